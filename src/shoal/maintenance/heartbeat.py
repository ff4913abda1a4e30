"""Renewal: extend the leases of the runs executing here, every ``heartbeat`` seconds. It does
nothing else, so no other work (delivery, recovery, a slow handler) can make a healthy instance
lose its own runs; it goes on while a stop drains, and stops last."""

from __future__ import annotations

from shoal.clock import Clock
from shoal.maintenance.service import Pass, Reporter, Service


class Heartbeat(Service):
    name = "heartbeat"
    failure_event = "renew.failed"

    def __init__(self, clock: Clock, interval: float, reporter: Reporter, renew: Pass) -> None:
        super().__init__(clock, interval, reporter)
        self._renew = renew

    async def run_once(self) -> None:
        await self._renew()
