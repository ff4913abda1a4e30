"""Turns at a few connections for any number of operations: first come, first served.

A pool of ``size`` connections serves ``size`` operations at once; the others wait their turn here,
in order, rather than in the pool's own queue, where each waiter's fixed timeout made a burst fail
although every connection was busy serving it. Waiting is bounded by the queue's progress, not by
a fixed time: operations wait as long as the queue moves (some operation gets a connection), and
all those waiting fail once it has not moved for ``patience`` seconds. A burst of any size
therefore completes, while an unreachable server fails every waiting operation within
``patience`` seconds. Time the event loop itself was held up does not count: the store could
serve no one then.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque


class Turns:
    """At most ``size`` turns at once; :meth:`take` waits for one, :meth:`give` ends one."""

    def __init__(self, size: int, patience: float) -> None:
        self.patience = patience
        self._free = size
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._moved = False   # an operation got its connection since the watch last looked
        self._watch: asyncio.Task[None] | None = None

    @property
    def free(self) -> bool:
        """Whether a turn would be granted at once."""
        return self._free > 0 and not self.waiting

    @property
    def waiting(self) -> int:
        """Operations queued for a turn (cancelled ones may be counted until their turn)."""
        return len(self._urgent) + len(self._waiting)

    async def take(self, *, urgent: bool = False) -> None:
        """Wait for a turn, ``urgent`` ones before all others. Raise TimeoutError, holding no
        turn, when the queue has not moved for ``patience`` seconds."""
        if self._free and not self.waiting:
            self._free -= 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._urgent if urgent else self._waiting).append(turn)
        if self._watch is None or self._watch.done():
            self._watch = asyncio.create_task(self._watch_queue(), name="shoal-turns")
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled() and turn.exception() is None:
                self.give()   # granted, but it will not be used: the next one takes it
            else:
                turn.cancel()
            raise

    def served(self) -> None:
        """An operation got its connection: the queue moves."""
        self._moved = True

    def give(self) -> None:
        """End a turn: the first waiter (urgent ones first) takes it."""
        for queue in (self._urgent, self._waiting):
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)
                    return
        self._free += 1

    def close(self) -> None:
        """Stop watching (the waiters still get their turns, or fail, as operations end)."""
        if self._watch is not None:
            self._watch.cancel()

    async def _watch_queue(self) -> None:
        """While operations wait: fail them all once the queue has not moved for ``patience``
        seconds. A tick that comes late counts as two ticks at most: the event loop was held
        up (CPU-bound code, a burst's thousands of tasks starting), not the store."""
        tick = self.patience / 10
        stuck = 0.0
        self._moved = False
        last = time.monotonic()
        while self.waiting:
            await asyncio.sleep(tick)
            now = time.monotonic()
            stuck = 0.0 if self._moved else stuck + min(now - last, 2 * tick)
            self._moved = False
            last = now
            if stuck >= self.patience - tick / 2:   # ten ticks, whatever the rounding
                stuck = 0.0
                self.fail_waiting()

    def fail_waiting(self) -> None:
        """Every operation waiting for a turn raises TimeoutError: the front of the queue got
        no connection for ``patience`` seconds, and those behind it would not either."""
        for queue in (self._urgent, self._waiting):
            for turn in queue:
                if not turn.done():
                    turn.set_exception(TimeoutError())
            queue.clear()
