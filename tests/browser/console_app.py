"""The worker side of the console's browser tests: one shoal App over a shared SQLite file, with
workflows that give the console something to show and steer. Steps and deliveries append what
they did to a shared log (one JSON line per write), so a test can count effects.

- ``order``: three short steps (the second spends 0.02 usd), the last sends an ``email`` outbox
  entry; returns its input.
- ``batch``: three child ``order`` runs, awaited.
- ``charge``: one step that fails (``RuntimeError`` naming the card) until the flag file
  ``charge-ok-RUN_ID`` exists; one attempt, so a failure is final until someone retries it.
- ``refund``: a step, an approval ``refund`` (the request names amount and customer), then a
  step ``pay`` that logs the decision it was given.
- ``nap``: a step, then a durable sleep of an hour, then a step.
- ``notify``: one step sending a ``webhook`` entry, whose handler fails (dead-lettered at its
  first failure) until the flag file ``webhook-ok`` exists.
- ``index``: ``input["chunks"]`` chunks, each a step that starts once the flag file
  ``index-RUN_ID-I`` exists, reporting its progress (``ctx.progress``) before each one and at
  the end.

``python console_app.py worker``: serve until SIGTERM. Environment: ``CONSOLE_STORE`` (a store
URL), ``CONSOLE_LOG`` (the log), ``CONSOLE_FLAGS`` (the directory of flag files),
``CONSOLE_INSTANCE``, ``CONSOLE_MAX_LIFE`` (a guard against leftovers).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))

import harness

import shoal

NAMESPACE = "shop"
emit = harness.LineLog("CONSOLE_LOG")


def flag(name: str) -> bool:
    return (Path(os.environ["CONSOLE_FLAGS"]) / name).exists()


def make_app(store: str, instance_id: str | None = None) -> shoal.App:
    app = shoal.App(NAMESPACE, store=store, instance_id=instance_id, lease=2.0,
                    max_concurrent_runs=4, version="2026.12.1",
                    membership_interval=0.5)

    async def pause_a_little(name: str) -> dict[str, Any]:
        await asyncio.sleep(random.uniform(0.05, 0.25))
        return {"step": name, "pid": os.getpid()}

    @app.workflow(name="order")
    async def order(ctx: shoal.RunContext, input: Any) -> Any:
        async def charge_card() -> dict[str, Any]:
            await ctx.spend(0.02)
            return await pause_a_little("charge")

        await ctx.step("reserve", pause_a_little, "reserve")
        await ctx.step("charge", charge_card)

        async def ship() -> str:
            ctx.outbox.send("email", {"to": "customer@example.com", "order": input})
            return "shipped"

        await ctx.step("ship", ship)
        return {"echo": input}

    @app.workflow(name="batch")
    async def batch(ctx: shoal.RunContext, input: dict[str, Any]) -> list[Any]:
        children = [await ctx.start_child("order", {"batch": input["batch"], "part": i})
                    for i in range(3)]
        return [await child.result() for child in children]

    @app.workflow(name="charge", max_attempts=1)
    async def charge(ctx: shoal.RunContext, input: dict[str, Any]) -> dict[str, Any]:
        def authorize() -> dict[str, Any]:
            if not flag(f"charge-ok-{ctx.run_id}"):
                raise RuntimeError(f"card declined: {input['card']}")
            return {"authorization": "A-1001"}

        return await ctx.step("authorize", authorize)

    @app.workflow(name="refund")
    async def refund(ctx: shoal.RunContext, input: dict[str, Any]) -> dict[str, Any]:
        await ctx.step("assess", pause_a_little, "assess")
        decision = await ctx.approval("refund", {"amount": input["amount"],
                                                 "customer": input["customer"]},
                                      expires_in=3600)

        def pay() -> bool:
            emit({"kind": "paid", "run": ctx.run_id, "approved": decision.approved,
                  "by": decision.by, "reason": decision.reason, "pid": os.getpid(),
                  "t": time.time()})
            return decision.approved

        await ctx.step("pay", pay)
        return {"approved": decision.approved, "by": decision.by, "reason": decision.reason}

    @app.workflow(name="nap")
    async def nap(ctx: shoal.RunContext, input: Any) -> str:
        await ctx.step("prepare", pause_a_little, "prepare")
        await ctx.sleep(3600)
        await ctx.step("after", pause_a_little, "after")
        return "woke"

    @app.workflow(name="notify")
    async def notify(ctx: shoal.RunContext, input: Any) -> str:
        async def send() -> str:
            ctx.outbox.send("webhook", input)
            return "sent"

        return await ctx.step("send", send)

    @app.workflow(name="index")
    async def index(ctx: shoal.RunContext, input: dict[str, Any]) -> int:
        total = input["chunks"]
        for i in range(total):
            ctx.progress(i / total, f"chunk {i + 1} of {total}", chunk=i + 1)
            while True:   # the test moves it along
                if flag(f"index-{ctx.run_id}-{i}"):
                    break
                await asyncio.sleep(0.05)
            await ctx.step(f"chunk {i}", pause_a_little, f"chunk {i}")
        ctx.progress(1.0, "indexed", chunks=total)
        return total

    @app.outbox_handler("email")
    async def email(payload: Any, key: str) -> None:
        emit({"kind": "email", "key": key, "pid": os.getpid(), "t": time.time()})

    @app.outbox_handler("webhook", max_deliveries=1)
    async def webhook(payload: Any, key: str) -> None:
        if not flag("webhook-ok"):
            raise ConnectionError("POST https://hooks.example.com/paid: 503 Service Unavailable")
        emit({"kind": "webhook", "key": key, "pid": os.getpid(), "t": time.time()})

    return app


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        harness.serve(lambda: make_app(os.environ["CONSOLE_STORE"],
                                       os.environ["CONSOLE_INSTANCE"]),
                      emit, "CONSOLE", drain=3.0)
    else:
        sys.exit(f"usage: {sys.argv[0]} worker")
