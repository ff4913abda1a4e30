"""Time for shoal: every store call that compares or stores a time gets ``now`` from a Clock."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

# The part of a lease before its end at which what holds it here without a renewal confirmed
# since stops (a run's execution, a provider call's slots): another instance compares the
# lease's end with its own clock, and takes it over that much early if its clock is ahead. A
# tenth: a lease is to be at least ten times the worst clock skew (docs/leases.md), 3 s of the
# default 30.
DRIFT_MARGIN = 0.1


@runtime_checkable
class Clock(Protocol):
    """A source of time and of waits measured in it."""

    def now(self) -> float:
        """Seconds since the Unix epoch."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock."""
        ...


class SystemClock:
    """The wall clock: ``time.time()`` and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
