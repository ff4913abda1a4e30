"""Maintenance on the memory store sleeps until its work is due (the store says when, and wakes
it when written to), and still does that work on time: recovery of an expired claim, a delayed
dispatch from elsewhere, retention, approval expiry. A pass that fails goes on polling."""

from __future__ import annotations

from typing import Any

import pytest

import shoal
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock


def counting(store: MemoryStore, name: str) -> list[float]:
    """Record the clock's time of every call of ``store.<name>`` (a pass of a service)."""
    calls: list[float] = []
    real = getattr(store, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[-1] if name in ("recover_runs", "expire_pauses") else 0.0)
        return await real(*args, **kwargs)

    setattr(store, name, counted)
    return calls


def serving(store: MemoryStore, clock: VirtualClock, **options: Any) -> shoal.App:
    app = shoal.App("quiet", store=store, clock=clock, **options)

    @app.workflow
    async def echo(ctx: shoal.RunContext, input: str) -> str:
        return input

    @app.workflow
    async def ask(ctx: shoal.RunContext, input: None) -> bool:
        decision = await ctx.approval("go", expires_in=3600)
        return decision.approved

    return app


async def test_an_idle_hour_asks_the_store_a_few_times_not_every_interval() -> None:
    clock, store = VirtualClock(), MemoryStore()
    recoveries = counting(store, "recover_runs")
    async with serving(store, clock) as app:
        await clock.advance(3600)
        assert len(recoveries) <= 2            # 361 every lease / 3
        assert app.check_liveness().healthy    # asleep by choice is not stuck


async def test_a_claim_that_expires_is_recovered_when_its_lease_ends() -> None:
    """Another instance (here: a claim made on the store itself) took the run and vanished:
    nothing is written meanwhile, and recovery wakes at the end of that lease."""
    clock, store = VirtualClock(), MemoryStore()
    async with serving(store, clock) as app:
        await clock.advance(600)
        other = shoal.App("quiet", store=store, clock=clock)    # dispatches, serves nothing
        run = await other.dispatch("echo", "hi")
        [taken] = await store.claim_runs("quiet", ["echo"], "vanished", 1, 300.0, clock.now())
        assert taken.id == run.id
        await clock.advance(299)
        assert (await app.get_run(run.id)).owner == "vanished"
        await clock.advance(2)
        assert await app.result(run.id, timeout=0) == "hi"
        assert (await app.get_run(run.id)).attempts == 2        # the vanished one counts


async def test_a_delayed_dispatch_from_elsewhere_starts_on_time() -> None:
    clock, store = VirtualClock(), MemoryStore()
    async with serving(store, clock) as app:
        client = shoal.App("quiet", store=store, clock=clock)
        run = await client.dispatch("echo", "later", delay=7200)
        await clock.advance(7199)
        assert (await app.get_run(run.id)).status == "queued"
        await clock.advance(1)
        assert await app.result(run.id, timeout=0) == "later"


async def test_retention_and_expiry_act_on_time_while_nothing_else_happens() -> None:
    clock, store = VirtualClock(), MemoryStore()
    async with serving(store, clock, run_retention=86400) as app:
        done = await app.dispatch("echo", "old")
        asked = await app.dispatch("ask")
        await clock.advance(1)
        assert await app.result(done, timeout=0) == "old"
        await clock.advance(3600)                                 # the approval's hour
        assert await app.result(asked, timeout=0) is False
        await clock.advance(86400 - 3601 - 1)
        assert (await app.get_run(done.id)).status == "succeeded"
        await clock.advance(2)                                    # run_retention has passed
        with pytest.raises(shoal.UnknownRunError):
            await app.get_run(done.id)


async def test_a_pass_that_fails_polls_every_interval() -> None:
    """The store's answer about due work is only trusted after a pass that worked."""
    clock, store = VirtualClock(), MemoryStore()
    real = store.recover_runs
    failing = [True]
    calls: list[float] = []

    async def recover_runs(namespace: str, now: float) -> Any:
        calls.append(now)
        if failing[0]:
            raise ConnectionError("the store is away")
        return await real(namespace, now)

    store.recover_runs = recover_runs  # type: ignore[method-assign]
    async with serving(store, clock):
        start = clock.now()
        await clock.advance(60)
        assert [round(t - start) for t in calls] == [0, 10, 20, 30, 40, 50, 60]
        failing[0] = False
        await clock.advance(3600)
        assert len(calls) <= 7 + 2                             # it works again: quiet
