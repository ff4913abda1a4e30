"""PostgreSQL as a real deployment hands it over: the schema migrated by its owner (``shoal
migrate``), the workers connected as a role that may only read and write rows. Opening a store
whose schema is current does no DDL, so such a role starts workers, dispatches, runs workflows to
their end, reads runs, holds locks and wakes through LISTEN/NOTIFY.

The role (``shoal_dml_<random>``) and the schema are dropped after each test, also when it fails
(test_postgres.py's server, skip and CI failure).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql
from test_postgres import URL, _url

import shoal
from shoal.backends._sql import migrations
from shoal.backends.postgres import PostgresStore
from shoal.testing.contract import add


@pytest.fixture
def dml_role(schema: str) -> Iterator[str]:
    """A login role with no privilege of its own; dropped (with its grants) afterwards, after
    the schema fixture's schema is no more in its way."""
    name = f"shoal_dml_{secrets.token_hex(6)}"
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE usename = %s", (name,))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _grant_dml(schema: str, role: str) -> None:
    """What a DBA gives an application role: rows, not tables."""
    s, r = sql.Identifier(schema), sql.Identifier(role)
    with psycopg.connect(URL, autocommit=True) as conn:
        for grant in ("GRANT USAGE ON SCHEMA {s} TO {r}",
                      "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {r}",
                      "GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {r}"):
            conn.execute(sql.SQL(grant).format(s=s, r=r))


def _as(role: str, url: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


async def test_a_role_with_only_row_privileges_serves_a_migrated_schema(
    schema: str, dml_role: str
) -> None:
    owner = PostgresStore.from_url(_url(schema))
    await owner.open()   # the owner migrates (as `shoal migrate` does)
    await owner.close()
    _grant_dml(schema, dml_role)
    url = _as(dml_role, _url(schema))

    app = shoal.App("roles", store=url, lease=3.0)

    @app.workflow
    async def greet(ctx: shoal.RunContext, input: dict[str, Any]) -> str:
        name = await ctx.step("name", lambda: input["name"])
        got = await ctx.wait_for("go", timeout=30)
        return f"hello {name} {got}"

    async with app:
        run = await app.dispatch(greet, {"name": "ada"})
        for _ in range(300):
            if (await app.get_run(run.id)).status == shoal.RunStatus.WAITING:
                break
            await asyncio.sleep(0.02)
        await app.signal(run.id, "go", 1)
        assert await app.result(run.id, timeout=15) == "hello ada 1"
        assert [r.id for r in await app.list_runs()] == [run.id]
        async with app.lock("one"):
            pass


async def test_a_role_with_only_row_privileges_listens_and_notifies(
    schema: str, dml_role: str
) -> None:
    owner = PostgresStore.from_url(_url(schema))
    await owner.open()
    _grant_dml(schema, dml_role)
    role = PostgresStore.from_url(_as(dml_role, _url(schema)))
    await role.open()
    try:
        await role.wait_for_work(5)   # the listener is up: its first wake-up
        started = time.monotonic()
        waiting = asyncio.ensure_future(role.wait_for_work(10))
        await asyncio.sleep(0.1)
        await add(owner, time.time())            # NOTIFY from the owner reaches the role
        await waiting
        assert time.monotonic() - started < 5
        await owner.wait_for_work(5)
        started = time.monotonic()
        waiting = asyncio.ensure_future(owner.wait_for_work(10))
        await asyncio.sleep(0.1)
        await add(role, time.time())             # and the role's own NOTIFY reaches the owner
        await waiting
        assert time.monotonic() - started < 5
    finally:
        await role.close()
        await owner.close()


async def test_a_role_with_only_row_privileges_cannot_upgrade_a_schema_and_says_so(
    schema: str, dml_role: str
) -> None:
    from test_rate_postgres import _schema_at

    newest = max(number for number, _, _ in migrations("postgres"))
    _schema_at(schema, newest - 1)
    _grant_dml(schema, dml_role)
    app = shoal.App("roles", store=_as(dml_role, _url(schema)))
    with pytest.raises(shoal.ConfigurationError) as e:
        await app.start()
    assert "permission denied" in str(e.value) and "shoal migrate" in str(e.value)
    await app.close()
    # without the grants, the same clear error (not psycopg's) at the first read
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(sql.SQL("REVOKE USAGE ON SCHEMA {} FROM {}").format(
            sql.Identifier(schema), sql.Identifier(dml_role)))
    store = PostgresStore.from_url(_as(dml_role, _url(schema)))
    with pytest.raises(shoal.ConfigurationError, match="USAGE on it"):
        await store.open()
    await store.close()
