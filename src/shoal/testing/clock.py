"""The virtual clock and ``settle``: a leaf of :mod:`shoal.testing` that imports no app, so that
the contract suites (:mod:`shoal.testing.contract`) can use it without the engine."""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from shoal import _threads

log = logging.getLogger("shoal")


class _CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """The event loop's default executor while a VirtualClock drives it: it keeps the work
    still running in its threads (``asyncio.to_thread``: plain-function steps, sync handlers),
    so that ``advance()`` can wait for it before it moves time.

    A piece of work counts as running until the loop has its result: the thread hands the
    result over (asyncio's callback queues it on the loop), then queues its own end behind it.
    So once nothing runs here, every result is in the loop's ready queue, and a settle that
    runs the loop until that queue is empty delivers it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(thread_name_prefix="shoal-virtual")
        self.running: set[concurrent.futures.Future[Any]] = set()
        self._guard = threading.Lock()
        self._loop = loop

    def submit(self, fn: Callable[..., Any], /, *args: Any,
               **kwargs: Any) -> concurrent.futures.Future[Any]:
        work: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def call() -> None:
            if work.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as e:
                    work.set_exception(e)
                else:
                    work.set_result(result)
            _threads.ended_on(self._loop, self._discard, work)

        with self._guard:
            self.running.add(work)
        super().submit(call)
        return work

    def _discard(self, work: concurrent.futures.Future[Any]) -> None:
        with self._guard:
            self.running.discard(work)

    def busy(self) -> list[concurrent.futures.Future[Any]]:
        with self._guard:
            return [w for w in self.running if not w.cancelled()]


class VirtualClock:
    """A clock that moves only when told. ``await clock.advance(s)`` lets the work already started
    reach its next wait, then moves time forward, waking every due ``sleep`` in time order
    (lease renewals, polls, durable sleeps), letting the tasks woken at one moment run before
    the next. The sleeps due at the same moment wake together, in the order they began, and the
    loop settles once for them all: an app's polls and beats share their moments.

    Work the event loop runs in a thread (a plain-function step, a sync outbox handler: anything
    given to ``asyncio.to_thread``) counts as work already started: the clock makes the loop's
    default executor its own, and ``advance`` waits for that work to end (in real time) before
    it moves time, so time never jumps past a step still running. A thread still running after
    ``max_thread_wait`` real seconds (one that waits for something only the test does after
    ``advance``) is logged (``clock.thread_running``) and time moves on without it; with
    ``max_thread_wait=0`` time moves on at once (a test of what happens while a thread
    runs)."""

    def __init__(self, start: float = 1_767_225_600.0, *, max_thread_wait: float = 10.0) -> None:
        self._now = float(start)
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self.max_thread_wait = float(max_thread_wait)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: _CountingExecutor | None = None
        self._given_up: set[concurrent.futures.Future[Any]] = set()   # waited for too long

    def now(self) -> float:
        if self._loop is None or asyncio._get_running_loop() is not self._loop:
            self._attach()
        return self._now

    async def sleep(self, seconds: float) -> None:
        if self._loop is not asyncio.get_running_loop():
            self._attach()
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (self._now + seconds, next(self._order), future))
        await future

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking due sleeps in time order (those due at one
        moment together); before it moves, and after each moment's wake-ups, the work started
        meanwhile (threads included) reaches its next wait."""
        if seconds < 0:
            raise ValueError("a VirtualClock only moves forward")
        self._attach()
        target = self._now + seconds
        await self._quiet()
        waiters = self._waiters
        while waiters and waiters[0][0] <= target:
            when = waiters[0][0]
            woken = False   # a moment whose sleeps were all cancelled needs no settle
            while waiters and waiters[0][0] == when:
                future = heapq.heappop(waiters)[2]
                if not future.done():
                    future.set_result(None)
                    woken = True
            if woken:
                self._now = max(self._now, when)
                await self._quiet()
        self._now = target
        await self._quiet()

    def _attach(self) -> None:
        """Count the thread work of the running loop (see the class): once per loop."""
        loop = asyncio._get_running_loop()
        if loop is None or loop is self._loop:
            return
        self._loop = loop
        self._executor = _CountingExecutor(loop)
        loop.set_default_executor(self._executor)
        _executors[loop] = self._executor

    async def _quiet(self) -> None:
        """Settle the loop; while thread work started from it still runs, wait for it (at most
        ``max_thread_wait`` real seconds) and settle again."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_thread_wait
        while True:
            if await _settle_for_advance():
                self._given_up.clear()   # nothing runs: every thread given up on has ended
                return
            busy = [w for w in self._busy() if w not in self._given_up]
            self._given_up = {w for w in self._given_up if not w.done()}
            if not busy:
                return
            left = deadline - loop.time()
            if left <= 0:
                self._given_up.update(busy)
                if self.max_thread_wait <= 0:
                    return
                log.warning("clock.thread_running: %d thread(s) still run after %.1f s; the "
                            "VirtualClock moves on without them", len(busy),
                            self.max_thread_wait, extra={"event": "clock.thread_running"})
                return
            await asyncio.wait([asyncio.wrap_future(w) for w in busy], timeout=left,
                               return_when=asyncio.FIRST_COMPLETED)

    def _busy(self) -> list[concurrent.futures.Future[Any]]:
        """The thread work started from the clock's loop that still runs: in the default
        executor, and in shoal's own threads (plain-function steps, handlers)."""
        return [] if self._loop is None else _threads_busy(self._loop)


# the default executor a VirtualClock gave each loop (see VirtualClock._attach)
_executors: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _CountingExecutor] = (
    weakref.WeakKeyDictionary())


def _threads_busy(loop: asyncio.AbstractEventLoop) -> list[concurrent.futures.Future[Any]]:
    """The thread work started from ``loop`` whose result the loop does not have yet."""
    executor = _executors.get(loop)
    return _threads.pool().busy(loop) + (executor.busy() if executor is not None else [])


MAX_TURNS = 100_000   # a loop never quiet after this many turns has a task that never waits
THREAD_TURNS = 50     # turns a settle gives a thread still running to hand its result back


async def settle(rounds: int | None = None) -> None:
    """Let every task that can make progress without waiting on time do so: run the event
    loop until nothing is ready to run (every task waits for time, I/O, a thread or an event),
    and return. That takes as many turns as the work needs (one when a task wakes and goes back
    to sleep, more for a run of many steps) and no more; while a thread started from the loop
    (a plain-function step) still runs, at least ``THREAD_TURNS``, as every settle took before.
    A task that never waits (``while True: await asyncio.sleep(0)``) is cut off after
    ``MAX_TURNS`` turns and logged (``clock.busy``). With ``rounds``, exactly that many turns
    instead. (``VirtualClock.advance`` waits for the threads themselves.)"""
    await _settle(rounds)


async def _settle_for_advance() -> bool:
    """What ``advance`` settles with: :func:`settle` (looked up here each time: a test over a
    network store replaces it with one that also waits for the server); True when it saw no
    thread running as it returned."""
    if settle is not _SETTLE:
        await settle()
        return False
    return await _settle(None)


async def _settle(rounds: int | None) -> bool:
    """:func:`settle`; True when it saw no thread running as it returned (``advance`` need
    not look again)."""
    if rounds is not None:
        for _ in range(rounds):
            await asyncio.sleep(0)
        return False
    loop = asyncio.get_running_loop()
    ready = getattr(loop, "_ready", None)
    scheduled = getattr(loop, "_scheduled", None)
    if ready is None or scheduled is None:
        # a loop without asyncio's queues (uvloop): the fixed settle this one replaced
        for _ in range(50):
            await asyncio.sleep(0)
        return False
    for turn in range(1, MAX_TURNS + 1):
        await asyncio.sleep(0)
        # our own turn is over: anything still queued (or a timer already due, which the
        # next turn moves to the queue) can run without waiting
        if ready or (scheduled and scheduled[0].when() <= loop.time()):
            continue
        if turn < THREAD_TURNS:
            if _threads_busy(loop):
                continue
            return True
        return False
    log.warning("clock.busy: the event loop was still busy after %d turns (a task that never "
                "waits?); settle returns without it", MAX_TURNS,
                extra={"event": "clock.busy"})
    return False


_SETTLE = settle

__all__ = ["VirtualClock", "settle"]
