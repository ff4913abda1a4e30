"""Races at the end of an execution: a progress write slow to finish never holds the run's
settlement past its lease (the run would execute twice); a run whose end-of-claim write did
not end the claim (a signal was there) stops at once when the instance closed meanwhile; a run
cancelled in the same loop turn as its claim launched it is not kept (and renewed) forever."""

from __future__ import annotations

import asyncio
from typing import Any

from helpers import until

import shoal
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock, settle
from shoal.types import Fence


class SlowProgress(MemoryStore):
    """A store whose progress writes wait for ``gate`` (a locked row, a busy pool)."""

    def __init__(self, slow_calls: int) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.calls = 0
        self.slow_calls = slow_calls

    async def record_progress(self, fence: Fence, progress: shoal.Progress) -> bool:
        self.calls += 1
        if self.calls <= self.slow_calls:
            await self.gate.wait()
        return await super().record_progress(fence, progress)


async def _true(value: bool) -> bool:
    return value


async def test_a_slow_progress_write_does_not_hold_the_settlement_past_the_lease() -> None:
    clock = VirtualClock()
    store = SlowProgress(slow_calls=1)
    app = shoal.App("p", store=store, clock=clock, lease=30.0)
    executed: list[str] = []

    @app.workflow
    async def wf(ctx: shoal.RunContext, _: Any) -> str:
        executed.append(ctx.run_id)
        ctx.progress(0.5, "half")
        return "ok"

    async with app:
        run = await app.dispatch(wf)
        await until(lambda: _true(store.calls >= 1))
        for _ in range(6):
            await clock.advance(15)   # past the lease: renewals skip a finishing run
        store.gate.set()
        await settle()
        for _ in range(4):
            await clock.advance(15)
        got = await app.get_run(run.id)
    assert (got.status, got.attempts) == ("succeeded", 1)
    assert len(executed) == 1, f"the workflow ran {len(executed)} times"


async def test_close_stops_a_run_whose_wait_found_its_signal_while_it_flushed() -> None:
    clock = VirtualClock()
    store = SlowProgress(slow_calls=10)
    app = shoal.App("p", store=store, clock=clock, lease=30.0)
    state: list[str] = []

    @app.workflow
    async def wf(ctx: shoal.RunContext, _: Any) -> str:
        ctx.progress(0.1)
        got = await ctx.wait_for("go")   # the signal is there: the wait does not park
        state.append("received")
        await asyncio.Event().wait()     # long work
        return str(got)

    await app.start()
    run = await app.dispatch(wf, delay=1)
    await app.signal(run.id, "go", "x")
    await clock.advance(1)   # due: it starts, and its wait flushes (slowly) before it asks
    await until(lambda: _true(store.calls >= 1))
    closing = asyncio.ensure_future(app.close(timeout=0))
    await settle()
    store.gate.set()
    await asyncio.wait_for(closing, 5)   # it hung forever before
    assert state == []                   # stopped as its wait returned, not after
    got = await store.get_run(run.id)
    assert got.status == "interrupted" and got.owner is None   # released for another one


async def test_a_run_cancelled_as_it_was_launched_is_not_kept_forever() -> None:
    clock = VirtualClock()
    app = shoal.App("c", store="memory://", clock=clock, lease=30.0)

    @app.workflow
    async def wf(ctx: shoal.RunContext, _: Any) -> str:
        return "ok"

    async with app:
        engine = app._engine
        assert engine is not None
        engine._accepting = False   # claim by hand below
        run = await app.dispatch(wf)
        [claimed] = await app.store.claim_runs("c", ["wf"], engine.instance_id, 1, 30.0,
                                               clock.now())
        await app.store.cancel_run(run.id, clock.now())
        engine._launch(claimed, clock.now())   # the claim pass launches it...
        engine.cancel_local(run.id)            # ...and app.cancel aborts it in the same turn
        await settle()
        assert run.id not in {x.run.id for x in engine.executing()}
        for _ in range(10):
            await clock.advance(30)
        got = await app.get_run(run.id)
    assert got.status != "running"
