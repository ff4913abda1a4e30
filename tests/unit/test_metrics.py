"""Prometheus metrics (shoal.telemetry.metrics) read from the App's registry, one family at a
time, on the memory store with a VirtualClock: runs and attempts, steps, the instance's gauges,
outbox and pauses, locks and meters, providers and spend, store calls; the store's gauges from
exactly one of two replicas; the registry rules and the console's /metrics route."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import status_is, until
from prometheus_client import REGISTRY, CollectorRegistry
from starlette.testclient import TestClient

import shoal
import shoal.web
from shoal.backends.memory import MemoryStore
from shoal.telemetry.metrics import MAX_GROUPS, PrometheusMetrics
from shoal.testing import VirtualClock, cluster, settle

LEASE = 30.0


def value(app: shoal.App, name: str, **labels: str) -> float | None:
    assert app.metrics is not None
    return app.metrics.registry.get_sample_value(name, labels)


def count(app: shoal.App, name: str, **labels: str) -> float:
    return value(app, name, **labels) or 0.0


async def advance_until(clock: VirtualClock, check: Any, limit: float = 120.0,
                        step: float = 1.0) -> None:
    waited = 0.0
    while not check():
        assert waited < limit, "never reached"
        await clock.advance(step)
        waited += step


async def test_runs_attempts_and_steps_are_counted_by_workflow_and_outcome() -> None:
    clock, store = VirtualClock(), MemoryStore()
    app = shoal.App("m", store=store, clock=clock, lease=LEASE, metrics=True)
    flaky = {"b": 1}

    def sometimes() -> int:
        if flaky["b"]:
            flaky["b"] -= 1
            raise OSError("flaky")
        return 2

    @app.workflow(max_attempts=3, backoff=1.0)
    async def order(ctx: shoal.RunContext, input: Any) -> str:
        await ctx.step("a", lambda: 1)
        await ctx.step.with_options(retries=1)("b", sometimes)   # one in-place retry
        if ctx.attempt == 1:
            raise ValueError("once")                             # a retry
        await ctx.sleep(10)
        await ctx.wait_for("go")
        return "done"

    def boom() -> None:
        raise KeyError("missing")

    @app.workflow(max_attempts=1)
    async def broken(ctx: shoal.RunContext, input: Any) -> None:
        await ctx.step("boom", boom)

    async with app.open():              # dispatched while no worker runs: both wait 7 s
        first = await app.dispatch(order)
        await app.dispatch(order, idempotency_key="k")
        await app.dispatch(order, idempotency_key="k")          # the same run: not counted
        await app.dispatch(broken)
    await clock.advance(7)
    async with app:
        await advance_until(clock, lambda: count(app, "shoal_runs_parked_total",
                                                 workflow="order", kind="sleep") == 2,
                            step=0.25)
        await clock.advance(10)
        await advance_until(clock, lambda: count(app, "shoal_runs_parked_total",
                                                 workflow="order", kind="signal") == 2)
        for run in await app.list_runs(workflow="order"):
            await app.signal(run.id, "go")
        await until(status_is(app, first.id, "succeeded"))
        await until(lambda: _async(count(app, "shoal_runs_finished_total", workflow="order",
                                         status="succeeded") == 2))
    assert count(app, "shoal_runs_dispatched_total", workflow="order") == 2
    assert count(app, "shoal_runs_dispatched_total", workflow="broken") == 1
    # each claim: first, after the retry's backoff, after the sleep, after the signal
    assert count(app, "shoal_runs_claimed_total", workflow="order") == 8
    assert count(app, "shoal_runs_claimed_total", workflow="broken") == 1
    for outcome in ("retry", "sleeping", "waiting", "succeeded"):
        assert count(app, "shoal_attempts_total", workflow="order", outcome=outcome) == 2
    assert count(app, "shoal_attempts_total", workflow="broken", outcome="failed") == 1
    assert count(app, "shoal_runs_finished_total", workflow="broken", status="failed") == 1
    assert count(app, "shoal_attempt_duration_seconds_count", workflow="order") == 8
    # only the first claim measures the start latency: 7 s of the app's clock, each run
    assert count(app, "shoal_run_start_latency_seconds_count", workflow="order") == 2
    assert count(app, "shoal_run_start_latency_seconds_sum", workflow="order") == 14.0
    assert count(app, "shoal_run_start_latency_seconds_bucket", workflow="order",
                 le="5.0") == 0
    assert count(app, "shoal_run_start_latency_seconds_bucket", workflow="order",
                 le="10.0") == 2
    # steps executed (not replayed): a and b in each run's first attempt, then b once more
    # in the first run only (its in-place retry is inside the step); broken's boom
    assert count(app, "shoal_step_duration_seconds_count", workflow="order") == 4
    assert count(app, "shoal_step_retries_total", workflow="order") == 1
    assert count(app, "shoal_step_errors_total", workflow="broken") == 1
    assert count(app, "shoal_step_errors_total", workflow="order") == 0


async def _async(result: bool) -> bool:
    return result


async def test_recovery_counts_the_runs_it_took_back_and_those_it_failed() -> None:
    clock, store = VirtualClock(), MemoryStore()
    app = shoal.App("m", store=store, clock=clock, lease=LEASE, metrics=True)

    @app.workflow(max_attempts=1)
    async def job(ctx: shoal.RunContext, input: Any) -> None:
        return None

    async with app.open():
        await app.dispatch(job)
        await store.claim_runs("m", ["job"], "dead", 1, LEASE, clock.now())
    await clock.advance(LEASE + 1)
    async with app:
        await advance_until(clock, lambda: count(app, "shoal_runs_recovered_total",
                                                 workflow="job") == 1)
    assert count(app, "shoal_runs_finished_total", workflow="job", status="failed") == 1


async def test_the_instance_gauges_are_read_from_the_engine_at_each_scrape() -> None:
    clock = VirtualClock()
    app = shoal.App("m", store=MemoryStore(), clock=clock, lease=LEASE, max_concurrent_runs=3,
                    metrics=True)
    gate = asyncio.Event()

    @app.workflow
    async def held(ctx: shoal.RunContext, input: Any) -> None:
        await gate.wait()

    assert value(app, "shoal_runs_executing") is None      # not started: nothing to read
    async with app:
        runs = [await app.dispatch(held) for _ in range(2)]
        for run in runs:
            await until(status_is(app, run.id, "running"))
        assert value(app, "shoal_runs_executing") == 2
        assert value(app, "shoal_run_slots_free") == 1
        assert value(app, "shoal_run_slots") == 3
        assert value(app, "shoal_membership_assigned") == 0   # too early to own a slot
        await advance_until(clock, lambda: value(app, "shoal_membership_assigned") == 1)
        assert value(app, "shoal_membership_members") == 1
        gate.set()
        for run in runs:
            await until(status_is(app, run.id, "succeeded"))
        await until(lambda: _async(value(app, "shoal_runs_executing") == 0))
        assert value(app, "shoal_run_slots_free") == 3
    assert value(app, "shoal_runs_executing") is None      # closed: nothing to read


async def test_progress_reported_by_the_runs_executing_here_is_a_gauge_by_workflow() -> None:
    clock = VirtualClock()
    app = shoal.App("m", store=MemoryStore(), clock=clock, lease=LEASE, metrics=True)
    gate = asyncio.Event()

    @app.workflow
    async def report(ctx: shoal.RunContext, fraction: float | None) -> None:
        ctx.progress(fraction, "working")
        await gate.wait()

    async with app:
        runs = [await app.dispatch(report, f) for f in (0.2, 0.6, None)]
        for run in runs:
            await until(status_is(app, run.id, "running"))
        await settle()
        # two report a fraction (the third only a message): counted, and their mean
        assert value(app, "shoal_runs_reporting_progress", workflow="report") == 2
        assert value(app, "shoal_run_progress_ratio", workflow="report") == pytest.approx(0.4)
        gate.set()
        for run in runs:
            await until(status_is(app, run.id, "succeeded"))
        await settle()
        assert value(app, "shoal_runs_reporting_progress", workflow="report") is None


async def test_outbox_deliveries_and_pause_notifications_are_counted() -> None:
    clock = VirtualClock()
    app = shoal.App("m", store=MemoryStore(), clock=clock, lease=LEASE, metrics=True)
    mail_down = {"left": 1}

    @app.outbox_handler("email")
    async def email(payload: Any, key: str) -> None:
        return None

    @app.outbox_handler("sms", max_deliveries=2)
    async def sms(payload: Any, key: str) -> None:
        raise ConnectionError("no route")

    @app.on_pause_notify
    async def announce(pause: shoal.Pause) -> None:
        if mail_down["left"]:
            mail_down["left"] -= 1
            raise ConnectionError("mail server down")

    @app.workflow
    async def notify(ctx: shoal.RunContext, input: Any) -> bool:
        def send() -> None:
            ctx.outbox.send("email", {})
            ctx.outbox.send("sms", {})
        await ctx.step("send", send)
        return (await ctx.approval("go", {})).approved

    async with app:
        run = await app.dispatch(notify)
        await until(status_is(app, run.id, "waiting"))
        await advance_until(clock, lambda: count(app, "shoal_outbox_deliveries_total",
                                                 topic="sms", result="dead") == 1)
        await advance_until(clock, lambda: count(app, "shoal_pause_notifications_total",
                                                 result="sent") == 1)
    assert count(app, "shoal_outbox_deliveries_total", topic="email", result="delivered") == 1
    assert count(app, "shoal_outbox_deliveries_total", topic="sms", result="retry") == 1
    assert count(app, "shoal_outbox_delivery_duration_seconds_count", topic="sms") == 2
    assert count(app, "shoal_pause_notifications_total", result="failed") == 1


async def test_locks_and_meters_are_counted_by_the_group_of_their_first_key() -> None:
    clock = VirtualClock()
    app = shoal.App("m", store=MemoryStore(), clock=clock, lease=LEASE, metrics=True)
    async with app:
        first = app.lock("orders:7")
        await first.__aenter__()
        second = asyncio.ensure_future(app.locked(["orders:7", "stock:1"], lambda s: None))
        await settle()
        await clock.advance(4)
        await first.__aexit__(None, None, None)
        await second
        waiter = asyncio.ensure_future(app.locked("orders:9", lambda s: None))
        async with app.lock("orders:9"):
            pass
        await waiter
        async with app.lock("orders:10") as held:
            # lost while held: the store forgets it and the renewal is refused
            await app._coord().lock_release("m", ["orders:10"], held.holder)
            await clock.advance(LEASE)
        for i in range(MAX_GROUPS + 5):
            await app.meter([f"tenant-{i}:calls"], [1])
    assert count(app, "shoal_lock_wait_seconds_count", group="orders") == 5
    assert count(app, "shoal_lock_handoffs_total", group="orders") >= 1
    assert count(app, "shoal_lock_hold_seconds_count", group="orders") == 5
    # the first lock was held 4 s of the app's clock; the lost one a lease
    assert count(app, "shoal_lock_hold_seconds_sum", group="orders") == 4.0 + LEASE
    assert count(app, "shoal_locks_lost_total", group="orders") == 1
    assert count(app, "shoal_lock_wait_failures_total", group="orders") == 0
    # a hundred groups, then the rest together
    assert count(app, "shoal_meter_calls_total", group="tenant-0") == 1
    assert count(app, "shoal_meter_calls_total", group="other") == 5


async def test_providers_spend_and_store_calls_are_counted() -> None:
    clock = VirtualClock()
    app = shoal.App("m", store=MemoryStore(), clock=clock, lease=LEASE, metrics=True)
    llm = app.provider("llm", price_per_token=0.01,
                       breaker=shoal.Breaker(failures=1, window=60, cooldown=30))
    async with app.open():
        async with llm.call(tokens=10, tenant="acme"):
            pass
        async with llm.call(tenant="acme") as call:
            call.rate_limited(retry_after=1)
        await clock.advance(2)
        with pytest.raises(OSError):
            async with llm.call(tenant="globex"):
                raise OSError("500")
        with pytest.raises(shoal.CircuitOpenError):
            async with llm.call():
                pass
        await app.spend(2.5, tenant="globex", currency="eur")
        with pytest.raises(shoal.UnknownRunError):
            await app.get_run("nope")
    for result, n in (("succeeded", 1), ("rate_limited", 1), ("failed", 1),
                      ("circuit_open", 1)):
        assert count(app, "shoal_provider_calls_total", provider="llm", result=result) == n
    assert count(app, "shoal_provider_call_duration_seconds_count", provider="llm") == 3
    assert count(app, "shoal_provider_pauses_total", provider="llm") == 1
    assert count(app, "shoal_spend_total", tenant="acme", currency="usd") == pytest.approx(0.1)
    assert count(app, "shoal_spend_total", tenant="globex", currency="eur") == 2.5
    assert count(app, "shoal_store_call_duration_seconds_count", operation="get_run") == 1
    assert count(app, "shoal_store_call_duration_seconds_count", operation="admit") == 4
    assert count(app, "shoal_store_call_errors_total", operation="get_run") == 0


async def test_store_call_errors_are_counted_by_operation() -> None:
    class Refusing(MemoryStore):
        async def get_run(self, run_id: str) -> Any:
            raise ConnectionError("refused")

    app = shoal.App("m", store=Refusing(), clock=VirtualClock(), metrics=True)
    async with app.open():
        for _ in range(2):
            with pytest.raises(ConnectionError):
                await app.get_run("r1")
    assert count(app, "shoal_store_call_errors_total", operation="get_run") == 2


def sampled(store: Any, clock: Any, instance_id: str) -> shoal.App:
    app = shoal.App("m", store=store, clock=clock, instance_id=instance_id, lease=LEASE,
                    membership_interval=2.0, metrics=PrometheusMetrics(stats_interval=5.0))

    @app.workflow
    async def refund(ctx: shoal.RunContext, input: Any) -> bool:
        return (await ctx.approval("refund", {})).approved

    app.provider("llm", breaker=shoal.Breaker(failures=1, window=60, cooldown=30))
    return app


async def test_the_store_gauges_come_from_exactly_one_of_two_replicas() -> None:
    clock = VirtualClock()
    async with cluster(sampled, instances=2, clock=clock) as apps:
        a = apps[0]
        await a.dispatch("refund", tenant="acme", delay=3600)
        await a.dispatch("refund", tenant="acme", delay=3600)
        await a.dispatch("refund", tenant="globex", delay=3600)
        waiting = await a.dispatch("refund", tenant="acme")
        await until(status_is(a, waiting.id, "waiting"))
        with pytest.raises(OSError):
            async with a.providers["llm"].call():
                raise OSError("500")                 # the breaker opens for every replica

        def samplers() -> list[float]:
            return [value(app, "shoal_stats_sampler") or 0.0 for app in apps]

        await advance_until(clock, lambda: sorted(samplers()) == [0.0, 1.0])
        holder, other = (apps[0], apps[1]) if samplers()[0] else (apps[1], apps[0])
        await advance_until(clock, lambda: value(holder, "shoal_pending_approvals") == 1)
        assert value(holder, "shoal_queued_runs", tenant="acme", state="delayed") == 2
        assert value(holder, "shoal_queued_runs", tenant="globex", state="delayed") == 1
        assert value(holder, "shoal_runs", workflow="refund", status="queued") == 3
        assert value(holder, "shoal_runs", workflow="refund", status="waiting") == 1
        assert value(holder, "shoal_outbox_backlog") == 0
        assert value(holder, "shoal_provider_breaker_state", provider="llm",
                     state="open") == 1
        assert value(holder, "shoal_provider_breaker_state", provider="llm",
                     state="closed") == 0
        assert value(holder, "shoal_provider_paused", provider="llm") == 0
        # the other replica exports none of them: a sum over replicas counts each run once
        for name in ("shoal_pending_approvals", "shoal_outbox_backlog",
                     "shoal_outbox_dead_letters"):
            assert value(other, name) is None
        assert value(other, "shoal_queued_runs", tenant="acme", state="delayed") is None
        assert value(other, "shoal_runs", workflow="refund", status="queued") is None
        # the holder stops: the other takes the sampling over
        await holder.close()
        await advance_until(clock, lambda: value(other, "shoal_pending_approvals") == 1)
        assert value(other, "shoal_stats_sampler") == 1


async def test_a_sampler_that_cannot_read_the_store_exports_no_stale_gauges() -> None:
    class Flaky(MemoryStore):
        down = False

        async def stats(self, namespace: str, now: float) -> Any:
            if self.down:
                raise ConnectionError("store down")
            return await super().stats(namespace, now)

    clock, store = VirtualClock(), Flaky()
    errors: list[BaseException] = []
    app = sampled(store, clock, "solo")
    app.on_error(errors.append)
    async with app:
        await advance_until(clock, lambda: value(app, "shoal_pending_approvals") == 0)
        store.down = True
        await advance_until(clock, lambda: value(app, "shoal_pending_approvals") is None)
        assert count(app, "shoal_stats_sample_failures_total") >= 1
        assert any("store down" in str(e) for e in errors)
        store.down = False
        await advance_until(clock, lambda: value(app, "shoal_pending_approvals") == 0)


def test_each_app_has_its_own_registry_and_one_registry_serves_one_app() -> None:
    a = shoal.App("a", store="memory://", metrics=True)
    b = shoal.App("b", store="memory://", metrics=True)
    assert a.metrics is not None and b.metrics is not None
    assert a.metrics.registry is not b.metrics.registry
    assert shoal.App("c", store="memory://").metrics is None
    shared = CollectorRegistry()
    shoal.App("d", store="memory://", metrics=shared)
    with pytest.raises(shoal.ConfigurationError, match="one registry serves one App"):
        shoal.App("e", store="memory://", metrics=shared)
    with pytest.raises(TypeError, match=r"App\(metrics=\.\.\.\) takes True"):
        shoal.App("f", store="memory://", metrics="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stats_interval"):
        PrometheusMetrics(stats_interval=0)
    assert REGISTRY.get_sample_value("shoal_runs_executing") is None   # never the global one


async def test_the_console_serves_the_apps_metrics_behind_its_token() -> None:
    app = shoal.App("m", store=MemoryStore(), clock=VirtualClock(), metrics=True)

    @app.workflow
    async def job(ctx: shoal.RunContext, input: Any) -> None:
        return None

    async with app:
        run = await app.dispatch(job)
        await until(status_is(app, run.id, "succeeded"))
        web = shoal.web.asgi(app, token="s3cret")
        plain = shoal.web.asgi(shoal.App("n", store=MemoryStore()))

        def scrape() -> tuple[Any, Any, Any]:
            with TestClient(web) as client, TestClient(plain) as other:
                return (client.get("/metrics"),
                        client.get("/metrics", headers={"Authorization": "Bearer s3cret"}),
                        other.get("/metrics"))

        refused, scraped, absent = await asyncio.to_thread(scrape)
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain; version=")
    assert 'shoal_runs_finished_total{status="succeeded",workflow="job"} 1.0' in scraped.text
    assert absent.status_code == 404 and "App(metrics=True)" in absent.json()["error"]


async def test_dispatch_in_the_callers_transaction_goes_through_the_timed_store(
        tmp_path: Any) -> None:
    import sqlite3

    db = tmp_path / "shop.db"
    app = shoal.App("m", store=f"sqlite:///{db}", metrics=True)

    @app.workflow
    async def ship(ctx: shoal.RunContext, order: int) -> str:
        return f"shipped {order}"

    async with app:
        conn = sqlite3.connect(db)
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER)")
            conn.commit()
            conn.execute("INSERT INTO orders (id) VALUES (1)")
            run = await app.dispatch(ship, 1, connection=conn)
            conn.commit()
        finally:
            conn.close()
        assert await app.result(run.id, timeout=10) == "shipped 1"
    assert count(app, "shoal_store_call_duration_seconds_count", operation="create_run_in") == 1
    assert count(app, "shoal_runs_dispatched_total", workflow="ship") == 1
