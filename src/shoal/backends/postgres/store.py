"""PostgreSQL store: several replicas on several machines over one database.

psycopg 3 (async) with a connection pool. Every table lives in the store's own schema (default
``shoal``), set as each pooled connection's ``search_path``; the schema is created from
``schema.sql`` and upgraded by versioned ``.sql`` migrations, under an advisory lock, so instances
that start together migrate once. Pooled connections run in autocommit: an operation that is one
statement (a claim, a checkpoint, a settlement) costs one round trip and one commit; the others run
in one explicit transaction. Claims lock their rows with ``FOR UPDATE SKIP LOCKED``, and a unique
partial index makes the database itself refuse a second live run of a concurrency key. Writes
that make work due for another instance ``NOTIFY`` a channel named after the schema;
:meth:`PostgresStore.wait_for_work` listens on a dedicated connection (outside the pool) that
reconnects when it drops.

Behind a pooler in transaction mode (``?pooler=transaction``: PgBouncer's ``pool_mode =
transaction``, RDS Proxy, Supavisor, Neon's pooler) consecutive transactions of one client
connection may run on different server connections, so the store keeps no session state: no
``SET``, no LISTEN, no prepared statement (``prepare_threshold=None``). Each transaction sets the
search_path and ``shoal.counted`` itself, for itself only (``SET LOCAL`` after ``BEGIN``, in the
same message; ``set_config(..., true)`` ahead of a lone statement, in one pipeline): no extra
round trip, and nothing parses or rewrites the statements. LISTEN goes to ``?direct_url=`` when
given (a URL of the server itself); without it, wake-ups come from polling (see
:data:`POLL_INTERVAL`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import math
import operator
import re
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, Literal, LiteralString, TypeVar
from urllib.parse import unquote, urlencode, urlsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from shoal import _json
from shoal.backends._batches import (
    Key,
    answers,
    firsts,
    held_flags,
    key_of,
    namespace_of,
    queued_run,
)
from shoal.backends._sql import behind, current_schema, migrations, progress_of, queries
from shoal.backends._stats import keep, since, stats_from_rows
from shoal.backends._urls import mask_url
from shoal.backends.postgres import joined
from shoal.backends.postgres.coord import PostgresCoordination
from shoal.backends.postgres.graphs import PostgresGraphCheckpoints
from shoal.backends.postgres.rates import PostgresRateLimits
from shoal.backends.postgres.turns import Turns
from shoal.errors import AdmissionRejectedError, ConfigurationError, StoreUnavailableError
from shoal.types import (
    JSON,
    WORKFLOW_INSTANCE_RETENTION,
    Fence,
    NewRun,
    OutboxEntry,
    Pause,
    PauseWait,
    Progress,
    Renewal,
    Run,
    RunFilter,
    RunOwner,
    RunRecord,
    RunStatus,
    Settlement,
    SignalRecord,
    SignalWait,
    Stats,
    Step,
    StepRecord,
    WorkflowInfo,
)

log = logging.getLogger("shoal.store.postgres")

# The statements come from the package's own files, never from input (psycopg types queries as
# LiteralString so that user data formatted into SQL is a type error).
_Q = queries("postgres")
_SCHEMA = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,48}$")
# shoal's own URL options; every other query option goes to libpq as written
_OPTIONS = {"schema", "pool_min_size", "pool_max_size", "open_timeout", "pool_timeout",
            "reconnect_timeout", "command_timeout", "pooler", "direct_url"}
_POOLERS = ("session", "transaction")
# Without LISTEN (pooler=transaction and no direct_url), how often the store asks which lock
# waiters a release made first in line (PostgresStore._poll). Idle workers look for due runs
# every second anyway (the engine's watch loop, runner.py): a dispatch starts within about a
# second rather than at once.
POLL_INTERVAL = 1.0
# Transient refusals of one transaction: it did nothing, so it is run again.
_RETRYABLE = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)
_Conn = psycopg.AsyncConnection[DictRow]
_T = TypeVar("_T")
_BATCH = 500   # rows per batched statement at most
# create_runs copies a batch of at least this many new runs without idempotency keys in (COPY,
# then NOTIFY, in a transaction: 5 round trips, as cheap as insert_runs' one at 100 runs; half
# its time per run at 1,000)
_COPY_MIN = 100
_COPY_CHUNK = 250   # rows per write of a COPY (about 40 KB of no-op runs)
# COPY's text format: these characters of a value are written escaped
_COPY_SPECIAL = re.compile(r"[\\\t\n\r]")
_COPY_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
_SETTLE_COLUMNS = ("id", "owner", "epoch", "status", "output", "error", "finished_at", "run_at",
                   "attempt_inc", "traceback")


class PostgresStore(PostgresCoordination, PostgresRateLimits, PostgresGraphCheckpoints):
    """The ``postgresql://user:password@host:port/db?schema=shoal`` store.

    ``schema`` is created if missing and holds every table; ``pool_min_size``/``pool_max_size``
    size the connection pool (default 1 and 10). Operations take turns at the connections, first
    come, first served (renewals first); those waiting fail only when the queue has not moved
    (no operation got a connection) for ``pool_timeout`` seconds (default 2), so a burst of any
    size completes and an outage fails fast. ``reconnect_timeout`` (default 3 s) bounds the
    pool's reconnect backoff, so work resumes as soon as the server is back (psycopg_pool's own
    defaults, 30 s and 300 s with exponential backoff, left instances idle for tens of seconds
    after a long outage). ``command_timeout`` (default 30 s) bounds how long an operation's
    statements may go unanswered: past it the connection is closed, never used again, and the
    operation fails with StoreUnavailableError. A partition that holds the bytes (no reset, so
    no error, and TCP keepalives answered by a proxy on the way) would otherwise leave the
    operation, and its pooled connection, waiting for ever. Migrations are not bounded. Other
    query options go to libpq as written (``sslmode``, ``connect_timeout``,
    ``host=/socket/dir``, …).
    """

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = "shoal",
        pool_min_size: int = 1,
        pool_max_size: int = 10,
        open_timeout: float = 10.0,
        pool_timeout: float = 2.0,
        reconnect_timeout: float = 3.0,
        command_timeout: float = 30.0,
        pooler: str | None = None,
        direct_url: str | None = None,
    ) -> None:
        super().__init__()
        if pooler is not None and pooler not in _POOLERS:
            raise ConfigurationError(
                f"pooler={pooler!r} is not a pooling mode shoal knows: write pooler=transaction "
                f"behind a pooler that lends a server connection per transaction (PgBouncer's "
                f"pool_mode = transaction, RDS Proxy, Supabase's or Neon's pooler), "
                f"pooler=session behind one that keeps it for the whole connection, or leave "
                f"it out.")
        if not _SCHEMA.match(schema):
            raise ConfigurationError(
                f"Bad PostgreSQL schema name {schema!r}: use letters, digits and underscores, "
                f"starting with a letter or an underscore, at most 49 characters."
            )
        _check_options(pool_min_size=pool_min_size, pool_max_size=pool_max_size,
                       open_timeout=open_timeout, pool_timeout=pool_timeout,
                       reconnect_timeout=reconnect_timeout, command_timeout=command_timeout)
        self.conninfo = conninfo
        self.schema = schema
        self.pooler = pooler
        self.direct_url = direct_url
        # no session state: every transaction scopes its settings to itself (see the module)
        self.stateless = pooler == "transaction"
        shown = {"schema": schema, **({"pooler": pooler} if pooler else {}),
                 **({"direct_url": direct_url} if direct_url else {})}
        self.url = f"{conninfo}{'&' if '?' in conninfo else '?'}{urlencode(shown)}"
        # the store's schema as a search_path value (the name is checked above: no quote in it)
        self._search_path = f'"{schema}"'
        # a lone statement's prelude in a stateless store's pipelines (see _execute)
        self._scope: list[tuple[LiteralString, dict[str, Any]]] = [
            ("SELECT set_config('search_path', %(path)s, true), "
             "set_config('shoal.counted', 'on', true)", {"path": self._search_path})
        ] if self.stateless else []
        # The runs_ended trigger (schema.sql, 0003_trees.sql) builds the same name from its
        # table's schema.
        self.channel = f"shoal_{schema}"
        self.pool_min_size = pool_min_size
        self.pool_max_size = pool_max_size
        self.open_timeout = open_timeout
        self.pool_timeout = pool_timeout
        self.reconnect_timeout = reconnect_timeout
        self.command_timeout = command_timeout
        self._pool: AsyncConnectionPool[_Conn] | None = None
        self._work = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()   # set while the LISTEN connection is up
        self._sweeping: asyncio.Task[None] | None = None
        self._settles = _Batcher(self, "settle", _SETTLE_COLUMNS)
        self._checkpoints = _Batcher(self, "checkpoint", ("id", "owner", "epoch", "expires",
                                                          "seq", "name", "output", "finished",
                                                          "finished_at", "started_at",
                                                          "attempt", "retries"))
        self._progress = _Batcher(self, "record_progress",
                                  ("id", "owner", "epoch", "progress", "progress_at"))
        self._busy = 0   # operations holding or waiting for a pooled connection
        self._turns = Turns(pool_max_size, pool_timeout)
        self._sticky = _Sticky()
        # every connection the pool made: close() closes those the pool could not
        self._pooled: weakref.WeakSet[_Conn] = weakref.WeakSet()
        self._callers = joined.CallerConnections(
            schema, mask_url(self.url),
            lambda: self._one(_Q["database_identity"], {"schema": schema}))

    @property
    def in_flight(self) -> int:
        """Operations not answered yet (waiting on the server or queued for a batch): a test
        that settles an event loop waits for 0."""
        return self._busy + len(self._settles.queue) + len(self._checkpoints.queue)

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        """Any libpq URL (``postgresql://`` or ``postgres://``: Unix sockets, host lists,
        ``?host=/dir``, ``sslmode`` and the other libpq parameters) as psycopg takes it, with
        shoal's own options (``schema``, ``pool_min_size``, …) taken out of the query. An option
        that is neither shoal's nor libpq's, or a bad value of shoal's, is a ConfigurationError
        naming it."""
        if not url.startswith(("postgresql://", "postgres://")):
            raise ConfigurationError(
                f"Bad PostgreSQL URL {mask_url(url)!r}: write "
                f"'postgresql://user:password@host:5432/database?schema=shoal'."
            )
        conninfo, ours = _split_options(url)
        try:
            conninfo_to_dict(conninfo)   # libpq's own parser: what it refuses, it never connects
        except psycopg.Error as e:
            raise ConfigurationError(f"Bad PostgreSQL URL {mask_url(url)!r}: {e}") from None
        direct = ours.get("direct_url")
        if direct is not None:
            try:
                conninfo_to_dict(direct)
            except psycopg.Error:
                # libpq's reason may quote the value, password and all: not shown
                raise ConfigurationError(
                    f"direct_url in the PostgreSQL URL {mask_url(url)!r} is not a URL libpq "
                    f"can read: write the server's own URL, percent-encoded, as in "
                    f"?direct_url=postgresql%3A%2F%2Fuser%40host%3A5432%2Fdb.") from None

        def number(name: str, kind: type[int] | type[float], default: float) -> Any:
            if name not in ours:
                return default
            try:
                return kind(ours[name])
            except ValueError:
                raise ConfigurationError(
                    f"{name}={ours[name]!r} in the PostgreSQL URL {mask_url(url)!r} is not "
                    f"{'a whole number' if kind is int else 'a number of seconds'}."
                ) from None

        return cls(
            conninfo,
            schema=ours.get("schema", "shoal"),
            pool_min_size=number("pool_min_size", int, 1),
            pool_max_size=number("pool_max_size", int, 10),
            open_timeout=number("open_timeout", float, 10.0),
            pool_timeout=number("pool_timeout", float, 2.0),
            reconnect_timeout=number("reconnect_timeout", float, 3.0),
            command_timeout=number("command_timeout", float, 30.0),
            pooler=ours.get("pooler"),
            direct_url=direct,
        )

    # -- connection and schema -------------------------------------------------------------

    async def open(self, *, migrate: bool = True) -> None:
        if self._pool is not None:
            return
        await self._probe()
        pool: AsyncConnectionPool[_Conn] = AsyncConnectionPool(
            self.conninfo,
            connection_class=_Conn,
            kwargs={"autocommit": True, "row_factory": dict_row,
                    **self._application_name("shoal"), **self._unprepared()},
            configure=self._configure,
            min_size=self.pool_min_size,
            max_size=self.pool_max_size,
            timeout=self.pool_timeout,
            reconnect_timeout=self.reconnect_timeout,
            open=False,
            name=f"shoal-{self.schema}",
        )
        try:
            await pool.open(wait=True, timeout=self.open_timeout)
        except PoolTimeout as e:
            await pool.close()
            raise self._unavailable(e) from None
        self._pool = pool
        try:
            if migrate:
                await self.migrate()
            else:
                behind(mask_url(self.url), "postgres", await self._version(), migrate=False)
        except BaseException:
            self._pool = None
            await pool.close()
            raise

    async def _probe(self) -> None:
        """One connection first: a wrong address, user or database fails at once with the
        server's reason (a pool would retry in the background until its timeout)."""
        try:
            async with asyncio.timeout(self.open_timeout):
                conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True,
                                                             **self._unprepared())
            await conn.close()
        except (psycopg.Error, TimeoutError) as e:
            raise self._unavailable(e) from None

    async def exists(self) -> bool:
        """Whether the schema holds a shoal store (its migrations table), read on one connection
        without creating anything: a command that only reads must not make a store out of a
        mistyped schema name."""
        try:
            async with asyncio.timeout(self.open_timeout):
                conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True,
                                                             **self._unprepared())
                try:
                    cur = await conn.execute("SELECT to_regclass(%(table)s) IS NOT NULL",
                                             {"table": f'"{self.schema}".shoal_migrations'})
                    row = await cur.fetchone()
                finally:
                    await conn.close()
        except (psycopg.Error, TimeoutError) as e:
            raise self._unavailable(e) from None
        return bool(row and row[0])

    def _unavailable(self, e: BaseException) -> StoreUnavailableError:
        """Opening failed. "within N s" is said only when open_timeout really ran out (our
        timeout, or the pool's wait for its first connections); a failure that came sooner
        gives its own reason."""
        if isinstance(e, TimeoutError | PoolTimeout):
            reason = f"no answer within open_timeout={self.open_timeout:g} s."
        else:
            reason = self._reason(e)
            if not reason.endswith((".", "?", "!")):
                reason += "."
        return StoreUnavailableError(
            f"Cannot connect to the PostgreSQL store {mask_url(self.url)!r}: {reason} Check "
            f"that the server runs and the URL (host, port, user, password, database) is right."
        )

    def _application_name(self, what: str) -> dict[str, str]:
        """Name the connections after the schema in pg_stat_activity, unless the URL does."""
        if "application_name" in self._params():
            return {}
        return {"application_name": f"{what} {self.schema}"}

    def _unprepared(self) -> dict[str, Any]:
        """A stateless store's connections prepare no statement on the server: the next
        execution may reach another server connection, where it does not exist."""
        return {"prepare_threshold": None} if self.stateless else {}

    def _params(self) -> dict[str, Any]:
        """The connection parameters as libpq reads them (none if it cannot)."""
        try:
            return conninfo_to_dict(self.conninfo)
        except psycopg.Error:
            return {}

    def _reason(self, e: BaseException) -> str:
        """An error's text without the password the URL may carry."""
        text = " ".join(str(e).split()) or type(e).__name__
        passwords = [urlsplit(self.conninfo).password, self._params().get("password")]
        if self.direct_url is not None:
            with contextlib.suppress(ValueError, psycopg.Error):
                passwords += [urlsplit(self.direct_url).password,
                              conninfo_to_dict(self.direct_url).get("password")]
        for password in passwords:
            if password:
                text = text.replace(str(password), "***")
        return text

    async def _configure(self, conn: _Conn) -> None:
        self._pooled.add(conn)
        if self.stateless:
            return   # each transaction sets both for itself (_transaction, _execute)
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        # the statements of this store record what they change in run_counts themselves, one row
        # per batch (queries.sql): the triggers that count run by run for other sessions skip it
        await conn.execute("SET shoal.counted TO on")

    async def close(self) -> None:
        # writes already asked for are still made
        await self._settles.drain()
        await self._checkpoints.drain()
        await self._progress.drain()
        tasks = [t for t in (self._listener, self._sweeping) if t is not None]
        self._listener = self._sweeping = None
        self._turns.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        pool, self._pool = self._pool, None
        if pool is not None:
            await self._sticky.release(pool, self._turns)
            await self._close_pool(pool)

    async def _close_pool(self, pool: AsyncConnectionPool[_Conn]) -> None:
        """Close ``pool`` and its connections, also when its own tasks were cancelled before:
        ``asyncio.run`` cancels every task of its loop, the pool's too, before it finalizes the
        async generators, where an AsyncClient closes what it opened in that loop. The pool
        then stops short of closing its idle connections; they are closed here (and so they
        are when this close itself is cancelled)."""
        try:
            await pool.close()
        except asyncio.CancelledError:
            for conn in list(self._pooled):
                await conn.close()
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise   # this close was cancelled too, not only the pool's tasks
        self._work.set()

    async def migrate(self) -> int:
        """Bring the schema to the newest version in one transaction under an advisory lock: a
        schema with no shoal store gets ``schema.sql`` in one go, one behind gets its missing
        migrations in order. A schema already current is only read (no lock, no DDL): a role
        allowed rows and nothing else opens it."""
        masked = mask_url(self.url)
        found = await self._version()
        if not behind(masked, "postgres", found, migrate=True):
            return found
        schema = sql.Identifier(self.schema)
        table = sql.Identifier(self.schema, "shoal_migrations")
        # Safe through a pooler in transaction mode: one transaction, whose lock, search_path
        # (which the functions keep: SET search_path FROM CURRENT) and DDL all end with it.
        async with self._privileged(), self._connection(bounded=False) as conn, \
                self._transaction(conn):
            await conn.execute(_Q["advisory_xact_lock"], {"key": f"shoal:migrate:{self.schema}"})
            cur = await conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s",
                                     {"schema": self.schema})
            if await cur.fetchone() is None:
                await conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
            await conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (version integer PRIMARY KEY, name text NOT NULL, "
                "applied_at double precision NOT NULL)").format(table))
            cur = await conn.execute(sql.SQL("SELECT version FROM {}").format(table))
            done = {row["version"] for row in await cur.fetchall()}
            version = max(done, default=0)
            behind(masked, "postgres", version, migrate=True)   # a newer shoal came first
            if not done:
                await conn.execute(current_schema("postgres"))
                # what the script recorded; a migration newer than the script still follows
                cur = await conn.execute(sql.SQL("SELECT version FROM {}").format(table))
                done = {row["version"] for row in await cur.fetchall()}
                version = max(done, default=0)
            for number, name, text in migrations("postgres"):
                if number in done:
                    continue
                # A file holds several statements and no parameters: sent as one simple query.
                await conn.execute(text)
                await conn.execute(
                    sql.SQL("INSERT INTO {} (version, name, applied_at) "
                            "VALUES (%(v)s, %(n)s, %(t)s)").format(table),
                    {"v": number, "n": name, "t": time.time()},
                )
                version = number
        return version

    async def _version(self) -> int:
        """The schema's version, 0 when it holds no shoal store; reads only."""
        async with self._privileged(), self._connection() as conn:
            cur = await conn.execute("SELECT to_regclass(%(table)s) AS t",
                                     {"table": f'"{self.schema}".shoal_migrations'})
            row = await cur.fetchone()
            if row is None or row["t"] is None:
                return 0
            table = sql.Identifier(self.schema, "shoal_migrations")
            cur = await conn.execute(
                sql.SQL("SELECT coalesce(max(version), 0) AS v FROM {}").format(table))
            row = await cur.fetchone()
            return int(row["v"]) if row is not None else 0

    @asynccontextmanager
    async def _privileged(self) -> AsyncIterator[None]:
        """A privilege the connecting role lacks is a ConfigurationError that says which grants
        shoal needs (rather than psycopg's bare refusal)."""
        try:
            yield
        except pg_errors.InsufficientPrivilege as e:
            reason = self._reason(e).rstrip(".")
            raise ConfigurationError(
                f"The PostgreSQL store {mask_url(self.url)!r} refused this role: {reason}. "
                f"To serve a schema, a role needs USAGE on it, SELECT, INSERT, UPDATE and "
                f"DELETE on its tables and USAGE on its sequences; to create or upgrade it, "
                f"run 'shoal migrate' as a role that may create tables there (its owner)."
            ) from None

    async def ping(self) -> None:
        async with self._connection() as conn:
            await conn.execute("SELECT 1")

    @asynccontextmanager
    async def _connection(self, *, urgent: bool = False, hot: bool = False,
                          bounded: bool = True) -> AsyncIterator[_Conn]:
        """A pooled connection, in turn (``urgent`` ones first: renewals). A burst waits as
        long as the queue moves; when no operation got a connection for ``pool_timeout``
        seconds, or the server fails, it is a StoreUnavailableError.

        ``hot``: the engine's claims, settlements and checkpoints, a statement every few
        milliseconds on a busy worker. They keep one connection between them (see
        :class:`_Sticky`) rather than take the next in the pool's rotation (psycopg_pool hands
        its connections out first in, first out): one server process then serves them all, its
        caches warm. The rotation cost a no-op run about a tenth more server CPU, and a busy
        worker a sixth of its throughput (bench/postgres.py, alternating rounds).

        ``bounded``: the body's statements are answered within ``command_timeout`` seconds or
        it fails (see :meth:`_answered`); only migrations are not."""
        pool = self._pool
        if pool is None:
            raise StoreUnavailableError(
                f"The PostgreSQL store {mask_url(self.url)!r} is not open."
            )
        sticky = self._sticky
        if not hot and sticky.idle and not self._turns.free:
            # every turn is taken and one of them only keeps a connection for later: give it
            # back, so that no operation ever waits for a connection kept idle
            await sticky.release(pool, self._turns)
        task = asyncio.current_task()
        asked = task.cancelling() if task is not None else 0
        self._busy += 1
        try:
            conn = sticky.take() if hot else None
            if conn is not None:
                ok = False
                try:
                    async with self._answered(conn, bounded):
                        yield conn
                    ok = True
                finally:
                    sticky.put_back()
                    if not (ok and self._may_keep(pool)) or sticky.old():
                        await sticky.release(pool, self._turns)
                return
            try:
                await self._turns.take(urgent=urgent)
            except TimeoutError:
                raise self._starved() from None
            kept = False
            try:
                try:
                    conn = await pool.getconn(timeout=self.pool_timeout)
                except PoolTimeout:
                    self._turns.fail_waiting()   # at the front for pool_timeout: none would
                    raise                        # get one
                try:
                    self._turns.served()
                    if task is not None and task.cancelling() > asked:
                        # Cancelled while the pool handed this connection over: psycopg_pool's
                        # wait (asyncio.wait_for on Python 3.11) returns the connection and
                        # drops the cancellation, so a stopping loop would go on forever.
                        raise asyncio.CancelledError
                    async with self._answered(conn, bounded):
                        yield conn
                    # kept, with its turn, for the next hot operation
                    kept = hot and self._may_keep(pool) and sticky.keep(conn)
                finally:
                    if not kept:
                        await pool.putconn(conn)
            finally:
                if not kept:
                    self._turns.give()
        except PoolTimeout:
            raise self._starved() from None
        except PoolClosed:
            raise StoreUnavailableError(
                f"The PostgreSQL store {mask_url(self.url)!r} was closed before this operation "
                f"got a connection."
            ) from None
        except psycopg.OperationalError as e:
            if isinstance(e, _RETRYABLE):
                raise
            self._sweep(pool)
            raise StoreUnavailableError(
                f"The PostgreSQL store {mask_url(self.url)!r} failed: {self._reason(e)}"
            ) from None
        finally:
            self._busy -= 1

    @asynccontextmanager
    async def _answered(self, conn: _Conn, bounded: bool) -> AsyncIterator[None]:
        """The body, given ``command_timeout`` seconds to be answered (when ``bounded``).
        Past them it is cancelled (psycopg asks the server to cancel the statement, if it
        can reach it) and the connection is closed: its state is unknown, and a partition
        that holds its bytes would keep it waiting for ever. The pool then replaces it."""
        if not bounded:
            yield
            return
        limit = asyncio.timeout(self.command_timeout)
        try:
            async with limit:
                yield
        except TimeoutError:
            if not limit.expired():
                raise
            await conn.close()
            log.warning("store.unanswered: no answer within command_timeout=%g s: its "
                        "connection is closed", self.command_timeout,
                        extra={"event": "store.unanswered"})
            raise StoreUnavailableError(
                f"The PostgreSQL store {mask_url(self.url)!r} did not answer within "
                f"command_timeout={self.command_timeout:g} s (a partition, or a server that "
                f"hangs): the connection was closed. Raise ?command_timeout= in the store URL "
                f"if the server is only slow."
            ) from None

    def _may_keep(self, pool: AsyncConnectionPool[_Conn]) -> bool:
        """Whether a hot operation may keep its connection now: the store is still open on
        ``pool`` and no operation waits for a turn."""
        return self._pool is pool and not self._turns.waiting

    def _starved(self) -> StoreUnavailableError:
        """No operation got a connection for pool_timeout seconds: the server does not answer
        (or every connection is held that long)."""
        return StoreUnavailableError(
            f"No connection to the PostgreSQL store {mask_url(self.url)!r}: no operation got one "
            f"for pool_timeout={self.pool_timeout:g} s (the server does not answer, or every "
            f"one of the pool_max_size={self.pool_max_size} connections stayed busy that long). "
            f"Check the server; raise ?pool_timeout= or ?pool_max_size= in the store URL if it "
            f"is only slow."
        )

    def _sweep(self, pool: AsyncConnectionPool[_Conn]) -> None:
        """After a server restart every idle pooled connection is dead: test them all at once
        (in the background) rather than fail one operation per stale connection."""
        if self._sweeping is None or self._sweeping.done():
            self._sweeping = asyncio.create_task(pool.check(), name=f"shoal-check-{self.schema}")

    @asynccontextmanager
    async def _transaction(self, conn: _Conn, *, snapshot: bool = False) -> AsyncIterator[None]:
        """One transaction on ``conn`` for the block, committed at its end, rolled back if it
        raises (a savepoint when ``conn`` is in one already). ``snapshot``: REPEATABLE READ READ
        ONLY, one snapshot for every read. A stateless store's begins with the settings of its
        session (search_path, shoal.counted) as SET LOCAL, sent with BEGIN in one message."""
        if conn.info.transaction_status != pq.TransactionStatus.IDLE or not (
                self.stateless or snapshot):
            async with conn.transaction():
                yield
            return
        begin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if snapshot else "BEGIN"
        scope = sql.SQL("; SET LOCAL search_path TO {}; SET LOCAL shoal.counted TO on").format(
            sql.Identifier(self.schema)) if self.stateless else sql.SQL("")
        # no parameter: psycopg sends it as one simple query, several statements at once
        await conn.execute(sql.SQL(begin) + scope)
        try:
            yield
        except BaseException:
            if conn.info.transaction_status in (pq.TransactionStatus.INTRANS,
                                                pq.TransactionStatus.INERROR):
                with contextlib.suppress(psycopg.Error):
                    await conn.rollback()
            raise
        await conn.commit()

    async def _execute(self, conn: _Conn, cur: psycopg.AsyncCursor[Any],
                       query: LiteralString | sql.Composed, args: dict[str, Any],
                       binary: bool | None = None) -> None:
        """``query`` on ``cur`` (a cursor of ``conn``). Outside a transaction (autocommit: the
        statement is its own), a stateless store sends it after the statement setting the
        session's settings for the transaction only, in one pipeline: the server runs both as
        one implicit transaction, in one round trip."""
        if not self.stateless or conn.info.transaction_status != pq.TransactionStatus.IDLE:
            await cur.execute(query, args, binary=binary)
            return
        async with conn.pipeline():
            for prelude, values in self._scope:
                await conn.execute(prelude, values)
            await cur.execute(query, args, binary=binary)

    def _on(self, conn: _Conn) -> joined.Execute:
        """How a plan of :mod:`~shoal.backends.postgres.joined`'s kind runs the named
        statements on one of the store's own connections (see :meth:`_execute`)."""
        async def execute(name: str, args: dict[str, Any]) -> list[DictRow]:
            cur = conn.cursor()
            await self._execute(conn, cur, _Q[name], args)
            return await cur.fetchall()

        return execute

    async def _one(self, query: LiteralString, args: dict[str, Any]) -> DictRow | None:
        """One row of one statement (autocommit: the statement is its own transaction)."""
        async with self._connection() as conn:
            cur = conn.cursor()
            await self._execute(conn, cur, query, args)
            return await cur.fetchone()

    async def _all(
        self, query: LiteralString | sql.Composed, args: dict[str, Any], *,
        fetch: bool = True, urgent: bool = False, hot: bool = False,
    ) -> list[DictRow]:
        """Every row of one statement. ``hot``: see :meth:`_connection`."""
        async with self._connection(urgent=urgent, hot=hot) as conn:
            cur = conn.cursor()
            await self._execute(conn, cur, query, args)
            return await cur.fetchall() if fetch else []

    async def _tuples(
        self, query: LiteralString, args: dict[str, Any], *, hot: bool = False
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """The names of one statement's columns and its rows as tuples, in PostgreSQL's binary
        format: the claims' whole runs (the server formats no number as text and the client
        parses none; a tuple costs a run less than a dict). ``hot``: see :meth:`_connection`."""
        async with self._connection(hot=hot) as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await self._execute(conn, cur, query, args, binary=True)
            return [c.name for c in cur.description or ()], await cur.fetchall()

    # -- workflows -------------------------------------------------------------------------

    async def register_workflows(
        self, namespace: str, workflows: Mapping[str, JSON], now: float,
        instance: str | None = None,
    ) -> None:
        if not workflows:
            return
        # in name order: two instances registering at once lock the rows in one order
        names = sorted(workflows)
        args = {"namespace": namespace, "names": names, "now": now, "instance": instance,
                "options": [_json.dumps(workflows[n]) for n in names],
                "before": now - WORKFLOW_INSTANCE_RETENTION}

        async def register() -> None:
            async with self._connection() as conn, self._transaction(conn):
                await conn.execute(_Q["register_workflows"], args)
                if instance is not None:
                    await conn.execute(_Q["register_workflow_instances"], args)
                    await conn.execute(_Q["forget_workflow_instances"], args)

        await self._retry(register)

    async def get_workflow(self, namespace: str, name: str) -> JSON:
        row = await self._one(_Q["get_workflow"], {"namespace": namespace, "name": name})
        return None if row is None else _json.loads(row["options"])

    async def list_workflows(self, namespace: str | None) -> list[WorkflowInfo]:
        args = {"namespace": namespace}
        served: dict[tuple[str, str], list[tuple[str, float]]] = {}
        for row in await self._all(_Q["list_workflow_instances"], args):
            served.setdefault((row["namespace"], row["workflow"]), []).append(
                (row["instance"], row["registered_at"]))
        return [WorkflowInfo(row["namespace"], row["name"], _json.loads(row["options"]),
                             row["registered_at"],
                             tuple(served.get((row["namespace"], row["name"]), ())))
                for row in await self._all(_Q["list_workflows"], args)]

    # -- runs ------------------------------------------------------------------------------

    async def create_run(
        self, new: NewRun, *, max_queued: int | None, admission: str
    ) -> tuple[Run, bool]:
        args = self._run_args(new)
        if max_queued is None:
            # One statement; a concurrent insert of the same idempotency key makes it insert
            # nothing, and the run that won is read back.
            async with self._connection() as conn:
                execute = self._on(conn)
                rows = await execute("insert_run", args)
                row = rows[0] if rows else None
                if row is None:
                    rows = await execute("find_idempotent", args)
                    row = rows[0] if rows else None
                    if row is None:
                        raise StoreUnavailableError(
                            f"The run of idempotency key {new.idempotency_key!r} was inserted "
                            f"by another transaction but cannot be read back; try again."
                        )
                    return _run(row), False
                return _run(row), True
        return await self._retry(lambda: self._create_admitted(new, args, max_queued, admission))

    def _run_args(self, new: NewRun) -> dict[str, Any]:
        """The arguments of ``insert_run`` (and ``find_idempotent``) for ``new``."""
        return {
            "id": new.id, "namespace": new.namespace, "tenant": new.tenant,
            "workflow": new.workflow, "input": _input_text(new),
            "priority": new.priority, "created_at": new.created_at, "run_at": new.run_at,
            "max_attempts": new.max_attempts, "concurrency_key": new.concurrency_key,
            "idempotency_key": new.idempotency_key, "version": new.version,
            "parent_id": new.parent_id, "root_id": new.root_id or new.id, "held": False,
            "trace_context": new.trace_context, "channel": self.channel,
        }

    async def create_run_in(
        self, connection: object, new: NewRun, *, max_queued: int | None, admission: str
    ) -> tuple[Run, bool]:
        """``create_run`` in the transaction of the caller's psycopg 3 connection (see
        :mod:`shoal.backends.postgres.joined`); its errors are the caller's connection's."""
        execute = await self._callers.join(connection)
        row, created = await joined.create_run(execute, self._run_args(new),
                                               max_queued=max_queued, admission=admission)
        return _run(row), created

    async def _create_admitted(
        self, new: NewRun, args: dict[str, Any], max_queued: int, admission: str
    ) -> tuple[Run, bool]:
        async with self._connection() as conn, self._transaction(conn):
            admission_key = self._admission_key(new.namespace)
            await conn.execute(_Q["advisory_xact_lock"], {"key": admission_key})
            if new.idempotency_key is not None:
                row = await (await conn.execute(_Q["find_idempotent"], args)).fetchone()
                if row is not None:
                    return _run(row), False
            counts = await (await conn.execute(_Q["count_queued"], {
                "namespace": new.namespace, "max_queued": max_queued})).fetchone()
            assert counts is not None
            if counts["queued"] >= max_queued or counts["parked"] > 0:
                if admission == "reject":
                    raise AdmissionRejectedError(new.namespace, max_queued)
                args = {**args, "held": True}
            row = await (await conn.execute(_Q["insert_run"], args)).fetchone()
            if row is None:
                row = await (await conn.execute(_Q["find_idempotent"], args)).fetchone()
                assert row is not None
                return _run(row), False
            return _run(row), True

    async def create_runs(
        self, news: Sequence[NewRun], *, max_queued: int | None, admission: str
    ) -> list[tuple[Run, bool]]:
        # Without admission control one statement (insert_runs) answers the whole batch; with
        # it, that statement follows the admission count in one transaction.
        if not news:
            return []
        namespace = namespace_of(news)
        return await self._retry(lambda: self._create_batch(namespace, news, max_queued,
                                                            admission))

    async def _create_batch(
        self, namespace: str, news: Sequence[NewRun], max_queued: int | None, admission: str
    ) -> list[tuple[Run, bool]]:
        async with self._connection() as conn:
            execute = self._on(conn)
            copy = len(news) >= _COPY_MIN and all(n.idempotency_key is None for n in news)
            insert = (functools.partial(self._copy_runs, conn) if copy
                      else functools.partial(self._insert_runs, execute))
            if max_queued is None and not copy:
                batch = await self._insert_batch(execute, namespace, news, None, admission,
                                                 insert)
            else:
                async with self._transaction(conn):
                    if max_queued is not None:
                        await execute("advisory_xact_lock",
                                      {"key": self._admission_key(namespace)})
                    batch = await self._insert_batch(execute, namespace, news, max_queued,
                                                     admission, insert)
            return await _answer_batch(execute, namespace, news, *batch, caller=False)

    async def create_runs_in(
        self, connection: object, news: Sequence[NewRun], *, max_queued: int | None,
        admission: str,
    ) -> list[tuple[Run, bool]]:
        """``create_runs`` in the transaction of the caller's psycopg 3 connection, with the
        statements of ``create_runs`` (see :mod:`shoal.backends.postgres.joined`); its errors
        are the caller's connection's. No admission lock, as in ``create_run_in``: held until
        the caller commits, it would stall every dispatch of the namespace behind the caller's
        transaction, so admission counts the runs that transaction sees."""
        execute = await self._callers.join(connection)
        if not news:
            return []
        namespace = namespace_of(news)
        batch = await self._insert_batch(execute, namespace, news, max_queued, admission,
                                         functools.partial(self._insert_runs, execute))
        return await _answer_batch(execute, namespace, news, *batch, caller=True)

    async def _insert_batch(
        self, execute: joined.Execute, namespace: str, news: Sequence[NewRun],
        max_queued: int | None, admission: str,
        insert: Callable[[str, Sequence[NewRun], Sequence[bool]], Awaitable[dict[str, Run]]],
    ) -> tuple[dict[str, Run], dict[Key, Run], list[NewRun]]:
        """The admission count and the insert (``insert``: insert_runs or copy_runs) of
        ``create_runs``: the runs inserted (by id), the stored runs of the batch's keys read
        before (under admission control only: without it insert_runs alone tells a taken key),
        and the items that made a new run."""
        stored = {} if max_queued is None else await _find_keys(execute, namespace, news)
        fresh = [news[i] for i in firsts(news, stored)]
        queued = parked = 0
        if max_queued is not None and fresh:
            [counts] = await execute("count_queued", {"namespace": namespace,
                                                      "max_queued": max_queued})
            queued, parked = counts["queued"], counts["parked"]
        held = held_flags(namespace, len(fresh), queued, parked, max_queued, admission)
        return await insert(namespace, fresh, held), stored, fresh

    async def _insert_runs(
        self, execute: joined.Execute, namespace: str, fresh: Sequence[NewRun],
        held: Sequence[bool],
    ) -> dict[str, Run]:
        """insert_runs: the runs it inserted, by id."""
        if not fresh:
            return {}
        # In key order: two batches inserting the same keys wait for each other in one order,
        # never in a cycle (a deadlock, which the server takes deadlock_timeout to break).
        rows = sorted(zip(fresh, held, map(_input_text, fresh), strict=True),
                      key=lambda r: (r[0].idempotency_key is None, r[0].tenant, r[0].workflow,
                                     r[0].idempotency_key or ""))
        # One JSON text for the whole batch: json.dumps is C, where psycopg dumps arrays of
        # text in Python; unescaped, so that text reaches the server as any text parameter does.
        batch = json.dumps([{
            "id": n.id, "tenant": n.tenant, "workflow": n.workflow, "input": text,
            "priority": n.priority, "created_at": n.created_at, "run_at": n.run_at,
            "max_attempts": n.max_attempts, "concurrency_key": n.concurrency_key,
            "idempotency_key": n.idempotency_key, "version": n.version,
            "parent_id": n.parent_id, "root_id": n.root_id or n.id, "held": h,
            "trace_context": n.trace_context,
        } for n, h, text in rows], ensure_ascii=False, separators=(",", ":"))
        found = await execute("insert_runs", {"namespace": namespace, "rows": batch,
                                              "channel": self.channel})
        ids = {row["id"] for row in found}
        return {n.id: queued_run(n, h, text) for n, h, text in rows if n.id in ids}

    async def _copy_runs(
        self, conn: _Conn, namespace: str, fresh: Sequence[NewRun], held: Sequence[bool],
    ) -> dict[str, Run]:
        """copy_runs, in the transaction open on ``conn``, and one NOTIFY when a run is not
        held: every run of ``fresh`` (they have no idempotency keys), by id."""
        texts = list(map(_input_text, fresh))
        rows = list(zip(fresh, held, texts, strict=True))
        async with conn.cursor().copy(_Q["copy_runs"]) as copy:
            # In chunks: the server inserts one while the next is written, and the last while
            # the runs are built.
            lines = _CopyLines(namespace)
            for i in range(0, len(rows), _COPY_CHUNK):
                await copy.write("".join(map(lines.line, rows[i:i + _COPY_CHUNK])))
            runs = {n.id: queued_run(n, h, text) for n, h, text in rows}
        if not all(held):
            await conn.execute(_Q["notify"], {"channel": self.channel})
        return runs

    def _admission_key(self, namespace: str) -> str:
        return f"shoal:admission:{self.schema}:{namespace}"

    async def get_run(self, run_id: str) -> Run | None:
        row = await self._one(_Q["get_run"], {"id": run_id})
        return None if row is None else _run(row)

    async def list_runs(
        self,
        namespace: str | None,
        *,
        status: str | None = None,
        workflow: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[Run]:
        where: list[sql.Composable] = []
        args: dict[str, Any] = {"limit": limit}
        for column, value in (("namespace", namespace), ("status", status),
                              ("workflow", workflow), ("tenant", tenant)):
            if value is not None:
                where.append(sql.SQL("{} = {}").format(sql.Identifier(column),
                                                       sql.Placeholder(column)))
                args[column] = value
        if after is not None:
            where.append(sql.SQL("id > %(after)s"))
            args["after"] = after
        query = sql.SQL("SELECT * FROM runs {} ORDER BY id LIMIT %(limit)s").format(
            sql.SQL("WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL(""))
        return [_run(row) for row in await self._all(query, args)]

    async def claim_runs(
        self,
        namespace: str,
        workflows: Sequence[str],
        owner: str,
        limit: int,
        lease: float,
        now: float,
        *,
        version: str | None = None,
        any_version: Sequence[str] = (),
    ) -> list[Run]:
        if limit <= 0 or not workflows:
            return []
        args = {"namespace": namespace, "workflows": list(workflows), "owner": owner,
                "limit": limit, "expires": now + lease, "now": now, "version": version,
                "any_version": list(any_version)}
        runs: list[Run] = []
        for _ in range(3):
            try:
                runs = _claimed(*await self._tuples(_Q["claim"], args, hot=True))
                break
            except pg_errors.UniqueViolation:
                # Another claim of the same concurrency key committed after this statement's
                # snapshot: runs_key_holder refused the second holder. Claiming again sees it.
                log.debug("claim.key_race: claiming again")
            except _RETRYABLE:
                log.debug("claim.retry")
        return runs

    async def incompatible_runs(
        self, namespace: str, workflows: Sequence[str], version: str | None,
        any_version: Sequence[str], now: float, limit: int = 100,
    ) -> list[Run]:
        if limit <= 0 or not workflows:
            return []
        rows = await self._all(_Q["incompatible_runs"], {
            "namespace": namespace, "workflows": list(workflows), "version": version,
            "any_version": list(any_version), "now": now, "limit": limit})
        return [_run(r) for r in rows]

    async def renew_leases(
        self, owner: str, leases: dict[str, int], lease: float, now: float
    ) -> Renewal:
        if not leases:
            return Renewal(frozenset(), frozenset())
        ids = sorted(leases)
        # urgent: a burst of other operations queued for a connection must not cost leases
        rows = await self._retry(lambda: self._all(_Q["renew"], {
            "expires": now + lease, "owner": owner, "ids": ids,
            "epochs": [leases[i] for i in ids],
        }, urgent=True))
        return Renewal(frozenset(r["id"] for r in rows),
                       frozenset(r["id"] for r in rows if r["cancel_requested"]))

    async def load_steps(self, run_id: str) -> list[Step]:
        rows = await self._all(_Q["load_steps"], {"run_id": run_id})
        return [Step(r["seq"], r["name"], _json.loads(r["output"]), r["finished"], r["epoch"],
                     r["started_at"], r["attempt"], r["retries"]) for r in rows]

    @staticmethod
    def _step_args(fence: Fence, step: Step, now: float) -> dict[str, Any]:
        return {
            "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
            "seq": step.seq, "name": step.name, "output": _json.dumps(step.output),
            "finished": step.finished, "finished_at": now if step.finished else None,
            "started_at": step.started_at, "attempt": step.attempt, "retries": step.retries,
        }

    async def checkpoint_step(
        self, fence: Fence, step: Step, lease: float, now: float,
        outbox: Sequence[OutboxEntry] = (),
    ) -> bool:
        if outbox:
            # A step that sent entries takes a transaction of its own rather than the batch: the
            # batch statement takes one row per run, and checking "this step is not finished
            # yet" in it would read the steps as of before its row locks were granted. Here the
            # run row is locked (fence_extend) before the statement that checks the step and
            # writes entries and step together, so it sees every committed write of the run;
            # fenced and atomic as a batched row is. Such steps are the few; the rest keep the
            # group commit.
            return await self._retry(
                lambda: self._checkpoint_outbox(fence, step, lease, now, outbox))
        return await self._checkpoints.write(fence.run_id, {
            "id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
            "expires": now + lease, "seq": step.seq, "name": step.name,
            "output": _json.dumps(step.output), "finished": step.finished,
            "finished_at": now if step.finished else None, "started_at": step.started_at,
            "attempt": step.attempt, "retries": step.retries,
        })

    async def _checkpoint_outbox(
        self, fence: Fence, step: Step, lease: float, now: float, outbox: Sequence[OutboxEntry]
    ) -> bool:
        async with self._connection() as conn, self._transaction(conn):
            fenced = {"run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
                      "expires": now + lease}
            if await (await conn.execute(_Q["fence_extend"], fenced)).fetchone() is None:
                return False
            await conn.execute(_Q["checkpoint_outbox"], {
                **self._step_args(fence, step, now), "now": now,
                "o_id": [e.id for e in outbox], "o_namespace": [e.namespace for e in outbox],
                "o_run_id": [e.run_id for e in outbox], "o_seq": [e.seq for e in outbox],
                "o_idx": [e.index for e in outbox], "o_topic": [e.topic for e in outbox],
                "o_payload": [_json.dumps(e.payload) for e in outbox],
                "o_created_at": [e.created_at for e in outbox],
                "o_trace_context": [e.trace_context for e in outbox],
            })
            return True

    async def record_progress(self, fence: Fence, progress: Progress) -> bool:
        # batched with the progress of other runs: one statement, one commit
        return await self._progress.write(fence.run_id, {
            "id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
            "progress": _json.dumps(progress.to_json()), "progress_at": progress.at,
        })

    async def suspend_run(
        self,
        fence: Fence,
        step: Step,
        status: Literal["sleeping", "waiting"],
        run_at: float | None,
        wait_for: str | None,
        now: float,
    ) -> bool:
        args = {**self._step_args(fence, step, now), "status": status, "run_at": run_at,
                "wait_for": wait_for}
        row = await self._retry(lambda: self._one(_Q["suspend"], args))
        return row is not None and row["held"] == 1

    async def wait_signal(
        self, fence: Fence, step: Step, signal: str, deadline: float | None, now: float
    ) -> SignalWait | None:
        return await self._retry(lambda: self._wait_signal(fence, step, signal, deadline, now))

    async def _wait_signal(
        self, fence: Fence, step: Step, signal: str, deadline: float | None, now: float
    ) -> SignalWait | None:
        async with self._connection() as conn, self._transaction(conn):
            fenced = {"run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch}
            if await (await conn.execute(_Q["fence_lock"], fenced)).fetchone() is None:
                return None
            row = await (await conn.execute(_Q["consume_signal"], {
                "run_id": fence.run_id, "name": signal})).fetchone()
            if row is not None:
                payload = _json.loads(row["payload"])
                done = replace(step, output={"payload": payload}, finished=True)
                await conn.execute(_Q["put_step"], self._step_args(fence, done, now))
                return SignalWait(received=True, payload=payload)
            if deadline is not None and deadline <= now:
                return SignalWait(received=False, parked=False)
            await conn.execute(_Q["suspend"], {
                **self._step_args(fence, step, now), "status": "waiting", "run_at": deadline,
                "wait_for": signal,
            })
            return SignalWait(received=False, parked=True)

    async def settle_run(self, fence: Fence, settlement: Settlement, now: float) -> bool:
        return await self._settles.write(fence.run_id, _settle_row(fence, settlement, now))

    async def settle_and_claim(
        self,
        settlements: Sequence[tuple[Fence, Settlement, float]],
        namespace: str,
        workflows: Sequence[str],
        owner: str,
        limit: int,
        lease: float,
        now: float,
        *,
        version: str | None = None,
        any_version: Sequence[str] = (),
    ) -> tuple[list[bool], list[Run]]:
        if limit <= 0 or not workflows:
            limit = 0
        if not settlements:
            return [], await self.claim_runs(namespace, workflows, owner, limit, lease, now,
                                             version=version, any_version=any_version)
        if len({f.run_id for f, _, _ in settlements}) < len(settlements):
            # two settlements of one run cannot share the statement: one by one, then claim
            held = [await self.settle_run(*item) for item in settlements]
            return held, await self.claim_runs(namespace, workflows, owner, limit, lease, now,
                                               version=version, any_version=any_version)
        rows = [_settle_row(*item) for item in settlements]
        settle: dict[str, Any] = {c: [row[c] for row in rows] for c in _SETTLE_COLUMNS}
        settle["channel"] = self.channel
        claim = {"namespace": namespace, "workflows": list(workflows), "owner": owner,
                 "limit": limit, "expires": now + lease, "now": now, "version": version,
                 "any_version": list(any_version)}
        # As in claim_runs, a claim of a concurrency key can be refused when another claim of
        # the key committed after this statement's snapshot; the whole statement was undone,
        # so it is tried again, the third time without the claim (the settlements are never
        # given up for it).
        for claiming in (limit > 0, limit > 0, False):
            try:
                written, claimed = await self._retry(functools.partial(
                    self._settle_and_claim, settle, claim if claiming else None))
                break
            except pg_errors.UniqueViolation:
                if not claiming:
                    raise
                log.debug("claim.key_race: settling and claiming again")
        else:
            raise AssertionError("unreachable")
        return [f.run_id in written for f, _, _ in settlements], claimed

    async def _settle_and_claim(
        self, settle: dict[str, Any], claim: dict[str, Any] | None
    ) -> tuple[set[str], list[Run]]:
        """One statement: the settlements and the claim (one round trip, one commit). The ids
        settled, and the runs claimed."""
        if claim is None:
            return {r["id"] for r in await self._all(_Q["settle"], settle, hot=True)}, []
        names, rows = await self._tuples(_SETTLE_AND_CLAIM, {**settle, "s_owner": settle["owner"],
                                                             **claim}, hot=True)
        # one row carries the ids settled; a row without a run when none was claimed
        settled = next((r[0] for r in rows if r[0] is not None), None)
        return set(settled or ()), _claimed(names, [r for r in rows if r[1] is not None])

    async def release_run(self, fence: Fence, now: float) -> bool:
        args = {"run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
                "channel": self.channel}
        return await self._retry(lambda: self._one(_Q["release"], args)) is not None

    async def recover_runs(self, namespace: str, now: float) -> list[Run]:
        rows = await self._retry(lambda: self._all(_Q["recover"], {
            "namespace": namespace, "now": now, "channel": self.channel}))
        return [_run(r) for r in rows]

    async def cancel_run(self, run_id: str, now: float) -> Run | None:
        # one statement, with the tree of an unfinished root (see the query)
        row = await self._retry(lambda: self._one(_Q["cancel"], {
            "id": run_id, "now": now, "channel": self.channel}))
        if row is None:
            # unknown, or final already (a final run never changes again)
            row = await self._one(_Q["get_run"], {"id": run_id})
        return None if row is None else _run(row)

    async def retry_run(
        self, namespace: str, run_id: str, tenant: str | None, now: float
    ) -> tuple[Run | None, bool]:
        row = await self._retry(lambda: self._one(_Q["retry"], {
            "id": run_id, "namespace": namespace, "tenant": tenant, "now": now,
            "channel": self.channel}))
        if row is not None:
            return _run(row), True
        found = await self._one(_Q["get_run"], {"id": run_id})
        if found is None or found["namespace"] != namespace or (
                tenant is not None and found["tenant"] != tenant):
            return None, False
        return _run(found), False

    async def send_signal(
        self, run_id: str, name: str, payload: JSON, signal_id: str, now: float
    ) -> Run | None:
        return await self._retry(lambda: self._send_signal(run_id, name, payload, signal_id, now))

    async def _send_signal(
        self, run_id: str, name: str, payload: JSON, signal_id: str, now: float
    ) -> Run | None:
        async with self._connection() as conn, self._transaction(conn):
            row = await (await conn.execute(_Q["lock_run"], {"id": run_id})).fetchone()
            if row is None:
                return None
            woken = await (await conn.execute(_Q["signal_and_wake"], {
                "id": signal_id, "run_id": run_id, "name": name,
                "payload": _json.dumps(payload), "now": now, "channel": self.channel,
            })).fetchone()
            return _run(woken if woken is not None else row)

    async def release_held(self, namespace: str, max_queued: int, now: float) -> int:
        counts = await self._one(_Q["count_queued"], {"namespace": namespace,
                                                       "max_queued": max_queued})
        assert counts is not None
        if counts["parked"] == 0 or counts["queued"] >= max_queued:
            return 0
        return await self._retry(lambda: self._release_held(namespace, max_queued))

    async def _release_held(self, namespace: str, max_queued: int) -> int:
        async with self._connection() as conn, self._transaction(conn):
            await conn.execute(_Q["advisory_xact_lock"], {"key": self._admission_key(namespace)})
            counts = await (await conn.execute(_Q["count_queued"], {
                "namespace": namespace, "max_queued": max_queued})).fetchone()
            assert counts is not None
            n = min(counts["parked"], max_queued - counts["queued"])
            if n <= 0:
                return 0
            cur = await conn.execute(_Q["release_held"], {"namespace": namespace, "n": n,
                                                          "channel": self.channel})
            return len(await cur.fetchall())

    # -- tree state and children -----------------------------------------------------------

    async def save_tree_key(
        self, root_id: str, key: str, value: JSON, claimant: str, now: float
    ) -> bool:
        args = {"root_id": root_id, "key": key, "value": _json.dumps(value),
                "claimant": claimant, "now": now}
        return await self._retry(lambda: self._save_tree_key(args, claimant))

    async def _save_tree_key(self, args: dict[str, Any], claimant: str) -> bool:
        # Two statements, each its own transaction: when the insert meets a concurrent insert of
        # the key it waits for it and inserts nothing, and only a later statement's snapshot is
        # sure to see the row that won.
        async with self._connection() as conn:
            execute = self._on(conn)
            if await execute("insert_tree_key", args):
                return True
            rows = await execute("get_tree_key", args)
            return bool(rows) and rows[0]["claimant"] == claimant

    async def get_tree_key(self, root_id: str, key: str) -> JSON:
        row = await self._one(_Q["get_tree_key"], {"root_id": root_id, "key": key})
        return None if row is None else _json.loads(row["value"])

    async def tree_keys(self, root_id: str) -> list[tuple[str, str]]:
        rows = await self._all(_Q["list_tree_keys"], {"root_id": root_id})
        return [(row["key"], row["tenant"]) for row in rows]

    async def wait_child(self, fence: Fence, step: Step, child_id: str, now: float) -> Run | None:
        return await self._retry(lambda: self._wait_child(fence, step, child_id, now))

    async def _wait_child(
        self, fence: Fence, step: Step, child_id: str, now: float
    ) -> Run | None:
        async with self._connection() as conn, self._transaction(conn):
            fenced = {"run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch}
            if await (await conn.execute(_Q["fence_lock"], fenced)).fetchone() is None:
                return None
            # The child's row is locked (after the parent's, as a statement ending the child
            # locks them) until the park commits, so the child cannot end between this check
            # and the park unseen: the runs_ended trigger of a statement ending it runs after
            # this commit and finds the parent waiting.
            row = await (await conn.execute(_Q["lock_child"], {"id": child_id})).fetchone()
            if row is None:
                raise KeyError(f"no child run {child_id!r}")
            child = _run(row)
            if child.status.final:
                done = replace(step, output={"status": child.status.value,
                                             "output": child.output, "error": child.error},
                               finished=True)
                await conn.execute(_Q["put_step"], self._step_args(fence, done, now))
            else:
                await conn.execute(_Q["suspend"], {
                    **self._step_args(fence, step, now), "status": "waiting", "run_at": None,
                    "wait_for": _child_wait(child_id)})
            return child

    # -- pauses ----------------------------------------------------------------------------

    async def create_pause(self, fence: Fence, step: Step, pause: Pause, now: float) -> bool:
        args = {**self._step_args(fence, step, now), "wait_for": _pause_wait(pause.id),
                "pause_id": pause.id, "namespace": pause.namespace, "tenant": pause.tenant,
                "pause_name": pause.name, "request": _json.dumps(pause.request),
                "created_at": pause.created_at, "expires_at": pause.expires_at}
        row = await self._retry(lambda: self._one(_Q["park_on_pause"], args))
        return row is not None and row["held"] == 1

    async def get_pause(self, pause_id: str) -> Pause | None:
        row = await self._one(_Q["get_pause"], {"id": pause_id})
        return None if row is None else _pause(row)

    async def wait_pause(
        self, fence: Fence, step: Step, pause_id: str, now: float
    ) -> PauseWait | None:
        return await self._retry(lambda: self._wait_pause(fence, step, pause_id, now))

    async def _wait_pause(
        self, fence: Fence, step: Step, pause_id: str, now: float
    ) -> PauseWait | None:
        async with self._connection() as conn, self._transaction(conn):
            fenced = {"run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch}
            if await (await conn.execute(_Q["fence_lock"], fenced)).fetchone() is None:
                return None
            # The run row is locked until the park commits. resolve_pause locks it before the
            # pause, so it resolves either before this read (seen here) or after the park; an
            # expiry resolving the pause meanwhile updates the run last, waiting for this
            # commit, and then finds it parked: either way the run is woken, never left behind.
            row = await (await conn.execute(_Q["get_pause"], {"id": pause_id})).fetchone()
            pause = None if row is None else _pause(row)
            if pause is None or pause.status != "pending":
                return PauseWait(pause, parked=False)
            await conn.execute(_Q["suspend"], {
                **self._step_args(fence, step, now), "status": "waiting", "run_at": None,
                "wait_for": _pause_wait(pause_id)})
            return PauseWait(pause, parked=True)

    async def resolve_pause(
        self, pause_id: str, decision: JSON, now: float
    ) -> tuple[Pause | None, bool]:
        return await self._retry(lambda: self._resolve_pause(pause_id, decision, now))

    async def _resolve_pause(
        self, pause_id: str, decision: JSON, now: float
    ) -> tuple[Pause | None, bool]:
        async with self._connection() as conn, self._transaction(conn):
            # the run row first: a resolution racing the park or a cancel waits for it
            await conn.execute(_Q["lock_pause_run"], {"id": pause_id})
            row = await (await conn.execute(_Q["resolve_pause"], {
                "id": pause_id, "decision": _json.dumps(decision), "now": now,
                "channel": self.channel})).fetchone()
            if row is not None:
                return _pause(row), True
            # unknown, or resolved already (by another call: exactly one wins)
            row = await (await conn.execute(_Q["get_pause"], {"id": pause_id})).fetchone()
            return (None if row is None else _pause(row)), False

    async def list_pauses(
        self, namespace: str, *, tenant: str | None = None, limit: int = 100
    ) -> list[Pause]:
        rows = await self._all(_Q["list_pauses"], {"namespace": namespace, "tenant": tenant,
                                                   "limit": limit})
        return [_pause(r) for r in rows]

    async def expire_pauses(self, namespace: str, now: float) -> list[Pause]:
        args: dict[str, Any] = {"namespace": namespace, "now": now}
        # one cheap statement on every poll; a transaction only when something has expired
        if await self._one(_Q["expiring_pauses"], args) is None:
            return []
        return await self._retry(lambda: self._expire_pauses(args))

    async def _expire_pauses(self, args: dict[str, Any]) -> list[Pause]:
        async with self._connection() as conn, self._transaction(conn):
            locked = await (await conn.execute(_Q["lock_expiring_runs"], args)).fetchall()
            if not locked:
                return []
            rows = await (await conn.execute(_Q["expire_pauses"], {
                **args, "run_ids": [r["id"] for r in locked], "decision": _json.dumps(_EXPIRED),
                "channel": self.channel})).fetchall()
            return [_pause(r) for r in rows]

    async def claim_notifications(
        self, namespace: str, now: float, lease: float, limit: int
    ) -> list[Pause]:
        if limit <= 0:
            return []
        rows = await self._retry(lambda: self._all(_Q["claim_notifications"], {
            "namespace": namespace, "now": now, "until": now + lease, "limit": limit}))
        return sorted((_pause(r) for r in rows), key=lambda p: (p.created_at, p.id))

    async def mark_notified(self, pause_id: str) -> None:
        await self._retry(lambda: self._all(_Q["mark_notified"], {"id": pause_id}, fetch=False))

    async def prune_pauses(self, namespace: str, before: float, limit: int) -> int:
        args = {"namespace": namespace, "before": before, "limit": limit}
        return len(await self._retry(lambda: self._all(_Q["prune_pauses"], args)))

    # -- outbox ----------------------------------------------------------------------------

    async def claim_outbox(
        self, namespace: str, topics: Sequence[str], now: float, lease: float, limit: int
    ) -> list[OutboxEntry]:
        if limit <= 0 or not topics:
            return []
        rows = await self._retry(lambda: self._all(_Q["claim_outbox"], {
            "namespace": namespace, "topics": list(topics), "now": now, "until": now + lease,
            "limit": limit}))
        return sorted((_entry(r) for r in rows), key=lambda e: (e.created_at, e.id))

    async def finish_delivery(
        self, entry_id: str, now: float, error: str | None = None,
        retry_at: float | None = None,
    ) -> None:
        if error is None:
            query, args = _Q["outbox_delivered"], {"id": entry_id, "now": now}
        else:
            query, args = _Q["outbox_failed"], {
                "id": entry_id, "error": error, "dead": retry_at is None,
                "next_at": retry_at if retry_at is not None else now}
        await self._retry(lambda: self._all(query, args, fetch=False))

    # -- what a console reads ------------------------------------------------------------------

    async def redrive(self, namespace: str, entry_id: str,
                      now: float) -> tuple[OutboxEntry | None, bool]:
        async with self._connection() as conn, self._transaction(conn):
            one = {"id": entry_id, "namespace": namespace}
            row = await (await conn.execute(_Q["redrive"], {**one, "now": now})).fetchone()
            if row is not None:
                return _entry(row), True
            row = await (await conn.execute(_Q["get_outbox"], one)).fetchone()
            return (None if row is None else _entry(row)), False

    async def search_runs(
        self, namespace: str, where: RunFilter, *, before: str | None = None, limit: int = 50,
    ) -> list[Run]:
        query, args = _search_sql(namespace, where, before, limit)
        return [_run(row) for row in await self._all(query, args)]

    async def inspect_run(self, run_id: str, tree_limit: int = 200) -> RunRecord | None:
        one = {"run_id": run_id}
        async with self._connection() as conn, self._transaction(conn, snapshot=True):
            # one snapshot for every read below

            async def rows(name: str, args: dict[str, Any]) -> list[DictRow]:
                return await (await conn.execute(_Q[name], args)).fetchall()

            found = await rows("get_run", {"id": run_id})
            if not found:
                return None
            run = _run(found[0])
            root = [run] if run.id == run.root_id else [
                _run(r) for r in await rows("get_run", {"id": run.root_id})]
            children = await rows("inspect_children", {"root_id": run.root_id,
                                                        "limit": max(0, tree_limit - 1)})
            return RunRecord(
                run=run,
                steps=tuple(StepRecord(r["seq"], r["name"], _json.loads(r["output"]),
                                       bool(r["finished"]), r["epoch"], r["finished_at"],
                                       r["started_at"], r["attempt"], r["retries"])
                            for r in await rows("inspect_steps", one)),
                signals=tuple(SignalRecord(r["id"], r["name"], _json.loads(r["payload"]),
                                           r["created_at"], bool(r["consumed"]))
                              for r in await rows("inspect_signals", one)),
                pauses=tuple(_pause(r) for r in await rows("inspect_pauses", one)),
                outbox=tuple(_entry(r) for r in await rows("inspect_outbox", one)),
                tree=tuple((root if tree_limit > 0 else []) + [_run(r) for r in children]
                           )[:tree_limit])

    async def run_owners(self, namespace: str, limit: int = 1000) -> list[RunOwner]:
        rows = await self._all(_Q["run_owners"], {"namespace": namespace, "limit": limit})
        return [RunOwner(r["owner"], r["running"], r["lease_until"]) for r in rows]

    async def finished_per_minute(
        self, namespace: str, since: float, minutes: int
    ) -> list[int]:
        counts = [0] * minutes
        for row in await self._all(_Q["finished_per_minute"], {
                "namespace": namespace, "since": since, "until": since + 60 * minutes}):
            if 0 <= row["minute"] < minutes:
                counts[row["minute"]] += row["n"]
        return counts

    async def dead_letters(self, namespace: str, limit: int = 100) -> list[OutboxEntry]:
        rows = await self._all(_Q["dead_letters"], {"namespace": namespace, "limit": limit})
        return [_entry(r) for r in rows]

    # -- retention -------------------------------------------------------------------------

    async def prune_runs(self, namespace: str, before: float, limit: int) -> int:
        args = {"namespace": namespace, "before": before, "limit": limit}
        return len(await self._retry(lambda: self._all(_Q["prune_runs"], args)))

    # -- stats -----------------------------------------------------------------------------

    async def stats(self, namespace: str, now: float) -> Stats:
        rows = await self._all(_Q["stats"], {"namespace": namespace, "now": now,
                                             "since": since(now)})
        return stats_from_rows(namespace, now, rows)

    async def fold_stats(self, namespace: str, now: float) -> None:
        args = {"namespace": namespace, "keep": keep(now)}
        if await self._one(_Q["fold_needed"], args) is not None:
            await self._retry(lambda: self._all(_Q["fold_counts"], args, fetch=False))

    # -- wake-ups --------------------------------------------------------------------------

    async def wait_for_work(self, timeout: float) -> None:
        if self._pool is None:
            return
        self._start_listener()
        # asyncio.wait, not wait_for: on 3.11 wait_for can swallow a cancellation.
        waiter = asyncio.ensure_future(self._work.wait())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()
        self._work.clear()

    def _start_listener(self) -> None:
        """Run the LISTEN task, for wait_for_work and lock watches, unless it runs; in a
        stateless store without ``direct_url``, the task that polls in its place."""
        if self._pool is not None and (self._listener is None or self._listener.done()):
            wake = self._poll() if self.stateless and self.direct_url is None else self._listen()
            self._listener = asyncio.create_task(wake, name=f"shoal-listen-{self.schema}")

    async def _poll(self) -> None:
        """No LISTEN (a pooler in transaction mode lends the listening connection's server
        connection to others between transactions: notifications would reach nobody). Every
        POLL_INTERVAL seconds, wake the waiter of wait_for_work (a hint: the engine looks for
        due runs then) and ask the store which lock watches a release has made first in line
        (only while there are watches)."""
        self._listening.set()
        self._lock_listening()
        while self._pool is not None:
            await asyncio.sleep(POLL_INTERVAL)
            self._work.set()
            if not self._lock_watches:
                continue
            try:
                await self._lock_poll()
            except (StoreUnavailableError, psycopg.Error) as e:
                # the waiters' own timers go on; the next poll asks again
                log.debug("lock poll failed: %s", self._reason(e))

    async def _listen(self) -> None:
        """LISTEN on a connection of its own, and reconnect when it drops. After each
        (re)connection, wake the waiter and every lock watch once: notifications may have been
        missed meanwhile. Lock notifications wake lock watches only."""
        delay = 0.1
        listen = sql.SQL("LISTEN {}").format(sql.Identifier(self.channel))
        while self._pool is not None:
            try:
                # the direct URL goes to the server itself: PgBouncer in transaction mode
                # would not keep the LISTEN's server connection for this one
                async with asyncio.timeout(self.open_timeout):
                    conn = await psycopg.AsyncConnection.connect(
                        make_conninfo(self.direct_url or self.conninfo,
                                      **self._application_name("shoal-listen")),
                        autocommit=True, **self._unprepared())
                async with conn:
                    async with asyncio.timeout(self.command_timeout):
                        await conn.execute(listen)
                    self._listening.set()
                    self._work.set()
                    self._lock_listening()
                    delay = 0.1
                    while True:
                        async for n in conn.notifies(timeout=30.0):
                            if not self._lock_notified(n.payload):
                                self._work.set()
                        # quiet for a while: make sure the connection still answers (one
                        # that a partition holds would not, and would never fail either)
                        async with asyncio.timeout(self.command_timeout):
                            await conn.execute("SELECT 1")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._listening.clear()
                log.warning("listen.failed: %s; reconnecting in %.1f s", self._reason(e), delay,
                            extra={"event": "listen.failed"})
                self._work.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    # -- transient errors ------------------------------------------------------------------

    async def _retry(self, attempt: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``attempt()`` (one whole transaction) again when the server refused it as a
        deadlock victim or a serialization failure: it wrote nothing."""
        for n in range(4):
            try:
                return await attempt()
            except _RETRYABLE:
                if n == 3:
                    raise
                await asyncio.sleep(0.01 * (n + 1))
        raise AssertionError("unreachable")


class _Batcher:
    """Fenced writes of different runs sharing one statement and one commit.

    ``write`` queues a row; one task writes the queue as one statement per batch (the named
    query takes one array per column and returns the ids of the rows whose fence held), and
    rows that arrive while a batch is on its way go together in the next one, as group commit
    does. A batch holds one row per run; a second write of a run waits for the next batch, so
    each answers as if alone. The writing task is its own, so a cancelled caller never leaves
    the others waiting.
    """

    def __init__(self, store: PostgresStore, query: str, columns: tuple[str, ...]) -> None:
        self.store = store
        self.query = query
        self.columns = columns
        self.queue: list[tuple[str, dict[str, Any], asyncio.Future[bool]]] = []
        self.task: asyncio.Task[None] | None = None

    async def write(self, run_id: str, row: dict[str, Any]) -> bool:
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.queue.append((run_id, row, done))
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run(), name=f"shoal-{self.query}")
        # A cancelled caller cancels only its own future: its row is written all the same (it
        # is queued), and the batch skips answering a future already done.
        return await done

    async def drain(self) -> None:
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)

    async def _run(self) -> None:
        while self.queue:
            batch: list[tuple[str, dict[str, Any], asyncio.Future[bool]]] = []
            rest: list[tuple[str, dict[str, Any], asyncio.Future[bool]]] = []
            runs: set[str] = set()
            for item in self.queue:
                if item[0] in runs or len(batch) >= _BATCH:
                    rest.append(item)
                else:
                    runs.add(item[0])
                    batch.append(item)
            self.queue = rest
            args: dict[str, Any] = {c: [row[c] for _, row, _ in batch] for c in self.columns}
            args["channel"] = self.store.channel
            try:
                written = await self.store._retry(
                    functools.partial(self.store._all, _Q[self.query], args, hot=True))
            except Exception as e:
                for _, _, done in batch:
                    if not done.done():
                        done.set_exception(e)
                continue
            held = {r["id"] for r in written}
            for run_id, _, done in batch:
                if not done.done():
                    done.set_result(run_id in held)


def _split_options(url: str) -> tuple[str, dict[str, str]]:
    """The URL without shoal's own query options, every other character as written (libpq
    parses it, not shoal), and shoal's options, decoded. An option that libpq does not know
    either is a ConfigurationError."""
    base, _, query = url.partition("?")
    ours: dict[str, str] = {}
    rest: list[str] = []
    for pair in query.split("&") if query else []:
        key, _, value = pair.partition("=")
        name = unquote(key)
        if name in _OPTIONS:
            ours[name] = unquote(value)
        elif name in _libpq_keywords():
            rest.append(pair)
        elif pair:
            raise ConfigurationError(
                f"Unknown option {name!r} in the PostgreSQL URL {mask_url(url)!r}: shoal's "
                f"options are {', '.join(sorted(_OPTIONS))}; any other must be a libpq "
                f"connection parameter (sslmode, connect_timeout, application_name, …; see "
                f"https://www.postgresql.org/docs/current/libpq-connect.html)."
            )
    return base + ("?" + "&".join(rest) if rest else ""), ours


@functools.cache
def _libpq_keywords() -> frozenset[str]:
    """The connection parameters of the libpq psycopg uses, and ``ssl``, libpq's URL alias
    of ``sslmode=require``."""
    return frozenset({d.keyword.decode() for d in pq.Conninfo.get_defaults()} | {"ssl"})


def _check_options(*, pool_min_size: int, pool_max_size: int, **timeouts: float) -> None:
    """Pool sizes are whole numbers with 1 <= pool_min_size <= pool_max_size; timeouts are
    seconds > 0: a ConfigurationError names the first option that is not."""
    for name, size in (("pool_min_size", pool_min_size), ("pool_max_size", pool_max_size)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigurationError(f"{name}={size!r} must be a whole number >= 1.")
    if pool_max_size < pool_min_size:
        raise ConfigurationError(
            f"pool_max_size={pool_max_size} is below pool_min_size={pool_min_size}: "
            f"need pool_min_size <= pool_max_size.")
    for name, seconds in timeouts.items():
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
                or not 0 < seconds < math.inf:
            raise ConfigurationError(f"{name}={seconds!r} must be a number of seconds > 0.")


_EXPIRED = {"approved": False, "data": None, "by": None, "reason": "expired"}


def _pause_wait(pause_id: str) -> str:
    """What a run parked on a pause waits for (``Run.wait_for``)."""
    return f"shoal.pause:{pause_id}"


def _child_wait(child_id: str) -> str:
    """What a run parked on a child run waits for (``Run.wait_for``); the runs_ended trigger
    (0003_trees.sql) matches it."""
    return f"shoal.child:{child_id}"


def _compose_settle_and_claim() -> str:
    """The ``settle`` and ``claim`` statements as one: the settlements' CTEs and update, then the
    claim's (the same snapshot: the claim does not see the rows the settlements free), then the
    claimed rows, the first of them (or a row of its own) carrying the ids settled."""
    def split(name: str) -> tuple[str, str]:
        text = _Q[name]
        start = text.index("WITH ")   # after the comment lines that describe it
        at = text.rindex("\nUPDATE runs\n")
        return text[start + len("WITH "):at], text[at + 1:]

    settle_with, settle_update = split("settle")
    claim_with, claim_update = split("claim")
    # the claim's owner is one text, the settlements' one per row
    assert settle_with.count("%(owner)b") == 1 and "%(owner)" not in settle_update
    settle_with = settle_with.replace("%(owner)b", "%(s_owner)b")
    composed = (f"WITH {settle_with}, settled AS (\n{settle_update}\n), {claim_with}, "
                f"claimed AS (\n{claim_update}\n), ids AS (SELECT array_agg(id) AS settled "
                f"FROM settled)\nSELECT CASE WHEN row_number() OVER () = 1 THEN ids.settled "
                f"END AS settled, claimed.* FROM ids LEFT JOIN claimed ON true")
    # Without its comments and indentation: psycopg caches the parsing of a statement's
    # placeholders only below 4 KB, and this one is sent on every batch (its text has no
    # string literal that either would change).
    compact = " ".join(re.sub(r"--[^\n]*", "", composed).split())
    assert len(compact.encode()) < 4096, len(compact)
    return compact


_SETTLE_AND_CLAIM: Any = _compose_settle_and_claim()


def _settle_row(fence: Fence, settlement: Settlement, now: float) -> dict[str, Any]:
    """One row of the batched ``settle`` statement."""
    outcome = settlement.outcome
    return {
        "id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
        "status": "queued" if outcome == "retry" else outcome,
        "output": (("null" if settlement.output is None else _json.dumps(settlement.output))
                   if outcome == "succeeded" else None),
        "error": settlement.error,
        "finished_at": None if outcome == "retry" else now,
        "run_at": settlement.run_at if outcome == "retry" else now,
        "attempt_inc": 1 if outcome == "retry" else 0,
        "traceback": settlement.traceback,
    }


# runs_status's statuses (schema version 15)
RARE_STATUSES = frozenset({"failed", "cancelled", "sleeping", "waiting", "interrupted"})


def _search_sql(namespace: str, where: RunFilter, before: str | None,
                limit: int) -> tuple[sql.Composed, dict[str, Any]]:
    """``search_runs`` as one statement; the terms that name a partial index's own condition
    (runs_status: the statuses runs pass through rarely; a key's: the key is not null) let the
    planner walk it newest first."""
    terms: list[sql.Composable] = [sql.SQL("namespace = %(namespace)s")]
    args: dict[str, Any] = {"namespace": namespace, "limit": limit}
    for column, value in (("status", where.status), ("workflow", where.workflow),
                          ("tenant", where.tenant), ("idempotency_key", where.idempotency_key),
                          ("concurrency_key", where.concurrency_key)):
        if value is not None:
            terms.append(sql.SQL("{} = {}").format(sql.Identifier(column),
                                                   sql.Placeholder(column)))
            args[column] = value
    bounds: tuple[tuple[str, LiteralString, object], ...] = (
        ("created_from", "created_at >= %(created_from)s", where.created_from),
        ("created_to", "created_at < %(created_to)s", where.created_to),
        ("before", "id < %(before)s", before))
    for name, term, bound in bounds:
        if bound is not None:
            terms.append(sql.SQL(term))
            args[name] = bound
    if where.idempotency_key is not None:
        terms.append(sql.SQL("idempotency_key IS NOT NULL"))
    if where.concurrency_key is not None:
        terms.append(sql.SQL("concurrency_key IS NOT NULL"))
    if where.status in RARE_STATUSES:
        terms.append(sql.SQL("status IN ('failed', 'cancelled', 'sleeping', 'waiting', "
                             "'interrupted')"))
    query = sql.SQL("SELECT * FROM runs WHERE {} ORDER BY id DESC LIMIT %(limit)s").format(
        sql.SQL(" AND ").join(terms))
    return query, args


def _entry(row: DictRow) -> OutboxEntry:
    return OutboxEntry(
        id=row["id"], namespace=row["namespace"], run_id=row["run_id"], seq=row["seq"],
        index=row["idx"], topic=row["topic"], payload=_json.loads(row["payload"]),
        created_at=row["created_at"], attempts=row["attempts"], next_at=row["next_at"],
        delivered_at=row["delivered_at"], dead=row["dead"], error=row["error"],
        trace_context=row["trace_context"],
    )


def _pause(row: DictRow) -> Pause:
    return Pause(
        id=row["id"], namespace=row["namespace"], tenant=row["tenant"], run_id=row["run_id"],
        name=row["name"], request=_json.loads(row["request"]), status=row["status"],
        decision=_json.loads(row["decision"]), created_at=row["created_at"],
        expires_at=row["expires_at"], resolved_at=row["resolved_at"], notified=row["notified"],
    )


class _Sticky:
    """The connection the engine's hot statements keep between them (``_connection(hot=True)``):
    taken from the pool with its turn, and given back (the turn with it) when a statement on it
    fails, when another operation waits for a turn, when the store closes, and after a minute
    (the pool then sees it again: its checks, its lifetime)."""

    KEEP = 60.0   # seconds before it goes back to the pool

    def __init__(self) -> None:
        self.connection: _Conn | None = None
        self.busy = False
        self.since = 0.0

    @property
    def idle(self) -> bool:
        return self.connection is not None and not self.busy

    def take(self) -> _Conn | None:
        """The kept connection, now busy; None when there is none or it is busy."""
        if not self.idle:
            return None
        self.busy = True
        return self.connection

    def put_back(self) -> None:
        self.busy = False

    def keep(self, conn: _Conn) -> bool:
        """Keep ``conn`` unless a connection is kept already."""
        if self.connection is not None:
            return False
        self.connection, self.since = conn, time.monotonic()
        return True

    def old(self) -> bool:
        return time.monotonic() - self.since > self.KEEP

    async def release(self, pool: AsyncConnectionPool[_Conn], turns: Turns) -> None:
        """Give the kept connection back to ``pool`` and its turn to ``turns``, unless a
        statement is using it (it is given back when that ends)."""
        conn = self.connection
        if conn is None or self.busy:
            return
        self.connection = None
        try:
            # shielded: a caller cancelled here must not leave the connection out of the pool
            # and uncounted (psycopg_pool takes it back under a lock it may wait for)
            await asyncio.shield(pool.putconn(conn))
        finally:
            turns.give()


# The columns of runs a Run is made of, in this order: each but the last names the Run field it
# fills (input, output, status and progress then decoded in place); progress_at goes into
# progress.
_RUN_COLUMNS = (
    "id", "namespace", "tenant", "workflow", "input", "output", "error", "status", "priority",
    "created_at", "run_at", "attempts", "max_attempts", "concurrency_key", "idempotency_key",
    "owner", "lease_expires_at", "lease_epoch", "cancel_requested", "version", "parent_id",
    "root_id", "wait_for", "held", "started_at", "finished_at", "resume_reason", "traceback",
    "progress", "trace_context", "progress_at")
_RUN_FIELDS = _RUN_COLUMNS[:-1]
assert _RUN_COLUMNS[-1] == "progress_at"
_BY_NAME = operator.itemgetter(*_RUN_COLUMNS)


def _run(row: DictRow) -> Run:
    """The Run of a row of runs read as a dict."""
    return _run_of(_BY_NAME(row))


def _claimed(names: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> list[Run]:
    """The Runs of a claim's rows, read as tuples whose columns are ``names``, in claim order
    (the order the engine starts them in)."""
    at = operator.itemgetter(*(names.index(c) for c in _RUN_COLUMNS))
    runs = [_run_of(at(row)) for row in rows]
    runs.sort(key=lambda r: (-r.priority, r.created_at, r.id))
    return runs


def _run_of(values: tuple[Any, ...]) -> Run:
    run = object.__new__(Run)
    # What Run's generated __init__ does, without its object.__setattr__ per field (the class is
    # frozen): a claim makes a Run of every row it takes (as _batches.queued_run does for new
    # runs). _FIELDS names every field first, so none is ever missing.
    fields = vars(run)
    fields.update(_FIELDS)
    fields.update(zip(_RUN_FIELDS, values, strict=False))   # but the last: progress_at
    fields["input"] = _json.loads(fields["input"])
    fields["output"] = _json.loads(fields["output"])
    fields["status"] = _STATUSES[fields["status"]]
    fields["progress"] = progress_of(fields["progress"], values[-1])
    return run


# every field of Run at its declared default (None where it declares none); a default made by a
# factory would have to be made per run, so there must be none
_FIELDS: dict[str, object] = {
    f.name: None if f.default is dataclasses.MISSING else f.default
    for f in dataclasses.fields(Run)}
assert all(f.default_factory is dataclasses.MISSING for f in dataclasses.fields(Run)), \
    "Run has a field with a default_factory: _run must make that default per run"
_STATUSES: dict[str, RunStatus] = {status.value: status for status in RunStatus}
assert set(_RUN_FIELDS) <= set(_FIELDS), set(_RUN_FIELDS) - set(_FIELDS)


def _input_text(new: NewRun) -> str:
    """The JSON text of a new run's input (the caller's, when it gave it)."""
    return new.input_json if new.input_json is not None else _json.dumps(new.input)


class _CopyLines:
    """The rows of new runs as lines of COPY's text format, in the columns of copy_runs."""

    def __init__(self, namespace: str) -> None:
        self.namespace = _copy_text(namespace)
        # the values most runs of a batch share (tenant, workflow, version, times): each
        # escaped or written once
        self.known: dict[str | float | None, str] = {}

    def same(self, value: str | float | None) -> str:
        out = self.known.get(value)
        if out is None:
            out = self.known[value] = _copy_value(value)
        return out

    def line(self, row: tuple[NewRun, bool, str]) -> str:
        n, held, text = row
        run_id = _copy_text(n.id)
        root = run_id if n.root_id is None or n.root_id == n.id else _copy_text(n.root_id)
        # An input's JSON text (dumps) is ASCII with its control characters escaped: only its
        # backslashes need escaping again.
        text = text.replace("\\", "\\\\")
        same = self.same
        return (f"{run_id}\t{self.namespace}\t{same(n.tenant)}\t{same(n.workflow)}\t{text}\t"
                f"queued\t{n.priority}\t{same(n.created_at)}\t{same(n.run_at)}\t"
                f"{n.max_attempts}\t{_copy_value(n.concurrency_key)}\t\\N\t{same(n.version)}\t"
                f"{_copy_value(n.parent_id)}\t{root}\t{'t' if held else 'f'}\t"
                f"{_copy_value(n.trace_context)}\n")


def _copy_value(value: str | float | None) -> str:
    """A value as a field of COPY's text format: NULL is \\N, a float its repr (which
    PostgreSQL reads back exactly), text as :func:`_copy_text` writes it."""
    if value is None:
        return "\\N"
    if isinstance(value, str):
        return _copy_text(value)
    return repr(value)


def _copy_text(value: str) -> str:
    """Text as a field of COPY's text format: its backslashes, tabs and line breaks escaped."""
    if "\\" not in value and value.isprintable():   # the common case, in two scans in C
        return value
    return _COPY_SPECIAL.sub(lambda m: _COPY_ESCAPES[m.group()], value)


async def _find_keys(execute: joined.Execute, namespace: str,
                     news: Sequence[NewRun]) -> dict[Key, Run]:
    """The stored runs of the idempotency keys of ``news``."""
    keys = list(dict.fromkeys(k for k in map(key_of, news) if k is not None))
    if not keys:
        return {}
    rows = await execute("find_idempotent_many", {
        "namespace": namespace, "tenant": [k[0] for k in keys],
        "workflow": [k[1] for k in keys], "idempotency_key": [k[2] for k in keys]})
    runs = [_run(row) for row in rows]
    return {(r.tenant, r.workflow, r.idempotency_key): r for r in runs
            if r.idempotency_key is not None}


async def _answer_batch(
    execute: joined.Execute, namespace: str, news: Sequence[NewRun], inserted: dict[str, Run],
    stored: dict[Key, Run], fresh: Sequence[NewRun], *, caller: bool,
) -> list[tuple[Run, bool]]:
    """``create_runs``' answers once the batch is inserted (``caller``: in a caller's
    transaction, which is not the store's to run again)."""
    # Keys taken before the batch, or by a transaction that committed while the insert waited
    # for it: read in a statement of their own, which sees them (create_run too).
    taken = [n for n in fresh if n.id not in inserted]
    if taken:
        stored.update(await _find_keys(execute, namespace, taken))
        if any(key_of(n) not in stored for n in taken):
            raise StoreUnavailableError(
                "A run of this batch's idempotency keys was inserted by another transaction "
                "but cannot be read back in this one (REPEATABLE READ or SERIALIZABLE began "
                "before it committed): roll back and try again." if caller else
                "A run of this batch's idempotency keys was inserted by another "
                "transaction but cannot be read back; try again.")
    return answers(news, inserted, stored)
