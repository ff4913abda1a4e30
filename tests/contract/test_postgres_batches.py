"""``create_runs`` and ``app.dispatch_many`` on PostgreSQL, beyond the contract suite: one NOTIFY
per batch, batches racing on the same idempotency keys from two pools, a batch meeting an insert
of its key still in flight, and a batch started by idle workers at once (the NOTIFY, not a poll).

Each test gets a schema of its own (the ``schema`` fixture of ``conftest.py``)."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from typing import Any

import psycopg
import pytest
from psycopg import sql
from test_postgres import URL, _open, _url

import shoal
from shoal.backends.postgres import PostgresStore
from shoal.testing.contract import NS, T0, new_run


async def _notifications(listener: psycopg.AsyncConnection[Any], store: PostgresStore,
                         mark: str) -> list[str]:
    """The payloads on the store's channel until ``mark``, sent now from the store's own pool
    (after the batch committed, so delivered after the batch's notifications)."""
    await store.db.all("SELECT pg_notify(%(channel)s, %(mark)s)",
                     {"channel": store.channel, "mark": mark}, fetch=False)
    got = []
    async with asyncio.timeout(10):
        async for note in listener.notifies():
            if note.payload == mark:
                return got
            got.append(note.payload)
    raise AssertionError("unreachable")


async def test_a_batch_sends_one_notify(schema: str) -> None:
    s = await _open(schema)
    try:
        async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as listener:
            await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(s.channel)))
            counts = []
            keyed = [new_run(T0, idem=f"k{i}") for i in range(50)]
            await s.create_runs(keyed, max_queued=None, admission="reject")
            counts.append(len(await _notifications(listener, s, "new")))
            # repeats only: nothing inserted, nothing to wake anyone for
            await s.create_runs([new_run(T0 + 1, idem=f"k{i}") for i in range(50)],
                                max_queued=None, admission="reject")
            counts.append(len(await _notifications(listener, s, "repeats")))
            # 10 fit under max_queued, 10 are parked: one NOTIFY for the 10
            runs = await s.create_runs([new_run(T0 + 2) for _ in range(20)], max_queued=60,
                                       admission="park")
            assert sum(run.held for run, _ in runs) == 10
            counts.append(len(await _notifications(listener, s, "some parked")))
            runs = await s.create_runs([new_run(T0 + 3) for _ in range(5)], max_queued=60,
                                       admission="park")
            assert all(run.held for run, _ in runs)
            counts.append(len(await _notifications(listener, s, "all parked")))
            assert counts == [1, 0, 1, 0]
    finally:
        await s.close()


async def test_a_copied_batch_sends_one_notify_at_its_commit(schema: str) -> None:
    # 100 or more runs without idempotency keys are copied in (COPY), then notified
    s = await _open(schema)
    try:
        async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as listener:
            await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(s.channel)))
            counts = []
            await s.create_runs([new_run(T0) for _ in range(150)], max_queued=None,
                                admission="reject")
            counts.append(len(await _notifications(listener, s, "copied")))
            runs = await s.create_runs([new_run(T0 + 1) for _ in range(200)], max_queued=250,
                                       admission="park")
            assert sum(run.held for run, _ in runs) == 100
            counts.append(len(await _notifications(listener, s, "some parked")))
            runs = await s.create_runs([new_run(T0 + 2) for _ in range(100)], max_queued=250,
                                       admission="park")
            assert all(run.held for run, _ in runs)
            counts.append(len(await _notifications(listener, s, "all parked")))
            # refused: rolled back, no run and no wake-up
            taken = dataclasses.replace(new_run(T0 + 3), id=runs[0][0].id)
            with pytest.raises(psycopg.errors.UniqueViolation):
                await s.create_runs([new_run(T0 + 3) for _ in range(120)] + [taken],
                                    max_queued=None, admission="reject")
            counts.append(len(await _notifications(listener, s, "refused")))
            assert counts == [1, 1, 0, 0]
            assert len(await s.list_runs(NS, limit=1000)) == 450
    finally:
        await s.close()


async def test_batches_racing_on_the_same_keys_from_two_pools(schema: str) -> None:
    a, b = await _open(schema), await _open(schema)
    try:
        keys = [f"k{i}" for i in range(300)]

        async def batch(s: PostgresStore, order: list[str], at: float) -> list[tuple[Any, bool]]:
            return await s.create_runs([new_run(at, idem=k, input={"at": at}) for k in order],
                                       max_queued=None, admission="reject")

        got = await asyncio.gather(*(batch(s, keys if i % 2 else keys[::-1], T0 + i)
                                     for i, s in enumerate([a, b] * 3)))
        by_key: dict[str, set[str]] = {}
        for answers in got:
            for run, _ in answers:
                by_key.setdefault(run.idempotency_key, set()).add(run.id)
        assert all(len(ids) == 1 for ids in by_key.values()) and len(by_key) == 300
        assert sum(created for answers in got for _, created in answers) == 300
        assert len(await a.list_runs(NS, limit=1000)) == 300
    finally:
        await a.close()
        await b.close()


async def test_a_batch_meeting_an_insert_of_its_key_in_flight(schema: str) -> None:
    s = await _open(schema)
    try:
        rival_run = new_run(T0, idem="contested")
        async with await psycopg.AsyncConnection.connect(s.conninfo) as rival:
            await rival.execute(
                sql.SQL("INSERT INTO {} (id, namespace, tenant, workflow, input, status, "
                        "created_at, run_at, max_attempts, idempotency_key, root_id) VALUES "
                        "(%(id)s, %(ns)s, 'default', 'wf', '\"rival\"', 'queued', %(t)s, %(t)s, "
                        "3, 'contested', %(id)s)").format(sql.Identifier(schema, "runs")),
                {"id": rival_run.id, "ns": NS, "t": T0})
            batch = [new_run(T0 + 1), new_run(T0 + 1, idem="contested"), new_run(T0 + 1)]
            task = asyncio.create_task(s.create_runs(batch, max_queued=None,
                                                     admission="reject"))
            # the batch's statement now waits for the rival's index entry
            for _ in range(1000):
                if await _lock_waiters(s, schema):
                    break
                await asyncio.sleep(0.01)
            assert await _lock_waiters(s, schema) == 1 and not task.done()
            await rival.commit()
            got = await asyncio.wait_for(task, 10)
        assert [created for _, created in got] == [True, False, True]
        assert got[1][0].id == rival_run.id and got[1][0].input == "rival"
        assert len(await s.list_runs(NS)) == 3
    finally:
        await s.close()


async def _lock_waiters(s: PostgresStore, schema: str) -> int:
    rows = await s.db.all("SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = "
                        "%(name)s AND wait_event_type = 'Lock'", {"name": f"shoal {schema}"})
    return int(rows[0]["n"])


@pytest.mark.parametrize("size", [1, 50, 300])
async def test_idle_workers_start_a_batch_in_milliseconds(schema: str, size: int) -> None:
    # lease 30 s: the workers poll every 10 s, so only the batch's NOTIFY starts the runs soon
    url = _url(schema)
    workers = [shoal.App("many", store=url, instance_id=f"w{i}", lease=30.0,
                         max_concurrent_runs=64) for i in range(2)]
    for app in workers:
        @app.workflow(name="noop")
        async def noop(ctx: shoal.RunContext, input: Any) -> Any:
            return input

    submitter = shoal.App("many", store=url, instance_id="submitter")
    try:
        for app in workers:
            await app.start()
            store = app.store
            assert isinstance(store, PostgresStore)
            await store.wait_for_work(0)                 # its engine listens, or now will
            await asyncio.wait_for(store.notifications.listening.wait(), 5)
        async with submitter.open():
            # not needed for the outcome: it lets the workers' first passes end, so the batch
            # meets idle workers, as it would in production
            await asyncio.sleep(0.2)
            runs = await submitter.dispatch_many("noop", [{"i": i} for i in range(size)])
            for run in runs:
                assert await asyncio.wait_for(submitter.result(run.id), 5) == run.input
            ended = [await submitter.get_run(run.id) for run in runs]
        waits = [r.started_at - r.created_at for r in ended]   # type: ignore[operator]
        print(f"batch of {size}: dispatch -> start p50 {1000 * statistics.median(waits):.1f} "
              f"ms, max {1000 * max(waits):.1f} ms")
        assert max(waits) < 1.0                          # a poll would be 10 s away
    finally:
        for app in workers:
            await app.close()
