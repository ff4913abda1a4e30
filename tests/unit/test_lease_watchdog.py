"""Invariant 11: an execution whose store stops answering (a partition: calls hang, nothing is
refused) is aborted here before its lease ends, so its last side effect comes before the first
of the instance that takes the run over; once the store answers again, it writes nothing over
the new owner's work, goes on serving, and the cut cost the run one attempt. On the memory store
and on SQLite, under a VirtualClock."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import shoal
from shoal.backends.memory import MemoryStore
from shoal.backends.sqlite import SQLiteStore
from shoal.ports import Store
from shoal.testing import VirtualClock, cluster


class Stall:
    """One instance's path to the shared store. While it is stalled every call waits (nothing
    is refused) until it heals, as a connection whose bytes a partition holds."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.healed = asyncio.Event()
        self.healed.set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            await self.healed.wait()
            return await attr(*args, **kwargs)

        return call


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else SQLiteStore(
        str(tmp_path / "cut.db"))
    await s.open()
    yield s
    await s.close()


async def test_a_cut_off_instance_stops_its_run_before_the_new_owner_starts(
        store: Store) -> None:
    clock = VirtualClock()
    stalls: dict[str, Stall] = {}
    effects: list[tuple[str, float]] = []
    errors: list[tuple[str, BaseException]] = []

    def make_app(shared: Store, clock: shoal.Clock, instance_id: str) -> shoal.App:
        stalls[instance_id] = Stall(shared)
        app = shoal.App("cut", store=stalls[instance_id], clock=clock,  # type: ignore[arg-type]
                        instance_id=instance_id, lease=30.0)
        app.on_error(lambda error: errors.append((instance_id, error)))

        @app.workflow
        async def send(ctx: shoal.RunContext, emails: int) -> str:
            async def send_all() -> str:                 # a side effect every virtual second
                for _ in range(emails):
                    effects.append((instance_id, clock.now()))
                    await clock.sleep(1)
                return f"sent by {instance_id}"

            return await ctx.step("send_all", send_all)

        return app

    async with cluster(make_app, instances=2, clock=clock, store=store) as apps:
        try:
            run = await apps[0].dispatch("send", 200)
            await clock.advance(0)
            a = (await apps[0].get_run(run.id)).owner
            assert a is not None
            b = next(app for app in apps if app.instance_id != a)
            stalls[a].healed.clear()                         # A's store calls hang from now on
            for _ in range(60):                              # the lease, a poll, and B at work
                await clock.advance(1)
            theirs = [at for who, at in effects if who == b.instance_id]
            ours = [at for who, at in effects if who == a]
            assert theirs, "the other instance never took the run over"
            assert max(ours) < min(theirs)                   # never both at once
            assert any(i == a and isinstance(e, shoal.LeaseLostError) for i, e in errors)

            stalls[a].healed.set()                           # the partition heals
            for _ in range(200):
                await clock.advance(1)
                done = await b.get_run(run.id)
                if done.status == shoal.RunStatus.SUCCEEDED:
                    break
            assert done.output == f"sent by {b.instance_id}" and done.attempts == 2
            assert max(at for who, at in effects if who == a) == max(ours)   # A did no more

            healed = next(app for app in apps if app.instance_id == a)
            again = await healed.dispatch("send", 1)         # A goes on serving
            for _ in range(10):
                await clock.advance(1)
            assert await b.result(again.id, timeout=0) == f"sent by {a}"
        finally:
            for stall in stalls.values():   # a failed check must not leave a close hanging
                stall.healed.set()


async def test_a_run_that_goes_on_after_a_slow_wait_is_still_watched() -> None:
    """A write that may end the claim (a wait whose signal is already there) is slow, and the
    watchdog's time comes meanwhile; the run goes on, and then the store stops answering: the
    run is still aborted before its lease ends (a finishing run was dropped from the watch)."""
    clock = VirtualClock()
    store = MemoryStore()
    await store.open()
    stall = Stall(store)
    slow: dict[str, bool] = {"wait": False}
    waited = stall.__getattr__("wait_signal")

    async def slow_wait(*args: Any, **kwargs: Any) -> Any:
        if slow["wait"]:
            await clock.sleep(5)                     # spans the watchdog's wake-up
        answer = await waited(*args, **kwargs)
        if slow["wait"]:
            stall.healed.clear()                     # then the partition begins
        return answer

    stall.wait_signal = slow_wait  # type: ignore[attr-defined]
    effects: list[float] = []
    errors: list[BaseException] = []
    app = shoal.App("watched", store=stall, clock=clock, instance_id="a",  # type: ignore[arg-type]
                    lease=30.0)
    app.on_error(errors.append)
    began = clock.now()

    @app.workflow
    async def wf(ctx: shoal.RunContext, input: None) -> None:
        async def first() -> None:
            await clock.sleep(45)

        async def second() -> None:
            for _ in range(100):
                effects.append(clock.now() - began)
                await clock.sleep(1)

        await ctx.step("first", first)
        slow["wait"] = True
        await ctx.wait_for("go")
        await ctx.step("second", second)

    await app.start()
    try:
        run = await app.dispatch("wf", None)
        await app.signal(run.id, "go", 1)
        for _ in range(120):
            await clock.advance(1)
        assert effects and max(effects) < 75 - 3 + 1, effects[-1:]   # its lease ended at 75
        assert any(isinstance(e, shoal.LeaseLostError) for e in errors)
    finally:
        stall.healed.set()
        await app.close(timeout=0)
        await store.close()


async def test_a_cut_off_call_gives_its_provider_slot_up_before_another_replica_takes_it(
        store: Store) -> None:
    """A provider call holds its concurrency slot under a lease (renewed while it runs): cut
    off from the store, the call is cancelled before that lease ends, so the call of another
    replica that takes the slot once it ends never runs beside it (max_concurrent holds)."""
    clock = VirtualClock()
    stalls: dict[str, Stall] = {}
    effects: list[tuple[str, float]] = []

    def make_app(shared: Store, clock: shoal.Clock, instance_id: str) -> shoal.App:
        stalls[instance_id] = Stall(shared)
        return shoal.App("cut", store=stalls[instance_id], clock=clock,  # type: ignore[arg-type]
                         instance_id=instance_id, lease=30.0)

    async def call(app: shoal.App, seconds: int) -> None:
        async with app.provider("model", max_concurrent=1).call():
            for _ in range(seconds):                  # a side effect every virtual second
                effects.append((app.instance_id, clock.now()))
                await clock.sleep(1)

    async with cluster(make_app, instances=2, clock=clock, store=store) as (a, b):
        try:
            first = asyncio.create_task(call(a, 1000))
            while not effects:
                await clock.advance(0)
            stalls[a.instance_id].healed.clear()     # A's store calls hang from now on
            second = asyncio.create_task(call(b, 5))
            for _ in range(120):
                await clock.advance(1)
            ours = [at for who, at in effects if who == a.instance_id]
            theirs = [at for who, at in effects if who == b.instance_id]
            assert theirs, "the other replica never got the slot"
            assert max(ours) < min(theirs)           # never both at once
            assert second.done() and second.exception() is None
            stalls[a.instance_id].healed.set()
            for _ in range(10):
                await clock.advance(1)
            assert first.done()
            with pytest.raises(shoal.StoreUnavailableError, match="slot"):
                first.result()
        finally:
            for stall in stalls.values():
                stall.healed.set()


async def _cut_handler_off(store: Store, kind: str) -> None:
    """Two instances handle ``kind`` (an outbox topic, or pause notification); the first whose
    handler starts is cut off from the store while its handler runs (a side effect every
    virtual second, for ever): its handler is stopped before the claim it was called under
    ends, so the other instance, which takes the item once the claim ends, never handles it
    beside it."""
    clock = VirtualClock()
    stalls: dict[str, Stall] = {}
    effects: list[tuple[str, float]] = []

    def make_app(shared: Store, clock: shoal.Clock, instance_id: str) -> shoal.App:
        stalls[instance_id] = Stall(shared)
        app = shoal.App("cut", store=stalls[instance_id], clock=clock,  # type: ignore[arg-type]
                        instance_id=instance_id, lease=30.0)

        async def handle(*args: Any) -> None:
            for _ in range(1000):
                effects.append((instance_id, clock.now()))
                await clock.sleep(1)

        if kind == "outbox":
            app.outbox_handler("email")(handle)
        else:
            app.on_pause_notify(handle)

        @app.workflow
        async def wf(ctx: shoal.RunContext, input: None) -> None:
            if kind == "outbox":
                async def send() -> None:
                    ctx.outbox.send("email", {"to": "someone"})
                await ctx.step("send", send)
            else:
                await ctx.approval("refund", {"amount": 40})

        return app

    async with cluster(make_app, instances=2, clock=clock, store=store) as apps:
        try:
            await apps[0].dispatch("wf", None)
            while not effects:
                await clock.advance(0.5)
            first = effects[0][0]
            stalls[first].healed.clear()              # its store calls hang from now on
            for _ in range(120):
                await clock.advance(1)
            ours = [at for who, at in effects if who == first]
            theirs = [at for who, at in effects if who != first]
            assert theirs, "the other instance never handled it"
            assert max(ours) < min(theirs)            # never both at once
        finally:
            for stall in stalls.values():
                stall.healed.set()


async def test_a_cut_off_outbox_delivery_stops_before_another_instance_delivers(
        store: Store) -> None:
    await _cut_handler_off(store, "outbox")


async def test_a_cut_off_pause_notification_stops_before_another_instance_notifies(
        store: Store) -> None:
    await _cut_handler_off(store, "pause")


async def test_a_step_thread_sees_its_lease_end_before_the_event_loop_runs() -> None:
    """A process thawed after a freeze (SIGSTOP past the lease): its step's thread runs on at
    once, and used to make its next side effect before the lease watchdog's first turn on the
    event loop. ``ctx.signal`` now reads as set in the thread as soon as the lease has ended
    (less the drift margin), with the loop still frozen (here: not run at all)."""
    import threading

    clock = VirtualClock(max_thread_wait=0)
    app = shoal.App("thaw", store="memory://", clock=clock, lease=30.0)
    looking, seen = threading.Event(), threading.Event()
    looked: list[tuple[bool, str | None]] = []

    @app.workflow
    async def export(ctx: shoal.RunContext, input: None) -> int:
        def rows() -> int:
            written = 0
            while not ctx.signal.aborted and written < 3:
                written += 1
                looking.wait(5)              # the test says when to look again
                looking.clear()
                reason = ctx.signal.reason
                looked.append((ctx.signal.aborted, type(reason).__name__ if reason else None))
                seen.set()
            return written

        return await ctx.step("rows", rows)

    async with app:
        run = await app.dispatch(export)
        await clock.advance(0)
        assert (await app.get_run(run.id)).status == "running"
        frozen = clock.now()
        # time passes with the loop frozen: no renewal, no watchdog turn (nothing is awaited)
        clock._now = frozen + 30 * 0.9 - 0.5          # still within the lease less the margin
        looking.set()
        assert seen.wait(5)
        seen.clear()
        assert looked[-1] == (False, None)
        clock._now = frozen + 30 * 0.9               # the lease, less the drift margin, ended
        looking.set()
        assert seen.wait(5)
        assert looked[-1] == (True, "LeaseLostError")
        await clock.advance(1)                        # the loop runs
        # the thread stopped at its first look after the lease's end (two rows); what it
        # returned was checkpointed and the run settled while the store still held its lease
        # (fenced writes: nobody else could have it yet), once, in its first attempt
        assert await app.result(run, timeout=0) == 2
        assert (await app.get_run(run.id)).attempts == 1
