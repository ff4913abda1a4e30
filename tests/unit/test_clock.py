"""VirtualClock: time moves only when told, and due sleeps wake in time order."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import shoal
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


async def test_advance_waits_for_a_plain_function_step_and_never_hangs() -> None:
    """The natural unit test: a plain function (run in a thread) before a durable sleep. The
    advance must not move time while the step's thread runs, or the sleep would begin after
    the advance and wait for a time nobody moves the clock to."""
    import threading

    import shoal

    clock = VirtualClock()
    app = shoal.App("clock-threads", store="memory://", clock=clock)
    started = clock.now()
    seen: list[tuple[str, float]] = []
    slow = threading.Event()

    def fetch(n: int) -> int:
        slow.wait(0.05)                 # real time: a blocking client
        seen.append((threading.current_thread().name, clock.now()))
        return n + 1

    @app.workflow
    async def wf(ctx: shoal.RunContext, n: int) -> int:
        a = await ctx.step("fetch", fetch, n)
        await ctx.sleep(60)
        return await ctx.step("again", fetch, a)

    async with app:
        run = await app.dispatch(wf, 1)
        await clock.advance(61)
        assert (await app.get_run(run.id)).status == shoal.RunStatus.SUCCEEDED
        assert await app.result(run.id, timeout=0) == 3
    # the first step ran before any time passed, the second after the sleep
    assert [at - started for _, at in seen] == [0.0, 60.0]
    assert all(name.startswith("shoal-step") for name, _ in seen)   # shoal's daemon threads


async def test_a_thread_that_waits_on_the_test_delays_advance_by_max_thread_wait_only() -> None:
    import threading

    clock = VirtualClock(start=0.0, max_thread_wait=0.2)
    release = threading.Event()
    work = asyncio.ensure_future(asyncio.to_thread(release.wait, 30))
    ticks: list[float] = []

    async def sleeper() -> None:
        await clock.sleep(5)
        ticks.append(clock.now())

    task = asyncio.create_task(sleeper())
    await clock.advance(10)             # waits 0.2 s for the thread, then moves on
    assert ticks == [5.0] and clock.now() == 10.0 and not work.done()
    await clock.advance(10)             # a thread given up on is not waited for again
    release.set()
    assert await work is True
    await task


# -- what advance costs: event-loop turns, counted by the loop's selector (one select a turn) --

class CountingSelector(selectors.DefaultSelector):
    """The selector of a loop of its own: every turn of the event loop calls ``select`` once."""

    turns = 0

    def select(self, timeout: float | None = None) -> list[Any]:
        self.turns += 1
        return super().select(timeout)


def run_counting(main: Callable[[CountingSelector], Awaitable[None]]) -> None:
    selector = CountingSelector()
    loop = asyncio.SelectorEventLoop(selector)
    try:
        loop.run_until_complete(main(selector))
    finally:
        loop.close()


def test_a_day_without_due_work_costs_a_few_turns() -> None:
    """Nothing due before the one sleep at the end of the day: advance goes straight there."""
    async def main(selector: CountingSelector) -> None:
        clock = VirtualClock(start=0.0)
        woke: list[float] = []

        async def sleeper() -> None:
            await clock.sleep(86400)
            woke.append(clock.now())

        task = asyncio.create_task(sleeper())
        await settle()
        before = selector.turns
        await clock.advance(86400)
        assert woke == [86400.0]
        assert selector.turns - before <= 10      # it was 150: three settles of 50 turns
        await task

    run_counting(main)


def test_each_wake_up_of_a_poll_costs_about_one_turn() -> None:
    """Polls every 5 and 10 s for a day: each wakes at its time, in order, and the loop runs
    only as long as something is ready (it ran 50 turns after every wake-up)."""
    async def main(selector: CountingSelector) -> None:
        clock = VirtualClock(start=0.0)
        ticks: dict[float, list[float]] = {5.0: [], 10.0: []}

        async def poller(interval: float) -> None:
            while True:
                await clock.sleep(interval)
                ticks[interval].append(clock.now())

        tasks = [asyncio.create_task(poller(i)) for i in (5.0, 10.0, 10.0)]
        await settle()
        before = selector.turns
        await clock.advance(86400)
        wake_ups = len(ticks[5.0]) + len(ticks[10.0])
        assert ticks[5.0] == [5.0 * k for k in range(1, 17281)]
        assert ticks[10.0] == sorted(2 * [10.0 * k for k in range(1, 8641)])
        assert selector.turns - before <= 2 * wake_ups + 10
        for task in tasks:
            task.cancel()

    run_counting(main)


async def _idle_hour(selector: CountingSelector) -> tuple[list[float], int, bool]:
    """An app started on the memory store, idle for an hour of its VirtualClock: the seconds of
    every sleep on the clock meanwhile, the event-loop turns it took, and whether the app's
    membership still beats at its end."""
    clock = VirtualClock()
    app = shoal.App("idle-hour", store="memory://", clock=clock)
    sleeps: list[float] = []

    @app.workflow
    async def noop(ctx: shoal.RunContext, input: None) -> None:
        return input

    real_sleep = clock.sleep

    async def counted(seconds: float) -> None:
        sleeps.append(seconds)
        await real_sleep(seconds)

    clock.sleep = counted  # type: ignore[method-assign]
    async with app:
        await clock.advance(1)
        before, sleeps[:] = selector.turns, []
        await clock.advance(3600)
        turns = selector.turns - before
        view = await app.coordination_view()
    beating = bool(view.members) and view.members[0].beat_at >= clock.now() - 5
    return sleeps, turns, beating


def test_an_idle_app_settles_only_while_its_loops_run() -> None:
    """An idle app's hour: every poll and membership beat still wakes at its time, and each
    costs the turns its own work takes, not 50 more."""
    async def main(selector: CountingSelector) -> None:
        sleeps, turns, _ = await _idle_hour(selector)
        assert len(sleeps) > 3600 // 5        # the loops go on polling
        assert turns < 5 * len(sleeps)        # 50 turns a wake-up before

    run_counting(main)


def test_an_idle_app_hour_is_one_wake_up_per_beat() -> None:
    """An idle app's hour on the memory store: a membership beat every 5 s, one wake-up each.
    The maintenance passes, which the memory store tells that no work is due, sleep until
    some is or the store is written to; the heartbeat, with no run to renew, until one starts.
    The beats' timeouts and the validity watchdog cost a timer (two tasks) each beat, and
    about 13,000 turns an hour, before; a store that answers at once needs neither. The
    passes woke 1,800 times more, and the heartbeat 360."""
    async def main(selector: CountingSelector) -> None:
        sleeps, turns, beating = await _idle_hour(selector)
        assert beating                                  # the membership still beats
        assert sleeps.count(5.0) == 720                 # the beats: 1,442 with their timers
        assert len(sleeps) < 720 + 10                   # passes: 2,885 with the watchdog's
        assert turns < 1.5 * 720                        # 13,300 turns before

    run_counting(main)


def test_waits_due_at_the_same_moment_wake_together_in_the_order_they_began() -> None:
    """Three polls due every 10 s: each moment wakes all three in the order they first slept,
    then settles once (one settle after each, before)."""
    async def main(selector: CountingSelector) -> None:
        clock = VirtualClock(start=0.0)
        woke: list[tuple[float, str]] = []

        async def poller(name: str) -> None:
            while True:
                await clock.sleep(10)
                woke.append((clock.now(), name))

        tasks = [asyncio.create_task(poller(n)) for n in "abc"]
        await settle()
        before = selector.turns
        await clock.advance(86400)
        assert woke == [(10.0 * k, n) for k in range(1, 8641) for n in "abc"]
        assert selector.turns - before <= 2 * 8640 + 10   # 6 * 8640 one at a time
        for task in tasks:
            task.cancel()

    run_counting(main)


async def test_a_run_started_after_an_idle_day_is_claimed_and_renewed() -> None:
    """The heartbeat of an instance with nothing to renew sleeps until a run starts, and claims
    are not refused meanwhile for a renewal pass "overdue"; once a run executes, its lease is
    renewed every heartbeat, so a step longer than the lease keeps it."""
    clock = VirtualClock()
    app = shoal.App("idle-then-busy", store="memory://", clock=clock, lease=30)
    renewals: list[float] = []

    @app.workflow
    async def slow(ctx: shoal.RunContext, input: None) -> str:
        async def long_step() -> str:
            await clock.sleep(95)            # three leases: only renewals keep the run here
            return "done"
        return await ctx.step("long", long_step)

    async with app:
        engine = app._engine
        assert engine is not None
        real_renew = engine.store.renew_leases

        async def counted(*args: Any, **kwargs: Any) -> Any:
            renewals.append(clock.now())
            return await real_renew(*args, **kwargs)

        engine.store.renew_leases = counted  # type: ignore[method-assign]
        await clock.advance(86400)
        assert renewals == []                          # nothing to renew: never asked
        run = await app.dispatch(slow, None)
        started = clock.now()
        await clock.advance(100)
        assert await app.result(run, timeout=0) == "done"
        assert (await app.get_run(run.id)).attempts == 1
        assert [round(t - started) for t in renewals] == [10, 20, 30, 40, 50, 60, 70, 80, 90]


async def test_a_run_of_many_steps_finishes_within_one_advance() -> None:
    """'A run dispatched before advance(1) has run as far as it can': however many turns that
    takes (the settles of 50 turns stopped a long run part of the way)."""
    clock = VirtualClock()
    app = shoal.App("long-run", store="memory://", clock=clock)

    async def one(i: int) -> int:
        await asyncio.sleep(0)          # a step that yields to the loop (a client, a lock)
        return i

    @app.workflow
    async def many(ctx: shoal.RunContext, n: int) -> int:
        total = 0
        for i in range(n):
            total += await ctx.step(f"s{i}", one, i)
        return total

    async with app:
        run = await app.dispatch(many, 200)
        await clock.advance(1)
        assert await app.result(run, timeout=0) == sum(range(200))
