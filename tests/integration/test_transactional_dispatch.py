"""``app.dispatch(..., connection=conn)`` end to end, in one process with real stores: a run
dispatched in a rolled-back transaction leaves no run and no wake-up (PostgreSQL: nothing on the
store's NOTIFY channel; SQLite: no run), a committed one is claimed by a started App at once
(the time from the commit to the run's start is printed, ``-s`` shows it; not asserted), with a
psycopg ``AsyncConnection``, a sync ``Connection`` and a ``sqlite3`` connection; the caller's
own row commits with the run. The same for a batch of 100 (``app.dispatch_many(...,
connection=conn)``): nothing, and no wake-up, for a rollback; one wake-up for a commit, after
which a started App claims all of it (the times from the commit to the first and the last
start are printed). And the refusals: the memory store, a connection in autocommit outside a
transaction, a failed transaction.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from backends import PG_URL, postgres_schema
from psycopg import pq, sql

import shoal
from shoal.backends.postgres import PostgresStore
from shoal.errors import ConfigurationError

TIMEOUT = 10.0


def started_app(store: str, concurrency: int = 4) -> tuple[shoal.App, dict[str, float]]:
    """An app with one workflow, ``mark``, that records when each run started (by its input)."""
    app = shoal.App("tx", store=store, max_concurrent_runs=concurrency)
    starts: dict[str, float] = {}

    @app.workflow(name="mark")
    async def mark(ctx: shoal.RunContext, order: str) -> str:
        starts.setdefault(order, time.monotonic())
        return order

    return app, starts


@pytest.fixture
def pg_store() -> Iterator[str]:
    with postgres_schema("shoal_tx_") as url:
        yield url


async def _schema_of(url: str) -> str:
    return PostgresStore.from_url(url).schema


async def _orders_table(schema: str) -> sql.Composed:
    """The caller's own table (in the store's schema, so that it goes with it)."""
    table = sql.Identifier(schema, "orders")
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (name text)").format(table))
    return sql.SQL("INSERT INTO {} (name) VALUES (%s)").format(table)


async def _orders(schema: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
        cur = await conn.execute(sql.SQL("SELECT name FROM {} ORDER BY name").format(
            sql.Identifier(schema, "orders")))
        return [r[0] for r in await cur.fetchall()]


class Listener:
    """LISTEN on the store's channel; ``heard()`` is what came before a sentinel notification
    sent after the fact (notifications arrive in commit order, so anything a commit sent
    earlier is there: no wait for a silence)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], channel: str) -> None:
        self.conn = conn
        self.channel = channel

    @classmethod
    async def open(cls, schema: str) -> Listener:
        conn = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)
        channel = f"shoal_{schema}"
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        return cls(conn, channel)

    async def heard(self) -> list[str]:
        async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as other:
            await other.execute("SELECT pg_notify(%s, 'sentinel')", (self.channel,))
        payloads: list[str] = []
        async with asyncio.timeout(TIMEOUT):
            async for n in self.conn.notifies():
                if n.payload == "sentinel":
                    return payloads
                payloads.append(n.payload)
        raise AssertionError("unreachable")


async def _caller(sync: bool) -> Any:
    """The caller's connection in autocommit mode: its transactions are ``conn.transaction()``
    blocks, the documented way."""
    if sync:
        return await asyncio.to_thread(psycopg.connect, PG_URL, autocommit=True)
    return await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)


async def _in_transaction(conn: Any, insert: sql.Composed, order: str, app: shoal.App,
                          *, commit: bool) -> str:
    """The caller's own row and a run of ``mark`` in one transaction of ``conn`` (async or
    sync), committed or rolled back; the run's id."""
    if isinstance(conn, psycopg.AsyncConnection):
        async with conn.transaction(force_rollback=not commit):
            await conn.execute(insert, (order,))
            run = await app.dispatch("mark", order, connection=conn)
        return run.id
    tx = conn.transaction(force_rollback=not commit)
    await asyncio.to_thread(tx.__enter__)
    try:
        await asyncio.to_thread(conn.execute, insert, (order,))
        run = await app.dispatch("mark", order, connection=conn)
    finally:
        await asyncio.to_thread(tx.__exit__, None, None, None)
    return run.id


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_postgres_rollback_leaves_nothing_and_commit_is_claimed_at_once(
    pg_store: str, sync: bool,
) -> None:
    schema = await _schema_of(pg_store)
    app, starts = started_app(pg_store)
    async with app:
        insert = await _orders_table(schema)
        listener = await Listener.open(schema)
        conn = await _caller(sync)
        try:
            assert await listener.heard() == []   # the started app is quiet
            lost = await _in_transaction(conn, insert, "lost", app, commit=False)
            assert await listener.heard() == []   # no wake-up
            assert await app.store.get_run(lost) is None
            assert await app.list_runs() == [] and await _orders(schema) == []

            kept = await _in_transaction(conn, insert, "kept", app, commit=True)
            committed = time.monotonic()
            assert await app.result(kept, timeout=TIMEOUT) == "kept"
            print(f"\n{'sync' if sync else 'async'} psycopg: commit -> start "
                  f"{(starts['kept'] - committed) * 1000:.1f} ms")
            assert await _orders(schema) == ["kept"]
            assert "" in await listener.heard()   # the commit's wake-up
            assert [r.id for r in await app.list_runs()] == [kept]
        finally:
            if sync:
                await asyncio.to_thread(conn.close)
            else:
                await conn.close()
            await listener.conn.close()


@asynccontextmanager
async def _transaction(conn: Any, *, commit: bool) -> AsyncIterator[None]:
    """A transaction block on the caller's connection (async or sync, in autocommit mode),
    committed or rolled back at its end."""
    if isinstance(conn, psycopg.AsyncConnection):
        async with conn.transaction(force_rollback=not commit):
            yield
        return
    tx = conn.transaction(force_rollback=not commit)
    await asyncio.to_thread(tx.__enter__)
    try:
        yield
    finally:
        await asyncio.to_thread(tx.__exit__, None, None, None)


async def _execute(conn: Any, query: sql.Composed, args: tuple[Any, ...]) -> None:
    if isinstance(conn, psycopg.AsyncConnection):
        await conn.execute(query, args)
    else:
        await asyncio.to_thread(conn.execute, query, args)


BATCH = 100


def _report(what: str, starts: dict[str, float], names: list[str], committed: float) -> None:
    after = sorted((starts[n] - committed) * 1000 for n in names)
    print(f"\n{what}: a batch of {len(names)}, commit -> first start {after[0]:.1f} ms, "
          f"median {after[len(after) // 2]:.1f} ms, last {after[-1]:.1f} ms")


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_postgres_a_rolled_back_batch_wakes_nobody_and_a_committed_one_is_claimed(
    pg_store: str, sync: bool,
) -> None:
    schema = await _schema_of(pg_store)
    app, starts = started_app(pg_store, concurrency=BATCH)
    async with app:
        insert = await _orders_table(schema)
        listener = await Listener.open(schema)
        conn = await _caller(sync)
        try:
            assert await listener.heard() == []   # the started app is quiet
            async with _transaction(conn, commit=False):
                await _execute(conn, insert, ("lost",))
                lost = await app.dispatch_many(
                    "mark", [f"lost-{i}" for i in range(BATCH)], connection=conn)
                assert len(lost) == BATCH
            assert await listener.heard() == []   # no wake-up
            assert await app.store.get_run(lost[0].id) is None
            assert await app.list_runs() == [] and await _orders(schema) == []

            names = [f"kept-{i}" for i in range(BATCH)]
            async with _transaction(conn, commit=True):
                await _execute(conn, insert, ("kept",))
                kept = await app.dispatch_many(
                    "mark", [shoal.DispatchItem(n, idempotency_key=n) for n in names],
                    connection=conn)
                assert await listener.heard() == []   # nothing before the commit
            committed = time.monotonic()
            for run in kept:
                assert await app.result(run.id, timeout=TIMEOUT) == run.input
            _report(f"{'sync' if sync else 'async'} psycopg", starts, names, committed)
            assert [p for p in await listener.heard() if p == ""] == [""]   # one wake-up
            assert await _orders(schema) == ["kept"]
            assert sorted(r.id for r in await app.list_runs(limit=1000)) == sorted(
                r.id for r in kept)
            assert not any(name.startswith("lost") for name in starts)
        finally:
            if sync:
                await asyncio.to_thread(conn.close)
            else:
                await conn.close()
            await listener.conn.close()


async def test_sqlite_a_rolled_back_batch_leaves_nothing_and_a_committed_one_is_claimed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shoal.db"
    app, starts = started_app(f"sqlite:///{path}", concurrency=BATCH)
    async with app:
        conn = sqlite3.connect(path)
        try:
            conn.execute("CREATE TABLE orders (name TEXT)")
            conn.commit()
            conn.execute("INSERT INTO orders VALUES ('lost')")
            lost = await app.dispatch_many("mark", [f"lost-{i}" for i in range(BATCH)],
                                           connection=conn)
            conn.rollback()
            assert await app.store.get_run(lost[0].id) is None and await app.list_runs() == []

            names = [f"kept-{i}" for i in range(BATCH)]
            conn.execute("INSERT INTO orders VALUES ('kept')")
            kept = await app.dispatch_many("mark", names, connection=conn)
            assert await app.list_runs() == []
            conn.commit()
            committed = time.monotonic()
            for run in kept:
                assert await app.result(run.id, timeout=TIMEOUT) == run.input
            _report("sqlite3", starts, names, committed)
            assert conn.execute("SELECT name FROM orders").fetchall() == [("kept",)]
            assert sorted(r.id for r in await app.list_runs(limit=1000)) == sorted(
                r.id for r in kept)
            assert not any(name.startswith("lost") for name in starts)
        finally:
            conn.close()


async def test_sqlite_rollback_leaves_nothing_and_commit_is_claimed_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shoal.db"
    app, starts = started_app(f"sqlite:///{path}")
    async with app:
        conn = sqlite3.connect(path)
        try:
            conn.execute("CREATE TABLE orders (name TEXT)")
            conn.commit()
            conn.execute("INSERT INTO orders VALUES ('lost')")
            lost = await app.dispatch("mark", "lost", connection=conn)
            conn.rollback()
            assert await app.store.get_run(lost.id) is None and await app.list_runs() == []

            conn.execute("INSERT INTO orders VALUES ('kept')")
            kept = await app.dispatch("mark", "kept", connection=conn)
            conn.commit()
            committed = time.monotonic()
            assert await app.result(kept.id, timeout=TIMEOUT) == "kept"
            print(f"\nsqlite3: commit -> start {(starts['kept'] - committed) * 1000:.1f} ms")
            assert conn.execute("SELECT name FROM orders").fetchall() == [("kept",)]
            assert [r.id for r in await app.list_runs()] == [kept.id]
            assert "lost" not in starts
        finally:
            conn.close()


async def test_the_memory_store_has_no_transaction_to_join() -> None:
    app, _ = started_app("memory://")
    async with app.open():
        with pytest.raises(ConfigurationError, match="connection="):
            await app.dispatch("mark", "x", connection=sqlite3.connect(":memory:"))
        with pytest.raises(ConfigurationError, match=r"dispatch_many\(connection="):
            await app.dispatch_many("mark", ["x"], connection=sqlite3.connect(":memory:"))
        assert await app.list_runs() == []


@pytest.fixture
async def pg_app(pg_store: str) -> AsyncIterator[shoal.App]:
    app, _ = started_app(pg_store)
    async with app.open():
        yield app


async def test_postgres_refuses_autocommit_and_failed_transactions(pg_app: shoal.App) -> None:
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
        with pytest.raises(ConfigurationError, match="autocommit"):
            await pg_app.dispatch("mark", "x", connection=conn)
        async with conn.transaction(force_rollback=True):
            with pytest.raises(psycopg.errors.DivisionByZero):
                await conn.execute("SELECT 1 / 0")
            with pytest.raises(ConfigurationError, match="roll it back"):
                await pg_app.dispatch("mark", "x", connection=conn)
    assert await pg_app.list_runs() == []


async def test_postgres_a_refusal_leaves_the_caller_s_transaction_as_it_was(
    pg_app: shoal.App, pg_store: str,
) -> None:
    """A connection in its default mode (not autocommit), idle: shoal's check opened its
    transaction, and closes it again when it refuses."""
    schema = await _schema_of(pg_store)
    async with await psycopg.AsyncConnection.connect(PG_URL) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        await conn.commit()
        with pytest.raises(ConfigurationError, match="holds no shoal store"):
            await pg_app.dispatch("mark", "x", connection=conn)
        assert conn.info.transaction_status == pq.TransactionStatus.IDLE


async def test_postgres_the_default_mode_leaves_the_transaction_open(pg_app: shoal.App) -> None:
    """Not autocommit: the dispatch begins the transaction (as psycopg's first statement does)
    and leaves it open for the caller's commit."""
    async with await psycopg.AsyncConnection.connect(PG_URL) as conn:
        run = await pg_app.dispatch("mark", "x", connection=conn)
        assert conn.info.transaction_status == pq.TransactionStatus.INTRANS
        assert await pg_app.store.get_run(run.id) is None
        await conn.commit()
    assert (await pg_app.get_run(run.id)).status == "queued"
