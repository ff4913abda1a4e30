"""What a console reads of the PostgreSQL store's runs (:class:`shoal.ports.RunInspection`)."""

from __future__ import annotations

from typing import Any, LiteralString

from psycopg import sql
from psycopg.rows import DictRow

from shoal import _json
from shoal.backends.postgres.connections import Connections, Q
from shoal.backends.postgres.records import entry_of, pause_of, run_of
from shoal.types import Run, RunFilter, RunOwner, RunRecord, SignalRecord, StepRecord

# runs_status's statuses (schema version 15)
RARE_STATUSES = frozenset({"failed", "cancelled", "sleeping", "waiting", "interrupted"})


class PostgresInspection:
    """Searches and whole records of runs, on ``db``."""

    def __init__(self, db: Connections) -> None:
        self.db = db

    async def search_runs(
        self, namespace: str, where: RunFilter, *, before: str | None = None, limit: int = 50,
    ) -> list[Run]:
        query, args = _search_sql(namespace, where, before, limit)
        return [run_of(row) for row in await self.db.all(query, args)]

    async def inspect_run(self, run_id: str, tree_limit: int = 200) -> RunRecord | None:
        one = {"run_id": run_id}
        async with self.db.connection() as conn, self.db.transaction(conn, snapshot=True):
            # one snapshot for every read below

            async def rows(name: str, args: dict[str, Any]) -> list[DictRow]:
                return await (await conn.execute(Q[name], args)).fetchall()

            found = await rows("get_run", {"id": run_id})
            if not found:
                return None
            run = run_of(found[0])
            root = [run] if run.id == run.root_id else [
                run_of(r) for r in await rows("get_run", {"id": run.root_id})]
            children = await rows("inspect_children", {"root_id": run.root_id,
                                                        "limit": max(0, tree_limit - 1)})
            return RunRecord(
                run=run,
                steps=tuple(StepRecord(r["seq"], r["name"], _json.loads(r["output"]),
                                       bool(r["finished"]), r["epoch"], r["finished_at"],
                                       r["started_at"], r["attempt"], r["retries"])
                            for r in await rows("inspect_steps", one)),
                signals=tuple(SignalRecord(r["id"], r["name"], _json.loads(r["payload"]),
                                           r["created_at"], bool(r["consumed"]))
                              for r in await rows("inspect_signals", one)),
                pauses=tuple(pause_of(r) for r in await rows("inspect_pauses", one)),
                outbox=tuple(entry_of(r) for r in await rows("inspect_outbox", one)),
                tree=tuple((root if tree_limit > 0 else []) + [run_of(r) for r in children]
                           )[:tree_limit])

    async def run_owners(self, namespace: str, limit: int = 1000) -> list[RunOwner]:
        rows = await self.db.all(Q["run_owners"], {"namespace": namespace, "limit": limit})
        return [RunOwner(r["owner"], r["running"], r["lease_until"]) for r in rows]

    async def finished_per_minute(
        self, namespace: str, since: float, minutes: int
    ) -> list[int]:
        counts = [0] * minutes
        for row in await self.db.all(Q["finished_per_minute"], {
                "namespace": namespace, "since": since, "until": since + 60 * minutes}):
            if 0 <= row["minute"] < minutes:
                counts[row["minute"]] += row["n"]
        return counts


def _search_sql(namespace: str, where: RunFilter, before: str | None,
                limit: int) -> tuple[sql.Composed, dict[str, Any]]:
    """``search_runs`` as one statement; the terms that name a partial index's own condition
    (runs_status: the statuses runs pass through rarely; a key's: the key is not null) let the
    planner walk it newest first."""
    terms: list[sql.Composable] = [sql.SQL("namespace = %(namespace)s")]
    args: dict[str, Any] = {"namespace": namespace, "limit": limit}
    for column, value in (("status", where.status), ("workflow", where.workflow),
                          ("tenant", where.tenant), ("idempotency_key", where.idempotency_key),
                          ("concurrency_key", where.concurrency_key)):
        if value is not None:
            terms.append(sql.SQL("{} = {}").format(sql.Identifier(column),
                                                   sql.Placeholder(column)))
            args[column] = value
    bounds: tuple[tuple[str, LiteralString, object], ...] = (
        ("created_from", "created_at >= %(created_from)s", where.created_from),
        ("created_to", "created_at < %(created_to)s", where.created_to),
        ("before", "id < %(before)s", before))
    for name, term, bound in bounds:
        if bound is not None:
            terms.append(sql.SQL(term))
            args[name] = bound
    if where.idempotency_key is not None:
        terms.append(sql.SQL("idempotency_key IS NOT NULL"))
    if where.concurrency_key is not None:
        terms.append(sql.SQL("concurrency_key IS NOT NULL"))
    if where.status in RARE_STATUSES:
        terms.append(sql.SQL("status IN ('failed', 'cancelled', 'sleeping', 'waiting', "
                             "'interrupted')"))
    query = sql.SQL("SELECT * FROM runs WHERE {} ORDER BY id DESC LIMIT %(limit)s").format(
        sql.SQL(" AND ").join(terms))
    return query, args
