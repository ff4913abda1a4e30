"""The app as its engine's host: the few things the engine asks of the app that owns it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shoal.maintenance import Maintenance
from shoal.scope import RunScope
from shoal.types import Run

if TYPE_CHECKING:
    from shoal.app.core import App


class Host:
    """The app as its engine's :class:`~shoal.engine.runner.EngineHost`: what the engine cannot
    do alone, without making it part of the app's public face."""

    def __init__(self, app: App) -> None:
        self._app = app
        self.maintenance: Maintenance | None = None

    async def dispatch_child(self, parent: Run, workflow: Any, input: Any, key: str,
                             options: dict[str, Any]) -> Run:
        return await self._app._dispatch_child(parent, workflow, input, key, options)

    async def spend(self, scope: RunScope, amount: float, currency: str) -> None:
        await self._app._spend(scope, amount, currency)

    def outbox_written(self) -> None:
        if self.maintenance is not None:
            self.maintenance.outbox_written()

    def pause_created(self) -> None:
        if self.maintenance is not None:
            self.maintenance.pause_created()
