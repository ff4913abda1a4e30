"""The app as its engine's host: the few things the engine asks of the app that owns it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from shoal.maintenance import Maintenance
from shoal.scope import RunScope
from shoal.types import Run

ChildDispatcher = Callable[[Run, Any, Any, str, dict[str, Any]], Awaitable[Run]]
Spender = Callable[[RunScope, float, str], Awaitable[None]]


class Host:
    """An :class:`~shoal.engine.runner.EngineHost` made of the app's dispatch path for child
    runs, its ledger, and the maintenance services to wake (set once they are built)."""

    def __init__(self, dispatch_child: ChildDispatcher, spend: Spender) -> None:
        self._dispatch_child = dispatch_child
        self._spend = spend
        self.maintenance: Maintenance | None = None

    async def dispatch_child(self, parent: Run, workflow: Any, input: Any, key: str,
                             options: dict[str, Any]) -> Run:
        return await self._dispatch_child(parent, workflow, input, key, options)

    async def spend(self, scope: RunScope, amount: float, currency: str) -> None:
        await self._spend(scope, amount, currency)

    def outbox_written(self) -> None:
        if self.maintenance is not None:
            self.maintenance.outbox_written()

    def pause_created(self) -> None:
        if self.maintenance is not None:
            self.maintenance.pause_created()
