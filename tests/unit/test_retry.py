"""``app.retry``: a failed or cancelled run started again from its checkpoints, on the memory
store under a VirtualClock (the store's part runs on every backend in shoal.testing.contract)."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import status_is, until

import shoal
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


def make_app(clock: VirtualClock, store: shoal.Store, **kw: Any) -> shoal.App:
    return shoal.App("test", store=store, clock=clock, lease=30.0, **kw)


class Reasons:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def on_run_start(self, run: shoal.Run) -> None:
        self.seen.append(("start", run.id))

    def on_run_resume(self, run: shoal.Run, reason: str) -> None:
        self.seen.append((reason, run.id))


async def test_a_failed_run_retried_does_not_repeat_its_finished_steps(
    clock: VirtualClock,
) -> None:
    store = MemoryStore()
    app = make_app(clock, store, instance_id="worker")
    calls = {"charge": 0, "ship": 0}
    delivered: list[str] = []
    broken = True

    def charge() -> str:
        calls["charge"] += 1
        return "ch-1"

    def ship() -> str:
        calls["ship"] += 1
        if broken:
            raise RuntimeError("the carrier is down")
        return "shipped"

    @app.workflow(max_attempts=1)
    async def order(ctx: shoal.RunContext, input: Any) -> dict[str, str]:
        async def charge_and_tell() -> str:
            ctx.outbox.send("email", {"order": input})
            return charge()
        charged = await ctx.step("charge", charge_and_tell)
        shipped = await ctx.step("ship", ship)
        return {"charge": charged, "ship": shipped}

    @app.outbox_handler("email")
    async def email(payload: Any, key: str) -> None:
        delivered.append(key)

    reasons = app.observe(Reasons())
    async with app:
        run = await app.dispatch(order, "o-7", idempotency_key="o-7")
        await until(status_is(app, run.id, "failed"))
        failed = await app.get_run(run.id)
        assert failed.attempts == 1 and "carrier is down" in (failed.error or "")
        broken = False
        # from another process that only submits work
        client = make_app(clock, store, instance_id="client")
        async with client.open():
            retried = await client.retry(run.id)
            assert retried.status == "queued" and retried.attempts == 0
            # the idempotency key still names the same run
            assert (await client.dispatch("order", "o-7", idempotency_key="o-7")).id == run.id
        assert await app.result(run.id) == {"charge": "ch-1", "ship": "shipped"}
        await until(lambda: _is(delivered, 1))
    assert calls == {"charge": 1, "ship": 2}
    assert delivered == [f"{run.id}:1:0"]
    assert reasons.seen == [("start", run.id), ("retried", run.id)]
    done = await app.get_run(run.id)
    assert done.attempts == 1 and done.max_attempts == 1


async def _is(items: list[Any], n: int) -> bool:
    return len(items) == n


async def test_retry_refuses_runs_that_are_live_or_succeeded(clock: VirtualClock) -> None:
    app = make_app(clock, MemoryStore())

    @app.workflow
    async def hold(ctx: shoal.RunContext, input: Any) -> int:
        await ctx.wait_for("go")
        return 1

    async with app:
        run = await app.dispatch(hold, tenant="acme")
        await until(status_is(app, run.id, "waiting"))
        with pytest.raises(shoal.NotRetryableError, match=r"is waiting .*cancel it first"):
            await app.retry(run.id)
        with pytest.raises(shoal.UnknownRunError):
            await app.retry("missing")
        # another tenant's run reads as unknown
        with pytest.raises(shoal.UnknownRunError):
            await app.retry(run.id, tenant="other")
        await app.signal(run.id, "go")
        assert await app.result(run.id) == 1
        with pytest.raises(shoal.NotRetryableError, match="succeeded: dispatch a new run"):
            await app.retry(run.id, tenant="acme")
        assert (await app.get_run(run.id)).status == "succeeded"


async def test_a_cancelled_run_retried_asks_for_its_approval_again(clock: VirtualClock) -> None:
    app = make_app(clock, MemoryStore())
    picked = 0

    def pick() -> int:
        nonlocal picked
        picked += 1
        return 3

    @app.workflow
    async def refund(ctx: shoal.RunContext, input: Any) -> Any:
        n = await ctx.step("pick", pick)
        decision = await ctx.approval("refund", {"items": n})
        return {"approved": decision.approved, "items": n}

    async with app:
        run = await app.dispatch(refund)
        await until(status_is(app, run.id, "waiting"))
        [first] = await app.pending_pauses()
        await app.cancel(run.id)
        assert await app.pending_pauses() == []
        await app.retry(run.id)
        await until(status_is(app, run.id, "waiting"))
        [second] = await app.pending_pauses()
        assert second.id != first.id and second.request == {"items": 3}
        await app.resume(second.id, approved=True)
        assert await app.result(run.id) == {"approved": True, "items": 3}
    assert picked == 1
