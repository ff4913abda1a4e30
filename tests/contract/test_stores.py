"""The store contract suites on the memory and SQLite stores (and random calls that must get the
memory reference's answers on SQLite), plus the migrations that bring an older SQLite file up."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sql_support import sqlite_file_at, sqlite_store

from shoal.backends.memory import MemoryStore
from shoal.backends.sqlite import SQLiteStore
from shoal.ports import Store
from shoal.testing.contract import RunDifferential, StoreContract
from shoal.types import Fence, Progress, Settlement


class TestMemoryStore(StoreContract):
    @pytest.fixture
    async def store(self) -> AsyncIterator[Store]:
        s = MemoryStore()
        await s.open()
        yield s
        await s.close()

    @pytest.fixture
    async def other(self, store: Store) -> Store:
        return store


class TestSQLiteStore(StoreContract, RunDifferential):
    differential_seeds = tuple(range(8))

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        s = SQLiteStore(str(tmp_path / "shoal.db"))
        await s.open()
        yield s
        await s.close()

    @pytest.fixture
    async def other(self, store: SQLiteStore) -> AsyncIterator[Store]:
        s = SQLiteStore(store.path)
        await s.open()
        yield s
        await s.close()


# A file at schema version 8: two roots of their own tenants with keys, and a key whose root run
# is gone (shared with test_postgres.py's migration test: the same rows on both).
TREE_ROWS_AT_8 = (
    "INSERT INTO runs (id, namespace, tenant, workflow, input, status, created_at, max_attempts, "
    "root_id) VALUES ('r1', 'ns', 'acme', 'wf', '{}', 'running', 0, 3, 'r1'), "
    "('r2', 'ns', 'beta', 'wf', '{}', 'queued', 0, 3, 'r2')",
    "INSERT INTO tree_keys (root_id, key, value, claimant, created_at) VALUES "
    "('r1', 'b', '2', 's2', 0), ('r1', 'a', '1', 's1', 0), ('r2', 'a', '3', 's3', 0), "
    "('gone', 'a', '4', 's4', 0)",
)


async def check_the_tree_tenants_after_9(store: Store) -> None:
    """The keys of TREE_ROWS_AT_8 after migration 9: their root's tenant, 'default' without a
    root; they keep their values and claimants, and a new key gets its root's tenant."""
    assert await store.tree_keys("r1") == [("a", "acme"), ("b", "acme")]
    assert await store.tree_keys("r2") == [("a", "beta")]
    assert await store.tree_keys("gone") == [("a", "default")]
    assert await store.get_tree_key("r1", "a") == 1
    assert await store.save_tree_key("r1", "a", 9, "s1", 1.0)          # its claimant's again
    assert not await store.save_tree_key("r2", "a", 9, "other", 1.0)
    assert await store.save_tree_key("r2", "c", 5, "s5", 1.0)
    assert await store.tree_keys("r2") == [("a", "beta"), ("c", "beta")]


async def test_a_store_at_version_8_gets_the_tree_tenants(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    applied = sqlite_file_at(path, 8, *TREE_ROWS_AT_8)   # the file as shoal left it at 8
    assert applied == [1, 2, 3, 4, 5, 6, 7, 8]

    async with sqlite_store(path) as store:
        assert await store.migrate() >= 9
        await check_the_tree_tenants_after_9(store)


# A file at schema version 11: a failed run, and one running under owner 'a' at epoch 1 (shared
# with test_postgres.py's migration test: the same rows on both).
RUN_ROWS_AT_11 = (
    "INSERT INTO runs (id, namespace, tenant, workflow, input, status, error, created_at, "
    "max_attempts, root_id, owner, lease_expires_at, lease_epoch) VALUES "
    "('r1', 'ns', 'default', 'wf', '{}', 'failed', 'ValueError: old', 0, 3, 'r1', NULL, NULL, 1), "
    "('r2', 'ns', 'default', 'wf', '{}', 'running', NULL, 0, 3, 'r2', 'a', 100, 1)",
)


async def check_the_tracebacks_after_13(store: Store) -> None:
    """The runs of RUN_ROWS_AT_11 after migration 12: none has a traceback, and the running one
    keeps the traceback its settlement brings."""
    old = await store.get_run("r1")
    assert old is not None and old.error == "ValueError: old" and old.traceback is None
    assert (await store.get_run("r2")).traceback is None  # type: ignore[union-attr]
    assert await store.settle_run(Fence("r2", "a", 1), Settlement(
        "failed", error="KeyError: 'k'", traceback="Traceback ...\nKeyError: 'k'\n"), 1.0)
    assert (await store.get_run("r2")).traceback == "Traceback ...\nKeyError: 'k'\n"  # type: ignore[union-attr]


async def test_a_store_at_version_11_gets_run_tracebacks(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    applied = sqlite_file_at(path, 11, *RUN_ROWS_AT_11)   # the file as shoal left it at 11
    assert applied == list(range(1, 12))

    async with sqlite_store(path) as store:
        assert await store.migrate() >= 13
        await check_the_tracebacks_after_13(store)


# A file at schema version 13: final runs of two namespaces, one queued (shared with
# test_postgres.py's migration test: the same rows on both).
RUN_ROWS_AT_13 = (
    "INSERT INTO runs (id, namespace, tenant, workflow, input, status, created_at, "
    "max_attempts, root_id, run_at, finished_at) VALUES "
    "('r1', 'ns', 'default', 'wf', '{}', 'succeeded', 0, 3, 'r1', 0, 1000.5), "
    "('r2', 'ns', 'default', 'wf', '{}', 'failed', 0, 3, 'r2', 0, 900), "
    "('r3', 'ns', 'acme', 'other', '{}', 'cancelled', 0, 3, 'r3', 0, 1100.2), "
    "('r4', 'ns', 'acme', 'wf', '{}', 'queued', 0, 3, 'r4', 0, NULL), "
    "('r5', 'ns2', 'default', 'wf', '{}', 'succeeded', 0, 3, 'r5', 0, 50)",
)


async def check_the_counts_after_14(store: Store) -> None:
    """The runs of RUN_ROWS_AT_13 after migration 14: counted by stats, those that finished in
    the two minutes before the newest of their namespace by the second; and counted on as they
    are retried and pruned."""
    got = await store.stats("ns", 1059.7)
    assert got.by_status == {**dict.fromkeys(got.by_status, 0), "queued": 1, "succeeded": 1,
                             "failed": 1, "cancelled": 1}
    assert got.by_workflow == {"wf": {"queued": 1, "succeeded": 1, "failed": 1},
                               "other": {"cancelled": 1}}
    assert got.finished_last_minute == {"succeeded": 1, "failed": 0, "cancelled": 1}
    assert (await store.stats("ns2", 60)).finished_last_minute["succeeded"] == 1
    assert await store.prune_runs("ns", 950, 10) == 1                   # r2
    run, retried = await store.retry_run("ns", "r3", None, 1101)
    assert retried and run is not None
    await store.fold_stats("ns", 1101)
    got = await store.stats("ns", 1101)
    assert got.by_status == {**dict.fromkeys(got.by_status, 0), "queued": 2, "succeeded": 1}
    assert got.finished_last_minute == {"succeeded": 0, "failed": 0, "cancelled": 0}


async def test_a_store_at_version_13_gets_its_final_runs_counted(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    applied = sqlite_file_at(path, 13, *RUN_ROWS_AT_13)   # the file as shoal left it at 13
    assert applied == list(range(1, 14))

    async with sqlite_store(path) as store:
        assert await store.migrate() >= 14
        await check_the_counts_after_14(store)


# A file at schema version 18: a run running under owner w-1, epoch 1 (migration 19 adds the
# progress columns of runs).
RUNNING_AT_18 = (
    "INSERT INTO runs (id, namespace, tenant, workflow, input, status, created_at, max_attempts, "
    "root_id, owner, lease_epoch, lease_expires_at, started_at) VALUES ('r1', 'ns', 'acme', "
    "'wf', '{}', 'running', 1, 3, 'r1', 'w-1', 1, 100, 1)",
)


async def test_a_store_at_version_18_gets_the_progress_of_runs(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    assert sqlite_file_at(path, 18, *RUNNING_AT_18) == list(range(1, 19))

    async with sqlite_store(path) as store:
        assert await store.migrate() >= 19
        run = await store.get_run("r1")
        assert run is not None and run.progress is None and run.status == "running"
        value = Progress(0.25, "a quarter", {"rows": 25}, 50.0)
        assert await store.record_progress(Fence("r1", "w-1", 1), value)
        assert not await store.record_progress(Fence("r1", "w-1", 2), Progress(1, None, {}, 51))
        run = await store.get_run("r1")
        assert run is not None and run.progress == value
