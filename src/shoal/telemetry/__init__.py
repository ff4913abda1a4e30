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
        """``result``: ``delivered``, ``retry`` (due again later), ``dead``, or
        ``store_failed`` (the outcome could not be written: the entry is taken again once its
        lease passes); ``error`` what the handler raised."""

    def pause_notified(self, pause: Pause, error: BaseException | None) -> None:
        """A pending pause was announced to the ``on_pause_notify`` handlers: ``error`` is None
        when every handler returned (it is not sent again), else what one raised (it is)."""

    # -- coordination ----------------------------------------------------------------------

    def lock_wait_started(self, keys: tuple[str, ...]) -> Token:
        """``app.lock(keys)`` (or ``app.locked``) begins asking for the lock on ``keys``."""
        return None

    def lock_wait_ended(self, token: Token, keys: tuple[str, ...], acquired: bool,
                        queued: bool) -> None:
        """The wait begun with ``token`` ended: ``acquired``, or not (the store could not be
        asked for a lease, or the caller was cancelled). ``queued``: the first ask found the
        lock held or waited for, so it was handed over to this caller by a release or an
        expiry (a contended lock)."""

    def lock_released(self, keys: tuple[str, ...], held_seconds: float, lost: bool) -> None:
        """A lock acquired here was released after ``held_seconds`` (app clock); ``lost``
        when it had been lost while held (a renewal refused or not confirmed in time)."""

    def metered(self, keys: Sequence[str], deltas: Sequence[float],
                debts: Sequence[float]) -> None:
        """``app.meter(keys, deltas)`` added ``deltas`` and the store answered ``debts``
        (milliseconds). The meter itself refuses nothing: the caller compares the debts."""

    # -- providers and budgets -------------------------------------------------------------

    def provider_call_started(self, provider: str, tenant: str) -> Token:
        """A call through ``app.provider(name)`` asks for admission for ``tenant`` (the one
        given to ``provider.call``, else the current run's, else ``default``)."""
        return None

    def provider_call_ended(self, token: Token, provider: str, result: str,
                            error: BaseException | None) -> None:
        """The call begun with ``token`` ended. ``result``: ``succeeded`` (admitted, made, and
        its block returned), ``failed`` (admitted, its block raised), ``rate_limited`` (the
        block said the provider answered 429), ``circuit_open``, ``timed_out`` (no admission
        within the timeout), ``refused`` (a budget had no room), ``cancelled`` (the caller was
        cancelled, waiting for admission or in its block) or ``store_failed`` (the
        coordination store failed during admission); ``error`` what was raised, if any."""

    def provider_paused(self, provider: str, seconds: float) -> None:
        """A 429 paused every replica's calls to ``provider`` for ``seconds``."""

    def spent(self, tenant: str, amount: float, currency: str) -> None:
        """``amount`` (> 0) of ``currency`` was recorded as spent by ``tenant`` (``ctx.spend``,
        ``app.spend``, a provider call's cost), once written to the ledger."""

    # -- the store -------------------------------------------------------------------------

    def store_call(self, operation: str, seconds: float, error: BaseException | None) -> None:
        """A call of the store's ``operation`` (a method name of the Store, CoordStore or
        RateStore protocols) took ``seconds`` (real time) and raised ``error``. Only called
        when a sink overrides it: the app then calls its stores through a wrapper
        (:func:`shoal.telemetry.store.measured`) that times every call; without one, no
        wrapper is made. ``wait_for_work`` (a wait, not a query) is not reported."""


NOTHING = Telemetry()


def _nothing(*args: Any) -> None:
    return None


class _Combined(Telemetry):
    """Sinks as one: each hook called on each sink that implements it, a token per sink. A sink
    that raises is logged once per hook and skipped, so telemetry never fails a run. Each hook
    is made once, calling the sinks' bound methods directly: a hook no sink implements does
    nothing, one that a single sink implements costs one call more than the sink's own."""

    def __init__(self, sinks: Sequence[Telemetry]) -> None:
        self._sinks = tuple(sinks)
        self._failed: set[tuple[int, str]] = set()
        for hook in _HOOKS:   # made once: each hook an attribute of its own
            setattr(self, hook, self._make(hook))

    def _failure(self, i: int, hook: str) -> None:
        """Sink ``i`` raised in ``hook`` (called from an ``except``): logged the first time."""
        if (i, hook) not in self._failed:
            self._failed.add((i, hook))
            log.exception("telemetry.failed: %s.%s", type(self._sinks[i]).__name__, hook,
                          extra={"event": "telemetry.failed"})

    def _make(self, hook: str) -> Any:
        n = len(self._sinks)
        live = [(i, getattr(sink, hook)) for i, sink in enumerate(self._sinks)
                if overrides(sink, hook)]
        if not live:
            return _nothing
        if hook == "trace_carrier":
            return self._carrier(live)
        paired = hook in _BEGINS or hook in _ENDS
        if n == 1 or (len(live) == 1 and not paired):
            # one sink: its token passed as it is, not in a tuple
            return self._one(hook, *live[0])
        fail = self._failure
        if hook in _BEGINS:
            def begin(*args: Any) -> Token:
                tokens: list[Token] = [None] * n
                for i, method in live:
                    try:
                        tokens[i] = method(*args)
                    except Exception:
                        fail(i, hook)
                return tuple(tokens)
            return begin
        back = live[::-1]   # ends in the reverse order of beginning: spans close inside out

        def end(token: Token, *args: Any) -> None:
            tokens = token if isinstance(token, tuple) and len(token) == n else (None,) * n
            for i, method in back:
                try:
                    method(tokens[i], *args)
                except Exception:
                    fail(i, hook)

        def each(*args: Any) -> None:
            for i, method in live:
                try:
                    method(*args)
                except Exception:
                    fail(i, hook)
        return end if hook in _ENDS else each

    def _one(self, hook: str, i: int, method: Any) -> Any:
        fail = self._failure
        if hook in _BEGINS:
            def begin(*args: Any) -> Token:
                try:
                    return method(*args)
                except Exception:
                    fail(i, hook)
                    return None
            return begin

        def call(*args: Any) -> None:
            try:
                method(*args)
            except Exception:
                fail(i, hook)
        return call

    def _carrier(self, live: list[tuple[int, Any]]) -> Any:
        fail = self._failure

        def carrier() -> str | None:
            for i, method in live:
                try:
                    found = method()
                except Exception:
                    fail(i, "trace_carrier")
                    continue
                if found is not None:
                    return str(found)
            return None
        return carrier


_HOOKS = frozenset(name for name in vars(Telemetry) if not name.startswith("_"))
_BEGINS = frozenset(name for name in _HOOKS if name.endswith("_started"))
_ENDS = frozenset(name for name in _HOOKS if name.endswith("_ended"))


def combine(sinks: Sequence[Telemetry]) -> Telemetry:
    """One telemetry calling each of ``sinks`` and isolating their failures; the do-nothing
    one for none."""
    sinks = [s for s in sinks if s is not NOTHING]
    return _Combined(sinks) if sinks else NOTHING


def overrides(telemetry: Telemetry, hook: str) -> bool:
    """Whether ``telemetry`` (or one of the sinks it combines) implements ``hook``: a caller
    whose hook costs something to feed (timing every store call) skips it otherwise."""
    if isinstance(telemetry, _Combined):
        return any(overrides(sink, hook) for sink in telemetry._sinks)
    method = getattr(telemetry, hook, None)
    # a method of the sink's class, or a function set on the sink itself
    return getattr(method, "__func__", method) is not getattr(Telemetry, hook)
