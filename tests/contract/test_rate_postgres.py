"""The rate-limit contract on PostgreSQL: two stores, each with its own pool, on a schema of their
own dropped after each test (test_postgres.py's fixture, server, skip and CI failure); the migration
that brings a schema at version 6 up to the rate-limit tables; random calls that must get the
memory reference's answers; and concurrent callers on several keys at once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg import sql

# pytest puts this directory on sys.path (rootdir-relative "prepend" imports, no __init__.py)
from sql_support import RATE_TABLES, check_the_ledger_filters, random_calls, use_the_rate_tables
from test_postgres import URL, _open, schema  # noqa: F401 (a fixture)

from shoal.coord.base import RateStore, SlotBusy, SlotGrant, SpendEntry
from shoal.stores._sqlfiles import migrations
from shoal.stores.memory import MemoryStore
from shoal.stores.postgres import PostgresStore
from shoal.testing.rate_contract import RateContract


class TestPostgresRateLimits(RateContract):
    @pytest.fixture
    async def rates(self, schema: str) -> AsyncIterator[PostgresStore]:  # noqa: F811
        s = await _open(schema)
        yield s
        await s.close()

    @pytest.fixture
    async def other(self, rates: PostgresStore) -> AsyncIterator[PostgresStore]:
        """A second store with a pool of its own, same schema."""
        s = await _open(rates.schema)
        yield s
        await s.close()


def test_the_postgres_store_is_a_rate_store() -> None:
    assert isinstance(PostgresStore("postgresql://localhost/x"), RateStore)


async def test_a_schema_at_version_6_gets_the_rate_tables(schema: str) -> None:  # noqa: F811
    with psycopg.connect(URL, autocommit=True) as conn:   # the schema as shoal left it at 6
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.execute("CREATE TABLE shoal_migrations (version integer PRIMARY KEY, "
                     "name text NOT NULL, applied_at double precision NOT NULL)")
        old = [m for m in migrations("postgres") if m[0] <= 6]
        assert [number for number, _, _ in old] == [1, 2, 3, 4, 5, 6]
        for number, name, text in old:
            conn.execute(text.encode())
            conn.execute("INSERT INTO shoal_migrations VALUES (%s, %s, 0)", (number, name))
        conn.execute("INSERT INTO meters VALUES ('ns', 'k', 5, 0)")

    store = await _open(schema)
    try:
        newest = max(number for number, _, _ in migrations("postgres"))
        assert newest >= 7
        assert await store.migrate() == newest
        rows = await store._all("SELECT table_name FROM information_schema.tables "
                                "WHERE table_schema = %(schema)s", {"schema": schema})
        assert {r["table_name"] for r in rows} >= RATE_TABLES
        assert await store.meter("ns", ["k"], [0.0], 0.0) == [5.0], "version 6's rows stay"
        entry = await use_the_rate_tables(store)
        assert await store.ledger("ns", root_id="r") == [entry]
    finally:
        await store.close()


async def test_a_window_keeps_only_its_entries(schema: str) -> None:  # noqa: F811
    store = await _open(schema)
    try:
        for i in range(30):
            await store.window_add("ns", "w", 1, 10.0, None, float(i))
            await store.window_add("ns", "other", 1, 10.0, None, 0.0)
        rows = await store._all("SELECT key, count(*) AS n FROM rate_window_entries "
                                "GROUP BY key", {})
        assert {r["key"]: r["n"] for r in rows} == {"w": 10, "other": 30}
    finally:
        await store.close()


async def test_the_ledger_filters_by_tenant_and_root_together(schema: str) -> None:  # noqa: F811
    store = await _open(schema)
    try:
        await check_the_ledger_filters(store)
    finally:
        await store.close()


async def test_concurrent_spends_on_overlapping_keys(schema: str) -> None:  # noqa: F811
    """Spends naming shared counters in different orders (and twice) from two pools: never a
    limit passed, never a deadlock, and the ledger has exactly the spends that were added."""
    a, b = await _open(schema), await _open(schema)
    try:
        rnd = random.Random(7)
        calls = []
        for i in range(60):
            keys = rnd.sample(["x", "y", "z", "w"], rnd.randint(1, 4))
            if rnd.random() < 0.3:
                keys.append(keys[0])
            calls.append((a if i % 2 else b).counter_add(
                "ns", keys, [1.0] * len(keys), [20.0] * len(keys), 0.0,
                SpendEntry("t", f"r{i}", None, 1.0, "usd", 0.0)))
        got = await asyncio.gather(*calls)
        totals = (await a.counter_add("ns", ["x", "y", "z", "w"], [0] * 4, [None] * 4,
                                      0.0)).totals
        assert all(t <= 20 for t in totals)
        added = sum(g.added for g in got)
        assert len(await a.ledger("ns")) == added
        assert sum(totals) == sum(len(g.totals) for g in got if g.added)
    finally:
        await a.close()
        await b.close()


async def test_concurrent_slot_takers_on_an_expired_slot(schema: str) -> None:  # noqa: F811
    """The slots that ended are taken again by exactly as many callers as there are slots."""
    a, b = await _open(schema), await _open(schema)
    try:
        for h in ("old1", "old2"):
            assert isinstance(await a.slot_acquire("ns", "k", h, 2, 10.0, 0.0), SlotGrant)
        got = await asyncio.gather(*(
            (a if i % 2 else b).slot_acquire("ns", "k", f"h{i}", 2, 10.0, 10.0)
            for i in range(16)))
        assert sum(isinstance(g, SlotGrant) for g in got) == 2
        assert all(g == SlotBusy(20.0) for g in got if isinstance(g, SlotBusy))
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize("seed", range(4))
async def test_the_same_answers_as_the_memory_reference(
    schema: str, seed: int  # noqa: F811
) -> None:
    store = await _open(schema)
    try:
        await random_calls(random.Random(seed), MemoryStore(), store)
    finally:
        await store.close()
