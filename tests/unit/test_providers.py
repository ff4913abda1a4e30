"""Provider limits, the circuit breaker, budgets and tenants through the public API, on two
instances over one store (memory, then SQLite) and one VirtualClock."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers import until

import shoal
from shoal.backends.memory import MemoryStore
from shoal.backends.sqlite import SQLiteStore
from shoal.ports import RateStore, Store
from shoal.testing import VirtualClock, cluster, settle


def make(store: Any, clock: Any, instance_id: str) -> shoal.App:
    return shoal.App("agents", store=store, clock=clock, instance_id=instance_id, lease=30.0)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "sqlite":
        pytest.importorskip("shoal.backends.sqlite.rates")
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
    assert await b.cooldown_until() == pytest.approx(paused_at + 20, abs=1e-3)

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


async def test_the_ledger_reads_on_page_by_page(clock: VirtualClock, two: list[shoal.App]) -> None:
    """Two replicas spend, many rows at one time; a reader paging with after=the last id gets
    every row once, in the order written, rows written between pages included."""
    a, b = two
    for i in range(7):
        await (a, b)[i % 2].spend(0.5, tenant=f"t{i % 2}")
    first = await b.ledger(limit=3)
    await a.spend(9.0, tenant="late")
    rows = list(first)
    while page := await a.ledger(after=rows[-1].id, limit=3):
        rows += page
    assert [r.amount for r in rows] == [0.5] * 7 + [9.0]
    assert [r.id for r in rows] == sorted({r.id for r in rows})
    assert {r.at for r in rows} == {clock.now()}
    assert await b.ledger(tenant="t1", after=rows[0].id) == [r for r in rows if r.tenant == "t1"]
    assert await b.ledger(since=clock.now() + 1) == []
    assert await b.ledger(until=clock.now()) == []
    for bad in ({"limit": -1}, {"limit": 1.5}, {"after": "3"}, {"after": True}):
        with pytest.raises(ValueError, match=r"app\.ledger"):
            await b.ledger(**bad)  # type: ignore[arg-type]


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


# -- regressions: admission, the breaker's states, exits ---------------------------------------


class Outage(Exception):
    """The fake provider is down."""


async def fail_once(p: shoal.Provider) -> None:
    with pytest.raises(Outage):
        async with p.call():
            raise Outage()


def rates_of(store: Store) -> RateStore:
    assert isinstance(store, RateStore)
    return store


def events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


async def goes(p: shoal.Provider, **options: Any) -> bool:
    """Whether a call through ``p`` goes at once (False: it would have to wait)."""
    try:
        async with p.call(timeout=0, **options):
            return True
    except shoal.RateLimitTimeoutError:
        return False


async def test_a_store_error_during_admission_gives_back_all_it_took(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = providers(two, max_concurrent=1, requests_per_minute=3, tokens_per_minute=1000,
                     breaker=shoal.Breaker(failures=1, window=60, cooldown=10))
    await fail_once(a)                                   # request 1; the circuit opens
    await clock.advance(11)                              # half-open
    real = rates_of(store).admit

    async def blip(*args: Any) -> Any:
        await real(*args)                                # the store took it all (request 2)...
        raise ConnectionError("store blip")              # ...and its answer was lost

    monkeypatch.setattr(store, "admit", blip)
    with pytest.raises(ConnectionError):
        async with a.call(tokens=10):
            pytest.fail("the call cannot go")
    monkeypatch.setattr(store, "admit", real)
    # the trial slot and the concurrency slot are free again: b's trial goes (and closes the
    # circuit). The request entry stays counted for its minute (taking back an entry that might
    # not have been added could let the window pass its limit): no fourth request fits
    assert await goes(b)
    assert not await goes(b)


async def test_a_cancel_during_admission_gives_back_all_it_took(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = providers(two, max_concurrent=1, requests_per_minute=10,
                     breaker=shoal.Breaker(failures=1, window=60, cooldown=10))
    await fail_once(a)
    await clock.advance(11)
    real = rates_of(store).admit
    stuck = asyncio.Event()

    async def hang(*args: Any) -> Any:
        await real(*args)                                # the store took the trial and the slot
        stuck.set()
        await asyncio.Event().wait()                     # and its answer never comes
        raise AssertionError("unreachable")

    monkeypatch.setattr(store, "admit", hang)
    task = asyncio.create_task(a.call().__aenter__())
    await stuck.wait()                                   # holds the trial and the slot
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    monkeypatch.setattr(store, "admit", real)
    assert await goes(b)                                 # the trial slot and the slot are free


async def test_a_failed_trial_leaves_the_circuit_half_open_after_the_next_cooldown(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = providers(two, breaker=shoal.Breaker(failures=2, window=60, cooldown=30))
    await fail_once(a)
    await fail_once(b)                                   # open until 30
    await clock.advance(30)
    await fail_once(a)                                   # the trial fails: open until 60
    with pytest.raises(shoal.CircuitOpenError):
        async with b.call():
            pass
    await clock.advance(31)      # the failures at 0 left the window: still not closed
    trial = b.call()
    await trial.__aenter__()
    for p in (a, b):                                     # one trial at a time
        with pytest.raises(shoal.CircuitOpenError) as e:
            async with p.call():
                pass
        assert e.value.until is None
    await trial.__aexit__(None, None, None)              # it succeeds: closed
    assert await goes(a) and await goes(b)


async def test_a_long_trial_keeps_the_circuit_half_open_and_its_slot(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = providers(two, breaker=shoal.Breaker(failures=1, window=60, cooldown=10))
    await fail_once(a)
    await clock.advance(11)
    trial = a.call()
    await trial.__aenter__()
    for _ in range(150):          # past the failure's window and the trial slot's first lease
        await clock.advance(1)
    with pytest.raises(shoal.CircuitOpenError):
        async with b.call():
            pass
    await trial.__aexit__(Outage, Outage(), None)        # it fails: open for another cooldown
    with pytest.raises(shoal.CircuitOpenError) as e:
        async with b.call():
            pass
    assert e.value.until == pytest.approx(clock.now() + 10, abs=1e-3)


async def test_a_breaker_whose_window_is_shorter_than_its_cooldown_half_opens(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = providers(two, breaker=shoal.Breaker(failures=1, window=5, cooldown=10))
    await fail_once(a)
    await clock.advance(11)
    trial = a.call()
    await trial.__aenter__()
    with pytest.raises(shoal.CircuitOpenError):          # half-open, not closed
        async with b.call():
            pass
    await trial.__aexit__(None, None, None)
    assert await goes(b)


async def test_replicas_opening_the_circuit_at_once_count_one_opening(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = providers(two, breaker=shoal.Breaker(failures=1, window=60, cooldown=10))
    real = rates_of(store).counter_add

    async def interleaved(*args: Any) -> Any:
        await asyncio.sleep(0)       # both replicas read the circuit closed before either opens
        return await real(*args)

    monkeypatch.setattr(store, "counter_add", interleaved)
    calls = [a.call(), b.call()]
    for call in calls:
        await call.__aenter__()
    await asyncio.gather(*(call.__aexit__(Outage, Outage(), None) for call in calls))
    monkeypatch.undo()
    await clock.advance(11)
    assert await goes(b)                                 # one trial closes it: one opening
    first, second = a.call(), b.call()
    await first.__aenter__()
    await second.__aenter__()                            # closed: not a second trial
    for call in (first, second):
        await call.__aexit__(None, None, None)


async def test_a_trial_that_lost_its_slot_cannot_close_a_later_opening(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial whose slot was lost is cancelled; one whose block swallows the cancellation
    and ends well, too late, closes nothing."""
    a, b = providers(two, breaker=shoal.Breaker(failures=1, window=60, cooldown=10))
    await fail_once(a)
    await clock.advance(11)
    entered, finish = asyncio.Event(), asyncio.Event()

    async def stale_trial() -> None:
        async with a.call():                             # the trial of the first opening
            entered.set()
            while not finish.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await finish.wait()

    stale = asyncio.create_task(stale_trial())
    await entered.wait()

    async def refused(*args: Any) -> bool:
        return False

    monkeypatch.setattr(store, "slot_renew", refused)    # a's process stalls: its lease ends
    for _ in range(61):
        await clock.advance(1)
    monkeypatch.undo()
    assert await goes(b)                                 # b's trial closes the circuit
    await fail_once(b)                                   # and it opens again
    finish.set()                                         # the old trial ends well: too late
    await stale
    await clock.advance(11)      # after the second opening's cooldown: half-open, not closed
    trial = b.call()
    await trial.__aenter__()
    with pytest.raises(shoal.CircuitOpenError) as e:
        async with a.call():
            pass
    assert e.value.until is None
    await trial.__aexit__(None, None, None)


async def test_a_429_then_raised_is_not_a_breaker_failure(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = providers(two, breaker=shoal.Breaker(failures=2, window=60, cooldown=30))
    for p in (a, b):
        with pytest.raises(Outage):
            async with p.call() as call:
                call.rate_limited(retry_after=0)
                raise Outage("429 Too Many Requests")    # what an SDK does after a 429
    assert await a.open_until() is None
    assert await goes(b)


async def test_a_429_pauses_before_the_slot_is_freed(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = providers(two, max_concurrent=1)
    model = FakeModel(clock)
    real = rates_of(store).pause_until
    answer = asyncio.Event()

    async def slow(*args: Any) -> Any:
        await answer.wait()                              # a round trip that takes a while
        return await real(*args)

    monkeypatch.setattr(store, "pause_until", slow)

    async def first() -> None:
        async with a.call() as call:
            call.rate_limited(retry_after=30)

    async def second() -> None:
        async with a.call():
            await model()

    one = asyncio.create_task(first())
    await settle()
    two_ = asyncio.create_task(second())
    await settle()
    answer.set()
    await run_all(clock, [one, two_])
    assert model.calls[0] >= 1_767_225_600.0 + 30


async def test_a_429_reported_while_admission_asks_is_waited_for(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = providers(two, max_concurrent=2)
    model = FakeModel(clock)
    real = rates_of(store).admit
    reported = False

    async def asked_as_429(*args: Any) -> Any:
        nonlocal reported
        if not reported:          # another replica's call answers 429 while a's admission asks
            reported = True
            async with b.call() as other:
                other.rate_limited(retry_after=20)
        return await real(*args)

    monkeypatch.setattr(store, "admit", asked_as_429)

    async def one() -> None:
        async with a.call():
            await model()

    await run_all(clock, [asyncio.create_task(one())])
    assert model.calls[0] >= 1_767_225_600.0 + 20


async def test_the_timeout_covers_waiting_for_the_turn(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, _ = providers(two, max_concurrent=1)
    holder = a.call(tenant="t1")
    await holder.__aenter__()
    head = asyncio.create_task(a.call(tenant="t2").__aenter__())      # waits for the slot
    await settle()
    behind = asyncio.create_task(a.call(tenant="t3", timeout=1).__aenter__())
    await settle()
    for _ in range(3):
        await clock.advance(1)
    assert behind.done()
    with pytest.raises(shoal.RateLimitTimeoutError, match="max_concurrent=1"):
        behind.result()
    assert not head.done()
    await holder.__aexit__(None, None, None)
    await run_all(clock, [head])
    await head.result().__aexit__(None, None, None)


async def test_an_open_circuit_fails_callers_at_once_even_behind_a_waiting_call(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = providers(two, max_concurrent=2,
                     breaker=shoal.Breaker(failures=1, window=60, cooldown=30))
    held = a.call()
    await held.__aenter__()
    failing = b.call()
    await failing.__aenter__()
    head = asyncio.create_task(a.call().__aenter__())          # waits for a slot
    await settle()
    await failing.__aexit__(Outage, Outage(), None)            # b opens the circuit
    late = asyncio.create_task(a.call().__aenter__())
    await settle()
    assert late.done() and isinstance(late.exception(), shoal.CircuitOpenError)
    await clock.advance(1)
    assert head.done() and isinstance(head.exception(), shoal.CircuitOpenError)
    await held.__aexit__(None, None, None)


async def test_fewer_tokens_than_estimated_leave_the_window_with_the_estimate(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = providers(two, tokens_per_minute=1000)

    async def long_call() -> None:
        async with a.call(tokens=1000) as call:
            await clock.sleep(40)
            call.used(tokens=0)

    task = asyncio.create_task(long_call())
    await run_all(clock, [task])                         # it went at 0 and ended at 40
    assert await goes(b, tokens=500)                     # the correction made room at once
    await clock.advance(21)      # the estimate left the window at 60, and its correction too
    assert await goes(b, tokens=500)                     # with the 500 of 40: full
    assert not await goes(b, tokens=1)
    assert not await goes(a, tokens=1)


async def test_a_call_across_utc_midnight_corrects_the_day_it_was_counted_under(
    store: Store
) -> None:
    clock = VirtualClock(start=1_767_225_600.0 - 5)      # 5 s before 2026-01-01 UTC
    async with cluster(make, instances=2, clock=clock, store=store) as apps:
        for app in apps:
            app.budget(per_tenant_day=1.0)
        a, b = providers(apps, price_per_token=0.0001)

        async def across() -> None:
            async with a.call(tokens=5000, tenant="t") as call:     # 0.5 reserved on Dec 31
                await clock.sleep(10)
                call.used(tokens=2000)                              # 0.2 spent

        await run_all(clock, [asyncio.create_task(across())])
        spent = await apps[1].spent(tenant="t")
        assert spent == {"the daily budget of tenant 't' (2026-01-01 UTC)": 0.0}, spent
        with pytest.raises(shoal.BudgetExceededError):   # Jan 1 has 1.0, not 1.3
            async with b.call(tenant="t", cost=1.2):
                pass
        ledger = await apps[1].ledger(tenant="t")
        assert [e.at for e in ledger] == [1_767_225_605.0]
        assert ledger[0].amount == pytest.approx(0.2)


async def test_an_exhausted_budget_refuses_calls_estimated_at_nothing(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    for app in two:
        app.budget(per_tenant_day=1.0)
    a = two[0].provider("openai")                        # no price: every estimate is 0
    b = two[1].provider("priced", price_per_token=0.001)
    assert await goes(a, tenant="t")                     # room left: it goes
    await two[1].spend(1.0, tenant="t")                  # exactly at the limit
    for p, options in ((a, {}), (b, {"tokens": 0}), (a, {"cost": 0.0})):
        with pytest.raises(shoal.BudgetExceededError, match="daily budget") as e:
            async with p.call(tenant="t", **options):
                pytest.fail("the budget is spent")
        assert e.value.spent == pytest.approx(1.0) and e.value.amount == 0
    assert await goes(a, tenant="other")                 # another tenant's budget has room


async def test_a_store_error_at_exit_skips_nothing_else_and_hides_no_error(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="shoal")
    for app in two:
        app.budget(per_tenant_day=10.0)
    a, b = providers(two, max_concurrent=1, tokens_per_minute=1000,
                     breaker=shoal.Breaker(failures=1, window=60, cooldown=30))

    async def down(*args: Any) -> Any:
        raise ConnectionError("store blip")

    with pytest.raises(Outage, match="the body's own"):
        async with a.call(tokens=100, tenant="t", cost=1.0) as call:
            monkeypatch.setattr(store, "window_add", down)   # correction, failure count fail
            call.used(tokens=10, cost=0.25)
            raise Outage("the body's own error")
    assert len(events(caplog, "provider.exit_failed")) == 2      # correction, failure count
    monkeypatch.undo()
    # the cost was recorded and the slot freed even though steps before them failed
    spent = await two[1].spent(tenant="t")
    assert list(spent.values()) == [pytest.approx(0.25)]
    assert await goes(b, tenant="t")


async def test_the_exit_runs_to_its_end_when_the_caller_is_cancelled(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = providers(two, max_concurrent=1)
    real = rates_of(store).pause_until
    writing = asyncio.Event()
    answer = asyncio.Event()

    async def slow(*args: Any) -> Any:
        writing.set()
        await answer.wait()
        return await real(*args)

    monkeypatch.setattr(store, "pause_until", slow)

    async def call() -> None:
        async with a.call() as c:
            c.rate_limited(retry_after=30)

    task = asyncio.create_task(call())
    await writing.wait()
    task.cancel()                                        # while the exit writes the pause
    await settle()
    answer.set()
    with pytest.raises(asyncio.CancelledError):          # the caller's cancel is not swallowed
        await task
    assert await b.cooldown_until() == pytest.approx(clock.now() + 30, abs=1e-3)
    monkeypatch.undo()
    await clock.advance(31)
    assert await goes(b)                                 # the slot was freed


async def test_a_lost_slot_is_logged_and_the_call_cancelled(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="shoal")
    a, _ = providers(two, max_concurrent=1)

    async def refused(*args: Any) -> bool:
        return False

    monkeypatch.setattr(store, "slot_renew", refused)
    model = FakeModel(clock)

    async def one() -> None:
        async with a.call():
            await model(hold=50)

    with pytest.raises(shoal.StoreUnavailableError, match="refused to renew"):
        await run_all(clock, [asyncio.create_task(one())])
    assert len(events(caplog, "provider.slot_lost")) == 1 and len(model.calls) == 1
    assert clock.now() - model.calls[0] < 50 and model.running == 0   # cut short


async def test_a_slot_given_back_by_a_failed_admission_wakes_the_next_caller(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = providers(two, max_concurrent=1, requests_per_minute=10)
    real = rates_of(store).admit
    failed = False

    async def blip_once(*args: Any) -> Any:
        nonlocal failed
        got = await real(*args)
        if not failed:
            failed = True
            raise ConnectionError("store blip")          # the first caller holds the slot
        return got

    monkeypatch.setattr(store, "admit", blip_once)
    first = asyncio.create_task(a.call().__aenter__())
    second = asyncio.create_task(a.call().__aenter__())
    await settle()                                       # no time passes
    assert isinstance(first.exception(), ConnectionError)
    assert second.done()
    await second.result().__aexit__(None, None, None)


def test_the_estimated_cost_is_a_finite_number(two: list[shoal.App]) -> None:
    a, _ = providers(two)
    bad: list[Any] = [-1.0, float("nan"), float("inf"), True, "1"]
    for cost in bad:
        with pytest.raises(ValueError, match="cost"):
            a.call(cost=cost)


# -- per-tenant limits ------------------------------------------------------------------------


class TenantModel:
    """Records concurrency and call times per tenant."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.running: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.total_peak = 0
        self.calls: dict[str, list[float]] = {}

    async def __call__(self, tenant: str, hold: float = 0.0) -> None:
        self.running[tenant] = self.running.get(tenant, 0) + 1
        self.peak[tenant] = max(self.peak.get(tenant, 0), self.running[tenant])
        self.total_peak = max(self.total_peak, sum(self.running.values()))
        self.calls.setdefault(tenant, []).append(self.clock.now())
        try:
            if hold:
                await self.clock.sleep(hold)
        finally:
            self.running[tenant] -= 1


async def test_tenant_max_concurrent_holds_across_replicas_and_spares_other_tenants(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    model = TenantModel(clock)
    ps = providers(two, max_concurrent=4, tenant_max_concurrent=2)
    start = clock.now()

    async def one(i: int, tenant: str) -> None:
        async with ps[i % 2].call(tenant=tenant):
            await model(tenant, hold=5)

    tasks = [asyncio.create_task(one(i, "big")) for i in range(8)]
    await settle()
    tasks += [asyncio.create_task(one(i, "small")) for i in range(2)]
    await run_all(clock, tasks)
    assert model.peak["big"] == 2 and len(model.calls["big"]) == 8
    # "big" asked first for all 8, yet "small" had the provider's other 2 slots at once
    assert model.peak["small"] == 2 and model.calls["small"] == [start] * 2
    assert model.total_peak == 4
    assert ps[0].tenant_keys("big")["slots"] == "provider:openai:tenant:big:slots"


async def test_tenant_requests_per_minute_hold_across_replicas(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    model = TenantModel(clock)
    ps = providers(two, requests_per_minute=10, tenant_requests_per_minute=2)
    start = clock.now()

    async def one(i: int, tenant: str) -> None:
        async with ps[i % 2].call(tenant=tenant):
            await model(tenant)

    tasks = [asyncio.create_task(one(i, "acme")) for i in range(6)]
    tasks += [asyncio.create_task(one(i, "other")) for i in range(2)]
    await run_all(clock, tasks)
    acme = model.calls["acme"]
    for t in acme:
        assert sum(1 for u in acme if t - 60 < u <= t) <= 2, acme
    assert sum(1 for u in acme if u < start + 60) == 2 and len(acme) == 6
    assert model.calls["other"] == [start, start]


async def test_tenant_tokens_per_minute_count_what_was_used(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = providers(two, tokens_per_minute=10_000, tenant_tokens_per_minute=1000)
    async with a.call(tokens=800, tenant="t") as call:
        call.used(tokens=300)                        # the estimate was too high
    assert await goes(b, tokens=700, tenant="t")     # fits: 300 + 700
    assert not await goes(b, tokens=1, tenant="t")
    assert await goes(b, tokens=1000, tenant="u")    # another tenant's window
    with pytest.raises(ValueError, match="tenant_tokens_per_minute=1000"):
        a.call(tokens=1001)
    late = asyncio.create_task(a.call(tokens=1, tenant="t", timeout=5).__aenter__())
    await run_all(clock, [asyncio.create_task(asyncio.wait([late]))])
    with pytest.raises(shoal.RateLimitTimeoutError, match="tenant_tokens_per_minute=1000"):
        late.result()



async def test_a_store_error_during_admission_gives_back_the_tenant_caps(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = providers(two, tokens_per_minute=1000, tenant_max_concurrent=1,
                     tenant_requests_per_minute=2, tenant_tokens_per_minute=200)
    real = rates_of(store).admit

    async def blip(*args: Any) -> Any:
        await real(*args)                            # the tenant's slot, request and tokens...
        raise ConnectionError("store blip")          # ...taken, and the answer lost

    monkeypatch.setattr(store, "admit", blip)
    with pytest.raises(ConnectionError):
        async with a.call(tokens=100, tenant="t"):
            pytest.fail("the call cannot go")
    monkeypatch.setattr(store, "admit", real)
    # the tenant's slot was given back: one call fits again; the request and the 100 tokens
    # stay counted for their minute (see test_a_store_error_during_admission_gives_back_all...)
    assert await goes(b, tokens=100, tenant="t")
    assert not await goes(b, tenant="t")             # the two requests of the minute


async def test_a_cancel_during_admission_gives_back_the_tenant_caps(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = providers(two, tenant_max_concurrent=1, tenant_requests_per_minute=1,
                     tenant_tokens_per_minute=100)
    real = rates_of(store).admit
    stuck = asyncio.Event()

    async def hang(*args: Any) -> Any:
        stuck.set()
        await asyncio.Event().wait()                 # a store that never takes it or answers
        raise AssertionError("unreachable")

    monkeypatch.setattr(store, "admit", hang)
    task = asyncio.create_task(a.call(tokens=100, tenant="t").__aenter__())
    await stuck.wait()                               # may hold the tenant's slot (marked)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    monkeypatch.setattr(store, "admit", real)
    assert await goes(b, tokens=100, tenant="t")     # nothing was counted, nothing is held


async def test_a_capped_tenant_does_not_block_other_tenants_in_the_instance(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, _ = providers(two, max_concurrent=10, tenant_max_concurrent=1,
                     tenant_requests_per_minute=3)
    held = a.call(tenant="big")
    await held.__aenter__()
    waiting = [asyncio.create_task(a.call(tenant="big").__aenter__()) for _ in range(3)]
    await settle()                                   # they waited for the turn, then their cap
    for _ in range(2):
        small = asyncio.create_task(a.call(tenant="small").__aenter__())
        await settle()                               # no time passes: "small" goes at once
        assert small.done() and not any(t.done() for t in waiting)
        await small.result().__aexit__(None, None, None)
    # a capped caller still times out on its own cap, and the others still go in turn
    late = asyncio.create_task(a.call(tenant="big", timeout=2).__aenter__())
    await run_all(clock, [asyncio.create_task(asyncio.wait([late]))], step=0.25)
    with pytest.raises(shoal.RateLimitTimeoutError, match="tenant_max_concurrent=1"):
        late.result()
    await held.__aexit__(None, None, None)
    await run_all(clock, [waiting[0]], step=0.25)
    await waiting[0].result().__aexit__(None, None, None)
    await run_all(clock, [waiting[1]], step=0.25)
    await waiting[1].result().__aexit__(None, None, None)
    # "big" used its 3 requests of the minute: the last one waits for the window, still
    # without holding the turn: "small" (its third request of the minute) goes at once
    await settle()
    assert not waiting[2].done()
    assert await goes(a, tenant="small")
    await run_all(clock, [waiting[2]], step=1)
    assert clock.now() >= 1_767_225_600.0 + 60
    await waiting[2].result().__aexit__(None, None, None)


async def test_a_long_call_keeps_its_tenant_slot_renewed(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = providers(two, tenant_max_concurrent=1)
    long = a.call(tenant="t")
    await long.__aenter__()
    for _ in range(150):                             # past the slot's first lease
        await clock.advance(1)
    assert not await goes(b, tenant="t")             # renewed: still held
    assert await goes(b, tenant="u")
    await long.__aexit__(None, None, None)
    assert await goes(b, tenant="t")                 # freed when the call ended


def hang(store: Store, monkeypatch: pytest.MonkeyPatch, *methods: str) -> None:
    """Make ``methods`` of ``store`` never answer (until the test ends)."""

    async def never(*args: Any) -> Any:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    for method in methods:
        monkeypatch.setattr(store, method, never)


async def timed_out_at(clock: VirtualClock, task: asyncio.Task[Any], timeout: float) -> None:
    """``task`` raises RateLimitTimeoutError, waiting for an answer of the store, when its
    ``timeout`` (from now) passes on ``clock``, not before and not after."""
    await clock.advance(timeout - 0.5)
    assert not task.done(), "gave up before its timeout"
    await clock.advance(0.5)
    await settle()
    assert task.done(), f"still waiting for the store at the end of its {timeout} s timeout"
    with pytest.raises(shoal.RateLimitTimeoutError) as e:
        await task
    assert e.value.limit == "an answer from the coordination store"
    assert "could not go within its timeout" in str(e.value)


async def test_a_store_that_never_answers_admission_does_not_outlast_the_timeout(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = providers(two, max_concurrent=1)
    hang(store, monkeypatch, "admit")
    await timed_out_at(clock, asyncio.create_task(a.call(timeout=5).__aenter__()), 5)
    monkeypatch.undo()
    assert await goes(a), "the slot marked before the store was asked was given back"


async def test_a_store_that_never_answers_the_budget_or_the_give_back_does_not_outlast_it(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every store wait of admission is bounded by what is left of the timeout: the budget
    reservation; and giving back after the store failed does not hold the caller either."""
    two[0].budget(per_tenant_day=10.0)
    a, _ = providers(two, max_concurrent=1, requests_per_minute=10, breaker=shoal.Breaker())
    hang(store, monkeypatch, "counter_add")
    await timed_out_at(clock, asyncio.create_task(a.call(timeout=3, cost=1.0).__aenter__()), 3)
    monkeypatch.undo()
    hang(store, monkeypatch, "admit", "slot_release", "window_add")
    await timed_out_at(clock, asyncio.create_task(a.call(timeout=4, cost=1.0).__aenter__()), 4)


async def test_a_store_that_never_answers_whether_the_circuit_is_open_does_not_outlast_it(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = providers(two, breaker=shoal.Breaker())
    hang(store, monkeypatch, "admit", "paused_until")
    first = asyncio.create_task(a.call(timeout=5).__aenter__())      # holds the turn
    await settle()
    second = asyncio.create_task(a.call(timeout=3).__aenter__())     # asks about the circuit
    await timed_out_at(clock, second, 3)
    await timed_out_at(clock, first, 2)


async def test_a_call_without_time_left_still_gives_the_store_a_moment_to_answer(
    clock: VirtualClock, two: list[shoal.App], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``timeout=0`` asks once: a store over the network (here: one that answers after 10 ms
    of real time, the virtual clock standing still) is given a second to answer."""
    a, _ = providers(two, max_concurrent=1)
    admit = store.admit

    async def slow(*args: Any) -> Any:
        await asyncio.sleep(0.01)
        return await admit(*args)

    monkeypatch.setattr(store, "admit", slow)
    assert await goes(a)
    hang(store, monkeypatch, "admit")
    await timed_out_at(clock, asyncio.create_task(a.call(timeout=0).__aenter__()), 1)
