"""The schema version a store is opened at, on SQLite and PostgreSQL (and the memory store, which
has none): ``App(migrate=False)`` never migrates and refuses a schema behind or missing; a schema
newer than the code (a rolled-back deploy) is refused with or without migrating, by the store and
by the App, and left as it was. PostgreSQL schemas are test_postgres.py's (one per test,
dropped afterwards; its server, skip and CI failure)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sql_support import sqlite_file_at
from test_postgres import URL, _url

import shoal
from shoal.backends._sql import migrations
from shoal.backends.postgres import PostgresStore
from shoal.errors import ConfigurationError, SchemaVersionError
from shoal.stores import open_store

NEWEST = max(number for number, _, _ in migrations("sqlite"))
# the version before the newest (numbers are reserved per branch, so it need not be NEWEST - 1)
PREVIOUS = sorted(number for number, _, _ in migrations("sqlite"))[-2]
assert max(number for number, _, _ in migrations("postgres")) == NEWEST


@dataclass
class Place:
    """Where a store lives, and how to put a schema there as some shoal left it."""

    url: str
    at: Callable[[int], None]          # the schema at this version (0: no store at all)
    version: Callable[[], int | None]  # the version recorded there (None: no store)


def _sqlite_place(tmp_path: Path) -> Place:
    path = tmp_path / "shoal.db"

    def at(version: int) -> None:
        if not version:
            return
        sqlite_file_at(path, min(version, NEWEST))
        with sqlite3.connect(path) as conn:
            for future in range(NEWEST + 1, version + 1):
                conn.execute("INSERT INTO shoal_migrations VALUES (?, ?, 0)",
                             (future, f"{future:04d}_future.sql"))
        conn.close()

    def version() -> int | None:
        if not path.exists():
            return None
        with sqlite3.connect(path) as conn:
            row = conn.execute("SELECT max(version) FROM shoal_migrations").fetchone()
        conn.close()
        return int(row[0])

    if path.exists():
        path.unlink()
    return Place(f"sqlite:///{path}", at, version)


def _postgres_place(schema: str) -> Place:
    from test_rate_postgres import _schema_at

    table = sql.Identifier(schema, "shoal_migrations")

    def at(version: int) -> None:
        if not version:
            return
        _schema_at(schema, min(version, NEWEST))
        with psycopg.connect(URL, autocommit=True) as conn:
            for future in range(NEWEST + 1, version + 1):
                conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, 0)").format(table),
                             (future, f"{future:04d}_future.sql"))

    def version() -> int | None:
        with psycopg.connect(URL, autocommit=True) as conn:
            if conn.execute("SELECT to_regclass(%s)", (f'"{schema}".shoal_migrations',)
                            ).fetchone() == (None,):
                return None
            row = conn.execute(sql.SQL("SELECT max(version) FROM {}").format(table)).fetchone()
        assert row is not None
        return int(row[0])

    return Place(_url(schema), at, version)


@pytest.fixture(params=["sqlite", "postgres"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    if request.param == "sqlite":
        return _sqlite_place(tmp_path)
    return _postgres_place(request.getfixturevalue("schema"))


def _app(url: str, **options: Any) -> shoal.App:
    app = shoal.App("versions", store=url, lease=3.0, **options)

    @app.workflow
    async def double(ctx: shoal.RunContext, input: int) -> int:
        return await ctx.step("double", lambda: input * 2)

    return app


# -- App(migrate=False) ------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, PREVIOUS])
async def test_migrate_false_refuses_a_schema_behind_or_missing_and_changes_nothing(
    place: Place, version: int
) -> None:
    place.at(version)
    app = _app(place.url, migrate=False)
    with pytest.raises(SchemaVersionError) as e:
        await app.start()
    await app.close()
    assert isinstance(e.value, ConfigurationError)
    assert (e.value.found, e.value.expected) == (version, NEWEST)
    text = str(e.value)
    assert f"needs version {NEWEST}" in text and "shoal migrate" in text and "migrate=False" in text
    assert (f"schema version {version}" if version else "holds no shoal schema") in text
    assert place.version() == (version or None), "nothing created, nothing migrated"


async def test_migrate_false_serves_a_current_schema(place: Place) -> None:
    place.at(NEWEST)
    app = _app(place.url, migrate=False)
    async with app:
        run = await app.dispatch("double", 21)
        assert await app.result(run.id, timeout=15) == 42


async def test_migrate_false_on_the_memory_store_and_a_bad_value() -> None:
    app = _app("memory://", migrate=False)
    async with app:
        run = await app.dispatch("double", 1)
        assert await app.result(run.id, timeout=15) == 2
    with pytest.raises(ConfigurationError, match=r"App\(migrate\) must be True or False, not 'no'"):
        shoal.App("versions", store="memory://", migrate="no")  # type: ignore[arg-type]


# -- a schema newer than the code ----------------------------------------------------------------


async def test_a_schema_newer_than_the_code_is_refused_and_left_alone(place: Place) -> None:
    place.at(NEWEST + 2)
    for migrate in (True, False):
        store = open_store(place.url)
        with pytest.raises(SchemaVersionError) as e:
            await store.open(migrate=migrate)
        await store.close()
        assert (e.value.found, e.value.expected) == (NEWEST + 2, NEWEST)
        assert (f"schema version {NEWEST + 2}, newer than version {NEWEST}"
                in str(e.value)), str(e.value)
        app = _app(place.url, migrate=migrate)
        with pytest.raises(SchemaVersionError):
            await app.start()
        await app.close()
        with pytest.raises(SchemaVersionError):
            async with app.open():
                pass
    assert place.version() == NEWEST + 2


async def test_migrating_refuses_a_schema_a_newer_shoal_migrated_meanwhile(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """migrate() reads the version again under its lock: another (newer) instance may have
    migrated between its first read and the lock."""
    place.at(NEWEST + 1)
    store = open_store(place.url)

    async def stale() -> int:
        return NEWEST - 1

    monkeypatch.setattr(store, "_version", stale if isinstance(store, PostgresStore)
                        else lambda: NEWEST - 1)
    with pytest.raises(SchemaVersionError) as e:
        await store.open()
    await store.close()
    assert e.value.found == NEWEST + 1
    assert place.version() == NEWEST + 1
