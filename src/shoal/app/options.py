"""Validation of the options of ``App(...)``, ``@app.workflow(...)`` and ``app.dispatch(...)``
(and of the items of ``app.dispatch_many``): each raises an error naming the first option that
cannot work, before anything is stored."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from shoal import _checks
from shoal._checks import CALL, CONFIG
from shoal.clock import Clock
from shoal.errors import ConfigurationError
from shoal.ports import Store

if TYPE_CHECKING:
    from shoal.telemetry.tracing import Tracing

# app.dispatch_many: items per call, and the JSON of their inputs together (one statement)
MAX_BATCH = 10_000
MAX_BATCH_BYTES = 64 << 20


class DispatchOptions(TypedDict, total=False):
    """The keyword options of ``app.dispatch`` (for its typed overloads)."""

    idempotency_key: str | None
    concurrency_key: str | None
    priority: int | None
    tenant: str
    delay: float | None
    max_attempts: int | None
    connection: object | None
    allow_unregistered: bool


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


def check_dispatch_options(idempotency_key: object, concurrency_key: object, priority: object,
                           tenant: object, delay: object, max_attempts: object,
                           call: str = "app.dispatch") -> None:
    """Raise ``TypeError`` (a value of the wrong type) or ``ValueError`` naming the first
    option of ``app.dispatch(...)`` (or of ``call``) that cannot be stored as it is."""
    for what, key in (("idempotency_key", idempotency_key),
                      ("concurrency_key", concurrency_key)):
        if key is not None:
            _checks.text(key, f"{call}({what})", CALL, empty=True)
    _checks.text(tenant, f"{call}(tenant)", CALL)
    if priority is not None:
        _checks.integer(priority, f"{call}(priority)", CALL, low=_checks.INT32_MIN,
                        high=_checks.INT32_MAX)
    if delay is not None:   # ValueError, as it always was
        _checks.seconds(delay, f"{call}(delay)", _checks.VALUE)
    if max_attempts is not None:
        _checks.integer(max_attempts, f"{call}(max_attempts)", _checks.VALUE, low=1,
                        high=_checks.INT32_MAX)


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


def check_workflow_options(name: object, max_attempts: object, priority: object,
                           concurrency_key: object, backoff: object, max_backoff: object,
                           on_incompatible: object) -> None:
    """Raise ``ConfigurationError`` naming the first option of ``@app.workflow(...)`` that
    cannot work."""
    _checks.text(name, "@app.workflow(name)", CONFIG)
    what = f"@app.workflow(name={name!r}"
    _checks.integer(max_attempts, f"{what}, max_attempts)", CONFIG, low=1,
                    high=_checks.INT32_MAX)
    _checks.integer(priority, f"{what}, priority)", CONFIG, low=_checks.INT32_MIN,
                    high=_checks.INT32_MAX)
    if isinstance(concurrency_key, str):
        _checks.text(concurrency_key, f"{what}, concurrency_key)", CONFIG, empty=True)
    elif concurrency_key is not None and not callable(concurrency_key):
        raise ConfigurationError(f"{what}, concurrency_key) must be None, a str or a function "
                                 f"of the input giving a str, not {concurrency_key!r:.80}.")
    _checks.seconds(backoff, f"{what}, backoff)", CONFIG)
    _checks.seconds(max_backoff, f"{what}, max_backoff)", CONFIG)
    _checks.one_of(on_incompatible, f"{what}, on_incompatible)", CONFIG, ("wait", "resume"))


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


def check_app_options(namespace: object, store: object, instance_id: object,
                      max_concurrent_runs: object, lease: object, clock: object,
                      version: object, max_queued: object, admission: object,
                      membership_interval: object, pause_retention: object,
                      run_retention: object, max_payload_bytes: object, heartbeat: object,
                      migrate: object) -> None:
    """Raise ``ConfigurationError`` naming the first option of ``App(...)`` that cannot work."""
    _checks.text(namespace, "App(namespace)", CONFIG)
    if not isinstance(store, (str, Store)):
        raise ConfigurationError(f"App(store) must be a store URL ('memory://', "
                                 f"'sqlite:///path', 'postgresql://…') or a shoal Store, not "
                                 f"{store!r:.80}.")
    if instance_id is not None:
        _checks.text(instance_id, "App(instance_id)", CONFIG)
    if version is not None:
        _checks.text(version, "App(version)", CONFIG)
    _checks.integer(max_concurrent_runs, "App(max_concurrent_runs)", CONFIG, low=1)
    _checks.seconds(lease, "App(lease)", CONFIG, low=_checks.MIN_LEASE)
    if clock is not None and not isinstance(clock, Clock):
        raise ConfigurationError(f"App(clock) must be None or a shoal Clock (with now() and "
                                 f"async sleep(seconds)), not {clock!r:.80}.")
    if max_queued is not None:
        _checks.integer(max_queued, "App(max_queued)", CONFIG, low=1)
    _checks.one_of(admission, "App(admission)", CONFIG, ("reject", "park"))
    _checks.seconds(membership_interval, "App(membership_interval)", CONFIG, above=True)
    _checks.seconds(pause_retention, "App(pause_retention)", CONFIG)
    _checks.seconds(run_retention, "App(run_retention)", CONFIG)
    _checks.integer(max_payload_bytes, "App(max_payload_bytes)", CONFIG, low=1)
    if heartbeat is not None:
        _checks.seconds(heartbeat, "App(heartbeat)", CONFIG, above=True)
        assert isinstance(heartbeat, (int, float)) and isinstance(lease, (int, float))
        if heartbeat > lease / 2:
            raise ConfigurationError(
                f"App(heartbeat) must be at most lease / 2 ({lease / 2:g} s, so one late "
                f"renewal never loses a lease), not {heartbeat!r}.")
    if not isinstance(migrate, bool):
        raise ConfigurationError(f"App(migrate) must be True or False, not {migrate!r}.")


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
