"""shoal in a Flask app (``pip install 'shoal[flask]'``; docs/flask.md): the extension object.

::

    shoal_ext = Shoal()                    # in extensions.py

    def create_app() -> Flask:
        app = Flask(__name__)
        app.config["SHOAL_STORE"] = "sqlite:///shop.db"
        shoal_ext.init_app(app)
        return app

    shoal_ext.client.dispatch("fulfil", {"order": 42})   # in a view

Configuration: ``SHOAL_STORE`` (the store URL, required), ``SHOAL_NAMESPACE`` (default
``"default"``), ``SHOAL_OPTIONS`` (the Client's options: ``max_queued``, ``admission``,
``version``, ``max_payload_bytes``, ``migrate``, ``clock``, ``tracing``, ``close_timeout``; an
unknown one is a ConfigurationError naming it) and ``SHOAL_WORKER_APP`` (``module:attribute``
of the worker's :class:`shoal.App`, or of a function returning one, called in the app context).
The values given to ``Shoal(...)`` are the defaults. ``flask shoal worker`` serves the worker App
until SIGTERM or Ctrl-C; ``flask shoal migrate`` creates or upgrades the store; an error of
shoal's own ends either with one line, as ``shoal worker`` does.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click
from flask import Flask, current_app
from flask.cli import AppGroup

from shoal.app import Client
from shoal.app.collector import tune_from_env
from shoal.errors import ConfigurationError
from shoal.integrations._commands import migrate as migrate_store
from shoal.integrations._commands import one_line, serve
from shoal.integrations._loading import load_app
from shoal.integrations._options import client_options
from shoal.stores import mask_url

__all__ = ["Shoal"]
T = TypeVar("T")


@dataclass
class _State:
    client: Client
    worker: str | None


class Shoal:
    """The Flask extension: one :class:`shoal.Client` per Flask app (``.client``, for the app
    of the current request or app context), and the ``flask shoal`` commands."""

    def __init__(self, app: Flask | None = None, *, store: str | None = None,
                 namespace: str | None = None, worker: str | None = None,
                 **options: Any) -> None:
        self.store = store
        self.namespace = namespace
        self.worker = worker
        self.options = client_options(options, "Shoal(...)")
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Make the app's Client (it connects at its first call) and add ``flask shoal``."""
        config = app.config
        store = config.get("SHOAL_STORE", self.store)
        if not isinstance(store, str) or not store:
            raise ConfigurationError(
                f"Flask app {app.name!r}: set app.config['SHOAL_STORE'] to the store URL "
                f"(e.g. 'sqlite:///shop.db'), or give Shoal(store=...).")
        options = {**self.options, **client_options(
            config.get("SHOAL_OPTIONS", {}), f"Flask app {app.name!r}: "
                                              f"app.config['SHOAL_OPTIONS']")}
        client = Client(store, namespace=config.get("SHOAL_NAMESPACE",
                                                    self.namespace or "default"), **options)
        app.extensions["shoal"] = _State(client, config.get("SHOAL_WORKER_APP", self.worker))
        app.cli.add_command(_commands())

    @property
    def client(self) -> Client:
        """The current app's Client (RuntimeError outside an app context)."""
        return _state(current_app).client


def _state(app: Flask) -> _State:
    state = app.extensions.get("shoal")
    if not isinstance(state, _State):
        raise ConfigurationError(f"Flask app {app.name!r} has no shoal extension: call "
                                 f"Shoal(app) or shoal.init_app(app) in its factory.")
    return state


def _one_line(fn: Callable[[], T]) -> T:
    """``fn()``; an error of shoal's own ends the command with one line (``Error: …``), as
    ``shoal worker`` does, instead of a traceback."""
    try:
        return fn()
    except Exception as e:
        line = one_line(e)
        if line is None:
            raise
        raise click.ClickException(line) from None


def _commands() -> AppGroup:
    group = AppGroup("shoal", help="shoal's worker and store commands.")

    @group.command("worker")
    @click.argument("app_spec", metavar="[MODULE:APP]", required=False)
    @click.option("--concurrency", type=click.IntRange(min=1), default=None,
                  help="Runs executed at once (the App's max_concurrent_runs).")
    @click.option("--shutdown-timeout", type=float, default=25.0, show_default=True,
                  help="Seconds a stop waits for running runs.")
    def worker(app_spec: str | None, concurrency: int | None, shutdown_timeout: float) -> None:
        """Serve the worker App (SHOAL_WORKER_APP, or MODULE:APP) until SIGTERM or Ctrl-C."""
        spec = app_spec or _state(current_app).worker
        if not spec:
            raise click.UsageError("Name the App to serve: app.config['SHOAL_WORKER_APP'] = "
                                   "'shop.workflows:app', or flask shoal worker MODULE:APP.")
        served = _one_line(lambda: load_app(spec, "MODULE:APP" if app_spec
                                            else "SHOAL_WORKER_APP"))
        if concurrency is not None:
            served.max_concurrent_runs = concurrency
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                                format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        try:   # a process of its own: as `shoal worker` does (shoal.app.collector)
            tuned = tune_from_env()
        except ValueError as e:
            raise click.ClickException(str(e)) from None

        def announce() -> None:   # once connected: an unreachable store is one error line
            click.echo(f"flask shoal worker: serving {served!r}, max_concurrent_runs="
                       f"{served.max_concurrent_runs}, gc={'tuned' if tuned else 'default'}; "
                       f"SIGTERM or Ctrl-C stops it gracefully.", err=True)

        _one_line(lambda: serve(served, shutdown_timeout, announce))

    @group.command("migrate")
    def migrate() -> None:
        """Create or upgrade the store of SHOAL_STORE; print its schema version."""
        client = _state(current_app).client
        version = _one_line(lambda: migrate_store(client.namespace, client.store_url))
        click.echo(f"{mask_url(client.store_url)} is at schema version {version}.")

    return group
