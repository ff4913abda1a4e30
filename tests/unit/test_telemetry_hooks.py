"""The telemetry hooks beyond the engine's: dispatch, recovery, outbox delivery, pause
notification, locks, meters, provider calls, spending and the store's calls, each told what
happened where it happened; a sink that raises changes none of it; an app whose sinks do not
time store calls calls its store directly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import status_is, until

import shoal
from shoal.backends.memory import MemoryStore
from shoal.ports import CoordStore, RateStore, Store, TransactionalDispatch
from shoal.telemetry import Telemetry
from shoal.telemetry.store import Measured
from shoal.testing import VirtualClock, settle

LEASE = 30.0


class Recorder(Telemetry):
    """Every hook but the engine's, recorded as a tuple; tokens checked to come back."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.calls: list[tuple[str, bool]] = []

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        return [e[1:] for e in self.events if e[0] == kind]

    def runs_dispatched(self, workflow: str, created: int) -> None:
        self.events.append(("dispatched", workflow, created))

    def run_recovered(self, run: shoal.Run) -> None:
        self.events.append(("recovered", run.id, run.status.value))

    def delivery_started(self, entry: shoal.OutboxEntry) -> Any:
        return ("delivery", entry.id)

    def delivery_ended(self, token: Any, entry: shoal.OutboxEntry, result: str,
                       error: BaseException | None) -> None:
        assert token == ("delivery", entry.id)
        self.events.append(("delivery", entry.topic, result, type(error).__name__
                            if error else None))

    def pause_notified(self, pause: shoal.Pause, error: BaseException | None) -> None:
        self.events.append(("notified", pause.name, type(error).__name__ if error else None))

    def lock_wait_started(self, keys: tuple[str, ...]) -> Any:
        return ("lock", keys)

    def lock_wait_ended(self, token: Any, keys: tuple[str, ...], acquired: bool,
                        queued: bool) -> None:
        assert token == ("lock", keys)
        self.events.append(("lock", keys, acquired, queued))

    def lock_released(self, keys: tuple[str, ...], held_seconds: float, lost: bool) -> None:
        self.events.append(("released", keys, held_seconds, lost))

    def metered(self, keys: Any, deltas: Any, debts: Any) -> None:
        self.events.append(("metered", list(keys), list(deltas), list(debts)))

    def provider_call_started(self, provider: str, tenant: str) -> Any:
        return ("call", provider, tenant)

    def provider_call_ended(self, token: Any, provider: str, result: str,
                            error: BaseException | None) -> None:
        assert token[:2] == ("call", provider)
        self.events.append(("call", provider, token[2], result,
                            type(error).__name__ if error else None))

    def provider_paused(self, provider: str, seconds: float) -> None:
        self.events.append(("paused", provider, seconds))

    def spent(self, tenant: str, amount: float, currency: str) -> None:
        self.events.append(("spent", tenant, amount, currency))

    def store_call(self, operation: str, seconds: float, error: BaseException | None) -> None:
        assert seconds >= 0
        self.calls.append((operation, error is not None))


class Raising(Telemetry):
    """A sink that raises in every hook: nothing it is told about may fail because of it."""


for _hook in ("runs_dispatched", "run_recovered", "delivery_started", "delivery_ended",
              "pause_notified", "lock_wait_started", "lock_wait_ended", "lock_released",
              "metered", "provider_call_started", "provider_call_ended", "provider_paused",
              "spent", "store_call", "run_claimed", "attempt_started", "attempt_ended"):
    def _raise(self: Telemetry, *args: Any, _hook: str = _hook) -> Any:
        raise RuntimeError(f"sink bug in {_hook}")
    setattr(Raising, _hook, _raise)


def make(store: Any, clock: VirtualClock, name: str = "i1", *,
         raising: bool = True) -> tuple[shoal.App, Recorder]:
    app = shoal.App("hooks", store=store, clock=clock, lease=LEASE, instance_id=name)
    recorder = app.instrument(Recorder())
    if raising:
        app.instrument(Raising())
    return app, recorder


async def test_dispatch_tells_the_runs_created_not_the_repeated_keys() -> None:
    app, told = make("memory://", VirtualClock())

    @app.workflow
    async def job(ctx: shoal.RunContext, input: Any) -> None:
        return None

    async with app.open():
        await app.dispatch(job, 1, idempotency_key="k")
        await app.dispatch(job, 1, idempotency_key="k")              # the same run
        await app.dispatch_many(job, [shoal.DispatchItem(2, idempotency_key="k"), 3, 4])
    assert told.of("dispatched") == [("job", 1), ("job", 2)]


async def test_recovery_tells_each_run_it_took_back() -> None:
    clock, store = VirtualClock(), MemoryStore()
    app, told = make(store, clock)

    @app.workflow(max_attempts=1)
    async def job(ctx: shoal.RunContext, input: Any) -> None:
        return None

    async with app.open():
        run = await app.dispatch(job)
        await store.claim_runs("hooks", ["job"], "dead", 1, LEASE, clock.now())
    await clock.advance(LEASE + 1)
    async with app:
        await until(lambda: _told(told, "recovered"))
        # out of attempts (its one attempt was the crashed instance's): failed, still told
        assert told.of("recovered") == [(run.id, "failed")]


async def _told(recorder: Recorder, kind: str, n: int = 1) -> bool:
    return len(recorder.of(kind)) >= n


async def test_outbox_deliveries_tell_delivered_retry_and_dead() -> None:
    clock = VirtualClock()
    app, told = make("memory://", clock)
    failures = {"email": 1}

    @app.outbox_handler("email")
    async def email(payload: Any, key: str) -> None:
        if failures["email"]:
            failures["email"] -= 1
            raise ConnectionError("smtp down")

    @app.outbox_handler("sms", max_deliveries=1)
    def sms(payload: Any, key: str) -> None:
        raise ValueError("no such number")

    @app.workflow
    async def notify(ctx: shoal.RunContext, input: Any) -> None:
        def send() -> None:
            ctx.outbox.send("email", {"to": "ann"})
            ctx.outbox.send("sms", {"to": "+1"})
        await ctx.step("send", send)

    async with app:
        run = await app.dispatch(notify)
        await until(status_is(app, run.id, "succeeded"))
        await until(lambda: _told(told, "delivery", 2))
        await clock.advance(5)    # past the email's backoff (at most 2 s)
        await until(lambda: _told(told, "delivery", 3))
    assert sorted(told.of("delivery")) == [
        ("email", "delivered", None), ("email", "retry", "ConnectionError"),
        ("sms", "dead", "ValueError")]


async def test_pause_notifications_tell_sent_and_failed() -> None:
    clock = VirtualClock()
    app, told = make("memory://", clock)
    sent: list[str] = []

    @app.on_pause_notify
    async def mail(pause: shoal.Pause) -> None:
        sent.append(pause.id)
        if len(sent) == 1:
            raise ConnectionError("mail server down")

    @app.workflow
    async def refund(ctx: shoal.RunContext, input: Any) -> bool:
        return (await ctx.approval("refund", {"amount": 40})).approved

    async with app:
        run = await app.dispatch(refund)
        await until(status_is(app, run.id, "waiting"))
        await until(lambda: _told(told, "notified"))
        await clock.advance(LEASE + 1)     # taken again once the sender's lease passed
        await until(lambda: _told(told, "notified", 2))
    assert told.of("notified") == [("refund", "ConnectionError"), ("refund", None)]


async def test_locks_tell_waits_hand_overs_and_hold_times() -> None:
    clock = VirtualClock()
    app, told = make("memory://", clock)
    async with app:
        first = app.lock(["orders:7", "orders:8"])
        await first.__aenter__()
        second = asyncio.ensure_future(app.locked("orders:7", lambda signal: "done"))
        await settle()
        assert not second.done()
        await clock.advance(4)
        await first.__aexit__(None, None, None)
        assert await second == "done"
    assert told.of("lock") == [(("orders:7", "orders:8"), True, False),
                               (("orders:7",), True, True)]   # the second was handed over
    assert told.of("released") == [(("orders:7", "orders:8"), 4.0, False),
                                   (("orders:7",), 0.0, False)]


async def test_a_lock_wait_that_is_cancelled_is_told_not_acquired() -> None:
    clock = VirtualClock()
    app, told = make("memory://", clock)
    async with app, app.lock("report"):
        waiter = asyncio.ensure_future(app.locked("report", lambda signal: None))
        await settle()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    assert told.of("lock") == [(("report",), True, False), (("report",), False, True)]


async def test_meters_tell_the_debts_the_store_answered() -> None:
    clock = VirtualClock()
    app, told = make("memory://", clock)
    async with app.open():
        await app.meter(["appraise:c1", "appraise"], [6000, 6000])
        await clock.advance(1)
        await app.meter(["appraise:c1"], [0])
    assert told.of("metered") == [(["appraise:c1", "appraise"], [6000.0, 6000.0],
                                   [6000.0, 6000.0]),
                                  (["appraise:c1"], [0.0], [5000.0])]


async def test_provider_calls_tell_their_result_pauses_and_spend() -> None:
    clock = VirtualClock()
    app, told = make("memory://", clock)
    app.budget(per_tenant_day=1.0)
    llm = app.provider("llm", price_per_token=0.001, requests_per_minute=3,
                       breaker=shoal.Breaker(failures=1, window=60, cooldown=30))
    async with app.open():
        async with llm.call(tokens=100, tenant="acme"):
            pass                                         # 0.1 spent by acme
        async with llm.call(tenant="acme") as call:
            call.rate_limited(retry_after=2)             # a 429: paused 2 s
        await clock.advance(3)
        with pytest.raises(shoal.BudgetExceededError):
            async with llm.call(tokens=5000, tenant="acme"):
                pass
        async with llm.call(tenant="globex"):           # the minute's third request
            pass
        with pytest.raises(shoal.RateLimitTimeoutError):
            async with llm.call(tenant="globex", timeout=0):
                pass
        await clock.advance(60)
        with pytest.raises(OSError):
            async with llm.call(tenant="globex"):
                raise OSError("provider 500")            # opens the circuit (1 failure)
        with pytest.raises(shoal.CircuitOpenError):
            async with llm.call(tenant="globex"):
                pass
    assert told.of("call") == [
        ("llm", "acme", "succeeded", None),
        ("llm", "acme", "rate_limited", None),
        ("llm", "acme", "refused", "BudgetExceededError"),
        ("llm", "globex", "succeeded", None),
        ("llm", "globex", "timed_out", "RateLimitTimeoutError"),
        ("llm", "globex", "failed", "OSError"),
        ("llm", "globex", "circuit_open", "CircuitOpenError"),
    ]
    assert told.of("paused") == [("llm", 2.0)]
    assert told.of("spent") == [("acme", pytest.approx(0.1), "usd")]


async def test_spending_outside_a_provider_is_told() -> None:
    clock = VirtualClock()
    app, told = make("memory://", clock)

    @app.workflow
    async def agent(ctx: shoal.RunContext, input: Any) -> None:
        await ctx.spend(0.25, currency="eur")

    async with app:
        run = await app.dispatch(agent, tenant="acme")
        await until(status_is(app, run.id, "succeeded"))
        await app.spend(0.5, tenant="globex")
        await app.spend(0, tenant="globex")             # nothing spent: not told
    assert told.of("spent") == [("acme", 0.25, "eur"), ("globex", 0.5, "usd")]


async def test_store_calls_are_timed_through_a_wrapper_of_the_same_shape() -> None:
    clock = VirtualClock()
    store = MemoryStore()
    app, told = make(store, clock)
    calls: Any = app._calls
    assert isinstance(calls, Measured) and calls.measured_store is store and app.store is store
    for protocol in (Store, CoordStore, RateStore):
        assert isinstance(calls, protocol)
    assert not isinstance(calls, TransactionalDispatch)   # as the memory store itself

    @app.workflow
    async def job(ctx: shoal.RunContext, input: Any) -> int:
        return await ctx.step("one", lambda: 1)

    async with app:
        run = await app.dispatch(job)
        await until(status_is(app, run.id, "succeeded"))
        async with app.lock("k"):
            pass
        with pytest.raises(shoal.UnknownRunError):
            await app.get_run("nope")
    operations = {op for op, _ in told.calls}
    assert {"register_workflows", "create_run", "claim_runs", "checkpoint_step",
            "settle_and_claim", "recover_runs", "get_run", "lock_acquire",
            "lock_release"} <= operations
    assert "wait_for_work" not in operations              # a wait, not a query
    assert not any(failed for _, failed in told.calls)


async def test_a_failing_store_call_is_told_with_its_error() -> None:
    class Refusing(MemoryStore):
        async def get_run(self, run_id: str) -> Any:
            raise ConnectionError("refused")

    app, told = make(Refusing(), VirtualClock())
    async with app.open():
        with pytest.raises(ConnectionError):
            await app.get_run("r1")
    assert ("get_run", True) in told.calls


async def test_without_a_sink_timing_store_calls_the_store_is_called_directly() -> None:
    store = MemoryStore()
    app = shoal.App("hooks", store=store, clock=VirtualClock())
    assert app._calls is store
    app.instrument(Telemetry())               # a sink that implements nothing
    assert app._calls is store
    app.instrument(Recorder())
    assert isinstance(app._calls, Measured)


async def test_a_single_sink_and_one_of_two_get_their_own_tokens_back() -> None:
    class Ends(Telemetry):
        """Implements only the end of a lock wait: it gets no token of another sink's."""

        def __init__(self) -> None:
            self.tokens: list[Any] = []

        def lock_wait_ended(self, token: Any, keys: tuple[str, ...], acquired: bool,
                            queued: bool) -> None:
            self.tokens.append(token)

    for sinks in ([Recorder()], [Ends(), Recorder()], [Recorder(), Ends()]):
        app = shoal.App("hooks", store="memory://", clock=VirtualClock())
        for sink in sinks:
            app.instrument(sink)
        async with app.open(), app.lock("k"):
            pass
        recorder = next(s for s in sinks if isinstance(s, Recorder))
        ends = next((s for s in sinks if isinstance(s, Ends)), None)
        assert recorder.of("lock") == [(("k",), True, False)]   # its token came back
        assert ends is None or ends.tokens == [None]
