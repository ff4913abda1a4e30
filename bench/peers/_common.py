"""What every peer runner shares with bench/postgres.py: the line protocol and the tally.

A runner is started as ``python bench/peers/<peer>.py DSN MODE ...`` with the benchmark's own
interpreter (bench/.venv-peers). Modes:

- ``setup``: create the peer's tables in the (new, empty) database DSN;
- ``enqueue N [--interval S [--priority P]]``: enqueue N jobs in batches; or one every S seconds,
  each with the time it was enqueued (``{"t": time.time()}``) as its argument (at priority P,
  higher first, where the runner supports it), until N are enqueued or ``stop`` comes on stdin;
  prints one JSON line ``{"event": "enqueued", "seconds": ..., "count": ...}``;
- ``--workflow noop|steps5`` (setup, enqueue and work): the no-op job, or a workflow of 5 trivial
  async checkpointed steps where the runner has durable steps;
- ``work --name NAME --slots C``: a worker process. It prints ``{"event": "ready"}``, waits for
  ``go`` on stdin, starts consuming and prints ``started``; on ``stop`` (or EOF, SIGTERM) it stops
  and prints ``done`` with what its jobs recorded (count, first start, enqueue->start latencies,
  CPU seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any


def emit(**message: Any) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class Tally:
    """What the no-op jobs of one worker process record: each call notes when it started, and
    how long after its enqueue (the ``t`` its argument carries, if any)."""

    def __init__(self) -> None:
        self.executed = 0
        self.first: float | None = None
        self.last: float | None = None
        self.latencies: list[float] = []
        self.extra: dict[str, Any] = {}   # anything else a runner wants to report

    def hit(self, sent: Any = None) -> None:
        now = time.time()
        self.executed += 1
        if self.first is None:
            self.first = now
        self.last = now
        if isinstance(sent, (int, float)):
            self.latencies.append(now - sent)

    def report(self) -> dict[str, Any]:
        return {"executed": self.executed, "first_start": self.first, "last_start": self.last,
                "latencies": self.latencies, **self.extra}


async def serve(tally: Tally, start: Callable[[], Awaitable[None]],
                stop: Callable[[], Awaitable[None]]) -> None:
    """The worker side of the protocol: ``ready``; wait for ``go``; ``start()``; ``started``;
    wait for ``stop``; ``stop()``; ``done`` with the tally and the CPU time in between."""
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()
    go, halt = asyncio.Event(), asyncio.Event()

    def on_stdin() -> None:
        data = os.read(fd, 64)
        if not data or b"stop" in data:
            halt.set()
            go.set()
        elif b"go" in data:
            go.set()

    loop.add_reader(fd, on_stdin)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, halt.set)
    emit(event="ready")
    await go.wait()
    if halt.is_set():
        return
    cpu0 = time.process_time()
    await start()
    emit(event="started")
    await halt.wait()
    loop.remove_reader(fd)
    cpu = time.process_time() - cpu0
    await stop()
    emit(event="done", cpu=cpu, **tally.report())


async def paced(n: int, interval: float, one: Callable[[int], Awaitable[None]]
                ) -> tuple[float, int]:
    """Call ``one(i)`` n times, one every ``interval`` seconds (no drift), or until ``stop`` (or
    EOF) comes on stdin; returns the seconds and the calls made."""
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()
    halt = asyncio.Event()

    def on_stdin() -> None:
        data = os.read(fd, 64)
        if not data or b"stop" in data:
            halt.set()

    loop.add_reader(fd, on_stdin)
    start = time.perf_counter()
    done = 0
    try:
        for i in range(n):
            delay = start + i * interval - time.perf_counter()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(halt.wait(), delay)
            if halt.is_set():
                break
            await one(i)
            done += 1
    finally:
        loop.remove_reader(fd)
    return time.perf_counter() - start, done
