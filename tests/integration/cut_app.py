"""The worker side of ``test_partition.py``: one shoal App whose workflow ``effects`` has a
plain-function step (run in a thread) and an async step, each appending its side effects to a
shared log (one ``os.write`` per JSON line, O_APPEND) with the time it made them.

``python cut_app.py worker``   serve until SIGTERM (``App.run_forever``), then close

Configured by environment variables: ``CUT_STORE`` (a store URL), ``CUT_LOG`` (the log),
``CUT_INSTANCE`` (instance id), ``CUT_LEASE`` (seconds), ``CUT_MAX_LIFE`` (seconds; the worker
exits by itself after that). The processes and the worker's plumbing are in ``harness.py``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import harness

import shoal

NAMESPACE = "cut"
PAUSE = 0.05            # seconds between two side effects
LONG = 1200             # effects of the step that the test cuts (a minute), on the first attempt
SHORT = 10              # effects of every other step
emit = harness.LineLog("CUT_LOG")


def _effect(ctx: shoal.RunContext, step: str, n: int) -> None:
    emit({"kind": "effect", "run": ctx.run_id, "step": step, "n": n, "attempt": ctx.attempt,
          "instance": os.environ.get("CUT_INSTANCE"), "pid": os.getpid(), "t": time.time()})


def _count(ctx: shoal.RunContext, input: dict[str, Any], step: str) -> int:
    return LONG if input.get("cut") == step and ctx.attempt == 1 else SHORT


def plain(ctx: shoal.RunContext, input: dict[str, Any]) -> str:
    """A step in a thread: it cannot be cancelled, so it checks ctx.signal between its side
    effects, as docs/leases.md says a step in a thread must."""
    for n in range(_count(ctx, input, "plain")):
        if ctx.signal.aborted:
            raise RuntimeError("aborted")
        _effect(ctx, "plain", n)
        time.sleep(PAUSE)
    return str(os.environ.get("CUT_INSTANCE"))


async def coro(ctx: shoal.RunContext, input: dict[str, Any]) -> str:
    """An async step: it is cancelled with its run's task."""
    for n in range(_count(ctx, input, "coro")):
        _effect(ctx, "coro", n)
        await asyncio.sleep(PAUSE)
    return str(os.environ.get("CUT_INSTANCE"))


def make_app(store: str, instance_id: str | None = None, lease: float = 3.0) -> shoal.App:
    app = shoal.App(NAMESPACE, store=store, instance_id=instance_id, lease=lease,
                    max_concurrent_runs=4)

    @app.workflow(name="effects", max_attempts=5)
    async def effects(ctx: shoal.RunContext, input: dict[str, Any]) -> list[str]:
        return [await ctx.step("plain", plain, ctx, input),
                await ctx.step("coro", coro, ctx, input)]

    return app


def worker() -> None:
    harness.serve(lambda: make_app(os.environ["CUT_STORE"], os.environ["CUT_INSTANCE"],
                                   float(os.environ.get("CUT_LEASE", "3"))),
                  emit, "CUT", drain=5.0)


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        worker()
    else:
        sys.exit(f"usage: {sys.argv[0]} worker")
