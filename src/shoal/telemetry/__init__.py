"""Instrumentation hooks: where shoal tells metrics, traces and logs what happens.

The engine, the maintenance services, coordination and the providers call a :class:`Telemetry`
at each point worth measuring. This base class does nothing, so an app without metrics or
tracing pays one method call per hook. A sink (Prometheus metrics, OpenTelemetry traces)
overrides the hooks it needs; :func:`combine` joins several into one, and a sink that raises
is logged once and never fails the caller.

Hooks that begin something return a token (whatever the sink needs: a span, a start time) that
the matching ``*_ended`` hook gets back. Durations are the sink's to measure (real time, not
the app's clock); the times passed in are the app's clock, for latencies measured against the
store's own timestamps (a run's ``run_at``). The hooks are synchronous and must be cheap.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from shoal.types import OutboxEntry, Pause, Run

log = logging.getLogger("shoal")

Token = Any


class Telemetry:
    """The hooks, each doing nothing. Subclass and override those a sink needs."""

    # -- runs (the app's dispatch path, the engine) ----------------------------------------

    def trace_carrier(self) -> str | None:
        """The trace context active in the caller, as text, to store with a run being
        dispatched now (or with the outbox entries of the step ending now), so its attempts (its
        deliveries) continue that trace; None for none. The tracing sink's is the propagator's
        carrier in JSON (W3C ``traceparent`` and ``tracestate``)."""
        return None

    def runs_dispatched(self, workflow: str, created: int) -> None:
        """``created`` runs of ``workflow`` were just dispatched (repeated keys not counted)."""

    def run_claimed(self, run: Run, now: float) -> None:
        """This instance claimed ``run`` at ``now`` (app clock): it starts at once."""

    def attempt_started(self, run: Run, instance: str) -> Token:
        """An execution of ``run`` begins here (a first attempt, a retry or a resumption:
        ``run.lease_epoch``, ``run.attempts`` and ``run.resume_reason`` tell which). Called in
        the run's own task, so a sink may make its span current for the whole attempt."""
        return None

    def attempt_ended(self, token: Token, run: Run, outcome: str,
                      error: BaseException | str | None) -> None:
        """The execution begun with ``token`` ended, in the run's task. ``outcome`` is the
        run's status if it settled (``succeeded``, ``failed``, ``cancelled``), ``retry`` (an
        attempt failed, another follows), ``sleeping`` or ``waiting`` (parked), or why it
        stopped here without settling: ``interrupted`` (released for another instance),
        ``lost`` (its lease) or ``store_failed``."""

    def run_recovered(self, run: Run) -> None:
        """Recovery requeued (or, out of attempts, failed) ``run``, whose claim had lapsed."""

    # -- inside a run (RunContext) ---------------------------------------------------------

    def step_started(self, run: Run, name: str, seq: int) -> Token:
        """A ``ctx.step`` begins executing (not replayed from its checkpoint); the step's
        function runs in the caller's context, so a sink may make its span current."""
        return None

    def step_ended(self, token: Token, run: Run, name: str, error: BaseException | None,
                   retries: int) -> None:
        """The step begun with ``token`` ended: ``error`` is None when its function returned
        (its checkpoint is then being written), else what it raised after ``retries``
        in-place retries."""

    def run_parked(self, run: Run, kind: str, name: str | None, until: float | None) -> None:
        """The run gives up its slot to wait durably: ``kind`` is ``sleep``, ``signal``,
        ``approval`` or ``child``; ``name`` the signal's, approval's or child run's;
        ``until`` when it is due again by itself (app clock), if ever."""

    # -- outbox and pauses (maintenance) ---------------------------------------------------

    def delivery_started(self, entry: OutboxEntry) -> Token:
        """An outbox entry is handed to its handler."""
        return None

    def delivery_ended(self, token: Token, entry: OutboxEntry, result: str,
                       error: BaseException | None) -> None:
        """``result``: ``delivered``, ``retry`` (due again later) or ``dead``."""

    def pause_notified(self, pause: Pause) -> None:
        """A pending pause was announced to the ``on_pause_notify`` handlers."""

    # -- coordination ----------------------------------------------------------------------

    def lock_wait_started(self, name: str) -> Token:
        """``app.lock(name)`` begins waiting for the lock."""
        return None

    def lock_wait_ended(self, token: Token, name: str, acquired: bool) -> None:
        """The wait begun with ``token`` ended: ``acquired``, or it timed out / failed."""

    def lock_released(self, name: str, held_seconds: float, handed_off: bool) -> None:
        """A lock held here for ``held_seconds`` was released; ``handed_off`` when a waiter
        was waiting for it."""

    def meter_refused(self, name: str) -> None:
        """``app.meter(name)`` refused a take (the limit was reached)."""

    # -- providers and budgets -------------------------------------------------------------

    def provider_call_started(self, provider: str, tenant: str | None) -> Token:
        """A call through ``app.provider(name)`` asks for admission."""
        return None

    def provider_call_ended(self, token: Token, provider: str, result: str,
                            error: BaseException | None) -> None:
        """``result``: ``admitted`` (the call was made and returned), ``failed`` (admitted,
        the call raised), ``rate_limited`` (the provider answered 429), ``circuit_open``,
        ``timed_out`` (no admission within the timeout) or ``refused`` (budget, bad use)."""

    def provider_paused(self, provider: str, seconds: float) -> None:
        """A 429 paused every replica's calls to ``provider`` for ``seconds``."""

    def spent(self, tenant: str, amount: float, currency: str) -> None:
        """A run of ``tenant`` spent ``amount`` (``ctx.spend``, a provider call's cost)."""

    # -- the store -------------------------------------------------------------------------

    def store_call(self, operation: str, seconds: float, error: BaseException | None) -> None:
        """A call of the store's ``operation`` took ``seconds`` (and raised ``error``)."""


NOTHING = Telemetry()


class _Combined(Telemetry):
    """Sinks as one: each hook called on each sink, a token per sink. A sink that raises is
    logged once per hook and skipped, so telemetry never fails a run."""

    def __init__(self, sinks: Sequence[Telemetry]) -> None:
        self._sinks = tuple(sinks)
        self._failed: set[tuple[int, str]] = set()
        for hook in _HOOKS:   # made once: each hook an attribute of its own
            setattr(self, hook, self._make(hook))

    def _call(self, i: int, hook: str, *args: Any) -> Any:
        try:
            return getattr(self._sinks[i], hook)(*args)
        except Exception:
            if (i, hook) not in self._failed:
                self._failed.add((i, hook))
                log.exception("telemetry.failed: %s.%s", type(self._sinks[i]).__name__, hook,
                              extra={"event": "telemetry.failed"})
            return None

    def _make(self, hook: str) -> Any:
        call = self._call
        order = range(len(self._sinks))
        if hook == "trace_carrier":
            def carrier() -> str | None:
                for i in order:
                    found = call(i, hook)
                    if found is not None:
                        return str(found)
                return None
            return carrier
        if hook in _BEGINS:
            def begin(*args: Any) -> Token:
                return tuple(call(i, hook, *args) for i in order)
            return begin
        if hook in _ENDS:
            back = list(reversed(order))

            def end(token: Token, *args: Any) -> None:
                tokens = token if isinstance(token, tuple) else (None,) * len(order)
                for i in back:   # the reverse order of beginning: spans close inside out
                    call(i, hook, tokens[i], *args)
            return end

        def each(*args: Any) -> Any:
            for i in order:
                call(i, hook, *args)
        return each


_HOOKS = frozenset(name for name in vars(Telemetry) if not name.startswith("_"))
_BEGINS = frozenset(name for name in _HOOKS if name.endswith("_started"))
_ENDS = frozenset(name for name in _HOOKS if name.endswith("_ended"))


def combine(sinks: Sequence[Telemetry]) -> Telemetry:
    """One telemetry calling each of ``sinks`` and isolating their failures; the do-nothing
    one for none."""
    sinks = [s for s in sinks if s is not NOTHING]
    return _Combined(sinks) if sinks else NOTHING
