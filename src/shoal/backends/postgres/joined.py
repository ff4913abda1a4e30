"""Writes in the caller's own transaction (``app.dispatch(..., connection=conn)``, and
``app.dispatch_many``).

The caller hands over its psycopg 3 connection, an ``AsyncConnection`` or a sync ``Connection``
(whose statements run in a worker thread, so the event loop never blocks on them), to the
store's database. :class:`CallerConnections` checks it once (the same server and database, the
store's schema there) and runs the store's own named statements on it, each table written
``"schema".table``: the caller's ``search_path`` stays as the caller set it. Nothing is committed
here. The rows, and the ``pg_notify`` that wakes the workers, take effect when the caller commits,
and not at all if it rolls back.

A plan (such as :func:`create_run`) is an async function of an :data:`Execute`. The store's
``create_runs`` is one too: it runs on the store's own connection under the admission lock, or,
as ``create_runs_in``, here without it (the rule :func:`create_run` states), with one
``insert_runs`` statement and so one ``pg_notify`` per batch.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import DictRow, dict_row

from shoal.backends._sql import qualified, queries
from shoal.errors import AdmissionRejectedError, ConfigurationError, StoreUnavailableError

_Q = queries("postgres")
_IDENTITY = ("database", "database_oid", "started")

# Runs the named statement of queries.sql with these arguments in the caller's transaction.
Execute = Callable[[str, dict[str, Any]], Awaitable[list[DictRow]]]


class CallerConnections:
    """The callers' connections a store of ``schema`` writes in. ``identify`` reads the store's
    own ``database_identity`` row (on its pool) for a connection to be compared with."""

    def __init__(self, schema: str, store: str,
                 identify: Callable[[], Awaitable[DictRow | None]]) -> None:
        self.schema = schema
        self.store = store   # the masked URL, for messages
        self._identify = identify
        self._identity: DictRow | None = None
        # connection -> the backend pid it was checked on (a connection never changes database)
        self._checked: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
        self._queries: dict[str, str] = {}

    def query(self, name: str) -> str:
        """The named statement with the store's tables qualified by its schema."""
        text = self._queries.get(name)
        if text is None:
            text = self._queries[name] = qualified(_Q[name], self.schema, "postgres")
        return text

    async def join(self, connection: object) -> Execute:
        """How to run statements in ``connection``'s transaction, once it is checked: a TypeError
        unless it is a psycopg 3 connection; a ConfigurationError if it is closed, failed, in
        autocommit outside a transaction, or on another database (the caller's transaction
        then as it was)."""
        execute: Execute
        if isinstance(connection, psycopg.AsyncConnection):
            execute = self._async(connection)
        elif isinstance(connection, psycopg.Connection):
            execute = self._sync(connection)
        else:
            raise TypeError(
                f"dispatch(connection=...) on the PostgreSQL store takes a psycopg 3 "
                f"AsyncConnection or Connection to the store's database, not "
                f"{type(connection).__name__}.")
        self._check_state(connection)
        began = connection.info.transaction_status == pq.TransactionStatus.IDLE
        pid = connection.info.backend_pid
        if self._checked.get(connection) != pid:
            found = (await execute("database_identity", {"schema": self.schema}))[0]
            refusal = await self._refusal(found)
            if refusal is not None:
                if began:
                    # our check opened the transaction: close it, as the caller had it
                    await _rollback(connection)
                raise ConfigurationError(refusal)
            self._checked[connection] = pid
        return execute

    def _check_state(self, connection: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
                     ) -> None:
        status = connection.info.transaction_status
        if connection.closed or status == pq.TransactionStatus.UNKNOWN:
            raise ConfigurationError(
                "The connection given to dispatch(connection=...) is closed or broken.")
        if status == pq.TransactionStatus.INERROR:
            raise ConfigurationError(
                "The transaction of the connection given to dispatch(connection=...) has "
                "failed: roll it back, then dispatch in a new one.")
        if status == pq.TransactionStatus.IDLE and connection.autocommit:
            raise ConfigurationError(
                "The connection given to dispatch(connection=...) is in autocommit mode outside "
                "a transaction, so the run would be committed at once, alone. Dispatch inside "
                "'async with conn.transaction():' (or 'with conn.transaction():'), or without "
                "connection= to commit it at once.")

    async def _refusal(self, found: DictRow) -> str | None:
        """Why a connection whose ``database_identity`` is ``found`` is not the store's, or
        None. The store's own row is read again once before refusing (the server may have
        restarted since it was read)."""
        for fresh in (self._identity is None, True):
            if fresh:
                self._identity = await self._identify()
            ours = self._identity
            if ours is not None and all(found[k] == ours[k] for k in _IDENTITY):
                if found["has_store"]:
                    return None
                return (f"The connection given to dispatch(connection=...) is to the store's "
                        f"database, but its schema {self.schema!r} holds no shoal store.")
        where = (f"database {found['database']!r}" if ours is None
                 or found["database"] != ours["database"] else
                 f"a database {found['database']!r} on another server")
        return (f"The connection given to dispatch(connection=...) is to {where}, not to the "
                f"store's ({self.store}): pass a connection to the store's database, or "
                f"dispatch without connection=.")

    # Cursors of psycopg's default class whatever the connection's cursor_factory (a raw cursor
    # would not take %(name)s); every statement run here returns rows (fetched even in
    # pipeline mode, where a result is known only once fetched).

    def _async(self, connection: psycopg.AsyncConnection[Any]) -> Execute:
        async def execute(name: str, args: dict[str, Any]) -> list[DictRow]:
            async with psycopg.AsyncCursor(connection, row_factory=dict_row) as cur:
                await cur.execute(self.query(name), args)
                return await cur.fetchall()

        return execute

    def _sync(self, connection: psycopg.Connection[Any]) -> Execute:
        def run(name: str, args: dict[str, Any]) -> list[DictRow]:
            with psycopg.Cursor(connection, row_factory=dict_row) as cur:
                cur.execute(self.query(name), args)
                return cur.fetchall()

        async def execute(name: str, args: dict[str, Any]) -> list[DictRow]:
            return await asyncio.to_thread(run, name, args)

        return execute


async def _rollback(connection: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    if isinstance(connection, psycopg.AsyncConnection):
        await connection.rollback()
    else:
        await asyncio.to_thread(connection.rollback)


async def create_run(
    execute: Execute, args: dict[str, Any], *, max_queued: int | None, admission: str,
) -> tuple[DictRow, bool]:
    """The store's ``create_run`` (``args`` as it builds them) in the caller's transaction. No
    admission lock: held until the caller commits, it would stall every dispatch of the
    namespace behind the caller's transaction. So admission counts the runs the transaction
    sees: runs dispatched by transactions not yet committed are not counted."""
    namespace = args["namespace"]
    if max_queued is not None:
        if args["idempotency_key"] is not None:
            found = await execute("find_idempotent", args)
            if found:
                return found[0], False
        [counts] = await execute("count_queued", {"namespace": namespace,
                                                  "max_queued": max_queued})
        if counts["queued"] >= max_queued or counts["parked"] > 0:
            if admission == "reject":
                raise AdmissionRejectedError(namespace, max_queued)
            args = {**args, "held": True}
    inserted = await execute("insert_run", args)
    if inserted:
        return inserted[0], True
    # the key's run exists, committed or inserted earlier in this very transaction
    found = await execute("find_idempotent", args)
    if not found:
        raise StoreUnavailableError(
            f"The run of idempotency key {args['idempotency_key']!r} was inserted by another "
            f"transaction but cannot be read back in this one (REPEATABLE READ or SERIALIZABLE "
            f"began before it committed): roll back and try again.")
    return found[0], False
