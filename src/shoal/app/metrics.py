"""``App(metrics=...)``: the Prometheus sink an App feeds, and, while the App runs, what its
scrapes read of the engine and of the store (see :mod:`shoal.telemetry.metrics`).

The store's gauges are sampled by one replica at a time: the one that owns slot 0 of
``app.slots(1)``. The membership behind slots already runs on every replica (no extra store
writes), and it never gives a slot to two replicas at once; while it rebalances (a replica
starts or stops) none may own it for a moment, and the gauges are absent meanwhile rather than
counted twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from shoal.clock import Clock
from shoal.coord.membership import Membership
from shoal.coord.provider import Provider
from shoal.engine.runner import Engine
from shoal.errors import ConfigurationError
from shoal.maintenance.service import Reporter, Service
from shoal.types import Stats

if TYPE_CHECKING:
    from shoal.telemetry.metrics import InstanceState, PrometheusMetrics, StoreSample


class Metered(Protocol):
    """What the metrics read of an App (``shoal.App`` is one)."""

    clock: Clock
    _engine: Engine | None
    _membership: Membership | None

    def slots(self, total: int) -> list[int] | None: ...

    async def stats(self) -> Stats: ...

    @property
    def providers(self) -> Mapping[str, Provider]: ...


def metrics_sink(option: Any) -> PrometheusMetrics | None:
    """The sink ``App(metrics=option)`` feeds: None for False/None; a new one with a registry
    of its own for True; one over the ``CollectorRegistry`` given; the ``PrometheusMetrics``
    given. ConfigurationError without the metrics extra, TypeError for anything else."""
    if option is None or option is False:
        return None
    try:
        from prometheus_client import CollectorRegistry

        from shoal.telemetry.metrics import PrometheusMetrics
    except ImportError as e:
        raise ConfigurationError(f"App(metrics=...) needs the metrics extra: pip install "
                                 f"'shoal[metrics]' ({e}).") from None
    if option is True:
        return PrometheusMetrics()
    if isinstance(option, PrometheusMetrics):
        return option
    if isinstance(option, CollectorRegistry):
        return PrometheusMetrics(option)
    raise TypeError(f"App(metrics=...) takes True, False, a prometheus_client "
                    f"CollectorRegistry or a shoal.telemetry.metrics.PrometheusMetrics, not "
                    f"{option!r:.80}.")


class StoreSampling(Service):
    """Every ``stats_interval``: if this replica is the sampler, read the store's gauges into
    the sink; else forget any sample it kept. A failed read is counted, logged and reported to
    ``app.on_error`` like a failed maintenance pass (the gauges then go absent)."""

    name = "metrics.sampling"
    failure_event = "metrics.sample_failed"

    def __init__(self, clock: Clock, reporter: Reporter, sink: PrometheusMetrics,
                 read: Callable[[], Awaitable[StoreSample]]) -> None:
        super().__init__(clock, sink.stats_interval, reporter)
        self._sink = sink
        self._read = read

    async def run_once(self) -> None:
        if not self._sink.sampling():
            self._sink.store_sampled(None)
            return
        try:
            sample = await self._read()
        except Exception:
            self._sink.sample_failures.inc(())
            raise
        self._sink.store_sampled(sample)


class AppMetrics:
    """What a started App's metrics read: its engine at each scrape, the store every
    interval while it is the sampler. Made by ``app.start()``, stopped by ``app.close()``."""

    def __init__(self, app: Metered, sink: PrometheusMetrics,
                 on_error: Sequence[Callable[[BaseException], Any]]) -> None:
        self._app = app
        self._sink = sink
        reporter = Reporter(app.clock, on_error, sink.stats_interval)
        self._sampling = StoreSampling(app.clock, reporter, sink, self.store_sample)

    def start(self) -> None:
        self._sink.bind_instance(self.instance_state)
        self._sink.bind_sampling(self.is_sampler, self._app.clock.now)
        self._sampling.start()

    async def stop(self) -> None:
        await self._sampling.stop()
        self._sink.bind_instance(None)
        self._sink.bind_sampling(None)

    def is_sampler(self) -> bool:
        """Whether this replica owns slot 0 of one: the one that samples the store."""
        return self._app.slots(1) == [0]

    def instance_state(self) -> InstanceState | None:
        from shoal.telemetry.metrics import InstanceState

        app = self._app
        engine = app._engine
        if engine is None:
            return None
        membership = app._membership
        assignment = membership.assignment if membership is not None else None
        progress: dict[str, tuple[int, float]] = {}
        for x in list(engine.executing()):
            latest = x.progress.latest if x.progress is not None else None
            if latest is not None and latest.fraction is not None:
                n, total = progress.get(x.run.workflow, (0, 0.0))
                progress[x.run.workflow] = (n + 1, total + latest.fraction)
        return InstanceState(
            executing=engine.running, free_slots=engine.free_slots, slots=engine.config.slots,
            members=assignment.n if assignment is not None else None,
            assigned=None if membership is None else assignment is not None, progress=progress)

    async def store_sample(self) -> StoreSample:
        """``app.stats()``, and each provider's breaker and 429 pause (one read each)."""
        from shoal.telemetry.metrics import StoreSample

        app = self._app
        stats = await app.stats()
        breakers: dict[str, str] = {}
        paused: dict[str, bool] = {}
        for name, provider in app.providers.items():
            state = await provider.state()
            if state.breaker is not None:
                breakers[name] = state.breaker
            paused[name] = state.paused_until is not None
        return StoreSample(stats, breakers, paused)
