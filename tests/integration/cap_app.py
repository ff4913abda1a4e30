"""The worker side of ``test_cap_processes.py``: one shoal App over a shared store (a SQLite
file or a PostgreSQL schema) with a workflow of ``max_running=CAP_N`` and one of
``max_running_per_tenant=CAP_T``, whose runs write their start and end to a shared log (one
``os.write`` per JSON line, O_APPEND).

``python cap_app.py worker``   serve until SIGTERM (``App.run_forever``), then close

Configured by environment variables: ``CAP_STORE`` (a store URL), ``CAP_LOG`` (the log),
``CAP_N`` and ``CAP_T`` (the caps: a new deploy may change them), ``CAP_INSTANCE`` (instance
id), ``CAP_MAX_LIFE`` (seconds; the worker exits by itself after that). The test side is in
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

NAMESPACE = "caps"
LEASE = 2.0
emit = harness.LineLog("CAP_LOG")


async def _work(ctx: shoal.RunContext, workflow: str, input: dict[str, Any]) -> None:
    """The run's one step, between its start and its end in the log (a run killed in it has
    no end: it starts again, from the step, once recovered)."""
    record = {"run": ctx.run_id, "workflow": workflow, "tenant": ctx.tenant, "pid": os.getpid()}
    emit({"kind": "start", **record, "t": time.time()})
    await asyncio.sleep(input["seconds"])
    emit({"kind": "end", **record, "t": time.time()})


def make_app(store: str, instance_id: str | None = None, cap: int = 3,
             tenant_cap: int = 2) -> shoal.App:
    """The app of every process of the test: four slots a process, more than the caps need,
    so that the caps, not the slots, bind."""
    app = shoal.App(NAMESPACE, store=store, instance_id=instance_id, lease=LEASE,
                    max_concurrent_runs=4)

    @app.workflow(name="capped", max_running=cap)
    async def capped(ctx: shoal.RunContext, input: dict[str, Any]) -> None:
        await ctx.step("work", _work, ctx, "capped", input)

    @app.workflow(name="per_tenant", max_running_per_tenant=tenant_cap)
    async def per_tenant(ctx: shoal.RunContext, input: dict[str, Any]) -> None:
        await ctx.step("work", _work, ctx, "per_tenant", input)

    return app


def worker() -> None:
    harness.serve(lambda: make_app(os.environ["CAP_STORE"], os.environ["CAP_INSTANCE"],
                                   int(os.environ["CAP_N"]), int(os.environ["CAP_T"])),
                  emit, "CAP", drain=10.0)


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        worker()
    else:
        sys.exit(f"usage: {sys.argv[0]} worker")
