"""The worker side of ``test_failover.py``: one shoal App over a PostgreSQL primary and its
standby, named in one URL as a libpq host list with ``target_session_attrs=read-write``. Its
steps append their side effects to a shared log, and its store appends every write the server
acknowledged (a checkpoint, a settlement), so the test can tell which ones a failover must keep.

``python failover_app.py worker``    serve until SIGTERM (``App.run_forever``), then close

Configured by environment variables: ``FAILOVER_STORE`` (the store URL), ``FAILOVER_LOG`` (the
shared log), ``FAILOVER_INSTANCE`` (instance id), ``FAILOVER_LEASE`` (seconds),
``FAILOVER_DRAIN`` (close timeout), ``FAILOVER_MAX_LIFE`` (seconds; the worker exits by itself
after that). Log lines, one JSON object each:

- ``start``/``end``/``abort``: a step's side effect began, ended (``ok``), or was cancelled
  (the shape of ``proc_app.py``'s, so ``test_sqlite_processes.check_invariants`` reads them);
- ``ack``: ``checkpoint_step`` returned True (``run``, ``seq``, ``epoch``, ``name``);
- ``settled``: ``settle_run`` or ``settle_and_claim`` answered True (``run``, ``epoch``,
  ``status``).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

import harness

import shoal
from shoal.stores.postgres import PostgresStore

NAMESPACE = "failover"
emit = harness.LineLog("FAILOVER_LOG")


class AckingStore(PostgresStore):
    """The PostgreSQL store, logging each checkpoint and settlement the server acknowledged:
    a failover may lose what was never acknowledged, never what was. ``log_line`` is the
    log it appends to (``chaos_app.py`` gives it its own)."""

    log_line: harness.LineLog = emit

    async def checkpoint_step(self, fence: Any, step: Any, lease: float, now: float,
                              outbox: Sequence[Any] = ()) -> bool:
        ok = await super().checkpoint_step(fence, step, lease, now, outbox)
        if ok:
            self.log_line({"kind": "ack", "run": fence.run_id, "seq": step.seq,
                           "name": step.name, "epoch": fence.epoch, "pid": os.getpid(),
                           "t": time.time()})
        return ok

    async def settle_run(self, fence: Any, settlement: Any, now: float) -> bool:
        ok = await super().settle_run(fence, settlement, now)
        if ok:
            self._settled(fence, settlement)
        return ok

    async def settle_and_claim(self, settlements: Sequence[Any], *args: Any,
                               **kwargs: Any) -> Any:
        answers, claimed = await super().settle_and_claim(settlements, *args, **kwargs)
        for (fence, settlement, _), ok in zip(settlements, answers, strict=True):
            if ok:
                self._settled(fence, settlement)
        return answers, claimed

    def _settled(self, fence: Any, settlement: Any) -> None:
        self.log_line({"kind": "settled", "run": fence.run_id, "epoch": fence.epoch,
                       "status": settlement.outcome, "pid": os.getpid(), "t": time.time()})


async def _work(ctx: shoal.RunContext, n: int, input: dict[str, Any]) -> dict[str, Any]:
    """Step ``n``: log its start, sleep a little, log its end (or its cancellation)."""
    base = {"run": ctx.run_id, "step": ctx.step_key, "n": n, "epoch": ctx.lease_epoch,
            "attempt": ctx.attempt, "ckey": input.get("key"), "pid": os.getpid()}
    start = time.time()
    emit({**base, "kind": "start", "t": start})
    try:
        await asyncio.sleep(random.uniform(0.05, 0.25))
    except asyncio.CancelledError:
        emit({**base, "kind": "abort", "start": start, "t": time.time()})
        raise
    emit({**base, "kind": "end", "ok": True, "start": start, "end": time.time()})
    return {"n": n, "pid": os.getpid(), "epoch": ctx.lease_epoch}


def make_app(url: str, instance_id: str | None = None, lease: float = 2.0) -> shoal.App:
    """The app of the workers and of the test: workflow ``chaos`` (four steps, a durable sleep
    between the second and the third when the input asks), as ``proc_app.py`` has it."""
    app = shoal.App(NAMESPACE, store=AckingStore.from_url(url), instance_id=instance_id,
                    lease=lease, max_concurrent_runs=8)

    @app.workflow(name="chaos", max_attempts=20, backoff=0.2, max_backoff=1.0,
                  concurrency_key=lambda i: i.get("key"))
    async def chaos(ctx: shoal.RunContext, input: dict[str, Any]) -> list[Any]:
        outputs = []
        for n in range(4):
            if n == 2 and input.get("sleep"):
                await ctx.sleep(input["sleep"])
            outputs.append(await ctx.step(f"s{n}", _work, ctx, n, input))
        return outputs

    return app


def worker() -> None:
    harness.serve(lambda: make_app(os.environ["FAILOVER_STORE"], os.environ["FAILOVER_INSTANCE"],
                                   float(os.environ.get("FAILOVER_LEASE", "2.0"))),
                  emit, "FAILOVER", drain=10.0)


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        worker()
    else:
        sys.exit(f"usage: {sys.argv[0]} worker")
