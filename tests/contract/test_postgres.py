"""The store contract suites on PostgreSQL (and random calls that must get the memory reference's
answers), plus what only PostgreSQL has to show.

Each test gets a schema of its own (``shoal_t_<random>``), dropped with everything in it afterwards.
The server is ``SHOAL_TEST_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/test``).
Without a reachable server the tests skip with a message, except under ``CI``, where they fail.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import AsyncIterator
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from shoal.backends._sql import migrations
from shoal.backends.postgres import PostgresStore
from shoal.errors import ConfigurationError, StoreUnavailableError
from shoal.ports import Store
from shoal.stores import mask_url, open_store
from shoal.testing.contract import (
    NS,
    T0,
    RunDifferential,
    StoreContract,
    add,
    claim,
    fence,
    new_run,
)
from shoal.types import Fence, FlowLimits, RunStatus, Settlement, Step

URL = os.environ.get("SHOAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


@functools.cache
def _unreachable() -> str | None:
    """Why the test server cannot be used, or None when it can."""
    try:
        with psycopg.connect(URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as e:
        return str(e).strip() or type(e).__name__
    return None


def _require_postgres() -> None:
    reason = _unreachable()
    if reason is None:
        return
    message = (f"PostgreSQL at {mask_url(URL)} is not reachable ({reason}); "
               f"set SHOAL_TEST_POSTGRES to a server where the tests may create schemas")
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _url(schema: str, **options: str) -> str:
    parts = urlsplit(URL)
    pairs = [*parse_qsl(parts.query), ("schema", schema), *options.items()]
    return urlunsplit(parts._replace(query=urlencode(pairs)))


def _drop(schema: str) -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def _open(schema: str) -> PostgresStore:
    s = PostgresStore.from_url(_url(schema, pool_min_size="4", pool_max_size="4"))
    await s.open()
    return s


class TestPostgresStore(StoreContract, RunDifferential):
    @pytest.fixture
    async def store(self, schema: str) -> AsyncIterator[Store]:
        s = await _open(schema)
        yield s
        await s.close()

    @pytest.fixture
    async def other(self, store: PostgresStore) -> AsyncIterator[Store]:
        """A second store with a pool of its own over the same schema."""
        s = await _open(store.schema)
        yield s
        await s.close()


# -- what only PostgreSQL has to show ---------------------------------------------------------


async def test_url_options_and_masking() -> None:
    s = open_store("postgres://alice:s3cret@db.example:5433/app?schema=Billing_2&sslmode=disable"
                   "&pool_max_size=3")
    assert isinstance(s, PostgresStore)
    assert s.schema == "Billing_2" and s.pool_max_size == 3
    assert "sslmode=disable" in s.conninfo and "schema" not in s.conninfo
    assert "s3cret" not in mask_url(s.url)
    for bad in ("postgresql://h/db?schema=a;drop", "postgresql://h/db?schema=1x",
                "postgresql://h/db?pool_max_size=many"):
        with pytest.raises(ConfigurationError):
            PostgresStore.from_url(bad)


async def test_unreachable_server_is_a_clear_error_without_the_password() -> None:
    s = PostgresStore.from_url("postgresql://u:hunter2@127.0.0.1:1/db?open_timeout=0.5"
                               "&connect_timeout=1")
    with pytest.raises(StoreUnavailableError) as e:
        await s.open()
    assert "hunter2" not in str(e.value) and "***" in str(e.value)
    await s.close()


async def test_migrations_from_several_instances_at_once(schema: str) -> None:
    stores = [PostgresStore.from_url(_url(schema)) for _ in range(4)]
    try:
        await asyncio.gather(*(s.open() for s in stores))
        versions = [number for number, _, _ in migrations("postgres")]
        assert {await s.migrate() for s in stores} == {versions[-1]}
        rows = await stores[0].db.all("SELECT version FROM shoal_migrations ORDER BY version", {})
        assert [r["version"] for r in rows] == versions
    finally:
        for s in stores:
            await s.close()


async def test_database_refuses_a_second_holder_of_a_key(schema: str) -> None:
    s = await _open(schema)
    try:
        a = await add(s, T0, key="k")
        b = await add(s, T0 + 1, key="k")
        [c] = await claim(s, now=T0 + 1)
        assert c.id == a.id
        with pytest.raises(psycopg.errors.UniqueViolation):
            await s.db.one("UPDATE runs SET status = 'running', started_at = 1 WHERE id = %(id)s",
                         {"id": b.id})
    finally:
        await s.close()


async def test_claim_racing_a_key_holder_is_not_an_error(schema: str) -> None:
    """A claim whose snapshot predates another commit of the same key hits runs_key_holder;
    it claims again instead of failing, and takes nothing of that key."""
    s = await _open(schema)
    try:
        first = await add(s, T0, key="k")
        later = await add(s, T0 + 1, key="k")
        async with await psycopg.AsyncConnection.connect(s.conninfo) as rival:
            await rival.execute(
                sql.SQL("UPDATE {} SET status = 'running', owner = 'rival', lease_epoch = 1, "
                        "started_at = %(now)s, lease_expires_at = %(exp)s WHERE id = %(id)s")
                .format(sql.Identifier(schema, "runs")),
                {"id": later.id, "now": T0 + 2, "exp": T0 + 99})
            task = asyncio.create_task(claim(s, owner="me", now=T0 + 2))
            await asyncio.sleep(0.3)   # the claim now waits on the rival's index entry
            assert not task.done()
            await rival.commit()
            got = await asyncio.wait_for(task, 5)
        assert got == []
        assert (await s.get_run(first.id)).status == RunStatus.QUEUED  # type: ignore[union-attr]
    finally:
        await s.close()


async def test_settle_and_claim_racing_a_key_holder_still_settles(schema: str) -> None:
    """The same race in the statement that settles and claims: it is undone as a whole and
    tried again, so the settlement is written once and answered, and nothing of the key taken."""
    s = await _open(schema)
    try:
        done = await add(s, T0)
        first = await add(s, T0 + 1, key="k")
        later = await add(s, T0 + 2, key="k")
        [c] = await claim(s, owner="me", now=T0 + 1, limit=1)
        assert c.id == done.id
        async with await psycopg.AsyncConnection.connect(s.conninfo) as rival:
            await rival.execute(
                sql.SQL("UPDATE {} SET status = 'running', owner = 'rival', lease_epoch = 1, "
                        "started_at = %(now)s, lease_expires_at = %(exp)s WHERE id = %(id)s")
                .format(sql.Identifier(schema, "runs")),
                {"id": later.id, "now": T0 + 2, "exp": T0 + 99})
            task = asyncio.create_task(s.settle_and_claim(
                [(fence(c), Settlement("succeeded", output="ok"), T0 + 2)],
                NS, ["wf"], "me", 5, 30.0, T0 + 2))
            await asyncio.sleep(0.3)   # the claim now waits on the rival's index entry
            assert not task.done()
            await rival.commit()
            answers, got = await asyncio.wait_for(task, 5)
        assert answers == [True] and got == []
        settled = await s.get_run(done.id)
        assert settled is not None and settled.status == RunStatus.SUCCEEDED
        assert settled.output == "ok"
        assert (await s.get_run(first.id)).status == RunStatus.QUEUED  # type: ignore[union-attr]
    finally:
        await s.close()


async def test_racing_flow_claimers_never_exceed_a_running_cap(schema: str) -> None:
    """Many claims at once on separate connections (four stores, four connections each) against
    one max_running and one max_running_per_tenant: each claim counts in a snapshot taken after
    the advisory lock of the workflow, so no two see the same count; the caps bind and are
    never exceeded, round after round of claims and settlements."""
    stores = [await _open(schema) for _ in range(4)]
    flow = {"wf": FlowLimits(max_running=5, max_running_per_tenant=3)}
    try:
        for i in range(120):
            await add(stores[0], T0 + i * 0.001, tenant=("acme", "globex", "initech")[i % 3])
        peak, done = 0, 0
        for n in range(12):
            now = T0 + 1 + n
            got = await asyncio.gather(*(
                stores[k % 4].claim_runs(NS, ["wf"], f"w{k}", 3, 30.0, now, flow=flow)
                for k in range(24)))
            running = [r for batch in got for r in batch]
            rows = await stores[1].db.all(
                "SELECT tenant, count(*) AS n FROM runs WHERE status = 'running' "
                "GROUP BY tenant", {})
            assert sum(r["n"] for r in rows) <= 5, rows
            assert all(r["n"] <= 3 for r in rows), rows
            peak = max(peak, sum(r["n"] for r in rows))
            # some settle at once while others claim (settle_and_claim: its flow path)
            answers = await asyncio.gather(*(
                stores[k % 4].settle_and_claim(
                    [(fence(r), Settlement("succeeded"), now + 0.5)], NS, ["wf"], r.owner or "",
                    2, 30.0, now + 0.5, flow=flow)
                for k, r in enumerate(running)))
            assert all(held == [True] for held, _ in answers)
            done += len(running)
            for _, batch in answers:
                for r in batch:
                    assert await stores[2].settle_run(fence(r), Settlement("succeeded"),
                                                      now + 0.7)
                    done += 1
            count = await stores[3].db.one(
                "SELECT count(*) AS n FROM runs WHERE status = 'running'", {})
            assert count is not None and count["n"] == 0
        assert peak == 5    # the cap binds
        assert done >= 60
    finally:
        for s in stores:
            await s.close()


async def _listening(s: PostgresStore) -> None:
    """Start the store's listener and wait until it listens; drop the wake-up it gives then."""
    await s.wait_for_work(0)
    await asyncio.wait_for(s.notifications.listening.wait(), 5.0)
    await s.wait_for_work(1.0)


async def test_notify_wakes_another_instance_in_milliseconds(schema: str) -> None:
    a, b = await _open(schema), await _open(schema)
    try:
        await _listening(b)
        started = time.monotonic()
        waiter = asyncio.create_task(b.wait_for_work(5.0))
        await asyncio.sleep(0.05)
        await add(a, T0)
        await asyncio.wait_for(waiter, 5.0)
        assert time.monotonic() - started < 1.0
        # nothing written: the wait lasts its timeout
        started = time.monotonic()
        await b.wait_for_work(0.2)
        assert time.monotonic() - started >= 0.19
    finally:
        await a.close()
        await b.close()


async def test_listener_reconnects_after_its_connection_is_killed(schema: str) -> None:
    a, b = await _open(schema), await _open(schema)
    try:
        await _listening(b)
        assert await _terminate(a, f"shoal-listen {schema}") == 1
        for _ in range(100):                 # the listener notices, then connects again
            if not b.notifications.listening.is_set():
                break
            await asyncio.sleep(0.01)
        await asyncio.wait_for(b.notifications.listening.wait(), 5.0)
        await b.wait_for_work(1.0)
        waiter = asyncio.create_task(b.wait_for_work(5.0))
        await asyncio.sleep(0.3)
        await add(a, T0)
        started = time.monotonic()
        await asyncio.wait_for(waiter, 5.0)
        assert time.monotonic() - started < 1.0
    finally:
        await a.close()
        await b.close()


async def _terminate(s: PostgresStore, application_name: str) -> int:
    """Kill the server sessions of that name (as a server restart would); how many."""
    rows = await s.db.all("SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity "
                        "WHERE application_name = %(name)s AND pid <> pg_backend_pid()",
                        {"name": application_name})
    return sum(1 for r in rows if r["ok"])


async def test_pool_recovers_when_its_connections_are_killed(schema: str) -> None:
    s = await _open(schema)
    killer = PostgresStore.from_url(_url(schema, application_name="shoal-test-killer"))
    await killer.open()
    try:
        run = await add(s)
        assert await _terminate(killer, f"shoal {schema}") == 4
        failures = 0
        for _ in range(20):
            try:
                got = await s.get_run(run.id)
                break
            except StoreUnavailableError as e:   # a dead connection: said once, not forever
                assert "terminating connection" in str(e) or "closed" in str(e)
                failures += 1
                await asyncio.sleep(0.05)
        assert got is not None and got.id == run.id and failures <= 1
        assert len(await claim(s)) == 1
    finally:
        await s.close()
        await killer.close()


async def test_idempotent_creates_racing_from_two_pools(schema: str) -> None:
    a, b = await _open(schema), await _open(schema)
    try:
        got = await asyncio.gather(*(
            s.create_run(new_run(T0 + i * 0.001, idem="once"), max_queued=None,
                         admission="reject")
            for i, s in enumerate([a, b] * 5)))
        assert len({run.id for run, _ in got}) == 1
        assert sum(created for _, created in got) == 1
        parked = await asyncio.gather(*(
            s.create_run(new_run(T0 + i * 0.001), max_queued=3, admission="park")
            for i, s in enumerate([a, b] * 5)))
        assert sum(not run.held for run, _ in parked) == 2   # 1 queued before, max 3
        assert len(await a.list_runs(NS, status="queued")) == 11
    finally:
        await a.close()
        await b.close()


async def test_json_is_kept_as_written(schema: str) -> None:
    s = await _open(schema)
    try:
        await add(s)
        [c] = await claim(s)
        assert await s.checkpoint_step(fence(c), Step(1, "a", {"k": "\u0000é"}, True, 0),
                                       30.0, T0)
        [step] = await s.load_steps(c.id)
        assert step.output == {"k": "\u0000é"}
    finally:
        await s.close()


async def test_a_retrying_holder_is_claimed_before_earlier_runs_of_its_key(schema: str) -> None:
    """A run waiting for its retry holds its key, even against a run of the key that comes
    first in claim order (higher priority): that one waits, the holder is claimed again."""
    s = await _open(schema)
    try:
        holder = await add(s, T0, key="k")
        [c] = await claim(s, now=T0)
        assert await s.settle_run(fence(c), Settlement("retry", error="x", run_at=T0 + 10),
                                  T0 + 1)
        urgent = await add(s, T0 + 2, key="k", priority=5)
        assert await claim(s, now=T0 + 5) == []
        [again] = await claim(s, now=T0 + 10)
        assert again.id == holder.id and again.attempts == 2
        assert await s.settle_run(fence(again), Settlement("succeeded"), T0 + 11)
        [nxt] = await claim(s, now=T0 + 11)
        assert nxt.id == urgent.id
    finally:
        await s.close()


async def test_settlements_of_many_runs_at_once_are_each_fenced(schema: str) -> None:
    """Concurrent settlements share statements (batches); each still answers for its own fence:
    a stale epoch or a second settlement of the same claim is refused, the others written."""
    s = await _open(schema)
    try:
        for i in range(30):
            await add(s, T0 + i * 0.001)
        claimed = await claim(s, owner="a", limit=30, now=T0 + 1)
        assert len(claimed) == 30
        stale = [Fence(c.id, c.owner or "", c.lease_epoch - 1) for c in claimed[:5]]
        calls = [
            *(s.settle_run(fence(c), Settlement("succeeded", output=i), T0 + 1)
              for i, c in enumerate(claimed)),
            *(s.settle_run(f, Settlement("failed", error="stale"), T0 + 1) for f in stale),
            s.settle_run(fence(claimed[7]), Settlement("failed", error="twice"), T0 + 1),
        ]
        got = await asyncio.gather(*calls)
        assert got == [True] * 30 + [False] * 5 + [False]
        runs = {r.id: r for r in await s.list_runs(NS)}
        assert all(runs[c.id].status == RunStatus.SUCCEEDED and runs[c.id].output == i
                   for i, c in enumerate(claimed))
    finally:
        await s.close()


async def test_checkpoints_of_many_runs_at_once_are_each_fenced(schema: str) -> None:
    s = await _open(schema)
    try:
        for i in range(20):
            await add(s, T0 + i * 0.001)
        claimed = await claim(s, owner="a", limit=20, now=T0 + 1)
        first = claimed[0]
        assert await s.checkpoint_step(fence(first), Step(1, "one", "kept", True, 0), 30.0, T0)
        calls = [
            *(s.checkpoint_step(fence(c), Step(1, "one", c.id, True, 0), 30.0, T0 + 2)
              for c in claimed),
            *(s.checkpoint_step(Fence(c.id, "a", c.lease_epoch + 1),
                                Step(2, "two", "stale", True, 0), 30.0, T0 + 2)
              for c in claimed[:4]),
        ]
        assert await asyncio.gather(*calls) == [True] * 20 + [False] * 4
        for c in claimed:
            steps = await s.load_steps(c.id)
            assert [(st.seq, st.output) for st in steps] == \
                [(1, "kept" if c.id == first.id else c.id)]
            assert (await s.get_run(c.id)).lease_expires_at == T0 + 32  # type: ignore[union-attr]
    finally:
        await s.close()


async def test_a_schema_at_version_8_gets_the_tree_tenants(schema: str) -> None:
    """Migration 9 gives each tree key its root's tenant ('default' without a root run): the
    rows and checks of test_stores.py's SQLite test."""
    # imported here: test_rate_postgres imports this module
    from test_rate_postgres import _schema_at
    from test_stores import TREE_ROWS_AT_8, check_the_tree_tenants_after_9

    applied = _schema_at(schema, 8, *TREE_ROWS_AT_8)   # the schema as shoal left it at 8
    assert applied == [1, 2, 3, 4, 5, 6, 7, 8]
    store = await _open(schema)
    try:
        assert await store.migrate() >= 9
        await check_the_tree_tenants_after_9(store)
    finally:
        await store.close()


async def test_a_schema_at_version_11_gets_run_tracebacks(schema: str) -> None:
    """Migration 12 adds the runs' tracebacks: the rows and checks of test_stores.py's SQLite
    test."""
    from test_rate_postgres import _schema_at
    from test_stores import RUN_ROWS_AT_11, check_the_tracebacks_after_13

    applied = _schema_at(schema, 11, *RUN_ROWS_AT_11)   # the schema as shoal left it at 11
    assert applied == list(range(1, 12))
    store = await _open(schema)
    try:
        assert await store.migrate() >= 13
        await check_the_tracebacks_after_13(store)
    finally:
        await store.close()


async def test_a_schema_at_version_13_gets_its_final_runs_counted(schema: str) -> None:
    """Migration 14 counts the runs already final: the rows and checks of test_stores.py's
    SQLite test."""
    from test_rate_postgres import _schema_at
    from test_stores import RUN_ROWS_AT_13, check_the_counts_after_14

    applied = _schema_at(schema, 13, *RUN_ROWS_AT_13)   # the schema as shoal left it at 13
    assert applied == list(range(1, 14))
    store = await _open(schema)
    try:
        assert await store.migrate() >= 14
        await check_the_counts_after_14(store)
    finally:
        await store.close()


async def test_a_root_drops_its_tree_keys_whether_stored_before_or_after_version_16(
        schema: str) -> None:
    """Version 16 fires runs_ended only for children and for roots that stored tree keys: a
    root whose keys were stored before it (migration 16 marks it), one whose keys are stored
    after, and one stored by older code during a rollout (retention drops them with the root)
    each leave no key behind; a root without keys ends as before."""
    from test_rate_postgres import _schema_at

    applied = _schema_at(schema, 15, (
        "INSERT INTO runs (id, namespace, tenant, workflow, input, status, created_at, "
        "max_attempts, root_id, run_at, owner, lease_epoch, started_at) VALUES "
        f"('old', '{NS}', 'default', 'wf', '{{}}', 'running', 0, 3, 'old', 0, 'a', 1, 0)"),
        "INSERT INTO tree_keys (root_id, key, value, claimant, created_at, tenant) "
        "VALUES ('old', 'k', '1', 'step', 0, 'default')")
    assert applied == list(range(1, 16))
    store = await _open(schema)
    try:
        assert await store.migrate() >= 16
        new, plain, legacy = [await add(store, T0 + i) for i in range(3)]
        claimed = {r.id: r for r in await claim(store, now=T0 + 3)}
        assert await store.save_tree_key(new.id, "k", 2, "step", T0 + 2) is True
        with psycopg.connect(URL, autocommit=True) as conn:   # as code older than 16 does
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.execute("INSERT INTO tree_keys (root_id, key, value, claimant, created_at, "
                         "tenant) VALUES (%s, 'k', '3', 'step', 0, 'default')", (legacy.id,))
        assert await store.settle_run(Fence("old", "a", 1), Settlement("succeeded"), T0 + 4)
        for run_id in (new.id, plain.id, legacy.id):
            assert await store.settle_run(fence(claimed[run_id]), Settlement("succeeded"),
                                          T0 + 4)
        assert await store.tree_keys("old") == []
        assert await store.tree_keys(new.id) == []
        assert await store.tree_keys(legacy.id) == [("k", "default")]   # until retention
        assert await store.prune_runs(NS, T0 + 5, 10) == 4
        assert await store.tree_keys(legacy.id) == []
    finally:
        await store.close()


async def test_what_other_sessions_change_is_counted_by_the_triggers(schema: str) -> None:
    """The store's statements record the runs they end, retry and prune in run_counts
    themselves; what another session does to the runs table (shoal code older than schema
    version 14 during a rollout, a psql session) is counted by the triggers, run by run, and
    nothing twice."""
    store = await _open(schema)
    try:
        a, b, c = [await add(store, T0 + i) for i in range(3)]
        claimed = {r.id: r for r in await claim(store, now=T0 + 1)}
        assert await store.settle_run(fence(claimed[a.id]), Settlement("succeeded"), T0 + 2)
        with psycopg.connect(URL, autocommit=True) as conn:   # without shoal.counted
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            for run_id, status in ((b.id, "failed"), (c.id, "cancelled")):
                conn.execute("UPDATE runs SET status = %s, finished_at = %s, owner = NULL "
                             "WHERE id = %s", (status, T0 + 3, run_id))
        got = await store.stats(NS, T0 + 4)
        assert got.by_status == {**dict.fromkeys(got.by_status, 0), "succeeded": 1,
                                 "failed": 1, "cancelled": 1}
        assert got.finished_last_minute == {"succeeded": 1, "failed": 1, "cancelled": 1}
        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.execute("UPDATE runs SET status = 'queued', finished_at = NULL WHERE id = %s",
                         (c.id,))
            conn.execute("DELETE FROM runs WHERE id = %s", (b.id,))
        await store.fold_stats(NS, T0 + 5)
        got = await store.stats(NS, T0 + 5)
        assert got.by_status == {**dict.fromkeys(got.by_status, 0), "succeeded": 1, "queued": 1}
        assert await store.prune_runs(NS, T0 + 10, 10) == 1                     # a
        assert (await store.stats(NS, T0 + 10)).finished == 0
    finally:
        await store.close()
