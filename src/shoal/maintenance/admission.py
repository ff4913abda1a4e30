"""Admission release: with ``App(max_queued=N, admission="park")``, release held runs, oldest
first, while fewer than N are queued, every poll interval; the engine is asked for a pass when
any was released."""

from __future__ import annotations

from collections.abc import Callable

from shoal.clock import Clock
from shoal.maintenance.service import Reporter, Service
from shoal.ports import RunQueue


class AdmissionRelease(Service):
    name = "admission"

    def __init__(self, clock: Clock, interval: float, reporter: Reporter, store: RunQueue,
                 namespace: str, max_queued: int, kick: Callable[[], None]) -> None:
        super().__init__(clock, interval, reporter)
        self._store = store
        self._namespace = namespace
        self._max_queued = max_queued
        self._kick = kick

    async def run_once(self) -> None:
        released = await self._store.release_held(self._namespace, self._max_queued,
                                                  self.clock.now())
        if released:
            self._kick()
