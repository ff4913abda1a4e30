"""The SQLite store's shared transactions, beyond the contract suite: checkpoints of several runs
written in one transaction (each fenced on its own, a step's outbox entries still once), a write
whose statements fail failing alone, a cancelled caller's write still made,
``settle_and_claim`` as one transaction that another connection sees all or nothing of, and a
claim that reads its candidates once unless another writer came between its read and its
transaction."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sql_support import sqlite_store

from shoal.backends.sqlite import SQLiteStore
from shoal.errors import StoreUnavailableError
from shoal.testing.contract import LEASE, NS, T0, add, claim, entries, fence
from shoal.types import Fence, RunStatus, Settlement, Step


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    async with sqlite_store(tmp_path / "shoal.db") as s:
        yield s


@pytest.fixture
def reader(store: SQLiteStore) -> Iterator[sqlite3.Connection]:
    """Another connection to the file: it sees what has been committed, and nothing else."""
    conn = sqlite3.connect(store.path)
    yield conn
    conn.close()


@contextmanager
def statements(store: SQLiteStore) -> Iterator[list[str]]:
    """The statements the store's connection runs meanwhile, as SQLite traces them."""
    seen: list[str] = []
    store._db.set_trace_callback(seen.append)
    try:
        yield seen
    finally:
        store._db.set_trace_callback(None)


def transactions(seen: list[str]) -> int:
    return sum(s == "BEGIN IMMEDIATE" for s in seen)


def states(reader: sqlite3.Connection, *run_ids: str) -> list[tuple[str, str | None]]:
    return [reader.execute("SELECT status, owner FROM runs WHERE id = ?", (i,)).fetchone()
            for i in run_ids]


async def test_checkpoints_of_many_runs_at_once_share_one_transaction_each_fenced(
    store: SQLiteStore
) -> None:
    for i in range(20):
        await add(store, T0 + i * 0.001)
    claimed = await claim(store, owner="a", limit=20, now=T0 + 1)
    first = claimed[0]
    assert await store.checkpoint_step(fence(first), Step(1, "one", "kept", True, 0), LEASE, T0)
    with statements(store) as seen:
        got = await asyncio.gather(
            *(store.checkpoint_step(fence(c), Step(1, "one", c.id, True, 0), LEASE, T0 + 2)
              for c in claimed),
            *(store.checkpoint_step(Fence(c.id, "a", c.lease_epoch + 1),
                                    Step(2, "two", "stale", True, 0), LEASE, T0 + 2)
              for c in claimed[:4]))
    assert got == [True] * 20 + [False] * 4
    assert transactions(seen) == 1
    for c in claimed:
        steps = await store.load_steps(c.id)
        # a finished step is never replaced; a stale fence wrote nothing
        assert [(s.seq, s.output) for s in steps] == [(1, "kept" if c is first else c.id)]
        assert (await store.get_run(c.id)).lease_expires_at == T0 + 2 + LEASE  # type: ignore[union-attr]


async def test_a_step_and_its_outbox_entries_exist_once_when_checkpointed_twice_in_a_batch(
    store: SQLiteStore, reader: sqlite3.Connection
) -> None:
    await add(store, T0)
    await add(store, T0 + 0.001)
    a, b = await claim(store, now=T0 + 1, limit=2)
    with statements(store) as seen:
        got = await asyncio.gather(
            store.checkpoint_step(fence(a), Step(1, "s", 1, True, 0), LEASE, T0,
                                  entries(a, 1, "email", "sms")),
            # the same step again in the same transaction (a replay racing the first write)
            store.checkpoint_step(fence(a), Step(1, "s", 2, True, 0), LEASE, T0,
                                  entries(a, 1, "email", "sms", now=T0 + 1)),
            store.checkpoint_step(fence(b), Step(1, "s", 3, True, 0), LEASE, T0,
                                  entries(b, 1, "email")))
    assert got == [True, True, True] and transactions(seen) == 1
    rows = reader.execute("SELECT run_id, seq, idx, topic FROM outbox "
                          "ORDER BY run_id, seq, idx").fetchall()
    assert rows == [(a.id, 1, 0, "email"), (a.id, 1, 1, "sms"), (b.id, 1, 0, "email")]
    assert [s.output for s in await store.load_steps(a.id)] == [1]


async def test_a_checkpoint_whose_statements_fail_fails_alone(store: SQLiteStore) -> None:
    for i in range(3):
        await add(store, T0 + i * 0.001)
    small, big, other = await claim(store, now=T0 + 1, limit=3)
    # a nearly full disk: room for small rows, not for a step of 200 kB
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages + 8}")
    got = await asyncio.gather(
        store.checkpoint_step(fence(small), Step(1, "s", "small", True, 0), LEASE, T0 + 5),
        store.checkpoint_step(fence(big), Step(1, "s", "x" * 200_000, True, 0), LEASE, T0 + 5),
        store.checkpoint_step(fence(other), Step(1, "s", "other", True, 0), LEASE, T0 + 5),
        return_exceptions=True)
    assert got[0] is True and got[2] is True
    assert isinstance(got[1], StoreUnavailableError) and "SQLITE_FULL" in str(got[1])
    assert [s.output for s in await store.load_steps(small.id)] == ["small"]
    assert [s.output for s in await store.load_steps(other.id)] == ["other"]
    assert await store.load_steps(big.id) == []
    assert (await store.get_run(big.id)).lease_expires_at == big.lease_expires_at  # type: ignore[union-attr]


async def test_a_cancelled_caller_still_gets_its_checkpoint_written(store: SQLiteStore) -> None:
    await add(store, T0)
    [a] = await claim(store)
    task = asyncio.create_task(store.checkpoint_step(fence(a), Step(1, "s", 1, True, 0), LEASE,
                                                     T0 + 1))
    await asyncio.sleep(0)   # queued, not written yet
    assert await store.load_steps(a.id) == []
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await store.close()   # writes already asked for are still made
    await store.open()
    assert [s.output for s in await store.load_steps(a.id)] == [1]


async def _settle_and_claim_scene(store: SQLiteStore) -> dict[str, Any]:
    """A key holder and a plain run claimed by ``a``; a run waiting for the holder's key, and
    three later runs, queued."""
    holder = await add(store, T0, key="k")
    waiter = await add(store, T0 + 1, key="k")
    plain = await add(store, T0 + 2)
    later = [await add(store, T0 + 3 + i) for i in range(3)]
    held, plain_c = await claim(store, now=T0 + 5, limit=2)
    assert (held.id, plain_c.id) == (holder.id, plain.id)
    return {"held": held, "plain": plain_c, "waiter": waiter, "later": later,
            "settlements": [(fence(held), Settlement("succeeded", output=[1]), T0 + 6),
                            (Fence(plain.id, "a", plain_c.lease_epoch + 1),
                             Settlement("succeeded", output=[2]), T0 + 6)]}


async def test_settle_and_claim_is_one_transaction_seen_all_or_nothing(
    store: SQLiteStore, reader: sqlite3.Connection
) -> None:
    scene = await _settle_and_claim_scene(store)
    held, plain, waiter, later = scene["held"], scene["plain"], scene["waiter"], scene["later"]
    mid: list[list[tuple[str, str | None]]] = []

    def look(statement: str) -> None:
        seen.append(statement)
        if "SET status = 'running'" in statement:   # the claim, after the settlements
            mid.append(states(reader, held.id, plain.id, waiter.id))

    seen: list[str] = []
    store._db.set_trace_callback(look)
    try:
        answers, runs = await store.settle_and_claim(scene["settlements"], NS, ["wf"], "b", 2,
                                                     LEASE, T0 + 7)
    finally:
        store._db.set_trace_callback(None)
    # each settlement fenced on its own (the stale one refused, the other written); the claim
    # in the same transaction sees the key the settlement freed, and respects it: the waiter
    # is the key's one holder now
    assert answers == [True, False]
    assert [r.id for r in runs] == [waiter.id, later[0].id]
    assert all(r.status == RunStatus.RUNNING and r.owner == "b"
               and r.lease_expires_at == T0 + 7 + LEASE for r in runs)
    assert transactions(seen) == 1
    # while the claim ran, another connection saw none of the transaction's writes ...
    assert mid and all(m == [("running", "a"), ("running", "a"), ("queued", None)] for m in mid)
    # ... and after the commit all of them
    assert states(reader, held.id, plain.id, waiter.id) == [
        ("succeeded", None), ("running", "a"), ("running", "b")]
    assert [r.id for r in await claim(store, "c", now=T0 + 8)] == [later[1].id, later[2].id]


async def test_a_failure_between_the_settlements_and_the_claim_leaves_neither(
    store: SQLiteStore, reader: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    scene = await _settle_and_claim_scene(store)
    held, waiter = scene["held"], scene["waiter"]
    before = reader.execute("SELECT * FROM runs ORDER BY id").fetchall()

    def crash(*args: Any) -> Any:
        raise RuntimeError("the process died here")

    with monkeypatch.context() as m:
        m.setattr(store._runs, "_claim", crash)
        with pytest.raises(RuntimeError, match="died"):
            await store.settle_and_claim(scene["settlements"], NS, ["wf"], "b", 2, LEASE,
                                         T0 + 7)
    # the settlement written before the claim failed is gone with it: the file is as before
    assert reader.execute("SELECT * FROM runs ORDER BY id").fetchall() == before
    assert not store._db.in_transaction
    answers, runs = await store.settle_and_claim(scene["settlements"], NS, ["wf"], "b", 2,
                                                 LEASE, T0 + 7)
    assert answers == [True, False] and runs[0].id == waiter.id
    assert states(reader, held.id)[0] == ("succeeded", None)


def candidate_reads(seen: list[str]) -> int:
    return sum(s.startswith("-- Due runs in claim order") for s in seen)


async def test_a_claim_reads_its_candidates_once_when_nothing_changed_meanwhile(
    store: SQLiteStore
) -> None:
    runs = [await add(store, T0) for _ in range(3)]
    with statements(store) as seen:
        claimed = await claim(store, limit=2)
    assert [r.id for r in claimed] == [r.id for r in runs[:2]]
    # the plain read (no write lock for an idle poll) and nothing read again in the transaction
    assert candidate_reads(seen) == 1 and transactions(seen) == 1


async def test_a_claim_reads_its_candidates_again_when_another_writer_came_first(
    store: SQLiteStore, reader: sqlite3.Connection
) -> None:
    first, second = await add(store, T0), await add(store, T0 + 0.5)
    reader.execute("BEGIN IMMEDIATE")   # another process holds the write lock
    seen: list[str] = []
    read = asyncio.Event()

    def look(statement: str) -> None:
        seen.append(statement)
        if candidate_reads(seen):
            read.set()

    store._db.set_trace_callback(look)
    try:
        task = asyncio.create_task(claim(store, limit=1, now=T0 + 1))
        await read.wait()   # its plain read is made, and it waits for the write lock
        # the other process cancels the run that read found first, and lets go of the lock
        reader.execute("UPDATE runs SET status = 'cancelled' WHERE id = ?", (first.id,))
        reader.execute("COMMIT")
        claimed = await task
    finally:
        store._db.set_trace_callback(None)
    assert [r.id for r in claimed] == [second.id]
    assert candidate_reads(seen) == 2
    assert states(reader, first.id, second.id) == [("cancelled", None), ("running", "a")]
