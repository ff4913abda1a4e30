"""OpenTelemetry traces (``App(tracing=...)``, ``shoal.telemetry.tracing``), exported by the SDK
to memory: the span active at dispatch is the parent of a run's attempts, wherever they run;
steps nest under their attempt and the application's own spans under its step (in a thread too);
parks are events; failures, lost leases and a crashed owner's second attempt are told on the
spans; child runs and outbox entries continue their step's trace; cron ticks and runs dispatched
outside any span start traces of their own. The hooks the maintenance services, locks and
providers call are tested by calling them. Two-instance tests run on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import shoal
from shoal.errors import ConfigurationError
from shoal.telemetry.tracing import Tracing
from shoal.testing import VirtualClock, settle
from shoal.types import OutboxEntry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from backends import postgres_schema

LEASE = 30.0
T0 = 1_767_225_600.0


class Spans:
    """A tracer provider of the test's own (never the global one), exporting to memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def all(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.all() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        [span] = self.named(name)
        return span


@pytest.fixture
def spans() -> Iterator[Spans]:
    s = Spans()
    yield s
    s.provider.shutdown()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shoal.db'}"
    else:
        with postgres_schema("shoal_trace_") as url:
            yield url


def _parent(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def _id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def _trace(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.trace_id)


def _attr(span: ReadableSpan, name: str) -> Any:
    return (span.attributes or {})[name]


def _events(span: ReadableSpan, name: str) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == name]


async def _until_final(app: shoal.App, run_id: str, rounds: int = 500) -> shoal.Run:
    """Poll ``app`` (a scheduling pass each time, as its poll loop would) until the run is
    final; the store may be a server, so each round also yields to real I/O briefly."""
    for _ in range(rounds):
        run = await app.get_run(run_id)
        if run.status.final:
            return run
        await app.poll()
        await settle()
        await asyncio.sleep(0.005)
    raise AssertionError(f"run {run_id} is {(await app.get_run(run_id)).status}")


def _flow_app(url: str, clock: VirtualClock, instance: str, spans: Spans) -> shoal.App:
    """An app whose workflow ``flow`` runs an async step and a thread step, each opening a
    span of the application's own, then sends an outbox entry."""
    app = shoal.App("traced", store=url, clock=clock, lease=LEASE, instance_id=instance,
                    tracing=spans.provider)
    own = spans.provider.get_tracer("user")

    async def fetch() -> int:
        with own.start_as_current_span("user.fetch"):
            return 1

    def compute() -> str:
        with own.start_as_current_span("user.compute"):
            return threading.current_thread().name

    @app.workflow(name="flow")
    async def flow(ctx: shoal.RunContext, input: Any) -> Any:
        a = await ctx.step("fetch", fetch)
        b = await ctx.step("compute", compute)
        await ctx.step("notify", lambda: ctx.outbox.send("mail", {"to": "a@b"}))
        return [a, b]

    @app.outbox_handler("mail")
    async def mail(payload: Any, key: str) -> None:
        pass

    return app


# -- a run dispatched under a span, executed by another instance ------------------------------


async def test_a_run_continues_the_trace_it_was_dispatched_in(store_url: str,
                                                              spans: Spans) -> None:
    clock = VirtualClock()
    front = _flow_app(store_url, clock, "front", spans)
    back = _flow_app(store_url, clock, "back", spans)
    async with back, front.open():
        with spans.tracer.start_as_current_span("request") as request:
            run = await front.dispatch("flow", {"n": 1})
        stored = await back.get_run(run.id)
        carrier = json.loads(stored.trace_context or "{}")
        ctx = request.get_span_context()
        assert carrier["traceparent"] == (f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-"
                                          f"{ctx.trace_flags:02x}")
        done = await _until_final(back, run.id)
        assert done.status == shoal.RunStatus.SUCCEEDED and done.output[0] == 1
        record = await back.store.inspect_run(run.id)
        assert record is not None
        [entry] = record.outbox
    attempt = spans.one("shoal.run flow")
    assert _trace(attempt) == ctx.trace_id and _parent(attempt) == ctx.span_id
    assert attempt.kind == SpanKind.CONSUMER
    assert dict(attempt.attributes or {}) == {
        "shoal.run_id": run.id, "shoal.workflow": "flow", "shoal.attempt": 1,
        "shoal.lease_epoch": 1, "shoal.tenant": "default", "shoal.instance": "back",
        "shoal.resume_reason": "dispatched",
        "shoal.outcome": "succeeded"}
    assert attempt.status.status_code == StatusCode.UNSET
    steps = {s.name: s for s in spans.all() if s.name.startswith("shoal.step ")}
    assert list(steps) == ["shoal.step fetch", "shoal.step compute", "shoal.step notify"]
    for i, step in enumerate(steps.values(), start=1):
        assert _parent(step) == _id(attempt) and _trace(step) == ctx.trace_id
        assert step.attributes is not None and step.attributes["shoal.step_seq"] == i
        assert step.attributes["shoal.outcome"] == "succeeded"
    # the outbox entry keeps the context of the step that sent it
    assert entry.trace_context is not None
    assert json.loads(entry.trace_context)["traceparent"].split("-")[1:3] == [
        f"{ctx.trace_id:032x}", f"{_id(steps['shoal.step notify']):016x}"]
    # the application's spans nest under the step running them, in the step's thread too
    assert _parent(spans.one("user.fetch")) == _id(steps["shoal.step fetch"])
    assert _parent(spans.one("user.compute")) == _id(steps["shoal.step compute"])
    assert done.output[1] != threading.current_thread().name
    # nothing of the run is left current once it ended
    assert not trace.get_current_span().get_span_context().is_valid


async def test_dispatch_many_and_a_transactional_dispatch_carry_the_span(
        tmp_path: Path, spans: Spans) -> None:
    path = tmp_path / "shoal.db"
    app = _flow_app(f"sqlite:///{path}", VirtualClock(), "one", spans)
    async with app.open():
        with spans.tracer.start_as_current_span("batch") as batch:
            runs = await app.dispatch_many("flow", [1, 2, shoal.DispatchItem(3)])
        conn = sqlite3.connect(path)
        try:
            with spans.tracer.start_as_current_span("joined") as joined:
                mine = await app.dispatch("flow", 4, connection=conn)
                many = await app.dispatch_many("flow", [5, 6], connection=conn)
            conn.commit()
        finally:
            conn.close()
        outside = await app.dispatch("flow", 7)
        stored = {r.id: (await app.get_run(r.id)).trace_context for r in
                  [*runs, mine, *many, outside]}
    def parent_of(run: shoal.Run) -> str:
        text = stored[run.id]
        assert text is not None
        return str(json.loads(text)["traceparent"]).split("-")[2]
    assert {parent_of(r) for r in runs} == {f"{batch.get_span_context().span_id:016x}"}
    assert {parent_of(r) for r in [mine, *many]} == {f"{joined.get_span_context().span_id:016x}"}
    assert stored[outside.id] is None   # no span active: nothing to continue


# -- steps, parks, failures ------------------------------------------------------------------


async def test_parks_are_events_and_every_attempt_continues_the_dispatch_trace(
        spans: Spans) -> None:
    clock = VirtualClock(T0)
    app = shoal.App("parks", store="memory://", clock=clock, lease=LEASE, instance_id="i",
                    tracing=spans.provider)

    @app.workflow
    async def waits(ctx: shoal.RunContext, input: Any) -> str:
        await ctx.step("before", lambda: 1)
        await ctx.sleep(60)
        await ctx.wait_for("go")
        return "done"

    async with app:
        with spans.tracer.start_as_current_span("request") as request:
            run = await app.dispatch(waits)
        await _until(app, run.id, "sleeping")
        await clock.advance(61)
        await _until(app, run.id, "waiting")
        await app.signal(run.id, "go", 1)
        assert (await _until_final(app, run.id)).status == shoal.RunStatus.SUCCEEDED
    attempts = spans.named("shoal.run waits")
    assert [_attr(a, "shoal.outcome") for a in attempts] == ["sleeping", "waiting", "succeeded"]
    assert [_attr(a, "shoal.lease_epoch") for a in attempts] == [1, 2, 3]
    assert [_attr(a, "shoal.resume_reason") for a in attempts] == ["dispatched", "woke", "resumed"]
    rid = request.get_span_context().span_id
    assert all(_parent(a) == rid for a in attempts)
    assert _events(attempts[0], "shoal.parked") == [{"shoal.park": "sleep",
                                                     "shoal.until": T0 + 60}]
    assert _events(attempts[1], "shoal.parked") == [{"shoal.park": "signal",
                                                     "shoal.wait_for": "go"}]
    assert all(a.status.status_code == StatusCode.UNSET for a in attempts)
    # replayed steps are not spans again: one "before", in the first attempt
    assert [_parent(s) for s in spans.named("shoal.step before")] == [_id(attempts[0])]


async def _until(app: shoal.App, run_id: str, status: str) -> None:
    for _ in range(300):
        if (await app.get_run(run_id)).status == status:
            return
        await settle()
    raise AssertionError(f"run {run_id} never became {status}")


async def test_failed_steps_and_attempts_record_their_exception(spans: Spans) -> None:
    clock = VirtualClock()
    app = shoal.App("fails", store="memory://", clock=clock, lease=LEASE,
                    tracing=spans.provider)

    def broken() -> None:
        raise KeyError("missing")

    flaky = {"left": 1}

    def once() -> int:
        if flaky["left"]:
            flaky["left"] -= 1
            raise OSError("flaky")
        return 1

    @app.workflow(max_attempts=2, backoff=1.0)
    async def fails(ctx: shoal.RunContext, input: Any) -> None:
        await ctx.step.with_options(retries=1)("flaky", once)
        await ctx.step("broken", broken)

    async with app:
        with spans.tracer.start_as_current_span("request"):
            run = await app.dispatch(fails)
        for _ in range(100):
            if (await app.get_run(run.id)).status.final:
                break
            await clock.advance(0.5)
        assert (await app.get_run(run.id)).status == shoal.RunStatus.FAILED
    steps = spans.named("shoal.step broken")
    attempts = spans.named("shoal.run fails")
    assert [_attr(a, "shoal.outcome") for a in attempts] == ["retry", "failed"]
    for span in [*steps, *attempts]:
        assert span.status.status_code == StatusCode.ERROR
        assert span.status.description == "KeyError: 'missing'"
        [exception] = _events(span, "exception")
        assert exception["exception.type"] == "KeyError"
        assert "broken" in str(exception["exception.stacktrace"])
    assert [_parent(s) for s in steps] == [_id(a) for a in attempts]
    # a step retried in place is one span, which tells how many retries it took
    flaky_span = spans.one("shoal.step flaky")
    assert dict(flaky_span.attributes or {}) == {
        "shoal.run_id": run.id, "shoal.step": "flaky", "shoal.step_seq": 1, "shoal.retries": 1,
        "shoal.outcome": "succeeded"}
    assert flaky_span.status.status_code == StatusCode.UNSET
    assert [_attr(s, "shoal.outcome") for s in steps] == ["failed", "failed"]


# -- a crashed owner: the second attempt is in the same trace --------------------------------


async def test_a_lost_attempt_and_the_recovering_one_share_the_trace(
        store_url: str, spans: Spans) -> None:
    """Instance a stands still (its clock frozen, its step blocked) past its lease: b recovers
    the run and finishes it; a's attempt then ends ``lost``, in the same trace."""
    clock, frozen = VirtualClock(), VirtualClock()
    release = asyncio.Event()

    def make(c: VirtualClock, name: str) -> shoal.App:
        app = shoal.App("crash", store=store_url, clock=c, lease=LEASE, instance_id=name,
                        tracing=spans.provider)

        @app.workflow(name="wf", max_attempts=3)
        async def wf(ctx: shoal.RunContext, input: Any) -> str:
            async def slow() -> str:
                if name == "a":
                    await release.wait()
                return name
            await ctx.step("one", lambda: 1)
            return str(await ctx.step("slow", slow))

        return app

    a, b = make(frozen, "a"), make(clock, "b")
    async with a:
        with spans.tracer.start_as_current_span("request") as request:
            run = await a.dispatch("wf")
        for _ in range(200):
            await settle()
            await asyncio.sleep(0.005)
            if spans.named("shoal.step one"):
                break
        async with b:
            await clock.advance(LEASE + 1)
            done = await _until_final(b, run.id)
            assert done.output == "b" and done.attempts == 2
            release.set()
            for _ in range(200):
                await settle()
                await asyncio.sleep(0.005)
                if len(spans.named("shoal.run wf")) == 2:
                    break
    ctx = request.get_span_context()
    first, second = sorted(spans.named("shoal.run wf"),
                           key=lambda s: int(_attr(s, "shoal.lease_epoch")))
    for span in (first, second):
        assert _trace(span) == ctx.trace_id and _parent(span) == ctx.span_id
    assert first.attributes is not None and second.attributes is not None
    assert (first.attributes["shoal.instance"], first.attributes["shoal.outcome"]) == ("a", "lost")
    assert first.status.status_code == StatusCode.ERROR
    assert (second.attributes["shoal.instance"], second.attributes["shoal.attempt"],
            second.attributes["shoal.lease_epoch"], second.attributes["shoal.resume_reason"],
            second.attributes["shoal.outcome"]) == ("b", 2, 2, "recovered", "succeeded")
    # b replays "one" from its checkpoint and runs "slow" again, under its own attempt
    assert [_parent(s) for s in spans.named("shoal.step one")] == [_id(first)]
    assert sorted(_parent(s) or 0 for s in spans.named("shoal.step slow")) == sorted(
        [_id(first), _id(second)])


# -- children and the outbox continue their step's trace -------------------------------------


async def test_child_runs_and_outbox_entries_continue_the_step_that_made_them(
        spans: Spans) -> None:
    clock = VirtualClock()
    app = shoal.App("tree", store="memory://", clock=clock, lease=LEASE, instance_id="i",
                    tracing=spans.provider)
    sink = app.tracing
    assert isinstance(sink, Tracing)

    @app.workflow
    async def child(ctx: shoal.RunContext, input: Any) -> int:
        return int(input) * 2

    @app.workflow
    async def parent(ctx: shoal.RunContext, input: Any) -> int:
        kid = await ctx.start_child(child, 21)
        value = await kid.result()
        await ctx.step("send", lambda: ctx.outbox.send("mail", {"v": value}))
        return int(value)

    async with app:
        with spans.tracer.start_as_current_span("request") as request:
            run = await app.dispatch(parent)
        assert (await _until_final(app, run.id)).output == 42
        record = await app.store.inspect_run(run.id)
        assert record is not None
        [entry] = record.outbox
    start = spans.one("shoal.step shoal.start_child:child")
    kid_attempt = spans.one("shoal.run child")
    tid = request.get_span_context().trace_id
    assert _trace(kid_attempt) == tid and _parent(kid_attempt) == _id(start)
    assert kid_attempt.attributes is not None
    assert kid_attempt.attributes["shoal.parent_run_id"] == run.id
    first, second = spans.named("shoal.run parent")
    assert _parent(start) == _id(first)
    assert _events(first, "shoal.parked") == [{"shoal.park": "child",
                                               "shoal.wait_for": kid_attempt.attributes[
                                                   "shoal.run_id"]}]
    send = spans.one("shoal.step send")
    assert _parent(send) == _id(second)
    # the entry keeps its step's context; a delivery (the hook the outbox service calls)
    # continues it, and the handler's own spans nest under the delivery
    assert entry.trace_context is not None
    assert f"{_id(send):016x}" in entry.trace_context
    token = sink.delivery_started(entry)
    with spans.tracer.start_as_current_span("handler"):
        pass
    sink.delivery_ended(token, entry, "delivered", None)
    delivery = spans.one("shoal.deliver mail")
    assert delivery.kind == SpanKind.CONSUMER
    assert _trace(delivery) == tid and _parent(delivery) == _id(send)
    assert _parent(spans.one("handler")) == _id(delivery)
    assert dict(delivery.attributes or {}) == {
        "shoal.run_id": run.id, "shoal.topic": "mail", "shoal.outbox_key": entry.key,
        "shoal.delivery": 1, "shoal.outcome": "delivered"}


# -- traces of their own: cron ticks, runs dispatched outside a span, link mode --------------


async def test_cron_runs_and_runs_dispatched_outside_a_span_start_their_own_trace(
        spans: Spans) -> None:
    clock = VirtualClock(T0 + 1)
    app = shoal.App("roots", store="memory://", clock=clock, lease=LEASE,
                    tracing=spans.provider)

    @app.cron("* * * * *", name="minutely")
    @app.workflow(name="tick")
    async def ticked(ctx: shoal.RunContext, input: Any) -> None:
        await ctx.step("s", lambda: None)

    @app.workflow
    async def plain(ctx: shoal.RunContext, input: Any) -> None:
        pass

    # the app's own tasks are started inside a span: none of its runs may inherit it
    with spans.tracer.start_as_current_span("boot"):
        await app.start()
    try:
        run = await app.dispatch(plain)
        assert run.trace_context is None
        await _until_final(app, run.id)
        for _ in range(20):
            if spans.named("shoal.run tick"):
                break
            await clock.advance(10)
    finally:
        await app.close(timeout=0)
    ticks = spans.named("shoal.run tick")
    assert ticks and all(s.parent is None for s in ticks)
    for s in [*ticks, spans.one("shoal.run plain")]:
        assert s.parent is None and _trace(s) != _trace(spans.one("boot"))
    [step] = spans.named("shoal.step s")[:1]
    assert _parent(step) == _id(ticks[0])


async def test_link_mode_starts_a_trace_per_attempt_linked_to_the_dispatch(
        spans: Spans) -> None:
    app = shoal.App("links", store="memory://", clock=VirtualClock(), lease=LEASE)
    app.instrument(Tracing(spans.provider, link=True))

    @app.workflow
    async def linked(ctx: shoal.RunContext, input: Any) -> None:
        pass

    async with app:
        with spans.tracer.start_as_current_span("request") as request:
            run = await app.dispatch(linked)
        await _until_final(app, run.id)
    attempt = spans.one("shoal.run linked")
    ctx = request.get_span_context()
    assert attempt.parent is None and _trace(attempt) != ctx.trace_id
    [link] = attempt.links
    assert (link.context.trace_id, link.context.span_id) == (ctx.trace_id, ctx.span_id)


async def test_a_carrier_that_is_not_one_starts_a_trace_and_the_run_goes_on(
        spans: Spans) -> None:
    sink = Tracing(spans.provider)
    run = shoal.Run(
        id="r", namespace="n", tenant="t", workflow="w", input=None, output=None, error=None,
        status=shoal.RunStatus.RUNNING, priority=0, created_at=0, run_at=None, attempts=1,
        max_attempts=3, concurrency_key=None, idempotency_key=None, owner="i",
        lease_expires_at=1, lease_epoch=1, cancel_requested=False, version=None,
        parent_id=None, root_id="r", wait_for=None, held=False, started_at=0,
        finished_at=None)
    for carrier in ("not json", "[1, 2]", '{"traceparent": "00-zz"}'):
        bad = _replace(run, trace_context=carrier)
        token = sink.attempt_started(bad, "i")
        sink.attempt_ended(token, bad, "succeeded", None)
    assert [s.parent for s in spans.named("shoal.run w")] == [None, None, None]


def _replace(run: shoal.Run, **changes: Any) -> shoal.Run:
    return dataclasses.replace(run, **changes)


# -- off unless asked, and bad options -------------------------------------------------------


async def test_tracing_is_off_unless_asked(spans: Spans) -> None:
    app = shoal.App("off", store="memory://", clock=VirtualClock())
    assert app.tracing is None

    @app.workflow
    async def quiet(ctx: shoal.RunContext, input: Any) -> None:
        pass

    async with app:
        with spans.tracer.start_as_current_span("request"):
            run = await app.dispatch(quiet)
        assert run.trace_context is None
        await _until_final(app, run.id)
    assert [s.name for s in spans.all()] == ["request"]


def test_bad_tracing_options_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match=r"App\(tracing\) must be True, False or an "
                                                 r"OpenTelemetry TracerProvider, not 'yes'"):
        shoal.App("bad", store="memory://", tracing="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TracerProvider, not str"):
        Tracing("provider")  # type: ignore[arg-type]
    # without the OpenTelemetry API installed: what to install
    monkeypatch.delitem(sys.modules, "shoal.telemetry.tracing")
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'shoal\[otel\]'"):
        shoal.App("bad", store="memory://", tracing=True)


# -- the hooks of the maintenance services, locks and providers, called directly -------------


def _entry(trace_context: str | None = None, attempts: int = 0) -> OutboxEntry:
    return OutboxEntry(id="o1", namespace="n", run_id="r1", seq=2, index=0, topic="mail",
                       payload=None, created_at=0.0, attempts=attempts,
                       trace_context=trace_context)


def test_a_failed_delivery_records_its_exception(spans: Spans) -> None:
    sink = Tracing(spans.provider)
    token = sink.delivery_started(_entry(attempts=9))
    sink.delivery_ended(token, _entry(attempts=9), "dead", ConnectionError("down"))
    token = sink.delivery_started(_entry())
    sink.delivery_ended(token, _entry(), "retry", None)
    dead, retry = spans.named("shoal.deliver mail")
    assert dead.parent is None   # an entry of a step that was not traced: a trace of its own
    assert dead.attributes is not None and dead.attributes["shoal.delivery"] == 10
    assert (dead.status.status_code, dead.status.description) == (
        StatusCode.ERROR, "ConnectionError: down")
    assert _events(dead, "exception")[0]["exception.type"] == "ConnectionError"
    assert (retry.status.status_code, retry.status.description) == (StatusCode.ERROR, "retry")
    assert not trace.get_current_span().get_span_context().is_valid


def test_lock_waits_and_provider_calls_are_spans_under_the_caller(spans: Spans) -> None:
    sink = Tracing(spans.provider)
    with spans.tracer.start_as_current_span("caller") as caller:
        waited = sink.lock_wait_started(("settlement",))
        sink.lock_wait_ended(waited, ("settlement",), True, True)
        timed_out = sink.lock_wait_started(("settlement",))
        sink.lock_wait_ended(timed_out, ("settlement",), False, False)
        call = sink.provider_call_started("openai", "acme")
        with spans.tracer.start_as_current_span("http"):   # the client's own span
            sink.spent("acme", 0.25, "USD")
        sink.provider_call_ended(call, "openai", "succeeded", None)
        call = sink.provider_call_started("openai", "default")
        sink.provider_paused("openai", 20.0)
        sink.provider_call_ended(call, "openai", "rate_limited", None)
        sink.runs_dispatched("flow", 3)
    cid = caller.get_span_context().span_id
    acquired, refused = spans.named("shoal.lock.wait")
    assert [_parent(acquired), _parent(refused)] == [cid, cid]
    assert acquired.attributes == {"shoal.lock": ("settlement",), "shoal.outcome": "acquired",
                                   "shoal.lock.queued": True}
    assert refused.attributes == {"shoal.lock": ("settlement",),
                                  "shoal.outcome": "not_acquired", "shoal.lock.queued": False}
    assert refused.status.status_code == StatusCode.ERROR
    ok, limited = spans.named("shoal.provider openai")
    assert [_parent(ok), _parent(limited)] == [cid, cid]
    assert ok.attributes == {"shoal.provider": "openai", "shoal.tenant": "acme",
                             "shoal.outcome": "succeeded"}
    assert ok.status.status_code == StatusCode.UNSET
    http = spans.one("http")
    assert _parent(http) == _id(ok)
    assert _events(http, "shoal.spent") == [{"shoal.tenant": "acme", "shoal.amount": 0.25,
                                            "shoal.currency": "USD"}]
    assert (limited.status.status_code, limited.status.description) == (
        StatusCode.ERROR, "rate_limited")
    assert _events(limited, "shoal.provider.paused") == [{"shoal.provider": "openai",
                                                         "shoal.seconds": 20.0}]
    done = spans.one("caller")
    assert _events(done, "shoal.dispatched") == [{"shoal.workflow": "flow", "shoal.runs": 3}]


def test_a_recovered_run_is_marked_in_its_trace(spans: Spans) -> None:
    sink = Tracing(spans.provider)
    with spans.tracer.start_as_current_span("request") as request:
        carrier = sink.trace_carrier()
    assert carrier is not None
    run = shoal.Run(
        id="r", namespace="n", tenant="t", workflow="w", input=None, output=None,
        error="the run's owner stopped renewing its lease 3 times", status=shoal.RunStatus.FAILED,
        priority=0, created_at=0, run_at=None, attempts=3, max_attempts=3,
        concurrency_key=None, idempotency_key=None, owner=None, lease_expires_at=None,
        lease_epoch=3, cancel_requested=False, version=None, parent_id=None, root_id="r",
        wait_for=None, held=False, started_at=0, finished_at=1, trace_context=carrier)
    sink.run_recovered(run)
    sink.run_recovered(_replace(run, status=shoal.RunStatus.QUEUED, error=None, attempts=1))
    failed, requeued = spans.named("shoal.recovered w")
    for span in (failed, requeued):
        assert _parent(span) == request.get_span_context().span_id
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["shoal.outcome"] == "failed"
    assert requeued.status.status_code == StatusCode.UNSET


def test_combined_with_other_sinks_the_carrier_is_the_tracing_one(spans: Spans) -> None:
    from shoal.telemetry import Telemetry, combine

    both = combine([Telemetry(), Tracing(spans.provider)])
    assert both.trace_carrier() is None   # no span active
    with spans.tracer.start_as_current_span("request") as request:
        carrier = both.trace_carrier()
    assert carrier is not None
    assert json.loads(carrier)["traceparent"].split("-")[1] == \
        f"{request.get_span_context().trace_id:032x}"


async def test_the_real_outbox_provider_and_lock_paths_make_spans_in_the_runs_trace(
        spans: Spans) -> None:
    """With the hooks placed where they happen (not called by hand): the outbox service's
    delivery continues the step that sent the entry; a provider call and a lock wait made
    inside a step nest under it; all in the trace of the request that dispatched the run."""
    clock = VirtualClock()
    app = shoal.App("real", store="memory://", clock=clock, lease=LEASE, instance_id="i",
                    tracing=spans.provider)
    llm = app.provider("llm", max_concurrent=2)
    delivered: list[Any] = []

    @app.outbox_handler("mail")
    async def mail(payload: Any, key: str) -> None:
        delivered.append(payload)

    async def work() -> str:
        async with llm.call(tokens=10):
            pass
        async with app.lock("orders:1"):
            pass
        ctx = shoal.scope.current_run.get()
        assert ctx is not None
        ctx.outbox.send("mail", {"ok": True})
        return "done"

    @app.workflow
    async def flow(ctx: shoal.RunContext, input: Any) -> str:
        return str(await ctx.step("work", work))

    async with app:
        with spans.tracer.start_as_current_span("request") as request:
            run = await app.dispatch(flow)
        assert (await _until_final(app, run.id)).output == "done"
        for _ in range(50):
            if delivered:
                break
            await clock.advance(1)
        assert delivered == [{"ok": True}]
        await settle()
    tid = request.get_span_context().trace_id
    step = spans.one("shoal.step work")
    provider = spans.one("shoal.provider llm")
    lock = spans.one("shoal.lock.wait")
    delivery = spans.one("shoal.deliver mail")
    assert {_trace(s) for s in (step, provider, lock, delivery)} == {tid}
    assert _parent(provider) == _id(step) and _parent(lock) == _id(step)
    assert _attr(provider, "shoal.outcome") == "succeeded"
    assert _attr(lock, "shoal.outcome") == "acquired"
    assert _parent(delivery) == _id(step) and _attr(delivery, "shoal.outcome") == "delivered"
