"""The run queue (:class:`shoal.ports.RunQueue`, :class:`shoal.ports.WorkflowRegistry`,
:class:`shoal.ports.TransactionalDispatch`) in the SQLite store's tables: creating runs (in the
store's transaction or in the caller's), claiming them, renewing, settling and releasing their
leases, recovering, cancelling and retrying them, and the counts kept of them. Settlements and
releases go through the group commit (:mod:`shoal.backends.sqlite.batches`), with the
checkpoints of other runs.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from shoal import _json
from shoal.backends._batches import (
    Key,
    answers,
    firsts,
    held_flags,
    key_of,
    namespace_of,
    queued_run,
)
from shoal.backends._fairness import fair_workflows
from shoal.backends._flow import Shares
from shoal.backends._sql import queries
from shoal.backends._stats import keep, since, stats_from_rows
from shoal.backends.sqlite import flow as flow_sql
from shoal.backends.sqlite import joined
from shoal.backends.sqlite.batches import GroupCommit
from shoal.backends.sqlite.connection import SQLiteConnection, unavailable_on_failure
from shoal.backends.sqlite.rows import _run
from shoal.errors import AdmissionRejectedError
from shoal.types import (
    JSON,
    WORKFLOW_INSTANCE_RETENTION,
    Fence,
    FlowLimits,
    NewRun,
    PausedWorkflow,
    Renewal,
    Run,
    Settlement,
    Stats,
    WorkflowInfo,
)

_Q = queries("sqlite")


def _limited(text: str) -> str:
    """``claim_candidates`` for workflows that allow several runs of a key at once: a queued
    run's key is free while fewer than its workflow's limit (``:limits``, a JSON object; 1 for
    a workflow it leaves out) hold it."""
    start = text.index("NOT EXISTS (\n                SELECT 1 FROM runs o")
    end = text.index("'interrupted')))", start) + len("'interrupted')")
    holders = text[start + len("NOT EXISTS ("):end]
    text = (text[:start] + f"(SELECT count(*) FROM ({holders})) < coalesce(("
            "SELECT value FROM json_each(:limits) WHERE key = r.workflow), 1)" + text[end + 1:])
    return text


_Q["claim_candidates_limited"] = _limited(_Q["claim_candidates"])
# a claimer with flow rules (flow=): the same with what the rules hold back skipped by the scan
_Q["claim_candidates_flow"] = flow_sql.derive(_Q["claim_candidates"])
_Q["claim_candidates_limited_flow"] = flow_sql.derive(_Q["claim_candidates_limited"])
_QG = queries("sqlite", "graphs.sql")


@unavailable_on_failure
class SQLiteRuns:
    """Runs and workflows for :class:`~shoal.backends.sqlite.SQLiteStore`."""

    def __init__(self, connection: SQLiteConnection, writes: GroupCommit) -> None:
        self.connection = connection
        self.writes = writes   # shared with the checkpoints (SQLiteSteps)

    async def register_workflows(
        self, namespace: str, workflows: Mapping[str, JSON], now: float,
        instance: str | None = None,
    ) -> None:
        async with self.connection.tx() as db:
            for name, options in workflows.items():
                args = {"namespace": namespace, "name": name, "options": _json.dumps(options),
                        "now": now, "instance": instance}
                db.execute(_Q["register_workflow"], args)
                if instance is not None:
                    db.execute(_Q["register_workflow_instance"], args)
            if instance is not None:
                db.execute(_Q["forget_workflow_instances"], {
                    "namespace": namespace, "before": now - WORKFLOW_INSTANCE_RETENTION})

    async def get_workflow(self, namespace: str, name: str) -> JSON:
        row = self.connection.one(_Q["get_workflow"], {"namespace": namespace, "name": name})
        return None if row is None else _json.loads(row["options"])

    async def list_workflows(self, namespace: str | None) -> list[WorkflowInfo]:
        args = {"namespace": namespace}
        served: dict[tuple[str, str], list[tuple[str, float]]] = {}
        for row in self.connection.db.execute(_Q["list_workflow_instances"], args).fetchall():
            served.setdefault((row["namespace"], row["workflow"]), []).append(
                (row["instance"], row["registered_at"]))
        return [WorkflowInfo(row["namespace"], row["name"], _json.loads(row["options"]),
                             row["registered_at"],
                             tuple(served.get((row["namespace"], row["name"]), ())))
                for row in self.connection.db.execute(_Q["list_workflows"], args).fetchall()]

    async def pause_workflow(
        self, namespace: str, workflow: str, tenant: str | None, now: float
    ) -> bool:
        async with self.connection.tx() as db:
            return db.execute(_Q["pause_workflow"], _paused(namespace, workflow, tenant, now)
                              ).rowcount == 1

    async def resume_workflow(
        self, namespace: str, workflow: str, tenant: str | None, now: float
    ) -> bool:
        # the delete changes the file: waiting claimers (data_version) look again
        async with self.connection.tx() as db:
            return db.execute(_Q["resume_workflow"], _paused(namespace, workflow, tenant, now)
                              ).rowcount == 1

    async def paused_workflows(self, namespace: str) -> list[PausedWorkflow]:
        rows = self.connection.db.execute(_Q["paused_workflows"],
                                          {"namespace": namespace}).fetchall()
        return [PausedWorkflow(row["workflow"], row["tenant"] or None, row["paused_at"])
                for row in rows]

    async def set_tenant_weight(self, namespace: str, tenant: str, weight: float) -> None:
        args = {"namespace": namespace, "tenant": tenant, "weight": float(weight)}
        async with self.connection.tx() as db:
            db.execute(_Q["clear_tenant_weight" if weight == 1 else "set_tenant_weight"], args)

    async def tenant_weights(self, namespace: str) -> dict[str, float]:
        rows = self.connection.db.execute(_Q["tenant_weights"],
                                          {"namespace": namespace}).fetchall()
        return {row["tenant"]: row["weight"] for row in rows}

    async def create_run(
        self, new: NewRun, *, max_queued: int | None, admission: str
    ) -> tuple[Run, bool]:
        async with self.connection.tx() as db:
            row, created = _create_run(db.cursor(), _Q, new, max_queued, admission)
            return _run(row), created

    async def create_run_in(
        self, connection: object, new: NewRun, *, max_queued: int | None, admission: str
    ) -> tuple[Run, bool]:
        """``create_run`` in the transaction of the caller's ``sqlite3`` connection (see
        :mod:`shoal.backends.sqlite.joined`); its errors are the caller's connection's."""
        name = joined.caller_schema(connection, self.connection.path)
        assert isinstance(connection, sqlite3.Connection)
        cur = connection.cursor()
        cur.row_factory = sqlite3.Row
        try:
            q = {n: joined.query(n, name) for n in ("find_idempotent", "count_queued",
                                                   "insert_run")}
            row, created = _create_run(cur, q, new, max_queued, admission)
        finally:
            cur.close()
        return _run(row), created

    async def create_runs(
        self, news: Sequence[NewRun], *, max_queued: int | None, admission: str
    ) -> list[tuple[Run, bool]]:
        if not news:
            return []
        namespace = namespace_of(news)
        async with self.connection.tx() as db:
            return _create_runs(db.cursor(), _Q, namespace, news, max_queued, admission)

    async def create_runs_in(
        self, connection: object, news: Sequence[NewRun], *, max_queued: int | None,
        admission: str,
    ) -> list[tuple[Run, bool]]:
        """``create_runs`` in the transaction of the caller's ``sqlite3`` connection, with its
        statements (see :mod:`shoal.backends.sqlite.joined`); its errors are the caller's
        connection's. A connection outside a transaction (Python's default mode, before its
        first write) gets one begun with the write lock, so that no other writer takes a key
        between the lookup and the insert; when nothing is inserted it is ended again, as the
        caller had it."""
        name = joined.caller_schema(connection, self.connection.path)
        assert isinstance(connection, sqlite3.Connection)
        if not news:
            return []
        namespace = namespace_of(news)
        q = {n: joined.query(n, name) for n in ("find_idempotent", "count_queued",
                                               "insert_runs")}
        began = joined.begin(connection)
        cur = connection.cursor()
        cur.row_factory = sqlite3.Row
        answered: list[tuple[Run, bool]] = []
        try:
            # a savepoint: a batch that fails half-way leaves none of its rows to the caller
            cur.execute("SAVEPOINT shoal_create_runs")
            try:
                answered = _create_runs(cur, q, namespace, news, max_queued, admission)
            except BaseException:
                if connection.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        cur.execute("ROLLBACK TO shoal_create_runs")
                        cur.execute("RELEASE shoal_create_runs")
                raise
            cur.execute("RELEASE shoal_create_runs")
        finally:
            cur.close()
            if began and not any(created for _, created in answered) \
                    and connection.in_transaction:
                connection.rollback()
        return answered

    async def incompatible_runs(
        self, namespace: str, workflows: Sequence[str], version: str | None,
        any_version: Sequence[str], now: float, limit: int = 100,
    ) -> list[Run]:
        rows = self.connection.db.execute(_Q["incompatible_runs"], {
            "namespace": namespace, "workflows": _json.dumps(list(workflows)),
            "any_version": _json.dumps(list(any_version)), "version": version, "now": now,
            "limit": limit}).fetchall()
        return [_run(row) for row in rows]

    async def get_run(self, run_id: str) -> Run | None:
        row = self.connection.one(_Q["get_run"], {"id": run_id})
        return None if row is None else _run(row)

    async def list_runs(
        self,
        namespace: str | None,
        *,
        status: str | None = None,
        workflow: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[Run]:
        where, args = [], []
        for column, value in (("namespace", namespace), ("status", status),
                              ("workflow", workflow), ("tenant", tenant)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if after is not None:
            where.append("id > ?")
            args.append(after)
        sql = "SELECT * FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id LIMIT ?"
        rows = self.connection.db.execute(sql, [*args, limit]).fetchall()
        return [_run(row) for row in rows]

    async def claim_runs(
        self,
        namespace: str,
        workflows: Sequence[str],
        owner: str,
        limit: int,
        lease: float,
        now: float,
        *,
        version: str | None = None,
        any_version: Sequence[str] = (),
        concurrency_limits: Mapping[str, int] | None = None,
        flow: Mapping[str, FlowLimits] | None = None,
    ) -> list[Run]:
        if limit <= 0 or not workflows:
            return []
        # A plain read first: an idle poll takes no write lock. The write transaction uses its
        # rows unless the file changed in between, rather than running the query again.
        args = _claim_args(namespace, workflows, limit, now, version, any_version,
                           concurrency_limits)
        query = _Q["claim_candidates_limited" if "limits" in args else "claim_candidates"]
        seen = self.connection.changes()   # before the read: a commit after it is seen as a change
        candidates = self.connection.db.execute(query, args).fetchall()
        if not candidates:
            return []   # (a flow claim's candidates are a part of these)
        async with self.connection.tx() as db:
            if flow:
                return self._claim_flow(db, args, owner, limit, lease, now, version,
                                        concurrency_limits, flow)
            if self.connection.changes() != seen:
                candidates = db.execute(query, args).fetchall()
            return self._claim_candidates(db, candidates, owner, limit, lease, now, version,
                                          concurrency_limits)

    def _claim(
        self, db: sqlite3.Connection, namespace: str, workflows: Sequence[str], owner: str,
        limit: int, lease: float, now: float, version: str | None, any_version: Sequence[str],
        concurrency_limits: Mapping[str, int] | None,
        flow: Mapping[str, FlowLimits] | None = None,
    ) -> list[Run]:
        """``claim_runs``' statements, in the caller's write transaction."""
        if limit <= 0 or not workflows:
            return []
        args = _claim_args(namespace, workflows, limit, now, version, any_version,
                           concurrency_limits)
        if flow:
            return self._claim_flow(db, args, owner, limit, lease, now, version,
                                    concurrency_limits, flow)
        query = _Q["claim_candidates_limited" if "limits" in args else "claim_candidates"]
        candidates = db.execute(query, args).fetchall()
        return self._claim_candidates(db, candidates, owner, limit, lease, now, version,
                                      concurrency_limits)

    def _claim_flow(
        self, db: sqlite3.Connection, args: dict[str, Any], owner: str, limit: int,
        lease: float, now: float, version: str | None,
        concurrency_limits: Mapping[str, int] | None, flow: Mapping[str, FlowLimits],
    ) -> list[Run]:
        """The claim of a claimer with flow rules, in the write transaction ``db`` (see
        :mod:`~shoal.backends.sqlite.flow`): the flow query, walked with the shares counted in
        ``db``, again while the walk filled a workflow, tenant or window and the scan left runs
        behind."""
        query = _Q["claim_candidates_limited_flow" if "limits" in args
                   else "claim_candidates_flow"]
        held = flow_sql.shares(db, args["namespace"], flow, now)
        fair = fair_workflows(flow, _json.loads(args["workflows"]))
        ids: list[str] = []
        keys: set[tuple[str, str]] = set()
        taken: Counter[tuple[str, str]] = Counter()   # by an earlier round, under fairness
        unkeyed: set[str] = set()   # first starts of a rated workflow without a rate key
        while True:
            values = flow_sql.args(args, flow, now, held, ids)
            if fair:
                rows = flow_sql.fair_candidates(db, query, values, fair, taken, limit)
            else:
                rows = db.execute(query, values).fetchall()
            before = len(ids)
            cut = _choose(db, rows, limit, concurrency_limits, ids, keys, held)
            unkeyed.update(r["id"] for r in rows if r["rate_key"] is None
                           and r["started_at"] is None and r["workflow"] in held.rates)
            if fair:
                chosen = set(ids[before:])
                taken.update((r["workflow"], r["tenant"]) for r in rows if r["id"] in chosen)
            if len(ids) >= limit or not cut or len(rows) < args["scan"]:
                break
        if unkeyed := unkeyed.intersection(ids):
            # dispatched before its workflow had a rate: its first start counts under ''
            db.execute(flow_sql.NO_RATE_KEY, {"ids": _json.dumps(sorted(unkeyed))})
        return self._claim_ids(db, ids, owner, lease, now, version)

    def _claim_candidates(
        self, db: sqlite3.Connection, candidates: list[sqlite3.Row], owner: str, limit: int,
        lease: float, now: float, version: str | None,
        concurrency_limits: Mapping[str, int] | None = None,
    ) -> list[Run]:
        """Claim the first ``limit`` of ``candidates`` (``claim_candidates``' rows as the
        write transaction ``db`` sees them), one run per concurrency key that has not started
        before; with ``concurrency_limits``, each such run takes a free slot of its key."""
        ids: list[str] = []
        _choose(db, candidates, limit, concurrency_limits, ids, set())
        return self._claim_ids(db, ids, owner, lease, now, version)

    def _claim_ids(self, db: sqlite3.Connection, ids: list[str], owner: str, lease: float,
                   now: float, version: str | None) -> list[Run]:
        """Set the runs ``ids`` running under ``owner``: the claim's update."""
        if not ids:
            return []
        rows = db.execute(_Q["claim"], {
            "owner": owner, "expires": now + self.connection.waited + lease, "now": now,
            "version": version, "ids": _json.dumps(ids)}).fetchall()
        return sorted((_run(r) for r in rows), key=lambda r: (-r.priority, r.created_at, r.id))

    async def renew_leases(
        self, owner: str, leases: dict[str, int], lease: float, now: float
    ) -> Renewal:
        renewed, cancel = set(), set()
        if leases:
            async with self.connection.tx() as db:
                for run_id, epoch in leases.items():
                    row = db.execute(_Q["renew"], {"expires": now + self.connection.waited + lease,
                                                   "id": run_id,
                                                   "owner": owner, "epoch": epoch}).fetchone()
                    if row is not None:
                        renewed.add(run_id)
                        if row["cancel_requested"]:
                            cancel.add(run_id)
        return Renewal(frozenset(renewed), frozenset(cancel))

    async def settle_run(self, fence: Fence, settlement: Settlement, now: float) -> bool:
        return await self.writes.write(lambda db: _settle(db, fence, settlement, now))

    async def settle_and_claim(
        self,
        settlements: Sequence[tuple[Fence, Settlement, float]],
        namespace: str,
        workflows: Sequence[str],
        owner: str,
        limit: int,
        lease: float,
        now: float,
        *,
        version: str | None = None,
        any_version: Sequence[str] = (),
        concurrency_limits: Mapping[str, int] | None = None,
        flow: Mapping[str, FlowLimits] | None = None,
    ) -> tuple[list[bool], list[Run]]:
        if not settlements:
            return [], await self.claim_runs(namespace, workflows, owner, limit, lease, now,
                                             version=version, any_version=any_version,
                                             concurrency_limits=concurrency_limits, flow=flow)

        # One transaction (shared with the checkpoints queued meanwhile): each settlement
        # fenced on its own, then the claim, which sees the slots and keys they freed.
        def write(db: sqlite3.Connection) -> tuple[list[bool], list[Run]]:
            held = [_settle(db, fence, settlement, at) for fence, settlement, at in settlements]
            return held, self._claim(db, namespace, workflows, owner, limit, lease, now,
                                     version, any_version, concurrency_limits, flow)

        return await self.writes.write(write)

    async def release_run(self, fence: Fence, now: float) -> bool:
        # a stopping instance releases its runs at once: together
        return await self.writes.write(lambda db: db.execute(_Q["release"], {
            "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch}).rowcount == 1)

    async def recover_runs(self, namespace: str, now: float) -> list[Run]:
        args = {"namespace": namespace, "now": now}
        if self.connection.one(_Q["anything_to_recover"], args) is None:
            return []
        async with self.connection.tx() as db:
            rows = [*db.execute(_Q["recover_crashed_final"], args).fetchall(),
                    *db.execute(_Q["recover_crashed"], args).fetchall(),
                    *db.execute(_Q["recover_cancelled_interrupted"], args).fetchall(),
                    *db.execute(_Q["recover_interrupted"], args).fetchall()]
        return [_run(r) for r in rows]

    async def cancel_run(self, run_id: str, now: float) -> Run | None:
        async with self.connection.tx() as db:
            root = db.execute(_Q["get_run"], {"id": run_id}).fetchone()
            if (root is not None and root["id"] == root["root_id"]
                    and root["status"] not in ("succeeded", "failed", "cancelled")):
                for child in db.execute(_Q["cancel_tree_now"],
                                        {"id": run_id, "now": now}).fetchall():
                    db.execute(_Q["cancel_pauses_of_run"], {"run_id": child["id"], "now": now})
                db.execute(_Q["cancel_tree_request"], {"id": run_id})
            row = db.execute(_Q["cancel_now"], {"id": run_id, "now": now}).fetchone()
            if row is not None:
                db.execute(_Q["cancel_pauses_of_run"], {"run_id": run_id, "now": now})
            if row is None:
                row = db.execute(_Q["cancel_request"], {"id": run_id}).fetchone()
            if row is None:
                row = db.execute(_Q["get_run"], {"id": run_id}).fetchone()
            return None if row is None else _run(row)

    async def retry_run(
        self, namespace: str, run_id: str, tenant: str | None, now: float
    ) -> tuple[Run | None, bool]:
        async with self.connection.tx() as db:
            row = db.execute(_Q["get_run"], {"id": run_id}).fetchone()
            if row is None or row["namespace"] != namespace or (
                    tenant is not None and row["tenant"] != tenant):
                return None, False
            retried = db.execute(_Q["retry"], {"id": run_id, "now": now}).fetchone()
            if retried is None:
                return _run(row), False
            db.execute(_Q["uncount_retried"], {
                "namespace": row["namespace"], "workflow": row["workflow"],
                "status": row["status"], "finished_at": row["finished_at"]})
            db.execute(_Q["retry_drop_unfinished"], {"id": run_id})
            return _run(retried), True

    async def release_held(self, namespace: str, max_queued: int, now: float) -> int:
        counts = self.connection.one(_Q["count_queued"], {"namespace": namespace})
        assert counts is not None
        queued, parked = counts
        if parked == 0 or queued >= max_queued:
            return 0
        async with self.connection.tx() as db:
            queued, parked = db.execute(_Q["count_queued"], {"namespace": namespace}).fetchone()
            n = min(parked, max_queued - queued)
            if n <= 0:
                return 0
            return db.execute(_Q["release_held"], {"namespace": namespace, "n": n}).rowcount

    async def prune_runs(self, namespace: str, before: float, limit: int) -> int:
        args = {"namespace": namespace, "before": before, "limit": limit}
        if self.connection.one(_Q["prunable"], args) is None:
            return 0
        async with self.connection.tx() as db:
            ids = [row[0] for row in db.execute(_Q["prunable"], args)]
            batch = {"ids": _json.dumps(ids)}
            db.execute(_Q["prune_steps"], batch)
            db.execute(_Q["prune_outbox"], batch)
            db.execute(_Q["prune_signals"], batch)
            db.execute(_QG["graph_prune_run_writes"], batch)
            db.execute(_QG["graph_prune_run_checkpoints"], batch)
            return db.execute(_Q["prune_runs"], batch).rowcount

    async def stats(self, namespace: str, now: float) -> Stats:
        rows = self.connection.db.execute(_Q["stats"], {"namespace": namespace, "now": now,
                                                        "since": since(now)}).fetchall()
        return stats_from_rows(namespace, now, rows)

    async def fold_stats(self, namespace: str, now: float) -> None:
        args = {"namespace": namespace, "keep": keep(now)}
        sums = self.connection.db.execute(_Q["fold_sums"], args).fetchall()
        if not any(row["todo"] for row in sums):
            return   # nothing to fold: no write lock taken
        async with self.connection.tx() as db:
            sums = db.execute(_Q["fold_sums"], args).fetchall()
            db.execute(_Q["fold_delete"], args)
            db.executemany(_Q["fold_insert"], [
                {"namespace": namespace, "workflow": row["workflow"], "status": row["status"],
                 "folded": row["folded"], "n": row["n"]} for row in sums if row["n"]])


def _paused(namespace: str, workflow: str, tenant: str | None, now: float) -> dict[str, Any]:
    """The arguments of the paused_workflows statements ('' stands for every tenant)."""
    return {"namespace": namespace, "workflow": workflow, "tenant": tenant or "", "now": now}


def _claim_args(namespace: str, workflows: Sequence[str], limit: int, now: float,
                version: str | None, any_version: Sequence[str],
                concurrency_limits: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The arguments of ``claim_candidates`` (of ``claim_candidates_limited``, with
    ``limits``, when some workflow allows more than one run of a key)."""
    args = {"namespace": namespace, "workflows": _json.dumps(list(workflows)), "now": now,
            "scan": limit * 4 + 16, "version": version,
            "any_version": _json.dumps(list(any_version))}
    if concurrency_limits:
        args["limits"] = _json.dumps(dict(concurrency_limits))
    return args


def _choose(db: sqlite3.Connection, candidates: list[sqlite3.Row], limit: int,
            concurrency_limits: Mapping[str, int] | None, ids: list[str],
            keys: set[tuple[str, str]], held: Shares | None = None) -> bool:
    """Add to ``ids`` the ``candidates`` (in claim order) the claim takes, up to ``limit`` in
    all: one run per concurrency key that has not started before (``keys``: those taken); with
    ``concurrency_limits``, each such run takes a free slot of its key; with ``held``, a run of
    a workflow or tenant with no share left, or a first start of a full window, is skipped and
    each run taken holds a share (a place of its window). True when the shares skipped a run."""
    cut = False
    for row in candidates:
        if len(ids) >= limit:
            break
        first = row["started_at"] is None
        if held is not None and not held.fits(row["workflow"], row["tenant"], row["rate_key"],
                                              first):
            cut = True
            continue
        key = row["concurrency_key"]
        # a run that started before holds its key already (with others, under a limit
        # lowered since they started)
        if key is not None and row["started_at"] is None:
            if (row["workflow"], key) in keys:
                continue
            keys.add((row["workflow"], key))
            if concurrency_limits:
                _take_key_slot(db, row, concurrency_limits.get(row["workflow"], 1))
        if held is not None:
            held.take(row["workflow"], row["tenant"], row["rate_key"], first)
        ids.append(row["id"])
    return cut


def _take_key_slot(db: sqlite3.Connection, row: sqlite3.Row, n: int) -> None:
    """Give the unstarted run of ``row`` the smallest slot of its key in [0, n) that no holder
    takes (the candidates query saw fewer than n holders: one is free)."""
    run = db.execute(_Q["get_run"], {"id": row["id"]}).fetchone()
    taken = {r["key_slot"] for r in db.execute(_Q["key_slots"], {
        "namespace": run["namespace"], "workflow": row["workflow"],
        "key": row["concurrency_key"]})}
    slot = min(set(range(n)) - taken, default=0)
    db.execute(_Q["take_key_slot"], {"slot": slot, "id": row["id"]})


def _settle(db: sqlite3.Connection, fence: Fence, settlement: Settlement, now: float) -> bool:
    """``settle_run``'s statement, in the caller's write transaction."""
    outcome = settlement.outcome
    cur = db.execute(_Q["settle"], {
        "status": "queued" if outcome == "retry" else outcome,
        "output": _json.dumps(settlement.output) if outcome == "succeeded" else None,
        "error": settlement.error, "traceback": settlement.traceback,
        "finished_at": None if outcome == "retry" else now,
        "run_at": settlement.run_at if outcome == "retry" else now,
        "attempt_inc": 1 if outcome == "retry" else 0,
        "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
    })
    return cur.rowcount == 1


def _create_run(
    cur: sqlite3.Cursor, q: Mapping[str, str], new: NewRun, max_queued: int | None,
    admission: str,
) -> tuple[sqlite3.Row, bool]:
    """``create_run``'s statements (``q``: the named ones) on ``cur``, in its connection's
    transaction: the store's own write transaction, or a caller's."""
    args = {"namespace": new.namespace, "tenant": new.tenant, "workflow": new.workflow,
            "idempotency_key": new.idempotency_key}
    if new.idempotency_key is not None:
        row = cur.execute(q["find_idempotent"], args).fetchone()
        if row is not None:
            return row, False
    held = 0
    if max_queued is not None:
        queued, parked = cur.execute(q["count_queued"], {"namespace": new.namespace}).fetchone()
        if queued >= max_queued or parked > 0:
            if admission == "reject":
                raise AdmissionRejectedError(new.namespace, max_queued)
            held = 1
    try:
        row = cur.execute(q["insert_run"], {
            "id": new.id, "namespace": new.namespace, "tenant": new.tenant,
            "workflow": new.workflow, "input": _json.dumps(new.input),
            "priority": new.priority, "created_at": new.created_at, "run_at": new.run_at,
            "max_attempts": new.max_attempts, "concurrency_key": new.concurrency_key,
            "idempotency_key": new.idempotency_key, "version": new.version,
            "parent_id": new.parent_id, "root_id": new.root_id or new.id, "held": held,
            "trace_context": new.trace_context, "rate_key": new.rate_key,
        }).fetchone()
    except sqlite3.IntegrityError:
        # a caller's transaction that read before another committed the same key (the store's
        # own write transaction holds the lock from its first read: never there)
        row = cur.execute(q["find_idempotent"], args).fetchone() \
            if new.idempotency_key is not None else None
        if row is None:
            raise
        return row, False
    return row, True


def _create_runs(
    cur: sqlite3.Cursor, q: Mapping[str, str], namespace: str, news: Sequence[NewRun],
    max_queued: int | None, admission: str,
) -> list[tuple[Run, bool]]:
    """``create_runs``' statements (``q``: the named ones) on ``cur``, in a transaction that
    holds the write lock: the store's own, or a caller's."""
    stored: dict[Key, Run] = {}
    for key in dict.fromkeys(k for k in map(key_of, news) if k is not None):
        row = cur.execute(q["find_idempotent"], {
            "namespace": namespace, "tenant": key[0], "workflow": key[1],
            "idempotency_key": key[2]}).fetchone()
        if row is not None:
            stored[key] = _run(row)
    fresh = [news[i] for i in firsts(news, stored)]
    queued = parked = 0
    if max_queued is not None and fresh:
        queued, parked = cur.execute(q["count_queued"], {"namespace": namespace}).fetchone()
    held = held_flags(namespace, len(fresh), queued, parked, max_queued, admission)
    rows = list(zip(fresh, held, (_json.dumps(n.input) for n in fresh), strict=True))
    cur.executemany(q["insert_runs"], [{
        "id": new.id, "namespace": namespace, "tenant": new.tenant,
        "workflow": new.workflow, "input": text, "priority": new.priority,
        "created_at": new.created_at, "run_at": new.run_at,
        "max_attempts": new.max_attempts, "concurrency_key": new.concurrency_key,
        "idempotency_key": new.idempotency_key, "version": new.version,
        "parent_id": new.parent_id, "root_id": new.root_id or new.id, "held": int(h),
        "trace_context": new.trace_context, "rate_key": new.rate_key,
    } for new, h, text in rows])
    inserted = {new.id: queued_run(new, h, text) for new, h, text in rows}
    return answers(news, inserted, stored)
