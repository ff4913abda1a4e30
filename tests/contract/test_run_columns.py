"""The columns a Run is made of (``shoal.backends._runs``) against a freshly migrated PostgreSQL
and SQLite store: every column of the mapping is in the runs table, every column of the table
is in the mapping (or declared no part of a Run), and the statements that hand runs to the
engine return every column of the mapping. A column added to Run, to the table or to a
migration, but not to the mapping, fails here rather than read as None.

The server is ``SHOAL_TEST_POSTGRES`` (see ``test_postgres.py``); each test has a schema of its
own.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from test_postgres import _url

from shoal.backends import _runs
from shoal.backends.postgres import PostgresStore
from shoal.backends.postgres.connections import Q
from shoal.backends.postgres.runs import _SETTLE_AND_CLAIM, _SETTLE_COLUMNS
from shoal.backends.sqlite import SQLiteStore
from shoal.types import Run


def test_the_mapping_names_every_field_of_run_once() -> None:
    assert set(_runs.FIELDS) == {f.name for f in dataclasses.fields(Run)}
    assert len(set(_runs.NAMES)) == len(_runs.NAMES) == len(_runs.FIELDS) + 1


async def test_the_runs_table_and_the_mapping_agree(schema: str) -> None:
    store = PostgresStore.from_url(_url(schema))
    await store.open()
    try:
        rows = await store.db.all(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = %(schema)s AND table_name = 'runs'", {"schema": schema})
    finally:
        await store.close()
    _agree({r["column_name"] for r in rows})


def _agree(table: set[str]) -> None:
    assert set(_runs.NAMES) - table == set(), "columns of the mapping missing from the table"
    assert table - set(_runs.NAMES) - _runs.NOT_OF_A_RUN == set(), \
        "columns of the table that the mapping (shoal.backends._runs.COLUMNS) forgets"


async def test_the_sqlite_runs_table_and_the_mapping_agree(tmp_path: Path) -> None:
    """SQLite's statements return whole rows (``RETURNING *``, ``SELECT *``): its table is
    what has to agree."""
    store = SQLiteStore(str(tmp_path / "columns.db"))
    await store.open()
    try:
        table = {row["name"] for row in store._db.execute("PRAGMA table_info(runs)")}
    finally:
        await store.close()
    _agree(table)


async def test_the_claims_return_every_column_of_the_mapping(schema: str) -> None:
    """The claim and the settlements-and-claim statement, as the store sends them (no run is
    due: only their columns are read)."""
    store = PostgresStore.from_url(_url(schema))
    await store.open()
    claim = {"namespace": "ns", "workflows": ["w"], "owner": "o", "limit": 1, "expires": 2.0,
             "now": 1.0, "version": None, "any_version": []}
    settle: dict[str, object] = {c: [] for c in _SETTLE_COLUMNS}
    try:
        claimed, _ = await store.db.tuples(Q["claim"], claim)
        both, _ = await store.db.tuples(_SETTLE_AND_CLAIM, {
            **settle, "s_owner": [], "channel": store.channel, **claim})
    finally:
        await store.close()
    assert set(_runs.NAMES) <= set(claimed), set(_runs.NAMES) - set(claimed)
    assert set(_runs.NAMES) <= set(both), set(_runs.NAMES) - set(both)
