"""The worker side of ``test_chaos.py``: one shoal App over PostgreSQL (on the wall clock, the
real ``SystemClock``) whose workflows mix steps in threads and async steps, durable sleeps,
signals, approvals, child runs and concurrency keys. Every step appends its side effects to a
shared log, and its store (``failover_app.AckingStore``) appends every checkpoint and
settlement the server acknowledged.

``python chaos_app.py worker``    serve until SIGTERM (``App.run_forever``), then close

Configured by environment variables: ``CHAOS_STORE`` (the store URL), ``CHAOS_LOG`` (the shared
log), ``CHAOS_INSTANCE`` (instance id), ``CHAOS_LEASE`` (seconds), ``CHAOS_DRAIN`` (close
timeout), ``CHAOS_MAX_LIFE`` (seconds; the worker exits by itself after that). Log lines, one
JSON object each, all with ``run``, ``seq`` (the step's position), ``name``, ``epoch`` (the
claim's ``lease_epoch``), ``pid`` and ``t`` (``time.time()``):

- ``start`` (``count``: how many effects it is to make), ``effect`` (``n``), ``end``: a
  step's side effects, in the order it made them;
- ``abort``: the step saw that its execution was aborted (cancelled, or ``ctx.signal``), and
  made no more side effects;
- ``ack`` and ``settled``: as ``failover_app.py`` writes them.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import failover_app
import harness

import shoal

NAMESPACE = "chaos"
PAUSE = 0.05      # seconds between two side effects of a step
emit = harness.LineLog("CHAOS_LOG")


class ChaosStore(failover_app.AckingStore):
    log_line = emit


def _line(ctx: shoal.RunContext, key: str, kind: str, name: str, **more: Any) -> None:
    emit({"kind": kind, "run": ctx.run_id, "seq": int(key.rpartition(":")[2]), "name": name,
          "epoch": ctx.lease_epoch, "attempt": ctx.attempt, "pid": os.getpid(),
          "t": time.time(), **more})


def _output(ctx: shoal.RunContext, name: str, count: int) -> dict[str, Any]:
    return {"name": name, "effects": count, "pid": os.getpid(), "epoch": ctx.lease_epoch}


async def in_loop(ctx: shoal.RunContext, name: str, count: int) -> dict[str, Any]:
    """An async step: ``count`` side effects; it is cancelled with its run's task."""
    key = str(ctx.step_key)
    _line(ctx, key, "start", name, count=count)
    try:
        for n in range(count):
            await asyncio.sleep(PAUSE)
            _line(ctx, key, "effect", name, n=n)
    except asyncio.CancelledError:
        _line(ctx, key, "abort", name)
        raise
    _line(ctx, key, "end", name)
    return _output(ctx, name, count)


def in_thread(ctx: shoal.RunContext, name: str, count: int) -> dict[str, Any]:
    """A plain-function step (run in a thread, which cannot be cancelled): it checks
    ``ctx.signal`` before each side effect, as docs/leases.md says such a step must."""
    key = str(ctx.step_key)
    _line(ctx, key, "start", name, count=count)
    for n in range(count):
        time.sleep(PAUSE)
        if ctx.signal.aborted:
            _line(ctx, key, "abort", name)
            raise RuntimeError(f"step {name} stopped: {ctx.signal.reason!r}")
        _line(ctx, key, "effect", name, n=n)
    _line(ctx, key, "end", name)
    return _output(ctx, name, count)


def make_app(url: str, instance_id: str | None = None, lease: float = 3.0) -> shoal.App:
    """Workflows ``order`` (its input says which parts it has) and ``part`` (a child)."""
    app = shoal.App(NAMESPACE, store=ChaosStore.from_url(url), instance_id=instance_id,
                    lease=lease, max_concurrent_runs=8)

    @app.workflow(name="order", max_attempts=20, backoff=0.2, max_backoff=1.0,
                  concurrency_key=lambda i: i.get("key"))
    async def order(ctx: shoal.RunContext, input: dict[str, Any]) -> dict[str, Any]:
        fetch, write, notify = input["effects"]
        out: dict[str, Any] = {"steps": [await ctx.step("fetch", in_loop, ctx, "fetch", fetch),
                                         await ctx.step("write", in_thread, ctx, "write", write)]}
        if input.get("sleep"):
            await ctx.sleep(input["sleep"])
        if input.get("signal"):
            out["signal"] = await ctx.wait_for("go")
        if input.get("approval"):
            d = await ctx.approval("ship", {"order": input["i"]})
            out["decision"] = {"approved": d.approved, "data": d.data, "by": d.by}
        if input.get("children"):
            children = [await ctx.start_child("part", {"parent": input["i"], "k": k,
                                                       "effects": input["part_effects"]})
                        for k in range(input["children"])]
            out["children"] = [await child.result() for child in children]
        out["steps"].append(await ctx.step("notify", in_loop, ctx, "notify", notify))
        return out

    @app.workflow(name="part", max_attempts=20, backoff=0.2, max_backoff=1.0)
    async def part(ctx: shoal.RunContext, input: dict[str, Any]) -> dict[str, Any]:
        first, second = input["effects"]
        return {"k": input["k"],
                "steps": [await ctx.step("load", in_thread, ctx, "load", first),
                          await ctx.step("store", in_loop, ctx, "store", second)]}

    return app


def worker() -> None:
    harness.serve(lambda: make_app(os.environ["CHAOS_STORE"], os.environ["CHAOS_INSTANCE"],
                                   float(os.environ.get("CHAOS_LEASE", "3.0"))),
                  emit, "CHAOS", drain=5.0)


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        worker()
    else:
        sys.exit(f"usage: {sys.argv[0]} worker")
