"""Workflow and handler code that swallows or raises the engine's control flow."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

from helpers import until

import shoal
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock, settle


async def _true(items: list[Any], item: Any) -> bool:
    return item in items


async def test_a_swallowed_lost_lease_stops_every_later_step() -> None:
    store = MemoryStore()
    clock, frozen = VirtualClock(), VirtualClock()
    ran: list[tuple[str, int]] = []
    gate = asyncio.Event()

    def make(name: str, clk: VirtualClock) -> shoal.App:
        app = shoal.App("sticky", store=store, clock=clk, instance_id=name, lease=30.0)

        @app.workflow(name="wf")
        async def wf(ctx: shoal.RunContext, input: Any) -> str:
            for i in range(3):
                async def work(i: int = i) -> int:
                    ran.append((name, i))
                    if name == "frozen" and i == 0:
                        await gate.wait()
                    return i
                # careless code: swallows the lost lease
                with contextlib.suppress(Exception):
                    await ctx.step(f"s{i}", work)
            return name

        return app

    a, b = make("frozen", frozen), make("other", clock)
    await a.start()
    run = await a.dispatch("wf")
    await until(lambda: _true(ran, ("frozen", 0)))
    async with b:
        await clock.advance(41)                  # b takes the run over and finishes it
        assert await b.result(run.id) == "other"
        gate.set()                                # a's step 0 returns: its checkpoint is refused
        for _ in range(5):
            await settle()
        assert [r for r in ran if r[0] == "frozen"] == [("frozen", 0)]   # no step 1, no step 2
    closing = asyncio.create_task(a.close(timeout=0))
    await frozen.advance(1)
    await closing


async def test_a_workflow_raising_cancelled_error_fails_instead_of_looping() -> None:
    clock = VirtualClock()
    app = shoal.App("cancel", store="memory://", clock=clock, lease=30.0)
    calls: list[int] = []

    @app.workflow(max_attempts=2, backoff=1.0)
    async def leaky(ctx: shoal.RunContext, input: Any) -> None:
        calls.append(ctx.attempt)
        raise asyncio.CancelledError   # e.g. a library's cancellation leaking out

    async with app:
        run = await app.dispatch(leaky)
        await until(lambda: _attempts(app, run.id, 2))
        await clock.advance(2)
        await until(lambda: _final(app, run.id))
        done = await app.get_run(run.id)
        assert done.status == "failed" and "CancelledError" in (done.error or "")
        assert calls == [1, 2]


async def _attempts(app: shoal.App, run_id: str, n: int) -> bool:
    return (await app.get_run(run_id)).attempts >= n


async def _final(app: shoal.App, run_id: str) -> bool:
    return (await app.get_run(run_id)).status.final


async def test_a_handler_raising_cancelled_error_does_not_stop_the_instance() -> None:
    clock = VirtualClock()
    app = shoal.App("handlers", store="memory://", clock=clock, lease=30.0)

    @app.outbox_handler("email", max_deliveries=2)
    async def email(payload: Any, key: str) -> None:
        raise asyncio.CancelledError

    @app.workflow
    async def send(ctx: shoal.RunContext, input: Any) -> str:
        async def step() -> str:
            ctx.outbox.send("email", {"to": "x"})
            return "sent"
        return str(await ctx.step("send", step))

    @app.workflow
    async def later(ctx: shoal.RunContext, input: Any) -> str:
        await ctx.sleep(60)
        return "still here"

    async with app:
        first = await app.dispatch(send)
        assert await app.result(first.id) == "sent"
        second = await app.dispatch(later)
        for _ in range(10):
            await clock.advance(10)
        assert await app.result(second.id) == "still here"   # polls and timers still run
        assert app.check_liveness().healthy
        [dead] = await app.dead_letters()
        assert "CancelledError" in (dead.error or "")


def _thread_apps(clock: VirtualClock, lease: float, release: threading.Event,
                 spans: list[tuple[str, float, float]]) -> tuple[shoal.App, shoal.App]:
    """Two instances, ``stopping`` and ``other``, over one store, whose workflow ``wf`` makes one
    plain-function step (run in a thread); in ``stopping`` it blocks until ``release``. Each
    step's (instance, start, end) goes to ``spans``."""
    store = MemoryStore()

    def make(name: str) -> shoal.App:
        app = shoal.App("threads", store=store, clock=clock, instance_id=name, lease=lease)

        @app.workflow(name="wf")
        async def wf(ctx: shoal.RunContext, input: Any) -> str:
            def charge() -> str:        # a blocking client: runs in a thread
                began = time.monotonic()
                if name == "stopping":
                    release.wait(10)
                spans.append((name, began, time.monotonic()))
                return name

            return str(await ctx.step("charge", charge))

        return app

    return make("stopping"), make("other")


async def test_a_step_thread_that_ends_within_the_stop_grace_is_checkpointed() -> None:
    """The drain is over while a plain-function step runs in a thread: the run is not released
    while the thread runs, and the result the thread returns within the grace is the step's,
    checkpointed before the release; the next instance replays it instead of running the step
    again, and the stop cost no attempt."""
    clock = VirtualClock(max_thread_wait=0)   # time moves while the step's thread runs
    spans: list[tuple[str, float, float]] = []
    release = threading.Event()
    stopping, other = _thread_apps(clock, 30.0, release, spans)
    await stopping.start()
    run = await stopping.dispatch("wf")
    await until(lambda: _running(stopping, run.id))
    async with other:
        closing = asyncio.create_task(stopping.close(timeout=5))
        await clock.advance(5)                     # the drain is over: the run is interrupted
        await asyncio.sleep(0.2)                   # ... while its step still runs in a thread
        assert (await other.get_run(run.id)).status == "running"   # not released yet
        release.set()                              # the thread returns within the grace
        await closing
        released = await other.get_run(run.id)
        assert released.status == "interrupted" and released.owner is None
        await clock.advance(10)                    # the other instance's next poll
        assert await other.result(run.id) == "stopping"     # the checkpointed result
        assert (await other.get_run(run.id)).attempts == 1
    assert [name for name, _, _ in spans] == ["stopping"]   # the step ran once


async def test_a_step_thread_outliving_the_stop_leaves_the_run_to_its_lease() -> None:
    """Half a lease after the drain, the thread still runs: the run is not released (another
    instance would run the step beside it at once) but left to lapse, and taken over as a crash
    only after its lease."""
    clock = VirtualClock(max_thread_wait=0)   # time moves while the step's thread runs
    release = threading.Event()
    lease = 1.0                     # half of it is the real time waited for the thread
    stopping, other = _thread_apps(clock, lease, release, [])
    await stopping.start()
    run = await stopping.dispatch("wf")
    await until(lambda: _running(stopping, run.id))
    try:
        async with other:
            closing = asyncio.create_task(stopping.close(timeout=0.1))
            await clock.advance(0.1)                # the drain is over: the run is interrupted
            await asyncio.wait_for(closing, 5)      # half a lease later, it stops anyway
            left = await other.get_run(run.id)
            assert left.status == "running" and left.owner == "stopping"   # not released
            await clock.advance(0.2)
            assert (await other.get_run(run.id)).status == "running"        # still its lease
            release.set()
            for _ in range(200):                    # lapsed: taken over as a crash
                await clock.advance(lease / 2)
                await asyncio.sleep(0.01)           # the new owner's step thread
                done = await other.get_run(run.id)
                if done.status == "succeeded":
                    break
            assert done.status == "succeeded" and done.output == "other"
            assert done.attempts == 2
    finally:
        release.set()


async def _running(app: shoal.App, run_id: str) -> bool:
    await asyncio.sleep(0.01)      # the step runs in a thread: let it start
    return (await app.get_run(run_id)).status == "running"
