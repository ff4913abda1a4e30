"""Provider limits, the circuit breaker, budgets and tenants through the public API, on two
instances over one store (memory, then SQLite) and one VirtualClock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers import until

import shoal
from shoal.stores.base import Store
from shoal.stores.memory import MemoryStore
from shoal.stores.sqlite import SQLiteStore
from shoal.testing import VirtualClock, cluster, settle


def make(store: Any, clock: Any, instance_id: str) -> shoal.App:
    return shoal.App("agents", store=store, clock=clock, instance_id=instance_id, lease=30.0)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "sqlite":
        pytest.importorskip("shoal.stores.sqlite_rate")
    s: Store = MemoryStore() if request.param == "memory" else SQLiteStore(
        str(tmp_path / "rates.db"))
    await s.open()
    yield s
    await s.close()


@pytest.fixture
async def two(clock: VirtualClock, store: Store) -> AsyncIterator[list[shoal.App]]:
    async with cluster(make, instances=2, clock=clock, store=store) as apps:
        yield apps


def providers(apps: list[shoal.App], **options: Any) -> list[shoal.Provider]:
    return [app.provider("openai", **options) for app in apps]


class FakeModel:
    """Records concurrency and the virtual times of calls."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.running = 0
        self.peak = 0
        self.calls: list[float] = []

    async def __call__(self, hold: float = 0.0) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.calls.append(self.clock.now())
        try:
            if hold:
                await self.clock.sleep(hold)
        finally:
            self.running -= 1


async def run_all(clock: VirtualClock, tasks: list[asyncio.Task[Any]], step: float = 1.0,
                  limit: float = 600.0) -> None:
    waited = 0.0
    while not all(t.done() for t in tasks):
        assert waited < limit, "calls never finished"
        await clock.advance(step)
        waited += step
    for t in tasks:
        t.result()


async def test_concurrency_never_passes_the_maximum_across_replicas(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    model = FakeModel(clock)
    ps = providers(two, max_concurrent=3)

    async def one(i: int) -> None:
        async with ps[i % 2].call():
            await model(hold=5)

    tasks = [asyncio.create_task(one(i)) for i in range(10)]
    await run_all(clock, tasks)
    assert model.peak == 3 and len(model.calls) == 10


async def test_requests_per_minute_hold_across_replicas(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    model = FakeModel(clock)
    ps = providers(two, requests_per_minute=4)
    start = clock.now()

    async def one(i: int) -> None:
        async with ps[i % 2].call():
            await model()

    tasks = [asyncio.create_task(one(i)) for i in range(10)]
    await run_all(clock, tasks)
    for t in model.calls:
        assert sum(1 for u in model.calls if t - 60 < u <= t) <= 4, model.calls
    assert sum(1 for u in model.calls if u < start + 60) == 4


async def test_tokens_per_minute_count_what_was_used(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = providers(two, tokens_per_minute=1000)
    async with a.call(tokens=800) as call:
        call.used(tokens=300)                        # the estimate was too high
    async with b.call(tokens=700):                   # fits: 300 + 700
        pass
    late = asyncio.create_task(b.call(tokens=100).__aenter__())
    await settle()
    assert not late.done()
    await run_all(clock, [late])
    assert clock.now() >= 1_767_225_600.0 + 60
    with pytest.raises(ValueError, match="never fit"):
        a.call(tokens=1001)


async def test_a_429_pauses_the_provider_for_every_replica(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    model = FakeModel(clock)
    a, b = providers(two, max_concurrent=5)
    async with a.call() as call:
        call.rate_limited(retry_after=20)
    paused_at = clock.now()
    assert await b.cooldown_until() == pytest.approx(paused_at + 20)

    async def one() -> None:
        async with b.call():
            await model()

    task = asyncio.create_task(one())
    await run_all(clock, [task])
    assert model.calls[0] >= paused_at + 20


async def test_the_breaker_opens_for_all_then_half_opens(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = providers(two, breaker=shoal.Breaker(failures=2, window=60, cooldown=30))
    for p in (a, b):
        with pytest.raises(RuntimeError):
            async with p.call():
                raise RuntimeError("provider 500")
    for p in (a, b):
        with pytest.raises(shoal.CircuitOpenError):
            async with p.call():
                pytest.fail("an open circuit lets no call through")
    ready = await two[1].check_readiness()
    assert ready.status == shoal.HealthStatus.DEGRADED and "openai" in ready.reason
    await clock.advance(31)
    # half-open: one trial at a time; its failure opens the circuit again
    trial = a.call()
    await trial.__aenter__()
    with pytest.raises(shoal.CircuitOpenError):
        async with b.call():
            pass
    await trial.__aexit__(RuntimeError, RuntimeError("still down"), None)
    with pytest.raises(shoal.CircuitOpenError):
        async with b.call():
            pass
    await clock.advance(31)
    async with b.call():                             # the trial succeeds: closed
        pass
    async with a.call():
        pass
    assert (await two[0].check_readiness()).status == shoal.HealthStatus.HEALTHY


async def test_waiting_past_the_timeout_raises(clock: VirtualClock, two: list[shoal.App]) -> None:
    a, _ = providers(two, max_concurrent=1)
    holder = a.call()
    await holder.__aenter__()
    waiter = asyncio.create_task(a.call(timeout=5).__aenter__())
    await run_all(clock, [asyncio.create_task(asyncio.sleep(0))])
    for _ in range(10):
        await clock.advance(1)
    assert waiter.done()
    with pytest.raises(shoal.RateLimitTimeoutError, match="max_concurrent=1"):
        waiter.result()
    await holder.__aexit__(None, None, None)


async def test_tenants_take_turns_within_an_instance(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, _ = providers(two, max_concurrent=1)
    order: list[str] = []

    async def one(tenant: str) -> None:
        async with a.call(tenant=tenant):
            order.append(tenant)
            await clock.sleep(1)

    tasks = []
    for tenant in ["big", "big", "big", "big", "small", "small"]:
        tasks.append(asyncio.create_task(one(tenant)))
        await settle(2)
    await run_all(clock, tasks, step=0.5)
    # the second "big" call already had its turn (waiting for the slot) when "small" arrived;
    # from then on the tenants alternate instead of "small" waiting behind all of "big"
    assert order == ["big", "big", "small", "big", "small", "big"], order


# -- budgets ----------------------------------------------------------------------------------


async def test_a_run_budget_stops_calls_and_names_the_budget(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = two
    for app in two:
        app.budget(per_run=1.0, per_tenant_day=100.0)
    pa = a.provider("openai", price_per_token=0.001)
    b.provider("openai", price_per_token=0.001)
    calls: list[int] = []

    @a.workflow
    async def agent(ctx: shoal.RunContext, input: Any) -> Any:
        for i in range(5):
            async def call(i: int = i) -> int:
                async with pa.call(tokens=300) as c:
                    c.used(tokens=250)
                    calls.append(i)
                return i
            try:
                await ctx.step(f"call{i}", call)
            except shoal.BudgetExceededError as e:
                return {"stopped": str(e), "spent": e.spent}
        return {"stopped": None}

    run = await a.dispatch("agent", tenant="acme")
    out = await a.result(run.id)
    # each call reserves its 0.3 estimate and then costs 0.25: after three (0.75) a fourth
    # estimate has no room under 1.0
    assert calls == [0, 1, 2]
    assert "per-run budget" in out["stopped"] and out["spent"] == pytest.approx(0.75)
    spent = await b.spent(tenant="acme", run_id=run.id)
    assert spent[f"the per-run budget of run {run.id}"] == pytest.approx(0.75)
    ledger = await b.ledger(tenant="acme")
    assert [e.amount for e in ledger] == [pytest.approx(0.25)] * 3
    assert all(e.run_id == run.id and e.root_id == run.id for e in ledger)


async def test_two_replicas_spending_at_once_pass_a_budget_by_at_most_one_estimate(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    for app in two:
        app.budget(per_tenant_day=10.0)
    ps = [app.provider("openai", max_concurrent=50) for app in two]
    refused = 0

    async def one(i: int) -> None:
        nonlocal refused
        try:
            async with ps[i % 2].call(tenant="acme", cost=1.0) as call:
                await settle(1)
                call.used(cost=1.0 + (i % 3) * 0.1)       # a little more than estimated
        except shoal.BudgetExceededError:
            refused += 1

    await asyncio.gather(*(one(i) for i in range(30)))
    spent = await two[0].spent(tenant="acme")
    total = next(v for k, v in spent.items() if "tenant 'acme'" in k)
    assert refused == 20
    assert 10.0 <= total <= 10.0 + 1.0 * 2, total   # over only by what calls cost beyond estimates


async def test_ctx_spend_is_recorded_and_shared(clock: VirtualClock, two: list[shoal.App]) -> None:
    a, b = two

    @a.workflow
    async def charge(ctx: shoal.RunContext, input: Any) -> None:
        async def pay() -> None:
            await ctx.spend(0.5, currency="eur")
        await ctx.step("pay", pay)

    run = await a.dispatch("charge", tenant="t1")
    await a.result(run.id)
    assert [(e.tenant, e.amount, e.currency) for e in await b.ledger()] == [("t1", 0.5, "eur")]
    with pytest.raises(ValueError, match="a number >= 0"):
        await b.spend(-1)


# -- tenants ----------------------------------------------------------------------------------


async def test_one_tenant_cannot_reach_another_tenants_runs(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = two

    @a.workflow
    async def ask(ctx: shoal.RunContext, input: Any) -> Any:
        return (await ctx.approval("ok?")).approved

    run = await a.dispatch("ask", tenant="acme")

    async def paused() -> bool:
        return bool(await b.pending_pauses(tenant="acme"))

    await until(paused)
    assert await b.pending_pauses(tenant="other") == []
    pause = (await b.pending_pauses(tenant="acme"))[0]
    with pytest.raises(shoal.UnknownRunError):
        await b.get_run(run.id, tenant="other")
    with pytest.raises(shoal.UnknownRunError):
        await b.signal(run.id, "x", tenant="other")
    with pytest.raises(shoal.UnknownRunError):
        await b.cancel(run.id, tenant="other")
    with pytest.raises(shoal.UnknownPauseError):
        await b.resume(pause.id, tenant="other")
    assert (await b.get_run(run.id, tenant="acme")).status == "waiting"
    await b.resume(pause.id, tenant="acme")
    assert await a.result(run.id, tenant="acme") is True
