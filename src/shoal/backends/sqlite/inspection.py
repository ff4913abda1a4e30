"""What a console reads (:class:`shoal.ports.RunInspection`) from the SQLite store's tables:
reads only, each one statement or one deferred transaction (one snapshot, no write lock).
"""

from __future__ import annotations

from typing import Any

from shoal import _json
from shoal.backends._sql import queries
from shoal.backends.sqlite.connection import SQLiteConnection, unavailable_on_failure
from shoal.backends.sqlite.rows import _entry, _pause, _run
from shoal.types import (
    Run,
    RunFilter,
    RunOwner,
    RunRecord,
    SignalRecord,
    StepRecord,
)

_Q = queries("sqlite")


@unavailable_on_failure
class SQLiteInspection:
    """Searching and inspecting runs for :class:`~shoal.backends.sqlite.SQLiteStore`."""

    def __init__(self, connection: SQLiteConnection) -> None:
        self.connection = connection

    async def search_runs(
        self, namespace: str, where: RunFilter, *, before: str | None = None, limit: int = 50,
    ) -> list[Run]:
        sql, args = search_sql(namespace, where, before, limit)
        return [_run(row) for row in self.connection.db.execute(sql, args).fetchall()]

    async def inspect_run(self, run_id: str, tree_limit: int = 200) -> RunRecord | None:
        db = self.connection.db
        db.execute("BEGIN")        # deferred: one snapshot for the reads, no write lock
        try:
            row = db.execute(_Q["get_run"], {"id": run_id}).fetchone()
            if row is None:
                return None
            run = _run(row)
            one = {"run_id": run_id}
            root = run if run.id == run.root_id else (
                None if (r := db.execute(_Q["get_run"], {"id": run.root_id}).fetchone()) is None
                else _run(r))
            children = db.execute(_Q["inspect_children"], {
                "root_id": run.root_id, "limit": max(0, tree_limit - 1)}).fetchall()
            return RunRecord(
                run=run,
                steps=tuple(StepRecord(r["seq"], r["name"], _json.loads(r["output"]),
                                       bool(r["finished"]), r["epoch"], r["finished_at"],
                                       r["started_at"], r["attempt"], r["retries"])
                            for r in db.execute(_Q["inspect_steps"], one)),
                signals=tuple(SignalRecord(r["id"], r["name"], _json.loads(r["payload"]),
                                           r["created_at"], bool(r["consumed"]))
                              for r in db.execute(_Q["inspect_signals"], one)),
                pauses=tuple(_pause(r) for r in db.execute(_Q["inspect_pauses"], one)),
                outbox=tuple(_entry(r) for r in db.execute(_Q["inspect_outbox"], one)),
                tree=tuple(([root] if root is not None and tree_limit > 0 else [])
                           + [_run(r) for r in children])[:tree_limit])
        finally:
            db.execute("COMMIT")

    async def run_owners(self, namespace: str, limit: int = 1000) -> list[RunOwner]:
        rows = self.connection.db.execute(_Q["run_owners"], {"namespace": namespace,
                                                             "limit": limit}).fetchall()
        return [RunOwner(r["owner"], r["running"], r["lease_until"]) for r in rows]

    async def finished_per_minute(
        self, namespace: str, since: float, minutes: int
    ) -> list[int]:
        counts = [0] * minutes
        for row in self.connection.db.execute(_Q["finished_per_minute"], {
                "namespace": namespace, "since": since, "until": since + 60 * minutes}):
            if 0 <= row["minute"] < minutes:
                counts[row["minute"]] += row["n"]
        return counts


# runs_status's statuses (schema version 15)
RARE_STATUSES = frozenset({"failed", "cancelled", "sleeping", "waiting", "interrupted"})


def search_sql(namespace: str, where: RunFilter, before: str | None,
               limit: int) -> tuple[str, list[Any]]:
    """``search_runs`` as one statement, walking the narrowest index of its filters newest
    first: a key's, the status's (runs_status holds the statuses runs pass through rarely), or
    the namespace's."""
    terms, args = ["namespace = ?"], list[Any]([namespace])
    for column, value in (("status", where.status), ("workflow", where.workflow),
                          ("tenant", where.tenant), ("idempotency_key", where.idempotency_key),
                          ("concurrency_key", where.concurrency_key)):
        if value is not None:
            terms.append(f"{column} = ?")
            args.append(value)
    bounds: tuple[tuple[str, object], ...] = (
        ("created_at >= ?", where.created_from), ("created_at < ?", where.created_to),
        ("id < ?", before))
    for term, bound in bounds:
        if bound is not None:
            terms.append(term)
            args.append(bound)
    if where.idempotency_key is not None:
        index = "runs_idempotency_key"
        terms.append("idempotency_key IS NOT NULL")
    elif where.concurrency_key is not None:
        index = "runs_concurrency_key"
        terms.append("concurrency_key IS NOT NULL")
    elif where.status in RARE_STATUSES:
        index = "runs_status"
        # the partial index's own term
        terms.append("status IN ('failed', 'cancelled', 'sleeping', 'waiting', 'interrupted')")
    else:
        index = "runs_namespace"
    sql = (f"SELECT * FROM runs INDEXED BY {index} WHERE {' AND '.join(terms)} "
           f"ORDER BY id DESC LIMIT ?")
    return sql, [*args, limit]
