"""The worker side of ``test_rate_processes.py``: one shoal App over a shared store (a SQLite
file or a PostgreSQL schema) with a workflow of ``rate_limit=shoal.Rate(RATE_N, per=RATE_PER,
key=partner)`` whose runs write their first start to a shared log (one ``os.write`` per JSON
line, O_APPEND).

``python rate_app.py worker``   serve until SIGTERM (``App.run_forever``), then close

Configured by environment variables: ``RATE_STORE`` (a store URL), ``RATE_LOG`` (the log),
``RATE_N`` and ``RATE_PER`` (the rate), ``RATE_INSTANCE`` (instance id), ``RATE_MAX_LIFE``
(seconds; the worker exits by itself after that, a guard against leftovers). The test side is
in ``harness.py``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import harness

import shoal

NAMESPACE = "rates"
emit = harness.LineLog("RATE_LOG")


def _started(run_id: str, partner: str) -> None:
    """The run's first start, as the worker that executes it sees it (a step: once a run)."""
    emit({"kind": "start", "run": run_id, "key": partner, "pid": os.getpid(), "t": time.time()})


def make_app(store: str, instance_id: str | None = None, limit: int = 3,
             per: float = 1.0) -> shoal.App:
    """The app of every process of the test: workflow ``call``, at most ``limit`` first starts
    per partner in any ``per`` seconds, each a step that logs its start and a short sleep.
    Four slots a process: the slots are never what holds a run back, the rate is."""
    app = shoal.App(NAMESPACE, store=store, instance_id=instance_id, lease=3.0,
                    max_concurrent_runs=4)

    @app.workflow(name="call", rate_limit=shoal.Rate(limit, per=per, key=lambda i: i["partner"]))
    async def call(ctx: shoal.RunContext, input: dict[str, Any]) -> None:
        await ctx.step("start", _started, ctx.run_id, input["partner"])
        await asyncio.sleep(0.05)

    return app


def worker() -> None:
    harness.serve(lambda: make_app(os.environ["RATE_STORE"], os.environ["RATE_INSTANCE"],
                                   int(os.environ["RATE_N"]), float(os.environ["RATE_PER"])),
                  emit, "RATE", drain=10.0)


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        worker()
    else:
        sys.exit(f"usage: {sys.argv[0]} worker")
