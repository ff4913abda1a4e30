"""The rate-limit contract on the SQLite store: two store objects (two connections) on one file,
the migrations that bring a file at version 6 up to the rate-limit tables and one at version 7 to
the windows' running totals, a window_add that reads only the entries it needs, and random calls
that must get the memory reference's answers."""

from __future__ import annotations

from pathlib import Path

import pytest
from sql_support import (
    RATE_TABLES,
    OnOneSQLiteFile,
    check_the_ledger_filters,
    sqlite_file_at,
    sqlite_store,
    trim_the_exported_ledger,
    use_the_rate_tables,
)

from shoal.backends._sql import migrations
from shoal.backends.sqlite import SQLiteStore
from shoal.backends.sqlite.rates import _Q
from shoal.ports import RateStore
from shoal.testing.contract import RateContract, RateDifferential
from shoal.testing.contract.rates import increasing, unwritten
from shoal.types import SpendEntry, WindowResult


class TestSQLiteRateLimits(OnOneSQLiteFile, RateContract, RateDifferential):
    differential_seeds = tuple(range(8))

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
        assert [unwritten(r) for r in await store.ledger("ns", tenant="t")] == [entry]


async def test_a_store_at_version_7_gets_the_window_totals(tmp_path: Path) -> None:
    """Migration 8 fills each window's running total from the entries there (even those that
    have left the window since: the next add subtracts them as they leave)."""
    path = tmp_path / "old.db"
    rows = [("ns", "w", 0.0, 2.0), ("ns", "w", 10.0, 3.0), ("ns", "w", 10.0, -0.5),
            ("ns", "other", 5.0, 1.25), ("ns2", "w", 1.0, 4.0)]
    applied = sqlite_file_at(path, 7, *(   # the file as shoal left it at version 7
        "INSERT INTO rate_window_entries (namespace, key, at, amount) "
        f"VALUES ('{ns}', '{key}', {at}, {amount})" for ns, key, at, amount in rows))
    assert applied == [1, 2, 3, 4, 5, 6, 7]

    async with sqlite_store(path) as store:
        assert await store.migrate() >= 8
        totals = {(ns, key): total for ns, key, total in store._db.execute(
            "SELECT namespace, key, total FROM rate_windows")}
        assert totals == {("ns", "w"): 4.5, ("ns", "other"): 1.25, ("ns2", "w"): 4.0}
        assert await store.window_add("ns", "w", 0, 60.0, None, 30.0) == WindowResult(True, 4.5)
        assert await store.window_add("ns", "w", 0, 60.0, None, 65.0) == WindowResult(True, 2.5)
        assert await store.window_add("ns", "w", 3, 60.0, 5, 65.0) == WindowResult(False, 2.5, 70.0)
        assert await store.window_add("ns", "w", 3, 60.0, 5, 70.0) == WindowResult(True, 3.0)
        assert (await store.window_add("ns", "other", 1, 60.0, 5, 64.0)).total == 2.25
        assert (await store.window_add("ns2", "w", 0, 60.0, None, 61.0)).total == 0


async def test_a_window_costs_the_entries_leaving_not_the_window(tmp_path: Path) -> None:
    """An add deletes the entries that left and keeps the running total; a refused add reads the
    entries from the oldest only as far as it needs."""
    async with sqlite_store(tmp_path / "shoal.db") as store:
        for i in range(100):
            await store.window_add("ns", "w", 1, 60.0, None, i / 10)
        args = {"namespace": "ns", "key": "w", "cutoff": 0.5}
        plans = {name: " ".join(r[3] for r in store._db.execute(
                     "EXPLAIN QUERY PLAN " + _Q[name], args))
                 for name in ("rate_window_leaving", "rate_window_prune", "rate_window_walk")}
        for name, plan in plans.items():
            assert "rate_window_entries_key" in plan, (name, plan)
            assert "TEMP B-TREE" not in plan, (name, plan)     # read in index order, no sort
        assert "at<?" in plans["rate_window_leaving"] and "at<?" in plans["rate_window_prune"]
        got = await store.window_add("ns", "w", 2, 60.0, 100, 60.05)
        assert got == WindowResult(False, 99.0, 60.1)     # the entry at 0 left: one more to go
        total = store._db.execute("SELECT total FROM rate_windows WHERE key = 'w'").fetchone()
        assert total[0] == 99.0
        assert await store.window_add("ns", "w", 0, 60.0, None, 200.0) == WindowResult(True, 0)
        assert store._db.execute("SELECT count(*) FROM rate_window_entries").fetchone()[0] == 0
        await store.window_add("ns", "w", 1, 60.0, None, 200.0)
        await store.window_clear("ns", "w")
        assert store._db.execute("SELECT count(*) FROM rate_windows").fetchone()[0] == 0


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


async def test_a_ledger_page_reads_through_an_index(tmp_path: Path) -> None:
    """Each filter's page walks the index of its narrowest filter from `after` (a search, in
    id order: no sort), never the ledger."""
    async with sqlite_store(tmp_path / "shoal.db") as store:
        args = {"namespace": "ns", "tenant": "t", "root_id": "a", "run_id": "r", "after": 5,
                "limit": 10, "since": None, "until": None}
        for name, index in [("cost_ledger", "cost_ledger_namespace"),
                            ("cost_ledger_of_tenant", "cost_ledger_tenant"),
                            ("cost_ledger_of_root", "cost_ledger_root"),
                            ("cost_ledger_of_run", "cost_ledger_run")]:
            plan = " ".join(r[3] for r in store._db.execute("EXPLAIN QUERY PLAN " + _Q[name],
                                                            args))
            assert f"SEARCH cost_ledger USING INDEX {index}" in plan, (name, plan)
            assert "id>?" in plan and "TEMP B-TREE" not in plan, (name, plan)


async def test_a_store_at_version_10_gets_the_ledger_indexes(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    applied = sqlite_file_at(path, 10, *(   # the file as shoal left it at version 10
        "INSERT INTO cost_ledger (namespace, tenant, run_id, root_id, amount, currency, at) "
        f"VALUES ('ns', 't', 'r{i}', NULL, {i}, 'usd', {i})" for i in range(3)))
    assert applied == list(range(1, 11))
    async with sqlite_store(path) as store:
        assert await store.migrate() >= 11
        rows = await store.ledger("ns")
        assert [r.run_id for r in rows] == ["r0", "r1", "r2"] and increasing(rows)
        assert await store.ledger("ns", run_id="r1") == [rows[1]]
        assert await store.ledger("ns", after=rows[0].id, limit=1) == [rows[1]]
        entry = SpendEntry("t", "r9", None, 1, "usd", 9)
        await store.counter_add("ns", [], [], [], 9, entry)
        assert [unwritten(r) for r in await store.ledger("ns", after=rows[2].id)] == [entry]


async def test_an_exported_ledger_is_trimmed_and_ids_go_on(tmp_path: Path) -> None:
    """What the docs say to do with an exported prefix: delete it by id; new rows never reuse
    an id, even when every row was deleted."""
    async with sqlite_store(tmp_path / "shoal.db") as store:
        await trim_the_exported_ledger(
            store, lambda last: store._db.execute(
                "DELETE FROM cost_ledger WHERE namespace = 'ns' AND id <= ?", (last,)))
