"""Writes in the caller's own transaction (``app.dispatch(..., connection=conn)``).

The caller hands over its ``sqlite3.Connection`` to the store's file (as ``main`` or attached under
another name). :func:`caller_schema` checks it and names the store's file in it; the store then runs
its own statements on it, each table written ``"name".table``, and commits nothing: the rows exist
once the caller commits, and never if it rolls back. The statements run on the event loop's
thread (a ``sqlite3`` connection belongs to its thread), and a write waits for the file's lock as
the caller's connection says (its ``timeout``). Workers notice the commit by ``PRAGMA
data_version``, as they notice any other process's write. A batch (``create_runs_in``) looks its
keys up and inserts in a transaction that holds the write lock (:func:`begin`), inside a
savepoint, so that it is all or nothing in the caller's transaction.
"""

from __future__ import annotations

import functools
import os
import sqlite3

from shoal.backends._sql import qualified, queries
from shoal.errors import ConfigurationError

_Q = queries("sqlite")


def caller_schema(connection: object, path: str) -> str:
    """The name under which ``connection`` has the store's file ``path`` (``main`` unless the
    caller attached it): a TypeError unless it is a ``sqlite3.Connection``; a
    ConfigurationError if it would commit each statement at once (autocommit outside a
    transaction) or has not the store's file. Reads nothing but ``PRAGMA database_list``."""
    if not isinstance(connection, sqlite3.Connection):
        raise TypeError(
            f"dispatch(connection=...) on the SQLite store takes a sqlite3.Connection to the "
            f"store's file, not {type(connection).__name__}.")
    if path == ":memory:":
        raise ConfigurationError(
            "dispatch(connection=...) cannot join the store sqlite:///:memory:: an in-memory "
            "database is the store's one connection, no other connection can open it. Use a "
            "file, or dispatch without connection=.")
    if not connection.in_transaction and _autocommits(connection):
        raise ConfigurationError(
            "The connection given to dispatch(connection=...) is in autocommit mode outside a "
            "transaction, so the run would be committed at once, alone. Run 'BEGIN' on it "
            "first (or open it with the default isolation_level), or dispatch without "
            "connection= to commit it at once.")
    cur = connection.cursor()
    cur.row_factory = None
    files = [(name, file) for _, name, file in cur.execute("PRAGMA database_list")]
    cur.close()
    for name, file in files:
        if file and _same_file(file, path):
            return str(name)
    raise ConfigurationError(
        f"The connection given to dispatch(connection=...) has "
        f"{', '.join(repr(f or name) for name, f in files)} open, not the store's file "
        f"{os.path.abspath(path)!r}: pass a connection to the store's file (or one that "
        f"attached it), or dispatch without connection=.")


def begin(connection: sqlite3.Connection) -> bool:
    """Begin a transaction on ``connection`` that holds the write lock (``BEGIN IMMEDIATE``, or
    ``EXCLUSIVE`` when that is its isolation level), unless it is in one: whether it began one.
    The lock is waited for as the connection's ``timeout`` says."""
    if connection.in_transaction:
        return False
    level = (connection.isolation_level or "").upper()
    connection.execute("BEGIN EXCLUSIVE" if level == "EXCLUSIVE" else "BEGIN IMMEDIATE")
    return True


def _autocommits(connection: sqlite3.Connection) -> bool:
    """Whether a write outside a transaction commits at once: ``autocommit=True`` (Python
    3.12+), or the legacy mode with ``isolation_level=None``."""
    autocommit = getattr(connection, "autocommit", None)
    if autocommit is True:
        return True
    legacy = autocommit is None or autocommit == getattr(
        sqlite3, "LEGACY_TRANSACTION_CONTROL", -1)
    return legacy and connection.isolation_level is None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


@functools.cache
def query(name: str, schema: str) -> str:
    """The named statement with the store's tables qualified by ``schema``."""
    return qualified(_Q[name], schema, "sqlite")
