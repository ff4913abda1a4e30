"""Test support shared by the SQLite and PostgreSQL contract tests (``test_coord_sqlite.py``,
``test_rate_sqlite.py``, ``test_rate_postgres.py``; pytest puts this directory on sys.path, and
``conftest.py`` has pytest rewrite the asserts here as in a test file): an open SQLite store, the
two stores on one file a contract wants, a SQLite file as an older shoal left it, the checks of
a store just migrated to the rate-limit tables and of the ledger's filters (the random calls
that must get the memory reference's answers are ``shoal.testing.contract.differential``'s)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from shoal.backends._sql import migrations
from shoal.backends.sqlite import SQLiteStore
from shoal.backends.sqlite.store import _statements
from shoal.ports import RateStore
from shoal.testing.contract.rates import unwritten
from shoal.types import SlotGrant, SpendEntry

RATE_TABLES = {"rate_slots", "rate_window_entries", "rate_pauses", "rate_counters", "cost_ledger"}


@asynccontextmanager
async def sqlite_store(path: str | Path) -> AsyncIterator[SQLiteStore]:
    """A SQLite store on ``path``, open for the ``with`` block."""
    s = SQLiteStore(str(path))
    await s.open()
    try:
        yield s
    finally:
        await s.close()


class OnOneSQLiteFile:
    """For a contract class (put first among the bases): the ``sqlite`` fixture, a store on a
    file of the test's own, and ``other``, a second store object (its own connection) on the same
    file."""

    @pytest.fixture
    async def sqlite(self, tmp_path: Path) -> AsyncIterator[SQLiteStore]:
        async with sqlite_store(tmp_path / "shoal.db") as s:
            yield s

    @pytest.fixture
    async def other(self, sqlite: SQLiteStore) -> AsyncIterator[SQLiteStore]:
        async with sqlite_store(sqlite.path) as s:
            yield s


def sqlite_file_at(path: Path, version: int, *statements: str) -> list[int]:
    """Write ``path`` as shoal left it at ``version``: its migrations up to that one applied and
    recorded, then ``statements`` (rows the file had). The numbers of the migrations applied."""
    old = [m for m in migrations("sqlite") if m[0] <= version]
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE shoal_migrations "
                     "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)")
        for number, name, sql in old:
            for statement in _statements(sql):
                conn.execute(statement)
            conn.execute("INSERT INTO shoal_migrations VALUES (?, ?, 0)", (number, name))
        for statement in statements:
            conn.execute(statement)
    conn.close()
    return [number for number, _, _ in old]


async def use_the_rate_tables(store: RateStore) -> SpendEntry:
    """One call on each rate-limit table of a store that has nothing in them yet; the spend
    entry recorded (for the caller to find in the ledger)."""
    assert await store.slot_acquire("ns", "s", "h", 1, 10.0, 0.0) == SlotGrant(10.0)
    assert (await store.window_add("ns", "w", 2, 60.0, 5, 0.0)).total == 2
    assert await store.pause_until("ns", "p", 9.0, 0.0) == 9.0
    entry = SpendEntry("t", "r", "r", 0.5, "usd", 0.0)
    assert (await store.counter_add("ns", ["c"], [0.5], [1.0], 0.0, entry)).totals == [0.5]
    return entry


async def check_the_ledger_filters(store: RateStore) -> None:
    """The ledger filters by tenant and root together (on an empty ledger)."""
    entries = [SpendEntry(t, f"r{i}", root, 1.0, "usd", float(i))
               for i, (t, root) in enumerate([("t1", "a"), ("t2", "a"), ("t1", "b"),
                                              ("t1", None), ("t1", "a")])]
    for e in entries:
        await store.counter_add("ns", [], [], [], e.at, e)
    rows = await store.ledger("ns")
    assert [unwritten(r) for r in rows] == entries
    assert await store.ledger("ns", tenant="t1", root_id="a") == [rows[0], rows[4]]
    assert await store.ledger("ns", tenant="t1", limit=2) == [rows[0], rows[2]]
    assert await store.ledger("ns", root_id="a") == [rows[0], rows[1], rows[4]]
    assert await store.ledger("ns", root_id="a", after=rows[1].id) == [rows[4]]
    assert await store.ledger("ns", run_id="r3", tenant="t1") == [rows[3]]


async def trim_the_exported_ledger(store: RateStore, delete: Callable[[int], object]) -> None:
    """Rows exported, then deleted up to the last id exported (``delete(last_id)``, what the
    docs say to do): the pages go on from there and new rows get larger ids, even once every
    row was deleted."""
    for i in range(5):
        await store.counter_add("ns", [], [], [], float(i), SpendEntry("t", None, None, i, "usd",
                                                                       float(i)))
    exported = await store.ledger("ns", limit=3)
    last = exported[-1].id
    assert last is not None
    delete(last)
    rest = await store.ledger("ns")
    assert [r.amount for r in rest] == [3, 4] and rest == await store.ledger("ns", after=last)
    final = rest[-1].id
    assert final is not None
    delete(final)
    assert await store.ledger("ns") == []
    await store.counter_add("ns", [], [], [], 9.0, SpendEntry("t", None, None, 9, "usd", 9.0))
    [new] = await store.ledger("ns", after=final)
    assert new.id is not None and new.id > final and new.amount == 9
