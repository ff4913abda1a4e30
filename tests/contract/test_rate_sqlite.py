"""The rate-limit contract on the SQLite store: two store objects (two connections) on one file,
the migration that brings a file at version 6 up to the rate-limit tables, and random calls that
must get the memory reference's answers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from sql_support import (
    RATE_TABLES,
    OnOneSQLiteFile,
    check_the_ledger_filters,
    random_calls,
    sqlite_file_at,
    sqlite_store,
    use_the_rate_tables,
)

from shoal.coord.base import RateStore
from shoal.stores._sqlfiles import migrations
from shoal.stores.memory import MemoryStore
from shoal.stores.sqlite import SQLiteStore
from shoal.testing.rate_contract import RateContract


class TestSQLiteRateLimits(OnOneSQLiteFile, RateContract):
    @pytest.fixture
    def rates(self, sqlite: SQLiteStore) -> SQLiteStore:
        return sqlite


def test_the_sqlite_store_is_a_rate_store() -> None:
    assert isinstance(SQLiteStore(":memory:"), RateStore)


async def test_a_store_at_version_6_gets_the_rate_tables(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    applied = sqlite_file_at(path, 6,    # the file as shoal left it at version 6
                             "INSERT INTO locks (namespace, key, holder, token, expires_at) "
                             "VALUES ('ns', 'k', NULL, 41, 0)")
    assert applied == [1, 2, 3, 4, 5, 6]

    async with sqlite_store(path) as store:
        newest = max(number for number, _, _ in migrations("sqlite"))
        assert newest >= 7
        assert await store.migrate() == newest
        tables = {r[0] for r in store._db.execute("SELECT name FROM sqlite_master")}
        assert tables >= RATE_TABLES
        assert (await store.lock_acquire("ns", ["k"], "h", 10.0, 0.0)).token == 42  # type: ignore[union-attr]
        entry = await use_the_rate_tables(store)
        assert await store.ledger("ns", tenant="t") == [entry]


async def test_a_window_keeps_only_its_entries(tmp_path: Path) -> None:
    """Entries that left the window are deleted by the next add of the key (not other keys')."""
    async with sqlite_store(tmp_path / "shoal.db") as store:
        for i in range(50):
            await store.window_add("ns", "w", 1, 10.0, None, float(i))
            await store.window_add("ns", "other", 1, 10.0, None, 0.0)
        counts = dict(store._db.execute(
            "SELECT key, count(*) FROM rate_window_entries GROUP BY key").fetchall())
        assert counts == {"w": 10, "other": 50}
        plan = " ".join(r[3] for r in store._db.execute(
            "EXPLAIN QUERY PLAN SELECT sum(amount) FROM rate_window_entries "
            "WHERE namespace = 'ns' AND key = 'w'"))
        assert "rate_window_entries_key" in plan


async def test_the_ledger_filters_by_tenant_and_root_together(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path / "shoal.db") as store:
        await check_the_ledger_filters(store)


@pytest.mark.parametrize("seed", range(8))
async def test_the_same_answers_as_the_memory_reference(tmp_path: Path, seed: int) -> None:
    async with sqlite_store(tmp_path / "shoal.db") as store:
        await random_calls(random.Random(seed), MemoryStore(), store)
