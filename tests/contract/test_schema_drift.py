"""Schema drift, on SQLite and PostgreSQL: a new store is created from ``schema.sql`` in one go, a
store of an older version is brought forward by its migrations, and both must end with the same
schema. Each side is read back from the database as a normalised description, one line per
table, column (name, type, nullability, default), constraint (primary key, unique, check, foreign
key), index (table, columns or expressions, uniqueness, partial predicate), trigger, view,
function, sequence and recorded version, and the two are compared with a diff.

SQLite is read through ``sqlite_master`` and its pragmas (table_list, table_xinfo, index_list,
index_xinfo, foreign_key_list); PostgreSQL through ``pg_catalog`` (pg_get_constraintdef,
pg_indexes.indexdef, pg_get_triggerdef, pg_get_functiondef), with the schema's random name
replaced by ``<schema>``. PostgreSQL schemas are test_postgres.py's (one per test, dropped
afterwards; its server, skip and CI failure).
"""

from __future__ import annotations

import asyncio
import difflib
import inspect
import re
import secrets
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from sql_support import sqlite_file_at
from test_postgres import URL, _drop, _url

import shoal.backends.postgres.store
import shoal.backends.sqlite.store
from shoal.backends._sql import current_schema, migrations
from shoal.backends.sqlite.store import _statements
from shoal.stores import open_store

NEWEST = max(number for number, _, _ in migrations("sqlite"))
RECORDED = [f"recorded version {number:04d} {name}" for number, name, _ in migrations("sqlite")]

# Rows of a store at version 6, in tables that later migrations change (tree_keys gets its
# tenant, runs a traceback) or leave alone; the same statements on both backends.
ROWS_AT_6 = (
    "INSERT INTO runs (id, namespace, tenant, workflow, input, status, created_at, max_attempts, "
    "root_id, resume_reason) VALUES ('r1', 'ns', 'acme', 'wf', '{\"a\": 1}', 'queued', 1.5, 3, "
    "'r1', 'dispatched')",
    "INSERT INTO steps (run_id, seq, name, output, finished, epoch) "
    "VALUES ('r1', 1, 's', '2', TRUE, 1)",
    "INSERT INTO signals (id, run_id, name, payload, created_at) VALUES ('g1', 'r1', 'go', '1', 2)",
    "INSERT INTO workflows VALUES ('ns', 'wf', '{}', 1)",
    "INSERT INTO pauses (id, namespace, tenant, run_id, name, status, created_at) "
    "VALUES ('p1', 'ns', 'acme', 'r1', 'ok', 'pending', 2.5)",
    "INSERT INTO tree_keys VALUES ('r1', 'k', '\"v\"', 's', 3)",
    "INSERT INTO outbox (id, namespace, run_id, seq, idx, topic, created_at, next_at) "
    "VALUES ('o1', 'ns', 'r1', 1, 0, 't', 1, 1)",
    "INSERT INTO locks VALUES ('ns', 'l', 'h', 3, 9)",
    "INSERT INTO meters VALUES ('ns', 'k', 5, 0)",
)
TABLES_AT_6 = ("runs", "steps", "signals", "workflows", "pauses", "tree_keys", "outbox", "locks",
               "meters")


# -- reading a schema back -------------------------------------------------------------------------

_TOKEN = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*|/\*.*?\*/|\s+|[(),;]"""
                    r"""|[^'"\s(),;-]+|-""", re.DOTALL)


def _tokens(text: str) -> list[str]:
    """SQL text as tokens, without comments and white space (quoted text kept whole)."""
    return [t for t in _TOKEN.findall(text) if not t.isspace() and not t.startswith(("--", "/*"))]


def _flat(text: str) -> str:
    """SQL text on one line, its layout and comments gone: one space between tokens, none
    inside parentheses nor before a comma or a semicolon."""
    out = ""
    for token in _tokens(text):
        if out and not out.endswith("(") and token not in (")", ",", ";"):
            out += " "
        out += token
    return out


def _checks(text: str) -> list[str]:
    """The CHECK constraints of a CREATE TABLE statement, each on one line."""
    tokens, found = _tokens(text), []
    for i, token in enumerate(tokens):
        if token.upper() == "CHECK" and tokens[i + 1 : i + 2] == ["("]:
            depth, j = 0, i + 1
            while True:
                depth += {"(": 1, ")": -1}.get(tokens[j], 0)
                if depth == 0:
                    break
                j += 1
            found.append(_flat(" ".join(tokens[i : j + 1])))
    return found


def describe_sqlite(path: Path) -> list[str]:
    """The schema of the SQLite file ``path``, one sorted line per object or property."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        lines = []
        objects = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
        for kind, name, table, text in objects:
            if kind == "table":
                lines += _sqlite_table(conn, name, text)
            elif kind == "index":
                lines += _sqlite_index(conn, name, table, text)
            else:   # trigger, view
                lines.append(f"{kind} {name} on {table}: {_flat(text)}")
        lines += [f"recorded version {v:04d} {n}" for v, n in
                  conn.execute("SELECT version, name FROM shoal_migrations ORDER BY version")]
    finally:
        conn.close()
    return sorted(lines)


def _sqlite_table(conn: sqlite3.Connection, name: str, text: str) -> list[str]:
    [(kind, without_rowid, strict)] = conn.execute(
        "SELECT type, wr, strict FROM pragma_table_list WHERE name = ?", (name,))
    autoincrement = "AUTOINCREMENT" in (t.upper() for t in _tokens(text))
    lines = [f"table {name}: {kind}, without rowid {without_rowid}, strict {strict}, "
             f"autoincrement {int(autoincrement)}"]
    for cid, column, type_, notnull, default, pk, hidden in conn.execute(
            "SELECT cid, name, type, \"notnull\", dflt_value, pk, hidden "
            "FROM pragma_table_xinfo(?)", (name,)):
        lines.append(f"column {name}.{column} #{cid}: {type_.upper()} "
                     f"{'NOT NULL' if notnull else 'NULL'}, default {default}, "
                     f"primary key #{pk}, hidden {hidden}")
    lines += [f"constraint {name}: {check}" for check in _checks(text)]
    for row in conn.execute("SELECT id, seq, \"table\", \"from\", \"to\", on_update, on_delete, "
                            "match FROM pragma_foreign_key_list(?)", (name,)):
        lines.append(f"foreign key {name} #{row[0]}.{row[1]}: ({row[3]}) REFERENCES "
                     f"{row[2]}({row[4]}) ON UPDATE {row[5]} ON DELETE {row[6]} MATCH {row[7]}")
    return lines


def _sqlite_index(conn: sqlite3.Connection, name: str, table: str, text: str | None) -> list[str]:
    [(unique, origin, partial)] = conn.execute(
        "SELECT \"unique\", origin, partial FROM pragma_index_list(?) WHERE name = ?",
        (table, name))
    columns = [f"{column or '<expression>'}{' DESC' if desc else ''}"
               f"{'' if collation == 'BINARY' else ' COLLATE ' + collation}"
               for column, desc, collation in conn.execute(
                   "SELECT name, \"desc\", coll FROM pragma_index_xinfo(?) WHERE key "
                   "ORDER BY seqno", (name,))]
    # the statement shows the expressions and the partial index's predicate (none for the
    # indexes of a primary key or a UNIQUE constraint)
    return [f"index {name} on {table}({', '.join(columns)}): unique {unique}, origin {origin}, "
            f"partial {partial}: {_flat(text) if text else '-'}"]


# One query per kind of object of the schema %(schema)s; each row is one line of the description.
_PG_DESCRIBE = {
    "relation": """
        SELECT c.relname, 'kind ' || c.relkind::text, 'persistence ' || c.relpersistence::text
        FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.relkind NOT IN ('i', 'I')""",
    "column": """
        SELECT c.relname || '.' || a.attname,
               row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum) AS position,
               format_type(a.atttypid, a.atttypmod),
               CASE WHEN a.attnotnull THEN 'NOT NULL' ELSE 'NULL' END,
               'default ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '-'),
               'identity ' || coalesce(nullif(a.attidentity::text, ''), '-'),
               'generated ' || coalesce(nullif(a.attgenerated::text, ''), '-'),
               'collation ' || coalesce(co.collname, '-')
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        LEFT JOIN pg_collation co ON co.oid = a.attcollation
        WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
          AND a.attnum > 0 AND NOT a.attisdropped""",
    "constraint": """
        SELECT k.conname, 'on ' || coalesce(c.relname, '-'), k.contype, pg_get_constraintdef(k.oid),
               'deferrable ' || k.condeferrable::text, 'validated ' || k.convalidated::text
        FROM pg_constraint k
        JOIN pg_namespace n ON n.oid = k.connamespace
        LEFT JOIN pg_class c ON c.oid = k.conrelid
        WHERE n.nspname = %(schema)s""",
    "index": """
        SELECT indexname, 'on ' || tablename, indexdef FROM pg_indexes
        WHERE schemaname = %(schema)s""",
    "trigger": """
        SELECT t.tgname, 'on ' || c.relname, pg_get_triggerdef(t.oid),
               'enabled ' || t.tgenabled::text
        FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND NOT t.tgisinternal""",
    "view": """
        SELECT viewname, definition FROM pg_views WHERE schemaname = %(schema)s""",
    "function": """
        SELECT p.proname, p.prokind, pg_get_function_identity_arguments(p.oid),
               CASE WHEN p.prokind IN ('f', 'p') THEN pg_get_functiondef(p.oid) END
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %(schema)s""",
    "sequence": """
        SELECT s.sequencename, s.data_type, s.start_value, s.min_value, s.max_value,
               s.increment_by, s.cycle, s.cache_size,
               (SELECT 'owned by ' || t.relname || '.' || a.attname || ' ' || d.deptype::text
                FROM pg_depend d
                JOIN pg_class q ON q.oid = d.objid
                JOIN pg_class t ON t.oid = d.refobjid
                JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = d.refobjsubid
                WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
                  AND q.relname = s.sequencename AND q.relnamespace = n.oid
                  AND d.deptype IN ('a', 'i'))
        FROM pg_sequences s JOIN pg_namespace n ON n.nspname = s.schemaname
        WHERE s.schemaname = %(schema)s""",
    "type": """
        SELECT t.typname, t.typtype, format_type(t.typbasetype, t.typtypmod),
               array(SELECT e.enumlabel FROM pg_enum e WHERE e.enumtypid = t.oid
                     ORDER BY e.enumsortorder)::text
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = %(schema)s AND t.typtype IN ('d', 'e', 'm', 'r')""",
}


def describe_postgres(schema: str) -> list[str]:
    """The schema ``schema`` on the test server, one sorted line per object or property, its
    name replaced by ``<schema>``."""
    lines = []
    with psycopg.connect(URL, autocommit=True) as conn:
        for kind, query in _PG_DESCRIBE.items():
            for row in conn.execute(query, {"schema": schema}):
                text = " ".join(str(value) for value in row)
                lines.append(f"{kind} {' '.join(text.replace(schema, '<schema>').split())}")
        table = sql.Identifier(schema, "shoal_migrations")
        lines += [f"recorded version {v:04d} {n}" for v, n in conn.execute(
            sql.SQL("SELECT version, name FROM {} ORDER BY version").format(table))]
    return sorted(lines)


def assert_same(stepwise: list[str], fresh: list[str]) -> None:
    """The two descriptions are equal, or the test fails with their differences."""
    if stepwise != fresh:
        diff = difflib.unified_diff(stepwise, fresh, "migrations, one by one", "schema.sql",
                                    lineterm="", n=1)
        pytest.fail("The schema that the migrations build and schema.sql's differ (-: only "
                    "migrated, +: only from schema.sql). Make the same change in both (see the "
                    "top of schema.sql):\n" + "\n".join(diff), pytrace=False)


# -- two databases of a backend --------------------------------------------------------------------


@dataclass
class Place:
    """Where a store lives, and how to read it and put a schema there as some shoal left it."""

    backend: str
    url: str
    at: Callable[..., list[int]]            # (version, *statements): as that version left it
    describe: Callable[[], list[str]]
    rows: Callable[[str], list[dict[str, Any]]]
    script: Callable[[], None]              # run schema.sql there, on its own


def _sqlite_place(path: Path) -> Place:
    def rows(table: str) -> list[dict[str, Any]]:
        conn = sqlite3.connect(path)
        conn.row_factory = sqlite3.Row
        try:
            return sorted((dict(r) for r in conn.execute(f"SELECT * FROM {table}")), key=repr)
        finally:
            conn.close()

    def script() -> None:
        with sqlite3.connect(path) as conn:
            for statement in _statements(current_schema("sqlite")):
                conn.execute(statement)
        conn.close()

    return Place("sqlite", f"sqlite:///{path}", lambda *a: sqlite_file_at(path, *a),
                 lambda: describe_sqlite(path), rows, script)


def _postgres_place(schema: str) -> Place:
    from test_rate_postgres import _schema_at

    def rows(table: str) -> list[dict[str, Any]]:
        with psycopg.connect(URL, autocommit=True, row_factory=dict_row) as conn:
            found = conn.execute(sql.SQL("SELECT * FROM {}").format(
                sql.Identifier(schema, table))).fetchall()
        return sorted(found, key=repr)

    def script() -> None:
        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.execute(current_schema("postgres").encode())

    return Place("postgres", _url(schema), lambda *a: _schema_at(schema, *a),
                 lambda: describe_postgres(schema), rows, script)


@pytest.fixture
def fresh_schema(schema: str) -> Iterator[str]:
    """A second schema of the test's own (beside ``schema``), dropped afterwards."""
    name = f"shoal_t_{secrets.token_hex(6)}"
    yield name
    _drop(name)


@pytest.fixture(params=["sqlite", "postgres"])
def places(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Place, Place]:
    """Two empty places of one backend: one for migrations, one for schema.sql."""
    if request.param == "sqlite":
        return _sqlite_place(tmp_path / "stepwise.db"), _sqlite_place(tmp_path / "fresh.db")
    return (_postgres_place(request.getfixturevalue("schema")),
            _postgres_place(request.getfixturevalue("fresh_schema")))


@pytest.fixture
def scripts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The backends whose schema.sql a store has run (each time a store ran one)."""
    ran = []

    def spy(backend: str) -> str:
        ran.append(backend)
        return current_schema(backend)

    monkeypatch.setattr(shoal.backends.sqlite.store, "current_schema", spy)
    monkeypatch.setattr(shoal.backends.postgres.store, "current_schema", spy)
    return ran


async def _open(url: str) -> None:
    """Open a store at ``url`` as an app does (migrating it), then close it."""
    store = open_store(url)
    try:
        await store.open()
    finally:
        await store.close()


# -- the tests -------------------------------------------------------------------------------------


async def test_the_migrations_one_by_one_build_the_schema_of_schema_sql(
    places: tuple[Place, Place], scripts: list[str]
) -> None:
    """Migration 1, then the store's migrate applying 2, 3, … N in turn; against a new store,
    which gets schema.sql in one go."""
    stepwise, fresh = places
    assert stepwise.at(1) == [1]
    await _open(stepwise.url)
    assert scripts == [], "a store behind gets its migrations, not schema.sql"
    await _open(fresh.url)
    assert scripts == [fresh.backend], "a new store gets schema.sql"
    described = stepwise.describe()
    assert [line for line in described if line.startswith("recorded")] == RECORDED
    for kind, name in [("index", "runs_key_holder"), ("trigger", "runs_ended"),
                       ("column", "runs.traceback"), ("trigger", "runs_uncounted")]:  # read back
        assert any(line.startswith(f"{kind} {name} ") for line in described), (kind, name)
    assert_same(described, fresh.describe())


def test_schema_sql_alone_holds_every_migration(places: tuple[Place, Place]) -> None:
    """schema.sql records every migration, so a new store runs no migration after it: a new
    migration must be folded into schema.sql too, not only applied on top of it."""
    place, _ = places
    assert place.at(0) == []   # nothing but the store's own table of versions
    place.script()
    recorded = [line for line in place.describe() if line.startswith("recorded")]
    assert recorded == RECORDED, (
        "schema.sql does not record every migration: make each migration's change in it too, "
        "and add the migration's row to the INSERT at its end")


async def test_a_store_at_version_6_with_rows_is_migrated_to_the_schema_of_schema_sql(
    places: tuple[Place, Place], scripts: list[str]
) -> None:
    """A store left at version 6, with rows, gets migrations 7 to N: its schema ends as a new
    store's, its rows are all there, and the columns added since hold what the migrations say."""
    stepwise, fresh = places
    assert stepwise.at(6, *ROWS_AT_6) == [1, 2, 3, 4, 5, 6]
    before = {table: stepwise.rows(table) for table in TABLES_AT_6}
    await _open(stepwise.url)
    assert scripts == []
    await _open(fresh.url)
    assert_same(stepwise.describe(), fresh.describe())

    after = {table: stepwise.rows(table) for table in TABLES_AT_6}
    for table, rows in before.items():
        assert [{k: row[k] for k in rows[0]} for row in after[table]] == rows, table
    assert [(r["tenant"], r["value"]) for r in after["tree_keys"]] == [("acme", '"v"')]
    assert [(r["id"], r["traceback"]) for r in after["runs"]] == [("r1", None)]


def test_stores_opening_a_new_place_at_once_create_it_once(
    places: tuple[Place, Place], scripts: list[str]
) -> None:
    """Four stores, each in a thread (and event loop) of its own, all read version 0 before any
    of them migrates: the first to take the lock (BEGIN IMMEDIATE, the advisory lock) runs
    schema.sql, the others read the version again under it and find the place current."""
    _, fresh = places
    together = threading.Barrier(4, timeout=30)

    def start(_: int) -> None:
        store = open_store(fresh.url)
        read = store._version   # type: ignore[attr-defined]
        if inspect.iscoroutinefunction(read):
            async def version() -> int:
                found: int = await read()
                together.wait()
                return found
            store._version = version   # type: ignore[attr-defined]
        else:
            def version_now() -> int:
                found: int = read()
                together.wait()
                return found
            store._version = version_now   # type: ignore[attr-defined]

        async def open_and_close() -> None:
            try:
                await store.open()
            finally:
                await store.close()

        asyncio.run(open_and_close())

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(start, range(4)))
    assert scripts == [fresh.backend]
    assert [line for line in fresh.describe() if line.startswith("recorded")] == RECORDED
