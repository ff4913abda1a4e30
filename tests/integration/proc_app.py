"""The worker side of ``test_sqlite_processes.py`` and ``test_postgres_processes.py``: one shoal
App over a shared store (a SQLite file or a PostgreSQL schema) whose steps append their side effects
to a shared log (one ``os.write`` per JSON line, O_APPEND).

``python proc_app.py worker``    serve until SIGTERM (``App.run_forever``), then close
``python proc_app.py dispatch``  dispatch the runs described by a JSON list on stdin, print run ids

Configured by environment variables: ``PROC_STORE`` (a store URL) or ``PROC_DB`` (a SQLite path),
``PROC_LOG`` (side-effect log),
``PROC_INSTANCE`` (instance id), ``PROC_LEASE`` (seconds), ``PROC_DRAIN`` (close timeout),
``PROC_MAX_LIFE`` (seconds; the worker exits by itself after that, a guard against leftovers).
The test side (the processes, the reaper, the chaos) and the worker's plumbing are in
``harness.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from typing import Any

import harness

import shoal

NAMESPACE = "chaos"
emit = harness.LineLog("PROC_LOG")   # the side-effect log: one JSON line per write (O_APPEND)


async def _work(ctx: shoal.RunContext, n: int, input: dict[str, Any]) -> dict[str, Any]:
    """Step ``n`` of a run: log its start, do a little async work, log its end."""
    base = {
        "run": ctx.run_id, "step": ctx.step_key, "n": n, "epoch": ctx.lease_epoch,
        "attempt": ctx.attempt, "ckey": input.get("key"), "pid": os.getpid(),
    }
    start = time.time()
    emit({**base, "kind": "start", "t": start})
    durations = input.get("durs")
    await asyncio.sleep(durations[n] if durations else random.uniform(0.0, 0.03))
    if input.get("fail_step") == n and ctx.attempt == 1:
        emit({**base, "kind": "end", "ok": False, "start": start, "end": time.time()})
        raise RuntimeError(f"planned failure of step {n} on the first attempt")
    emit({**base, "kind": "end", "ok": True, "start": start, "end": time.time()})
    return {"n": n, "pid": os.getpid(), "epoch": ctx.lease_epoch}


def store_url(db: str, busy_timeout: float = 5.0) -> str:
    """``db`` as a store URL: a URL (``postgresql://…``) as it is, a path as a SQLite file. A
    frozen worker can hold SQLite's write lock for seconds: dispatching processes wait longer."""
    if "://" in db:
        return db
    return f"sqlite:///{db}?busy_timeout={busy_timeout}"


def _env_store() -> str:
    return os.environ.get("PROC_STORE") or os.environ["PROC_DB"]


def make_app(db: str, instance_id: str | None = None, lease: float = 2.0,
             busy_timeout: float = 5.0) -> shoal.App:
    """The app every process of the test builds: workflows ``chaos`` and ``long``, over ``db``
    (a store URL, or the path of a SQLite file)."""
    app = shoal.App(NAMESPACE, store=store_url(db, busy_timeout),
                    instance_id=instance_id, lease=lease, max_concurrent_runs=8)

    # every kill or freeze that catches a run costs it an attempt; a freeze of the process that
    # holds the write lock stalls every instance past its lease and may cost all of their runs one
    @app.workflow(name="chaos", max_attempts=20, backoff=0.2, max_backoff=1.0,
                  concurrency_key=lambda i: i.get("key"))
    async def chaos(ctx: shoal.RunContext, input: dict[str, Any]) -> list[Any]:
        outputs = []
        for n in range(4):
            if n == 2 and input.get("sleep"):
                await ctx.sleep(input["sleep"])
            outputs.append(await ctx.step(f"s{n}", _work, ctx, n, input))
        return outputs

    @app.workflow(name="long", max_attempts=10, concurrency_key=lambda i: i.get("key"))
    async def long(ctx: shoal.RunContext, input: dict[str, Any]) -> list[Any]:
        return [await ctx.step(f"s{n}", _work, ctx, n, input) for n in range(len(input["durs"]))]

    return app


def worker() -> None:
    harness.serve(lambda: make_app(_env_store(), os.environ["PROC_INSTANCE"],
                                   float(os.environ.get("PROC_LEASE", "2.0"))),
                  emit, "PROC", drain=25.0)


async def dispatch(specs: list[dict[str, Any]]) -> list[str]:
    """Dispatch ``[{"workflow", "input", "idempotency_key"}]`` and return the run ids."""
    app = make_app(_env_store(), busy_timeout=30.0)
    ids = []
    async with app.open():
        for spec in specs:
            run = await app.dispatch(spec["workflow"], spec["input"],
                                     idempotency_key=spec.get("idempotency_key"))
            ids.append(run.id)
    return ids


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        worker()
    elif sys.argv[1:] == ["dispatch"]:
        print(json.dumps(asyncio.run(dispatch(json.load(sys.stdin)))))
    else:
        sys.exit(f"usage: {sys.argv[0]} worker|dispatch")
