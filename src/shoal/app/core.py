"""``shoal.App``: the public face. It wires a store, a clock and an engine together."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import math
import os
import signal as signals
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypeVar,
    Unpack,
    cast,
    overload,
)

from shoal import _checks, _ids, _json, logs
from shoal._checks import CALL, CONFIG
from shoal.abort import AbortSignal
from shoal.app import probes
from shoal.app.host import Host
from shoal.app.metrics import AppMetrics, metrics_sink
from shoal.app.options import (
    CONCURRENCY_ENV,
    MAX_BATCH_BYTES,
    AppConfig,
    DispatchItem,
    DispatchKeywords,
    DispatchOptions,
    batch_items,
    check_workflow_options,
    concurrency_setting,
    tracing_sink,
)
from shoal.clock import Clock
from shoal.coord.lock import LockManager, LockRequest, lock_keys
from shoal.coord.membership import Listener, Membership
from shoal.coord.provider import (
    Aimd,
    Breaker,
    Budgets,
    Ledger,
    Provider,
    Spender,
    check_provider_options,
)
from shoal.engine import values
from shoal.engine.context import RunContext
from shoal.engine.cron import CronTrigger
from shoal.engine.runner import (
    Engine,
    ErrorHandler,
    OutboxHandlerSpec,
    PauseHandler,
    Registry,
    WorkflowOptions,
    WorkflowSpec,
)
from shoal.engine.values import Codec, WorkflowTypes
from shoal.errors import (
    ConfigurationError,
    NotDeadError,
    NotPausedError,
    NotRetryableError,
    RunCancelledError,
    RunFailedError,
    ShoalError,
    UnknownOutboxEntryError,
    UnknownPauseError,
    UnknownRunError,
    UnknownWorkflowError,
)
from shoal.health import Health, HealthStatus, readiness
from shoal.maintenance import Maintenance
from shoal.maintenance.retention import PRUNE_BATCH
from shoal.ports import CoordStore, RateStore, Store, TransactionalDispatch
from shoal.scope import RunScope
from shoal.stores import mask_url, open_coordination, open_store
from shoal.telemetry import NOTHING, Telemetry, combine, overrides
from shoal.telemetry.store import measured
from shoal.types import (
    CoordinationView,
    NewRun,
    OutboxEntry,
    Pause,
    PausedWorkflow,
    Rate,
    Run,
    RunStatus,
    SpendEntry,
    Stats,
)

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider
    from prometheus_client import CollectorRegistry

    from shoal.telemetry.metrics import PrometheusMetrics
    from shoal.telemetry.tracing import Tracing

log = logging.getLogger("shoal")

P = ParamSpec("P")
R = TypeVar("R")
I = TypeVar("I")   # noqa: E741 (an input type, beside O)
O = TypeVar("O")   # noqa: E741
In = TypeVar("In", contravariant=True)
Out = TypeVar("Out", covariant=True)
SinkT = TypeVar("SinkT", bound=Telemetry)
WorkflowFunction = Callable[[RunContext, Any], Awaitable[Any]]
KeyFn = Callable[[Any], "str | None"]


def _check_workflow_signature(fn: Callable[..., Any], name: str) -> None:
    """Refuse a workflow function that cannot be called as ``fn(ctx, input)``, as every
    attempt calls it: refused here, it does not fail every attempt of every run."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):   # no signature to read (a builtin): the call will tell
        return
    try:
        signature.bind(None, None)
    except TypeError:
        fn_name = getattr(fn, "__name__", "fn")
        empty = inspect.Parameter.empty
        bare = signature.replace(   # its parameters as written, without their annotations
            parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
            return_annotation=empty)
        raise ConfigurationError(
            f"Workflow {name!r} is 'async def {fn_name}{bare}', but a workflow function is "
            f"called with two arguments, the run's context and its input: define it as "
            f"'async def {fn_name}(ctx, input)' (a workflow dispatched without an input gets "
            f"None: annotate it 'input: None').") from None


class Workflow(Generic[In, Out]):
    """A registered workflow: ``@app.workflow`` on ``async def fn(ctx, input: In) -> Out`` makes
    a ``Workflow[In, Out]``. Pass it (or its name) to ``app.dispatch``: a type checker then
    checks the input against ``In``, and ``await app.result(run)`` is an ``Out``."""

    def __init__(self, spec: WorkflowSpec) -> None:
        self.spec = spec
        self.name = spec.name

    @property
    def types(self) -> WorkflowTypes:
        """The codecs of its input and output (pydantic models, dataclasses)."""
        return self.spec.types

    async def __call__(self, ctx: RunContext, input: In) -> Out:
        return cast(Out, await self.spec.fn(ctx, input))

    def __repr__(self) -> str:
        return f"<shoal.Workflow {self.name!r}>"


class WorkflowDecorator(Protocol):
    """What ``@app.workflow(name=..., ...)`` returns: it makes a ``Workflow[In, Out]`` of
    ``async def fn(ctx, input: In) -> Out``."""

    def __call__(self, fn: Callable[[RunContext, I], Awaitable[O]], /) -> Workflow[I, O]: ...


class CronDecorator(Protocol):
    """What ``@app.cron(...)`` returns: it fires a workflow (or makes one of a function)."""

    @overload
    def __call__(self, target: Workflow[I, O], /) -> Workflow[I, O]: ...

    @overload
    def __call__(self, target: Callable[[RunContext, I], Awaitable[O]], /) -> Workflow[I, O]: ...


_T = TypeVar("_T")


def _defaults(stored: dict[str, Any]) -> tuple[int, int]:
    """The priority and max_attempts a run of a workflow takes when its dispatch gives none,
    from the workflow's stored options (``WorkflowOptions.stored``; empty: the defaults)."""
    return int(stored.get("priority", 0)), int(stored.get("max_attempts", 3))


def _about_item(e: Exception, i: int) -> Exception:
    """An error about one item of ``dispatch_many`` says which: a bad value is raised again
    with the item's position in its message, anything else carries it as a note."""
    if type(e) in (TypeError, ValueError, ConfigurationError):
        return type(e)(f"dispatch_many: item {i}: {e}")
    e.add_note(f"raised for item {i} of app.dispatch_many")
    return e


class _Setting(Generic[_T]):
    """An attribute of the App that is one of its validated configuration's (``App._config``,
    an :class:`~shoal.app.options.AppConfig`). The App keeps each value in its own
    ``__dict__`` too, so a read is a plain attribute's (a descriptor's ``__get__`` cost a
    tenth of a microsecond a read, on the dispatch path). Setting it, as ``shoal worker
    --concurrency`` does before the app starts, replaces that configuration with one
    validated again (``App.__setattr__``); what the engine and the services run by is made
    from it at ``start()``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, app: None, owner: type) -> _Setting[_T]: ...

    @overload
    def __get__(self, app: App, owner: type) -> _T: ...

    def __get__(self, app: App | None, owner: type) -> _T | _Setting[_T]:
        if app is None:
            return self
        return cast(_T, getattr(app._config, self._name))

    if TYPE_CHECKING:   # at run time App.__setattr__ sets it: a read stays a plain one
        def __set__(self, app: App, value: _T) -> None: ...


_SETTINGS: frozenset[str] = frozenset()   # the names of App's _Setting attributes (below)


class App:
    """One instance (replica) of a service's durable runs, over a shared store."""

    _config: AppConfig   # every setting below, validated (see _adopt)

    # the options of App(...), validated, defaults resolved (lease a float, the heartbeat,
    # the instance id, the clock): see AppConfig
    namespace: _Setting[str] = _Setting()
    coordination: _Setting[str | list[str] | CoordStore | None] = _Setting()
    instance_id: _Setting[str] = _Setting()
    max_concurrent_runs: _Setting[int] = _Setting()
    lease: _Setting[float] = _Setting()
    heartbeat: _Setting[float] = _Setting()
    max_payload_bytes: _Setting[int] = _Setting()
    clock: _Setting[Clock] = _Setting()
    version: _Setting[str | None] = _Setting()
    max_queued: _Setting[int | None] = _Setting()
    admission: _Setting[Literal["reject", "park"]] = _Setting()
    membership_interval: _Setting[float] = _Setting()
    pause_retention: _Setting[float] = _Setting()
    run_retention: _Setting[float] = _Setting()
    migrate: _Setting[bool] = _Setting()
    health_port: _Setting[int | None] = _Setting()
    health_host: _Setting[str] = _Setting()

    def _adopt(self, config: AppConfig) -> None:
        """Run by ``config``: kept whole, and each setting as a plain attribute."""
        values = self.__dict__
        values["_config"] = config
        for name in _SETTINGS:
            values[name] = getattr(config, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SETTINGS:   # validated again, with every other setting
            self._adopt(self._config.replace(**{name: value}))
        else:
            object.__setattr__(self, name, value)

    def __init__(
        self,
        namespace: str,
        store: str | Store = "sqlite:///shoal.db",
        coordination: str | list[str] | CoordStore | None = None,
        instance_id: str | None = None,
        max_concurrent_runs: int = 4,
        lease: float = 30.0,
        clock: Clock | None = None,
        version: str | None = None,
        max_queued: int | None = None,
        admission: Literal["reject", "park"] = "reject",
        membership_interval: float = 5.0,
        pause_retention: float = 86400.0,
        run_retention: float = 7 * 86400.0,
        heartbeat: float | None = None,
        migrate: bool = True,
        max_payload_bytes: int = _json.MAX_PAYLOAD_BYTES,
        health_port: int | None = None,
        health_host: str = "0.0.0.0",
        metrics: bool | CollectorRegistry | PrometheusMetrics = False,
        tracing: bool | TracerProvider = False,
    ) -> None:
        config = AppConfig.of(
            namespace=namespace, store=store, coordination=coordination,
            instance_id=instance_id, max_concurrent_runs=max_concurrent_runs, lease=lease,
            clock=clock, version=version, max_queued=max_queued, admission=admission,
            membership_interval=membership_interval, pause_retention=pause_retention,
            run_retention=run_retention, heartbeat=heartbeat, migrate=migrate,
            max_payload_bytes=max_payload_bytes, health_port=health_port,
            health_host=health_host)
        self._adopt(config)
        self.store: Store = open_store(store) if isinstance(store, str) else store
        # A store passed in as an object may be shared by several apps: its owner closes it.
        self._owns_store = isinstance(store, str)
        # None: the run store coordinates; else Redis (one address, or a Redlock quorum)
        self._coord_store: CoordStore | None = open_coordination(coordination)
        self._coord_opened = False
        self._probes: asyncio.Server | None = None
        self._registry = Registry()   # workflows, handlers, crons: what the engine serves
        # the codecs of workflows dispatched here as a Workflow but registered elsewhere
        self._dispatched: dict[str, WorkflowTypes] = {}
        self._engine: Engine | None = None
        self._maintenance: Maintenance | None = None
        self._locks = LockManager(self._coord, config.clock, namespace, config.instance_id,
                                  config.lease, self._registry.observers)
        self._membership: Membership | None = None
        self._rate_store: RateStore | None = None
        self._ledger = Ledger(self._rates, config.clock, namespace)
        self._providers: dict[str, Provider] = {}
        # what metrics, traces (and a user's own sink) are told: see shoal.telemetry
        self._sinks: list[Telemetry] = []
        self.telemetry: Telemetry = NOTHING
        # what the app, its engine and its services call: the stores themselves, or wrappers
        # timing each call once a sink wants store calls (see instrument)
        self._calls: Store = self.store
        self._coord_calls: CoordStore | None = self._coord_store
        # protocol -> (the object last checked, whether it implements it): see _implements
        self._protocol_checks: dict[type, tuple[object, bool]] = {}
        # Prometheus metrics (docs/observability.md): a sink fed like any other, and what a
        # started app's scrapes read of its engine and its store
        self.metrics: PrometheusMetrics | None = metrics_sink(metrics)
        self._app_metrics: AppMetrics | None = None
        self._opened = False
        self._started = False
        self._stopping = False
        if self.metrics is not None:
            self.instrument(self.metrics)
        # the OpenTelemetry sink of App(tracing=...) (or of `shoal worker --tracing`), if any
        self.tracing: Tracing | None = tracing_sink(tracing)
        if self.tracing is not None:
            self.instrument(self.tracing)

    def __repr__(self) -> str:
        return (f"<shoal.App {self.namespace!r} instance={self.instance_id!r} "
                f"store={mask_url(self.store.url)!r}>")

    @classmethod
    def from_env(cls, namespace: str | None = None, **kwargs: Any) -> App:
        """An App from ``SHOAL_STORE``, ``SHOAL_COORDINATION``, ``SHOAL_INSTANCE_ID`` (and
        ``SHOAL_NAMESPACE`` when ``namespace`` is not given); ``SHOAL_MAX_CONCURRENT_RUNS``, when
        set, overrides ``max_concurrent_runs`` (a deployment's setting, like the store)."""
        env = os.environ
        concurrency = env.get(CONCURRENCY_ENV, "").strip()
        if concurrency:
            kwargs["max_concurrent_runs"] = concurrency_setting(concurrency, CONCURRENCY_ENV)
        coordination: str | list[str] | None = env.get("SHOAL_COORDINATION") or None
        if isinstance(coordination, str) and "," in coordination:
            coordination = [a.strip() for a in coordination.split(",") if a.strip()]
        return cls(
            namespace or env.get("SHOAL_NAMESPACE", "default"),
            store=env.get("SHOAL_STORE", "sqlite:///shoal.db"),
            coordination=coordination,
            instance_id=env.get("SHOAL_INSTANCE_ID") or None,
            **kwargs,
        )

    # -- registration ----------------------------------------------------------------------

    @overload
    def workflow(self, fn: Callable[[RunContext, I], Awaitable[O]], /) -> Workflow[I, O]: ...

    @overload
    def workflow(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        max_attempts: int = 3,
        priority: int = 0,
        concurrency_key: str | KeyFn | None = None,
        backoff: float = 1.0,
        max_backoff: float = 300.0,
        on_incompatible: Literal["wait", "resume"] = "wait",
        concurrency_limit: int = 1,
        max_running: int | None = None,
        max_running_per_tenant: int | None = None,
        rate_limit: Rate | None = None,
        fairness: Literal["tenant"] | None = None,
    ) -> WorkflowDecorator: ...

    def workflow(
        self,
        fn: WorkflowFunction | None = None,
        /,
        *,
        name: str | None = None,
        max_attempts: int = 3,
        priority: int = 0,
        concurrency_key: str | KeyFn | None = None,
        backoff: float = 1.0,
        max_backoff: float = 300.0,
        on_incompatible: Literal["wait", "resume"] = "wait",
        concurrency_limit: int = 1,
        max_running: int | None = None,
        max_running_per_tenant: int | None = None,
        rate_limit: Rate | None = None,
        fairness: Literal["tenant"] | None = None,
    ) -> Workflow[Any, Any] | WorkflowDecorator:
        """Register an ``async def fn(ctx, input)`` as a workflow. ``max_attempts`` counts failed
        attempts (an exception, or a crash of the executing instance); retries wait
        ``backoff * 2**(attempt-1)`` seconds (at most ``max_backoff``) times a jitter in
        [0.5, 1]. With a ``concurrency_key``, ``concurrency_limit`` runs of one key may have
        started and not ended at once (the store enforces it in the claim). ``max_running``
        and ``max_running_per_tenant`` cap the workflow's runs in ``running`` (of one tenant),
        every replica together; ``rate_limit=shoal.Rate(limit, per=seconds, key=None)`` caps
        its first starts per window; ``fairness="tenant"`` makes tenants with due runs take
        turns (``set_tenant_weight``). See docs/flow-control.md."""

        def register(f: WorkflowFunction) -> Workflow[Any, Any]:
            if isinstance(f, Workflow):
                raise ConfigurationError(
                    f"{f!r} is already a workflow: put @app.workflow directly above the "
                    f"function, and decorators such as @app.cron above @app.workflow.")
            if not inspect.iscoroutinefunction(f):
                raise ConfigurationError(
                    f"Workflow {getattr(f, '__name__', f)!r} must be an async function "
                    f"'async def {getattr(f, '__name__', 'fn')}(ctx, input)'.")
            wf_name = f.__name__ if name is None else name
            options = WorkflowOptions(
                max_attempts=max_attempts, priority=priority, concurrency_key=concurrency_key,
                backoff=backoff, max_backoff=max_backoff, on_incompatible=on_incompatible,
                concurrency_limit=concurrency_limit, max_running=max_running,
                max_running_per_tenant=max_running_per_tenant, rate_limit=rate_limit,
                fairness=fairness)
            check_workflow_options(wf_name, options)
            _check_workflow_signature(f, wf_name)
            if wf_name in self._registry.workflows:
                raise ConfigurationError(f"A workflow named {wf_name!r} is already registered.")
            spec = WorkflowSpec(wf_name, f, options)
            unresolved = spec.types.unresolved(wf_name)
            if unresolved is not None:
                raise ConfigurationError(unresolved[0].upper() + unresolved[1:])
            self._registry.workflows[wf_name] = spec
            return Workflow(spec)

        if fn is not None:
            return register(fn)
        return cast(WorkflowDecorator, register)

    def cron(
        self,
        expression: str,
        *,
        name: str | None = None,
        tz: str = "UTC",
        catch_up: float = 60.0,
    ) -> CronDecorator:
        """Fire the workflow on a cron schedule: each tick starts exactly one run across all
        instances, with input ``{"cron": name, "scheduled_at": tick}``. ``expression`` has five
        fields (or six, seconds last) read in time zone ``tz``. A tick missed by more than
        ``catch_up`` seconds because every instance was down is skipped; within it, the latest
        missed tick fires once. Put it above ``@app.workflow`` (or on a bare async function)."""

        def register(target: Workflow[Any, Any] | WorkflowFunction) -> Workflow[Any, Any]:
            wf_name = target.name if isinstance(target, Workflow) else getattr(
                target, "__name__", None)
            if not isinstance(wf_name, str):
                raise ConfigurationError(f"@app.cron decorates a workflow or an async "
                                         f"function, not {target!r:.80}.")
            trigger_name = wf_name if name is None else name
            # everything is checked before anything is registered
            trigger = CronTrigger.parse(expression, name=trigger_name, workflow=wf_name, tz=tz,
                                        catch_up=catch_up)
            if trigger_name in self._registry.crons:
                raise ConfigurationError(
                    f"A cron trigger named {trigger_name!r} is already registered.")
            wf = target if isinstance(target, Workflow) else self.workflow(target)
            self._registry.crons[trigger_name] = trigger
            return wf

        return cast(CronDecorator, register)

    async def _fire_cron(self, trigger: CronTrigger, tick: float) -> None:
        # no trace continues into a tick's run: whatever span the poll runs under is not its
        await self._dispatch(trigger.workflow, {"cron": trigger.name, "scheduled_at": tick},
                             DispatchOptions(idempotency_key=trigger.idempotency_key(tick)),
                             traced=False)

    def outbox_handler(
        self, topic: str, *, max_deliveries: int = 10
    ) -> Callable[[Callable[[Any, str], Any]], Callable[[Any, str], Any]]:
        """Register ``fn(payload, key)`` (sync or async) to deliver the outbox entries of
        ``topic``. ``key`` is stable per entry: use it as the idempotency key downstream, since
        a delivery that fails (or whose instance dies) is tried again, with backoff, up to
        ``max_deliveries`` times; then the entry is dead-lettered (``app.dead_letters()``)."""
        _checks.text(topic, "@app.outbox_handler(topic)", CONFIG)
        _checks.integer(max_deliveries, f"@app.outbox_handler({topic!r}, max_deliveries)",
                        CONFIG, low=1)
        if topic in self._registry.outbox_handlers:
            raise ConfigurationError(f"An outbox handler for {topic!r} is already registered.")

        def register(fn: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
            if not callable(fn):
                raise ConfigurationError(f"@app.outbox_handler({topic!r}) decorates a function "
                                         f"fn(payload, key), not {fn!r:.80}.")
            self._registry.outbox_handlers[topic] = OutboxHandlerSpec(fn, max_deliveries)
            return fn

        return register

    async def dead_letters(self, limit: int = 100) -> list[OutboxEntry]:
        """Outbox entries of this namespace that failed ``max_deliveries`` times."""
        await self._open_store()
        return await self._calls.dead_letters(self.namespace, limit)

    async def redrive(self, entry_id: str) -> OutboxEntry:
        """Make dead-lettered outbox entry ``entry_id`` of this namespace deliverable again: due
        now, its delivery attempts counted from 0. Raises ``UnknownOutboxEntryError`` for an
        unknown id (or another namespace's) and ``NotDeadError`` for an entry that is not
        dead (delivered, still being tried, or redriven already: of two racing calls, one
        wins); nothing changes then."""
        _checks.text(entry_id, "app.redrive(entry_id)", CALL)
        await self._open_store()
        entry, redriven = await self._calls.redrive(self.namespace, entry_id, self.clock.now())
        if entry is None:
            raise UnknownOutboxEntryError(
                f"No outbox entry with id {entry_id!r} in namespace {self.namespace!r}; "
                f"'shoal outbox dead' lists the dead-lettered ones.")
        if not redriven:
            state = "delivered" if entry.delivered_at is not None else "still to deliver"
            raise NotDeadError(f"Outbox entry {entry_id} ({entry.topic!r} of run "
                               f"{entry.run_id}) is not dead-lettered: it is {state}. Nothing "
                               f"was changed.")
        if self._engine is not None:
            self._engine.kick()
        return entry

    def instrument(self, sink: SinkT) -> SinkT:
        """Add a telemetry sink: a :class:`shoal.telemetry.Telemetry` subclass whose hooks
        (run claimed, attempt started and ended, step, delivery, lock wait, provider call...)
        feed metrics or traces of your own. Add it before ``start()``; a sink that raises is
        logged once and ignored. Returns the sink."""
        if not isinstance(sink, Telemetry):
            raise TypeError(f"app.instrument(sink): a shoal.telemetry.Telemetry, not "
                            f"{type(sink).__name__}.")
        if self._started:
            raise ConfigurationError("app.instrument(sink): add telemetry sinks before "
                                     "app.start(); this app has started.")
        self._sinks.append(sink)
        self.telemetry = telemetry = combine(self._sinks)
        # Everything that reports to telemetry gets it now (all is made before start): the
        # stores, timed only if a sink times store calls; locks, the ledger, the providers.
        timed = overrides(telemetry, "store_call")
        self._calls = measured(self.store, telemetry) if timed else self.store
        coord = self._coord_store
        self._coord_calls = measured(coord, telemetry) if timed and coord is not None else coord
        self._rate_store = None
        self._locks.telemetry = self._ledger.telemetry = telemetry
        for provider in self._providers.values():
            provider.telemetry = telemetry
        return sink

    def observe(self, observer: Any) -> Any:
        """Add an observer: any object with some of ``on_run_start(run)``,
        ``on_run_resume(run, reason)`` (reason ``dispatched`` for a retry, ``woke``, ``resumed``,
        ``recovered``, or ``retried`` after ``app.retry``), ``on_run_pause(run)`` and
        ``on_run_end(run)``, sync or async, called on the instance executing the run. An
        observer that raises is logged and ignored. Returns the observer."""
        self._registry.observers.append(observer)
        return observer

    def on_pause_notify(self, fn: PauseHandler) -> PauseHandler:
        """Call ``fn(pause)`` (sync or async) for each new pause, on whichever instance takes
        it; the poll sends it again until ``fn`` returns without raising. Returns ``fn``."""
        self._registry.on_pause_notify.append(fn)
        return fn

    def on_error(self, fn: ErrorHandler) -> ErrorHandler:
        """Call ``fn(error)`` (sync or async) for errors that reach no caller: a lost lease
        (``LeaseLostError``), a failed poll. Returns ``fn`` (usable as a decorator)."""
        self._registry.on_error.append(fn)
        return fn

    # -- lifecycle -------------------------------------------------------------------------

    async def _open_store(self) -> None:
        if not self._opened:
            # a Store written before open(migrate=...) existed still opens with the default
            await (self.store.open() if self.migrate else self.store.open(migrate=False))
            self._opened = True
        if self._coord_store is not None and not self._coord_opened:
            # never raises for an unreachable Redis: its connections are made when used
            await self._coord_store.open()
            self._coord_opened = True

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[App]:
        """Connect only and run nothing: for a process that dispatches, signals and reads."""
        await self._open_store()
        try:
            yield self
        finally:
            if not self._started:
                await self._close_store()

    async def start(self) -> None:
        """Migrate if needed (unless ``migrate=False``: then a schema behind is refused),
        record this instance's workflows, then poll, schedule, recover. With ``health_port``,
        serve the probes from then until :meth:`close` returns (``ConfigurationError`` when
        the port cannot be listened on). The records shoal logs from the tasks started here
        carry this instance's id (``shoal.logs``)."""
        if self._started:
            return
        logs.install_filter()
        with logs.instance_scope(self.instance_id):
            await self._open_store()
            await self._calls.register_workflows(
                self.namespace,
                {name: spec.options.stored() for name, spec in self._registry.workflows.items()},
                self.clock.now(), instance=self.instance_id)
            await self._serve_probes()
            try:
                self._start_services()
            except BaseException:
                await self._stop_probes()
                raise
        log.info("app.started: %r", self,
                 extra={"event": "app.started", "instance": self.instance_id})

    def _start_services(self) -> None:
        """The engine, the maintenance services and the membership, started."""
        host = Host(self._dispatch_child, self._spend)
        self._engine = engine = Engine(self._calls, self.clock, self._config.engine(),
                                       self._registry, host, self.telemetry)
        self._maintenance = host.maintenance = Maintenance.build(
            engine, self._calls, self.clock, self._config.maintenance(), self._registry,
            self._fire_cron, self._prune_coordination)
        membership = self._membership_for() if self._coordinates() else None
        engine.start()
        self._maintenance.start()
        if self.metrics is not None:
            self._app_metrics = AppMetrics(self, self.metrics, self._registry.on_error)
            self._app_metrics.start()
        if membership is not None:
            membership.start()
        else:
            log.warning("membership.unavailable: the store %s keeps no coordination and no "
                        "coordination= was given: slots() answers None", mask_url(self.store.url),
                        extra={"event": "membership.unavailable", "instance": self.instance_id})
        self._started = True

    async def close(self, timeout: float = 25.0) -> None:
        """Graceful stop: take no more runs, wait up to ``timeout`` seconds for the running ones,
        then interrupt the rest (each releases its claim at once; another instance continues
        it at its next poll). The probes answer ``stopping`` until then. Idempotent."""
        with logs.instance_scope(self.instance_id):
            if self._engine is not None:
                self._stopping = True
                engine, self._engine = self._engine, None
                maintenance, self._maintenance = self._maintenance, None
                try:
                    if self._app_metrics is not None:
                        await self._app_metrics.stop()
                        self._app_metrics = None
                    if self._membership is not None:
                        await self._membership.stop()
                    if maintenance is not None:
                        await maintenance.stop()      # the heartbeat goes on while runs drain
                    await engine.close(timeout)
                    if maintenance is not None:
                        await maintenance.stop_heartbeat()
                finally:
                    await self._stop_probes()
                    self._stopping = False
            self._started = False
            await self._close_store()

    @property
    def health_address(self) -> tuple[str, int] | None:
        """(host, port) the probes are served on while the app is started with
        ``health_port`` (the port chosen when it was 0); None otherwise."""
        if self._probes is None or not self._probes.sockets:
            return None
        host, port = self._probes.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def _serve_probes(self) -> None:
        if self.health_port is None or self._probes is not None:
            return
        where = f"{self.health_host}:{self.health_port}"
        try:
            self._probes = await probes.serve(self.health_host, self.health_port,
                                              probes.health_routes(self))
        except OSError as e:
            raise ConfigurationError(
                f"App(health_port={self.health_port}, health_host={self.health_host!r}) cannot "
                f"listen on {where}: {e}. Give a free port (0 picks one), or "
                f"health_port=None to serve no probes.") from e
        host, port = self.health_address or (self.health_host, self.health_port)
        log.info("health.serving: GET /livez and /readyz on %s:%d", host, port,
                 extra={"event": "health.serving", "instance": self.instance_id, "port": port})

    async def _stop_probes(self) -> None:
        server, self._probes = self._probes, None
        if server is not None:
            server.close()
            # bounded: from Python 3.12 it also waits for the open connections
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    async def _close_store(self) -> None:
        if self._opened:
            self._opened = False
            if self._owns_store:
                await self.store.close()
        if self._coord_opened and self._coord_store is not None:
            self._coord_opened = False
            await self._coord_store.close()

    async def __aenter__(self) -> App:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def run_forever(self, *, timeout: float = 25.0,
                    on_started: Callable[[], object] | None = None) -> None:
        """Start, serve until SIGTERM or SIGINT, then ``close(timeout)``. Blocks.
        ``on_started()`` is called once the app has started (the store reached and migrated,
        its workflows recorded), so that a command says it serves only when it does."""

        async def serve() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signals.SIGTERM, signals.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await self.start()
            if on_started is not None:
                on_started()
            try:
                await stop.wait()
            finally:
                log.info("app.stopping: %r", self,
                         extra={"event": "app.stopping", "instance": self.instance_id})
                await self.close(timeout)

        asyncio.run(serve())

    # -- coordination between replicas ---------------------------------------------------

    def _implements(self, obj: object, protocol: type) -> bool:
        """``isinstance(obj, protocol)``, checked once per object: a runtime protocol check
        reads every member's name, and retention asks at every pass."""
        found = self._protocol_checks.get(protocol)
        if found is None or found[0] is not obj:
            found = self._protocol_checks[protocol] = (obj, isinstance(obj, protocol))
        return found[1]

    def _coord(self) -> CoordStore:
        if self._coord_calls is not None:
            return self._coord_calls
        calls = self._calls
        if not self._implements(calls, CoordStore):
            raise ConfigurationError(
                f"The store {mask_url(self.store.url)!r} does not implement coordination "
                f"(shoal.ports.CoordStore): give App(coordination='redis://…') or a store "
                f"that does.")
        return cast(CoordStore, calls)

    def _coordinates(self) -> bool:
        return self._coord_store is not None or self._implements(self.store, CoordStore)

    def _membership_for(self) -> Membership:
        if self._membership is None:
            self._membership = Membership(self._coord(), self.clock, self.namespace,
                                          self.instance_id, self.membership_interval,
                                          self._registry.observers, self.version)
        return self._membership

    def lock(self, key_or_keys: str | Sequence[str]) -> LockRequest:
        """``async with app.lock(key) as lock``: hold ``key`` (or every key of a list, together)
        while no other holder in this namespace does, on any replica. Waits as long as it takes,
        in FIFO order behind the holder and earlier waiters; renewed every lease/3 while held;
        released on exit, also by an exception. ``lock.token`` is a fencing token, strictly
        increasing per key; ``lock.signal`` is set if the lock is lost while held (the body is
        not interrupted: check ``lock.signal.raise_if_aborted()`` before a step that must not
        overlap)."""
        return LockRequest(self._locks, lock_keys(key_or_keys), self._open_store)

    async def locked(self, key_or_keys: str | Sequence[str],
                     fn: Callable[[AbortSignal], Awaitable[R] | R]) -> R:
        """Hold the lock while ``fn(signal)`` runs (sync or async) and return what it returns;
        the same semantics as :meth:`lock`."""
        keys = lock_keys(key_or_keys)
        if not callable(fn):
            raise TypeError(f"app.locked(keys, fn): fn must be callable, not {fn!r}.")
        await self._open_store()
        result: R = await self._locks.locked(keys, fn)
        return result

    def slots(self, total: int) -> list[int] | None:
        """The slots out of ``total`` this replica owns now (``i, i+n, i+2n, …`` for replica i of
        n), or None while it owns none: just after start (about two membership intervals),
        during a rebalance, while the store is unreachable, or before ``start()``. Ask each time
        you need it; never keep the answer."""
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise ValueError(f"app.slots(total): total must be an int >= 1, not {total!r}.")
        if self._membership is None or not self._started:
            return None
        assignment = self._membership.assignment
        if assignment is None:
            return None
        owned = assignment.slots(total)
        return owned or None

    def on_assigned(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(shoal.Assignment(i, n) | None)`` now and on each change of this
        replica's assignment; returns a function that removes it. A listener must not raise: one
        that does leaves this replica owning nothing from then on."""
        if not callable(listener):
            raise TypeError(f"app.on_assigned(listener): listener must be callable, not "
                            f"{listener!r}.")
        if not self._coordinates():
            listener(None)          # owns nothing, ever: there is no membership to join
            return lambda: None
        return self._membership_for().on_assigned(listener)

    async def coordination_view(self, limit: int = 100) -> CoordinationView:
        """What the coordination store holds for this namespace now, read without writing
        (:meth:`shoal.ports.CoordStore.coordination_view`): the live members with their last
        heartbeat and code version, the roster behind ``slots()``, the locks held or waited
        for, and the meters in debt (at most ``limit`` of each). Raises ConfigurationError when
        the app has no coordination store, StoreUnavailableError when it cannot be reached."""
        return await self._coord().coordination_view(self.namespace, self.clock.now(), limit)

    async def meter(self, keys: Sequence[str], deltas: Sequence[float]) -> list[float]:
        """Add ``deltas[i]`` (milliseconds) to the debt of ``keys[i]``, atomically for all keys
        and across replicas, and return the new debts. A debt drains by one millisecond per
        millisecond; a delta of 0 reads. Raises StoreUnavailableError if the store is down."""
        if isinstance(keys, str):
            raise TypeError(f"app.meter(keys, deltas) takes lists, e.g. app.meter([{keys!r}], "
                            f"[1000]), not a str.")
        keys, deltas = list(keys), list(deltas)
        if not keys or len(keys) != len(deltas):
            raise ValueError(f"app.meter: keys and deltas must be non-empty lists of the same "
                             f"length ({len(keys)} keys, {len(deltas)} deltas given).")
        for key in keys:
            if not isinstance(key, str) or not key:
                raise ValueError(f"A meter key is a non-empty str, not {key!r}.")
        for delta in deltas:
            if (isinstance(delta, bool) or not isinstance(delta, (int, float))
                    or delta != delta or delta in (float("inf"), float("-inf"))):
                raise ValueError(f"A meter delta is a finite number of milliseconds, not "
                                 f"{delta!r}.")
        await self._open_store()
        charged = [float(d) for d in deltas]
        debts = await self._coord().meter(self.namespace, keys, charged, self.clock.now())
        self.telemetry.metered(keys, charged, debts)
        return debts

    # -- model providers and budgets -------------------------------------------------------

    def _rates(self) -> RateStore:
        if self._rate_store is None:    # checked once: a runtime protocol check is not free
            coord = self._coord()
            if not isinstance(coord, RateStore):
                raise ConfigurationError(
                    f"The coordination store {coord!r} keeps no rate-limit state "
                    f"(shoal.ports.RateStore): provider limits and budgets need one.")
            self._rate_store = coord
        return self._rate_store

    def provider(
        self,
        name: str,
        *,
        max_concurrent: int | None = None,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        breaker: Breaker | None = None,
        price_per_token: float | None = None,
        currency: str = "usd",
        tenant_max_concurrent: int | None = None,
        tenant_requests_per_minute: int | None = None,
        tenant_tokens_per_minute: int | None = None,
        aimd: Aimd | None = None,
    ) -> Provider:
        """A model provider's limits, shared by every replica of this app: at most
        ``max_concurrent`` calls at once, ``requests_per_minute`` and ``tokens_per_minute`` over
        any sliding minute, a 429's pause (``call.rate_limited``) and a circuit ``breaker``.
        ``price_per_token`` turns tokens into cost for the budgets. Use it as
        ``async with provider.call(tokens=…) as call``.

        ``tenant_max_concurrent``, ``tenant_requests_per_minute`` and
        ``tenant_tokens_per_minute`` cap each tenant on its own (the same caps for every tenant,
        counted over all replicas under keys that carry the tenant), on top of the
        provider-wide limits: a tenant at its cap waits without holding up other tenants.

        ``aimd`` (a :class:`shoal.Aimd`) lowers ``max_concurrent`` for every replica after a 429
        and raises it back as calls succeed."""
        check_provider_options(name, max_concurrent, requests_per_minute, tokens_per_minute,
                               breaker, price_per_token, tenant_max_concurrent,
                               tenant_requests_per_minute, tenant_tokens_per_minute,
                               currency, aimd)
        if name in self._providers:
            raise ConfigurationError(f"A provider named {name!r} is already defined; use "
                                     f"app.providers[{name!r}].")
        provider = Provider(
            name=name, rates=self._rates, clock=self.clock, namespace=self.namespace,
            instance_id=self.instance_id, ledger=self._ledger, max_concurrent=max_concurrent,
            requests_per_minute=requests_per_minute, tokens_per_minute=tokens_per_minute,
            breaker=breaker, price_per_token=price_per_token, currency=currency,
            tenant_max_concurrent=tenant_max_concurrent,
            tenant_requests_per_minute=tenant_requests_per_minute,
            tenant_tokens_per_minute=tenant_tokens_per_minute, aimd=aimd)
        provider.telemetry = self.telemetry
        self._providers[name] = provider
        return provider

    @property
    def providers(self) -> dict[str, Provider]:
        return dict(self._providers)

    @property
    def budgets(self) -> dict[str, Budgets]:
        """The spending limits set with ``app.budget``, by currency."""
        return dict(self._ledger.budgets)

    @property
    def cron_triggers(self) -> dict[str, CronTrigger]:
        """The schedules registered with ``@app.cron``, by name."""
        return dict(self._registry.crons)

    def budget(
        self,
        *,
        per_run: float | None = None,
        per_root: float | None = None,
        per_tenant_day: float | None = None,
        tenants: dict[str, float] | None = None,
        currency: str = "usd",
    ) -> Budgets:
        """Spending limits in ``currency``, checked before each provider call (its estimated
        cost is reserved under each, all or nothing) across every replica: per run, per root run
        (the whole tree of child runs), per tenant per UTC day of the app's clock (``tenants``
        sets other daily limits for named tenants). Replaces earlier budgets of the currency."""
        for option, value in (("per_run", per_run), ("per_root", per_root),
                              ("per_tenant_day", per_tenant_day),
                              *((f"tenants[{t!r}]", v) for t, v in (tenants or {}).items())):
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0):
                raise ValueError(f"app.budget({option}=…) takes None or a finite number >= 0, "
                                 f"not {value!r}.")
        budgets = Budgets(per_run, per_root, per_tenant_day, currency, dict(tenants or {}))
        self._ledger.budgets[currency] = budgets
        return budgets

    async def _prune_coordination(self, before: float) -> None:
        """Retention for coordination and rate-limit state, a bounded batch per poll (the
        ledger is kept: it is the record of what was spent)."""
        if not self._coordinates():
            return
        coord = self._coord()
        await coord.prune_coordination(self.namespace, before, PRUNE_BATCH)
        if self._implements(coord, RateStore):
            await cast(RateStore, coord).prune_rates(self.namespace, before, PRUNE_BATCH)

    async def _spend(self, run: RunScope, amount: float, currency: str) -> None:
        await self._ledger.record(Spender(run.tenant, run.run_id, run.root_id), amount,
                                  currency)

    async def spend(self, amount: float, *, tenant: str = "default",
                    currency: str = "usd") -> None:
        """Record money spent outside any run (``ctx.spend`` inside one) against the tenant's
        daily budget and in the ledger."""
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not (
                math.isfinite(amount) and amount >= 0):
            raise ValueError(f"app.spend(amount): a number >= 0 and finite, not {amount!r}.")
        await self._open_store()
        await self._ledger.record(Spender(tenant), float(amount), currency)

    async def spent(self, *, tenant: str = "default", run_id: str | None = None,
                    currency: str = "usd") -> dict[str, float]:
        """What was spent so far under each budget that applies to ``tenant`` (today) and, with
        ``run_id``, to that run and its root. Keys name the budgets."""
        await self._open_store()
        root_id = None
        if run_id is not None:
            run = await self.get_run(run_id, tenant=tenant)
            root_id = run.root_id
        return await self._ledger.spent(Spender(tenant, run_id, root_id), currency)

    async def ledger(self, *, tenant: str | None = None, root_id: str | None = None,
                     run_id: str | None = None, after: int | None = None,
                     since: float | None = None, until: float | None = None,
                     limit: int = 1000) -> list[SpendEntry]:
        """A page of this namespace's cost ledger: at most ``limit`` rows with ``id > after``,
        oldest (lowest id) first, that match every filter given (``since <= at < until``, on
        the app's clock). Read the next page with ``after=rows[-1].id``: no row is skipped or
        repeated, rows written meanwhile included. Raises ValueError for a negative limit."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"app.ledger(limit=…) takes an int >= 0, not {limit!r}.")
        if after is not None and (isinstance(after, bool) or not isinstance(after, int)):
            raise ValueError(f"app.ledger(after=…) takes None or a row's id (an int), not "
                             f"{after!r}.")
        await self._open_store()
        return await self._rates().ledger(self.namespace, tenant=tenant, root_id=root_id,
                                          limit=limit, after=after, run_id=run_id,
                                          since=since, until=until)

    # -- health ----------------------------------------------------------------------------

    def check_liveness(self) -> Health:
        """No I/O. Unhealthy while stopping or not started, or when a maintenance service
        (recovery, retention, ...) has not completed a pass for three of its intervals, or the
        heartbeat a renewal pass for three heartbeats (each waits on a store that never
        answers)."""
        if self._stopping:
            return Health(HealthStatus.UNHEALTHY, "stopping")
        if self._engine is None or self._maintenance is None:
            return Health(HealthStatus.UNHEALTHY, "not started")
        return self._maintenance.liveness()

    async def check_readiness(self) -> Health:
        """Liveness, then a ping of each store under a 2 s timeout: unhealthy without the run
        store, degraded without a separate coordination store (Redis) or while a provider's
        circuit is open."""
        async def ping_store() -> None:
            await self._open_store()
            await self.store.ping()

        coord = self._coord_store
        breakers = {p.name: p.open_until for p in self._providers.values()
                    if p.breaker is not None}
        return await readiness(self.check_liveness(), ping_store,
                               coord.ping if coord is not None else None, breakers)

    async def poll(self) -> None:
        """Renew this instance's leases and run one maintenance poll now (recover, release,
        schedule, retention; delivery and notification start in the background). The engine
        renews every ``heartbeat`` and polls every lease/3 by itself."""
        if self._maintenance is None:
            raise ShoalError("The app is not started: use 'async with app:' or await app.start().")
        with logs.instance_scope(self.instance_id):
            await self._maintenance.poll()

    # -- runs ------------------------------------------------------------------------------

    @overload
    async def dispatch(self, workflow: Workflow[I, O], input: I,
                       **options: Unpack[DispatchKeywords]) -> Run[O]: ...

    @overload
    async def dispatch(self, workflow: Workflow[None, O], input: None = None,
                       **options: Unpack[DispatchKeywords]) -> Run[O]: ...

    @overload
    async def dispatch(self, workflow: Callable[[RunContext, I], Awaitable[O]], input: I,
                       **options: Unpack[DispatchKeywords]) -> Run[O]: ...

    @overload
    async def dispatch(self, workflow: Callable[[RunContext, None], Awaitable[O]],
                       input: None = None, **options: Unpack[DispatchKeywords]) -> Run[O]: ...

    @overload
    async def dispatch(self, workflow: str, input: Any = None,
                       **options: Unpack[DispatchKeywords]) -> Run[Any]: ...

    async def dispatch(
        self,
        workflow: Workflow[Any, Any] | WorkflowFunction | str,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        priority: int | None = None,
        tenant: str = "default",
        delay: float | None = None,
        max_attempts: int | None = None,
        connection: object | None = None,
        allow_unregistered: bool = False,
    ) -> Run[Any]:
        """Store a new queued run and return it; with an ``idempotency_key`` already used for
        this (tenant, workflow), return that run instead. Raises ``TypeError`` for input that is
        not JSON (or nests deeper than 256) and for an option of the wrong type, ``ValueError``
        for input over ``max_payload_bytes`` and for an option out of range, and
        ``UnknownWorkflowError`` for a name no instance registered; nothing is stored then.
        ``allow_unregistered=True`` queues a run of such a name all the same (with the default
        priority and max_attempts unless given): it waits until a worker serving it starts.

        When the workflow's ``input`` annotation names a pydantic model or a dataclass (and
        the workflow is registered here or given as a ``Workflow``), the input is that type
        or JSON that loads as one: its JSON is stored, and a bad one raises ``ValueError``
        naming the field.

        With ``connection`` (a psycopg 3 connection to a PostgreSQL store's database, or a
        ``sqlite3`` connection to a SQLite store's file), the run is written in that
        connection's open transaction and nothing is committed: it exists, and workers are
        woken, when the caller commits; never if it rolls back. Admission counts what that
        transaction sees. The memory store, with no transaction to join, refuses it
        (``ConfigurationError``)."""
        return await self._dispatch(
            workflow, input, DispatchOptions(
                idempotency_key=idempotency_key, concurrency_key=concurrency_key,
                priority=priority, tenant=tenant, delay=delay, max_attempts=max_attempts),
            connection=connection, allow_unregistered=allow_unregistered)

    async def _dispatch_child(self, parent: Run, workflow: Any, input: Any, key: str,
                              options: dict[str, Any]) -> Run:
        allowed = {"priority", "delay", "max_attempts", "concurrency_key"}
        unknown = set(options) - allowed
        if unknown:
            raise TypeError(f"start_child got unknown options {sorted(unknown)}; it takes "
                            f"{sorted(allowed)}")
        return await self._dispatch(
            workflow, input, DispatchOptions(idempotency_key=key, tenant=parent.tenant, **options),
            parent=parent)

    async def _dispatch(
        self,
        workflow: Workflow[Any, Any] | WorkflowFunction | str,
        input: Any,
        options: DispatchOptions,
        *,
        parent: Run | None = None,
        connection: object | None = None,
        traced: bool = True,
        allow_unregistered: bool = False,
    ) -> Run:
        config = self._config
        name = self._workflow_name(workflow)
        input = self._typed_input(name, workflow, input)
        input, _, text = _json.checked_text(input, "input", config.max_payload_bytes)
        options.check()
        await self._open_store()
        joined = self._transactional(connection, "dispatch")
        spec, stored = await self._workflow_options(name, allow_unregistered, "dispatch")
        key = self._concurrency_key(name, spec, stored, input, options.concurrency_key)
        rate_key = self._rate_key(name, spec, stored, input)
        now = config.clock.now()
        new = self._new_run(
            _ids.new_id(now), name, input, text, options, key, _defaults(stored), now,
            # the span active here (a child's: its parent's start_child step) is its runs'
            self.telemetry.trace_carrier() if traced else None, parent, rate_key)
        if joined is not None:
            run, created = await joined.create_run_in(
                connection, new, max_queued=config.max_queued, admission=config.admission)
            if created:
                self.telemetry.runs_dispatched(name, 1)
            if created and options.delay and self._engine is not None:
                # not kicked: the run is not there before the caller commits, and its commit
                # wakes the workers (NOTIFY, data_version); a delayed one is due later
                self._engine.wake_at(new.run_at or now)
            return run
        run, created = await self._calls.create_run(new, max_queued=config.max_queued,
                                                    admission=config.admission)
        if created:
            self.telemetry.runs_dispatched(name, 1)
        if created and self._engine is not None:
            self._engine.kick()
            if options.delay:
                self._engine.wake_at(new.run_at or now)
        return run

    def _new_run(self, run_id: str, name: str, input: Any, text: str, options: DispatchOptions,
                 concurrency_key: str | None, defaults: tuple[int, int], now: float,
                 trace_context: str | None, parent: Run | None = None,
                 rate_key: str | None = None) -> NewRun:
        """The run a dispatch stores: its options, each one left None the workflow's
        (``defaults``: its priority and max_attempts)."""
        priority, max_attempts = defaults
        return NewRun(
            id=run_id, namespace=self._config.namespace, tenant=options.tenant, workflow=name,
            input=input, priority=priority if options.priority is None else options.priority,
            created_at=now, run_at=now + (options.delay or 0.0),
            max_attempts=options.max_attempts or max_attempts,
            concurrency_key=concurrency_key, idempotency_key=options.idempotency_key,
            version=self._config.version,
            parent_id=None if parent is None else parent.id,
            root_id=run_id if parent is None else parent.root_id, input_json=text,
            trace_context=trace_context, rate_key=rate_key)

    async def dispatch_many(
        self,
        workflow: Workflow[Any, Any] | WorkflowFunction | str,
        inputs: Iterable[Any],
        *,
        concurrency_key: str | None = None,
        priority: int | None = None,
        tenant: str = "default",
        delay: float | None = None,
        max_attempts: int | None = None,
        connection: object | None = None,
        allow_unregistered: bool = False,
    ) -> list[Run]:
        """Store a batch of runs of one workflow at once, all or nothing, and return them in
        the order of ``inputs``. Each item is an input, or a ``shoal.DispatchItem`` whose own
        options (``idempotency_key`` among them) take the place of the batch's. An item whose
        idempotency key is taken gets that run (the first item's, for a key given twice).
        Raises as ``app.dispatch`` does, naming the item ("dispatch_many: item 3: ..."), and
        ``ValueError`` for more than 10,000 items or 64 MiB of input JSON; nothing is stored
        then. Admission counts the new runs: ``"reject"`` refuses the batch unless they all
        fit, ``"park"`` holds those beyond the room.

        With ``connection``, as in ``app.dispatch``, the batch is written in that connection's
        open transaction and nothing is committed: all of it exists, and workers are woken
        (once), when the caller commits; none of it if it rolls back. ``allow_unregistered``
        as in ``app.dispatch``."""
        name = self._workflow_name(workflow)
        batch = DispatchOptions(concurrency_key=concurrency_key, priority=priority,
                                tenant=tenant, delay=delay, max_attempts=max_attempts)
        batch.check("app.dispatch_many")
        checked = self._checked_items(batch_items(inputs), batch,
                                      self._input_codec(name, workflow), name)
        await self._open_store()
        joined = self._transactional(connection, "dispatch_many")
        spec, stored = await self._workflow_options(name, allow_unregistered, "dispatch_many")
        defaults = _defaults(stored)
        now = self.clock.now()
        trace_context = self.telemetry.trace_carrier()   # the span active here: the batch's
        news = []
        for i, ((value, text, one), run_id) in enumerate(
                zip(checked, _ids.new_ids(now, len(checked)), strict=True)):
            try:
                key = self._concurrency_key(name, spec, stored, value, one.concurrency_key)
                rate_key = self._rate_key(name, spec, stored, value)
            except Exception as e:
                raise _about_item(e, i) from None
            news.append(self._new_run(run_id, name, value, text, one, key, defaults, now,
                                      trace_context, rate_key=rate_key))
        if not news:
            return []
        config = self._config
        if joined is not None:
            answered = await joined.create_runs_in(
                connection, news, max_queued=config.max_queued, admission=config.admission)
        else:
            answered = await self._calls.create_runs(
                news, max_queued=config.max_queued, admission=config.admission)
        created = [run for run, new in answered if new]
        if created:
            self.telemetry.runs_dispatched(name, len(created))
        if created and self._engine is not None:
            if joined is None:
                # not kicked for a caller's transaction: its commit wakes the workers (NOTIFY,
                # data_version), and before it the runs are not there
                self._engine.kick()
            later = [r.run_at for r in created if r.run_at is not None and r.run_at > now]
            if later:
                self._engine.wake_at(min(later))
        return [run for run, _ in answered]

    def _transactional(self, connection: object | None, call: str,
                       ) -> TransactionalDispatch | None:
        """The store, to write in ``connection``'s transaction (None without a connection);
        ``ConfigurationError`` for a store with no transaction to join."""
        if connection is None:
            return None
        calls = self._calls
        if not isinstance(calls, TransactionalDispatch):
            raise ConfigurationError(
                f"{call}(connection=...) writes the "
                f"{'run' if call == 'dispatch' else 'runs'} in your own database transaction; "
                f"the store {mask_url(self.store.url)!r} ({type(self.store).__name__}) has none "
                f"to join. Use a PostgreSQL or SQLite store, or {call} without connection=.")
        return calls

    def _checked_items(self, items: list[Any], batch: DispatchOptions, codec: Codec | None = None,
                       name: str = "") -> list[tuple[Any, str, DispatchOptions]]:
        """Each item of a batch as (its input as stored, that input's JSON text, its options
        over the batch's), after the checks of ``app.dispatch``; the first bad one raises,
        naming its position."""
        checked = []
        size = 0
        max_bytes = self._config.max_payload_bytes
        for i, item in enumerate(items):
            try:
                own = isinstance(item, DispatchItem)    # options of its own
                value = item.input if own else item
                if codec is not None:
                    value = codec.dump(value, f"the input of workflow {name!r}")
                elif values.typed_instance(value) is not None:
                    value = values.plain(value, f"the input of workflow {name!r}")
                value, n, text = _json.checked_text(value, "input", max_bytes)
                options = batch
                if own:
                    options = item.over(batch)
                    options.check("DispatchItem")
            except Exception as e:
                raise _about_item(e, i) from None
            checked.append((value, text, options))
            size += n
        if size > MAX_BATCH_BYTES:
            raise ValueError(f"app.dispatch_many was given {size} bytes of input JSON, over "
                             f"the limit of {MAX_BATCH_BYTES} bytes per call: dispatch the "
                             f"inputs in smaller chunks")
        return checked

    async def _workflow_options(self, name: str, allow_unregistered: bool = False,
                                call: str = "dispatch",
                                ) -> tuple[WorkflowSpec | None, dict[str, Any]]:
        """The workflow registered here (None when another instance registered it) and its
        dispatch options; ``UnknownWorkflowError`` when no instance of the namespace did,
        unless ``allow_unregistered`` (then no options: the defaults)."""
        if not isinstance(allow_unregistered, bool):
            raise TypeError(f"app.{call}(allow_unregistered=...) takes True or False, not "
                            f"{allow_unregistered!r}")
        spec = self._registry.workflows.get(name)
        options = spec.options.stored() if spec is not None else (
            await self._calls.get_workflow(self.namespace, name))
        if options is None:
            if allow_unregistered:
                return None, {}
            raise UnknownWorkflowError(name, self.namespace)
        return spec, options

    def _concurrency_key(self, name: str, spec: WorkflowSpec | None, options: dict[str, Any],
                         input: Any, given: str | None) -> str | None:
        """The run's concurrency key: the one given, else the workflow's (from the input)."""
        if given is not None:
            return given
        own = None if spec is None else spec.options.concurrency_key
        if callable(own):
            key = own(input)
            if key is not None:
                _checks.text(key, f"the key given by the concurrency_key function of workflow "
                             f"{name!r}", CALL, empty=True)
            return key
        if options.get("key_from_input"):
            # never start a keyed run without its key: this process lacks the function
            raise ConfigurationError(
                f"Workflow {name!r} computes its concurrency key from the input in code this "
                f"process does not have. Pass concurrency_key=... to dispatch, or register "
                f"the workflow in this app too.")
        key = options.get("concurrency_key")
        return key if isinstance(key, str) else None

    def _rate_key(self, name: str, spec: WorkflowSpec | None, options: dict[str, Any],
                  input: Any) -> str | None:
        """The key the workflow's ``rate_limit`` counts the run under: its ``Rate.key`` of the
        input (a non-empty str), '' for no key (a rate without a key function, or one that
        gave None), None for a workflow without a rate (its runs stay out of the index of
        first starts, runs_rate_starts)."""
        rate = None if spec is None else spec.options.rate_limit
        if rate is not None and rate.key is not None:
            key = rate.key(input)
            if key is None:
                return ""
            _checks.text(key, f"the key given by the rate_limit key function of workflow "
                         f"{name!r} (shoal.Rate(key=...))", CALL)
            return key
        if spec is None and options.get("rate_key_from_input"):
            # never queue a run under the wrong rate: this process lacks the function
            raise ConfigurationError(
                f"Workflow {name!r} computes its rate_limit key from the input in code this "
                f"process does not have (shoal.Rate(key=...)). Dispatch it from a process that "
                f"registers the workflow.")
        if rate is not None or (spec is None and options.get("rate_limit") is not None):
            return ""
        return None

    def _workflow_name(self, workflow: Any) -> str:
        if isinstance(workflow, Workflow):
            return workflow.name
        if isinstance(workflow, str):
            if not workflow:
                raise UnknownWorkflowError(workflow, self.namespace)
            return workflow
        for spec in self._registry.workflows.values():
            if spec.fn is workflow:
                return spec.name
        raise TypeError(f"dispatch takes a workflow registered with @app.workflow or its name, "
                        f"not {workflow!r}")

    def _types(self, name: str, workflow: object = None) -> WorkflowTypes | None:
        """The codecs of workflow ``name``: registered here, given as a ``Workflow``, or one
        dispatched here as a ``Workflow`` before."""
        if isinstance(workflow, Workflow):
            self._dispatched.setdefault(name, workflow.types)
            return workflow.types
        spec = self._registry.workflows.get(name)
        return spec.types if spec is not None else self._dispatched.get(name)

    def _input_codec(self, name: str, workflow: object) -> Codec | None:
        types = self._types(name, workflow)
        return None if types is None else types.input

    def _typed_input(self, name: str, workflow: object, input: Any) -> Any:
        """``input`` as the JSON to store (see :mod:`shoal.engine.values`): through the codec
        of the workflow's input annotation when shoal knows the workflow, else a model or
        dataclass is dumped as it is (the instance that runs it checks it)."""
        codec = self._input_codec(name, workflow)
        if codec is not None:
            return codec.dump(input, f"the input of workflow {name!r}")
        if values.typed_instance(input) is None:
            return input
        return values.plain(input, f"the input of workflow {name!r}")

    def _typed_output(self, run: Run[Any]) -> Any:
        types = self._types(run.workflow)
        codec = None if types is None else types.output
        return values.load(codec, run.output, f"the output of run {run.id}")

    async def get_run(self, run_id: str, *, tenant: str | None = None) -> Run:
        """The run; raises ``UnknownRunError`` (also when ``tenant`` is given and the run
        belongs to another tenant: one tenant cannot learn of another's runs)."""
        await self._open_store()
        run = await self._calls.get_run(run_id)
        if run is None or run.namespace != self.namespace or (
                tenant is not None and run.tenant != tenant):
            raise UnknownRunError(run_id)
        return run

    async def list_runs(
        self,
        status: RunStatus | str | None = None,
        workflow: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[Run]:
        """Runs of this namespace in creation order; page with ``after=last.id``."""
        await self._open_store()
        if status is not None:
            try:
                status = RunStatus(status)
            except ValueError:
                raise ValueError(f"Unknown status {status!r}; one of "
                                 f"{', '.join(s.value for s in RunStatus)}") from None
        return await self._calls.list_runs(
            self.namespace, status=None if status is None else status.value,
            workflow=workflow, tenant=tenant, limit=limit, after=after)

    async def stats(self) -> Stats:
        """This namespace's runs by status and workflow, queued runs per tenant (due, delayed,
        held), the age of the oldest due run, the runs that ended in the last minute, pending
        pauses and the outbox, as one read of the store at the app's clock, with the due
        queued runs each flow-control rule holds back (``held_back``: workflow -> rule -> runs,
        each count at most ``shoal.types.HELD_BACK_CAP``) and the paused workflows (``paused``).
        Cheap however many final runs the store keeps: for a console or a metrics scrape."""
        await self._open_store()
        now = self.clock.now()
        stats = await self._calls.stats(self.namespace, now)
        held = await self._calls.held_back(self.namespace, now)
        paused = await self._calls.paused_workflows(self.namespace)
        return dataclasses.replace(stats, held_back=held, paused=tuple(paused))

    async def hold_reason(self, run_id: str | Run[Any], *, tenant: str | None = None
                          ) -> str | None:
        """The flow-control rule that holds back this queued run now, a key of
        ``shoal.types.HOLD_REASONS`` (``"paused"``, ``"max_running"``,
        ``"max_running_per_tenant"``, ``"rate_limit"``, ``"concurrency_limit"``, the first that
        applies in that order); None when the run is not due and queued or no rule holds it (it
        waits for a worker). ``UnknownRunError`` as ``get_run``."""
        run = await self.get_run(run_id if isinstance(run_id, str) else run_id.id,
                                 tenant=tenant)
        return await self._calls.hold_reason(run.id, self.clock.now())

    @overload
    async def result(self, run_id: Run[O], timeout: float | None = None, *,
                     tenant: str | None = None) -> O: ...

    @overload
    async def result(self, run_id: str, timeout: float | None = None, *,
                     tenant: str | None = None) -> Any: ...

    async def result(self, run_id: Run[Any] | str, timeout: float | None = None, *,
                     tenant: str | None = None) -> Any:
        """Wait until the run (its id, or the ``Run`` itself) is final and return its output:
        the model or dataclass its workflow's return annotation names, when the workflow is
        registered here (or was dispatched here as a ``Workflow``), else the JSON the run
        keeps. Raises ``RunFailedError``, ``RunCancelledError``, or ``TimeoutError`` after
        ``timeout`` seconds (app clock)."""
        if not isinstance(run_id, str):
            run_id = run_id.id
        deadline = None if timeout is None else self.clock.now() + timeout
        while True:
            found = await self.get_run(run_id, tenant=tenant)
            if found.status == RunStatus.SUCCEEDED:
                return self._typed_output(found)
            if found.status == RunStatus.FAILED:
                raise RunFailedError(found.id, found.error)
            if found.status == RunStatus.CANCELLED:
                raise RunCancelledError(found.id)
            if deadline is not None and self.clock.now() >= deadline:
                raise TimeoutError(f"Run {run_id} is still {found.status.value} after "
                                   f"{timeout}s.")
            if self._engine is not None:
                await self._engine.wait_settled(0.05)
            else:
                await asyncio.sleep(0.05)

    async def cancel(self, run_id: str, *, tenant: str | None = None) -> Run:
        """Cancel: a queued/sleeping/waiting/interrupted run at once, a running one by its owner
        (which aborts it at its next poll, or at once when it is this instance)."""
        # of this namespace (and tenant), or UnknownRunError: nothing changed
        await self.get_run(run_id, tenant=tenant)
        run = await self._calls.cancel_run(run_id, self.clock.now())
        if run is None:
            raise UnknownRunError(run_id)
        if self._engine is not None:
            self._engine.cancel_local(run_id)    # and its tree's runs executing here
            self._engine.kick()
        return run

    async def retry(self, run_id: str, *, tenant: str | None = None) -> Run:
        """Start a ``failed`` or ``cancelled`` run again from its checkpoints, on any instance:
        its finished steps replay (they do not run again, their outbox entries are not sent
        again); a sleep, wait or approval it was in starts over; it gets a fresh attempt budget
        (attempts 0 of its ``max_attempts``) and is queued, due now, its concurrency key taken
        as a new run's is. Returns the queued run. Raises ``UnknownRunError`` (also for another
        tenant's run when ``tenant`` is given) and ``NotRetryableError`` for a run that has not
        ended or succeeded; nothing changes then. Of two racing calls, one wins."""
        if tenant is not None and not isinstance(tenant, str):
            raise TypeError(f"tenant must be a str, not {type(tenant).__name__}")
        await self._open_store()
        run, retried = await self._calls.retry_run(self.namespace, run_id, tenant,
                                                   self.clock.now())
        if run is None:
            raise UnknownRunError(run_id)
        if not retried:
            raise NotRetryableError(run_id, run.status.value)
        if self._engine is not None:
            self._engine.kick()
        return run

    # -- paused workflows ------------------------------------------------------------------

    async def pause_workflow(self, name: str | Workflow[Any, Any], tenant: str | None = None,
                             ) -> bool:
        """Pause workflow ``name`` in this namespace, for every tenant or for ``tenant`` only:
        from now on no instance starts a run of it (a due sleeping or waiting run included);
        running runs go on and dispatch still queues. The pause is stored: every replica
        holds back at once, until ``resume_workflow``. True when it was not paused so
        already. ``UnknownWorkflowError`` for a name no instance registered."""
        workflow, tenant = await self._paused_args("pause_workflow", name, tenant)
        return await self._calls.pause_workflow(self.namespace, workflow, tenant,
                                                self.clock.now())

    async def resume_workflow(self, name: str | Workflow[Any, Any], tenant: str | None = None,
                              ) -> bool:
        """Drop the pause ``pause_workflow(name, tenant)`` made (a pause of every tenant and
        one of a tenant are resumed apart): its due runs start again on any instance. True
        when it was paused so. ``UnknownWorkflowError`` for a name no instance registered."""
        workflow, tenant = await self._paused_args("resume_workflow", name, tenant)
        resumed = await self._calls.resume_workflow(self.namespace, workflow, tenant,
                                                    self.clock.now())
        if resumed and self._engine is not None:
            self._engine.kick()
        return resumed

    async def paused_workflows(self) -> list[PausedWorkflow]:
        """The pauses of this namespace, by workflow, then tenant (``tenant`` None, every
        tenant, first)."""
        await self._open_store()
        return await self._calls.paused_workflows(self.namespace)

    # -- tenant weights (fairness="tenant") --------------------------------------------------

    async def set_tenant_weight(self, tenant: str, weight: float) -> None:
        """Give ``tenant`` ``weight`` shares under ``fairness="tenant"`` in this namespace
        (default 1): where tenants take turns, one of weight 2 gets two turns for one of
        weight 1. Stored: the next claim of every replica deals by it. ``weight`` is a
        positive finite number (``TypeError``/``ValueError`` naming it otherwise)."""
        tenant = _checks.text(tenant, "app.set_tenant_weight(tenant)", CALL)
        value = _checks.finite(weight, "app.set_tenant_weight(weight)", CALL)
        if value <= 0:
            raise ValueError(f"app.set_tenant_weight(weight) must be a positive number, "
                             f"not {weight!r:.80}.")
        await self._open_store()
        await self._calls.set_tenant_weight(self.namespace, tenant, value)

    async def tenant_weights(self) -> dict[str, float]:
        """The weights ``set_tenant_weight`` stored in this namespace, by tenant (a tenant
        left out has weight 1)."""
        await self._open_store()
        return await self._calls.tenant_weights(self.namespace)

    async def _paused_args(self, call: str, name: object, tenant: object,
                           ) -> tuple[str, str | None]:
        """``name`` as a workflow this app or another instance of the namespace registered
        (else ``UnknownWorkflowError``), and ``tenant`` checked."""
        if isinstance(name, Workflow):
            name = name.name
        workflow = _checks.text(name, f"app.{call}(name)", CALL)
        if tenant is not None:
            tenant = _checks.text(tenant, f"app.{call}(tenant)", CALL)
        await self._open_store()
        if (workflow not in self._registry.workflows
                and await self._calls.get_workflow(self.namespace, workflow) is None):
            raise UnknownWorkflowError(workflow, self.namespace)
        return workflow, tenant

    # -- approvals -------------------------------------------------------------------------

    async def pending_pauses(self, tenant: str | None = None, limit: int = 100) -> list[Pause]:
        """Pauses of this namespace waiting for a decision, oldest first."""
        await self._open_store()
        return await self._calls.list_pauses(self.namespace, tenant=tenant, limit=limit)

    async def resume(
        self, pause_id: str, approved: bool = True, data: Any = None, by: str | None = None,
        *, tenant: str | None = None, reason: str | None = None,
    ) -> Pause:
        """Answer a pause; its run continues (on any instance) with this ``Decision``
        (``reason``: why, in the decider's words). Exactly one answer wins: a pause already
        answered (or expired) raises ``NotPausedError``; an unknown id, or one resolved longer
        than ``pause_retention`` ago, ``UnknownPauseError``. Nothing changes when it raises."""
        if not isinstance(approved, bool):
            raise TypeError(f"approved must be True or False, not {approved!r}")
        if by is not None:
            _checks.text(by, "app.resume(by)", CALL, empty=True)
        if reason is not None:
            _checks.text(reason, "app.resume(reason)", CALL, empty=True)
        data = _json.checked(data, "data", self.max_payload_bytes)
        await self._open_store()
        decision = {"approved": approved, "data": data, "by": by, "reason": reason}
        found = await self._calls.get_pause(pause_id)
        foreign = found is not None and tenant is not None and found.tenant != tenant
        pause, won = (None, False) if (
            found is None or found.namespace != self.namespace or foreign) else (
            await self._calls.resolve_pause(pause_id, decision, self.clock.now()))
        if pause is None:
            raise UnknownPauseError(
                f"No pause with id {pause_id!r} in namespace {self.namespace!r}. Resolved "
                f"pauses are kept {self.pause_retention:g} s (pause_retention); 'shoal pauses' "
                f"lists the pending ones.")
        if not won:
            d = pause.decision or {}
            how = "expired" if d.get("reason") == "expired" else (
                "cancelled with its run" if d.get("reason") == "cancelled" else
                f"{'approved' if d.get('approved') else 'denied'}"
                f"{' by ' + d['by'] if d.get('by') else ''}")
            raise NotPausedError(f"Pause {pause_id} ({pause.name!r} of run {pause.run_id}) was "
                                 f"already resolved: {how}. Nothing was changed.")
        if self._engine is not None:
            self._engine.kick()
        return pause

    async def signal(self, run_id: str, name: str, payload: Any = None, *,
                     tenant: str | None = None) -> None:
        """Send signal ``name`` to the run; kept until its ``ctx.wait_for(name)`` consumes it.
        A payload that is not JSON raises ``TypeError``, one over ``max_payload_bytes``
        ``ValueError``, and nothing is sent."""
        _checks.text(name, "app.signal(name)", CALL)
        payload = _json.checked(payload, "payload", self.max_payload_bytes)
        await self._open_store()
        existing = await self._calls.get_run(run_id)
        if existing is None or existing.namespace != self.namespace or (
                tenant is not None and existing.tenant != tenant):
            raise UnknownRunError(run_id)
        now = self.clock.now()
        run = await self._calls.send_signal(run_id, name, payload, _ids.new_id(now), now)
        if run is None:
            raise UnknownRunError(run_id)
        if self._engine is not None:
            self._engine.kick()


_SETTINGS = frozenset(name for name, value in vars(App).items() if isinstance(value, _Setting))
