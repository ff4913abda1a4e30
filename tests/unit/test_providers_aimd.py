"""AIMD after 429s, through the public API: a provider's concurrency limit, shared by every
replica, is multiplied by ``decrease`` on a 429 (once per round of calls) and grows back by
``increase`` per limit's worth of successes; on two instances over one store (memory, then
SQLite) and one VirtualClock."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import shoal
from shoal.backends.memory import MemoryStore
from shoal.backends.sqlite import SQLiteStore
from shoal.ports import Store
from shoal.testing import VirtualClock, cluster, settle


def make(store: Any, clock: Any, instance_id: str) -> shoal.App:
    return shoal.App("agents", store=store, clock=clock, instance_id=instance_id, lease=30.0)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else SQLiteStore(
        str(tmp_path / "rates.db"))
    await s.open()
    yield s
    await s.close()


@pytest.fixture
async def two(clock: VirtualClock, store: Store) -> AsyncIterator[list[shoal.App]]:
    async with cluster(make, instances=2, clock=clock, store=store) as apps:
        yield apps


class Model:
    """Counts the calls in flight, and answers 429 to the calls it is told to."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.running = 0
        self.peak = 0

    async def __call__(self, provider: shoal.Provider, hold: float = 5.0,
                       status: int = 200) -> None:
        async with provider.call() as call:
            self.running += 1
            self.peak = max(self.peak, self.running)
            try:
                await self.clock.sleep(hold)
            finally:
                self.running -= 1
            if status == 429:
                call.rate_limited(retry_after=1)


async def drive(clock: VirtualClock, *calls: Any) -> None:
    tasks = [asyncio.create_task(c) for c in calls]
    for _ in range(600):
        if all(t.done() for t in tasks):
            break
        await clock.advance(1)
    for t in tasks:
        t.result()


async def limits(ps: list[shoal.Provider]) -> set[int | None]:
    return {(await p.state()).concurrency_limit for p in ps}


async def test_a_429_lowers_the_limit_once_per_round_and_successes_raise_it_back(
    clock: VirtualClock, two: list[shoal.App], caplog: pytest.LogCaptureFixture
) -> None:
    ps = [app.provider("openai", max_concurrent=8, aimd=shoal.Aimd()) for app in two]
    model = Model(clock)
    assert await limits(ps) == {8}

    # a round of 8 calls over both replicas; two of them, one on each replica, get a 429: they
    # went together, so the limit is halved once, not twice, and so for both replicas
    with caplog.at_level(logging.WARNING, logger="shoal"):
        await drive(clock, *(model(ps[i % 2], status=429 if i in (3, 6) else 200)
                             for i in range(8)))
    assert model.peak == 8
    assert await limits(ps) == {4}
    lowered = [r for r in caplog.records
               if getattr(r, "event", "") == "provider.concurrency_lowered"]
    assert len(lowered) == 1 and "4 calls at once, was 8" in lowered[0].getMessage()

    # the next 8 calls, over both replicas, never run more than 4 at once
    model.peak = 0
    await drive(clock, *(model(ps[i % 2], hold=5) for i in range(8)))
    assert model.peak == 4

    # one call at a time from now on: each success gives back 1/limit of a slot, so the limit
    # grows by one for every limit's worth of successes, up to max_concurrent and no further
    seen = []
    for i in range(40):
        await drive(clock, model(ps[i % 2], hold=1))
        seen.append((await ps[(i + 1) % 2].state()).concurrency_limit)
    # 8 successes above at a limit of 4 (some admitted at 4, some at 5) took it to 5 or 6
    assert seen[0] in (5, 6) and seen == sorted(seen) and seen[-1] == 8
    assert all(b - a <= 1 for a, b in itertools.pairwise(seen))
    assert seen.count(6) == 6 and seen.count(7) == 7

    # a 429 of a call that went after the last lowering lowers it again
    await drive(clock, model(ps[1], hold=1, status=429))
    assert await limits(ps) == {4}


async def test_the_limit_never_goes_below_min_concurrent(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    ps = [app.provider("openai", max_concurrent=10,
                       aimd=shoal.Aimd(decrease=0.3, increase=2, min_concurrent=2))
          for app in two]
    model = Model(clock)
    got = []
    for i in range(3):                 # one after another: each lowers it, down to the floor
        await drive(clock, model(ps[i % 2], hold=1, status=429))
        got.append((await ps[0].state()).concurrency_limit)
    assert got == [3, 2, 2]
    await drive(clock, model(ps[0], hold=1))     # increase 2 per limit's worth: 2/2 = one slot
    assert await limits(ps) == {3}


async def test_a_call_waiting_for_a_lowered_limit_says_so(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = (app.provider("openai", max_concurrent=2, aimd=shoal.Aimd()) for app in two)
    async with a.call() as call:
        call.rate_limited(retry_after=0)
    holder = b.call()
    await holder.__aenter__()
    with pytest.raises(shoal.RateLimitTimeoutError) as e:
        async with a.call(timeout=0):
            pass
    assert e.value.limit == "max_concurrent=1 (lowered by AIMD from 2)"
    await holder.__aexit__(None, None, None)
    await settle()


async def test_the_state_shows_max_concurrent_without_aimd(two: list[shoal.App]) -> None:
    plain = two[0].provider("plain", max_concurrent=3)
    unlimited = two[0].provider("unlimited")
    async with plain.call() as call:
        call.rate_limited(retry_after=0)
    assert (await plain.state()).concurrency_limit == 3
    assert (await unlimited.state()).concurrency_limit is None


@pytest.mark.parametrize(("options", "message"), [
    ({"aimd": shoal.Aimd()}, "give max_concurrent too"),
    ({"max_concurrent": 2, "aimd": shoal.Aimd(min_concurrent=3)}, "min_concurrent=3"),
    ({"max_concurrent": 2, "aimd": 0.5}, "takes a shoal.Aimd"),
])
def test_bad_aimd_options_are_refused(options: dict[str, Any], message: str) -> None:
    app = shoal.App("agents", store=MemoryStore())
    with pytest.raises(ValueError, match=message):
        app.provider("openai", **options)


@pytest.mark.parametrize(("options", "message"), [
    ({"decrease": 1}, "between 0 and 1"),
    ({"decrease": 0}, "between 0 and 1"),
    ({"increase": 0}, "number > 0"),
    ({"min_concurrent": 0}, "min_concurrent"),
])
def test_bad_aimd_values_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        shoal.Aimd(**options)
