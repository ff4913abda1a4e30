"""OpenTelemetry traces of what shoal does: a span per run attempt, one per executed step, one per
outbox delivery, lock wait and provider call, written through the OpenTelemetry API only (the
``shoal[otel]`` extra); the application's SDK set-up (or ``opentelemetry-instrument``) decides
where they go and which are sampled.

``App(tracing=True)`` (the global tracer provider) or ``App(tracing=provider)`` adds a
:class:`Tracing` sink; ``app.instrument(Tracing(...))`` does the same with its options.

- **Dispatch.** The trace context active where a run is dispatched (``app.dispatch``,
  ``dispatch_many``, a transactional dispatch, ``ctx.start_child``) is stored with the run, as
  the text-map propagator's carrier in JSON (W3C ``traceparent`` and ``tracestate`` by
  default). Every attempt of the run, on whichever instance and however much later, is a span
  whose parent is that context, so a request and the runs it started are one trace. With
  ``Tracing(link=True)`` each attempt begins a trace of its own, linked to it instead. A run
  dispatched with no span active (a cron tick, a script) has none: each attempt is a root.
- **Attempt** (``shoal.run <workflow>``, kind CONSUMER, as OpenTelemetry's messaging
  conventions name the processing of a message): current in the run's task for the whole
  attempt. Its end says why in ``shoal.outcome``; a failed attempt (``failed``, ``retry``) and
  one that ended abnormally (``lost`` its lease, ``store_failed``) have status ERROR, the first
  with the exception recorded; ``interrupted`` (a graceful stop) and the parks (``sleeping``,
  ``waiting``) do not. Durable sleeps, waits, approvals and child waits are ``shoal.parked``
  events on it.
- **Step** (``shoal.step <name>``, INTERNAL): current while the step's function runs, so the
  application's own spans (an HTTP client's) nest under it, in a thread too (``asyncio.to_thread``
  copies the context). A step that raised records the exception.
- **Outbox delivery** (``shoal.deliver <topic>``, CONSUMER): its parent is the step that sent
  the entry (its context is stored with the entry); current while the handler runs.
- **Lock wait** (``shoal.lock.wait``) and **provider call** (``shoal.provider <name>``, current
  while the call runs) under the caller's span.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

from shoal.errors import ConfigurationError
from shoal.telemetry import Telemetry, Token
from shoal.types import OutboxEntry, Run

try:
    from opentelemetry import context as otel
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, TracerProvider
except ImportError as e:   # pragma: no cover - the message is the point
    raise ConfigurationError(
        "shoal tracing needs the OpenTelemetry API: pip install 'shoal[otel]' (and an SDK, "
        "opentelemetry-sdk, to export the spans somewhere).") from e

__all__ = ["Tracing"]

# outcomes of an attempt that did not do its work: status ERROR
_ERRORS = frozenset({"failed", "retry", "lost", "store_failed"})
# what provider_call_ended's results other than "admitted" mean for the span
_PROVIDER_ERRORS = frozenset({"failed", "rate_limited", "circuit_open", "timed_out", "refused",
                              "store_failed"})

# the attempt span of the run executing in this task (run_parked adds its events there, even
# under a span of the application's own)
_attempt: contextvars.ContextVar[Span | None] = contextvars.ContextVar(
    "shoal_attempt_span", default=None)

_EMPTY = otel.Context()
_READ_LIMIT = 4096   # carriers kept read (Tracing._read)


def _version() -> str | None:
    try:
        return metadata.version("shoal")
    except metadata.PackageNotFoundError:   # pragma: no cover - a source tree not installed
        return None


class Tracing(Telemetry):
    """The OpenTelemetry sink. ``tracer_provider``: where the spans go (None: the global one,
    also when the SDK sets it up after the app is built). ``link``: begin a trace per attempt
    (and per delivery), linked to the dispatching span, instead of making that span their
    parent. ``TypeError`` for a provider that is not one."""

    def __init__(self, tracer_provider: TracerProvider | None = None, *,
                 link: bool = False) -> None:
        if tracer_provider is not None and not isinstance(tracer_provider, TracerProvider):
            raise TypeError(f"Tracing(tracer_provider): an OpenTelemetry TracerProvider, not "
                            f"{type(tracer_provider).__name__}.")
        self._tracer = trace.get_tracer("shoal", _version(), tracer_provider)
        self.link = bool(link)
        # carriers read lately, as contexts (immutable): the runs of a batch, and the attempts
        # of one run, share theirs, and reading one costs as much as a span
        self._read: dict[str, tuple[otel.Context, Sequence[Link] | None]] = {}

    def __repr__(self) -> str:
        return f"<shoal.telemetry.tracing.Tracing link={self.link}>"

    # -- the trace a run or an entry continues ---------------------------------------------

    def trace_carrier(self) -> str | None:
        if not trace.get_current_span().get_span_context().is_valid:
            return None
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return json.dumps(carrier, separators=(",", ":")) if carrier else None

    def _continued(self, carried: str | None) -> tuple[otel.Context, Sequence[Link] | None]:
        """The parent context of a span continuing ``carried`` (a carrier stored with a run or
        an entry), and its links: with ``link``, an empty context and a link to it."""
        if not carried:
            return _EMPTY, None
        found = self._read.get(carried)
        if found is None:
            if len(self._read) >= _READ_LIMIT:
                self._read.clear()
            found = self._read[carried] = self._read_carrier(carried)
        return found

    def _read_carrier(self, carried: str) -> tuple[otel.Context, Sequence[Link] | None]:
        try:
            carrier = json.loads(carried)
        except ValueError:
            return _EMPTY, None   # not ours to fail a run over: the span starts a trace
        if not isinstance(carrier, Mapping):
            return _EMPTY, None
        parent = propagate.extract(carrier, context=_EMPTY)
        if not self.link:
            return parent, None
        found = trace.get_current_span(parent).get_span_context()
        return _EMPTY, (Link(found),) if found.is_valid else None

    # -- run attempts and steps ------------------------------------------------------------

    def attempt_started(self, run: Run, instance: str) -> Token:
        parent, links = self._continued(run.trace_context)
        attributes: dict[str, str | int] = {
            "shoal.run_id": run.id, "shoal.workflow": run.workflow, "shoal.attempt": run.attempts,
            "shoal.lease_epoch": run.lease_epoch, "shoal.tenant": run.tenant,
            "shoal.instance": instance,
        }
        if run.resume_reason:
            attributes["shoal.resume_reason"] = run.resume_reason
        if run.parent_id:
            attributes["shoal.parent_run_id"] = run.parent_id
        span = self._tracer.start_span(f"shoal.run {run.workflow}", parent,
                                       kind=SpanKind.CONSUMER, attributes=attributes,
                                       links=links)
        # current for the whole attempt, over the dispatcher's context (its baggage with it)
        return span, otel.attach(trace.set_span_in_context(span, parent)), _attempt.set(span)

    def attempt_ended(self, token: Token, run: Run, outcome: str,
                      error: BaseException | str | None) -> None:
        span, attached, current = token
        try:
            span.set_attribute("shoal.outcome", outcome)
            if outcome in _ERRORS:
                _failed(span, error, outcome)
            span.end()
        finally:
            otel.detach(attached)
            _attempt.reset(current)

    def step_started(self, run: Run, name: str, seq: int) -> Token:
        # the run's other attributes are its attempt's, the parent: a span's attributes are
        # most of what it costs beyond the SDK's own
        span = self._tracer.start_span(f"shoal.step {name}", attributes={
            "shoal.run_id": run.id, "shoal.step": name, "shoal.step_seq": seq})
        return span, otel.attach(trace.set_span_in_context(span))

    def step_ended(self, token: Token, run: Run, name: str, error: BaseException | None,
                   retries: int) -> None:
        span, attached = token
        try:
            if retries:
                span.set_attribute("shoal.retries", retries)
            if error is None:
                span.set_attribute("shoal.outcome", "succeeded")
            elif isinstance(error, Exception):
                span.set_attribute("shoal.outcome", "failed")
                _failed(span, error, "failed")
            else:   # cancelled with its run (a cancel, a stop, a lost lease)
                span.set_attribute("shoal.outcome", "interrupted")
                span.set_status(Status(StatusCode.ERROR, f"interrupted ({type(error).__name__})"))
            span.end()
        finally:
            otel.detach(attached)

    def run_parked(self, run: Run, kind: str, name: str | None, until: float | None) -> None:
        span = _attempt.get() or trace.get_current_span()
        attributes: dict[str, str | float] = {"shoal.park": kind}
        if name is not None:
            attributes["shoal.wait_for"] = name
        if until is not None:
            attributes["shoal.until"] = until
        span.add_event("shoal.parked", attributes)

    def run_recovered(self, run: Run) -> None:
        """A mark in the run's trace where its lapsed claim was found: the attempt that held it
        (its process gone) never ended its span."""
        parent, links = self._continued(run.trace_context)
        span = self._tracer.start_span(
            f"shoal.recovered {run.workflow}", parent, links=links,
            attributes={"shoal.run_id": run.id, "shoal.workflow": run.workflow,
                        "shoal.tenant": run.tenant, "shoal.attempt": run.attempts,
                        "shoal.outcome": str(run.status)})
        if run.status.final:
            _failed(span, run.error, "failed")
        span.end()

    def runs_dispatched(self, workflow: str, created: int) -> None:
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event("shoal.dispatched", {"shoal.workflow": workflow, "shoal.runs": created})

    # -- the outbox ------------------------------------------------------------------------

    def delivery_started(self, entry: OutboxEntry) -> Token:
        parent, links = self._continued(entry.trace_context)
        span = self._tracer.start_span(
            f"shoal.deliver {entry.topic}", parent, kind=SpanKind.CONSUMER, links=links,
            attributes={"shoal.run_id": entry.run_id, "shoal.topic": entry.topic,
                        "shoal.outbox_key": entry.key, "shoal.delivery": entry.attempts + 1})
        return span, otel.attach(trace.set_span_in_context(span, parent))

    def delivery_ended(self, token: Token, entry: OutboxEntry, result: str,
                       error: BaseException | None) -> None:
        span, attached = token
        try:
            span.set_attribute("shoal.outcome", result)
            if error is not None or result != "delivered":
                _failed(span, error, result)
            span.end()
        finally:
            otel.detach(attached)

    # -- coordination and providers ----------------------------------------------------------

    def lock_wait_started(self, keys: tuple[str, ...]) -> Token:
        return self._tracer.start_span("shoal.lock.wait",
                                       attributes={"shoal.lock": list(keys)})

    def lock_wait_ended(self, token: Token, keys: tuple[str, ...], acquired: bool,
                        queued: bool) -> None:
        span: Span = token
        span.set_attribute("shoal.outcome", "acquired" if acquired else "not_acquired")
        span.set_attribute("shoal.lock.queued", queued)
        if not acquired:
            span.set_status(Status(StatusCode.ERROR, "the lock was not acquired"))
        span.end()

    def provider_call_started(self, provider: str, tenant: str) -> Token:
        attributes = {"shoal.provider": provider, "shoal.tenant": tenant}
        span = self._tracer.start_span(f"shoal.provider {provider}", attributes=attributes)
        return span, otel.attach(trace.set_span_in_context(span))

    def provider_call_ended(self, token: Token, provider: str, result: str,
                            error: BaseException | None) -> None:
        span, attached = token
        try:
            span.set_attribute("shoal.outcome", result)
            if result in _PROVIDER_ERRORS:
                _failed(span, error, result)
            span.end()
        finally:
            otel.detach(attached)

    def provider_paused(self, provider: str, seconds: float) -> None:
        _event("shoal.provider.paused", {"shoal.provider": provider, "shoal.seconds": seconds})

    def spent(self, tenant: str, amount: float, currency: str) -> None:
        _event("shoal.spent", {"shoal.tenant": tenant, "shoal.amount": amount,
                               "shoal.currency": currency})


def _failed(span: Span, error: BaseException | str | None, outcome: str) -> None:
    """Status ERROR on ``span``, with ``error`` recorded when it is an exception."""
    if isinstance(error, BaseException):
        span.record_exception(error)
        description = f"{type(error).__name__}: {error}"
    else:
        description = error or outcome
    span.set_status(Status(StatusCode.ERROR, description))


def _event(name: str, attributes: dict[str, Any]) -> None:
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, attributes)
