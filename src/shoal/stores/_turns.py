"""Turns at a few connections for any number of operations: first come, first served.

A pool of ``size`` connections serves ``size`` operations at once; the others wait their turn here,
in order, rather than in the pool's own queue, where each waiter's fixed timeout made a burst fail
although every connection was busy serving it. An operation's patience is measured against the
queue's progress, not against a fixed time: it waits as long as the operations ahead of it keep
getting connections, and gives up once ``patience`` seconds pass (counted from when it queued) in
which no operation got one. A burst of any size therefore completes, while an unreachable server
fails every waiting operation within ``patience`` seconds.
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
        self._served = float("-inf")   # monotonic time an operation last got its connection

    @property
    def waiting(self) -> int:
        """Operations queued for a turn (cancelled ones may be counted until their turn)."""
        return len(self._urgent) + len(self._waiting)

    async def take(self, *, urgent: bool = False) -> float:
        """Wait for a turn (``urgent`` ones before all others) and return the monotonic deadline
        by which its connection must come. Raise TimeoutError, holding no turn, once
        ``patience`` seconds passed since it queued and since an operation was last served."""
        queued = time.monotonic()
        if self._free and not self.waiting:
            self._free -= 1
            return queued + self.patience
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._urgent if urgent else self._waiting).append(turn)
        try:
            while True:
                deadline = max(queued, self._served) + self.patience
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                if turn.done():
                    return deadline
                # asyncio.wait, not wait_for: it never cancels the turn, and a turn granted in
                # the same moment as the timeout is seen above
                await asyncio.wait({turn}, timeout=left)
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.give()   # granted, but it will not be used: the next one takes it
            else:
                turn.cancel()
            raise

    def served(self) -> None:
        """An operation got its connection: the queue moves, the waiters' patience restarts."""
        self._served = time.monotonic()

    def give(self) -> None:
        """End a turn: the first waiter (urgent ones first) takes it."""
        for queue in (self._urgent, self._waiting):
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)
                    return
        self._free += 1
