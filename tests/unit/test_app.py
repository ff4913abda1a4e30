"""The App and engine through the public API, on the memory store under a VirtualClock."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from helpers import status_is, until

import shoal
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock, cluster


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


def make_app(clock: VirtualClock, store: shoal.Store | None = None, **kw: Any) -> shoal.App:
    return shoal.App("test", store=store or MemoryStore(), clock=clock, lease=30.0, **kw)


# -- bad input ---------------------------------------------------------------------------------

async def test_non_json_input_is_refused_and_nothing_stored(clock: VirtualClock) -> None:
    app = make_app(clock)

    @app.workflow
    async def wf(ctx: shoal.RunContext, input: Any) -> None:
        return None

    async with app:
        with pytest.raises(TypeError, match=r"input\['when'\]\[1\] is a datetime"):
            import datetime
            await app.dispatch(wf, {"when": [1, datetime.datetime.now()]})
        with pytest.raises(TypeError, match="NaN"):
            await app.dispatch(wf, {"x": float("nan")})
        with pytest.raises(TypeError, match="key 3"):
            await app.dispatch(wf, {3: "int key"})
        assert await app.list_runs() == []


async def test_unknown_workflow_is_refused(clock: VirtualClock) -> None:
    store = MemoryStore()
    app = make_app(clock, store)
    async with app.open():
        with pytest.raises(shoal.UnknownWorkflowError, match="'nope'"):
            await app.dispatch("nope", {})
        assert await app.list_runs() == []
    # a name registered by a started instance of the namespace is known to everyone
    worker = make_app(clock, store)

    @worker.workflow(name="remote")
    async def remote(ctx: shoal.RunContext, input: Any) -> str:
        return "done"

    async with worker, app.open():
        run = await app.dispatch("remote", {})
        assert await app.result(run.id) == "done"


async def test_unopenable_store_path(tmp_path: Path) -> None:
    app = shoal.App("t", store=f"sqlite:///{tmp_path}/missing/dir/x.db")
    with pytest.raises(shoal.StoreUnavailableError, match="does not exist"):
        await app.start()
    assert not (tmp_path / "missing").exists()
    with pytest.raises(shoal.ConfigurationError, match="Unknown store URL"):
        shoal.App("t", store="mysql://u:secret@host/db")
    try:
        shoal.App("t", store="mysql://u:secret@host/db")
    except shoal.ConfigurationError as e:
        assert "secret" not in str(e)


async def test_configuration_errors() -> None:
    with pytest.raises(shoal.ConfigurationError, match="odd number of addresses, 2 given"):
        shoal.App("t", store="memory://", coordination=["redis://a", "redis://b"])
    with pytest.raises(shoal.ConfigurationError, match="admission"):
        shoal.App("t", store="memory://", admission="drop")  # type: ignore[arg-type]
    app = shoal.App("t", store="memory://")
    with pytest.raises(shoal.ConfigurationError, match="async function"):
        app.workflow(lambda ctx, i: None)  # type: ignore[arg-type]


def test_from_env_takes_max_concurrent_runs_from_the_environment(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOAL_STORE", "memory://")
    monkeypatch.delenv("SHOAL_MAX_CONCURRENT_RUNS", raising=False)
    assert shoal.App.from_env("t", max_concurrent_runs=8).max_concurrent_runs == 8
    # the deployment's setting wins over the code's, as SHOAL_STORE does
    monkeypatch.setenv("SHOAL_MAX_CONCURRENT_RUNS", " 100 ")
    assert shoal.App.from_env("t", max_concurrent_runs=8).max_concurrent_runs == 100
    assert shoal.App.from_env("t").max_concurrent_runs == 100
    monkeypatch.setenv("SHOAL_MAX_CONCURRENT_RUNS", "")   # empty: not set
    assert shoal.App.from_env("t").max_concurrent_runs == 4
    for bad in ("0", "-3", "ten", "2.5", "1e3"):
        monkeypatch.setenv("SHOAL_MAX_CONCURRENT_RUNS", bad)
        with pytest.raises(shoal.ConfigurationError,
                           match=f"SHOAL_MAX_CONCURRENT_RUNS must be a whole number >= 1.*"
                                 f"not '{bad}'"):
            shoal.App.from_env("t")


# -- steps, replay, determinism --------------------------------------------------------------

async def test_steps_are_checkpointed_and_replayed(clock: VirtualClock) -> None:
    app = make_app(clock)
    calls: list[str] = []

    @app.workflow
    async def wf(ctx: shoal.RunContext, input: Any) -> Any:
        def one() -> int:               # a plain function runs in a thread
            calls.append("one")
            return 1

        a = await ctx.step("one", one)
        await ctx.sleep(60)            # durable: the run is re-delivered and replayed
        b = await ctx.step("two", lambda: calls.append("two") or 2)
        return {"sum": a + b, "attempt": ctx.attempt}

    async with app:
        run = await app.dispatch(wf)
        await until(status_is(app, run.id, "sleeping"))
        await clock.advance(61)
        await until(status_is(app, run.id, "succeeded"))
        assert await app.result(run.id) == {"sum": 3, "attempt": 1}
        assert calls == ["one", "two"]


async def test_nondeterminism_is_detected(clock: VirtualClock) -> None:
    app = make_app(clock)
    branch = {"name": "charge"}

    @app.workflow
    async def wf(ctx: shoal.RunContext, input: Any) -> None:
        await ctx.step(branch["name"], lambda: 1)
        await ctx.sleep(10)

    async with app:
        run = await app.dispatch(wf)
        await until(status_is(app, run.id, "sleeping"))
        branch["name"] = "refund"
        await clock.advance(11)
        await until(status_is(app, run.id, "failed"))
        with pytest.raises(shoal.RunFailedError, match=r"'charge'.*'refund'"):
            await app.result(run.id)


async def test_step_result_must_be_json(clock: VirtualClock) -> None:
    app = make_app(clock)

    @app.workflow(max_attempts=1)
    async def wf(ctx: shoal.RunContext, input: Any) -> None:
        await ctx.step("bad", lambda: {1, 2})

    async with app:
        run = await app.dispatch(wf)
        with pytest.raises(shoal.RunFailedError, match="result of step 'bad'"):
            await app.result(run.id)


# -- retries, attempts -----------------------------------------------------------------------

async def test_retries_with_backoff_then_success(clock: VirtualClock) -> None:
    app = make_app(clock)
    seen: list[int] = []

    @app.workflow(max_attempts=3, backoff=10.0)
    async def flaky(ctx: shoal.RunContext, input: Any) -> int:
        seen.append(ctx.attempt)
        await ctx.step("first", lambda: "once")
        if ctx.attempt < 3:
            raise RuntimeError(f"boom {ctx.attempt}")
        return ctx.attempt

    async with app:
        run = await app.dispatch(flaky)
        await until(lambda: _attempts(app, run.id, 2))
        assert (await app.get_run(run.id)).error == "RuntimeError: boom 1"
        await clock.advance(4)          # below the smallest backoff (10 * 0.5)
        assert seen == [1]
        await clock.advance(6)
        await until(lambda: _attempts(app, run.id, 3))
        await clock.advance(20)
        await until(status_is(app, run.id, "succeeded"))
        assert seen == [1, 2, 3] and await app.result(run.id) == 3


async def _attempts(app: shoal.App, run_id: str, n: int) -> bool:
    return (await app.get_run(run_id)).attempts == n


async def test_exhausted_attempts_fail(clock: VirtualClock) -> None:
    app = make_app(clock)

    @app.workflow(max_attempts=2, backoff=1.0)
    async def bad(ctx: shoal.RunContext, input: Any) -> None:
        raise ValueError("always")

    async with app:
        run = await app.dispatch(bad)
        await until(lambda: _attempts(app, run.id, 2))
        await clock.advance(2)
        await until(status_is(app, run.id, "failed"))
        with pytest.raises(shoal.RunFailedError, match="ValueError: always"):
            await app.result(run.id)


async def test_sleeps_and_waits_do_not_consume_attempts(clock: VirtualClock) -> None:
    app = make_app(clock)

    @app.workflow(max_attempts=1)
    async def patient(ctx: shoal.RunContext, input: Any) -> int:
        for _ in range(3):
            await ctx.sleep(5)
        await ctx.wait_for("go")
        return ctx.attempt

    async with app:
        run = await app.dispatch(patient)
        for _ in range(3):
            await until(status_is(app, run.id, "sleeping"))
            await clock.advance(6)
        await until(status_is(app, run.id, "waiting"))
        await app.signal(run.id, "go")
        assert await app.result(run.id) == 1


# -- sleep, signals --------------------------------------------------------------------------

async def test_sleeping_and_waiting_runs_hold_no_slot(clock: VirtualClock) -> None:
    app = make_app(clock, max_concurrent_runs=1)

    @app.workflow
    async def sleeper(ctx: shoal.RunContext, input: Any) -> str:
        await ctx.sleep(3600)
        return "slept"

    @app.workflow
    async def waiter(ctx: shoal.RunContext, input: Any) -> Any:
        return await ctx.wait_for("go")

    @app.workflow
    async def quick(ctx: shoal.RunContext, input: Any) -> str:
        return "quick"

    async with app:
        s = await app.dispatch(sleeper)
        w = await app.dispatch(waiter)
        q = await app.dispatch(quick)
        assert await app.result(q.id) == "quick"
        assert (await app.get_run(s.id)).status == "sleeping"
        assert (await app.get_run(w.id)).status == "waiting"
        await app.signal(w.id, "go", {"ok": True})
        assert await app.result(w.id) == {"ok": True}
        await clock.advance(3600)
        assert await app.result(s.id) == "slept"


async def test_signal_before_wait_and_timeout(clock: VirtualClock) -> None:
    app = make_app(clock)

    @app.workflow
    async def wf(ctx: shoal.RunContext, input: Any) -> Any:
        await ctx.sleep(10)
        first = await ctx.wait_for("early")
        try:
            await ctx.wait_for("never", timeout=30)
        except TimeoutError:
            return {"first": first, "timed_out": True}
        return None

    async with app:
        run = await app.dispatch(wf)
        await app.signal(run.id, "early", [1, 2])          # sent before the wait
        await until(status_is(app, run.id, "sleeping"))
        await clock.advance(10)
        await until(status_is(app, run.id, "waiting"))
        await clock.advance(29)
        assert (await app.get_run(run.id)).status == "waiting"
        await clock.advance(2)
        assert await app.result(run.id) == {"first": [1, 2], "timed_out": True}
        with pytest.raises(shoal.UnknownRunError):
            await app.signal("missing", "x")
        with pytest.raises(TypeError, match="payload"):
            await app.signal(run.id, "x", object())


# -- cancel, keys, priority, idempotency -----------------------------------------------------

async def test_cancel_queued_and_running(clock: VirtualClock) -> None:
    app = make_app(clock, max_concurrent_runs=1)
    started = asyncio.Event()

    @app.workflow
    async def long(ctx: shoal.RunContext, input: Any) -> None:
        started.set()
        await ctx.step("forever", asyncio.Event().wait)

    async with app:
        running = await app.dispatch(long)
        queued = await app.dispatch(long)
        await started.wait()
        c = await app.cancel(queued.id)
        assert c.status == "cancelled"
        await app.cancel(running.id)
        with pytest.raises(shoal.RunCancelledError):
            await app.result(running.id)
        with pytest.raises(shoal.RunCancelledError):
            await app.result(queued.id)
        with pytest.raises(shoal.UnknownRunError):
            await app.cancel("missing")


async def test_priority_then_fifo_and_concurrency_keys(clock: VirtualClock) -> None:
    app = make_app(clock, max_concurrent_runs=1)
    order: list[str] = []

    @app.workflow(concurrency_key=lambda i: i.get("key"))
    async def wf(ctx: shoal.RunContext, input: Any) -> None:
        order.append(input["name"])
        if input.get("sleep"):
            await ctx.sleep(100)
        order.append(input["name"] + "-end")

    async with app.open():   # dispatch everything before a worker starts
        await app.dispatch(wf, {"name": "low"})
        await app.dispatch(wf, {"name": "k1", "key": "k", "sleep": True}, priority=5)
        await app.dispatch(wf, {"name": "k2", "key": "k"}, priority=5)
        await app.dispatch(wf, {"name": "high"}, priority=9)
    async with app:
        await until(lambda: _count(app, "succeeded", 2))
        # k2 waits for k1 (which holds its key while sleeping); low runs past it
        assert order == ["high", "high-end", "k1", "low", "low-end"]
        await clock.advance(100)
        await until(lambda: _count(app, "succeeded", 4))
        assert order[5:] == ["k1", "k1-end", "k2", "k2-end"]


async def _count(app: shoal.App, status: str, n: int) -> bool:
    return len(await app.list_runs(status=status)) == n


async def test_a_concurrency_limit_lets_n_runs_of_a_key_run_at_once(clock: VirtualClock) -> None:
    app = make_app(clock, max_concurrent_runs=5)

    @app.workflow(concurrency_key=lambda i: i["key"], concurrency_limit=2)
    async def wf(ctx: shoal.RunContext, input: Any) -> None:
        await ctx.wait_for("go")

    async with app:
        runs = [await app.dispatch(wf, {"key": "k"}) for _ in range(3)]
        other = await app.dispatch(wf, {"key": "j"})
        await until(lambda: _count(app, "waiting", 3))
        assert (await app.get_run(other.id)).status == "waiting"
        assert [(await app.get_run(r.id)).status for r in runs] == ["waiting", "waiting",
                                                                    "queued"]
        await app.signal(runs[0].id, "go")
        await until(status_is(app, runs[2].id, "waiting"))
        assert (await app.get_run(runs[1].id)).status == "waiting"


async def test_idempotency_key_across_instances(clock: VirtualClock) -> None:
    def make(store: shoal.Store, clk: shoal.Clock, name: str) -> shoal.App:
        app = shoal.App("test", store=store, clock=clk, instance_id=name)

        @app.workflow(name="wf")
        async def wf(ctx: shoal.RunContext, input: Any) -> Any:
            return input

        return app

    async with cluster(make, instances=2, clock=clock) as (a, b):
        first = await a.dispatch("wf", {"v": 1}, idempotency_key="order-42")
        second = await b.dispatch("wf", {"v": 2}, idempotency_key="order-42")
        assert first.id == second.id
        assert await b.result(first.id) == {"v": 1}
        third = await b.dispatch("wf", {"v": 3}, idempotency_key="order-42")
        assert third.id == first.id and third.status == "succeeded"


# -- admission -------------------------------------------------------------------------------

async def test_admission_reject_and_park(clock: VirtualClock) -> None:
    store = MemoryStore()
    rejecting = make_app(clock, store, max_queued=2)
    parking = make_app(clock, store, max_queued=2, admission="park")

    @parking.workflow(name="wf")
    async def wf(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    rejecting.workflow(name="wf")(wf.spec.fn)
    async with rejecting.open():
        await rejecting.dispatch("wf", 1)
        await rejecting.dispatch("wf", 2)
        with pytest.raises(shoal.AdmissionRejectedError, match="max_queued"):
            await rejecting.dispatch("wf", 3)
        assert len(await rejecting.list_runs()) == 2
        held = [await parking.dispatch("wf", n) for n in (3, 4, 5)]
        assert all(r.held for r in held)
    async with parking:
        for _ in range(6):
            await clock.advance(10)
        results = [await parking.result(r.id) for r in held]
        assert results == [3, 4, 5]


# -- leases, recovery, graceful stop ---------------------------------------------------------

async def test_graceful_stop_interrupts_and_another_instance_continues(
    clock: VirtualClock,
) -> None:
    store = MemoryStore()
    executed: list[tuple[str, str]] = []
    gate = asyncio.Event()

    def make(name: str) -> shoal.App:
        app = shoal.App("test", store=store, clock=clock, instance_id=name, lease=30.0)

        @app.workflow(name="wf", concurrency_key="one")
        async def wf(ctx: shoal.RunContext, input: Any) -> str:
            await ctx.step("a", lambda: executed.append((name, "a")) or 1)

            async def b() -> int:
                executed.append((name, "b"))
                if name == "first":
                    await gate.wait()
                return 2

            await ctx.step("b", b)
            return name

        return app

    first, second = make("first"), make("second")
    await first.start()
    run = await first.dispatch("wf")
    await until(lambda: _has(executed, ("first", "b")))
    closing = asyncio.create_task(first.close(timeout=5))
    await clock.advance(5)                # the step does not finish: interrupted after 5 s
    await closing
    interrupted = await second.get_run(run.id)
    assert interrupted.status == "interrupted" and interrupted.owner is None
    async with second:                    # continued at its first poll, no lease wait
        assert await second.result(run.id) == "second"
    assert executed == [("first", "a"), ("first", "b"), ("second", "b")]
    final = await second.get_run(run.id)
    assert final.attempts == 1            # an interruption is not a failed attempt


async def _has(items: list[Any], item: Any) -> bool:
    return item in items


async def test_crash_recovery_after_lease_counts_an_attempt(clock: VirtualClock) -> None:
    store = MemoryStore()
    frozen = VirtualClock()

    def make(name: str, clk: VirtualClock) -> shoal.App:
        app = shoal.App("test", store=store, clock=clk, instance_id=name, lease=30.0)

        @app.workflow(name="wf", max_attempts=2)
        async def wf(ctx: shoal.RunContext, input: Any) -> int:
            if ctx.attempt == 1:
                await ctx.step("hang", asyncio.Event().wait)
            return ctx.attempt

        return app

    crashed, survivor = make("crashed", frozen), make("survivor", clock)
    await crashed.start()
    run = await crashed.dispatch("wf")
    await until(status_is(crashed, run.id, "running"))
    async with survivor:
        await clock.advance(29)
        assert (await survivor.get_run(run.id)).owner == "crashed"
        await clock.advance(12)          # lease + one poll
        assert await survivor.result(run.id) == 2
    await crashed.close(timeout=0)


async def test_dispatch_by_name_takes_the_registered_options(clock: VirtualClock) -> None:
    store = MemoryStore()
    worker = make_app(clock, store)

    @worker.workflow(name="static", priority=5, max_attempts=7, concurrency_key="ledger")
    async def static(ctx: shoal.RunContext, input: Any) -> None:
        return None

    @worker.workflow(name="keyed", concurrency_key=lambda i: i["customer"])
    async def keyed(ctx: shoal.RunContext, input: Any) -> None:
        return None

    submitter = make_app(clock, store)      # a web process: no workflow code
    async with worker, submitter.open():
        run = await submitter.dispatch("static", {})
        assert (run.priority, run.max_attempts, run.concurrency_key) == (5, 7, "ledger")
        with pytest.raises(shoal.ConfigurationError, match="concurrency_key="):
            await submitter.dispatch("keyed", {"customer": "c1"})
        explicit = await submitter.dispatch("keyed", {"customer": "c1"}, concurrency_key="c1")
        assert explicit.concurrency_key == "c1"
        assert len(await submitter.list_runs()) == 2


async def test_a_delayed_run_starts_at_its_time_not_a_poll_later(clock: VirtualClock) -> None:
    app = make_app(clock)      # lease 30: polls every 10 s

    @app.workflow
    async def later(ctx: shoal.RunContext, input: Any) -> float:
        return clock.now()

    async with app:
        run = await app.dispatch(later, delay=4.0)
        await clock.advance(3.9)
        assert (await app.get_run(run.id)).status == "queued"
        await clock.advance(0.1)
        assert await app.result(run.id) == run.created_at + 4.0


async def test_a_drain_longer_than_the_lease_keeps_the_lease(clock: VirtualClock) -> None:
    store = MemoryStore()
    ran: list[str] = []

    def make(name: str) -> shoal.App:
        app = shoal.App("test", store=store, clock=clock, instance_id=name, lease=30.0)

        @app.workflow(name="slow")
        async def slow(ctx: shoal.RunContext, input: Any) -> str:
            async def work() -> str:
                ran.append(name)
                await clock.sleep(40)        # longer than the lease
                return name
            return str(await ctx.step("work", work))

        return app

    draining, other = make("draining"), make("other")
    await draining.start()
    run = await draining.dispatch("slow")
    await until(lambda: _has(ran, "draining"))
    async with other:
        closing = asyncio.create_task(draining.close(timeout=60))
        await clock.advance(45)
        await closing
        done = await other.get_run(run.id)
        assert done.status == "succeeded" and done.output == "draining"
        assert done.attempts == 1 and ran == ["draining"]


class FlakyStore(MemoryStore):
    """A memory store whose next checkpoint fails as an unreachable store would."""

    fail_next_checkpoint = False

    async def checkpoint_step(self, *args: Any, **kwargs: Any) -> bool:
        if self.fail_next_checkpoint:
            self.fail_next_checkpoint = False
            raise shoal.StoreUnavailableError("the store is locked")
        return await super().checkpoint_step(*args, **kwargs)


async def test_a_store_outage_is_not_charged_to_the_run(clock: VirtualClock) -> None:
    store = FlakyStore()
    app = make_app(clock, store)
    errors: list[BaseException] = []
    app.on_error(errors.append)

    @app.workflow(max_attempts=1)
    async def wf(ctx: shoal.RunContext, input: Any) -> int:
        await ctx.step("one", lambda: 1)
        return ctx.attempt

    async with app:
        store.fail_next_checkpoint = True
        run = await app.dispatch(wf)
        await until(status_is(app, run.id, "interrupted"))    # released, not failed
        await clock.advance(10)                                # the next poll continues it
        assert await app.result(run.id) == 1
        assert [type(e) for e in errors] == [shoal.StoreUnavailableError]


async def test_finished_runs_are_pruned_after_run_retention(clock: VirtualClock) -> None:
    app = make_app(clock, run_retention=100.0)

    @app.workflow
    async def quick(ctx: shoal.RunContext, input: Any) -> int:
        return await ctx.step("one", lambda: 1)

    async with app:
        done = await app.dispatch(quick)
        assert await app.result(done.id) == 1
        waiting = await app.dispatch(quick, delay=500)
        await clock.advance(99)
        assert (await app.get_run(done.id)).status == "succeeded"
        await clock.advance(20)                  # past the retention, and a poll
        with pytest.raises(shoal.UnknownRunError):
            await app.get_run(done.id)
        assert (await app.get_run(waiting.id)).status == "queued"   # live runs are kept


class SilentRenewals:
    """A view of a store whose lease renewals never answer (a frozen or cut-off instance)."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def renew_leases(self, *args: Any) -> Any:
        await asyncio.Event().wait()


async def test_no_step_starts_once_the_lease_may_have_passed(clock: VirtualClock) -> None:
    store = MemoryStore()
    ran: list[tuple[str, str]] = []
    gate = asyncio.Event()
    errors: list[BaseException] = []

    def make(name: str, s: Any) -> shoal.App:
        app = shoal.App("test", store=s, clock=clock, instance_id=name, lease=30.0)
        app.on_error(errors.append)

        @app.workflow(name="wf")
        async def wf(ctx: shoal.RunContext, input: Any) -> str:
            await ctx.step("one", lambda: ran.append((name, "one")))
            if name == "frozen":
                await gate.wait()               # not a step: the lease runs out meanwhile
            await ctx.step("two", lambda: ran.append((name, "two")))
            return name

        return app

    frozen, other = make("frozen", SilentRenewals(store)), make("other", store)
    await frozen.start()
    run = await frozen.dispatch("wf")
    await until(lambda: _has(ran, ("frozen", "one")))
    async with other:
        await clock.advance(41)                  # lease + a poll: the other takes it over
        assert await other.result(run.id) == "other"
        gate.set()
        await until(lambda: _has_type(errors, shoal.LeaseLostError))
        assert ran == [("frozen", "one"), ("other", "two")]
    closing = asyncio.create_task(frozen.close(timeout=0))
    await clock.advance(1)
    await closing


async def _has_type(items: list[Any], kind: type) -> bool:
    return any(isinstance(i, kind) for i in items)


class RefusedRenewals(MemoryStore):
    """A memory store that refuses every lease renewal while ``refuse`` is set (as a store does
    once another instance took the run over, or the lease ran out)."""

    refuse = False

    async def renew_leases(self, owner: str, leases: dict[str, int], lease: float,
                           now: float) -> Any:
        if self.refuse:
            return await super().renew_leases(owner, {}, lease, now)
        return await super().renew_leases(owner, leases, lease, now)


async def test_a_run_claimed_again_waits_for_its_earlier_execution_here(
        clock: VirtualClock) -> None:
    """The lease of a run whose plain-function step is in a thread is lost: the task is aborted
    but the thread runs on. It holds its slot, and when this instance claims the run again the
    new execution waits for that thread: the step never runs twice at once here."""
    import threading

    clock.max_thread_wait = 0     # time moves while the step's thread runs: that is the test
    store = RefusedRenewals()
    app = make_app(clock, store, max_concurrent_runs=2)
    gate = threading.Event()
    running: list[int] = []
    most: list[int] = [0]
    calls: list[int] = []

    def work() -> str:
        running.append(1)
        most[0] = max(most[0], len(running))
        calls.append(1)
        gate.wait(10)
        running.pop()
        return "done"

    @app.workflow(name="wf")
    async def wf(ctx: shoal.RunContext, input: Any) -> str:
        return str(await ctx.step("work", work))

    @app.workflow(name="quick")
    async def quick(ctx: shoal.RunContext, input: Any) -> int:
        return 1

    async def thread_started() -> bool:
        await asyncio.sleep(0.001)
        return bool(running)

    async with app:
        run = await app.dispatch("wf")
        await until(thread_started)
        store.refuse = True
        await clock.advance(10)                   # the heartbeat is refused: the run is lost here
        store.refuse = False
        assert app._engine is not None and app._engine.running == 1   # the thread holds a slot
        await clock.advance(31)                   # past the lease: recovered and claimed again
        assert (await app.get_run(run.id)).lease_epoch == 2
        one = await app.dispatch("quick")         # no slot for it while the thread and the
        await clock.advance(1)                    # new execution waiting for it hold both
        assert (await app.get_run(one.id)).status == "queued"
        assert len(calls) == 1                    # the new execution has not started the step
        gate.set()
        assert await app.result(run.id, timeout=60) == "done"
        assert await app.result(one.id, timeout=60) == 1
    assert len(calls) == 2 and most[0] == 1


class CountedClaims:
    """A view of a memory store that checks, after every call that claims, that ``owner`` holds
    at most ``slots`` runs, and counts the runs claimed with the settlements that freed slots."""

    def __init__(self, store: MemoryStore, owner: str, slots: int) -> None:
        self._store = store
        self.owner, self.slots = owner, slots
        self.peak = 0
        self.claimed_with_settlements = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def _held(self) -> None:
        held = [r for r in await self._store.list_runs("test", status="running", limit=1000)
                if r.owner == self.owner]
        self.peak = max(self.peak, len(held))
        assert len(held) <= self.slots, f"{len(held)} claims held with {self.slots} slots"

    async def claim_runs(self, *args: Any, **kwargs: Any) -> list[shoal.Run]:
        runs = await self._store.claim_runs(*args, **kwargs)
        await self._held()
        return runs

    async def settle_and_claim(self, *args: Any, **kwargs: Any) -> Any:
        held, runs = await self._store.settle_and_claim(*args, **kwargs)
        if args[0]:
            self.claimed_with_settlements += len(runs)
        await self._held()
        return held, runs


async def test_claims_ride_with_settlements_and_never_exceed_the_slots(
    clock: VirtualClock
) -> None:
    store = CountedClaims(MemoryStore(), "w", 3)
    app = shoal.App("test", store=store, clock=clock, instance_id="w",  # type: ignore[arg-type]
                    max_concurrent_runs=3, lease=30.0)
    started: list[int] = []

    @app.workflow(name="wf")
    async def wf(ctx: shoal.RunContext, n: int) -> int:
        started.append(n)
        await asyncio.sleep(0)
        return n

    async with app:
        runs = [await app.dispatch("wf", n) for n in range(40)]
        assert [await app.result(r.id, timeout=60) for r in runs] == list(range(40))
    assert sorted(started) == list(range(40))
    assert store.peak == 3
    # the slots a batch of settlements frees are claimed with it, not by a claim of their own
    assert store.claimed_with_settlements > 20
