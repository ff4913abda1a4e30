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
                if query.startswith(("WITH queued AS(", "WITH s AS(", "WITH s AS (")))


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
        assert time.monotonic() - started < 4.0   # no wait for the 5 s pool_timeout
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
        # the claims keep a live connection again: the next ones share its server process
        after = []
        for n in range(3):
            assert len(await claim(store, now=T0 + 7 + n, limit=1)) == 1
            after.append(_last_claim(schema))
        assert len(set(after)) == 1 and killed not in after, (killed, after)
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


async def test_closing_while_hot_statements_wait_leaves_no_connection_behind(schema: str) -> None:
    """Two settlements wait for row locks another session holds, one on the kept connection and
    one on a connection of its own, while the store closes: when the locks go, neither
    connection is kept by the closed store."""
    store = PostgresStore.from_url(_url(schema, pool_min_size="2", pool_max_size="3"))
    await store.open()
    first, second = [await add(store, T0 + i) for i in range(2)]
    runs = {r.id: r for r in await claim(store, now=T0 + 5, limit=2)}
    with psycopg.connect(URL, autocommit=True) as locker:
        locker.execute("BEGIN")
        locker.execute(f'SELECT 1 FROM "{schema}".runs WHERE id = ANY(%s) FOR UPDATE',
                       ([first.id, second.id],))
        settles = [asyncio.ensure_future(store.settle_and_claim(
            [(fence(runs[r.id]), Settlement("succeeded"), T0 + 6)], NS, ["wf"], "a", 0, 30.0,
            T0 + 6)) for r in (first, second)]
        await asyncio.sleep(0.3)   # both statements are waiting for the locks
        assert not any(s.done() for s in settles)
        closing = asyncio.ensure_future(store.close())
        await asyncio.sleep(0.3)
        locker.execute("COMMIT")
    await asyncio.gather(*settles, return_exceptions=True)
    await closing
    for _ in range(100):
        if not _backends(schema):
            break
        await asyncio.sleep(0.05)
    assert _backends(schema) == []
