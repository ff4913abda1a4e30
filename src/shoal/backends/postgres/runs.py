"""The run queue of the PostgreSQL store (:class:`shoal.ports.RunQueue`): reading runs, claims,
leases, settlements (batched: :class:`~shoal.backends.postgres.batcher.Batcher`), recovery,
cancel and retry, retention and the counts of ``stats``."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.rows import tuple_row

from shoal import _json
from shoal.backends._stats import keep, since, stats_from_rows
from shoal.backends.postgres import flow as flow_sql
from shoal.backends.postgres.batcher import Batcher
from shoal.backends.postgres.connections import GENERIC_PLAN, RETRYABLE, Connections, Q
from shoal.backends.postgres.records import claimed, run_of
from shoal.types import Fence, FlowLimits, Renewal, Run, Settlement, Stats

log = logging.getLogger("shoal.store.postgres")

_HOLDERS = """SELECT 1 FROM runs h
                WHERE h.namespace = r.namespace AND h.workflow = r.workflow
                  AND h.concurrency_key = r.concurrency_key AND h.id <> r.id"""
_LIMIT = ("coalesce((SELECT l.n FROM unnest(%(limited)s::text[], %(limits)s::int[]) "
          "AS l(workflow, n) WHERE l.workflow = {run}.workflow), 1)")
_FREE_SLOT = """(SELECT coalesce(min(s.slot), 0) FROM generate_series(0, {limit} - 1) AS s(slot)
        WHERE NOT EXISTS (
            SELECT 1 FROM runs h
            WHERE h.namespace = runs.namespace AND h.workflow = runs.workflow
              AND h.concurrency_key = runs.concurrency_key AND h.key_slot = s.slot
              AND h.concurrency_key IS NOT NULL AND h.started_at IS NOT NULL
              AND h.status IN ('queued', 'running', 'sleeping', 'waiting', 'interrupted')))"""


def _limited(text: str) -> str:
    """``claim`` for workflows that allow several runs of a key at once (``%(limited)s`` with
    their ``%(limits)s``; 1 for a workflow left out): a queued run's key is free while fewer
    runs than the limit hold it, and its first start takes the smallest slot of the key no
    holder takes, so that runs_key_holder refuses a holder too many when claims race, as it
    does for one."""
    start = text.index("NOT EXISTS (\n                " + _HOLDERS[:20])
    end = text.index("'interrupted'))", start) + len("'interrupted')")
    holders = text[start + len("NOT EXISTS ("):end]
    assert _HOLDERS in holders
    text = (f"{text[:start]}(SELECT count(*) FROM ({holders}) k) < {_LIMIT.format(run='r')}"
            f"{text[end + 1:]}")
    slot = "key_slot = CASE WHEN runs.started_at IS NULL THEN 0 ELSE"
    assert text.count(slot) == 1
    return text.replace(slot, "key_slot = CASE WHEN runs.started_at IS NULL THEN "
                        + _FREE_SLOT.format(limit=_LIMIT.format(run="runs")) + " ELSE")


Q["claim_limited"] = _limited(Q["claim"])


def _compact(text: str) -> str:
    """``text`` without its comments, its indentation and the spaces around parentheses,
    commas and equal signs. psycopg caches the parsing of a statement's placeholders only below
    4 KB (a longer one is parsed again, in Python, on every execution), and the claims are
    sent every few milliseconds on a busy worker; their texts have no string literal that this
    would change."""
    compact = " ".join(re.sub(r"--[^\n]*", "", text).split())
    return re.sub(r" ?([(),=]) ?", r"\1", compact)


# the claims as they are sent (queries.sql keeps them readable, with their comments)
_CLAIM = _compact(Q["claim"])
_CLAIM_LIMITED = _compact(Q["claim_limited"])
assert len(_CLAIM.encode()) < 4096, len(_CLAIM)


@functools.cache
def _claim_flow_text(rules: frozenset[str], limited: bool) -> str:
    """The flow claim statement of a claimer whose ``flow`` has the rules ``rules`` (sent after
    flow_sql.LOCK; postgres/flow.py), from ``claim`` or (``limited``) ``claim_limited``: one
    text per combination, so that a claimer with one rule sends that rule's parts only."""
    return flow_sql.compact(_compact(flow_sql.derive(Q["claim_limited" if limited else "claim"],
                                                     rules)))


# below psycopg's 4 KB, the parsing of its placeholders cached (see _compact), as the plain
# claim's: a claimer with running caps alone. (A rate's is 4.2 KB, each claim_limited variant
# and each of two rules or more is longer: a claimer with those pays a parse of its placeholders.)
assert len(_claim_flow_text(frozenset({"caps"}), False).encode()) < 4096
# a flow claim's transaction runs its generic plan, without JIT, as the plain claim does: a
# claim of one run over 20,000 queued (analyzed), 20 tenants, went from 2.7-3.0 to 1.6-1.7 ms
# with caps, 3.9-4.1 to 1.9-2.4 ms with caps and a rate, 6.6-7.7 to 2.7 ms with fairness; with
# all three, 13-18 ms either way
_FLOW_GENERIC = True
_SETTLE_COLUMNS = ("id", "owner", "epoch", "status", "output", "error", "finished_at", "run_at",
                   "attempt_inc", "traceback")


class PostgresRuns:
    """Runs claimed, renewed, settled and recovered, on ``db``, announced on ``channel``."""

    def __init__(self, db: Connections, channel: str) -> None:
        self.db = db
        self.channel = channel
        self.settles = Batcher(db, channel, "settle", _SETTLE_COLUMNS)

    async def get_run(self, run_id: str) -> Run | None:
        row = await self.db.one(Q["get_run"], {"id": run_id})
        return None if row is None else run_of(row)

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
        where: list[sql.Composable] = []
        args: dict[str, Any] = {"limit": limit}
        for column, value in (("namespace", namespace), ("status", status),
                              ("workflow", workflow), ("tenant", tenant)):
            if value is not None:
                where.append(sql.SQL("{} = {}").format(sql.Identifier(column),
                                                       sql.Placeholder(column)))
                args[column] = value
        if after is not None:
            where.append(sql.SQL("id > %(after)s"))
            args["after"] = after
        query = sql.SQL("SELECT * FROM runs {} ORDER BY id LIMIT %(limit)s").format(
            sql.SQL("WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL(""))
        return [run_of(row) for row in await self.db.all(query, args)]

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
        args = _claim_args(namespace, workflows, owner, limit, lease, now, version,
                           any_version, concurrency_limits)
        flow = flow_sql.served(flow, workflows)
        if flow:
            return await self._claim_flow(args, flow)
        query = _CLAIM_LIMITED if "limits" in args else _CLAIM
        runs: list[Run] = []
        for _ in range(3):
            try:
                runs = claimed(*await self.db.tuples(query, args, hot=True))
                break
            except pg_errors.UniqueViolation:
                # Another claim of the same concurrency key committed after this statement's
                # snapshot: runs_key_holder refused the second holder. Claiming again sees it.
                log.debug("claim.key_race: claiming again")
            except RETRYABLE:
                log.debug("claim.retry")
        return runs

    async def _claim_flow(self, args: dict[str, Any],
                          flow: Mapping[str, FlowLimits]) -> list[Run]:
        """The claim of a claimer with flow rules (postgres/flow.py; ``flow``: those of the
        workflows it serves): one transaction, the advisory locks of its flowed workflows, then
        the flow claim statement of the rules ``flow`` has, again while its rank filters cut
        some of a batch that is not full."""
        rules = flow_sql.rules_of(flow)
        query = _claim_flow_text(rules, "limits" in args)
        lock = flow_sql.lock_args(args["namespace"], flow)
        args = {**args, **flow_sql.claim_args(flow, args["now"], rules)}
        limit = args["limit"]
        runs: list[Run] = []
        for _ in range(3):
            try:
                runs = await self.db.retry(functools.partial(
                    self._claim_flow_once, query, lock, args, limit))
                break
            except pg_errors.UniqueViolation:
                # a plain claimer of a concurrency key (one serving the workflow without its
                # flow rules: another version) committed after this statement's snapshot
                log.debug("claim.key_race: claiming again")
        return runs

    async def _claim_flow_once(self, query: Any, lock: dict[str, Any], args: dict[str, Any],
                               limit: int) -> list[Run]:
        runs: list[Run] = []
        async with self.db.connection(hot=True) as conn, self.db.transaction(conn):
            cur = conn.cursor(row_factory=tuple_row)
            if _FLOW_GENERIC and not self.db.stateless:
                # the claim's generic plan, without JIT, for this transaction (GENERIC_PLAN),
                # sent with the locks: one round trip
                async with conn.pipeline():
                    await conn.execute(GENERIC_PLAN)
                    await cur.execute(flow_sql.LOCK, lock)
            else:
                await self.db.execute(conn, cur, flow_sql.LOCK, lock)
            while len(runs) < limit:
                left = limit - len(runs)
                # scan: how far a fair claim's scans read (postgres/flow.py), as SQLite's do
                await self.db.execute(conn, cur, query,
                                      {**args, "limit": left, "scan": left * 4 + 16}, binary=True)
                names = [c.name for c in cur.description or ()]
                rows = await cur.fetchall()
                got = [r for r in rows if r[1] is not None]
                runs += claimed(names, got)
                if not rows[0][0] or not got:
                    break   # nothing cut: the batch is what the rules allow
        runs.sort(key=lambda r: (-r.priority, r.created_at, r.id))
        return runs

    async def incompatible_runs(
        self, namespace: str, workflows: Sequence[str], version: str | None,
        any_version: Sequence[str], now: float, limit: int = 100,
    ) -> list[Run]:
        if limit <= 0 or not workflows:
            return []
        rows = await self.db.all(Q["incompatible_runs"], {
            "namespace": namespace, "workflows": list(workflows), "version": version,
            "any_version": list(any_version), "now": now, "limit": limit})
        return [run_of(r) for r in rows]

    async def renew_leases(
        self, owner: str, leases: dict[str, int], lease: float, now: float
    ) -> Renewal:
        if not leases:
            return Renewal(frozenset(), frozenset())
        ids = sorted(leases)
        # urgent: a burst of other operations queued for a connection must not cost leases
        rows = await self.db.retry(lambda: self.db.all(Q["renew"], {
            "expires": now + lease, "owner": owner, "ids": ids,
            "epochs": [leases[i] for i in ids],
        }, urgent=True))
        return Renewal(frozenset(r["id"] for r in rows),
                       frozenset(r["id"] for r in rows if r["cancel_requested"]))

    async def settle_run(self, fence: Fence, settlement: Settlement, now: float) -> bool:
        return await self.settles.write(fence.run_id, _settle_row(fence, settlement, now))

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
        if limit <= 0 or not workflows:
            limit = 0
        flow = flow_sql.served(flow, workflows)
        if not settlements:
            return [], await self.claim_runs(namespace, workflows, owner, limit, lease, now,
                                             version=version, any_version=any_version,
                                             concurrency_limits=concurrency_limits, flow=flow)
        if len({f.run_id for f, _, _ in settlements}) < len(settlements):
            # two settlements of one run cannot share the statement: one by one, then claim
            held = [await self.settle_run(*item) for item in settlements]
            return held, await self.claim_runs(namespace, workflows, owner, limit, lease, now,
                                               version=version, any_version=any_version,
                                               concurrency_limits=concurrency_limits, flow=flow)
        rows = [_settle_row(*item) for item in settlements]
        settle: dict[str, Any] = {c: [row[c] for row in rows] for c in _SETTLE_COLUMNS}
        settle["channel"] = self.channel
        if flow:
            # the settlements' statement, then the flow claim's transaction (postgres/flow.py)
            written, _ = await self.db.retry(functools.partial(
                self._settle_and_claim, settle, None))
            return [f.run_id in written for f, _, _ in settlements], await self.claim_runs(
                namespace, workflows, owner, limit, lease, now, version=version,
                any_version=any_version, concurrency_limits=concurrency_limits, flow=flow)
        claim = _claim_args(namespace, workflows, owner, limit, lease, now, version,
                            any_version, concurrency_limits)
        # As in claim_runs, a claim of a concurrency key can be refused when another claim of
        # the key committed after this statement's snapshot; the whole statement was undone,
        # so it is tried again, the third time without the claim (the settlements are never
        # given up for it).
        for claiming in (limit > 0, limit > 0, False):
            try:
                written, claimed = await self.db.retry(functools.partial(
                    self._settle_and_claim, settle, claim if claiming else None))
                break
            except pg_errors.UniqueViolation:
                if not claiming:
                    raise
                log.debug("claim.key_race: settling and claiming again")
        else:
            raise AssertionError("unreachable")
        return [f.run_id in written for f, _, _ in settlements], claimed

    async def _settle_and_claim(
        self, settle: dict[str, Any], claim: dict[str, Any] | None
    ) -> tuple[set[str], list[Run]]:
        """One statement: the settlements and the claim (one round trip, one commit). The ids
        settled, and the runs claimed."""
        if claim is None:
            return {r["id"] for r in await self.db.all(Q["settle"], settle, hot=True)}, []
        statement = _SETTLE_AND_CLAIM_LIMITED if "limits" in claim else _SETTLE_AND_CLAIM
        names, rows = await self.db.tuples(statement, {**settle, "s_owner": settle["owner"],
                                                      **claim}, hot=True)
        # one row carries the ids settled; a row without a run when none was claimed
        settled = next((r[0] for r in rows if r[0] is not None), None)
        return set(settled or ()), claimed(names, [r for r in rows if r[1] is not None])

    async def release_run(self, fence: Fence, now: float) -> bool:
        args = {"run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
                "channel": self.channel}
        return await self.db.retry(lambda: self.db.one(Q["release"], args)) is not None

    async def recover_runs(self, namespace: str, now: float) -> list[Run]:
        rows = await self.db.retry(lambda: self.db.all(Q["recover"], {
            "namespace": namespace, "now": now, "channel": self.channel}))
        return [run_of(r) for r in rows]

    async def cancel_run(self, run_id: str, now: float) -> Run | None:
        # one statement, with the tree of an unfinished root (see the query)
        row = await self.db.retry(lambda: self.db.one(Q["cancel"], {
            "id": run_id, "now": now, "channel": self.channel}))
        if row is None:
            # unknown, or final already (a final run never changes again)
            row = await self.db.one(Q["get_run"], {"id": run_id})
        return None if row is None else run_of(row)

    async def retry_run(
        self, namespace: str, run_id: str, tenant: str | None, now: float
    ) -> tuple[Run | None, bool]:
        row = await self.db.retry(lambda: self.db.one(Q["retry"], {
            "id": run_id, "namespace": namespace, "tenant": tenant, "now": now,
            "channel": self.channel}))
        if row is not None:
            return run_of(row), True
        found = await self.db.one(Q["get_run"], {"id": run_id})
        if found is None or found["namespace"] != namespace or (
                tenant is not None and found["tenant"] != tenant):
            return None, False
        return run_of(found), False

    async def prune_runs(self, namespace: str, before: float, limit: int) -> int:
        args = {"namespace": namespace, "before": before, "limit": limit}
        return len(await self.db.retry(lambda: self.db.all(Q["prune_runs"], args)))

    async def stats(self, namespace: str, now: float) -> Stats:
        rows = await self.db.all(Q["stats"], {"namespace": namespace, "now": now,
                                             "since": since(now)})
        return stats_from_rows(namespace, now, rows)

    async def fold_stats(self, namespace: str, now: float) -> None:
        args = {"namespace": namespace, "keep": keep(now)}
        if await self.db.one(Q["fold_needed"], args) is not None:
            await self.db.retry(lambda: self.db.all(Q["fold_counts"], args, fetch=False))


def _claim_args(namespace: str, workflows: Sequence[str], owner: str, limit: int, lease: float,
                now: float, version: str | None, any_version: Sequence[str],
                concurrency_limits: Mapping[str, int] | None) -> dict[str, Any]:
    """The arguments of a claim statement, alone or with settlements."""
    return {"namespace": namespace, "workflows": list(workflows), "owner": owner,
            "limit": limit, "expires": now + lease, "now": now, "version": version,
            "any_version": list(any_version), **_limits(concurrency_limits)}


def _limits(concurrency_limits: Mapping[str, int] | None) -> dict[str, Any]:
    """``claim_limited``'s arguments for the workflows that allow more than one run of a key;
    none (``claim``) when no workflow does."""
    if not concurrency_limits:
        return {}
    names = sorted(concurrency_limits)
    return {"limited": names, "limits": [concurrency_limits[n] for n in names]}


def _compose_settle_and_claim(claim: str = "claim") -> str:
    """The ``settle`` and ``claim`` statements as one: the settlements' CTEs and update, then the
    claim's (the same snapshot: the claim does not see the rows the settlements free), then the
    claimed rows, the first of them (or a row of its own) carrying the ids settled."""
    def split(name: str) -> tuple[str, str]:
        text = Q[name]
        start = text.index("WITH ")   # after the comment lines that describe it
        at = text.rindex("\nUPDATE runs\n")
        return text[start + len("WITH "):at], text[at + 1:]

    settle_with, settle_update = split("settle")
    claim_with, claim_update = split(claim)
    # the claim's owner is one text, the settlements' one per row
    assert settle_with.count("%(owner)b") == 1 and "%(owner)" not in settle_update
    settle_with = settle_with.replace("%(owner)b", "%(s_owner)b")
    composed = (f"WITH {settle_with}, settled AS (\n{settle_update}\n), {claim_with}, "
                f"claimed AS (\n{claim_update}\n), ids AS (SELECT array_agg(id) AS settled "
                f"FROM settled)\nSELECT CASE WHEN row_number() OVER () = 1 THEN ids.settled "
                f"END AS settled, claimed.* FROM ids LEFT JOIN claimed ON true")
    compact = _compact(composed)   # sent on every batch: below 4 KB (see _compact)
    # (claim_limited's is longer: it is sent only by a claimer of a workflow with a limit)
    assert claim != "claim" or len(compact.encode()) < 4096, len(compact)
    return compact

_SETTLE_AND_CLAIM: Any = _compose_settle_and_claim()
_SETTLE_AND_CLAIM_LIMITED: Any = _compose_settle_and_claim("claim_limited")

def _settle_row(fence: Fence, settlement: Settlement, now: float) -> dict[str, Any]:
    """One row of the batched ``settle`` statement."""
    outcome = settlement.outcome
    return {
        "id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
        "status": "queued" if outcome == "retry" else outcome,
        "output": (("null" if settlement.output is None else _json.dumps(settlement.output))
                   if outcome == "succeeded" else None),
        "error": settlement.error,
        "finished_at": None if outcome == "retry" else now,
        "run_at": settlement.run_at if outcome == "retry" else now,
        "attempt_inc": 1 if outcome == "retry" else 0,
        "traceback": settlement.traceback,
    }
