"""On PostgreSQL the engine's claims and settlements keep one connection between them: one server
process serves them all, its caches warm (the pool hands its connections out in rotation, which
cost a busy worker a sixth of its throughput).
Keeping it never makes another operation wait, a broken one is given up, and closing the store
gives it back.

The server is ``SHOAL_TEST_POSTGRES`` (see ``test_postgres.py``); each test has a schema of its own.
"""

from __future__ import annotations

import asyncio
import time

import psycopg
from test_postgres import URL, _url

from shoal.backends.postgres import PostgresStore
from shoal.errors import StoreUnavailableError
from shoal.testing.contract import NS, T0, add, claim, fence
from shoal.types import Settlement


def _backends(schema: str) -> list[tuple[int, str]]:
    """The store's server processes (pid, last statement), the latest statement first."""
    with psycopg.connect(URL, autocommit=True) as conn:
        return [(pid, query) for pid, query in conn.execute(
            "SELECT pid, query FROM pg_stat_activity WHERE application_name = %s "
            "ORDER BY query_start DESC NULLS LAST", (f"shoal {schema}",)).fetchall()]


def _last_claim(schema: str) -> int:
    """The server process that ran the store's latest claim (alone or with settlements: the
    start of either statement, as pg_stat_activity keeps only a statement's first kilobyte)."""
    return next(pid for pid, query in _backends(schema)
                if query.startswith(("-- One statement: lock due runs", "WITH s AS (")))


async def test_claims_and_settlements_keep_one_server_process(schema: str) -> None:
    store = PostgresStore.from_url(_url(schema, pool_min_size="3", pool_max_size="3"))
    await store.open()
    try:
        for i in range(40):
            await add(store, T0 + i / 100)
        hot: list[int] = []
        others: set[int] = set()
        [run] = await claim(store, now=T0 + 1, limit=1)
        hot.append(_last_claim(schema))
        for n in range(12):
            # other operations in between take the pool's other connections in turn
            assert (await store.get_run(run.id)) is not None
            others.add(_backends(schema)[0][0])
            held, [run] = await store.settle_and_claim(
                [(fence(run), Settlement("succeeded"), T0 + 2 + n)], NS, ["wf"], "a", 1, 30.0,
                T0 + 2 + n)
            assert held == [True]
            hot.append(_last_claim(schema))
        assert len(set(hot)) == 1, hot
        assert len(others) >= 2 and hot[0] not in others, (hot[0], others)
    finally:
        await store.close()


async def test_a_kept_connection_never_keeps_another_operation_waiting(schema: str) -> None:
    """With a pool of one connection, the one the claims keep is given back as soon as anything
    else wants it (a wait would last pool_timeout, 5 s here, and then fail)."""
    store = PostgresStore.from_url(_url(schema, pool_min_size="1", pool_max_size="1",
                                        pool_timeout="5"))
    await store.open()
    try:
        for i in range(3):
            await add(store, T0 + i)
        [run] = await claim(store, now=T0 + 5, limit=1)
        started = time.monotonic()
        assert (await store.get_run(run.id)) is not None
        renewal = await store.renew_leases("a", {run.id: run.lease_epoch}, 30.0, T0 + 6)
        assert renewal.renewed == {run.id}
        got = await asyncio.gather(*(store.get_run(run.id) for _ in range(50)),
                                   claim(store, now=T0 + 7, limit=1),
                                   *(store.get_run(run.id) for _ in range(50)))
        assert all(r is not None for r in got)
        assert time.monotonic() - started < 2.0
    finally:
        await store.close()


async def test_a_broken_kept_connection_is_given_up(schema: str) -> None:
    store = PostgresStore.from_url(_url(schema, pool_min_size="2", pool_max_size="2"))
    await store.open()
    try:
        for i in range(5):
            await add(store, T0 + i)
        await claim(store, now=T0 + 5, limit=1)
        killed = _last_claim(schema)
        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (killed,))
        claimed = []
        for _ in range(3):   # the first may find the connection dead; the store recovers
            try:
                claimed = await claim(store, now=T0 + 6, limit=1)
                break
            except StoreUnavailableError:
                continue
        assert len(claimed) == 1
        assert _last_claim(schema) != killed
        assert len(await claim(store, now=T0 + 7, limit=1)) == 1
    finally:
        await store.close()


async def test_closing_the_store_gives_the_kept_connection_back(schema: str) -> None:
    store = PostgresStore.from_url(_url(schema, pool_min_size="2", pool_max_size="2"))
    await store.open()
    await add(store, T0)
    await claim(store, now=T0 + 1, limit=1)
    assert _backends(schema)
    await store.close()
    for _ in range(100):   # the server ends a closed connection's process soon after
        if not _backends(schema):
            break
        await asyncio.sleep(0.05)
    assert _backends(schema) == []
