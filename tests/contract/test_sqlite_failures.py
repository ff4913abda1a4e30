"""A SQLite file that cannot be written: a full disk (``PRAGMA max_page_count`` at the file's size
gives SQLITE_FULL, what a full disk gives) and a read-only file (``PRAGMA query_only``, since the
tests may run as root, which ignores file permissions: SQLITE_READONLY either way). Every store
call then raises ``StoreUnavailableError`` naming the cause, never ``sqlite3.OperationalError``;
a failed transaction leaves nothing of itself; once the disk has room again the store works on."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import shoal
from shoal.backends.sqlite import SQLiteStore
from shoal.errors import StoreUnavailableError
from shoal.testing.contract import LEASE, NS, T0, add, claim, entries, fence, new_run
from shoal.types import GraphCheckpoint, Pause, Step

BIG = {"text": "x" * 200_000}   # more than the pages a full file has left


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(str(tmp_path / "shoal.db"))
    await s.open()
    yield s
    await s.close()


def _count(store: SQLiteStore, table: str) -> int:
    n: int = store._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    return n


def _fill_the_disk(store: SQLiteStore) -> None:
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")


def _calls(store: SQLiteStore) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Writes of every kind: runs, workflows, locks, membership, meters, rate limits."""
    return {
        "create_run": lambda: store.create_run(new_run(T0, input=BIG), max_queued=None,
                                               admission="reject"),
        "register_workflows": lambda: store.register_workflows(NS, {"wf": BIG}, T0),
        "lock_acquire": lambda: store.lock_acquire(NS, ["k" * 100_000], "h", LEASE, T0),
        "heartbeat": lambda: store.heartbeat(NS, "m" * 100_000, None, T0, LEASE, 0.0),
        "meter": lambda: store.meter(NS, ["k" * 100_000], [1.0], T0),
        "slot_acquire": lambda: store.slot_acquire(NS, "k" * 100_000, "h", 1, LEASE, T0),
    }


def _unavailable(e: pytest.ExceptionInfo[StoreUnavailableError], *fragments: str) -> None:
    assert isinstance(e.value.__cause__, sqlite3.OperationalError), "the cause is kept"
    for fragment in fragments:
        assert fragment in str(e.value), str(e.value)


async def test_a_full_disk_is_store_unavailable_and_nothing_is_half_written(
    store: SQLiteStore
) -> None:
    run = await add(store, T0)
    [claimed] = await claim(store)
    _fill_the_disk(store)
    for name, call in _calls(store).items():
        with pytest.raises(StoreUnavailableError) as e:
            await call()
        _unavailable(e, "full", "SQLITE_FULL", "nothing of this call was written")
        assert not store._db.in_transaction, name
    # a checkpoint writes outbox entries, then the step: the step does not fit, so neither is
    # written, and the run's lease is not extended either
    step = Step(0, "s", BIG, True, claimed.lease_epoch)
    with pytest.raises(StoreUnavailableError):
        await store.checkpoint_step(fence(claimed), step, LEASE, T0 + 5,
                                    entries(claimed, 0, "t1", "t2"))
    assert _count(store, "outbox") == 0 and await store.load_steps(run.id) == []
    assert (await store.get_run(run.id)).lease_expires_at == claimed.lease_expires_at  # type: ignore[union-attr]
    assert [r.id for r in await store.list_runs(NS)] == [run.id]
    # room again: the same calls succeed on the same connection
    store._db.execute("PRAGMA max_page_count = 1073741823")
    assert await store.checkpoint_step(fence(claimed), step, LEASE, T0 + 5,
                                       entries(claimed, 0, "t1", "t2"))
    assert _count(store, "outbox") == 2
    for call in _calls(store).values():
        await call()


async def test_a_read_only_file_is_store_unavailable_for_writes_and_serves_reads(
    store: SQLiteStore
) -> None:
    run = await add(store, T0)
    store._db.execute("PRAGMA query_only = ON")
    for call in [*_calls(store).values(), lambda: claim(store),
                 lambda: store.cancel_run(run.id, T0),
                 lambda: store.send_signal(run.id, "go", 1, "sig-1", T0)]:
        with pytest.raises(StoreUnavailableError) as e:
            await call()
        _unavailable(e, "readonly", "SQLITE_READONLY", "permissions")
    assert (await store.get_run(run.id)).status == shoal.RunStatus.QUEUED  # type: ignore[union-attr]
    assert [r.id for r in await store.list_runs(NS)] == [run.id]


async def test_the_app_reports_a_full_disk_as_store_unavailable(store: SQLiteStore) -> None:
    app = shoal.App("full", store=store)

    @app.workflow
    async def echo(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    async with app.open():
        _fill_the_disk(store)
        with pytest.raises(StoreUnavailableError, match="full"):
            await app.dispatch(echo, BIG)
        store._db.execute("PRAGMA max_page_count = 1073741823")
        await app.dispatch(echo, BIG)


async def test_a_full_disk_is_store_unavailable_for_steps_pauses_outbox_and_graphs(
    store: SQLiteStore
) -> None:
    """The store's concerns beyond runs, coordination and rates (each a part of its own) turn
    a failed statement into StoreUnavailableError alike, and leave no transaction open."""
    run = await add(store, T0)
    [claimed] = await claim(store)
    [entry] = entries(claimed, 0, "t1")
    assert await store.checkpoint_step(fence(claimed), Step(0, "s", 1, True, claimed.lease_epoch),
                                       LEASE, T0, [entry])
    pause = Pause("p1", NS, claimed.tenant, run.id, "ok", BIG, "pending", None, T0, None, None,
                  False)
    graph = GraphCheckpoint("t", "", "c1", None, "json", b"x" * 200_000, {}, None, T0)
    _fill_the_disk(store)
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "steps": lambda: store.save_tree_key(run.id, "k", BIG, "c", T0),
        "pauses": lambda: store.create_pause(fence(claimed), Step(1, "ok", None, False,
                                                                  claimed.lease_epoch),
                                             pause, T0),
        "outbox": lambda: store.finish_delivery(entry.id, T0, "x" * 200_000, T0 + 1),
        "graph checkpoints": lambda: store.put_graph_checkpoint(NS, "t", graph, None),
    }
    for name, call in calls.items():
        with pytest.raises(StoreUnavailableError) as e:
            await call()
        _unavailable(e, "full", "SQLITE_FULL")
        assert not store._db.in_transaction, name
