"""Renewal: extend the leases of the runs executing here, every ``heartbeat`` seconds. It does
nothing else, so no other work (delivery, recovery, a slow handler) can make a healthy instance
lose its own runs; it goes on while a stop drains, and stops last. While no run executes here it
sleeps until one starts: an idle instance has nothing to renew (and its first renewal comes a
``heartbeat`` after that start, well within the lease the claim began)."""

from __future__ import annotations

from shoal.clock import Clock
from shoal.maintenance.service import Pass, Reporter, Service


class Heartbeat(Service):
    name = "heartbeat"
    failure_event = "renew.failed"

    def __init__(self, clock: Clock, interval: float, reporter: Reporter, renew: Pass,
                 until_renewing: Pass) -> None:
        super().__init__(clock, interval, reporter)
        self._renew = renew
        self._until_renewing = until_renewing
        self._idle = False

    async def run_once(self) -> None:
        await self._renew()

    async def _loop(self, first: bool) -> None:
        if not first:
            await self.clock.sleep(self.interval)
        while not self._stopped:
            await self.pass_once()
            self._idle = True
            try:
                await self._until_renewing()
            finally:
                self._idle = False
                self.last_loop_at = self.clock.now()
            await self.clock.sleep(self.interval)

    def stuck_for(self) -> float:
        """Asleep with nothing to renew, it is not behind."""
        return 0.0 if self._idle else super().stuck_for()
