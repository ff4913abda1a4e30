"""Pauses: expiry denies every approval whose time ran out (its run becomes due, and the engine
is asked for a pass); notification calls the ``on_pause_notify`` handlers for each new pause,
on whichever instance takes it, until every handler returned without raising."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from shoal._tasks import call_handler
from shoal.clock import Clock
from shoal.maintenance.service import Reporter, Service, Triggered
from shoal.ports import Pauses
from shoal.telemetry import NOTHING, Telemetry
from shoal.types import Pause

log = logging.getLogger("shoal")

NOTIFY_BATCH = 10   # pauses taken at once


class PauseExpiry(Service):
    name = "pause.expiry"

    def __init__(self, clock: Clock, interval: float, reporter: Reporter, store: Pauses,
                 namespace: str, kick: Callable[[], None]) -> None:
        super().__init__(clock, interval, reporter)
        self._store = store
        self._namespace = namespace
        self._kick = kick

    async def run_once(self) -> None:
        expired = await self._store.expire_pauses(self._namespace, self.clock.now())
        for pause in expired:
            log.info("pause.expired: %s of run %s", pause.id, pause.run_id,
                     extra={"event": "pause.expired", "run_id": pause.run_id,
                            "tenant": pause.tenant})
        if expired:
            self._kick()


class PauseNotification(Triggered):
    """One pause taken by this instance is not sent by another for a lease, and is sent again
    until every handler returned without raising; a handler gets what is left of that lease
    (less a margin) to answer."""

    name = "pause.notify"

    def __init__(self, clock: Clock, interval: float, reporter: Reporter, store: Pauses,
                 namespace: str, lease: float,
                 handlers: Sequence[Callable[[Pause], Any]],
                 telemetry: Telemetry = NOTHING) -> None:
        super().__init__(clock, interval, reporter)
        self._store = store
        self._namespace = namespace
        self._lease = lease
        self._handlers = handlers
        self._telemetry = telemetry

    def trigger(self) -> None:
        if self._handlers:
            super().trigger()

    async def run_once(self) -> None:
        if not self._handlers:
            return
        claimed_at = self.clock.now()
        pauses = await self._store.claim_notifications(self._namespace, claimed_at,
                                                       self._lease, NOTIFY_BATCH)
        deadline = claimed_at + self._lease * 0.8
        for pause in pauses:
            if self.clock.now() >= deadline:
                return   # the rest is taken again once the lease passes
            await self._notify_one(pause, deadline)

    async def _notify_one(self, pause: Pause, deadline: float) -> None:
        try:
            for handler in list(self._handlers):
                await call_handler(handler, self.clock, deadline - self.clock.now(), pause)
        except Exception as e:
            log.warning("pause.notify_failed: %s of run %s: %s", pause.id, pause.run_id, e,
                        extra={"event": "pause.notify_failed", "run_id": pause.run_id,
                               "tenant": pause.tenant})
            self._telemetry.pause_notified(pause, e)
            return
        await self._store.mark_notified(pause.id)
        self._telemetry.pause_notified(pause, None)
