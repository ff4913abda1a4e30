"""VirtualClock: time moves only when told, and due sleeps wake in time order."""

from __future__ import annotations

import asyncio

import pytest

from shoal import SystemClock
from shoal.testing import VirtualClock, settle


async def test_advance_wakes_due_sleeps_in_time_order() -> None:
    clock = VirtualClock(start=1000.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.now()))

    tasks = [asyncio.create_task(sleeper(n, s)) for n, s in [("c", 30), ("a", 10), ("b", 20)]]
    await settle()
    await clock.advance(15)
    assert woke == [("a", 1010.0)] and clock.now() == 1015.0
    await clock.advance(100)
    assert woke == [("a", 1010.0), ("b", 1020.0), ("c", 1030.0)]
    assert clock.now() == 1115.0
    await asyncio.gather(*tasks)


async def test_a_woken_task_that_sleeps_again_is_woken_within_the_same_advance() -> None:
    clock = VirtualClock(start=0.0)
    ticks: list[float] = []

    async def poller() -> None:
        while True:
            await clock.sleep(10)
            ticks.append(clock.now())

    task = asyncio.create_task(poller())
    await settle()
    await clock.advance(35)
    assert ticks == [10.0, 20.0, 30.0]
    task.cancel()


async def test_cancelled_sleep_is_skipped_and_time_never_goes_back() -> None:
    clock = VirtualClock(start=0.0)
    task = asyncio.create_task(clock.sleep(5))
    await settle()
    task.cancel()
    await clock.advance(10)
    assert task.cancelled() and clock.now() == 10.0
    with pytest.raises(ValueError):
        await clock.advance(-1)


async def test_system_clock() -> None:
    clock = SystemClock()
    before = clock.now()
    await clock.sleep(0.01)
    assert clock.now() >= before + 0.005
