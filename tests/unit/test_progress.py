"""``ctx.progress`` as workflow code meets it: bad values refused naming them, the latest value
written at most once a second of the app's clock (a loop reporting 100,000 times writes a handful
of times), the value not written yet flushed before the run ends, sleeps or is released, a store
that refuses or fails a write never failing the run. On the memory store under a VirtualClock,
through a store that counts its progress writes."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from typing import Any

import pytest
from helpers import status_is, until

import shoal
from shoal.backends.memory import MemoryStore
from shoal.engine.progress import PROGRESS_INTERVAL
from shoal.testing import VirtualClock, settle
from shoal.types import Fence


class Counting(MemoryStore):
    """A memory store that keeps each progress write it is asked for: (clock time, value)."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock
        self.writes: list[tuple[float, shoal.Progress]] = []

    async def record_progress(self, fence: Fence, progress: shoal.Progress) -> bool:
        self.writes.append((self.clock.now(), progress))
        return await super().record_progress(fence, progress)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def store(clock: VirtualClock) -> Counting:
    return Counting(clock)


def make_app(clock: VirtualClock, store: MemoryStore, **options: Any) -> shoal.App:
    return shoal.App("progress", store=store, clock=clock, lease=30.0, **options)


async def test_bad_values_are_refused_naming_them(clock: VirtualClock, store: Counting) -> None:
    app = make_app(clock, store, max_payload_bytes=2000)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("half",), {}), ((True,), {}), ((1.5,), {}), ((-0.1,), {}), ((math.nan,), {}),
        ((0.5, 3), {}), ((), {"rows": {1, 2}}), ((), {"blob": "x" * 3000}),
    ]

    @app.workflow
    async def wf(ctx: shoal.RunContext, _: Any) -> list[str]:
        errors = []
        for args, data in calls:
            try:
                ctx.progress(*args, **data)
            except (TypeError, ValueError) as e:
                errors.append(f"{type(e).__name__}: {e}")
            else:
                errors.append("accepted")
        ctx.progress(1, "done", rows=3)   # an int fraction is a number too
        return errors

    async with app:
        run = await app.dispatch(wf)
        errors = await app.result(run.id)
        got = (await app.get_run(run.id)).progress
    assert errors[0].startswith("TypeError: ctx.progress(fraction=...)") and "'half'" in errors[0]
    assert errors[1].startswith("TypeError: ctx.progress(fraction=...)")       # a bool is not
    for e in errors[2:5]:
        assert e.startswith("ValueError: ctx.progress(fraction=...): a number between 0 and 1")
    assert errors[5].startswith("TypeError: ctx.progress(message=...)")
    assert errors[6].startswith("TypeError: ctx.progress(...)['data']['rows'] is a set")
    assert errors[7].startswith("ValueError: ctx.progress(...) is ") and "2000 bytes" in errors[7]
    assert got == shoal.Progress(1.0, "done", {"rows": 3}, clock.now())
    assert isinstance(got.fraction, float)
    assert len(store.writes) == 1          # the refused calls kept nothing


async def test_a_tight_loop_writes_a_handful_of_times_and_its_last_value_lands(
    clock: VirtualClock, store: Counting
) -> None:
    app = make_app(clock, store)

    def crunch(ctx: shoal.RunContext) -> int:    # a plain function: it runs in a thread
        for i in range(100_000):
            ctx.progress(i / 99_999, f"row {i + 1} of 100000", row=i + 1)
        return 100_000

    @app.workflow
    async def wf(ctx: shoal.RunContext, _: Any) -> int:
        ctx.progress(0, "starting")
        return await ctx.step("crunch", crunch, ctx)

    async with app:
        run = await app.dispatch(wf)
        assert await app.result(run.id) == 100_000
        got = (await app.get_run(run.id)).progress
    assert got == shoal.Progress(1.0, "row 100000 of 100000", {"row": 100_000}, clock.now())
    assert 2 <= len(store.writes) <= 3     # the first value at once, the last before the end
    assert store.writes[-1][1] == got


async def test_the_newest_value_is_written_once_per_interval(
    clock: VirtualClock, store: Counting
) -> None:
    app = make_app(clock, store)

    @app.workflow
    async def wf(ctx: shoal.RunContext, _: Any) -> str:
        for i in range(101):                   # 10 s of the app's clock, 10 reports a second
            ctx.progress(i / 100, f"tick {i}")
            await clock.sleep(0.1)              # not durable: the run keeps its slot
        ctx.progress(1.0, "done")
        return "ok"

    async with app:
        run = await app.dispatch(wf)
        await until(status_is(app, run.id, "running"))
        started = clock.now()
        for _ in range(50):
            await clock.advance(0.1)
        shown = (await app.get_run(run.id)).progress
        assert shown is not None
        # half way: the stored value is at most one interval behind the newest report
        assert clock.now() - shown.at <= PROGRESS_INTERVAL + 0.1
        assert shown.message == f"tick {round((shown.at - started) / 0.1)}"
        for _ in range(60):
            await clock.advance(0.1)
        assert await app.result(run.id) == "ok"
        got = (await app.get_run(run.id)).progress
    assert got is not None and got.message == "done"
    times = [at for at, _ in store.writes]
    assert 9 <= len(times) <= 12, times        # about one a second, not one per report
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= PROGRESS_INTERVAL - 1e-9 for gap in gaps[:-1]), gaps
    assert store.writes[-1][1] == got          # the last one, flushed before the settlement


async def test_the_value_not_written_yet_lands_before_the_run_ends_or_sleeps(
    clock: VirtualClock, store: Counting
) -> None:
    app = make_app(clock, store)

    async def fetch(ctx: shoal.RunContext) -> int:
        ctx.progress(0.2, "inside a step")     # not durable: allowed in a step's function
        return 1

    @app.workflow
    async def wf(ctx: shoal.RunContext, fail: bool) -> int:
        ctx.progress(0.1, "first")
        await ctx.step("fetch", fetch, ctx)
        ctx.progress(0.4, "going to sleep")
        await ctx.sleep(60)
        ctx.progress(0.9, "almost", fail=fail)
        if fail:
            raise RuntimeError("boom")
        return 2

    async with app:
        ok = await app.dispatch(wf, False)
        bad = await app.dispatch(wf, True, max_attempts=1)
        for run_id in (ok.id, bad.id):
            await until(status_is(app, run_id, "sleeping"))
            sleeping = (await app.get_run(run_id)).progress
            assert sleeping is not None and sleeping.message == "going to sleep"
        await clock.advance(61)
        assert await app.result(ok.id) == 2
        await until(status_is(app, bad.id, "failed"))
        for run_id, fail in ((ok.id, False), (bad.id, True)):
            got = (await app.get_run(run_id)).progress
            assert got is not None
            assert (got.fraction, got.message, got.data) == (0.9, "almost", {"fail": fail})


async def test_an_interrupted_run_writes_its_last_value_before_it_is_released(
    clock: VirtualClock, store: Counting
) -> None:
    app = make_app(clock, store)
    reported = asyncio.Event()

    @app.workflow
    async def wf(ctx: shoal.RunContext, _: Any) -> None:
        ctx.progress(0.1, "written at once")
        await until(lambda: _written(store, 1))
        ctx.progress(0.5, "waiting for its turn")   # within the interval: not written yet
        reported.set()
        await asyncio.Event().wait()

    await app.start()
    run = await app.dispatch(wf)
    await asyncio.wait_for(reported.wait(), 5)
    await settle()
    assert len(store.writes) == 1
    await app.close(timeout=0)
    got = await store.get_run(run.id)
    assert got is not None and got.status == "interrupted"
    assert got.progress is not None and got.progress.message == "waiting for its turn"
    assert len(store.writes) == 2


async def _written(store: Counting, n: int) -> bool:
    return len(store.writes) >= n


class Failing(Counting):
    """Every progress write fails (an unreachable store), or is fenced out."""

    fenced = False

    async def record_progress(self, fence: Fence, progress: shoal.Progress) -> bool:
        self.writes.append((self.clock.now(), progress))
        if self.fenced:
            return False
        raise shoal.StoreUnavailableError("the store is down (test)")


@pytest.mark.parametrize("fenced", [False, True])
async def test_a_write_that_fails_or_is_fenced_out_never_fails_the_run(
    clock: VirtualClock, fenced: bool, caplog: pytest.LogCaptureFixture
) -> None:
    store = Failing(clock)
    store.fenced = fenced
    app = make_app(clock, store)

    @app.workflow
    async def wf(ctx: shoal.RunContext, _: Any) -> str:
        ctx.progress(0.5)
        await until(lambda: _written(store, 1))   # written in the background
        ctx.progress(0.6)                         # flushed before the settlement
        return "ok"

    with caplog.at_level(logging.DEBUG, logger="shoal"):
        async with app:
            run = await app.dispatch(wf)
            assert await app.result(run.id) == "ok"
    assert (await app.get_run(run.id)).progress is None
    assert len(store.writes) == 2
    events = [getattr(r, "event", None) for r in caplog.records]
    assert ("progress.fenced" if fenced else "progress.write_failed") in events
