"""Runs dispatched in the caller's own transaction (``TransactionalContract``) on SQLite and on
PostgreSQL, with each kind of connection a caller has: a ``sqlite3`` connection to the store's
file (or to a file of its own that attached the store's), a psycopg 3 ``AsyncConnection`` and a
sync ``Connection``. The caller keeps a table named ``runs`` of its own where its unqualified
names go, so a statement of the store that missed its schema would write there, or fail.

PostgreSQL: each test gets a store schema (``schema``) and a schema for the caller's own tables;
the stranger is a connection to another database of the server, made once for the module.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sql_support import sqlite_store
from test_postgres import URL, _open, _require_postgres

from shoal.backends.postgres import PostgresStore
from shoal.backends.sqlite import SQLiteStore
from shoal.testing.contract import CallerTransaction, TransactionalContract

Callers = Callable[[], Any]


# -- SQLite ----------------------------------------------------------------------------------------


class SQLiteCaller:
    """A caller's transaction on a ``sqlite3`` connection (the legacy default: the first write
    begins it); ``path`` is the file its own tables are in."""

    def __init__(self, connection: sqlite3.Connection, path: str) -> None:
        self.connection = connection
        self.path = path

    async def note(self, text: str) -> None:
        self.connection.execute("INSERT INTO notes (text) VALUES (?)", (text,))

    async def notes(self) -> list[str]:
        with sqlite3.connect(self.path) as reader:
            rows = reader.execute("SELECT text FROM notes ORDER BY rowid").fetchall()
        reader.close()
        return [r[0] for r in rows]

    async def commit(self) -> None:
        self.connection.commit()

    async def rollback(self) -> None:
        self.connection.rollback()


def sqlite_callers(path: Path, attach: Path | None = None) -> Callers:
    """Transactions on ``path``, which gets the caller's ``notes`` table and, when it is the
    store's file, a TEMP ``runs`` table (shadowing the store's for unqualified names); with
    ``attach``, the store's file attached as ``jobs`` and a ``runs`` table of the caller's own
    in ``path``."""

    @asynccontextmanager
    async def caller() -> AsyncIterator[CallerTransaction]:
        conn = sqlite3.connect(path)
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS notes (text TEXT)")
            if attach is None:
                conn.execute("CREATE TEMP TABLE runs (mine TEXT)")
            else:
                conn.execute("CREATE TABLE IF NOT EXISTS runs (mine TEXT)")
                conn.execute("ATTACH DATABASE ? AS jobs", (str(attach),))
            conn.commit()
            yield SQLiteCaller(conn, str(path))
            conn.rollback()
        finally:
            conn.close()

    return caller


class TestSQLiteTransactional(TransactionalContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[SQLiteStore]:
        async with sqlite_store(tmp_path / "shoal.db") as s:
            yield s

    @pytest.fixture
    async def other(self, store: SQLiteStore) -> AsyncIterator[SQLiteStore]:
        async with sqlite_store(store.path) as s:
            yield s

    @pytest.fixture
    def caller(self, store: SQLiteStore) -> Callers:
        return sqlite_callers(Path(store.path))

    @pytest.fixture
    async def stranger(self, tmp_path: Path) -> Callers:
        # another shoal store: refused by its file, not by what it holds
        async with sqlite_store(tmp_path / "elsewhere.db"):
            pass
        return sqlite_callers(tmp_path / "elsewhere.db")


class TestSQLiteAttached(TestSQLiteTransactional):
    """The caller's own file, with the store's attached: the store's tables are the attached
    ones, whatever the caller's file holds."""

    @pytest.fixture
    def caller(self, store: SQLiteStore, tmp_path: Path) -> Callers:
        return sqlite_callers(tmp_path / "app.db", attach=Path(store.path))


async def test_sqlite_refuses_an_autocommit_connection_and_the_memory_store(
    tmp_path: Path,
) -> None:
    from shoal.errors import ConfigurationError
    from shoal.testing.contract import new_run

    async with sqlite_store(tmp_path / "shoal.db") as store:
        conn = sqlite3.connect(store.path, isolation_level=None)
        try:
            with pytest.raises(ConfigurationError, match="autocommit"):
                await store.create_run_in(conn, new_run(), max_queued=None, admission="reject")
            conn.execute("BEGIN")   # in a transaction it is welcome
            run, created = await store.create_run_in(conn, new_run(), max_queued=None,
                                                     admission="reject")
            assert created and await store.get_run(run.id) is None
            conn.execute("COMMIT")
            assert await store.get_run(run.id) is not None
        finally:
            conn.close()
        conn = sqlite3.connect(store.path, isolation_level=None)
        try:
            with pytest.raises(ConfigurationError, match="autocommit"):
                await store.create_runs_in(conn, [new_run()], max_queued=None,
                                           admission="reject")
            conn.execute("BEGIN")
            got = await store.create_runs_in(conn, [new_run(), new_run()], max_queued=None,
                                             admission="reject")
            assert await store.get_run(got[0][0].id) is None
            conn.execute("COMMIT")
            assert len(await store.list_runs(None)) == 3
        finally:
            conn.close()
    memory = SQLiteStore(":memory:")
    await memory.open()
    try:
        with pytest.raises(ConfigurationError, match="memory"):
            await memory.create_run_in(sqlite3.connect(":memory:"), new_run(), max_queued=None,
                                       admission="reject")
        with pytest.raises(ConfigurationError, match="memory"):
            await memory.create_runs_in(sqlite3.connect(":memory:"), [new_run()],
                                        max_queued=None, admission="reject")
    finally:
        await memory.close()


def _locked_for(path: str) -> bool:
    """Whether another connection to ``path`` is refused the write lock (it does not wait)."""
    rival = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        rival.execute("BEGIN IMMEDIATE")
        rival.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as e:
        assert "locked" in str(e)
        return True
    finally:
        rival.close()


async def test_sqlite_a_batch_outside_a_transaction_begins_one_with_the_write_lock(
    tmp_path: Path,
) -> None:
    """Python's default mode before the first write: the batch begins the transaction with the
    write lock (no other writer can take a key between the lookup and the insert), and leaves
    it open for the caller; a batch that stores nothing ends it again."""
    from shoal.errors import AdmissionRejectedError
    from shoal.testing.contract import new_run

    async with sqlite_store(tmp_path / "shoal.db") as store:
        old, _ = await store.create_run(new_run(idem="old"), max_queued=None,
                                        admission="reject")
        conn = sqlite3.connect(store.path)
        try:
            assert not conn.in_transaction
            # nothing new: a repeat, a refused batch
            [(again, created)] = await store.create_runs_in(conn, [new_run(idem="old")],
                                                            max_queued=None, admission="reject")
            assert again.id == old.id and not created
            assert not conn.in_transaction and not _locked_for(store.path)
            with pytest.raises(AdmissionRejectedError):
                await store.create_runs_in(conn, [new_run(), new_run()], max_queued=2,
                                           admission="reject")
            assert not conn.in_transaction and not _locked_for(store.path)

            got = await store.create_runs_in(conn, [new_run(idem="old"), new_run(idem="k")],
                                             max_queued=2, admission="reject")
            assert [c for _, c in got] == [False, True]
            assert conn.in_transaction and _locked_for(store.path)
            assert await store.get_run(got[1][0].id) is None
            conn.commit()
            assert await store.get_run(got[1][0].id) is not None
        finally:
            conn.close()


async def test_sqlite_a_batch_failing_half_way_leaves_none_of_its_rows(tmp_path: Path) -> None:
    """The batch's inserts are one savepoint: a failure on its second row takes back its first,
    and the caller's transaction, with its own rows, goes on."""
    import dataclasses

    from shoal.testing.contract import new_run

    async with sqlite_store(tmp_path / "shoal.db") as store:
        stored, _ = await store.create_run(new_run(), max_queued=None, admission="reject")
        conn = sqlite3.connect(store.path)
        try:
            conn.execute("CREATE TABLE notes (text TEXT)")
            conn.execute("INSERT INTO notes VALUES ('mine')")
            first = new_run()
            clash = dataclasses.replace(new_run(), id=stored.id, root_id=stored.id)
            with pytest.raises(sqlite3.IntegrityError):
                await store.create_runs_in(conn, [first, clash], max_queued=None,
                                           admission="reject")
            assert conn.in_transaction
            conn.commit()
            assert conn.execute("SELECT text FROM notes").fetchall() == [("mine",)]
            assert [r.id for r in await store.list_runs(None)] == [stored.id]
        finally:
            conn.close()


# -- PostgreSQL ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_database() -> Iterator[str]:
    """The URL of another database on the test server, for the module."""
    _require_postgres()
    name = f"shoal_t_db_{secrets.token_hex(4)}"
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield psycopg.conninfo.make_conninfo(URL, dbname=name)
    finally:
        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _app_schema(url: str, name: str) -> None:
    """The caller's own schema: ``notes``, and a ``runs`` table of the caller's."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(name)))
        for table in ("CREATE TABLE IF NOT EXISTS {}.notes (text text)",
                      "CREATE TABLE IF NOT EXISTS {}.runs (mine text)"):
            conn.execute(sql.SQL(table).format(sql.Identifier(name)))


def _drop_app_schema(url: str, name: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


class PostgresCaller:
    """A caller's transaction on a psycopg connection in its default mode (the first statement
    begins it), whose search_path is the caller's own schema; a sync connection is driven in a
    thread, as a caller in async code would."""

    def __init__(self, connection: psycopg.AsyncConnection[Any] | psycopg.Connection[Any],
                 url: str, schema: str) -> None:
        self.connection = connection
        self.url = url
        self.schema = schema

    async def _call(self, method: str, *args: Any) -> Any:
        fn = getattr(self.connection, method)
        if isinstance(self.connection, psycopg.AsyncConnection):
            return await fn(*args)
        return await asyncio.to_thread(fn, *args)

    async def note(self, text: str) -> None:
        await self._call("execute", "INSERT INTO notes (text) VALUES (%s)", (text,))

    async def notes(self) -> list[str]:
        async with await psycopg.AsyncConnection.connect(self.url) as reader:
            cur = await reader.execute(sql.SQL("SELECT text FROM {}.notes").format(
                sql.Identifier(self.schema)))
            return [r[0] for r in await cur.fetchall()]

    async def commit(self) -> None:
        await self._call("commit")

    async def rollback(self) -> None:
        await self._call("rollback")


def postgres_callers(url: str, schema: str, *, sync: bool) -> Callers:
    @asynccontextmanager
    async def caller() -> AsyncIterator[CallerTransaction]:
        options = f"-c search_path={schema}"
        if sync:
            conn: Any = await asyncio.to_thread(psycopg.connect, url, options=options)
        else:
            conn = await psycopg.AsyncConnection.connect(url, options=options)
        try:
            yield PostgresCaller(conn, url, schema)
        finally:
            if sync:
                await asyncio.to_thread(conn.close)
            else:
                await conn.close()

    return caller


class TestPostgresTransactional(TransactionalContract):
    """With a psycopg AsyncConnection."""

    sync = False

    @pytest.fixture
    async def store(self, schema: str) -> AsyncIterator[PostgresStore]:
        s = await _open(schema)
        yield s
        await s.close()

    @pytest.fixture
    async def other(self, store: PostgresStore) -> AsyncIterator[PostgresStore]:
        s = await _open(store.schema)
        yield s
        await s.close()

    @pytest.fixture
    def caller(self, store: PostgresStore) -> Iterator[Callers]:
        mine = f"{store.schema}_app"
        _app_schema(URL, mine)
        yield postgres_callers(URL, mine, sync=self.sync)
        _drop_app_schema(URL, mine)

    @pytest.fixture
    def stranger(self, store: PostgresStore, other_database: str) -> Iterator[Callers]:
        # the store's schema name is free there: refused for the database, not the schema
        mine = f"{store.schema}_app"
        _app_schema(other_database, mine)
        yield postgres_callers(other_database, mine, sync=self.sync)
        _drop_app_schema(other_database, mine)


class TestPostgresSyncTransactional(TestPostgresTransactional):
    """With a sync psycopg Connection."""

    sync = True


async def test_sqlite_a_key_committed_between_the_lookup_and_the_insert(tmp_path: Path) -> None:
    """The caller's transaction had not written yet when another process committed the key
    after shoal looked it up: the insert finds the key taken and answers that run."""
    from shoal.backends.sqlite import joined
    from shoal.backends.sqlite.store import _create_run, _run
    from shoal.testing.contract import new_run

    async with sqlite_store(tmp_path / "shoal.db") as store:
        rival = sqlite3.connect(store.path, isolation_level=None)
        rival_id: list[str] = []

        class Racing(sqlite3.Cursor):
            def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:   # type: ignore[override]
                if sql.startswith("INSERT") and not rival_id:
                    run = new_run(idem="k")   # another process's dispatch of the key
                    rival_id.append(run.id)
                    rival.execute(
                        "INSERT INTO runs (id, namespace, tenant, workflow, input, status, "
                        "created_at, run_at, max_attempts, idempotency_key, root_id) VALUES "
                        "(?, ?, ?, ?, '1', 'queued', 0, 0, 3, ?, ?)",
                        (run.id, run.namespace, run.tenant, run.workflow, "k", run.id))
                return super().execute(sql, *args)

        conn = sqlite3.connect(store.path)
        try:
            cur = conn.cursor(Racing)
            cur.row_factory = sqlite3.Row
            q = {n: joined.query(n, "main") for n in ("find_idempotent", "count_queued",
                                                       "insert_run")}
            row, created = _create_run(cur, q, new_run(idem="k"), None, "reject")
            assert not created and _run(row).id == rival_id[0]
            conn.commit()
            assert [r.id for r in await store.list_runs(None)] == rival_id
        finally:
            conn.close()
            rival.close()


async def _waits_for_a_lock(pid: int) -> None:
    """Return once the backend ``pid`` waits for a lock (within 10 s)."""
    async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as watcher:
        async with asyncio.timeout(10):
            while True:
                cur = await watcher.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,))
                row = await cur.fetchone()
                if row is not None and row[0] == "Lock":
                    return
                await asyncio.sleep(0.01)


async def test_postgres_a_key_dispatched_in_an_open_transaction_waits_for_its_end(
    schema: str,
) -> None:
    """Two callers' transactions dispatch one idempotency key: the second waits for the first,
    then gets its run if it committed, or inserts its own if it rolled back."""
    from shoal.testing.contract import new_run

    store = await _open(schema)
    first = await psycopg.AsyncConnection.connect(URL)
    second = await psycopg.AsyncConnection.connect(URL)
    try:
        for commit in (True, False):
            key = f"k-{commit}"
            run, created = await store.create_run_in(first, new_run(idem=key), max_queued=None,
                                                     admission="reject")
            assert created
            waiting = asyncio.create_task(store.create_run_in(
                second, new_run(idem=key), max_queued=None, admission="reject"))
            await _waits_for_a_lock(second.info.backend_pid)   # on the key's index entry
            assert not waiting.done()
            await (first.commit() if commit else first.rollback())
            other, created = await asyncio.wait_for(waiting, 10)
            assert (other.id == run.id and not created) if commit else (
                other.id != run.id and created)
            await second.commit()
    finally:
        await first.close()
        await second.close()
        await store.close()


async def test_postgres_a_batch_key_dispatched_in_an_open_transaction_waits_for_its_end(
    schema: str,
) -> None:
    """Two callers' transactions dispatch batches sharing an idempotency key: the second waits
    for the first, then gets its run if it committed, or inserts its own if it rolled back."""
    from shoal.testing.contract import new_run

    store = await _open(schema)
    first = await psycopg.AsyncConnection.connect(URL)
    second = await psycopg.AsyncConnection.connect(URL)
    try:
        for commit in (True, False):
            key = f"k-{commit}"
            [_, (run, created)] = await store.create_runs_in(
                first, [new_run(), new_run(idem=key)], max_queued=None, admission="reject")
            assert created
            mine = new_run(idem=key)
            waiting = asyncio.create_task(store.create_runs_in(
                second, [new_run(), mine], max_queued=None, admission="reject"))
            await _waits_for_a_lock(second.info.backend_pid)   # on the key's index entry
            assert not waiting.done()
            await (first.commit() if commit else first.rollback())
            [(_, fresh), (other, created)] = await asyncio.wait_for(waiting, 10)
            assert fresh
            assert (other.id == run.id and not created) if commit else (
                other.id == mine.id and created)
            await second.commit()
        assert len(await store.list_runs(None)) == 5
    finally:
        await first.close()
        await second.close()
        await store.close()


async def test_postgres_admission_in_a_caller_s_transaction_takes_no_lock(schema: str) -> None:
    """Admission in the caller's transaction counts what it sees and takes no advisory lock:
    held until the caller commits, it would stall every dispatch of the namespace."""
    from shoal.testing.contract import NS, new_run

    store = await _open(schema)
    try:
        async with await psycopg.AsyncConnection.connect(URL) as conn:
            await store.create_run_in(conn, new_run(), max_queued=10, admission="reject")
            await store.create_runs_in(conn, [new_run(), new_run()], max_queued=10,
                                       admission="park")
            cur = await conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s",
                (conn.info.backend_pid,))
            assert await cur.fetchone() == (0,)
            # the store's own dispatch under admission control does not wait for it
            got = await asyncio.wait_for(store.create_runs(
                [new_run()], max_queued=10, admission="reject"), 10)
            assert got[0][1]
            await conn.commit()
        assert len(await store.list_runs(NS)) == 4
    finally:
        await store.close()


async def test_postgres_a_raw_cursor_factory_and_pipeline_mode(schema: str) -> None:
    """shoal's statements use psycopg's default cursor, whatever the connection's factory, and
    read their rows in pipeline mode too."""
    from shoal.testing.contract import new_run

    store = await _open(schema)
    try:
        conn = await psycopg.AsyncConnection.connect(URL, autocommit=True,
                                                     cursor_factory=psycopg.AsyncRawCursor)
        async with conn, conn.transaction(), conn.pipeline():
            a, created = await store.create_run_in(conn, new_run(idem="p"), max_queued=None,
                                                   admission="reject")
            assert created
            b, created = await store.create_run_in(conn, new_run(idem="p"), max_queued=None,
                                                   admission="reject")
            assert not created and b.id == a.id
            got = await store.create_runs_in(conn, [new_run(idem="p"), new_run(idem="q")],
                                             max_queued=5, admission="reject")
            assert [(r.id, c) for r, c in got] == [(a.id, False), (got[1][0].id, True)]
        assert [r.id for r in await store.list_runs(None)] == [a.id, got[1][0].id]
    finally:
        await store.close()
