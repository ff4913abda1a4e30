"""The worker side of ``test_limit_processes.py``: one shoal App over a shared store (a SQLite
file or a PostgreSQL schema) with a workflow of ``concurrency_limit=LIMIT_N`` whose runs write
their start and end to a shared log (one ``os.write`` per JSON line, O_APPEND).

``python limit_app.py worker``   serve until SIGTERM (``App.run_forever``), then close

Configured by environment variables: ``LIMIT_STORE`` (a store URL), ``LIMIT_LOG`` (the log),
``LIMIT_N`` (the limit), ``LIMIT_INSTANCE`` (instance id), ``LIMIT_MAX_LIFE`` (seconds; the
worker exits by itself after that, a guard against leftovers). The test side is in
``harness.py``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import harness

import shoal

NAMESPACE = "limits"
emit = harness.LineLog("LIMIT_LOG")


async def _work(ctx: shoal.RunContext, input: dict[str, Any], part: int) -> None:
    """A part of a run: long enough that other runs of its key start meanwhile."""
    if part == 0:
        emit({"kind": "start", "run": ctx.run_id, "key": input["key"], "pid": os.getpid(),
              "t": time.time()})
    await asyncio.sleep(input.get("seconds", 0.1))
    if part == 1:
        emit({"kind": "end", "run": ctx.run_id, "key": input["key"], "pid": os.getpid(),
              "t": time.time()})


def make_app(store: str, instance_id: str | None = None, limit: int = 2) -> shoal.App:
    """The app of every process of the test: workflow ``export``, ``limit`` runs of a key at
    once, each a step, a durable sleep (it keeps its place) and a step. Two slots a process:
    the three keys' six places need every worker, so none can take them all (a worker that
    settles a run claims the next in the same write)."""
    app = shoal.App(NAMESPACE, store=store, instance_id=instance_id, lease=5.0,
                    max_concurrent_runs=2)

    @app.workflow(name="export", concurrency_key=lambda i: i["key"], concurrency_limit=limit)
    async def export(ctx: shoal.RunContext, input: dict[str, Any]) -> None:
        await ctx.step("first", _work, ctx, input, 0)
        await ctx.sleep(0.05)
        await ctx.step("second", _work, ctx, input, 1)

    return app


def worker() -> None:
    harness.serve(lambda: make_app(os.environ["LIMIT_STORE"], os.environ["LIMIT_INSTANCE"],
                                   int(os.environ["LIMIT_N"])),
                  emit, "LIMIT", drain=10.0)


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        worker()
    else:
        sys.exit(f"usage: {sys.argv[0]} worker")
