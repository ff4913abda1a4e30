"""A run's progress (``ctx.progress``): the newest value an execution reported, written to the
store in the background, at most once per interval per run.

``ctx.progress(...)`` is a plain call, from the workflow or from a step's thread: it keeps the value
and returns. One task of the engine's own (outside the run's scope) writes it: the first value at
once, then the newest value reported at the end of each interval, so that a loop reporting 100,000
times writes a handful of times and its last value always lands. Before a write that ends the
execution's claim (its settlement, a sleep or a wait, a release) the engine flushes the value not
written yet, so that it is seen with the run's end. Writes are fenced like every write of a running
run: a stale execution's is ignored (the store answers False), and a write that fails is logged and
dropped, never an error of the run. Not a checkpoint: nothing of it is replayed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable

from shoal.clock import Clock
from shoal.scope import outside_run
from shoal.types import Progress

log = logging.getLogger("shoal")

PROGRESS_INTERVAL = 1.0   # seconds of the app's clock between two writes of one run's progress


class ProgressWriter:
    """The progress of one execution: :meth:`report` keeps the newest value (from any thread),
    one background task writes it through ``write`` at most once per ``interval``;
    :meth:`flush` writes what is not written yet now; :meth:`stop` ends it."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 write: Callable[[Progress], Awaitable[bool]], clock: Clock, run_id: str,
                 interval: float = PROGRESS_INTERVAL) -> None:
        self._loop = loop
        self._write = write
        self._clock = clock
        self._run_id = run_id
        self._interval = interval
        # shared with the threads that report: the newest value not written yet, whether a
        # writer task is started (or about to be), whether the execution has ended
        self._lock = threading.Lock()
        self._pending: Progress | None = None
        self.latest: Progress | None = None   # the newest value reported (a metrics gauge's)
        self._running = False
        self._closed = False
        # the loop's own
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None     # ends the writer's wait early
        self._writing: asyncio.Future[None] | None = None  # done when the write under way is
        self._written_at: float | None = None

    def report(self, progress: Progress) -> None:
        """Keep ``progress`` as the value to write next (replacing one not written yet); start
        the writer if none runs. Safe from any thread; nothing once the execution has ended."""
        with self._lock:
            if self._closed:
                return
            self._pending = self.latest = progress
            if self._running:
                return
            self._running = True
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._start()
            return
        try:
            self._loop.call_soon_threadsafe(self._start)
        except RuntimeError:   # the loop has closed: a thread outlived the app
            with self._lock:
                self._running = False

    def _start(self) -> None:
        self._task = self._loop.create_task(self._run(), name=f"shoal-progress-{self._run_id}",
                                            context=outside_run())

    async def _run(self) -> None:
        try:
            while True:
                await self._turn()
                while self._writing is not None:   # a flush's write
                    await asyncio.shield(self._writing)
                with self._lock:
                    value, self._pending = self._pending, None
                    if value is None or self._closed:
                        self._running = False
                        return
                await self._write_one(value)
        except BaseException:
            with self._lock:
                self._running = False
            raise

    async def _turn(self) -> None:
        """Return once an interval has passed since the last write began (at once before the
        first), or earlier when :meth:`stop` asks."""
        if self._written_at is None or self._closed:
            return
        delay = self._written_at + self._interval - self._clock.now()
        if delay <= 0:
            return
        self._wake = self._loop.create_future()
        nap = asyncio.ensure_future(self._clock.sleep(delay))
        try:
            await asyncio.wait({nap, self._wake}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            nap.cancel()
            self._wake = None

    async def _write_one(self, value: Progress) -> None:
        done = self._writing = self._loop.create_future()
        self._written_at = self._clock.now()
        try:
            if not await self._write(value):
                log.debug("progress.fenced: run %s: its progress was not written (another "
                          "execution holds the run, or it ended)", self._run_id,
                          extra={"event": "progress.fenced", "run_id": self._run_id})
        except Exception as e:
            log.warning("progress.write_failed: run %s: %s", self._run_id, e,
                        extra={"event": "progress.write_failed", "run_id": self._run_id})
        finally:
            self._writing = None
            done.set_result(None)

    async def flush(self) -> None:
        """Write the value not written yet now, after the write under way if any; return once
        it is written, refused by the fence, or failed (logged): never raises for the store."""
        while self._writing is not None:
            await asyncio.shield(self._writing)
        with self._lock:
            value, self._pending = self._pending, None
        if value is not None:
            await self._write_one(value)

    def stop(self) -> None:
        """The execution has ended: drop the value not written yet, ignore later reports, and
        let the writer task end (a write under way finishes)."""
        with self._lock:
            self._closed = True
            self._pending = None
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)
