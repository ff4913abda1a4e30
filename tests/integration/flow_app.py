"""The worker side of ``test_workflow_processes.py``: one shoal App over a shared store (a SQLite
file or a PostgreSQL schema) running a human-gated agent workflow, whose steps and outbox handlers
append what they did to a shared log (one ``os.write`` per JSON line, O_APPEND).

The workflow ``order``: a fake model call as a step, an approval, then (approved) child runs
``part`` that race for tree keys and send outbox entries, awaited by the root, and an outbox email;
(denied) only an email. The outbox handlers are idempotent by key: the first delivery of a key
creates its effect file with ``O_CREAT | O_EXCL``; later ones find it and change nothing.

``python flow_app.py worker``    serve until SIGTERM (``App.run_forever``), then close
``python flow_app.py resolver``  resume pauses read as JSON lines on stdin, each at a given time,
                                 from this second process; print one JSON line per answer

Configured by environment variables: ``FLOW_STORE`` (a store URL), ``FLOW_LOG`` (the log),
``FLOW_EFFECTS`` (the directory of effect files), ``FLOW_INSTANCE`` (instance id), ``FLOW_LEASE``
(seconds), ``FLOW_HANDLER_DELAY`` (seconds the ``ship`` handler takes), ``FLOW_CRON`` (set: register
the every-second cron trigger), ``FLOW_MAX_LIFE`` (seconds; the process exits by itself after that,
a guard against leftovers). The test side (the processes, the reaper, the chaos) and the worker's
plumbing are in ``harness.py``.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import random
import sys
import time
from typing import Any

import harness

import shoal

NAMESPACE = "flow"
CRON = "* * * * * *"   # every second (six fields, seconds last)
emit = harness.LineLog("FLOW_LOG")   # the log: one JSON line per write (O_APPEND)


def child_keys(i: int, c: int) -> list[str]:
    """The tree keys child ``c`` of root ``i`` claims, in its own order: its own key and two keys
    every sibling wants."""
    keys = [f"own-{c}", "shared-a", "shared-b"]
    random.Random(i * 100 + c).shuffle(keys)
    return keys


def tree_keys(n_children: int) -> list[str]:
    return sorted({k for c in range(n_children) for k in child_keys(0, c)})


def _effect(topic: str, payload: Any, key: str) -> None:
    """The handlers' side effect, idempotent by key: the first delivery creates the key's effect
    file (O_EXCL); a later one finds it there and does nothing."""
    base = {"topic": topic, "key": key, "pid": os.getpid(), "t": time.time()}
    effects = os.environ["FLOW_EFFECTS"]
    if payload.get("flaky"):
        # fail the first delivery of this key (once across every process): retried with backoff
        try:
            os.close(os.open(os.path.join(effects, f"flaky.{key}"),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            pass
        else:
            emit({**base, "kind": "handler_failed"})
            raise RuntimeError(f"planned failure of the first delivery of {key}")
    data = json.dumps({"key": key, "topic": topic, "payload": payload}).encode()
    try:
        fd = os.open(os.path.join(effects, f"effect.{key}"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as e:
        if e.errno != errno.EEXIST:
            raise
        first = False
    else:
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        first = True
    emit({**base, "kind": "delivery", "first": first})


def _step_record(ctx: shoal.RunContext, kind: str, **more: Any) -> dict[str, Any]:
    return {"kind": kind, "run": ctx.run_id, "step": ctx.step_key, "epoch": ctx.lease_epoch,
            "pid": os.getpid(), "t": time.time(), **more}


def make_app(store: str, instance_id: str | None = None, lease: float = 2.0,
             cron: bool = False) -> shoal.App:
    """The app every process of the test builds, over ``store`` (a store URL)."""
    app = shoal.App(NAMESPACE, store=store, instance_id=instance_id, lease=lease,
                    max_concurrent_runs=8)

    async def fake_model(ctx: shoal.RunContext, i: int) -> dict[str, Any]:
        """A model call: slow, and not free (the log counts the calls)."""
        emit(_step_record(ctx, "model", i=i))
        await asyncio.sleep(random.uniform(0.1, 0.6))
        return {"text": f"Dear customer {i}, your order ships this week.", "pid": os.getpid()}

    async def send_email(ctx: shoal.RunContext, payload: dict[str, Any]) -> dict[str, Any]:
        ctx.outbox.send("email", payload)
        return {"sent": payload["kind"]}

    def ship(ctx: shoal.RunContext, i: int, c: int, won: dict[str, bool]) -> list[str]:
        """A sync step (run in a thread): one outbox entry per tree key this child won."""
        mine = sorted(k for k, w in won.items() if w)
        for key in mine:
            ctx.outbox.send("ship", {"i": i, "c": c, "tree_key": key})
        return mine

    @app.workflow(name="order", max_attempts=30, backoff=0.2, max_backoff=1.0)
    async def order(ctx: shoal.RunContext, input: dict[str, Any]) -> dict[str, Any]:
        i, n_children = input["i"], input["children"]
        draft = await ctx.step("model", fake_model, ctx, i)
        decision = await ctx.approval("send", {"i": i, "draft": draft["text"]}, expires_in=600)
        out: dict[str, Any] = {"i": i, "approved": decision.approved, "by": decision.by,
                               "data": decision.data, "reason": decision.reason}
        if not decision.approved:
            await ctx.step("email", send_email, ctx,
                           {"i": i, "kind": "denied", "to": f"c{i}@example.com",
                            "flaky": input.get("flaky", False)})
            return out
        children = [await ctx.start_child("part", {"i": i, "c": c, "keys": child_keys(i, c)})
                    for c in range(n_children)]
        out["children"] = [child.id for child in children]
        out["results"] = [await child.result() for child in children]
        out["tree"] = {key: await ctx.tree.get(key) for key in tree_keys(n_children)}
        await ctx.step("email", send_email, ctx,
                       {"i": i, "kind": "shipped", "to": f"c{i}@example.com",
                        "flaky": input.get("flaky", False)})
        return out

    @app.workflow(name="part", max_attempts=30, backoff=0.2, max_backoff=1.0)
    async def part(ctx: shoal.RunContext, input: dict[str, Any]) -> dict[str, Any]:
        i, c = input["i"], input["c"]

        async def prepare() -> int:
            emit(_step_record(ctx, "prepare", i=i, c=c))
            await asyncio.sleep(random.uniform(0.05, 0.5))
            return os.getpid()

        await ctx.step("prepare", prepare)
        won = {}
        for key in input["keys"]:
            won[key] = await ctx.tree.save_if_absent(key, {"c": c, "run": ctx.run_id})
        shipped = await ctx.step("ship", ship, ctx, i, c, won)
        return {"c": c, "run": ctx.run_id, "won": won, "shipped": shipped}

    @app.outbox_handler("email")
    def deliver_email(payload: Any, key: str) -> None:
        _effect("email", payload, key)

    @app.outbox_handler("ship")
    async def deliver_ship(payload: Any, key: str) -> None:
        # a slow downstream (FLOW_HANDLER_DELAY seconds), without blocking the event loop
        await asyncio.sleep(float(os.environ.get("FLOW_HANDLER_DELAY", "0")))
        _effect("ship", payload, key)

    @app.workflow(name="burst", max_attempts=30, backoff=0.2, max_backoff=1.0)
    async def burst(ctx: shoal.RunContext, input: dict[str, Any]) -> int:
        """One step sending ``n`` outbox entries at once."""
        async def send() -> int:
            for n in range(input["n"]):
                ctx.outbox.send("ship", {"i": -1, "c": -1, "n": n})
            return int(input["n"])
        return int(await ctx.step("send", send))

    @app.on_pause_notify
    def notified(pause: shoal.Pause) -> None:
        emit({"kind": "notify", "pause": pause.id, "run": pause.run_id, "pid": os.getpid(),
              "t": time.time()})

    if cron:
        @app.cron(CRON, name="every-second")
        @app.workflow(name="tick", max_attempts=30, backoff=0.2, max_backoff=1.0)
        async def tick(ctx: shoal.RunContext, input: dict[str, Any]) -> float:
            async def fired() -> float:
                emit(_step_record(ctx, "tick", scheduled_at=input["scheduled_at"]))
                return float(input["scheduled_at"])
            return float(await ctx.step("fired", fired))

    return app


def worker() -> None:
    harness.serve(lambda: make_app(os.environ["FLOW_STORE"], os.environ["FLOW_INSTANCE"],
                                   float(os.environ.get("FLOW_LEASE", "2.0")),
                                   cron=bool(os.environ.get("FLOW_CRON"))),
                  emit, "FLOW", drain=5.0)


async def resolver() -> None:
    """Resume the pauses read on stdin (``{"pause", "approved", "at"}``, one JSON line each) at
    wall-clock time ``at``, with ``by="resolver"``; print ``{"pause", "won", "error"}`` lines."""
    app = make_app(os.environ["FLOW_STORE"])
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    async def answer(order: dict[str, Any]) -> None:
        await asyncio.sleep(max(0.0, order["at"] - time.time()))
        result: dict[str, Any] = {"pause": order["pause"], "won": False, "error": None,
                                  "t": time.time()}
        try:
            await app.resume(order["pause"], approved=order["approved"],
                             data={"who": "resolver"}, by="resolver")
            result["won"] = True
        except shoal.NotPausedError:
            pass
        except Exception as e:   # reported to the test, which fails on it
            result["error"] = f"{type(e).__name__}: {e}"
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()

    async with app.open():
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            task = asyncio.create_task(answer(json.loads(line)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks)


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        worker()
    elif sys.argv[1:] == ["resolver"]:
        harness.start_guard("FLOW")
        asyncio.run(resolver())
    else:
        sys.exit(f"usage: {sys.argv[0]} worker|resolver")
