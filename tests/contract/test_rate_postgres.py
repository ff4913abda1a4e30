"""The rate-limit contract on PostgreSQL: two stores, each with its own pool, on a schema of their
own dropped after each test (test_postgres.py's fixture, server, skip and CI failure); the
migrations that bring a schema at version 6 up to the rate-limit tables and one at version 7 to
the windows' running totals; a window_add that reads only the entries it needs; random calls that
must get the memory reference's answers; and concurrent callers on several keys at once."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

# pytest puts this directory on sys.path (rootdir-relative "prepend" imports, no __init__.py)
from sql_support import (
    RATE_TABLES,
    check_the_ledger_filters,
    trim_the_exported_ledger,
    use_the_rate_tables,
)
from test_postgres import URL, _open

import shoal
from shoal.backends._sql import migrations
from shoal.backends.postgres import PostgresStore
from shoal.backends.postgres.connections import Q as _Q
from shoal.ports import RateStore
from shoal.testing.contract import RateContract, RateDifferential
from shoal.testing.contract.rates import increasing, unwritten
from shoal.types import SlotBusy, SlotGrant, SpendEntry, WindowResult


class TestPostgresRateLimits(RateContract, RateDifferential):
    differential_seeds = (0, 1, 2, 3)

    @pytest.fixture
    async def rates(self, schema: str) -> AsyncIterator[PostgresStore]:
        s = await _open(schema)
        yield s
        await s.close()

    @pytest.fixture
    async def other(self, rates: PostgresStore) -> AsyncIterator[PostgresStore]:
        """A second store with a pool of its own, same schema."""
        s = await _open(rates.schema)
        yield s
        await s.close()

    # review finding: rate_counter_keys_create makes the circuit's rows (total 0, used now) to
    # lock them before rate_admit knows whether it reaches the circuit; a refused counter_add
    # leaves such rows too (queries.sql says so). They read as counters never counted: only
    # retention's count sees them.
    @pytest.mark.xfail(strict=True, reason="PostgreSQL admit writes the circuit's counter rows "
                       "(at 0) even when a need before it was refused or its pause is in force")
    async def test_admit_writes_no_counter_of_a_circuit_it_never_reached(
        self, rates: RateStore
    ) -> None:
        await super().test_admit_writes_no_counter_of_a_circuit_it_never_reached(rates)


def test_the_postgres_store_is_a_rate_store() -> None:
    assert isinstance(PostgresStore("postgresql://localhost/x"), RateStore)


def _schema_at(name: str, version: int, *statements: str) -> list[int]:
    """Create the schema ``name`` as shoal left it at ``version``: its migrations up to that one
    applied and recorded, then ``statements`` (rows it had). The numbers of the migrations
    applied."""
    old = [m for m in migrations("postgres") if m[0] <= version]
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(name)))
        conn.execute("CREATE TABLE shoal_migrations (version integer PRIMARY KEY, "
                     "name text NOT NULL, applied_at double precision NOT NULL)")
        for number, name, text in old:
            conn.execute(text.encode())
            conn.execute("INSERT INTO shoal_migrations VALUES (%s, %s, 0)", (number, name))
        for statement in statements:
            conn.execute(statement.encode())
    return [number for number, _, _ in old]


async def test_a_schema_at_version_6_gets_the_rate_tables(schema: str) -> None:
    applied = _schema_at(schema, 6,    # the schema as shoal left it at 6
                         "INSERT INTO meters VALUES ('ns', 'k', 5, 0)")
    assert applied == [1, 2, 3, 4, 5, 6]

    store = await _open(schema)
    try:
        newest = max(number for number, _, _ in migrations("postgres"))
        assert newest >= 7
        assert await store.migrate() == newest
        rows = await store.db.all("SELECT table_name FROM information_schema.tables "
                                "WHERE table_schema = %(schema)s", {"schema": schema})
        assert {r["table_name"] for r in rows} >= RATE_TABLES
        assert await store.meter("ns", ["k"], [0.0], 0.0) == [5.0], "version 6's rows stay"
        entry = await use_the_rate_tables(store)
        assert [unwritten(r) for r in await store.ledger("ns", root_id="r")] == [entry]
    finally:
        await store.close()


async def test_a_schema_at_version_7_gets_the_window_totals(schema: str) -> None:
    """Migration 8 fills each window's running total from the entries there (even those that
    have left the window since: the next add subtracts them as they leave), and numbers the
    entries of the same time in some order."""
    rows = [("ns", "w", 0.0, 2.0), ("ns", "w", 10.0, 3.0), ("ns", "w", 10.0, -0.5),
            ("ns", "other", 5.0, 1.25), ("ns2", "w", 1.0, 4.0)]
    applied = _schema_at(schema, 7, *(   # the schema as shoal left it at 7
        "INSERT INTO rate_window_entries (namespace, key, at, amount) "
        f"VALUES ('{ns}', '{key}', {at}, {amount})" for ns, key, at, amount in rows))
    assert applied == [1, 2, 3, 4, 5, 6, 7]

    store = await _open(schema)
    try:
        assert await store.migrate() >= 8
        totals = {(r["namespace"], r["key"]): r["total"] for r in await store.db.all(
            "SELECT namespace, key, total FROM rate_windows", {})}
        assert totals == {("ns", "w"): 4.5, ("ns", "other"): 1.25, ("ns2", "w"): 4.0}
        seqs = await store.db.all("SELECT seq FROM rate_window_entries", {})
        assert len({r["seq"] for r in seqs}) == len(rows)
        assert await store.window_add("ns", "w", 0, 60.0, None, 30.0) == WindowResult(True, 4.5)
        assert await store.window_add("ns", "w", 0, 60.0, None, 65.0) == WindowResult(True, 2.5)
        refused = await store.window_add("ns", "w", 3, 60.0, 5, 65.0)
        assert refused == WindowResult(False, 2.5, 70.0)
        assert await store.window_add("ns", "w", 3, 60.0, 5, 70.0) == WindowResult(True, 3.0)
        assert (await store.window_add("ns", "other", 1, 60.0, 5, 64.0)).total == 2.25
        assert (await store.window_add("ns2", "w", 0, 60.0, None, 61.0)).total == 0
    finally:
        await store.close()


def _scans(plan: dict[str, Any]) -> list[tuple[str, int]]:
    """The (node type, actual rows) of every read of rate_window_entries in an EXPLAIN (ANALYZE,
    FORMAT JSON) plan."""
    found = []
    if plan.get("Relation Name") == "rate_window_entries" and "Scan" in plan["Node Type"]:
        found.append((plan["Node Type"], plan["Actual Rows"]))
    for child in plan.get("Plans", []):
        found.extend(_scans(child))
    return found


async def test_a_window_costs_the_entries_leaving_not_the_window(
    schema: str
) -> None:
    """On a window of 2,000 entries, an add reads through the index only the entries leaving
    (and the newest, to know one is left), and a refused add only the entries it walks."""
    store = await _open(schema)
    try:
        await store.db.all("INSERT INTO rate_window_entries (namespace, key, at, amount) "
                         "SELECT 'ns', 'w', g / 100.0, 1 FROM generate_series(0, 1999) g",
                         {}, fetch=False)
        await store.db.all("INSERT INTO rate_windows VALUES ('ns', 'w', 2000)", {}, fetch=False)
        await store.db.all("ANALYZE rate_window_entries", {}, fetch=False)
        args: dict[str, Any] = {"namespace": "ns", "key": "w", "amount": 6.0, "window": 60.0,
                                "limit": 2000.0, "now": 60.025, "cutoff": 0.025}
        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            scans = {}
            with conn.transaction(force_rollback=True):
                for name in ("rate_window_prune", "rate_window_add"):
                    [[[explained]]] = conn.execute(
                        ("EXPLAIN (ANALYZE, FORMAT JSON) " + _Q[name]).encode(), args
                    ).fetchall()
                    scans[name] = _scans(explained["Plan"])
        assert all("Index" in kind for kind, _ in scans["rate_window_prune"] +
                   scans["rate_window_add"]), scans
        assert sorted(rows for _, rows in scans["rate_window_prune"]) == [1, 3], scans
        # 3 left (0, 0.01, 0.02), 1,997 stay: 6 more fit once the next 3 have left too (the
        # window function may read a row ahead), not one row more
        [(_, walked)] = scans["rate_window_add"]
        assert 3 <= walked <= 4, scans

        got = await store.window_add("ns", "w", 6, 60.0, 2000, 60.025)
        assert got == WindowResult(False, 1997.0, 0.05 + 60.0)
        assert await store.window_add("ns", "w", 0, 60.0, None, 200.0) == WindowResult(True, 0)
        await store.window_add("ns", "w", 1, 60.0, None, 200.0)
        await store.window_clear("ns", "w")
        assert await store.db.all("SELECT * FROM rate_windows", {}) == []
        assert await store.db.all("SELECT * FROM rate_window_entries", {}) == []
    finally:
        await store.close()


async def test_a_window_keeps_only_its_entries(schema: str) -> None:
    store = await _open(schema)
    try:
        for i in range(30):
            await store.window_add("ns", "w", 1, 10.0, None, float(i))
            await store.window_add("ns", "other", 1, 10.0, None, 0.0)
        rows = await store.db.all("SELECT key, count(*) AS n FROM rate_window_entries "
                                "GROUP BY key", {})
        assert {r["key"]: r["n"] for r in rows} == {"w": 10, "other": 30}
    finally:
        await store.close()


async def test_the_ledger_filters_by_tenant_and_root_together(schema: str) -> None:
    store = await _open(schema)
    try:
        await check_the_ledger_filters(store)
    finally:
        await store.close()


async def test_concurrent_spends_on_overlapping_keys(schema: str) -> None:
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


async def test_concurrent_slot_takers_on_an_expired_slot(schema: str) -> None:
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


async def test_a_spend_waits_for_the_one_before_it_to_commit(schema: str) -> None:
    """A spend whose row would take a larger id while an earlier one has not committed waits
    for it (the ledger's advisory lock), so a reader never sees the later row without the
    earlier one, and paging by id skips nothing."""
    store = await _open(schema)
    key = json.dumps(["shoal-rate", schema, "ledger", "ns", ""])
    try:
        with psycopg.connect(URL) as conn:      # a spend in flight: its lock taken, row written
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.execute(_Q["advisory_xact_lock"].encode(), {"key": key})
            conn.execute("INSERT INTO cost_ledger (namespace, tenant, amount, currency, at) "
                         "VALUES ('ns', 'first', 1, 'usd', 0)")
            later = asyncio.create_task(store.counter_add(
                "ns", ["c"], [1], [None], 0.0, SpendEntry("second", None, None, 1, "usd", 0.0)))
            await asyncio.sleep(0.3)
            assert not later.done(), "the later spend waits for the earlier one's commit"
            assert await store.ledger("ns") == []
            conn.commit()
        assert (await asyncio.wait_for(later, 10)).added
        rows = await store.ledger("ns")
        assert [r.tenant for r in rows] == ["first", "second"] and increasing(rows)
        # a spend in another namespace never waits for this one's ledger
        with psycopg.connect(URL) as conn:
            conn.execute(_Q["advisory_xact_lock"].encode(), {"key": key})
            other = await asyncio.wait_for(store.counter_add(
                "elsewhere", [], [], [], 0.0, SpendEntry("t", None, None, 1, "usd", 0.0)), 5)
            assert other.added
            conn.rollback()
    finally:
        await store.close()


async def test_a_ledger_page_reads_through_an_index(schema: str) -> None:
    """Each filter's page walks the index of its narrowest filter from `after`, not the
    ledger: on 20,000 rows, 1,000 of them in the namespace read, a page of 10 reads 10 rows."""
    store = await _open(schema)
    try:
        await store.db.all(
            "INSERT INTO cost_ledger (namespace, tenant, run_id, root_id, amount, currency, at) "
            "SELECT CASE WHEN g %% 20 = 0 THEN 'ns' ELSE 'other' END, 't' || (g / 20 %% 5), "
            "'r' || (g / 20 %% 50), 'root' || (g / 20 %% 20), 1, 'usd', g "
            "FROM generate_series(1, 20000) g", {}, fetch=False)
        await store.db.all("ANALYZE cost_ledger", {}, fetch=False)
        base: dict[str, Any] = {"namespace": "ns", "tenant": None, "root_id": None,
                                "run_id": None, "after": 5000, "limit": 10, "since": None,
                                "until": None}
        cases = {"cost_ledger": {}, "cost_ledger_of_tenant": {"tenant": "t4"},
                 "cost_ledger_of_root": {"root_id": "root8"},
                 "cost_ledger_of_run": {"run_id": "r6"}}
        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            for name, extra in cases.items():
                [[[explained]]] = conn.execute(
                    ("EXPLAIN (ANALYZE, FORMAT JSON) " + _Q[name]).encode(), {**base, **extra}
                ).fetchall()
                plan = json.dumps(explained["Plan"])
                assert "Index" in plan and "Seq Scan" not in plan and "Sort" not in plan, (
                    name, plan)
                found = _ledger_reads(explained["Plan"])
                assert found and all(rows <= 10 for rows in found), (name, found)
        rows = await store.ledger("ns", run_id="r6", after=5000, limit=10)
        assert len(rows) == 10 and all(r.run_id == "r6" and r.id > 5000 for r in rows)
    finally:
        await store.close()


def _ledger_reads(plan: dict[str, Any]) -> list[int]:
    """The actual rows of every read of cost_ledger in an EXPLAIN (ANALYZE, FORMAT JSON)
    plan."""
    found = []
    if plan.get("Relation Name") == "cost_ledger":
        found.append(plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0))
    for child in plan.get("Plans", []):
        found.extend(_ledger_reads(child))
    return found


async def test_a_schema_at_version_10_gets_the_ledger_indexes(schema: str) -> None:
    applied = _schema_at(schema, 10, *(   # the schema as shoal left it at 10
        "INSERT INTO cost_ledger (namespace, tenant, run_id, root_id, amount, currency, at) "
        f"VALUES ('ns', 't', 'r{i}', NULL, {i}, 'usd', {i})" for i in range(3)))
    assert applied == list(range(1, 11))
    store = await _open(schema)
    try:
        assert await store.migrate() >= 11
        rows = await store.ledger("ns")
        assert [r.run_id for r in rows] == ["r0", "r1", "r2"] and increasing(rows)
        assert await store.ledger("ns", run_id="r1") == [rows[1]]
        assert await store.ledger("ns", after=rows[0].id, limit=1) == [rows[1]]
        entry = SpendEntry("t", "r9", None, 1, "usd", 9)
        await store.counter_add("ns", [], [], [], 9, entry)
        assert [unwritten(r) for r in await store.ledger("ns", after=rows[2].id)] == [entry]
    finally:
        await store.close()


async def test_an_exported_ledger_is_trimmed_and_ids_go_on(schema: str) -> None:
    store = await _open(schema)
    try:
        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            await trim_the_exported_ledger(store, lambda last: conn.execute(
                "DELETE FROM cost_ledger WHERE namespace = 'ns' AND id <= %s", (last,)))
    finally:
        await store.close()


async def test_prune_never_cuts_a_circuits_pair_behind_a_lock(schema: str) -> None:
    """rate_counter_keys_create (admit's, counter_add's) locks a circuit's two counter rows one
    after the other, in "C" order. A retention batch that runs in between finds '…-opened'
    locked and skips it (FOR UPDATE SKIP LOCKED) but deletes the idle '…-reclosed': the
    transaction then makes '…-reclosed' again at 0, and the breaker looks tripped (opened 3 >
    closed 0) after a provider sat idle, which eb0473e's order was meant to rule out. Here the
    transaction between its two row locks is a connection holding the first one."""
    store = await _open(schema)
    keys = ["p:circuit-opened", "p:circuit-reclosed"]
    try:
        await store.counter_add("ns", keys, [3, 3], [None, None], 0.0)
        with psycopg.connect(URL) as conn:      # '…-opened' locked, '…-reclosed' not yet
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.execute("SELECT key FROM rate_counters WHERE namespace = 'ns' AND key = %s "
                         "FOR UPDATE", (keys[0],))
            await asyncio.wait_for(store.prune_rates("ns", 100.0, 100), 10)
            conn.commit()
        got = await store.counter_add("ns", keys, [0, 0], [None, None], 200.0)
        assert got.totals[0] <= got.totals[1], f"the breaker looks tripped: {got.totals}"
    finally:
        await store.close()


async def test_aimd_lowers_the_limit_for_every_replica_over_postgres(schema: str) -> None:
    """A 429 on one replica lowers the concurrency limit the other replica, on a pool of its
    own, admits calls under."""
    from shoal.testing import VirtualClock

    clock = VirtualClock()
    stores = [await _open(schema), await _open(schema)]
    apps = [shoal.App("aimd", store=s, clock=clock, instance_id=f"r{i}")
            for i, s in enumerate(stores)]
    a, b = (app.provider("openai", max_concurrent=6, aimd=shoal.Aimd()) for app in apps)
    try:
        async with apps[0].open(), apps[1].open():
            async with a.call() as call:
                call.rate_limited(retry_after=0)
            assert (await b.state()).concurrency_limit == 3
            held = [b.call() for _ in range(3)]
            for h in held:
                await h.__aenter__()
            with pytest.raises(shoal.RateLimitTimeoutError, match="lowered by AIMD from 6"):
                async with a.call(timeout=0):
                    pass
            for h in held:
                await h.__aexit__(None, None, None)
            assert (await a.state()).concurrency_limit == 4
    finally:
        for s in stores:
            await s.close()
