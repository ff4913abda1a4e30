"""shoal in a Django project (``pip install 'shoal[django]'``; docs/django.md).

Add ``"shoal.integrations.django"`` to ``INSTALLED_APPS`` and describe the store in settings::

    SHOAL = {
        "NAMESPACE": "shop",                  # default "default"
        "APP": "orders.workflows:app",        # the App that manage.py shoal_worker serves
        # "STORE": "postgresql://…",          # default: the database "DATABASE" names
        # "DATABASE": "default",              # whose transactions dispatch() joins
        # "SCHEMA": "shoal",                  # the store's schema there (PostgreSQL)
        # "JOIN_ATOMIC": True,                # dispatch() inside atomic() joins it
        # "OPTIONS": {"max_queued": 10_000},  # the Client's options (docs/clients.md):
        #                                     # max_queued, admission, version,
        #                                     # max_payload_bytes, migrate, clock, tracing,
        #                                     # close_timeout; make_app() takes the App's
    }

Without ``STORE`` the store lives in Django's own database (``DATABASES[DATABASE]``: its SQLite
file, or its PostgreSQL database in schema ``SCHEMA``), so that :func:`dispatch` inside
``transaction.atomic()`` writes the run in that transaction, through Django's own connection: the
run exists if and only if the transaction commits, and workers see it at the commit.

:func:`client` is the process's :class:`shoal.Client` on those settings (thread-safe, started
afresh in each forked gunicorn or uwsgi worker). :func:`make_app` builds the worker's
:class:`shoal.App` on the same store and namespace. ``manage.py shoal_worker`` serves it,
``manage.py shoal_migrate`` creates or upgrades the store.

The settings are checked at the first :func:`settings` call and by Django's system checks
(``manage.py check``, ``runserver``, ``migrate``, ``shoal_worker``…): a wrong key, option or
store URL is an ``ImproperlyConfigured`` naming it. Every step and outbox or pause handler a
shoal App runs in a Django process gets a request's connection hygiene: Django's
``close_old_connections`` before and after it, in the thread its code runs in.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from shoal.app import App, Client, Workflow
from shoal.errors import ConfigurationError
from shoal.integrations._options import client_options
from shoal.stores import open_store
from shoal.types import Run

__all__ = ["Settings", "client", "connection", "dispatch", "dispatch_many", "make_app",
           "settings"]

_KEYS = {"STORE", "NAMESPACE", "APP", "DATABASE", "SCHEMA", "JOIN_ATOMIC", "OPTIONS"}
# the App's own parameters that OPTIONS may carry to make_app() (not close_timeout, a Client's)
_APP_OPTIONS = frozenset(inspect.signature(App).parameters)


@dataclass(frozen=True)
class Settings:
    """``settings.SHOAL``, checked and completed."""

    store: str                 # the store's URL
    namespace: str
    database: str              # the alias of the database whose transactions dispatch joins
    join_atomic: bool
    app: str | None            # "module:attribute" of the worker's App
    options: dict[str, Any] = field(default_factory=dict)


_settings: Settings | None = None


def settings() -> Settings:
    """``settings.SHOAL`` (a dict; every key optional), checked, the store URL included (a
    scheme shoal has no store for is refused here, not at the first dispatch):
    ImproperlyConfigured names what is wrong. Read once; a change of the setting (a test's
    ``override_settings``) is read again."""
    global _settings
    found = _settings
    if found is None:
        found = _settings = _read_settings()
    return found


def _read_settings() -> Settings:
    given = getattr(django_settings, "SHOAL", {})
    if not isinstance(given, dict):
        raise ImproperlyConfigured(f"settings.SHOAL must be a dict, not {type(given).__name__}.")
    unknown = set(given) - _KEYS
    if unknown:
        raise ImproperlyConfigured(f"settings.SHOAL has unknown keys {sorted(unknown)}; it "
                                   f"takes {sorted(_KEYS)}.")
    try:
        options = client_options(given.get("OPTIONS", {}), "settings.SHOAL['OPTIONS']")
    except ConfigurationError as e:
        raise ImproperlyConfigured(str(e)) from None
    database = given.get("DATABASE", "default")
    if database not in django_settings.DATABASES:
        raise ImproperlyConfigured(f"settings.SHOAL['DATABASE'] is {database!r}, which is not "
                                   f"in settings.DATABASES.")
    store = given.get("STORE") or store_url(database, given.get("SCHEMA", "shoal"))
    namespace = given.get("NAMESPACE", "default")
    app = given.get("APP")
    for key, value in (("STORE", store), ("NAMESPACE", namespace)):
        if not isinstance(value, str) or not value:
            raise ImproperlyConfigured(f"settings.SHOAL[{key!r}] must be a non-empty str, not "
                                       f"{value!r:.80}.")
    try:
        open_store(store)   # builds it only: what a URL names is known without connecting
    except ConfigurationError as e:
        where = "settings.SHOAL['STORE']" if given.get("STORE") else "The store"
        raise ImproperlyConfigured(f"{where}: {e}") from None
    if app is not None and (not isinstance(app, str) or not app):
        raise ImproperlyConfigured(f"settings.SHOAL['APP'] is 'module:attribute' of your "
                                   f"shoal.App, not {app!r:.80}.")
    return Settings(store, namespace, database, bool(given.get("JOIN_ATOMIC", True)), app,
                    dict(options))


def store_url(alias: str = "default", schema: str = "shoal") -> str:
    """The store URL of Django's database ``alias``: its SQLite file, or its PostgreSQL
    database with the store in ``schema``."""
    db = django_settings.DATABASES[alias]
    engine = db.get("ENGINE", "")
    name = str(db.get("NAME") or "")
    if engine.endswith("sqlite3"):
        if not name or name == ":memory:" or name.startswith("file:"):
            raise ImproperlyConfigured(
                f"DATABASES[{alias!r}] is an SQLite database shoal cannot share ({name!r}): "
                f"give it a file path, or set settings.SHOAL['STORE'].")
        return f"sqlite:///{os.path.abspath(name)}"
    if "postgresql" in engine:
        user = quote(str(db.get("USER") or ""), safe="")
        password = quote(str(db.get("PASSWORD") or ""), safe="")
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        host = str(db.get("HOST") or "")
        port = f":{db['PORT']}" if db.get("PORT") else ""
        query = {"schema": schema}
        sslmode = (db.get("OPTIONS") or {}).get("sslmode")
        if sslmode:
            query["sslmode"] = sslmode
        return f"postgresql://{auth}{host}{port}/{quote(name, safe='')}?{urlencode(query)}"
    raise ImproperlyConfigured(
        f"DATABASES[{alias!r}] uses {engine!r}; shoal's store is SQLite or PostgreSQL: set "
        f"settings.SHOAL['STORE'] to a store URL.")


_lock = threading.Lock()
_client: Client | None = None


def client() -> Client:
    """The process's :class:`shoal.Client` on ``settings.SHOAL`` (made at the first call)."""
    global _client
    found = _client
    if found is not None:
        return found
    with _lock:
        if _client is None:
            s = settings()
            _client = Client(s.store, namespace=s.namespace, **s.options)
        return _client


def _reset() -> None:
    """Forget the settings and the client (the settings changed); it is closed."""
    global _client, _settings
    with _lock:
        old, _client, _settings = _client, None, None
    if old is not None:
        old.close()


def make_app(**kwargs: Any) -> App:
    """A :class:`shoal.App` on the store and namespace of ``settings.SHOAL`` (and its
    ``OPTIONS``, those an App takes), for the module that registers the workflows; ``kwargs``
    are App options (``max_concurrent_runs``, ``lease``…)."""
    s = settings()
    options = {k: v for k, v in s.options.items() if k in _APP_OPTIONS}
    return App(s.namespace, store=s.store, **{**options, **kwargs})


def _close_old_connections() -> None:
    """What Django does before and after each request (``django.db.close_old_connections``),
    done by shoal before and after each step and each outbox or pause handler in a Django
    process, in the thread that runs it: this thread's connections that had an unrecoverable
    error, or outlived ``CONN_MAX_AGE``, are closed, and the next query connects afresh (with
    ``CONN_HEALTH_CHECKS``, a kept one is checked before its next use). A connection inside
    ``atomic()`` is left alone: its transaction belongs to whoever opened it (a ``TestCase``'s
    thread, whose ORM calls an async step's ``sync_to_async`` runs)."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


def connection(using: str | None = None) -> object:
    """The DB-API connection under Django's connection ``using`` (default: SHOAL's
    ``DATABASE``), connected: a ``sqlite3.Connection`` or a psycopg 3 ``Connection``, for
    ``client().dispatch(..., connection=...)``."""
    conn = connections[using or settings().database]
    conn.ensure_connection()
    return conn.connection


def _joined(using: str | None) -> object | None:
    """Django's connection when a dispatch should join its transaction, else None."""
    s = settings()
    alias = using or s.database
    if not s.join_atomic or not connections[alias].in_atomic_block:
        return None
    return connection(alias)


def dispatch(workflow: str | Workflow[Any, Any], input: Any = None, *, using: str | None = None,
             **options: Any) -> Run:
    """``client().dispatch(...)``: inside ``transaction.atomic()`` (on SHOAL's ``DATABASE``,
    or ``using``) the run is written in that transaction, and exists iff it commits; outside
    one it is committed at once. ``options`` are ``shoal.Client.dispatch``'s."""
    return client().dispatch(workflow, input, connection=_joined(using), **options)


def dispatch_many(workflow: str | Workflow[Any, Any], inputs: Iterable[Any], *,
                  using: str | None = None, **options: Any) -> list[Run]:
    """``client().dispatch_many(...)``, joining the transaction as :func:`dispatch` does."""
    return client().dispatch_many(workflow, inputs, connection=_joined(using), **options)


# awaited around an async step: it runs where the step's sync_to_async(...) ORM calls run
_close_old_connections_async = sync_to_async(_close_old_connections)
