"""Cron: one loop per trigger, sleeping until its next tick, then dispatching the tick's run
under an idempotency key made of the trigger and the tick, so every instance may fire it and
exactly one run exists (invariant 10). A dispatch that fails is reported and tried again
shortly."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from shoal._tasks import cancel_and_wait
from shoal.clock import Clock
from shoal.engine.cron import CronTrigger
from shoal.maintenance.service import Reporter

log = logging.getLogger("shoal")

Fire = Callable[[CronTrigger, float], Awaitable[None]]


class Cron:
    name = "cron"

    def __init__(self, clock: Clock, retry: float, reporter: Reporter,
                 triggers: Sequence[CronTrigger], fire: Fire) -> None:
        self.clock = clock
        self._retry = retry
        self._reporter = reporter
        self._triggers = list(triggers)
        self._fire = fire
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._loop(t), name=f"shoal-cron-{t.name}")
                       for t in self._triggers]

    async def stop(self) -> None:
        self._stopped = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            await cancel_and_wait(task)

    async def _loop(self, trigger: CronTrigger) -> None:
        """Fire the trigger's due tick (idempotent across instances), then sleep to the next."""
        while not self._stopped:
            now = self.clock.now()
            tick = trigger.due(now)
            if tick is not None:
                try:
                    await self._fire(trigger, tick)
                except Exception as e:
                    await self._reporter.failed(f"cron {trigger.name} at {tick}", e,
                                                "cron.failed", workflow=trigger.workflow)
                    await self.clock.sleep(min(self._retry, 5.0))
                    continue
            await self.clock.sleep(max(0.0, trigger.next_tick(now) - self.clock.now()))
