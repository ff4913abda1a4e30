"""Test support shared by the SQLite and PostgreSQL contract tests (``test_coord_sqlite.py``,
``test_rate_sqlite.py``, ``test_rate_postgres.py``; pytest puts this directory on sys.path, and
``conftest.py`` has pytest rewrite the asserts here as in a test file): an open SQLite store, the
two stores on one file a contract wants, a SQLite file as an older shoal left it, the checks of
a store just migrated to the rate-limit tables and of the ledger's filters, and random calls
that must get the memory reference's answers (admissions among them)."""

from __future__ import annotations

import dataclasses
import random
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from shoal.backends._sql import migrations
from shoal.backends.memory import MemoryStore
from shoal.backends.sqlite import SQLiteStore
from shoal.backends.sqlite.store import _statements
from shoal.ports import RateStore
from shoal.testing.rate_contract import increasing, unwritten
from shoal.types import (
    CircuitNeed,
    Need,
    PauseNeed,
    SlotGrant,
    SlotNeed,
    SpendEntry,
    WindowNeed,
    WindowResult,
)

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


def random_needs(rnd: random.Random) -> list[Need]:
    """What an admission among :func:`random_calls` asks for, in a random order: maybe a
    circuit (its pause "a" or "b", counters "x" and "y", trial slot "c"), slots "a" and "b",
    pauses, and room in windows "a" and "b" (the lengths and limits random_calls gives them)."""
    needs: list[Need] = []
    if rnd.random() < 0.2:
        needs.append(CircuitNeed(rnd.choice(["a", "b"]), "x", "y", "c", 10.0))
    for key in rnd.sample(["a", "b"], rnd.randint(0, 2)):
        needs.append(SlotNeed(key, rnd.choice([1, 2, 3]), rnd.choice([5.0, 30.0])))
    opens = {n.open for n in needs if isinstance(n, CircuitNeed)}
    needs.extend(PauseNeed(key) for key in rnd.sample(["a", "b"], rnd.randint(0, 1))
                 if key not in opens)
    for key in rnd.sample(["a", "b"], rnd.randint(0, 2)):
        limit = {"a": 6, "b": 10}[key] if rnd.random() < 0.85 else None
        needs.append(WindowNeed(key, rnd.choice([1, 2, 0.25, 12]), {"a": 10.0, "b": 60.0}[key],
                                limit))
    rnd.shuffle(needs)
    return needs


async def random_calls(rnd: random.Random, memory: MemoryStore, store: RateStore) -> None:
    """250 random calls on both stores, answer for answer. The amounts of limited windows and of
    counters are small multiples of 1/4, so that every sum, and so every verdict and retry time,
    is exact whatever the order the backend adds in. A window's total is a running total, whose
    last bit depends on the order of its additions and subtractions (which differs between
    backends): totals are compared to 1e-9, and a window never limited ("c") gets amounts whose
    sums round. Negative window amounts (corrections) may be dated before other entries."""

    async def both(method: str, *args: object, **kwargs: object) -> object:
        answer = await getattr(memory, method)(*args, **kwargs)
        got = await getattr(store, method)(*args, **kwargs)
        if isinstance(answer, WindowResult) and isinstance(got, WindowResult):
            assert got.total == pytest.approx(answer.total, rel=1e-9, abs=1e-9), (
                method, args, got, answer)
            got = dataclasses.replace(got, total=answer.total)   # the rest compares exactly
        if method == "ledger":   # ids of a SQL ledger are shared by its namespaces
            assert isinstance(got, list) and increasing(got), got
            got = [unwritten(r) for r in got]
            answer = [unwritten(r) for r in answer]
        assert got == answer, (method, args, kwargs)
        return answer

    now = 1000.0
    for _ in range(250):
        now += rnd.choice([0, 0, 0, 0.25, 0.5, 1]) if rnd.random() < 0.98 else 40
        ns, op = rnd.choice(["n1", "n2"]), rnd.random()
        key = rnd.choice(["a", "b"])
        if rnd.random() < 0.15:
            await both("admit", ns, rnd.choice([f"h{i}" for i in range(5)]),
                       random_needs(rnd), now)
            continue
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
            if rnd.random() < 0.3:
                key, amount, limit = "c", rnd.choice([0, 0.1, 0.7, 1 / 3, -0.2]), None
            at = now - rnd.choice([0, 0.25, 3]) if amount < 0 else now
            await both("window_add", ns, key, amount, {"a": 10.0, "b": 60.0, "c": 5.0}[key],
                       limit, at)
        elif op < 0.62:
            await both("window_clear", ns, key)
        elif op < 0.66:
            await both("pause_until", ns, key, now + rnd.choice([-5, 0, 5, 30]), now)
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
