"""The rate-limit contract on the SQLite store: two store objects (two connections) on one file,
the migration that brings a file at version 6 up to the rate-limit tables, and random calls that
must get the memory reference's answers."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shoal.coord.base import RateStore, SlotGrant, SpendEntry
from shoal.stores._sqlfiles import migrations
from shoal.stores.memory import MemoryStore
from shoal.stores.sqlite import SQLiteStore, _statements
from shoal.testing.rate_contract import RateContract

RATE_TABLES = {"rate_slots", "rate_window_entries", "rate_pauses", "rate_counters", "cost_ledger"}


class TestSQLiteRateLimits(RateContract):
    @pytest.fixture
    async def rates(self, tmp_path: Path) -> AsyncIterator[SQLiteStore]:
        s = SQLiteStore(str(tmp_path / "shoal.db"))
        await s.open()
        yield s
        await s.close()

    @pytest.fixture
    async def other(self, rates: SQLiteStore) -> AsyncIterator[SQLiteStore]:
        s = SQLiteStore(rates.path)
        await s.open()
        yield s
        await s.close()


def test_the_sqlite_store_is_a_rate_store() -> None:
    assert isinstance(SQLiteStore(":memory:"), RateStore)


async def test_a_store_at_version_6_gets_the_rate_tables(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = [m for m in migrations("sqlite") if m[0] <= 6]
    assert [number for number, _, _ in old] == [1, 2, 3, 4, 5, 6]
    with sqlite3.connect(path) as conn:   # the file as shoal left it at version 6
        conn.execute("CREATE TABLE shoal_migrations "
                     "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)")
        for number, name, sql in old:
            for statement in _statements(sql):
                conn.execute(statement)
            conn.execute("INSERT INTO shoal_migrations VALUES (?, ?, 0)", (number, name))
        conn.execute("INSERT INTO locks (namespace, key, holder, token, expires_at) "
                     "VALUES ('ns', 'k', NULL, 41, 0)")
    conn.close()

    store = SQLiteStore(str(path))
    await store.open()
    try:
        newest = max(number for number, _, _ in migrations("sqlite"))
        assert newest >= 7
        assert await store.migrate() == newest
        tables = {r[0] for r in store._db.execute("SELECT name FROM sqlite_master")}
        assert tables >= RATE_TABLES
        assert (await store.lock_acquire("ns", ["k"], "h", 10.0, 0.0)).token == 42  # type: ignore[union-attr]
        assert await store.slot_acquire("ns", "s", "h", 1, 10.0, 0.0) == SlotGrant(10.0)
        assert (await store.window_add("ns", "w", 2, 60.0, 5, 0.0)).total == 2
        assert await store.pause_until("ns", "p", 9.0) == 9.0
        entry = SpendEntry("t", "r", "r", 0.5, "usd", 0.0)
        assert (await store.counter_add("ns", ["c"], [0.5], [1.0], 0.0, entry)).totals == [0.5]
        assert await store.ledger("ns", tenant="t") == [entry]
    finally:
        await store.close()


async def test_a_window_keeps_only_its_entries(tmp_path: Path) -> None:
    """Entries that left the window are deleted by the next add of the key (not other keys')."""
    store = SQLiteStore(str(tmp_path / "shoal.db"))
    await store.open()
    try:
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
    finally:
        await store.close()


async def test_the_ledger_filters_by_tenant_and_root_together(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "shoal.db"))
    await store.open()
    try:
        entries = [SpendEntry(t, f"r{i}", root, 1.0, "usd", float(i))
                   for i, (t, root) in enumerate([("t1", "a"), ("t2", "a"), ("t1", "b"),
                                                  ("t1", None), ("t1", "a")])]
        for e in entries:
            await store.counter_add("ns", [], [], [], e.at, e)
        assert await store.ledger("ns", tenant="t1", root_id="a") == [entries[0], entries[4]]
        assert await store.ledger("ns", tenant="t1", limit=2) == [entries[0], entries[2]]
        assert await store.ledger("ns", root_id="a") == [entries[0], entries[1], entries[4]]
        assert await store.ledger("ns") == entries
    finally:
        await store.close()


async def random_calls(rnd: random.Random, memory: MemoryStore, store: RateStore) -> None:
    """250 random calls on both stores, answer for answer. Amounts are small multiples of 1/4
    so that every sum is exact whatever the order the backend adds in."""

    async def both(method: str, *args: object, **kwargs: object) -> object:
        answer = await getattr(memory, method)(*args, **kwargs)
        got = await getattr(store, method)(*args, **kwargs)
        assert got == answer, (method, args, kwargs)
        return answer

    now = 1000.0
    for _ in range(250):
        now += rnd.choice([0, 0, 0, 0.25, 0.5, 1]) if rnd.random() < 0.98 else 40
        ns, op = rnd.choice(["n1", "n2"]), rnd.random()
        key = rnd.choice(["a", "b"])
        if op < 0.2:
            holder = rnd.choice([f"h{i}" for i in range(5)])
            await both("slot_acquire", ns, key, holder, rnd.choice([1, 2, 3]),
                       rnd.choice([5.0, 30.0]), now)
        elif op < 0.27:
            await both("slot_renew", ns, key, rnd.choice(["h0", "h1", "h2"]), 10.0, now)
        elif op < 0.32:
            await both("slot_release", ns, key, rnd.choice(["h0", "h1", "h2"]))
        elif op < 0.6:
            amount = rnd.choice([0, 1, 1, 2, 2, 3, 0.25, -1, -0.5, 12])
            limit = {"a": 6, "b": 10}[key] if rnd.random() < 0.85 else None
            await both("window_add", ns, key, amount, {"a": 10.0, "b": 60.0}[key], limit,
                       now)
        elif op < 0.62:
            await both("window_clear", ns, key)
        elif op < 0.66:
            await both("pause_until", ns, key, now + rnd.choice([-5, 0, 5, 30]))
        elif op < 0.72:
            await both("paused_until", ns, key, now)
        elif op < 0.95:
            n = rnd.randint(0, 3)
            names = [rnd.choice("xyz") for _ in range(n)]
            amounts = [rnd.choice([0, 0.25, 1, 2.5, -0.5, 3]) for _ in range(n)]
            limits = [rnd.choice([None, 2, 5, 8]) for _ in range(n)]
            entry = (None if rnd.random() < 0.3 else
                     SpendEntry(rnd.choice(["t1", "t2"]), rnd.choice([None, "r1", "r2"]),
                                rnd.choice([None, "r1", "r9"]), sum(amounts), "usd", now))
            await both("counter_add", ns, names, amounts, limits, now, entry)
        else:
            await both("ledger", ns, tenant=rnd.choice([None, "t1", "t2"]),
                       root_id=rnd.choice([None, "r1", "r9"]), limit=rnd.choice([3, 1000]))


@pytest.mark.parametrize("seed", range(8))
async def test_the_same_answers_as_the_memory_reference(tmp_path: Path, seed: int) -> None:
    store = SQLiteStore(str(tmp_path / "shoal.db"))
    await store.open()
    try:
        await random_calls(random.Random(seed), MemoryStore(), store)
    finally:
        await store.close()
