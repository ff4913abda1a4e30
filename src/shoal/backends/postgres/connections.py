"""The one object of the PostgreSQL store that talks to the server: :class:`Connections`.

It owns the pool (opening it, the probe before, closing it), the turns at its connections, the
connection the engine's hot statements keep (:class:`Sticky`), the command timeout, cancellation,
transactions, the settings a stateless store sends ahead of its statements, pipelines, retries of
transient refusals, and the translation of the server's and the pool's failures into
StoreUnavailableError and ConfigurationError. The store's parts (runs, coordination, rates, graph
checkpoints, notifications) are each handed it and run their statements through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, LiteralString, TypeVar
from urllib.parse import urlsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from shoal.backends._sql import queries
from shoal.backends._urls import mask_url
from shoal.backends.postgres import joined
from shoal.backends.postgres.turns import Turns
from shoal.errors import ConfigurationError, StoreUnavailableError

log = logging.getLogger("shoal.store.postgres")

Q = queries("postgres")
Conn = psycopg.AsyncConnection[DictRow]
# Transient refusals of one transaction: it did nothing, so it is run again.
RETRYABLE = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)
_T = TypeVar("_T")


# Sent first in a flow claim's transaction (runs.py: a claimer with flow-control rules), for
# that transaction only. A statement psycopg prepares (from its fifth execution) is either
# planned again for every execution or runs one generic plan made once, and the server chooses
# by their estimated costs: for the claims it plans every time, as their generic plan's
# estimate (LIMIT unknown) is the higher, and planning them costs more than running them (0.7
# ms of a 1.5 ms claim of one run; 0.5 ms with the generic plan, which is the same plan, over
# 3,600 or 100,000 queued runs alike). Only for the claims: other statements' best plans
# depend on their arguments (a list of failed runs, 0.5 ms, took 290 ms with its generic
# plan). The generic plan's high estimate also passes jit_above_cost, and JIT-compiling it
# cost 50 ms a claim. Not before the plain claims: sent as a statement of its own before each
# (a pipeline), it cost a small batch more than the planning it saved (no-op runs at 10 slots,
# 5,400 -> 4,400 runs/s); a connection of their own, set once, would not.
GENERIC_PLAN: LiteralString = ("SELECT set_config('plan_cache_mode', 'force_generic_plan', true), "
                               "set_config('jit', 'off', true)")


class Connections:
    """The connections of one store: ``conninfo`` as libpq reads it, the tables in ``schema``
    (set as each connection's search_path, or per transaction when ``stateless``), ``url`` the
    store's URL (masked in every message), the pool sized and timed by the store's options
    (see :class:`~shoal.backends.postgres.PostgresStore`)."""

    def __init__(
        self, conninfo: str, *, schema: str, url: str, stateless: bool, direct_url: str | None,
        pool_min_size: int, pool_max_size: int, open_timeout: float, pool_timeout: float,
        reconnect_timeout: float, command_timeout: float,
    ) -> None:
        self.conninfo = conninfo
        self.schema = schema
        self.url = url
        self.stateless = stateless
        self.direct_url = direct_url
        self.pool_min_size = pool_min_size
        self.pool_max_size = pool_max_size
        self.open_timeout = open_timeout
        self.pool_timeout = pool_timeout
        self.reconnect_timeout = reconnect_timeout
        self.command_timeout = command_timeout
        # the store's schema as a search_path value (the name is checked: no quote in it)
        self.search_path = f'"{schema}"'
        # a lone statement's prelude in a stateless store's pipelines (see execute)
        self.scope: list[tuple[LiteralString, dict[str, Any]]] = [
            ("SELECT set_config('search_path', %(path)s, true), "
             "set_config('shoal.counted', 'on', true)", {"path": self.search_path})
        ] if stateless else []
        self.pool: AsyncConnectionPool[Conn] | None = None
        self.busy = 0   # operations holding or waiting for a pooled connection
        self.turns = Turns(pool_max_size, pool_timeout)
        self.sticky = Sticky()
        self._sweeping: asyncio.Task[None] | None = None
        # every connection the pool made: close() closes those the pool could not
        self._pooled: weakref.WeakSet[Conn] = weakref.WeakSet()

    # -- opening and closing -----------------------------------------------------------------

    async def open(self) -> None:
        """Open the pool, once one probe connection got through (the server's reason for a
        refusal, at once); a StoreUnavailableError when it cannot."""
        await self._probe()
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self.conninfo,
            connection_class=Conn,
            kwargs={"autocommit": True, "row_factory": dict_row,
                    **self.application_name("shoal"), **self.unprepared()},
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
            raise self.unavailable(e) from None
        self.pool = pool

    async def abandon(self) -> None:
        """Close the pool just opened (the store did not get to use it: its migration
        failed)."""
        pool, self.pool = self.pool, None
        if pool is not None:
            await pool.close()

    async def _probe(self) -> None:
        """One connection first: a wrong address, user or database fails at once with the
        server's reason (a pool would retry in the background until its timeout)."""
        try:
            async with asyncio.timeout(self.open_timeout):
                conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True,
                                                             **self.unprepared())
            await conn.close()
        except (psycopg.Error, TimeoutError) as e:
            raise self.unavailable(e) from None

    async def exists(self) -> bool:
        """Whether the schema holds a shoal store (its migrations table), read on one connection
        without creating anything."""
        try:
            async with asyncio.timeout(self.open_timeout):
                conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True,
                                                             **self.unprepared())
                try:
                    cur = await conn.execute("SELECT to_regclass(%(table)s) IS NOT NULL",
                                             {"table": f'"{self.schema}".shoal_migrations'})
                    row = await cur.fetchone()
                finally:
                    await conn.close()
        except (psycopg.Error, TimeoutError) as e:
            raise self.unavailable(e) from None
        return bool(row and row[0])

    async def _configure(self, conn: Conn) -> None:
        self._pooled.add(conn)
        if self.stateless:
            return   # each transaction sets both for itself (transaction, execute)
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        # the statements of this store record what they change in run_counts themselves, one row
        # per batch (queries.sql): the triggers that count run by run for other sessions skip it
        await conn.execute("SET shoal.counted TO on")

    async def close(self) -> None:
        """Close the pool and its connections (the kept one first), after the background
        check of the connections stops."""
        sweeping, self._sweeping = self._sweeping, None
        self.turns.close()
        if sweeping is not None:
            sweeping.cancel()
            await asyncio.gather(sweeping, return_exceptions=True)
        pool, self.pool = self.pool, None
        if pool is not None:
            await self.sticky.release(pool, self.turns)
            await self._close_pool(pool)

    async def _close_pool(self, pool: AsyncConnectionPool[Conn]) -> None:
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

    # -- what the server is told and what a user is told ---------------------------------------

    def application_name(self, what: str) -> dict[str, str]:
        """Name the connections after the schema in pg_stat_activity, unless the URL does."""
        if "application_name" in self._params():
            return {}
        return {"application_name": f"{what} {self.schema}"}

    def unprepared(self) -> dict[str, Any]:
        """A stateless store's connections prepare no statement on the server: the next
        execution may reach another server connection, where it does not exist."""
        return {"prepare_threshold": None} if self.stateless else {}

    def _params(self) -> dict[str, Any]:
        """The connection parameters as libpq reads them (none if it cannot)."""
        try:
            return conninfo_to_dict(self.conninfo)
        except psycopg.Error:
            return {}

    def reason(self, e: BaseException) -> str:
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

    def unavailable(self, e: BaseException) -> StoreUnavailableError:
        """Opening failed. "within N s" is said only when open_timeout really ran out (our
        timeout, or the pool's wait for its first connections); a failure that came sooner
        gives its own reason."""
        if isinstance(e, TimeoutError | PoolTimeout):
            reason = f"no answer within open_timeout={self.open_timeout:g} s."
        else:
            reason = self.reason(e)
            if not reason.endswith((".", "?", "!")):
                reason += "."
        return StoreUnavailableError(
            f"Cannot connect to the PostgreSQL store {mask_url(self.url)!r}: {reason} Check "
            f"that the server runs and the URL (host, port, user, password, database) is right."
        )

    @asynccontextmanager
    async def privileged(self) -> AsyncIterator[None]:
        """A privilege the connecting role lacks is a ConfigurationError that says which grants
        shoal needs (rather than psycopg's bare refusal)."""
        try:
            yield
        except pg_errors.InsufficientPrivilege as e:
            reason = self.reason(e).rstrip(".")
            raise ConfigurationError(
                f"The PostgreSQL store {mask_url(self.url)!r} refused this role: {reason}. "
                f"To serve a schema, a role needs USAGE on it, SELECT, INSERT, UPDATE and "
                f"DELETE on its tables and USAGE on its sequences; to create or upgrade it, "
                f"run 'shoal migrate' as a role that may create tables there (its owner)."
            ) from None

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

    def _failed(self, pool: AsyncConnectionPool[Conn],
                e: PoolTimeout | PoolClosed | psycopg.OperationalError) -> StoreUnavailableError:
        """The StoreUnavailableError an operation raises for the pool's or the server's
        failure ``e`` (after a server's, the idle connections are checked: see _sweep)."""
        if isinstance(e, PoolTimeout):
            return self._starved()
        if isinstance(e, PoolClosed):
            return StoreUnavailableError(
                f"The PostgreSQL store {mask_url(self.url)!r} was closed before this operation "
                f"got a connection.")
        self._sweep(pool)
        return StoreUnavailableError(
            f"The PostgreSQL store {mask_url(self.url)!r} failed: {self.reason(e)}")

    def _sweep(self, pool: AsyncConnectionPool[Conn]) -> None:
        """After a server restart every idle pooled connection is dead: test them all at once
        (in the background) rather than fail one operation per stale connection."""
        if self._sweeping is None or self._sweeping.done():
            self._sweeping = asyncio.create_task(pool.check(), name=f"shoal-check-{self.schema}")

    # -- a connection, in turn -----------------------------------------------------------------

    @asynccontextmanager
    async def connection(self, *, urgent: bool = False, hot: bool = False,
                         bounded: bool = True) -> AsyncIterator[Conn]:
        """A pooled connection, in turn (``urgent`` ones first: renewals). A burst waits as
        long as the queue moves; when no operation got a connection for ``pool_timeout``
        seconds, or the server fails, it is a StoreUnavailableError.

        ``hot``: the engine's claims, settlements and checkpoints, a statement every few
        milliseconds on a busy worker. They keep one connection between them (see
        :class:`Sticky`) rather than take the next in the pool's rotation (psycopg_pool hands
        its connections out first in, first out): one server process then serves them all, its
        caches warm. The rotation cost a no-op run about a tenth more server CPU, and a busy
        worker a sixth of its throughput (bench/postgres.py, alternating rounds).

        ``bounded``: the body's statements are answered within ``command_timeout`` seconds or
        it fails (see :meth:`_answered`); only migrations are not."""
        pool = self._open_pool()
        if not hot:
            await self._release_idle(pool)
        task = asyncio.current_task()
        asked = task.cancelling() if task is not None else 0
        self.busy += 1
        try:
            conn = self.sticky.take() if hot else None
            if conn is not None:
                ok = False
                try:
                    async with self._answered(conn, bounded):
                        yield conn
                    ok = True
                finally:
                    await self._after_kept(pool, ok)
                return
            conn = await self._lend(pool, urgent, task, asked)
            kept = False
            try:
                async with self._answered(conn, bounded):
                    yield conn
                # kept, with its turn, for the next hot operation
                kept = hot and self._may_keep(pool) and self.sticky.keep(conn)
            finally:
                if not kept:
                    await self._give_back(pool, conn)
        except (PoolTimeout, PoolClosed, psycopg.OperationalError) as e:
            if isinstance(e, RETRYABLE):
                raise
            raise self._failed(pool, e) from None
        finally:
            self.busy -= 1

    def _open_pool(self) -> AsyncConnectionPool[Conn]:
        """The pool; a StoreUnavailableError when the store is not open."""
        pool = self.pool
        if pool is None:
            raise StoreUnavailableError(
                f"The PostgreSQL store {mask_url(self.url)!r} is not open."
            )
        return pool

    async def _release_idle(self, pool: AsyncConnectionPool[Conn]) -> None:
        """When every turn is taken and one of them only keeps a connection for later: give it
        back, so that no operation ever waits for a connection kept idle."""
        if self.sticky.idle and not self.turns.free:
            await self.sticky.release(pool, self.turns)

    async def _lend(self, pool: AsyncConnectionPool[Conn], urgent: bool,
                    task: asyncio.Task[Any] | None, asked: int) -> Conn:
        """A connection of ``pool`` with its turn (an operation's: it gives both back with
        :meth:`_give_back`). ``asked``: the cancellations of ``task`` before it asked."""
        try:
            await self.turns.take(urgent=urgent)
        except TimeoutError:
            raise self._starved() from None
        try:
            conn = await pool.getconn(timeout=self.pool_timeout)
        except BaseException as e:
            if isinstance(e, PoolTimeout):
                self.turns.fail_waiting()   # at the front for pool_timeout: none would get one
            self.turns.give()
            raise
        self.turns.served()
        if task is not None and task.cancelling() > asked:
            # Cancelled while the pool handed this connection over: psycopg_pool's wait
            # (asyncio.wait_for on Python 3.11) returns the connection and drops the
            # cancellation, so a stopping loop would go on forever.
            await self._give_back(pool, conn)
            raise asyncio.CancelledError
        return conn

    async def _give_back(self, pool: AsyncConnectionPool[Conn], conn: Conn) -> None:
        """``conn`` back to ``pool``, and its turn to the next operation."""
        try:
            await pool.putconn(conn)
        finally:
            self.turns.give()

    async def _after_kept(self, pool: AsyncConnectionPool[Conn], ok: bool) -> None:
        """A statement on the kept connection ended (``ok``: without an error): keep it for the
        next, unless that failed, another operation waits, or it has been kept a while."""
        self.sticky.put_back()
        if not (ok and self._may_keep(pool)) or self.sticky.old():
            await self.sticky.release(pool, self.turns)

    def _may_keep(self, pool: AsyncConnectionPool[Conn]) -> bool:
        """Whether a hot operation may keep its connection now: the store is still open on
        ``pool`` and no operation waits for a turn."""
        return self.pool is pool and not self.turns.waiting

    @asynccontextmanager
    async def _answered(self, conn: Conn, bounded: bool) -> AsyncIterator[None]:
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

    # -- statements ----------------------------------------------------------------------------

    @asynccontextmanager
    async def transaction(self, conn: Conn, *, snapshot: bool = False) -> AsyncIterator[None]:
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

    async def execute(self, conn: Conn, cur: psycopg.AsyncCursor[Any],
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
            for prelude, values in self.scope:
                await conn.execute(prelude, values)
            await cur.execute(query, args, binary=binary)

    def on(self, conn: Conn) -> joined.Execute:
        """How a plan of :mod:`~shoal.backends.postgres.joined`'s kind runs the named
        statements on one of the store's own connections (see :meth:`execute`)."""
        async def execute(name: str, args: dict[str, Any]) -> list[DictRow]:
            cur = conn.cursor()
            await self.execute(conn, cur, Q[name], args)
            return await cur.fetchall()

        return execute

    async def one(self, query: LiteralString, args: dict[str, Any]) -> DictRow | None:
        """One row of one statement (autocommit: the statement is its own transaction)."""
        async with self.connection() as conn:
            cur = conn.cursor()
            await self.execute(conn, cur, query, args)
            return await cur.fetchone()

    async def all(
        self, query: LiteralString | sql.Composed, args: dict[str, Any], *,
        fetch: bool = True, urgent: bool = False, hot: bool = False,
    ) -> list[DictRow]:
        """Every row of one statement. ``hot``: see :meth:`connection`."""
        async with self.connection(urgent=urgent, hot=hot) as conn:
            cur = conn.cursor()
            await self.execute(conn, cur, query, args)
            return await cur.fetchall() if fetch else []

    async def tuples(
        self, query: LiteralString, args: dict[str, Any], *, hot: bool = False,
        generic: bool = False,
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """The names of one statement's columns and its rows as tuples, in PostgreSQL's binary
        format: the claims' whole runs (the server formats no number as text and the client
        parses none; a tuple costs a run less than a dict). ``hot``: see :meth:`connection`.

        ``generic``: the statement runs its generic plan (see :data:`GENERIC_PLAN`), for the
        claims, whose best plan is one whatever their arguments."""
        async with self.connection(hot=hot) as conn:
            cur = conn.cursor(row_factory=tuple_row)
            if generic and not self.stateless:
                if conn.info.transaction_status == pq.TransactionStatus.IDLE:
                    # one round trip, one implicit transaction: the settings are the claim's
                    async with conn.pipeline():
                        await conn.execute(GENERIC_PLAN)
                        await cur.execute(query, args, binary=True)
                else:
                    await conn.execute(GENERIC_PLAN)
                    await cur.execute(query, args, binary=True)
            else:
                await self.execute(conn, cur, query, args, binary=True)
            return [c.name for c in cur.description or ()], await cur.fetchall()

    async def pipelined(
        self, steps: Sequence[tuple[str, dict[str, Any]]], *, urgent: bool = False
    ) -> list[DictRow]:
        """The rows of the last statement of ``steps``, all run as one transaction in one
        round trip: on a pooled connection (autocommit, so psycopg sends no BEGIN) the server
        runs the statements of a pipeline as one implicit transaction, committed at its sync
        (in a stateless store, the first sets the session's settings for it: ``scope``).
        ``urgent`` (renewals of leases) goes before the other operations waiting for a
        connection."""
        async with self.connection(urgent=urgent) as conn:
            async with conn.pipeline():
                for query, args in [*self.scope, *steps]:
                    cur = await conn.execute(query, args)
            return await cur.fetchall() if cur.description is not None else []

    async def retry(self, attempt: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``attempt()`` (one whole transaction) again when the server refused it as a
        deadlock victim or a serialization failure: it wrote nothing."""
        for n in range(4):
            try:
                return await attempt()
            except RETRYABLE:
                if n == 3:
                    raise
                await asyncio.sleep(0.01 * (n + 1))
        raise AssertionError("unreachable")

    async def retried(
        self, steps: Sequence[tuple[str, dict[str, Any]]], *, urgent: bool = False
    ) -> list[DictRow]:
        """:meth:`pipelined`, run again on a transient refusal (:meth:`retry`)."""
        return await self.retry(lambda: self.pipelined(steps, urgent=urgent))


class Sticky:
    """The connection the engine's hot statements keep between them (``connection(hot=True)``):
    taken from the pool with its turn, and given back (the turn with it) when a statement on it
    fails, when another operation waits for a turn, when the store closes, and after a minute
    (the pool then sees it again: its checks, its lifetime)."""

    KEEP = 60.0   # seconds before it goes back to the pool

    def __init__(self) -> None:
        self.connection: Conn | None = None
        self.busy = False
        self.since = 0.0

    @property
    def idle(self) -> bool:
        return self.connection is not None and not self.busy

    def take(self) -> Conn | None:
        """The kept connection, now busy; None when there is none or it is busy."""
        if not self.idle:
            return None
        self.busy = True
        return self.connection

    def put_back(self) -> None:
        self.busy = False

    def keep(self, conn: Conn) -> bool:
        """Keep ``conn`` unless a connection is kept already."""
        if self.connection is not None:
            return False
        self.connection, self.since = conn, time.monotonic()
        return True

    def old(self) -> bool:
        return time.monotonic() - self.since > self.KEEP

    async def release(self, pool: AsyncConnectionPool[Conn], turns: Turns) -> None:
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
