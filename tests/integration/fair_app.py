"""The worker side of ``test_fairness_processes.py``: one shoal App over a shared store (a SQLite
file or a PostgreSQL schema) with a workflow of ``fairness="tenant"`` whose runs write their
tenant and start to a shared log (one ``os.write`` per JSON line, O_APPEND).

``python fair_app.py worker``   serve until SIGTERM (``App.run_forever``), then close

Configured by environment variables: ``FAIR_STORE`` (a store URL), ``FAIR_LOG`` (the log),
``FAIR_INSTANCE`` (instance id), ``FAIR_MAX_LIFE`` (seconds; the worker exits by itself after
that, a guard against leftovers). The test side is in ``harness.py``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import harness

import shoal

NAMESPACE = "fairness"
emit = harness.LineLog("FAIR_LOG")


def make_app(store: str, instance_id: str | None = None) -> shoal.App:
    """The app of every process of the test: workflow ``job`` under ``fairness="tenant"``, a run
    a tenth of a second long; two slots a process."""
    app = shoal.App(NAMESPACE, store=store, instance_id=instance_id, lease=5.0,
                    max_concurrent_runs=2)

    @app.workflow(name="job", fairness="tenant")
    async def job(ctx: shoal.RunContext, input: dict[str, Any]) -> None:
        emit({"kind": "start", "run": ctx.run_id, "tenant": ctx.tenant, "pid": os.getpid(),
              "t": time.time()})
        await asyncio.sleep(input.get("seconds", 0.1))

    return app


def worker() -> None:
    harness.serve(lambda: make_app(os.environ["FAIR_STORE"], os.environ["FAIR_INSTANCE"]),
                  emit, "FAIR", drain=10.0)


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        worker()
    else:
        sys.exit(f"usage: {sys.argv[0]} worker")
