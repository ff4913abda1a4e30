"""The command line and the store's schema version (a SQLite file): every command refuses a schema
newer than the code with one line naming both versions, exit code 1, no traceback, and changes
nothing; ``shoal worker --no-migrate`` refuses a schema that is behind and serves a current one."""

from __future__ import annotations

import sqlite3
import textwrap
from pathlib import Path

import pytest
from click.testing import Result
from test_cli import assert_fails, shoal_cli

from shoal.backends._sql import migrations
from shoal.backends.sqlite.store import _statements

NEWEST = max(number for number, _, _ in migrations("sqlite"))


def _file_at(path: Path, version: int) -> str:
    """A SQLite store as the shoal that migrated it to ``version`` left it (versions past this
    shoal's newest recorded only); its URL."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE shoal_migrations "
                     "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)")
        for number, name, sql in migrations("sqlite"):
            if number <= version:
                for statement in _statements(sql):
                    conn.execute(statement)
                conn.execute("INSERT INTO shoal_migrations VALUES (?, ?, 0)", (number, name))
        for future in range(NEWEST + 1, version + 1):
            conn.execute("INSERT INTO shoal_migrations VALUES (?, ?, 0)",
                         (future, f"{future:04d}_future.sql"))
    conn.close()
    return f"sqlite:///{path}"


def _version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        version: int = conn.execute("SELECT max(version) FROM shoal_migrations").fetchone()[0]
    conn.close()
    return version


def _worker_module(folder: Path, name: str, url: str) -> str:
    """A module ``name`` (unique: imported modules stay) whose ``app`` uses ``url``; its spec."""
    (folder / f"{name}.py").write_text(textwrap.dedent(f"""
        import shoal
        app = shoal.App("versions", store={url!r})
    """))
    return f"{name}:app"


def _worker_fails(result: Result, *fragments: str) -> None:
    """As assert_fails: one line, and the worker never said it serves (it says so only once
    its app has started)."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "serving" not in result.stderr, result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_every_command_refuses_a_schema_newer_than_the_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "newer.db"
    url = _file_at(db, NEWEST + 1)
    monkeypatch.chdir(tmp_path)
    spec = _worker_module(tmp_path, "newer_app", url)
    both = f"schema version {NEWEST + 1}, newer than version {NEWEST}"
    for args in (["migrate"], ["runs"], ["-n", "shop", "runs"], ["run", "show", "x"],
                 ["run", "cancel", "x"], ["signal", "x", "go"], ["-n", "shop", "pauses"],
                 ["-n", "shop", "ledger"], ["approve", "p"]):
        assert_fails(shoal_cli(*args, store=url), both)
    for args in (["worker", spec], ["worker", "--no-migrate", spec]):
        _worker_fails(shoal_cli(*args), both)
    assert _version(db) == NEWEST + 1


def test_worker_no_migrate_refuses_a_schema_behind_and_serves_a_current_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "behind.db"
    url = _file_at(db, NEWEST - 1)
    monkeypatch.chdir(tmp_path)
    spec = _worker_module(tmp_path, "behind_app", url)
    _worker_fails(shoal_cli("worker", "--no-migrate", spec),
                  f"is at schema version {NEWEST - 1}, and this shoal needs version {NEWEST}",
                  "shoal migrate")
    assert _version(db) == NEWEST - 1
    missing = tmp_path / "missing.db"
    spec = _worker_module(tmp_path, "missing_app", f"sqlite:///{missing}")
    _worker_fails(shoal_cli("worker", "--no-migrate", spec), "holds no shoal schema")
    assert not missing.exists()
    # `shoal migrate` brings it up to date; the worker's start is then the one tested in
    # test_schema_versions.py (a current schema opens without migrating)
    assert shoal_cli("migrate", store=url).exit_code == 0
    assert _version(db) == NEWEST
