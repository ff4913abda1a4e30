"""The worker and dispatcher of ``test_pgbouncer.py``: one shoal App per process over one store
URL that goes through PgBouncer only (``POOL_STORE``), with every kind of statement the store
sends in a run's life.

The workflow ``order``: a step, a durable sleep, a wait for the signal ``go``, an approval, a
model call through ``app.provider("model", max_concurrent=1)`` and ``app.lock("shared")``, each
in a step that logs when it holds them, then a step sending an outbox email, whose handler
creates the effect file of its key with ``O_CREAT | O_EXCL`` (the first delivery only).
``ping`` returns its input. A worker logs each slot assignment it gets (``app.on_assigned``)
for ``SLOTS`` slots.

``python pooler_app.py worker``      serve until SIGTERM (``App.run_forever``), then close
``python pooler_app.py dispatcher``  ``dispatch_many`` ``POOL_RUNS`` orders, signal each, then
                                     answer their approvals as they come (order i approved when
                                     i is even); print the run ids as one JSON line

Configured by environment variables: ``POOL_STORE``, ``POOL_LOG`` (the shared log of JSON lines),
``POOL_EFFECTS`` (the directory of effect files), ``POOL_INSTANCE``, ``POOL_MAX_LIFE``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import harness

import shoal

NAMESPACE = "pooled"
SLOTS = 4
emit = harness.LineLog("POOL_LOG")


def make_app(instance_id: str | None = None) -> shoal.App:
    app = shoal.App(NAMESPACE, store=os.environ["POOL_STORE"], instance_id=instance_id,
                    max_concurrent_runs=4, membership_interval=0.5)
    model = app.provider("model", max_concurrent=1)

    def held(what: str, **data: Any) -> None:
        emit({"kind": what, "pid": os.getpid(), "t": time.time(), **data})

    async def call_model(i: int) -> int:
        async with model.call(tokens=1):
            held("model_start", i=i)
            await asyncio.sleep(0.02)
            held("model_end", i=i)
        return i

    async def under_lock(i: int) -> int:
        async with app.lock("shared") as lock:
            held("lock_start", i=i, token=lock.token)
            await asyncio.sleep(0.02)
            held("lock_end", i=i, token=lock.token)
        return lock.token

    def prepare(i: int) -> int:
        held("prepared", i=i)
        return i * 10

    @app.workflow(name="order", max_attempts=3)
    async def order(ctx: shoal.RunContext, input: dict[str, Any]) -> dict[str, Any]:
        i = input["i"]
        prepared = await ctx.step("prepare", prepare, i)
        await ctx.sleep(0.2)
        signal = await ctx.wait_for("go", timeout=120)
        decision = await ctx.approval("ship", {"i": i}, expires_in=300)
        await ctx.step("model", call_model, i)
        token = await ctx.step("lock", under_lock, i)

        async def notify() -> bool:
            ctx.outbox.send("email", {"i": i})
            return True

        await ctx.step("notify", notify)
        return {"i": i, "prepared": prepared, "signal": signal, "approved": decision.approved,
                "token": token}

    @app.workflow(name="ping")
    async def ping(ctx: shoal.RunContext, input: dict[str, Any]) -> dict[str, Any]:
        return input

    @app.outbox_handler("email")
    async def email(payload: dict[str, Any], key: str) -> None:
        try:
            fd = os.open(os.path.join(os.environ["POOL_EFFECTS"], f"email.{key}"),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return
        os.close(fd)
        held("emailed", i=payload["i"], key=key)

    def assigned(assignment: shoal.Assignment | None) -> None:
        slots = None if assignment is None else assignment.slots(SLOTS)
        emit({"kind": "slots", "instance": instance_id, "slots": slots, "t": time.time()})

    if instance_id is not None:
        app.on_assigned(assigned)
    return app


async def dispatcher() -> list[str]:
    app = make_app()
    n = int(os.environ["POOL_RUNS"])
    async with app.open():
        runs = await app.dispatch_many("order", [{"i": i} for i in range(n)])
        for run in runs:
            await app.signal(run.id, "go", {"from": "dispatcher"})
        ids = {run.id: run.input["i"] for run in runs}   # type: ignore[index]
        answered: set[str] = set()
        deadline = time.monotonic() + 120
        while len(answered) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(answered)} of {n} approvals came")
            for pause in await app.pending_pauses():
                if pause.run_id in ids and pause.id not in answered:
                    await app.resume(pause.id, approved=ids[pause.run_id] % 2 == 0,
                                     by="dispatcher")
                    answered.add(pause.id)
            await asyncio.sleep(0.1)
    return list(ids)


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        harness.serve(lambda: make_app(os.environ["POOL_INSTANCE"]), emit, "POOL", drain=10.0)
    elif sys.argv[1:] == ["dispatcher"]:
        harness.start_guard("POOL")
        print(json.dumps(asyncio.run(dispatcher())))
    else:
        sys.exit(f"usage: {sys.argv[0]} worker|dispatcher")
