"""Prometheus metrics: a :class:`~shoal.telemetry.Telemetry` sink over ``prometheus_client``
(the ``metrics`` extra: ``pip install 'shoal[metrics]'``). docs/observability.md lists every
metric with its labels.

Three kinds of metric, each exported as Prometheus expects a replica's metrics to be summed:

- **what happened here**: counters and histograms fed by the hooks (runs claimed, attempts,
  steps, deliveries, lock waits, provider calls, store calls...), on the instance where it
  happened;
- **this instance now**: gauges read when scraped (runs executing, free slots, membership),
  from callbacks the App binds at start (:meth:`PrometheusMetrics.bind_instance`);
- **the store now**: gauges of what the whole namespace holds (queued runs per workflow and
  tenant, the oldest due run's age, pending approvals, the outbox, provider breakers), sampled
  every ``stats_interval`` by the one replica that owns slot 0 of ``app.slots(1)`` and exported
  by it alone (:meth:`PrometheusMetrics.store_sampled`), so N replicas neither multiply the
  store's load nor count the same runs N times.

Labels are bounded: workflow, outbox topic, provider and store operation names come from the
code; a lock's or meter's ``group`` is its first key's part before the first ``:`` (at most
:data:`MAX_GROUPS` groups of each, the rest counted as ``other``); ``tenant`` (spend, queue
depth) takes one value per tenant of the app. No run id is ever a label.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

try:
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        generate_latest,
        start_http_server,
    )
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.utils import floatToGoString
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError(f"shoal's metrics need the metrics extra ({e}): "
                      f"pip install 'shoal[metrics]'.") from None

from shoal.errors import ConfigurationError
from shoal.telemetry import Telemetry, Token
from shoal.types import FINAL_STATUSES, OutboxEntry, Pause, Run, Stats

CONTENT_TYPE = CONTENT_TYPE_LATEST     # of :meth:`PrometheusMetrics.exposition`
STATS_INTERVAL = 15.0                  # seconds of the app's clock between store samples
MAX_GROUPS = 100                       # distinct lock and meter groups before ``other``

# histogram buckets, in seconds
FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
           60.0, 300.0, 900.0, 3600.0)
SLOW = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
        600.0, 1800.0, 3600.0)


@dataclass(frozen=True)
class InstanceState:
    """This instance as a scrape sees it: runs executing and the slots (of
    ``max_concurrent_runs``) free for a claim; ``members`` the replicas its membership
    assignment counts, ``assigned`` whether it holds one (None without a membership)."""

    executing: int
    free_slots: int
    slots: int
    members: int | None = None
    assigned: bool | None = None
    # per workflow, the runs executing here that reported a fraction (ctx.progress) and the
    # sum of their latest fractions
    progress: Mapping[str, tuple[int, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class StoreSample:
    """What the sampling replica read of the whole namespace: ``stats`` (``app.stats()``) and,
    per provider with a breaker, its state (``closed``, ``open``, ``half-open``); per provider,
    whether a 429 pause is in force."""

    stats: Stats
    breakers: Mapping[str, str] = field(default_factory=dict)
    paused: Mapping[str, bool] = field(default_factory=dict)


class _Family:
    """A counter or histogram family kept as plain numbers by label values, and exported as a
    ``prometheus_client`` metric family at each scrape.

    ``prometheus_client``'s own Counter and Histogram take a lock per update (a histogram one
    per bucket and one for its sum), which cost a no-op run a sixth of its time on the memory
    store. These are written from the app's event loop only, so they need none; a scrape, in
    another thread, copies each family's values in one step (``list`` of a dict's items holds
    the GIL throughout) and exports a histogram's count as its cumulative buckets, so the two
    always agree."""

    __slots__ = ("bounds", "doc", "histogram", "labels", "name", "values")

    def __init__(self, name: str, doc: str, labels: Sequence[str],
                 buckets: Sequence[float] | None = None) -> None:
        self.name = name
        self.doc = doc
        self.labels = list(labels)
        self.histogram = buckets is not None
        self.bounds = list(buckets or ())
        # counter: label values -> total; histogram: label values -> [sum, count per bucket
        # (not cumulative; the last one is +Inf)]
        self.values: dict[tuple[str, ...], Any] = {}

    def inc(self, key: tuple[str, ...], amount: float = 1.0) -> None:
        values = self.values
        values[key] = values.get(key, 0.0) + amount

    def observe(self, key: tuple[str, ...], value: float) -> None:
        kept = self.values.get(key)
        if kept is None:
            kept = self.values[key] = [0.0] + [0] * (len(self.bounds) + 1)
        kept[0] += value
        kept[1 + bisect.bisect_left(self.bounds, value)] += 1

    def get(self, key: tuple[str, ...] = ()) -> float:
        """A counter's value, or a histogram's count (0 for label values never seen)."""
        kept = self.values.get(key)
        if kept is None:
            return 0.0
        return float(sum(kept[1:])) if self.histogram else float(kept)

    def describe(self) -> Metric:
        if self.histogram:
            return HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        return CounterMetricFamily(self.name, self.doc, labels=self.labels)

    def collect(self) -> Metric:
        items = list(self.values.items())
        if not self.histogram:
            counter = CounterMetricFamily(self.name, self.doc, labels=self.labels)
            for key, total in items:
                counter.add_metric(list(key), total)
            return counter
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        edges = [*(_go_float(b) for b in self.bounds), "+Inf"]
        for key, kept in items:
            kept = list(kept)
            running, buckets = 0, []
            for edge, n in zip(edges, kept[1:], strict=True):
                running += n
                buckets.append((edge, float(running)))
            family.add_metric(list(key), buckets, kept[0])
        return family


# a bucket's ``le`` as prometheus_client writes it (its helper has no annotations)
_go_float = cast(Callable[[float], str], floatToGoString)


class _Recorded:
    """The counters and histograms, as one collector."""

    def __init__(self, families: list[_Family]) -> None:
        self._families = families

    def describe(self) -> Iterable[Metric]:
        return [f.describe() for f in self._families]

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            yield family.collect()


class _Groups:
    """The ``group`` label of lock and meter keys: the first key's part before ``:``, at most
    :data:`MAX_GROUPS` of them (the others are ``other``), so a key naming an id cannot make a
    series per id."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, keys: Sequence[str]) -> str:
        group = keys[0].split(":", 1)[0] if keys else ""
        if group in self._seen:
            return group
        if len(self._seen) >= MAX_GROUPS:
            return "other"
        self._seen.add(group)
        return group


def _since(token: Token) -> float | None:
    """Seconds since a token that is a ``perf_counter`` reading; None for another token."""
    return time.perf_counter() - token if isinstance(token, float) else None


class PrometheusMetrics(Telemetry):
    """shoal's metrics in ``registry`` (a new ``CollectorRegistry`` by default: several Apps in
    one process, or in one test run, each have their own). Give ``App(metrics=...)`` True, a
    registry, or one of these; read ``app.metrics.registry`` or :meth:`exposition`.

    Raises ConfigurationError when the registry already holds shoal's metrics (another App's):
    one registry serves one App."""

    content_type = CONTENT_TYPE     # of :meth:`exposition`

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 stats_interval: float = STATS_INTERVAL) -> None:
        if registry is not None and not isinstance(registry, CollectorRegistry):
            raise TypeError(f"PrometheusMetrics(registry): a prometheus_client "
                            f"CollectorRegistry, not {type(registry).__name__}.")
        if (isinstance(stats_interval, bool) or not isinstance(stats_interval, (int, float))
                or not math.isfinite(stats_interval) or stats_interval <= 0):
            raise ValueError(f"PrometheusMetrics(stats_interval): seconds > 0, not "
                             f"{stats_interval!r}.")
        self.registry = registry if registry is not None else CollectorRegistry()
        self.stats_interval = float(stats_interval)
        self._groups = _Groups()          # of lock keys
        self._meter_groups = _Groups()    # of meter keys
        self._instance: Callable[[], InstanceState | None] | None = None
        self._sampling: Callable[[], bool] | None = None
        self._now: Callable[[], float] = time.time
        self._sample: StoreSample | None = None
        self._sampled_at = 0.0
        self._lock = threading.Lock()   # the sample, read by scrapes in other threads
        made: list[Any] = []
        self._define(made)
        made += [_InstanceCollector(self), _StoreCollector(self)]
        self._register(made)

    # -- the metrics -----------------------------------------------------------------------

    def _define(self, made: list[Any]) -> None:
        families: list[_Family] = []

        def counter(name: str, doc: str, *labels: str) -> _Family:
            families.append(family := _Family(name, doc, labels))
            return family

        def histogram(name: str, doc: str, buckets: Sequence[float], *labels: str,
                      ) -> _Family:
            families.append(family := _Family(name, doc, labels, buckets))
            return family

        self.dispatched = counter("shoal_runs_dispatched", "Runs dispatched here (a repeated "
                                  "idempotency key not counted).", "workflow")
        self.claimed = counter("shoal_runs_claimed", "Runs claimed here (each claim of a "
                               "run: its first, after a sleep, wait, retry or recovery).",
                               "workflow")
        self.finished = counter("shoal_runs_finished", "Runs that reached a final status "
                                "here: executed to their end, or failed by recovery.",
                                "workflow", "status")
        self.attempts = counter("shoal_attempts", "Executions that ended here, by how: "
                                "succeeded, failed, cancelled, retry, sleeping, waiting, "
                                "interrupted, lost (its lease), store_failed.",
                                "workflow", "outcome")
        self.recovered = counter("shoal_runs_recovered", "Runs whose claim had lapsed, "
                                 "requeued (or failed) by this instance's recovery.",
                                 "workflow")
        self.parked = counter("shoal_runs_parked", "Runs that gave up their slot to wait "
                              "durably, by kind: sleep, signal, approval, child.",
                              "workflow", "kind")
        self.start_latency = histogram(
            "shoal_run_start_latency_seconds", "From a run's dispatch to its first claim, on "
            "the app's clock (a delay given at dispatch included).", LATENCY, "workflow")
        self.attempt_duration = histogram(
            "shoal_attempt_duration_seconds", "How long each execution of a run took here, "
            "whatever its outcome.", SLOW, "workflow")
        self.step_duration = histogram(
            "shoal_step_duration_seconds", "How long each step took to execute (replayed "
            "steps not counted), in-place retries included.", SLOW, "workflow")
        self.step_errors = counter("shoal_step_errors", "Steps whose function raised after "
                                   "their in-place retries.", "workflow")
        self.step_retries = counter("shoal_step_retries", "In-place retries of steps.",
                                    "workflow")
        self.deliveries = counter("shoal_outbox_deliveries", "Outbox entries handed to their "
                                  "handler, by result: delivered, retry, dead, store_failed.",
                                  "topic", "result")
        self.delivery_duration = histogram(
            "shoal_outbox_delivery_duration_seconds", "How long an outbox handler took.",
            FAST, "topic")
        self.notifications = counter("shoal_pause_notifications", "Pauses announced to the "
                                     "on_pause_notify handlers, by result: sent, failed.",
                                     "result")
        self.lock_wait = histogram(
            "shoal_lock_wait_seconds", "How long app.lock waited before it held the lock.",
            LATENCY, "group")
        self.lock_wait_failures = counter("shoal_lock_wait_failures", "Lock waits that "
                                          "ended without the lock (cancelled, store "
                                          "unreachable for a lease).", "group")
        self.lock_handoffs = counter("shoal_lock_handoffs", "Locks acquired after waiting "
                                     "for another holder or earlier waiters: handed over.",
                                     "group")
        self.lock_hold = histogram(
            "shoal_lock_hold_seconds", "How long a lock was held here, on the app's clock.",
            SLOW, "group")
        self.locks_lost = counter("shoal_locks_lost", "Locks lost while held (a renewal "
                                  "refused or not confirmed in time).", "group")
        self.meter_calls = counter("shoal_meter_calls", "Calls of app.meter.", "group")
        self.provider_calls = counter(
            "shoal_provider_calls", "Calls through app.provider, by result: succeeded, "
            "failed, rate_limited, circuit_open, timed_out, refused, cancelled, store_failed.",
            "provider", "result")
        self.provider_duration = histogram(
            "shoal_provider_call_duration_seconds", "From asking admission to the end of a "
            "call that was made (succeeded, failed, rate_limited).", SLOW, "provider")
        self.provider_pauses = counter("shoal_provider_pauses", "429 answers that paused "
                                       "the provider for every replica.", "provider")
        self.spend = counter("shoal_spend", "Money recorded as spent here (ctx.spend, "
                             "app.spend, provider calls), in the currency's unit.",
                             "tenant", "currency")
        self.store_duration = histogram(
            "shoal_store_call_duration_seconds", "Store calls by operation (a method of the "
            "Store, CoordStore or RateStore protocols).", FAST, "operation")
        self.store_errors = counter("shoal_store_call_errors", "Store calls that raised.",
                                    "operation")
        self.sample_failures = counter("shoal_stats_sample_failures", "Store samples that "
                                       "failed on this instance (it was the sampler).")
        made.append(_Recorded(families))

    def _register(self, made: list[Any]) -> None:
        done = []
        try:
            for collector in made:
                self.registry.register(collector)
                done.append(collector)
        except ValueError as e:
            for collector in done:
                self.registry.unregister(collector)
            raise ConfigurationError(
                f"This registry already holds shoal's metrics ({e}): one registry serves one "
                f"App. Give each App its own (App(metrics=True) makes one).") from None

    # -- what the App binds ----------------------------------------------------------------

    def bind_instance(self, read: Callable[[], InstanceState | None] | None) -> None:
        """Read this instance's gauges from ``read()`` at each scrape (None: export none)."""
        self._instance = read

    def bind_sampling(self, sampling: Callable[[], bool] | None,
                      now: Callable[[], float] = time.time) -> None:
        """``sampling()``: whether this instance is the one that samples the store now (the
        store gauges are exported only then); ``now``: the app's clock."""
        self._sampling = sampling
        self._now = now
        if sampling is None:
            self.store_sampled(None)

    def store_sampled(self, sample: StoreSample | None) -> None:
        """Keep ``sample``, taken now, for the scrapes (None: forget the last one)."""
        with self._lock:
            self._sample = sample
            self._sampled_at = self._now()

    def sampling(self) -> bool:
        """Whether this instance is the store's sampler now."""
        sampling = self._sampling
        return sampling is not None and bool(sampling())

    def fresh_sample(self) -> StoreSample | None:
        """The last sample, while this instance samples and it is at most two intervals
        old (a store that no longer answers leaves the gauges absent, not stale)."""
        if not self.sampling():
            return None
        with self._lock:
            sample, at = self._sample, self._sampled_at
        if sample is None or self._now() - at > 2 * self.stats_interval:
            return None
        return sample

    # -- exposition ------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format (``prometheus_client.generate_latest``);
        its content type is :data:`CONTENT_TYPE`."""
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "0.0.0.0") -> Callable[[], None]:
        """Serve the registry over HTTP on ``host:port`` (``prometheus_client``'s own server,
        in a daemon thread; every path answers the metrics, ``/metrics`` among them). Returns
        a function that stops it. Raises OSError when the port cannot be bound."""
        served: Any = start_http_server(port, addr=host, registry=self.registry)
        server = served[0] if isinstance(served, tuple) else None

        def stop() -> None:
            if server is not None:
                server.shutdown()
                server.server_close()

        return stop

    # -- the hooks: runs -------------------------------------------------------------------

    def runs_dispatched(self, workflow: str, created: int) -> None:
        self.dispatched.inc((workflow,), created)

    def run_claimed(self, run: Run, now: float) -> None:
        self.claimed.inc((run.workflow,))
        if run.lease_epoch == 1:
            # the first claim. A claim sets run_at to its own time, so a delay given at
            # dispatch cannot be told apart here: it is part of the latency (documented)
            self.start_latency.observe((run.workflow,), max(0.0, now - run.created_at))

    def attempt_started(self, run: Run, instance: str) -> Token:
        return time.perf_counter()

    def attempt_ended(self, token: Token, run: Run, outcome: str,
                      error: BaseException | str | None) -> None:
        self.attempts.inc((run.workflow, outcome))
        took = _since(token)
        if took is not None:
            self.attempt_duration.observe((run.workflow,), took)
        if outcome in FINAL_STATUSES:
            self.finished.inc((run.workflow, outcome))

    def run_recovered(self, run: Run) -> None:
        self.recovered.inc((run.workflow,))
        if run.status in FINAL_STATUSES:
            self.finished.inc((run.workflow, run.status.value))

    def step_started(self, run: Run, name: str, seq: int) -> Token:
        return time.perf_counter()

    def step_ended(self, token: Token, run: Run, name: str, error: BaseException | None,
                   retries: int) -> None:
        took = _since(token)
        if took is not None:
            self.step_duration.observe((run.workflow,), took)
        if error is not None:
            self.step_errors.inc((run.workflow,))
        if retries:
            self.step_retries.inc((run.workflow,), retries)

    def run_parked(self, run: Run, kind: str, name: str | None, until: float | None) -> None:
        self.parked.inc((run.workflow, kind))

    # -- outbox, pauses --------------------------------------------------------------------

    def delivery_started(self, entry: OutboxEntry) -> Token:
        return time.perf_counter()

    def delivery_ended(self, token: Token, entry: OutboxEntry, result: str,
                       error: BaseException | None) -> None:
        self.deliveries.inc((entry.topic, result))
        took = _since(token)
        if took is not None:
            self.delivery_duration.observe((entry.topic,), took)

    def pause_notified(self, pause: Pause, error: BaseException | None) -> None:
        self.notifications.inc(("sent" if error is None else "failed",))

    # -- coordination ----------------------------------------------------------------------

    def lock_wait_started(self, keys: tuple[str, ...]) -> Token:
        return time.perf_counter()

    def lock_wait_ended(self, token: Token, keys: tuple[str, ...], acquired: bool,
                        queued: bool) -> None:
        group = self._groups(keys)
        if not acquired:
            self.lock_wait_failures.inc((group,))
            return
        took = _since(token)
        if took is not None:
            self.lock_wait.observe((group,), took)
        if queued:
            self.lock_handoffs.inc((group,))

    def lock_released(self, keys: tuple[str, ...], held_seconds: float, lost: bool) -> None:
        group = self._groups(keys)
        self.lock_hold.observe((group,), max(0.0, held_seconds))
        if lost:
            self.locks_lost.inc((group,))

    def metered(self, keys: Sequence[str], deltas: Sequence[float],
                debts: Sequence[float]) -> None:
        self.meter_calls.inc((self._meter_groups(keys),))

    # -- providers, budgets ----------------------------------------------------------------

    def provider_call_started(self, provider: str, tenant: str) -> Token:
        return time.perf_counter()

    def provider_call_ended(self, token: Token, provider: str, result: str,
                            error: BaseException | None) -> None:
        self.provider_calls.inc((provider, result))
        took = _since(token)
        if took is not None and result in ("succeeded", "failed", "rate_limited"):
            self.provider_duration.observe((provider,), took)

    def provider_paused(self, provider: str, seconds: float) -> None:
        self.provider_pauses.inc((provider,))

    def spent(self, tenant: str, amount: float, currency: str) -> None:
        if amount > 0:
            self.spend.inc((tenant, currency), amount)

    # -- the store -------------------------------------------------------------------------

    def store_call(self, operation: str, seconds: float, error: BaseException | None) -> None:
        self.store_duration.observe((operation,), seconds)
        if error is not None:
            self.store_errors.inc((operation,))


def _read_engine(read: Callable[[], InstanceState | None]) -> InstanceState | None:
    """``read()``, from a scrape's thread while the event loop changes what it reads: a dict
    changed during the read makes it try again (a few times, then give up this scrape)."""
    for _ in range(5):
        with contextlib.suppress(RuntimeError):
            return read()
    return None


class _InstanceCollector:
    """This instance's gauges, read at each scrape."""

    def __init__(self, metrics: PrometheusMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return [*(GaugeMetricFamily(name, doc) for name, doc, _ in _INSTANCE),
                GaugeMetricFamily("shoal_runs_reporting_progress", ""),
                GaugeMetricFamily("shoal_run_progress_ratio", "")]

    def collect(self) -> Iterator[Metric]:
        read = self._metrics._instance
        state = _read_engine(read) if read is not None else None
        if state is None:
            return
        for name, doc, value in _INSTANCE:
            got = value(state)
            if got is not None:
                yield GaugeMetricFamily(name, doc, value=float(got))
        reporting = GaugeMetricFamily(
            "shoal_runs_reporting_progress", "Runs executing here that reported a fraction "
            "with ctx.progress, by workflow.", labels=["workflow"])
        mean = GaugeMetricFamily(
            "shoal_run_progress_ratio", "The mean of the latest fractions (0 to 1) those runs "
            "reported, by workflow.", labels=["workflow"])
        for workflow, (n, total) in sorted(state.progress.items()):
            reporting.add_metric([workflow], n)
            mean.add_metric([workflow], total / n)
        yield reporting
        yield mean


_INSTANCE: list[tuple[str, str, Callable[[InstanceState], float | None]]] = [
    ("shoal_runs_executing", "Executions alive on this instance, each holding a slot.",
     lambda s: s.executing),
    ("shoal_run_slots_free", "Slots of this instance free for a claim now.",
     lambda s: s.free_slots),
    ("shoal_run_slots", "Runs this instance executes at once at most (max_concurrent_runs).",
     lambda s: s.slots),
    ("shoal_membership_assigned", "1 while this replica holds a membership assignment (owns "
     "its share of app.slots), else 0.",
     lambda s: None if s.assigned is None else float(s.assigned)),
    ("shoal_membership_members", "Replicas in this replica's membership assignment.",
     lambda s: s.members),
]


class _StoreCollector:
    """The store's gauges, exported only by the sampling replica while its sample is fresh;
    ``shoal_stats_sampler`` by every replica (1 on the sampler)."""

    NAMES = ("shoal_stats_sampler", "shoal_runs", "shoal_queued_runs",
             "shoal_oldest_due_age_seconds", "shoal_pending_approvals", "shoal_outbox_backlog",
             "shoal_outbox_dead_letters", "shoal_provider_breaker_state",
             "shoal_provider_paused", "shoal_held_back_runs")

    def __init__(self, metrics: PrometheusMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(name, name) for name in self.NAMES]

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        if m._sampling is None:
            return
        sample = m.fresh_sample()
        yield GaugeMetricFamily("shoal_stats_sampler", "1 on the replica that samples the "
                                "store's gauges (slot 0 of app.slots(1)), else 0.",
                                value=1.0 if sample is not None else 0.0)
        if sample is not None:
            yield from _store_gauges(sample)


def _store_gauges(sample: StoreSample) -> Iterator[Metric]:
    stats = sample.stats
    runs = GaugeMetricFamily("shoal_runs", "Runs of the namespace in the store, by workflow "
                             "and status (final ones until retention prunes them).",
                             labels=["workflow", "status"])
    for workflow, counts in sorted(stats.by_workflow.items()):
        for status, n in sorted(counts.items()):
            runs.add_metric([workflow, status], n)
    yield runs
    queued = GaugeMetricFamily("shoal_queued_runs", "Queued runs per tenant: due now, "
                               "delayed (due later), held (by admission control).",
                               labels=["tenant", "state"])
    for tenant, depth in sorted(stats.queued.items()):
        for state in ("due", "delayed", "held"):
            queued.add_metric([tenant, state], getattr(depth, state))
    yield queued
    held = GaugeMetricFamily("shoal_held_back_runs", "Due queued runs a flow-control rule "
                             "holds back now, by workflow and rule (paused, max_running, "
                             "max_running_per_tenant, rate_limit, concurrency_limit), each "
                             "counted under the first rule that holds it.",
                             labels=["workflow", "reason"])
    for workflow, reasons in sorted(stats.held_back.items()):
        for reason, n in sorted(reasons.items()):
            held.add_metric([workflow, reason], n)
    yield held
    if stats.oldest_due_age is not None:
        yield GaugeMetricFamily("shoal_oldest_due_age_seconds", "How long the run waiting "
                                "longest for a worker has been due (absent: none is due).",
                                value=max(0.0, stats.oldest_due_age))
    yield GaugeMetricFamily("shoal_pending_approvals", "Pauses waiting for a decision.",
                            value=stats.pending_pauses)
    yield GaugeMetricFamily("shoal_outbox_backlog", "Outbox entries still to deliver.",
                            value=stats.outbox_backlog)
    yield GaugeMetricFamily("shoal_outbox_dead_letters", "Dead-lettered outbox entries.",
                            value=stats.dead_letters)
    breakers = GaugeMetricFamily("shoal_provider_breaker_state", "1 for the state each "
                                 "provider's circuit breaker is in (closed, open, half-open).",
                                 labels=["provider", "state"])
    for provider, state in sorted(sample.breakers.items()):
        for one in ("closed", "open", "half-open"):
            breakers.add_metric([provider, one], 1.0 if one == state else 0.0)
    yield breakers
    paused = GaugeMetricFamily("shoal_provider_paused", "1 while a 429 pauses the provider "
                               "for every replica.", labels=["provider"])
    for provider, on in sorted(sample.paused.items()):
        paused.add_metric([provider], 1.0 if on else 0.0)
    yield paused
