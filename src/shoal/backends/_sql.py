"""SQL kept as files beside each backend's code: versioned migrations ``migrations/NNNN_*.sql``,
the current schema as one script ``schema.sql`` (what a new store gets; it records the versions it
holds) and named blocks in ``queries.sql``."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from shoal import _json
from shoal.errors import SchemaVersionError
from shoal.types import LockState, LockWaiter, Progress

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_TABLE = re.compile(r"^CREATE TABLE (\w+)", re.MULTILINE)
# a table named where a statement reads or writes it (the files write keywords in capitals)
_TABLE_REF = re.compile(r"\b(FROM|INTO|UPDATE|JOIN)(\s+)([A-Za-z_]\w*)\b")


def queries(backend: str, file: str = "queries.sql") -> dict[str, str]:
    """The named statements of ``shoal/backends/<backend>/<file>``."""
    text = resources.files(f"shoal.backends.{backend}").joinpath(file).read_text()
    parts = _NAME.split(text)
    named: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        named[name] = body.strip().rstrip(";")
    return named


def migrations(backend: str) -> list[tuple[int, str, str]]:
    """``(version, file name, sql)`` of every migration, in version order."""
    folder = resources.files(f"shoal.backends.{backend}").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.match(r"^(\d{4})_\w+\.sql$", entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text()))
    return sorted(found)


def current_schema(backend: str) -> str:
    """``shoal/backends/<backend>/schema.sql``: the whole current schema, for a store that holds
    none yet, ending with the rows of ``shoal_migrations`` for every migration it holds."""
    return resources.files(f"shoal.backends.{backend}").joinpath("schema.sql").read_text()


def behind(store: str, backend: str, found: int, *, migrate: bool) -> bool:
    """Whether a schema at version ``found`` (0: none) lacks migrations of ``backend``. A schema
    newer than the newest migration is refused (a rolled-back deploy must not write rows the
    newer code reads differently), and so is one behind when not ``migrate``: both with a
    SchemaVersionError naming ``store`` and both versions."""
    newest = max(number for number, _, _ in migrations(backend))
    if found > newest or (found < newest and not migrate):
        raise SchemaVersionError(store, found, newest)
    return found < newest


@functools.cache
def tables(backend: str) -> frozenset[str]:
    """The tables ``schema.sql`` of ``backend`` creates."""
    return frozenset(_TABLE.findall(current_schema(backend)))


def qualified(query: str, schema: str, backend: str) -> str:
    """``query`` (a statement of ``queries.sql``) with every table of the store it names after
    FROM, INTO, UPDATE or JOIN written ``"schema".table``: what runs on a caller's connection,
    whose search path (PostgreSQL) or attached names (SQLite) are the caller's own."""
    ours = tables(backend)
    quoted = '"' + schema.replace('"', '""') + '"'

    def qualify(m: re.Match[str]) -> str:
        keyword, space, name = m.groups()
        return f"{keyword}{space}{quoted}.{name}" if name in ours else m.group(0)

    return _TABLE_REF.sub(qualify, query)


def progress_of(text: str | None, at: float | None) -> Progress | None:
    """A run's progress as its columns ``progress`` (JSON text) and ``progress_at`` keep it;
    None when it reported none."""
    if text is None or at is None:
        return None
    return Progress.from_json(_json.loads(text), at)


def lock_states(held: Sequence[Mapping[str, Any]], waiting: Sequence[Mapping[str, Any]],
                limit: int) -> tuple[tuple[LockState, ...], bool]:
    """``coordination_view``'s locks from the rows of the keys held (``key, token, holder,
    expires_at``, by key, at most ``limit + 1``) and of the live waiters (``key, holder,
    ticket, expires_at, token``, by key and ticket): at most ``limit`` keys, each with at most
    ``limit`` waiters, and whether something was cut."""
    tokens: dict[str, int] = {}
    holders: dict[str, tuple[str, float]] = {}
    queues: dict[str, list[LockWaiter]] = {}
    for row in held:
        tokens[row["key"]] = row["token"]
        holders[row["key"]] = (row["holder"], row["expires_at"])
    for row in waiting:
        tokens.setdefault(row["key"], row["token"])
        queues.setdefault(row["key"], []).append(
            LockWaiter(row["holder"], row["ticket"], row["expires_at"]))
    keys = sorted(tokens)
    cut = len(keys) > limit or any(len(q) > limit for q in queues.values())
    return tuple(
        LockState(k, tokens[k], holders[k][0] if k in holders else None,
                  holders[k][1] if k in holders else None, tuple(queues.get(k, [])[:limit]))
        for k in keys[:limit]), cut
