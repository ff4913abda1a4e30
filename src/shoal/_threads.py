"""The threads that run user code given as plain functions (steps, outbox handlers, hooks, the
function of ``app.locked``). A thread cannot be stopped, so these are daemon threads: one that
outlives a graceful stop never holds the process, which exits on time (``asyncio.to_thread``'s
default executor is joined by ``asyncio.run`` and again at interpreter exit, for as long as the
thread runs). Each call runs in a copy of the caller's context, as ``asyncio.to_thread`` does."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any

# Enough for every run of a busy worker to block in a step at once (the loop's default executor
# allows min(32, cores + 4)); an idle thread waits for the next call instead of ending.
MAX_THREADS = 256

_Work = tuple[concurrent.futures.Future[Any], Callable[[], Any]]


class DaemonPool(concurrent.futures.Executor):
    """A thread pool of daemon threads that keeps, per event loop, the calls still running, so
    that a VirtualClock can wait for the work started from its loop before it moves time."""

    def __init__(self, max_threads: int = MAX_THREADS) -> None:
        self._max = max_threads
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._guard = threading.Lock()
        self._threads = 0
        self._running: dict[concurrent.futures.Future[Any], asyncio.AbstractEventLoop | None] = {}

    def submit(self, fn: Callable[..., Any], /, *args: Any,
               **kwargs: Any) -> concurrent.futures.Future[Any]:
        work: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if not self._idle.acquire(blocking=False):
            with self._guard:
                grow = self._threads < self._max
                if grow:
                    self._threads += 1
            if grow:
                try:   # before the call is queued: one that cannot start leaves nothing behind
                    threading.Thread(target=self._serve, name=f"shoal-step-{self._threads}",
                                     daemon=True).start()
                except BaseException:
                    with self._guard:
                        self._threads -= 1
                    raise
        with self._guard:
            self._running[work] = asyncio._get_running_loop()
        self._queue.put((work, functools.partial(fn, *args, **kwargs)))
        return work

    def busy(self, loop: asyncio.AbstractEventLoop) -> list[concurrent.futures.Future[Any]]:
        """The calls submitted from ``loop`` whose result the loop does not have yet (see
        :func:`ended_on`)."""
        with self._guard:
            return [w for w, home in self._running.items()
                    if home is loop and not w.cancelled()]

    def _forget(self, work: concurrent.futures.Future[Any]) -> None:
        with self._guard:
            self._running.pop(work, None)

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, call = item
            del item
            if work.set_running_or_notify_cancel():
                try:
                    result = call()
                except BaseException as e:
                    work.set_exception(e)
                else:
                    work.set_result(result)
                    del result
            with self._guard:
                home = self._running.get(work)
            ended_on(home, self._forget, work)
            del work, call, home   # no reference to the result or the loop kept while idle
            self._idle.release()


def ended_on(loop: asyncio.AbstractEventLoop | None, forget: Callable[[Any], None],
             work: concurrent.futures.Future[Any]) -> None:
    """In the thread, after ``work``'s result was set (which queued it on ``loop``): queue
    ``forget(work)`` behind it. Work counts as running until then, so a VirtualClock that sees
    none running knows every result is already in its loop's ready queue: a thread between
    setting its result and that result reaching the loop is never taken for finished."""
    if loop is not None:
        try:
            loop.call_soon_threadsafe(forget, work)
            return
        except RuntimeError:       # the loop is closed: nobody waits for the result any more
            pass
    forget(work)


_pool: DaemonPool | None = None
_pool_guard = threading.Lock()


def pool() -> DaemonPool:
    """The process's pool, made on first use."""
    global _pool
    if _pool is None:
        with _pool_guard:
            if _pool is None:
                _pool = DaemonPool()
    return _pool


def run(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
    """``fn(*args, **kwargs)`` in a daemon thread, in a copy of the current context: a future of
    the event loop (as ``asyncio.to_thread``, but never waited for at exit)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return asyncio.get_running_loop().run_in_executor(pool(), call)
