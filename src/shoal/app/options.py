"""The options of ``App(...)``, ``@app.workflow(...)`` and ``app.dispatch(...)`` (and of the
items of ``app.dispatch_many``), each kind as one record validated in one place: each check
raises an error naming the first option that cannot work, before anything is stored.

- ``App(...)``'s keywords become one :class:`AppConfig` (:meth:`AppConfig.of`), which makes the
  engine's and the maintenance services' configurations (:meth:`AppConfig.engine`,
  :meth:`AppConfig.maintenance`); the App's attributes read it.
- ``@app.workflow(...)``'s keywords become a :class:`~shoal.engine.runner.WorkflowOptions`,
  checked by :func:`check_workflow_options`.
- ``app.dispatch(...)``'s (and a batch's, and a child's) become a :class:`DispatchOptions`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar

from shoal import _checks
from shoal._checks import CALL, CONFIG
from shoal.clock import Clock, SystemClock
from shoal.engine.runner import EngineConfig, WorkflowOptions
from shoal.errors import ConfigurationError
from shoal.maintenance import MaintenanceConfig, RetentionConfig
from shoal.ports import CoordStore, Store
from shoal.types import Rate

if TYPE_CHECKING:
    from shoal.telemetry.tracing import Tracing

# app.dispatch_many: items per call, and the JSON of their inputs together (one statement)
MAX_BATCH = 10_000
MAX_BATCH_BYTES = 64 << 20

_T = TypeVar("_T")


class DispatchKeywords(TypedDict, total=False):
    """The keyword options of ``app.dispatch`` (for its typed overloads)."""

    idempotency_key: str | None
    concurrency_key: str | None
    priority: int | None
    tenant: str
    delay: float | None
    max_attempts: int | None
    connection: object | None
    allow_unregistered: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class DispatchOptions:
    """The options of one dispatch (``app.dispatch``, a batch of ``app.dispatch_many``, a
    child's ``start_child``, a cron tick): an option left None takes the workflow's. A new
    dispatch option is a field here, its check in :meth:`check`, and a keyword of
    ``app.dispatch`` (and of :class:`DispatchKeywords`)."""

    idempotency_key: str | None = None
    concurrency_key: str | None = None
    priority: int | None = None
    tenant: str = "default"
    delay: float | None = None
    max_attempts: int | None = None

    def check(self, call: str = "app.dispatch") -> None:
        """Raise ``TypeError`` (a value of the wrong type) or ``ValueError`` naming the first
        option of ``app.dispatch(...)`` (or of ``call``) that cannot be stored as it is."""
        for what, key in (("idempotency_key", self.idempotency_key),
                          ("concurrency_key", self.concurrency_key)):
            if key is not None:
                _checks.text(key, f"{call}({what})", CALL, empty=True)
        _checks.text(self.tenant, f"{call}(tenant)", CALL)
        if self.priority is not None:
            _checks.integer(self.priority, f"{call}(priority)", CALL, low=_checks.INT32_MIN,
                            high=_checks.INT32_MAX)
        if self.delay is not None:   # ValueError, as it always was
            _checks.seconds(self.delay, f"{call}(delay)", _checks.VALUE)
        if self.max_attempts is not None:
            _checks.integer(self.max_attempts, f"{call}(max_attempts)", _checks.VALUE, low=1,
                            high=_checks.INT32_MAX)


@dataclass(frozen=True)
class DispatchItem:
    """One input of ``app.dispatch_many`` with options of its own. An option left None takes
    the batch's (and then the workflow's), as ``app.dispatch`` takes them; an
    ``idempotency_key`` is only ever an item's."""

    input: Any
    _: KW_ONLY
    idempotency_key: str | None = None
    concurrency_key: str | None = None
    priority: int | None = None
    tenant: str | None = None
    delay: float | None = None
    max_attempts: int | None = None

    def over(self, batch: DispatchOptions) -> DispatchOptions:
        """This item's options, each one it leaves None the batch's (its idempotency key is
        its own, never the batch's)."""
        return DispatchOptions(
            idempotency_key=self.idempotency_key,
            concurrency_key=_either(self.concurrency_key, batch.concurrency_key),
            priority=_either(self.priority, batch.priority),
            tenant=batch.tenant if self.tenant is None else self.tenant,
            delay=_either(self.delay, batch.delay),
            max_attempts=_either(self.max_attempts, batch.max_attempts))


def _either(item: _T | None, batch: _T | None) -> _T | None:
    return item if item is not None else batch


def batch_items(inputs: object) -> list[Any]:
    """The items of ``app.dispatch_many(workflow, inputs)`` as a list; ``TypeError`` for
    ``inputs`` that is not a list (or another iterable of items), ``ValueError`` for more than
    ``MAX_BATCH`` of them."""
    if isinstance(inputs, (str, bytes, bytearray, Mapping)) or not isinstance(inputs, Iterable):
        raise TypeError(f"app.dispatch_many takes a list of inputs (each an input or a "
                        f"shoal.DispatchItem), not {inputs!r:.80}")
    items = list(inputs)
    if len(items) > MAX_BATCH:
        raise ValueError(f"app.dispatch_many takes at most {MAX_BATCH} inputs per call, not "
                         f"{len(items)}: dispatch them in chunks, e.g. "
                         f"for i in range(0, len(inputs), {MAX_BATCH}): "
                         f"await app.dispatch_many(workflow, inputs[i:i + {MAX_BATCH}])")
    return items


def check_workflow_options(name: object, options: WorkflowOptions) -> None:
    """Raise ``ConfigurationError`` naming the first option of ``@app.workflow(...)`` that
    cannot work."""
    _checks.text(name, "@app.workflow(name)", CONFIG)
    what = f"@app.workflow(name={name!r}"
    _checks.integer(options.max_attempts, f"{what}, max_attempts)", CONFIG, low=1,
                    high=_checks.INT32_MAX)
    _checks.integer(options.priority, f"{what}, priority)", CONFIG, low=_checks.INT32_MIN,
                    high=_checks.INT32_MAX)
    concurrency_key = options.concurrency_key
    if isinstance(concurrency_key, str):
        _checks.text(concurrency_key, f"{what}, concurrency_key)", CONFIG, empty=True)
    elif concurrency_key is not None and not callable(concurrency_key):
        raise ConfigurationError(f"{what}, concurrency_key) must be None, a str or a function "
                                 f"of the input giving a str, not {concurrency_key!r:.80}.")
    _checks.integer(options.concurrency_limit, f"{what}, concurrency_limit)", CONFIG, low=1,
                    high=_checks.INT32_MAX)
    if options.concurrency_limit != 1 and concurrency_key is None:
        raise ConfigurationError(f"{what}, concurrency_limit) limits the runs of one "
                                 f"concurrency key: give the workflow a concurrency_key too.")
    for option in ("max_running", "max_running_per_tenant"):
        if (value := getattr(options, option)) is not None:
            _checks.integer(value, f"{what}, {option})", CONFIG, low=1, high=_checks.INT32_MAX)
    if options.rate_limit is not None and not isinstance(options.rate_limit, Rate):
        raise ConfigurationError(f"{what}, rate_limit) must be None or a shoal.Rate(limit, "
                                 f"per=seconds, key=None), not {options.rate_limit!r:.80}.")
    if options.fairness is not None:
        _checks.one_of(options.fairness, f"{what}, fairness)", CONFIG, ("tenant",))
    _checks.seconds(options.backoff, f"{what}, backoff)", CONFIG)
    _checks.seconds(options.max_backoff, f"{what}, max_backoff)", CONFIG)
    _checks.one_of(options.on_incompatible, f"{what}, on_incompatible)", CONFIG,
                   ("wait", "resume"))


CONCURRENCY_ENV = "SHOAL_MAX_CONCURRENT_RUNS"


def concurrency_setting(value: str, where: str) -> int:
    """``value``, text from the command line or the environment (``where`` names it), as
    ``App(max_concurrent_runs)``: a whole number >= 1, or a ``ConfigurationError`` naming
    ``where`` and the value."""
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ConfigurationError(f"{where} must be a whole number >= 1 (the runs a worker "
                                 f"executes at once, App(max_concurrent_runs)), not {value!r:.40}.")
    return int(text)


@dataclass(frozen=True, kw_only=True)
class AppConfig:
    """The validated options of one ``App(...)``, its defaults resolved (the instance id, the
    clock, the heartbeat): built once by :meth:`of` from the App's keywords, and read by the
    App's attributes of the same names. The engine's and the maintenance services' own
    configurations are made from it (:meth:`engine`, :meth:`maintenance`). A new App option
    is a keyword of ``App(...)``, a field here, its check in :meth:`of`, and (for a component
    that runs by it) a field of that component's configuration, filled in here."""

    namespace: str
    store: str | Store                 # as given: App.store is the store it opened
    coordination: str | list[str] | CoordStore | None
    instance_id: str
    max_concurrent_runs: int
    lease: float
    clock: Clock
    version: str | None
    max_queued: int | None
    admission: Literal["reject", "park"]
    membership_interval: float
    pause_retention: float
    run_retention: float
    heartbeat: float                   # between renewal passes (lease / 3 unless given)
    migrate: bool                      # False: never change the schema, refuse one behind
    max_payload_bytes: int
    health_port: int | None            # GET /livez and /readyz here while started
    health_host: str

    @classmethod
    def of(cls, *, namespace: str, store: str | Store,
           coordination: str | list[str] | CoordStore | None, instance_id: str | None,
           max_concurrent_runs: int, lease: float, clock: Clock | None, version: str | None,
           max_queued: int | None, admission: Literal["reject", "park"],
           membership_interval: float, pause_retention: float, run_retention: float,
           heartbeat: float | None, migrate: bool, max_payload_bytes: int,
           health_port: int | None, health_host: str) -> AppConfig:
        """The configuration of ``App(...)`` given these keywords; ``ConfigurationError``
        naming the first option that cannot work (``coordination`` is checked when the App
        builds its store)."""
        _checks.text(namespace, "App(namespace)", CONFIG)
        if not isinstance(store, (str, Store)):
            raise ConfigurationError(f"App(store) must be a store URL ('memory://', "
                                     f"'sqlite:///path', 'postgresql://…') or a shoal Store, "
                                     f"not {store!r:.80}.")
        if instance_id is not None:
            _checks.text(instance_id, "App(instance_id)", CONFIG)
        if version is not None:
            _checks.text(version, "App(version)", CONFIG)
        _checks.integer(max_concurrent_runs, "App(max_concurrent_runs)", CONFIG, low=1)
        _checks.seconds(lease, "App(lease)", CONFIG, low=_checks.MIN_LEASE)
        if clock is not None and not isinstance(clock, Clock):
            raise ConfigurationError(f"App(clock) must be None or a shoal Clock (with now() "
                                     f"and async sleep(seconds)), not {clock!r:.80}.")
        if max_queued is not None:
            _checks.integer(max_queued, "App(max_queued)", CONFIG, low=1)
        _checks.one_of(admission, "App(admission)", CONFIG, ("reject", "park"))
        _checks.seconds(membership_interval, "App(membership_interval)", CONFIG, above=True)
        _checks.seconds(pause_retention, "App(pause_retention)", CONFIG)
        _checks.seconds(run_retention, "App(run_retention)", CONFIG)
        _checks.integer(max_payload_bytes, "App(max_payload_bytes)", CONFIG, low=1)
        if heartbeat is not None:
            _checks.seconds(heartbeat, "App(heartbeat)", CONFIG, above=True)
            if heartbeat > lease / 2:
                raise ConfigurationError(
                    f"App(heartbeat) must be at most lease / 2 ({lease / 2:g} s, so one late "
                    f"renewal never loses a lease), not {heartbeat!r}.")
        if not isinstance(migrate, bool):
            raise ConfigurationError(f"App(migrate) must be True or False, not {migrate!r}.")
        if health_port is not None:
            _checks.integer(health_port, "App(health_port)", CONFIG, low=0, high=65535)
        _checks.text(health_host, "App(health_host)", CONFIG)
        lease = float(lease)
        return cls(
            namespace=namespace, store=store, coordination=coordination,
            instance_id=instance_id or f"{socket.gethostname()}-{os.getpid()}",
            max_concurrent_runs=max_concurrent_runs, lease=lease, clock=clock or SystemClock(),
            version=version, max_queued=max_queued, admission=admission,
            membership_interval=membership_interval, pause_retention=pause_retention,
            run_retention=run_retention,
            heartbeat=float(heartbeat) if heartbeat is not None else lease / 3,
            migrate=migrate, max_payload_bytes=max_payload_bytes, health_port=health_port,
            health_host=health_host)

    def replace(self, **changes: Any) -> AppConfig:
        """This configuration with ``changes``, validated again (``ConfigurationError``)."""
        given = {f.name: getattr(self, f.name) for f in fields(self)}
        return AppConfig.of(**(given | changes))

    def engine(self) -> EngineConfig:
        """What the engine runs by."""
        return EngineConfig(
            namespace=self.namespace, instance_id=self.instance_id,
            slots=self.max_concurrent_runs, lease=self.lease, heartbeat=self.heartbeat,
            version=self.version, max_payload_bytes=self.max_payload_bytes)

    def maintenance(self) -> MaintenanceConfig:
        """What the maintenance services run by."""
        return MaintenanceConfig(
            namespace=self.namespace, lease=self.lease, version=self.version,
            retention=RetentionConfig(run_retention=self.run_retention,
                                      pause_retention=self.pause_retention),
            max_queued=self.max_queued, coordination_in_store=self.coordination is None)


def tracing_sink(tracing: object) -> Tracing | None:
    """The sink ``App(tracing=...)`` asks for: None for False, else an OpenTelemetry
    :class:`~shoal.telemetry.tracing.Tracing` over the global tracer provider (True) or the one
    given. ``ConfigurationError`` for anything else, and when the OpenTelemetry API is not
    installed."""
    if tracing is False:
        return None
    if tracing is not True and not hasattr(tracing, "get_tracer"):
        raise ConfigurationError(f"App(tracing) must be True, False or an OpenTelemetry "
                                 f"TracerProvider, not {tracing!r:.80}.")
    # imports OpenTelemetry: only when asked
    from shoal.telemetry.tracing import Tracing

    try:
        return Tracing(None if tracing is True else tracing)  # type: ignore[arg-type]
    except TypeError as e:
        raise ConfigurationError(f"App(tracing): {e}") from None
