"""The ``shoal`` command line: serve an app, inspect and steer runs, migrate a store, the tour.

The store comes from ``--store`` or ``SHOAL_STORE`` (default ``sqlite:///shoal.db``), the namespace
from ``--namespace`` or ``SHOAL_NAMESPACE``; read commands cover every namespace when none is given.
A shoal error (bad URL, unreachable store, unknown run, bad input) ends the command with one line
on stderr and exit code 1, never a traceback; a bad option value (one of the wrong form, a
namespace or workflow the store has never seen) is a usage error naming the option, exit code 2.
``--tenant`` on the commands that show or change one run or pause confines them to that tenant:
another tenant's id is reported exactly like an unknown one, and nothing changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import ipaddress
import json
import logging
import math
import os
import re
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager, suppress
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shoal import _checks, _json, logs
from shoal.app import App, history
from shoal.app.collector import GC_ENV, tune_for_worker
from shoal.app.options import CONCURRENCY_ENV, concurrency_setting, tracing_sink
from shoal.errors import (
    ConfigurationError,
    ShoalError,
    UnknownPauseError,
    UnknownRunError,
    UnknownWorkflowError,
)
from shoal.logs import FORMAT_ENV, FORMATS
from shoal.ports import Store
from shoal.stores import mask_url, open_store
from shoal.types import (
    HELD_BACK_CAP,
    HOLD_REASONS,
    OutboxEntry,
    Pause,
    PausedWorkflow,
    Run,
    RunFilter,
    RunStatus,
    SpendEntry,
    Stats,
    Step,
    WorkflowInfo,
)
from shoal.watch import follow_run, progress_cell, runs_table, watch_runs
from shoal.watch import json_text as _json_text
from shoal.watch import status as _status
from shoal.watch import when as _when

DEFAULT_STORE = "sqlite:///shoal.db"
T = TypeVar("T")


class _Target:
    """Where a command points: the store URL and, when given, the namespace; ``namespace_hint``
    names where the namespace came from, for an error about it."""

    def __init__(self, store: str, namespace: str | None,
                 namespace_hint: str = "'--namespace' / '-n'") -> None:
        self.store = store
        self.namespace = namespace
        self.namespace_hint = namespace_hint


class _ShoalGroup(click.Group):
    """Turns shoal's own errors into one line on stderr and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ShoalError as e:
            raise click.ClickException(str(e)) from None
        except sqlite3.Error as e:
            raise click.ClickException(f"The SQLite store failed: {e}") from None


def _console() -> Console:
    console = Console()
    if not console.is_terminal:
        # Piped or captured: wide enough that run ids are never folded.
        console = Console(width=max(console.width, 160))
    return console


def _run_async(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


# -- options shared by the commands that talk to a store -------------------------------------


def _target_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--store`` and ``--namespace`` on a subcommand too, overriding the group's."""
    fn = click.option("--store", "store_override", metavar="URL", default=None,
                      help="Store URL (overrides the one given before the command).")(fn)
    fn = click.option("--namespace", "-n", "namespace_override", metavar="NAME", default=None,
                      help="Namespace (overrides the one given before the command).")(fn)
    return fn


def _target(ctx: click.Context, store: str | None, namespace: str | None) -> _Target:
    base: _Target = ctx.find_object(_Target) or _Target(DEFAULT_STORE, None)
    if namespace:
        return _Target(store or base.store, namespace)
    return _Target(store or base.store, base.namespace, base.namespace_hint)


def _tenant_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--tenant``: act only on a ``what`` of this tenant; another tenant's looks unknown."""
    return click.option(
        "--tenant", default=None, metavar="NAME", type=NAME,
        help=f"Only a {what} of this tenant: another tenant's {what} is reported as unknown "
             f"and left unchanged.")


if TYPE_CHECKING:
    _TextParam = click.ParamType[str]
else:   # generic in the newer clicks only; pyproject allows click 8.1
    _TextParam = click.ParamType

_RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class _RunIdType(_TextParam):
    """A run id as shoal makes them (a UUID), in lower case as the stores keep it: a value of
    another shape is a usage error, not a filter that quietly matches nothing."""

    name = "run_id"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        text = str(value).lower()
        if not _RUN_ID.fullmatch(text):
            self.fail(f"{value!r} is not a run id: give one as 'shoal runs' prints it, e.g. "
                      f"01a236f7-61ca-72fd-b34f-28c749b6c103.", param, ctx)
        return text


class _NameType(_TextParam):
    """A name shoal stores (a tenant, a workflow, a signal, an entry id): non-empty text that
    UTF-8 can encode. Refused here, it is one line naming the option; refused by the App, it
    would be a Python traceback speaking the Python API."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        text = str(value)
        if not text:
            self.fail("must not be empty: give a name" + (
                ", or leave the option out." if isinstance(param, click.Option) else "."),
                param, ctx)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            self.fail(f"{text!r} is not valid UTF-8.", param, ctx)
        return text


RUN_ID = _RunIdType()
NAME = _NameType()


async def _known_namespaces(store: Store) -> list[str]:
    """The namespaces where an instance registered workflows, by name."""
    return sorted({w.namespace for w in await store.list_workflows(None)})


async def _read_namespaces(store: Store, target: _Target) -> list[str]:
    """The namespaces a read command covers: the one given, else every one where an instance
    registered workflows."""
    if target.namespace is not None:
        return [target.namespace]
    return await _known_namespaces(store)


async def _check_namespace(store: Store, target: _Target,
                           more: Callable[[], Awaitable[bool]] | None = None) -> None:
    """Refuse (exit code 2, naming the option) a namespace given that the store has never
    seen: no instance registered workflows in it, no run of it is stored, and ``more`` (what
    else the command reads, e.g. ledger rows) finds nothing. A typo must not read as an empty
    namespace. Called when a read found nothing, so a read that found something costs no
    more."""
    namespace = target.namespace
    if namespace is None:
        return
    known = await _known_namespaces(store)
    if namespace in known or await store.list_runs(namespace, limit=1):
        return
    if more is not None and await more():
        return
    has = (f"the namespaces with registered workflows are {', '.join(map(repr, known))}"
           if known else "no instance registered workflows in any namespace")
    raise click.BadParameter(
        f"{mask_url(target.store)} has no namespace {namespace!r} (no instance registered "
        f"workflows in it and it holds no run of it); {has}.", param_hint=target.namespace_hint)


async def _check_workflow(store: Store, target: _Target, workflow: str) -> None:
    """Refuse (exit code 2) a ``--workflow`` that no instance of the namespace (of any, when
    none is given) registered and that no stored run has: a typo, not an empty result."""
    known = await store.list_workflows(target.namespace)
    if any(w.name == workflow for w in known):
        return
    if await store.list_runs(target.namespace, workflow=workflow, limit=1):
        return
    where = (f"namespace {target.namespace!r}" if target.namespace is not None
             else mask_url(target.store))
    names = sorted({w.name for w in known})
    has = f"the registered ones are {', '.join(map(repr, names))}" if names else "none is"
    raise click.BadParameter(
        f"no instance registered a workflow {workflow!r} in {where} and no run of it is "
        f"stored; {has}.", param_hint="'--workflow' / '-w'")


@asynccontextmanager
async def _opened_store(url: str, *, create: bool = False) -> AsyncIterator[Store]:
    """The store at ``url``, opened (which migrates it, and refuses a schema newer than this
    code: SchemaVersionError, one line and exit code 1 like every ShoalError). A SQLite file or
    a PostgreSQL schema that does not exist is refused unless ``create``: a typo in a path or a
    schema name must not look like an empty store, nor create one."""
    store = open_store(url)
    exists = getattr(store, "exists", None)
    if not create and exists is not None and not await exists():
        path, schema = getattr(store, "path", None), getattr(store, "schema", None)
        what = (f"the file {path!r} does not exist" if isinstance(path, str)
                else f"the schema {schema!r} holds no shoal store")
        raise click.ClickException(
            f"No shoal store at {mask_url(url)!r}: {what}. Give --store or set SHOAL_STORE "
            f"(shoal migrate creates a new store).")
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def _app_for_run(target: _Target, store: Store, run_id: str) -> AsyncIterator[App]:
    """An App (opened, running nothing) of the run's namespace: the given one, or the run's own
    when no namespace was given. Raises ``UnknownRunError``."""
    namespace = target.namespace
    if namespace is None:
        run = await store.get_run(run_id)
        if run is None:
            raise UnknownRunError(run_id)
        namespace = run.namespace
    app = App(namespace, store=store)
    async with app.open():
        yield app


# -- the group -------------------------------------------------------------------------------


@click.group(cls=_ShoalGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--store", envvar="SHOAL_STORE", default=DEFAULT_STORE, show_default=True,
              metavar="URL",
              help="Store URL: sqlite:///path.db, postgresql://user@host/db?schema=NAME "
                   "or memory:// [env SHOAL_STORE].")
@click.option("--namespace", "-n", envvar="SHOAL_NAMESPACE", default=None, metavar="NAME",
              help="Namespace of the runs [env SHOAL_NAMESPACE]; read commands show every "
                   "namespace when none is given.")
@click.version_option(package_name="shoal", prog_name="shoal")
@click.pass_context
def cli(ctx: click.Context, store: str, namespace: str | None) -> None:
    """shoal: durable runs and replica coordination through the store you already have."""
    from_env = ctx.get_parameter_source("namespace") is click.core.ParameterSource.ENVIRONMENT
    ctx.obj = _Target(store, namespace or None,
                      "SHOAL_NAMESPACE" if from_env else "'--namespace' / '-n'")


# -- worker ----------------------------------------------------------------------------------


def _load_app(spec: str) -> App:
    """The App named by ``MODULE:ATTRIBUTE`` (ATTRIBUTE defaults to ``app``), importable from the
    current directory too."""
    module_name, _, attribute = spec.partition(":")
    attribute = attribute or "app"
    if not module_name:
        raise click.ClickException(f"Give the app as MODULE:APP, e.g. 'myservice.jobs:app', "
                                   f"not {spec!r}.")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        # Only a missing module *named here* is a usage error; one missing inside the user's
        # module is their bug and keeps its traceback.
        if e.name is not None and (module_name == e.name
                                   or module_name.startswith(e.name + ".")):
            raise click.ClickException(
                f"Cannot import {module_name!r}: no module named {e.name!r} (looked in "
                f"{cwd!r} and the installed packages).") from None
        raise
    obj: Any = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise click.ClickException(f"Module {module_name!r} has no attribute {attribute!r}.")
        obj = getattr(obj, part)
    if not isinstance(obj, App):
        raise click.ClickException(
            f"{spec} is a {type(obj).__name__}, not a shoal.App.")
    return obj


@cli.command(short_help="Serve an App until SIGTERM or Ctrl-C.")
@click.argument("app_spec", metavar="MODULE:APP")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
              help="Level of the log lines written to stderr.")
@click.option("--shutdown-timeout", default=25.0, show_default=True, type=float,
              help="Seconds a stop waits for running runs before interrupting them.")
@click.option("--no-migrate", is_flag=True,
              help="Never change the store's schema: refuse one that is behind (run "
                   "'shoal migrate' first), as App(migrate=False) does.")
@click.option("--concurrency", envvar=CONCURRENCY_ENV, default=None, metavar="N",
              help="Runs this worker executes at once, instead of the app's "
                   f"max_concurrent_runs [env {CONCURRENCY_ENV}].")
@click.option("--log-format", type=click.Choice(FORMATS, case_sensitive=False), default=None,
              help=f"'text' (one human line a record) or 'json' (one JSON object a line) "
                   f"[env {FORMAT_ENV}; default text].")
@click.option("--health-port", type=click.IntRange(0, 65535), default=None, metavar="PORT",
              help="Serve GET /livez and /readyz on this port (as App(health_port)).")
@click.option("--health-host", default=None, metavar="HOST",
              help="The address the probes listen on [default: the app's health_host, "
                   "0.0.0.0: every interface].")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
              help="Serve Prometheus metrics over HTTP on this port (/metrics), turning the "
                   "app's metrics on if it did not (needs shoal[metrics]).")
@click.option("--metrics-host", default="0.0.0.0", show_default=True, metavar="HOST",
              help="The address --metrics-port listens on (127.0.0.1: this machine only).")
@click.option("--tracing", is_flag=True, envvar="SHOAL_TRACING",
              help="Trace runs with OpenTelemetry through the global tracer provider (set up "
                   "by your code or by opentelemetry-instrument), as App(tracing=True) does; "
                   "needs shoal[otel] [env SHOAL_TRACING].")
@click.option("--gc", "gc_mode", type=click.Choice(["tuned", "default"], case_sensitive=False),
              envvar=GC_ENV, default="tuned", show_default=True,
              help="Python's garbage collector in this process: 'tuned' collects the youngest "
                   "generation every 20,000 allocations (not 700) and freezes the objects "
                   "alive at start, about 10 us less CPU per short run; 'default' keeps "
                   f"Python's settings [env {GC_ENV}].")
@click.pass_context
def worker(ctx: click.Context, app_spec: str, log_level: str, shutdown_timeout: float,
           no_migrate: bool, concurrency: str | None, log_format: str | None,
           health_port: int | None, health_host: str | None, metrics_port: int | None,
           metrics_host: str, tracing: bool, gc_mode: str) -> None:
    """Serve the App MODULE:APP until SIGTERM or SIGINT, then stop gracefully.

    The app names its own store; build it with shoal.App.from_env() to take SHOAL_STORE,
    SHOAL_INSTANCE_ID and SHOAL_COORDINATION from the environment.
    """
    slots: int | None = None
    if concurrency is not None and concurrency.strip():
        given = ctx.get_parameter_source("concurrency") is click.core.ParameterSource.COMMANDLINE
        slots = concurrency_setting(concurrency, "--concurrency" if given else CONCURRENCY_ENV)
    try:
        as_json = logs.log_format(log_format) == "json"
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    root = logging.getLogger()
    level = root.level
    handler = logs.configure("json" if as_json else "text", level=log_level)
    try:
        source = ctx.parent.get_parameter_source("store") if ctx.parent else None
        _serve(app_spec, as_json, source is click.core.ParameterSource.COMMANDLINE,
               no_migrate, slots, health_port, health_host,
               None if metrics_port is None else (metrics_host, metrics_port), tracing,
               shutdown_timeout, gc_mode.lower() == "tuned")
    finally:    # as it was: the command may be invoked in a process that goes on
        root.removeHandler(handler)
        root.setLevel(level)


def _serve(app_spec: str, as_json: bool, store_given: bool, no_migrate: bool,
           slots: int | None, health_port: int | None, health_host: str | None,
           metrics: tuple[str, int] | None, tracing: bool, shutdown_timeout: float,
           tune_gc: bool) -> None:
    """``shoal worker``, once its logging is set up."""
    def say(level: int, text: str, **fields: Any) -> None:
        """A note of the worker's own: a line on stderr, or a record among the JSON ones."""
        if as_json:
            logging.getLogger("shoal").log(level, text, extra=fields)
        else:
            click.echo(text, err=True)

    if store_given:
        say(logging.WARNING, "shoal worker: --store is ignored; the app names its own store "
            "(build it with shoal.App.from_env() to take SHOAL_STORE).",
            event="worker.store_ignored")
    app = _load_app(app_spec)
    if no_migrate:
        app.migrate = False
    if slots is not None:
        app.max_concurrent_runs = slots
    if health_host is not None:
        if not health_host.strip():
            raise click.ClickException("--health-host must be an address, e.g. 0.0.0.0 or "
                                       "127.0.0.1, not an empty string.")
        app.health_host = health_host
    if health_port is not None:
        app.health_port = health_port
    if tracing and app.tracing is None:   # an app traced already keeps its own provider
        app.tracing = tracing_sink(True)
        assert app.tracing is not None
        app.instrument(app.tracing)
    stop_metrics = None
    if metrics is not None:
        stop_metrics = _serve_metrics(app, *metrics, say)
    if tune_gc:   # a process of its own: the collector's defaults cost short runs (collector.py)
        tune_for_worker()
    def serving() -> None:   # once started: a store that cannot be reached fails before
        say(logging.INFO, f"shoal worker: serving {app!r}, max_concurrent_runs="
            f"{app.max_concurrent_runs}, gc={'tuned' if tune_gc else 'default'}; SIGTERM or "
            f"Ctrl-C stops it gracefully.", event="worker.serving", instance=app.instance_id)

    try:
        app.run_forever(timeout=shutdown_timeout, on_started=serving)
    except ConfigurationError as e:
        # the App's message speaks App(health_port=...): say the flag that was given instead
        if health_port is None or not isinstance(e.__cause__, OSError) \
                or "health_port" not in str(e):
            raise
        raise click.ClickException(
            f"--health-port: cannot listen on {app.health_host}:{health_port}: {e.__cause__}. "
            f"Give a free port (0 picks one), or leave --health-port out to serve no "
            f"probes.") from None
    finally:
        if stop_metrics is not None:
            stop_metrics()


def _serve_metrics(app: App, host: str, port: int,
                   say: Callable[..., None]) -> Callable[[], None]:
    """Turn the app's metrics on (unless it did) and serve them on ``host:port``; a clear
    error when the extra is missing or the port cannot be bound."""
    if app.metrics is None:
        try:
            from shoal.telemetry.metrics import PrometheusMetrics
        except ImportError as e:
            raise click.ClickException(f"--metrics-port needs the metrics extra: pip install "
                                       f"'shoal[metrics]' ({e}).") from None
        app.metrics = app.instrument(PrometheusMetrics())
    try:
        stop = app.metrics.serve(port, host)
    except OSError as e:
        raise click.ClickException(f"--metrics-port: cannot listen on {host}:{port}: "
                                   f"{e.strerror or e}.") from None
    say(logging.INFO, f"shoal worker: metrics on http://{host}:{port}/metrics",
        event="metrics.serving", instance=app.instance_id, port=port)
    return stop


# -- runs ------------------------------------------------------------------------------------


def _first_line(text: str | None, limit: int = 120) -> str:
    line = (text or "").strip().split("\n", 1)[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _run_dict(run: Run) -> dict[str, Any]:
    out = dataclasses.asdict(run)
    out["status"] = str(run.status)
    return out


def _interval_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--interval``: seconds between two reads of the store while ``what`` is on."""
    return click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=None,
                        metavar="S", help=f"With {what}: seconds between two reads of the "
                                          f"store (default 1).")


async def _newest_runs(store: Store, namespace: str | None, where: RunFilter, limit: int,
                       after: str | None) -> list[Run]:
    """The newest ``limit`` runs matching ``where``, newest first, created after run ``after``:
    of ``namespace``, or of every namespace where an instance registered workflows."""
    names = ([namespace] if namespace is not None else
             sorted({w.namespace for w in await store.list_workflows(None)}))
    found: list[Run] = []
    for name in names:
        found += await store.search_runs(name, where, limit=limit)
    found.sort(key=lambda r: r.id, reverse=True)
    return [r for r in found if after is None or r.id > after][:limit]


@cli.command()
@click.option("--status", type=click.Choice([s.value for s in RunStatus]), default=None,
              help="Only runs with this status.")
@click.option("--workflow", "-w", default=None, type=NAME, help="Only runs of this workflow.")
@click.option("--tenant", default=None, type=NAME, help="Only runs of this tenant.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(min=1),
              help="At most this many runs.")
@click.option("--after", default=None, metavar="RUN_ID", type=RUN_ID,
              help="Only runs created after this one (to page): a run id.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--watch", is_flag=True,
              help="Redraw the table until Ctrl-C: the newest runs first, with their progress.")
@_interval_option("--watch")
@_target_options
@click.pass_context
def runs(ctx: click.Context, status: str | None, workflow: str | None, tenant: str | None,
         limit: int, after: str | None, as_json: bool, watch: bool, interval: float | None,
         store_override: str | None, namespace_override: str | None) -> None:
    """List runs in creation order (all namespaces unless one is given); with --watch, the
    newest runs first, redrawn every --interval seconds until Ctrl-C."""
    target = _target(ctx, store_override, namespace_override)
    if interval is not None and not watch:
        raise click.UsageError("--interval goes with --watch.")
    if watch and as_json:
        raise click.UsageError("--watch draws a table in the terminal; --json prints the runs "
                               "once: give one of them.")
    if watch:
        _watch_runs(target, RunFilter(status=status, workflow=workflow, tenant=tenant), limit,
                    after, interval or 1.0)
        return

    async def read() -> list[Run]:
        async with _opened_store(target.store) as store:
            found = await store.list_runs(target.namespace, status=status, workflow=workflow,
                                          tenant=tenant, limit=limit, after=after)
            if not found:   # nothing: because the namespace or the workflow is a typo?
                await _check_namespace(store, target)
                if workflow is not None:
                    await _check_workflow(store, target, workflow)
            return found

    found = _run_async(read())
    if as_json:
        for run in found:
            click.echo(json.dumps(_run_dict(run), ensure_ascii=False))
        return
    console = _console()
    if not found:
        where = f"namespace {target.namespace!r}" if target.namespace else "any namespace"
        console.print(f"No runs in {escape(where)} of {escape(mask_url(target.store))}.")
        return
    console.print(runs_table(found, f"runs in {escape(mask_url(target.store))}",
                             namespaces=target.namespace is None))
    if len(found) == limit:
        console.print(f"[dim]First {limit} shown; the next page: --after {found[-1].id}[/]")


def _watch_runs(target: _Target, where: RunFilter, limit: int, after: str | None,
                interval: float) -> None:
    """``shoal runs --watch``: the newest runs, redrawn every ``interval`` s until Ctrl-C."""
    console = _console()
    where_text = f"namespace {target.namespace!r}" if target.namespace else "every namespace"

    async def watch() -> None:
        async with _opened_store(target.store) as store:
            await _check_namespace(store, target)
            if where.workflow is not None:
                await _check_workflow(store, target, where.workflow)

            async def read() -> Any:
                found = await _newest_runs(store, target.namespace, where, limit, after)
                title = (f"newest runs of {escape(where_text)} in "
                         f"{escape(mask_url(target.store))} at {_when(time.time())}")
                if not found:
                    return f"[bold]{title}[/]\nNo runs match."
                return runs_table(found, title, namespaces=target.namespace is None)

            await watch_runs(read, console, interval)

    with suppress(KeyboardInterrupt):
        _run_async(watch())


# -- run show / cancel -----------------------------------------------------------------------


@cli.group()
def run() -> None:
    """Look at one run, cancel it, or retry it."""


@run.command("show")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True,
              help="The run and its steps as JSON (with --follow, one line each time they "
                   "change).")
@click.option("--follow", "-f", is_flag=True,
              help="Redraw the run (status, progress, steps) until it ends; exit code 1 if it "
                   "fails or is cancelled.")
@_interval_option("--follow")
@_tenant_option("run")
@_target_options
@click.pass_context
def run_show(ctx: click.Context, run_id: str, as_json: bool, follow: bool,
             interval: float | None, tenant: str | None, store_override: str | None,
             namespace_override: str | None) -> None:
    """Every field of run RUN_ID, its progress, its checkpointed steps, and the traceback of
    its last failed attempt; with --follow, the run as it goes until it ends."""
    target = _target(ctx, store_override, namespace_override)
    if interval is not None and not follow:
        raise click.UsageError("--interval goes with --follow.")
    if follow:
        _follow_run(target, run_id, tenant, as_json, interval or 1.0)
        return

    async def read() -> tuple[Run, list[Step], str | None]:
        async with _opened_store(target.store) as store, \
                _app_for_run(target, store, run_id) as app:
            found = await app.get_run(run_id, tenant=tenant)
            return (found, await store.load_steps(run_id),
                    await app.hold_reason(found, tenant=tenant))

    found, steps, reason = _run_async(read())
    if as_json:
        click.echo(json.dumps(_run_and_steps(found, steps) | {"hold_reason": reason},
                              ensure_ascii=False, indent=2))
        return
    console = _console()
    fields = Table(show_header=False, title=f"run {found.id}", title_justify="left")
    fields.add_column("field", style="bold")
    fields.add_column("value", overflow="fold")
    for field in dataclasses.fields(found):
        value = getattr(found, field.name)
        if field.name == "traceback":
            continue   # printed below the table, as Python prints it
        if field.name == "status":
            text = _status(value)
        elif field.name == "progress":
            if value is None:
                continue
            text = progress_cell(value, width=30, message_limit=200)
            if value.data:
                text += f"  {escape(_json_text(value.data))}"
            text += f"  [dim]at {_when(value.at)}[/]"
        elif field.name in ("input", "output"):
            text = escape(_json_text(value))
        elif field.name.endswith("_at") and isinstance(value, float):
            text = f"{_when(value)}  [dim]({value:.3f})[/]"
        else:
            text = escape("" if value is None else str(value))
        fields.add_row(field.name, text)
    console.print(fields)
    if reason is not None:
        console.print(f"[bold]held back[/]: queued, {escape(HOLD_REASONS[reason])} ({reason}).")
    if steps:
        table = Table(title="steps", title_justify="left")
        for column in ("seq", "name", "finished", "epoch", "output"):
            table.add_column(column, overflow="fold")
        for step in steps:
            table.add_row(str(step.seq), escape(step.name), "yes" if step.finished else "no",
                          str(step.epoch), escape(_json_text(step.output, 200)))
        console.print(table)
    else:
        console.print("[dim]No steps checkpointed yet.[/]")
    if found.traceback is not None:   # last, as Python prints it: it ends where it was raised
        console.print("[bold]traceback[/] of the last failed attempt:")
        console.print(escape(found.traceback.rstrip("\n")), highlight=False, soft_wrap=True)


def _run_and_steps(run: Run, steps: list[Step]) -> dict[str, Any]:
    out = _run_dict(run)
    out["steps"] = [dataclasses.asdict(s) for s in steps]
    return out


def _follow_run(target: _Target, run_id: str, tenant: str | None, as_json: bool,
                interval: float) -> None:
    """``shoal run show --follow``: the run redrawn (or, with ``as_json``, one JSON line per
    change) every ``interval`` seconds until it ends; exit code 1 unless it succeeded, 130 on
    Ctrl-C."""
    console = _console()

    def emit(run: Run, steps: list[Step]) -> None:
        click.echo(json.dumps(_run_and_steps(run, steps), ensure_ascii=False))

    async def follow() -> Run:
        async with _opened_store(target.store) as store, \
                _app_for_run(target, store, run_id) as app:
            async def read() -> tuple[Run, list[Step]]:
                return await app.get_run(run_id, tenant=tenant), await store.load_steps(run_id)

            return await follow_run(read, console, interval, emit if as_json else None)

    try:
        ended = _run_async(follow())
    except KeyboardInterrupt:
        click.echo(f"Stopped following run {run_id}; it goes on.", err=True)
        sys.exit(130)
    if ended.status == RunStatus.FAILED:
        raise click.ClickException(f"Run {run_id} failed: {_first_line(ended.error)}")
    if ended.status == RunStatus.CANCELLED:
        raise click.ClickException(f"Run {run_id} was cancelled.")


@run.command("cancel")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="The run as it is now, as JSON.")
@_tenant_option("run")
@_target_options
@click.pass_context
def run_cancel(ctx: click.Context, run_id: str, as_json: bool, tenant: str | None,
               store_override: str | None, namespace_override: str | None) -> None:
    """Cancel run RUN_ID: at once unless it is running; then its owner aborts it at its next
    poll."""
    target = _target(ctx, store_override, namespace_override)

    async def cancel() -> tuple[RunStatus, Run]:
        async with _opened_store(target.store) as store, \
                _app_for_run(target, store, run_id) as app:
            before = (await app.get_run(run_id, tenant=tenant)).status
            return before, await app.cancel(run_id, tenant=tenant)

    before, after = _run_async(cancel())
    if as_json:
        click.echo(json.dumps(_run_dict(after), ensure_ascii=False))
        return
    if after.status == RunStatus.CANCELLED and before != RunStatus.CANCELLED:
        click.echo(f"Cancelled run {run_id} (it was {before}).")
    elif after.status == RunStatus.RUNNING:
        click.echo(f"Asked {after.owner} to cancel run {run_id}: it is running there and "
                   f"stops at that instance's next poll.")
    else:
        click.echo(f"Run {run_id} had already ended ({after.status}); nothing to cancel.")


@run.command("retry")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="The queued run as JSON.")
@_tenant_option("run")
@_target_options
@click.pass_context
def run_retry(ctx: click.Context, run_id: str, as_json: bool, tenant: str | None,
              store_override: str | None, namespace_override: str | None) -> None:
    """Start failed or cancelled run RUN_ID again from its checkpoints, with a fresh attempt
    budget: its finished steps are not repeated. A run that has not ended, or succeeded, is
    refused (exit code 1)."""
    target = _target(ctx, store_override, namespace_override)

    async def retry() -> tuple[RunStatus, Run]:
        async with _opened_store(target.store) as store, \
                _app_for_run(target, store, run_id) as app:
            before = (await app.get_run(run_id, tenant=tenant)).status
            return before, await app.retry(run_id, tenant=tenant)

    before, after = _run_async(retry())
    if as_json:
        click.echo(json.dumps(_run_dict(after), ensure_ascii=False))
        return
    click.echo(f"Retried run {run_id} (it was {before}): queued again with "
               f"{after.max_attempts} attempt{'' if after.max_attempts == 1 else 's'}; its "
               f"finished steps are not repeated.")


# -- dispatch --------------------------------------------------------------------------------


def _json_argument(text: str | None, what: str, example: str = '{"order": 42}') -> Any:
    """``text`` parsed as JSON (None when not given), or a one-line error: when it is not
    JSON, or is JSON a run cannot keep (nested too deep), which the App would refuse with a
    traceback."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise click.ClickException(
            f"{what} is not JSON ({e.msg} at column {e.colno}): {text!r}. Quote it for the "
            f"shell, e.g. '{example}' or '\"text\"'.") from None
    except RecursionError:   # deeper than Python parses, so deeper than a run keeps
        raise click.ClickException(
            f"{what} nests lists and objects more than {_json.MAX_DEPTH} deep: a JSON value "
            f"here is at most {_json.MAX_DEPTH} levels deep.") from None
    try:
        _json.check_json(value, what)
    except TypeError as e:
        raise click.ClickException(f"{e}.") from None
    return value


async def _namespace_of(store: Store, target: _Target, workflow: str) -> str:
    """The namespace to dispatch ``workflow`` in: the one given, else the only namespace where
    an instance registered it."""
    if target.namespace is not None:
        return target.namespace
    found = sorted({w.namespace for w in await store.list_workflows(None) if w.name == workflow})
    if len(found) == 1:
        return found[0]
    if not found:
        raise click.ClickException(
            f"No instance registered a workflow named {workflow!r} in {mask_url(target.store)}: "
            f"start a worker that serves it ('shoal workflows' lists the known ones).")
    raise click.ClickException(
        f"Workflow {workflow!r} is registered in several namespaces ({', '.join(found)}): "
        f"give --namespace/-n NAME.")


async def _unregistered(store: Store, namespace: str, workflow: str) -> click.ClickException:
    """The error for a dispatch of a workflow no instance of ``namespace`` registered, in the
    command line's words (UnknownWorkflowError's hint is the Python API's): where the name is
    registered, if anywhere, and the flag that queues the run anyway."""
    elsewhere = sorted({w.namespace for w in await store.list_workflows(None)
                        if w.name == workflow})
    found = (f"it is registered in namespace{'s' if len(elsewhere) > 1 else ''} "
             f"{', '.join(map(repr, elsewhere))}" if elsewhere
             else "'shoal workflows' lists the registered ones")
    return click.ClickException(
        f"No workflow named {workflow!r} in namespace {namespace!r}: no instance of the "
        f"namespace registered it ({found}). Start a worker that serves it, or give "
        f"--allow-unregistered to queue the run until one does.")


@cli.command(short_help="Start a run of a workflow that a worker registered.")
@click.argument("workflow")
@click.argument("payload", metavar="[JSON]", required=False)
@click.option("--wait", is_flag=True,
              help="Wait for the run to end and print its output as JSON; exit code 1 if it "
                   "fails or is cancelled.")
@click.option("--timeout", type=click.FloatRange(min=0), default=None, metavar="S",
              help="With --wait: give up waiting after S seconds (exit code 1; the run goes "
                   "on).")
@click.option("--idempotency-key", default=None, metavar="KEY",
              help="The same key (per tenant and workflow) gives back the same run, never a "
                   "second one.")
@click.option("--tenant", default="default", show_default=True, metavar="NAME", type=NAME,
              help="The tenant the run belongs to.")
@click.option("--priority", type=click.IntRange(_checks.INT32_MIN, _checks.INT32_MAX),
              default=None, help="Higher runs first (default: the workflow's own).")
@click.option("--allow-unregistered", is_flag=True,
              help="Dispatch a workflow no worker registered yet (needs --namespace): the run "
                   "waits, queued, until a worker serving it starts.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the run as JSON (with --wait, once it has ended).")
@_target_options
@click.pass_context
def dispatch(ctx: click.Context, workflow: str, payload: str | None, wait: bool,
             timeout: float | None, idempotency_key: str | None, tenant: str,
             priority: int | None, allow_unregistered: bool, as_json: bool,
             store_override: str | None, namespace_override: str | None) -> None:
    """Start a run of WORKFLOW with a JSON input (default null) and print its id. The workflow
    is one a worker of the namespace registered in the store (this command runs no code of
    yours); without --namespace, the only namespace that has it. With --allow-unregistered
    and --namespace, one no worker registered yet: it waits for a worker that serves it."""
    target = _target(ctx, store_override, namespace_override)
    value = _json_argument(payload, "The input")
    if timeout is not None and not wait:
        raise click.UsageError("--timeout goes with --wait.")
    if allow_unregistered and target.namespace is None:
        raise click.ClickException("--allow-unregistered needs --namespace/-n NAME: a workflow no "
                               "worker registered is in no namespace yet.")

    async def go() -> tuple[Run, BaseException | None]:
        async with _opened_store(target.store) as store:
            app = App(await _namespace_of(store, target, workflow), store=store)
            async with app.open():
                try:
                    run = await app.dispatch(workflow, value, idempotency_key=idempotency_key,
                                             tenant=tenant, priority=priority,
                                             allow_unregistered=allow_unregistered)
                except UnknownWorkflowError:
                    raise await _unregistered(store, app.namespace, workflow) from None
                if not wait:
                    return run, None
                try:
                    await app.result(run.id, timeout=timeout)
                except (ShoalError, TimeoutError) as e:
                    return await app.get_run(run.id), e
                return await app.get_run(run.id), None

    found, error = _run_async(go())
    if as_json:
        click.echo(json.dumps(_run_dict(found), ensure_ascii=False))
    elif not wait:
        click.echo(found.id)
    elif error is None:
        click.echo(json.dumps(found.output, ensure_ascii=False))
    if isinstance(error, TimeoutError):
        raise click.ClickException(f"{error} It goes on: 'shoal run show {found.id}'.")
    if error is not None:
        raise click.ClickException(str(error))


# -- workflows -------------------------------------------------------------------------------


def _workflow_dict(info: WorkflowInfo, paused: list[PausedWorkflow]) -> dict[str, Any]:
    return {"namespace": info.namespace, "name": info.name, "options": info.options,
            "registered_at": info.registered_at,
            "instances": [{"instance": i, "registered_at": at} for i, at in info.instances],
            "paused": [_paused_dict(p) for p in paused]}


def _paused_dict(paused: PausedWorkflow) -> dict[str, Any]:
    return {"tenant": paused.tenant, "paused_at": paused.paused_at}


def _paused_text(paused: list[PausedWorkflow]) -> str:
    """The ``paused`` cell of ``shoal workflows``: which tenants, since when."""
    return "\n".join(f"{'every tenant' if p.tenant is None else escape(p.tenant)} "
                      f"[dim]{_when(p.paused_at)}[/]" for p in paused) or "[dim]-[/]"


async def _paused_in(store: Store, found: list[WorkflowInfo],
                     ) -> dict[tuple[str, str], list[PausedWorkflow]]:
    """The pauses of the workflows ``found``, by (namespace, workflow)."""
    paused: dict[tuple[str, str], list[PausedWorkflow]] = {}
    for namespace in sorted({info.namespace for info in found}):
        for p in await store.paused_workflows(namespace):
            paused.setdefault((namespace, p.workflow), []).append(p)
    return paused


@cli.command(short_help="The workflows the store knows, and the instances that serve them.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@_target_options
@click.pass_context
def workflows(ctx: click.Context, as_json: bool, store_override: str | None,
              namespace_override: str | None) -> None:
    """The workflows registered in the store (all namespaces unless one is given), with their
    dispatch options, the instances that registered each when they started, latest first
    (an instance that has not started for 30 days is forgotten), and its pauses ('shoal
    workflow pause')."""
    target = _target(ctx, store_override, namespace_override)

    async def read() -> tuple[list[WorkflowInfo], dict[tuple[str, str], list[PausedWorkflow]]]:
        async with _opened_store(target.store) as store:
            found = await store.list_workflows(target.namespace)
            if not found:
                await _check_namespace(store, target)
            return found, await _paused_in(store, found)

    found, paused = _run_async(read())
    if as_json:
        for info in found:
            click.echo(json.dumps(_workflow_dict(info, paused.get((info.namespace, info.name),
                                                                  [])), ensure_ascii=False))
        return
    console = _console()
    if not found:
        where = f"namespace {target.namespace!r}" if target.namespace else "any namespace"
        console.print(f"No workflows registered in {escape(where)} of "
                      f"{escape(mask_url(target.store))}: start a worker that serves some.")
        return
    table = Table(title=f"workflows in {escape(mask_url(target.store))}", title_justify="left")
    for column in ("namespace", "workflow", "options", "instances (latest start first)",
                   "paused"):
        table.add_column(column, overflow="fold")
    for info in found:
        instances = "\n".join(f"{escape(i)} [dim]{_when(at)}[/]" for i, at in info.instances)
        table.add_row(escape(info.namespace), escape(info.name),
                      escape(_json_text(info.options, 120)), instances or "[dim]-[/]",
                      _paused_text(paused.get((info.namespace, info.name), [])))
    console.print(table)


@cli.group("workflow")
def workflow_group() -> None:
    """Pause and resume a workflow (see 'shoal workflows' for the known ones)."""


def _pause_command(verb: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The arguments and options of ``shoal workflow pause|resume``."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for option in (
            click.pass_context, _target_options,
            click.option("--json", "as_json", is_flag=True,
                         help="The workflow's pauses after the command, as JSON."),
            click.option("--tenant", default=None, metavar="NAME", type=NAME,
                         help=f"{verb.capitalize()} the runs of this tenant only (without it: "
                              f"of every tenant)."),
            click.argument("name", type=NAME),
        ):
            fn = option(fn)
        return fn
    return decorate


def _pause_or_resume(ctx: click.Context, name: str, tenant: str | None, as_json: bool,
                     store_override: str | None, namespace_override: str | None,
                     pause: bool) -> None:
    target = _target(ctx, store_override, namespace_override)

    async def go() -> tuple[str, bool, list[PausedWorkflow]]:
        async with _opened_store(target.store) as store:
            app = App(await _namespace_of(store, target, name), store=store)
            async with app.open():
                try:
                    call = app.pause_workflow if pause else app.resume_workflow
                    changed = await call(name, tenant)
                except UnknownWorkflowError:
                    raise click.ClickException(
                        f"No workflow named {name!r} in namespace {app.namespace!r}: no "
                        f"instance of the namespace registered it ('shoal workflows' lists "
                        f"the registered ones).") from None
                paused = [p for p in await app.paused_workflows() if p.workflow == name]
                return app.namespace, changed, paused

    namespace, changed, paused = _run_async(go())
    if as_json:
        click.echo(json.dumps({"namespace": namespace, "workflow": name, "tenant": tenant,
                               "changed": changed, "paused": [_paused_dict(p) for p in paused]},
                              ensure_ascii=False))
        return
    whose = "every tenant" if tenant is None else f"tenant {tenant!r}"
    if pause:
        click.echo(f"Paused workflow {name!r} in namespace {namespace!r} for {whose}: none of "
                   f"its runs starts until 'shoal workflow resume'; running runs go on."
                   if changed else f"Workflow {name!r} was already paused for {whose}.")
    else:
        rest = (" (other pauses of it remain: 'shoal workflows')" if paused else "")
        click.echo(f"Resumed workflow {name!r} in namespace {namespace!r} for {whose}: its "
                   f"runs start again{rest}." if changed
                   else f"Workflow {name!r} was not paused for {whose}; nothing to resume{rest}.")


@workflow_group.command("pause", short_help="Start no run of a workflow until it is resumed.")
@_pause_command("pause")
def workflow_pause(ctx: click.Context, name: str, tenant: str | None, as_json: bool,
                   store_override: str | None, namespace_override: str | None) -> None:
    """Pause workflow NAME: no instance starts a run of it (of --tenant only, if given), a
    due sleeping or waiting run included, until 'shoal workflow resume'. Running runs go on
    and dispatch still queues. Without --namespace, the only namespace that has it."""
    _pause_or_resume(ctx, name, tenant, as_json, store_override, namespace_override, True)


@workflow_group.command("resume", short_help="Let a paused workflow's runs start again.")
@_pause_command("resume")
def workflow_resume(ctx: click.Context, name: str, tenant: str | None, as_json: bool,
                    store_override: str | None, namespace_override: str | None) -> None:
    """Resume workflow NAME, paused by 'shoal workflow pause' with the same --tenant (a pause
    of every tenant and one of a tenant are resumed apart): its due runs start again."""
    _pause_or_resume(ctx, name, tenant, as_json, store_override, namespace_override, False)


# -- stats -----------------------------------------------------------------------------------


def _stats_dict(stats: Stats) -> dict[str, Any]:
    out = dataclasses.asdict(stats)
    out.update(live=stats.live, executing=stats.executing, finished=stats.finished)
    return out


def _stats_table(stats: Stats, store: str, paused: list[PausedWorkflow]) -> list[Any]:
    """What ``shoal stats`` prints for one namespace: runs by workflow and status, queued runs
    by tenant, then a few lines (the paused workflows' among them, when there are some)."""
    table = Table(title=f"runs of namespace {escape(stats.namespace)!r} in {escape(store)} at "
                        f"{_when(stats.at)}", title_justify="left")
    table.add_column("workflow")
    for status in RunStatus:
        table.add_column(_status(status), justify="right")
    for name in sorted(stats.by_workflow):
        counts = stats.by_workflow[name]
        table.add_row(escape(name), *(str(counts.get(s.value, 0)) for s in RunStatus))
    table.add_section()
    table.add_row("[bold]all[/]", *(f"[bold]{stats.by_status[s.value]}[/]" for s in RunStatus))
    out: list[Any] = [table]
    if stats.queued:
        tenants = Table(title="queued runs by tenant", title_justify="left")
        for column in ("tenant", "due", "delayed", "held"):
            tenants.add_column(column, justify="left" if column == "tenant" else "right")
        for tenant, depth in stats.queued.items():
            tenants.add_row(escape(tenant), str(depth.due), str(depth.delayed), str(depth.held))
        out.append(tenants)
    age = stats.oldest_due_age
    ended = ", ".join(f"{n} {status}" for status, n in stats.finished_last_minute.items())
    out += [
        f"{stats.live} live, {stats.executing} executing. Oldest due run: "
        + ("none is due." if age is None else f"due for {age:,.1f} s."),
        f"Ended in the last minute: {ended}.",
        f"Pending pauses: {stats.pending_pauses}. Outbox: {stats.outbox_backlog} to deliver, "
        f"{stats.dead_letters} dead-lettered.",
    ]
    if paused:
        out.append("Paused workflows: " + ", ".join(
            f"{escape(p.workflow)} ({'every tenant' if p.tenant is None else escape(p.tenant)})"
            for p in paused) + ".")
    if stats.held_back:
        held = Table(title="due queued runs held back, by rule", title_justify="left")
        for column in ("workflow", "rule", "runs", "why"):
            held.add_column(column, justify="right" if column == "runs" else "left")
        for workflow, reasons in sorted(stats.held_back.items()):
            for reason, n in reasons.items():
                held.add_row(escape(workflow), reason, _held_count(n),
                             escape(HOLD_REASONS.get(reason, reason)))
        out.append(held)
    return out


def _held_count(n: int) -> str:
    """A count of held-back runs; one that reached the cap is a lower bound."""
    return f"{n:,}+" if n >= HELD_BACK_CAP else f"{n:,}"


@cli.command(short_help="Counts of runs by status, workflow and tenant; the queue's age.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per namespace, one per "
                                                      "line.")
@_target_options
@click.pass_context
def stats(ctx: click.Context, as_json: bool, store_override: str | None,
          namespace_override: str | None) -> None:
    """A namespace's runs by status and workflow, its queued runs by tenant (due now, delayed,
    held by admission control), how long the oldest due run has waited, the runs that ended in
    the last minute, pending pauses and the outbox: app.stats(). Without a namespace, every
    namespace where an instance registered workflows."""
    target = _target(ctx, store_override, namespace_override)

    async def read() -> list[tuple[Stats, list[PausedWorkflow]]]:
        async with _opened_store(target.store) as store:
            await _check_namespace(store, target)   # stats of any name are all zeros
            names = await _read_namespaces(store, target)
            found = []
            for name in names:
                app = App(name, store=store)
                async with app.open():
                    found.append((await app.stats(), await app.paused_workflows()))
            return found

    found = _run_async(read())
    if as_json:
        for one, paused in found:
            click.echo(json.dumps({**_stats_dict(one),
                                   "paused": [{"workflow": p.workflow, **_paused_dict(p)}
                                              for p in paused]}, ensure_ascii=False))
        return
    console = _console()
    if not found:
        console.print(f"No namespace has registered workflows in "
                      f"{escape(mask_url(target.store))}: give --namespace/-n NAME.")
        return
    for one, paused in found:
        for part in _stats_table(one, mask_url(target.store), paused):
            console.print(part)


# -- signal ----------------------------------------------------------------------------------


@cli.command(short_help="Send a signal with a JSON payload to a run.")
@click.argument("run_id")
@click.argument("name", type=NAME)
@click.argument("payload", metavar="[JSON]", required=False)
@click.option("--json", "as_json", is_flag=True, help="The run as it is now, as JSON.")
@_tenant_option("run")
@_target_options
@click.pass_context
def signal(ctx: click.Context, run_id: str, name: str, payload: str | None, as_json: bool,
           tenant: str | None, store_override: str | None,
           namespace_override: str | None) -> None:
    """Send signal NAME to run RUN_ID with a JSON payload (default null); a run waiting in
    ctx.wait_for(NAME) continues with it."""
    target = _target(ctx, store_override, namespace_override)
    value = _json_argument(payload, "The payload", '{"approved": true}')

    async def send() -> Run:
        async with _opened_store(target.store) as store, \
                _app_for_run(target, store, run_id) as app:
            await app.signal(run_id, name, value, tenant=tenant)
            return await app.get_run(run_id, tenant=tenant)

    found = _run_async(send())
    if as_json:
        click.echo(json.dumps(_run_dict(found), ensure_ascii=False))
    else:
        click.echo(f"Sent signal {name!r} to run {run_id} ({found.status}).")
    if found.status.final:
        click.echo(f"Note: run {run_id} has already ended; no one will receive this signal.",
                   err=True)


# -- approvals -------------------------------------------------------------------------------


@cli.command(short_help="List the pauses waiting for a decision.")
@click.option("--tenant", default=None, type=NAME, help="Only pauses of this tenant.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@_target_options
@click.pass_context
def pauses(ctx: click.Context, tenant: str | None, limit: int, as_json: bool,
           store_override: str | None, namespace_override: str | None) -> None:
    """The pending pauses (approvals), oldest first, at most --limit: of a namespace, or of
    every namespace where an instance registered workflows. Answer one with 'shoal approve
    PAUSE_ID' or 'shoal deny PAUSE_ID'."""
    target = _target(ctx, store_override, namespace_override)

    async def read() -> list[Pause]:
        async with _opened_store(target.store) as store:
            found: list[Pause] = []
            for name in await _read_namespaces(store, target):
                app = App(name, store=store)
                async with app.open():
                    found += await app.pending_pauses(tenant=tenant, limit=limit)
            if not found:
                await _check_namespace(store, target)
            found.sort(key=lambda p: (p.created_at, p.id))
            return found[:limit]

    found = _run_async(read())
    _print_listing(target, found, as_json, "pending pauses", "pending pauses",
                   ("pause", "name", "request", "created", "expires"),
                   lambda p: (escape(p.name), escape(_json_text(p.request, 120)),
                              _when(p.created_at), _when(p.expires_at)))


def _print_listing(target: _Target, found: list[Any], as_json: bool, what: str, title: str,
                   columns: tuple[str, ...], cells: Callable[[Any], tuple[str, ...]]) -> None:
    """Print ``found`` (records with ``id``, ``namespace`` and ``run_id``: pauses, dead
    letters) as JSON lines, or as a table of ``columns``: the id first, then the namespace (over
    every namespace) and the run, then the others, whose ``cells`` give."""
    if as_json:
        for item in found:
            click.echo(json.dumps(dataclasses.asdict(item), ensure_ascii=False))
        return
    where = (f"namespace {target.namespace!r}" if target.namespace is not None
             else f"any namespace of {mask_url(target.store)}")
    if not found:
        click.echo(f"No {what} in {where}.")
        return
    every = target.namespace is None
    table = Table(title=f"{title} of {escape(where.replace('any', 'every'))}",
                  title_justify="left")
    for column in (columns[0], *(("namespace",) if every else ()), "run", *columns[1:]):
        # ids whole: folded, a copied id would be wrong
        table.add_column(column, overflow="fold", no_wrap=column in (columns[0], "run"))
    for item in found:
        table.add_row(item.id, *((escape(item.namespace),) if every else ()), item.run_id,
                      *cells(item))
    _console().print(table)


def _answer(ctx: click.Context, pause_id: str, approved: bool, data: str | None,
            by: str | None, reason: str | None, tenant: str | None, as_json: bool,
            store_override: str | None, namespace_override: str | None) -> None:
    target = _target(ctx, store_override, namespace_override)
    value = _json_argument(data, "--data", '{"amount": 30}')

    async def answer() -> Pause:
        async with _opened_store(target.store) as store:
            namespace = target.namespace
            if namespace is None:
                found = await store.get_pause(pause_id)
                # another tenant's pause reads exactly like one that does not exist
                if found is None or (tenant is not None and found.tenant != tenant):
                    raise UnknownPauseError(f"No pause with id {pause_id!r}.")
                namespace = found.namespace
            app = App(namespace, store=store)
            async with app.open():
                return await app.resume(pause_id, approved=approved, data=value, by=by,
                                        tenant=tenant, reason=reason)

    resolved = _run_async(answer())
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(resolved), ensure_ascii=False))
        return
    verb = "Approved" if approved else "Denied"
    click.echo(f"{verb} pause {pause_id} ({resolved.name!r} of run {resolved.run_id}); the run "
               f"continues on any instance.")


def _answer_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = _tenant_option("pause")(fn)
    fn = click.option("--json", "as_json", is_flag=True,
                      help="The resolved pause as JSON.")(fn)
    fn = click.option("--by", default=None, metavar="NAME", help="Who decided.")(fn)
    fn = click.option("--reason", default=None, metavar="TEXT", help="Why, in your words.")(fn)
    fn = click.option("--data", default=None, metavar="JSON",
                      help="A JSON value given to the run with the decision.")(fn)
    return click.argument("pause_id")(fn)


@cli.command(short_help="Approve a pause: its run continues with approved=True.")
@_answer_options
@_target_options
@click.pass_context
def approve(ctx: click.Context, pause_id: str, data: str | None, by: str | None,
            reason: str | None, tenant: str | None, as_json: bool,
            store_override: str | None, namespace_override: str | None) -> None:
    """Approve pause PAUSE_ID (exactly one answer wins; a second gets an error)."""
    _answer(ctx, pause_id, True, data, by, reason, tenant, as_json, store_override,
            namespace_override)


@cli.command(short_help="Deny a pause: its run continues with approved=False.")
@_answer_options
@_target_options
@click.pass_context
def deny(ctx: click.Context, pause_id: str, data: str | None, by: str | None,
         reason: str | None, tenant: str | None, as_json: bool,
         store_override: str | None, namespace_override: str | None) -> None:
    """Deny pause PAUSE_ID (exactly one answer wins; a second gets an error)."""
    _answer(ctx, pause_id, False, data, by, reason, tenant, as_json, store_override,
            namespace_override)


# -- ledger ----------------------------------------------------------------------------------


def _amount(value: float) -> str:
    """Money as people read it: 12 significant digits (a sum's float noise, as in 0.1 + 0.2,
    does not show), never in exponent notation, thousands separated."""
    text = format(Decimal(f"{value:.12g}"), ",f")
    return "0" if text == "-0" else text


def _coordination_addresses(ctx: click.Context, param: click.Parameter,
                            value: str | None) -> str | list[str] | None:
    """``--coordination`` as ``App(coordination=…)`` takes it (a comma-separated list is a
    Redlock quorum), like ``App.from_env``; what the App would refuse is refused here, as a
    usage error that speaks the option instead of the App's argument."""
    if not value:
        return None
    addresses = [a.strip() for a in value.split(",") if a.strip()]
    for address in addresses:
        if not address.startswith(("redis://", "rediss://")):
            raise click.BadParameter(
                f"{address!r} is not a redis:// or rediss:// URL. Give the workers' Redis "
                f"(several, an odd number, separated by commas), or leave --coordination and "
                f"SHOAL_COORDINATION unset to read the run store.", ctx, param)
    if len(addresses) % 2 == 0:
        raise click.BadParameter(
            f"{len(addresses)} addresses given: a quorum of Redis servers is an odd number of "
            f"them.", ctx, param)
    return addresses if len(addresses) > 1 else addresses[0]


def _coordination_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--coordination URL[,URL...]`` (or SHOAL_COORDINATION), checked as it is parsed."""
    return click.option("--coordination", envvar="SHOAL_COORDINATION", default=None,
                        metavar="URL", callback=_coordination_addresses, help=help)


@cli.command(short_help="The cost ledger: who spent what, with a total per currency.")
@click.option("--tenant", default=None, metavar="NAME", type=NAME,
              help="Only what this tenant spent.")
@click.option("--root", "root_id", default=None, metavar="RUN_ID", type=RUN_ID,
              help="Only what this root run and its child runs spent.")
@click.option("--run", "run_id", default=None, metavar="RUN_ID", type=RUN_ID,
              help="Only what this run spent.")
@click.option("--after", default=None, type=click.IntRange(min=0), metavar="ID",
              help="Only rows after this id: the next page starts after the last id shown "
                   "(ids count within a namespace).")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(min=1),
              help="At most this many rows (of each namespace), oldest first.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per line, with its namespace.")
@_coordination_option("Where the app keeps its rate-limit state when not in the store: the "
                      "redis:// address of App(coordination=...), or several comma-separated "
                      "[env SHOAL_COORDINATION].")
@_target_options
@click.pass_context
def ledger(ctx: click.Context, tenant: str | None, root_id: str | None, run_id: str | None,
           after: int | None, limit: int, as_json: bool,
           coordination: str | list[str] | None, store_override: str | None,
           namespace_override: str | None) -> None:
    """The cost ledger (ctx.spend, app.spend, priced provider calls), oldest first, a page of
    --limit rows after --after, with the page's total per currency: of a namespace, else of
    the namespace of the run given to --root (or --run), else of every namespace where an
    instance registered workflows, each on its own."""
    target = _target(ctx, store_override, namespace_override)
    filters = {"tenant": tenant, "root_id": root_id, "run_id": run_id, "after": after,
               "limit": limit}
    pages = _run_async(_ledger_pages(target, coordination, filters))
    if as_json:
        for namespace, rows in pages:
            for entry in rows:
                click.echo(json.dumps({"namespace": namespace, **dataclasses.asdict(entry)},
                                      ensure_ascii=False))
        return
    every = len(pages) > 1
    where = ""
    if tenant is not None:
        where += f", tenant {tenant!r}"
    if root_id is not None:
        where += f", root run {root_id}"
    if run_id is not None:
        where += f", run {run_id}"
    if after is not None:
        where += f", after id {after}"
    console = _console()
    if not any(rows for _, rows in pages):
        space = (f"namespace {pages[0][0]!r}" if len(pages) == 1
                 else f"any namespace of {mask_url(target.store)}")
        console.print(f"No spending recorded for {escape(space + where)}.")
        return
    for namespace, rows in pages:
        if rows:
            _print_ledger(console, f"namespace {namespace!r}{where}", rows, limit,
                          f"-n {namespace} " if every else "")


async def _ledger_pages(target: _Target, coordination: str | list[str] | None,
                        filters: dict[str, Any]) -> list[tuple[str, list[SpendEntry]]]:
    """``shoal ledger``'s read: a page of rows per namespace covered, by namespace. Refuses
    (usage errors) an ``--after`` with several namespaces (ids count within one), a namespace
    the store has never seen and, when no row matched, a --root or --run that names no run
    of the tenant."""
    tenant = filters["tenant"]
    async with _opened_store(target.store) as store:
        named: dict[str, Run | None] = {}
        for option in ("root_id", "run_id"):
            if filters[option] is not None:
                run = await store.get_run(filters[option])
                # another tenant's run names nothing, like one that does not exist
                named[option] = None if run is None or (
                    tenant is not None and run.tenant != tenant) else run
        found = [run for run in named.values() if run is not None]
        names = ([found[0].namespace] if target.namespace is None and found
                 else await _read_namespaces(store, target))
        if filters["after"] is not None and len(names) > 1:
            raise click.BadParameter(
                f"a ledger row's id counts within one namespace, and this covers "
                f"{len(names)} ({', '.join(map(repr, names))}): give --namespace/-n NAME.",
                param_hint="'--after'")
        pages = []
        for name in names:
            app = App(name, store=store, coordination=coordination)
            async with app.open():
                pages.append((name, await app.ledger(**filters)))
                if target.namespace is not None and not pages[-1][1]:
                    await _check_namespace(store, target, functools.partial(_has_rows, app))
        if not any(rows for _, rows in pages):
            for option, run in named.items():
                if run is None:
                    whose = "" if tenant is None else f" of tenant {tenant!r}"
                    raise click.BadParameter(
                        f"no run{whose} has the id {filters[option]} and no ledger row names "
                        f"it.", param_hint=f"'--{option.removesuffix('_id')}'")
        return pages


async def _has_rows(app: App) -> bool:
    """Whether the app's namespace has a ledger row (where the app keeps its ledger)."""
    return bool(await app.ledger(limit=1))


def _print_ledger(console: Console, where: str, rows: list[SpendEntry], limit: int,
                  page_option: str) -> None:
    """One namespace's page of the ledger as a table, with its total per currency; when it is
    full, the option that shows the next page."""
    table = Table(title=f"cost ledger of {escape(where)}", title_justify="left")
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("when", no_wrap=True)
    table.add_column("tenant")
    table.add_column("run", no_wrap=True)
    table.add_column("root", no_wrap=True)
    table.add_column("provider")
    table.add_column("tokens", justify="right", no_wrap=True)
    table.add_column("amount", justify="right", no_wrap=True)
    table.add_column("currency")
    totals: dict[str, list[float]] = {}
    for entry in rows:
        totals.setdefault(entry.currency, []).append(entry.amount)
        table.add_row(str(entry.id), _when(entry.at), escape(entry.tenant),
                      entry.run_id or "[dim]-[/]",
                      entry.root_id or "[dim]-[/]",
                      escape(entry.provider) if entry.provider else "[dim]-[/]",
                      "[dim]-[/]" if entry.tokens is None else f"{entry.tokens:,}",
                      _amount(entry.amount), escape(entry.currency))
    table.add_section()
    for currency in sorted(totals):
        amounts = totals[currency]
        count = f"{len(amounts)} row{'' if len(amounts) == 1 else 's'}"
        table.add_row("", "[bold]total[/]", "", f"[dim]{count}[/]", "", "", "",
                      f"[bold]{_amount(math.fsum(amounts))}[/]", escape(currency))
    console.print(table)
    if len(rows) == limit:
        console.print(f"[dim]A page of {limit} rows (oldest first) is shown and added up; the "
                      f"next one: {escape(page_option)}--after {rows[-1].id}[/]")


# -- migrate ---------------------------------------------------------------------------------


@cli.command("export", short_help="A run's recorded history as JSON, for shoal replay.")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True,
              help="The history as JSON: its only form (accepted like on every command).")
@_tenant_option("run")
@_target_options
@click.pass_context
def export_run(ctx: click.Context, run_id: str, as_json: bool, tenant: str | None,
               store_override: str | None, namespace_override: str | None) -> None:
    """Print run RUN_ID's recorded history (the run's row and its checkpoints in order) as
    JSON, to check new workflow code against it with 'shoal replay FILE --app MODULE:APP'
    before deploying it: shoal export RUN_ID > run.json."""
    target = _target(ctx, store_override, namespace_override)

    async def read() -> dict[str, Any]:
        async with _opened_store(target.store) as store, \
                _app_for_run(target, store, run_id) as app:
            return await history.export(app, run_id, tenant=tenant)

    click.echo(json.dumps(_run_async(read()), ensure_ascii=False, indent=2))


@cli.command(short_help="Check workflow code against recorded histories (shoal export).")
@click.argument("files", metavar="FILE...", nargs=-1, required=True,
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("--app", "app_spec", required=True, metavar="MODULE:APP",
              help="The App whose workflow code to check, as for shoal worker.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per history.")
def replay(files: tuple[Path, ...], app_spec: str, as_json: bool) -> None:
    """Run the workflow code of MODULE:APP over each recorded history FILE (written by 'shoal
    export RUN_ID'), with no store and no side effects: each recorded step, sleep, wait,
    approval and child returns its recorded outcome, and the replay stops where the history
    ends. A LangGraph graph (run_graph) is checked against the super-steps its run recorded.
    Reports the first place where the code leaves the recorded path (the checkpoint's seq, its
    recorded name, the name the code reached, what differs), and what could not be checked;
    ends with how many histories replayed and failed; exits 1 when one does not replay."""
    app = _load_app(app_spec)

    async def check() -> list[tuple[Path, history.ReplayResult | str]]:
        results: list[tuple[Path, history.ReplayResult | str]] = []
        for path in files:
            try:
                results.append((path, await history.replay(app, path)))
            except (ValueError, ShoalError) as e:   # not a history; a workflow not in app
                results.append((path, str(e)))
        return results

    failed = 0
    console = _console()
    for path, result in _run_async(check()):
        if isinstance(result, str):
            failed += 1
            if as_json:
                click.echo(json.dumps({"file": str(path), "ok": False, "error": result}))
            else:
                console.print(f"[bold red]error[/] {escape(str(path))}: {escape(result)}")
            continue
        failed += not result.ok
        if as_json:
            click.echo(json.dumps({"file": str(path), **result.to_json()}, ensure_ascii=False))
        else:
            mark = "[green]ok[/]" if result.ok else "[bold red]FAILED[/]"
            console.print(f"{mark} {escape(str(path))}: {escape(str(result))}")
    if not as_json:
        verdict = f"[bold red]{failed} failed[/]" if failed else "0 failed"
        console.print(f"{len(files)} histor{'y' if len(files) == 1 else 'ies'}: "
                      f"{len(files) - failed} ok, {verdict}")
    if failed:
        sys.exit(1)


@cli.command(short_help="Create or upgrade the store; print its version.")
@click.option("--json", "as_json", is_flag=True,
              help='{"store": URL, "version": N} (the password masked).')
@_target_options
@click.pass_context
def migrate(ctx: click.Context, as_json: bool, store_override: str | None,
            namespace_override: str | None) -> None:
    """Create the store or bring its schema up to date, and print the schema version."""
    target = _target(ctx, store_override, namespace_override)

    async def go() -> int:
        async with _opened_store(target.store, create=True) as store:
            return await store.migrate()

    version = _run_async(go())
    if as_json:
        click.echo(json.dumps({"store": mask_url(target.store), "version": version}))
        return
    click.echo(f"{mask_url(target.store)} is at schema version {version}.")


# -- outbox ----------------------------------------------------------------------------------


@cli.group()
def outbox() -> None:
    """Outbox entries that were dead-lettered."""


@outbox.command("dead", short_help="List the dead-lettered outbox entries.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@_target_options
@click.pass_context
def outbox_dead(ctx: click.Context, limit: int, as_json: bool, store_override: str | None,
                namespace_override: str | None) -> None:
    """The dead-lettered outbox entries (app.dead_letters()), oldest first, at most --limit:
    of a namespace, or of every namespace where an instance registered workflows. Make one
    deliverable again with 'shoal outbox redrive ENTRY_ID'."""
    target = _target(ctx, store_override, namespace_override)

    async def read() -> list[OutboxEntry]:
        async with _opened_store(target.store) as store:
            found: list[OutboxEntry] = []
            for name in await _read_namespaces(store, target):
                app = App(name, store=store)
                async with app.open():
                    found += await app.dead_letters(limit)
            if not found:
                await _check_namespace(store, target)
            found.sort(key=lambda e: (e.created_at, e.id))
            return found[:limit]

    found = _run_async(read())
    _print_listing(target, found, as_json, "dead-lettered outbox entries", "dead letters",
                   ("entry", "topic", "attempts", "error", "created"),
                   lambda e: (escape(e.topic), str(e.attempts), escape(_first_line(e.error)),
                              _when(e.created_at)))


@outbox.command("redrive")
@click.argument("entry_id", type=NAME)
@click.option("--json", "as_json", is_flag=True, help="The entry as it is now, as JSON.")
@_target_options
@click.pass_context
def outbox_redrive(ctx: click.Context, entry_id: str, as_json: bool,
                   store_override: str | None, namespace_override: str | None) -> None:
    """Make dead-lettered outbox entry ENTRY_ID deliverable again (app.redrive): due now, its
    delivery attempts counted from 0. An entry that is not dead is refused (exit code 1)."""
    target = _target(ctx, store_override, namespace_override)

    async def go() -> OutboxEntry:
        async with _opened_store(target.store) as store:
            app = App(target.namespace or await _only_namespace(store), store=store)
            async with app.open():
                return await app.redrive(entry_id)

    entry = _run_async(go())
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(entry), ensure_ascii=False))
        return
    click.echo(f"Redrove outbox entry {entry_id} ({entry.topic!r} of run {entry.run_id}): "
               f"any instance with a handler for {entry.topic!r} delivers it now.")


async def _only_namespace(store: Store) -> str:
    """The one namespace whose instances registered workflows in ``store``; else ask for one."""
    names = await _known_namespaces(store)
    if len(names) != 1:
        raise click.ClickException(
            f"Which namespace? Give --namespace/-n NAME (or set SHOAL_NAMESPACE); the store "
            f"has {', '.join(map(repr, names)) or 'none with registered workflows'}.")
    return names[0]


# -- web -------------------------------------------------------------------------------------


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@cli.command(short_help="The console: a web page and a JSON API over the store.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Anything but loopback needs --token.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--token", envvar="SHOAL_WEB_TOKEN", default=None, metavar="TOKEN",
              help="Required of every request: 'Authorization: Bearer TOKEN' for the API, a "
                   "login form for the pages [env SHOAL_WEB_TOKEN].")
@click.option("--read-only", is_flag=True, help="Show everything, change nothing: every action "
                                                "is hidden and refused.")
@_coordination_option("The workers' coordination store, where the replicas page reads the "
                      "membership, locks and meters: the redis:// address of "
                      "App(coordination=...), or several comma-separated [env "
                      "SHOAL_COORDINATION]. Default: the run store.")
@_target_options
@click.pass_context
def web(ctx: click.Context, host: str, port: int, token: str | None, read_only: bool,
        coordination: str | list[str] | None, store_override: str | None,
        namespace_override: str | None) -> None:
    """Serve the console of one namespace (--namespace, else the one namespace whose workers
    registered in the store) at http://HOST:PORT/. It claims no run: any number may run
    beside the workers. Needs the web extra: pip install 'shoal[web]'."""
    target = _target(ctx, store_override, namespace_override)
    token = token or None
    if token is None and not _loopback(host):
        raise click.ClickException(
            f"Refusing to serve the console on {host}: anyone who can reach it could cancel "
            f"runs and answer approvals. Give --token TOKEN (or set SHOAL_WEB_TOKEN), or bind "
            f"to 127.0.0.1.")
    try:
        import uvicorn

        from shoal.web import asgi
    except ImportError as e:
        raise click.ClickException(f"The console needs the web extra ({e}): "
                                   f"pip install 'shoal[web]'.") from None
    _run_async(_check_console_target(target))
    console: Any = asgi(target.store, token=token, read_only=read_only,
                        namespace=target.namespace, coordination=coordination)
    if token is None:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        # loopback without a token: refuse other Host names (a DNS-rebinding page)
        console = TrustedHostMiddleware(console, allowed_hosts=[
            "127.0.0.1", "localhost", "::1", "[::1]"])
    click.echo(f"shoal console of {mask_url(target.store)} on http://{host}:{port}/"
               f"{' (read-only)' if read_only else ''}", err=True)
    uvicorn.run(console, host=host, port=port, log_level="warning")


async def _check_console_target(target: _Target) -> None:
    """Before the console serves: the store opens (one line, not a traceback from the web
    server's startup, when it cannot), the namespace given is one it has, and without one the
    store does not hold several to choose from."""
    async with _opened_store(target.store) as store:
        await _check_namespace(store, target)
        names = await _known_namespaces(store)
        if target.namespace is None and len(names) > 1:
            raise click.UsageError(
                f"The console shows one namespace, and {mask_url(target.store)} has several "
                f"({', '.join(map(repr, names))}): give --namespace/-n NAME.")


# -- demo ------------------------------------------------------------------------------------


@cli.command(short_help="The guided tour: replicas, one killed, nothing lost.")
@click.option("--runs", "runs_", default=36, show_default=True, type=click.IntRange(6, 500),
              help="How many runs to dispatch.")
@click.option("--workers", default=3, show_default=True, type=click.IntRange(2, 8),
              help="How many replica processes to start (one is killed).")
@click.option("--db", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="The SQLite file to use; it must not exist yet. Default: a fresh temporary "
                   "file.")
@click.option("--timeout", default=45.0, show_default=True, type=float,
              help="Give up (and fail) after this many seconds.")
@click.option("--keep", is_flag=True, help="Keep the temporary folder (database, logs) even "
                                           "when every check passes.")
def demo(runs_: int, workers: int, db: Path | None, timeout: float, keep: bool) -> None:
    """The guided tour: replicas on one SQLite file, one killed with SIGKILL mid-run, its runs
    continued by the others; ends with checks proven from the store. Exits 1 if one fails."""
    from shoal.demo import run_tour

    code = run_tour(runs=runs_, workers=workers, db=db, timeout=timeout, keep=keep)
    if code:
        sys.exit(code)


def main() -> None:
    """The ``shoal`` console script."""
    cli(prog_name="shoal")


if __name__ == "__main__":
    main()
