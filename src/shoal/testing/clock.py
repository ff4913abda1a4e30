"""The virtual clock and ``settle``: a leaf of :mod:`shoal.testing` that imports no app, so that
the contract suites (:mod:`shoal.testing.contract`) can use it without the engine."""

from __future__ import annotations

import asyncio
import heapq
import itertools


class VirtualClock:
    """A clock that moves only when told. ``await clock.advance(s)`` lets the work already started
    reach its next wait, then moves time forward, waking every due ``sleep`` in time order
    (lease renewals, polls, durable sleeps), letting each woken task run before the next."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:
        self._now = float(start)
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (self._now + seconds, next(self._order), future))
        await future

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking due sleeps in time order."""
        if seconds < 0:
            raise ValueError("a VirtualClock only moves forward")
        target = self._now + seconds
        await settle()
        while self._waiters and self._waiters[0][0] <= target:
            when, _, future = heapq.heappop(self._waiters)
            if future.done():
                continue
            self._now = max(self._now, when)
            future.set_result(None)
            await settle()
        self._now = target
        await settle()


async def settle(rounds: int = 50) -> None:
    """Let every task that can make progress without waiting on time do so."""
    for _ in range(rounds):
        await asyncio.sleep(0)


__all__ = ["VirtualClock", "settle"]
