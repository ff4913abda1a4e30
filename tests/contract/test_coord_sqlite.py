"""The coordination contract on the SQLite store: two store objects (two connections) on one file,
random calls that must get the memory reference's answers, and the migration that brings a file
made by an older shoal up to the coordination tables."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from handoffs import LockManagerHandOffs
from sql_support import OnOneSQLiteFile, sqlite_file_at, sqlite_store

from shoal.backends._sql import migrations
from shoal.backends.sqlite import SQLiteStore
from shoal.ports import CoordStore
from shoal.testing.contract import CoordContract, CoordDifferential
from shoal.types import LockGrant, LockWait

COORD_TABLES = {"locks", "lock_waiters", "lock_tickets", "members", "rosters", "meters"}


class TestSQLiteCoordination(OnOneSQLiteFile, CoordContract, CoordDifferential,
                             LockManagerHandOffs):
    differential_seeds = tuple(range(8))
    differential_calls = 250

    @pytest.fixture
    def coord(self, sqlite: SQLiteStore) -> SQLiteStore:
        return sqlite


def test_the_sqlite_store_is_a_coord_store() -> None:
    assert isinstance(SQLiteStore(":memory:"), CoordStore)


async def test_a_store_made_before_coordination_gets_its_tables(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    applied = sqlite_file_at(path, 5)   # the file as shoal left it before version 6
    assert applied == [1, 2, 3, 4, 5]

    async with sqlite_store(path) as store:
        newest = max(number for number, _, _ in migrations("sqlite"))
        assert newest >= 6
        assert await store.migrate() == newest
        tables = {r[0] for r in store._db.execute("SELECT name FROM sqlite_master")}
        assert tables >= COORD_TABLES
        assert isinstance(await store.lock_acquire("ns", ["k"], "h", 10.0, 0.0), LockGrant)
        assert (await store.heartbeat("ns", "m", None, 0.0, 15.0, 0.0)).members == ("m",)
        assert await store.meter("ns", ["k"], [5.0], 0.0) == [5.0]


async def test_a_watch_ends_its_poller_with_the_last_watch(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path / "shoal.db") as store:
        async with store.lock_watch("ns", ["a"], "h1"), store.lock_watch("ns", ["a", "b"], "h2"):
            poller = store._coord._lock_poller
            assert poller is not None and not poller.done()
        assert store._coord._lock_poller is None and not store._coord._lock_watches


async def test_a_commit_elsewhere_wakes_only_the_waiter_it_makes_next(tmp_path: Path) -> None:
    one, two = SQLiteStore(str(tmp_path / "shoal.db")), SQLiteStore(str(tmp_path / "shoal.db"))
    await one.open()
    await two.open()
    try:
        await two.lock_acquire("ns", ["k"], "h1", 10.0, 0.0)
        async with one.lock_watch("ns", ["k"], "h2") as watch, \
                one.lock_watch("ns", ["k"], "h3") as behind:
            assert isinstance(await one.lock_acquire("ns", ["k"], "h2", 10.0, 0.0), LockWait)
            assert isinstance(await one.lock_acquire("ns", ["k"], "h3", 10.0, 0.0), LockWait)
            waiting = asyncio.ensure_future(watch.wait())
            later = asyncio.ensure_future(behind.wait())
            await two.meter("ns", ["m"], [1.0], 0.0)              # another table
            await two.lock_acquire("ns", ["other"], "h4", 10.0, 0.0)  # another key
            await two.lock_acquire("ns", ["k"], "h5", 10.0, 0.0)   # another waiter behind
            await asyncio.sleep(0.1)
            assert not waiting.done() and not later.done()
            await two.lock_release("ns", ["k"], "h1")
            await asyncio.wait_for(waiting, 3.0)
            await asyncio.sleep(0.1)
            assert not later.done(), "h3 is not next: h2 is"
            assert isinstance(await one.lock_acquire("ns", ["k"], "h2", 10.0, 0.0), LockGrant)
            await asyncio.sleep(0.1)
            assert not later.done(), "h3 is next, but h2 holds the lock"
            await two.lock_release("ns", ["k"], "h2")
            await asyncio.wait_for(later, 3.0)
            later.result()
    finally:
        await one.close()
        await two.close()


async def test_closing_the_store_wakes_its_watches(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "shoal.db"))
    await store.open()
    async with store.lock_watch("ns", ["k"], "h1") as watch:
        waiting = asyncio.ensure_future(watch.wait())
        await asyncio.sleep(0.02)
        assert not waiting.done()
        await store.close()
        await asyncio.wait_for(waiting, 3.0)
