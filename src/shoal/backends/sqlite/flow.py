"""The claim's flow rules in the SQLite store that reorder or filter its candidates:
``fairness="tenant"`` (the rule: :mod:`shoal.backends._fairness`).

A claim writes under ``BEGIN IMMEDIATE`` (one writer at a time), so what it reads in its write
transaction (the runs in ``running``, the weights) is exact against every other claimer. The
statements are derived from ``claim_candidates`` (or its limited form), so that a condition
added to the plain claim applies here too:

- ``all``: the plain candidates with their tenant and status;
- ``tenant``: the same conditions on the queued runs of one workflow and tenant, in claim
  order, walking ``runs_fair_queued``;
- the tenants with queued runs of a workflow are found by a skip scan of that index (one probe
  a tenant), so a long backlog of one tenant is never read beyond its first ``scan`` runs.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from typing import Any

from shoal import _json
from shoal.backends._fairness import fair_order

_COLUMNS = "r.created_at, r.started_at\n"


def _with_tenant(text: str) -> str:
    """``claim_candidates`` (or its limited form) answering each row's tenant, status,
    priority and created_at too."""
    outer = "SELECT id, workflow, concurrency_key, started_at FROM ("
    assert text.count(outer) == 1 and text.count(_COLUMNS) == 2
    text = text.replace(outer, "SELECT id, workflow, concurrency_key, started_at, tenant, status,"
                        " priority, created_at FROM (")
    return text.replace(_COLUMNS, "r.created_at, r.started_at, r.tenant, r.status\n")


def _of_tenant(text: str) -> str:
    """The queued branch of ``_with_tenant(text)`` for one workflow and tenant
    (``:fair_workflow``, ``:fair_tenant``), by ``runs_fair_queued``."""
    text = _with_tenant(text)
    start = text.index("SELECT r.id, r.workflow")
    end = text.index("LIMIT :scan)", start) + len("LIMIT :scan")
    branch = text[start:end]
    index, where = "INDEXED BY runs_queued", "WHERE r.namespace = :namespace AND"
    assert branch.count(index) == 1 and branch.count(where) == 1
    return (branch.replace(index, "INDEXED BY runs_fair_queued")
            .replace(where, f"{where} r.workflow = :fair_workflow AND r.tenant = :fair_tenant AND"))


_NEXT_TENANT = """SELECT tenant FROM runs INDEXED BY runs_fair_queued
WHERE namespace = :namespace AND workflow = :fair_workflow AND status = 'queued' AND held = 0
  AND tenant {} :after
ORDER BY tenant LIMIT 1"""
_RUNNING = """SELECT workflow, tenant, count(*) AS n FROM runs INDEXED BY runs_claimed
WHERE namespace = :namespace AND status IN ('running', 'interrupted') AND status = 'running'
  AND workflow IN (SELECT value FROM json_each(:fair))
GROUP BY workflow, tenant"""
_WEIGHTS = "SELECT tenant, weight FROM tenant_weights WHERE namespace = :namespace"

@functools.cache
def _statements(query: str) -> tuple[str, str]:
    return _with_tenant(query), _of_tenant(query)


def fair_candidates(db: sqlite3.Connection, query: str, args: dict[str, Any],
                    fair: Sequence[str]) -> list[sqlite3.Row]:
    """The candidates of the claim statement ``query`` (``claim_candidates`` or its limited
    form) with ``args``, in the order of the claim under fairness for the workflows ``fair``,
    read in the write transaction ``db``: the plain candidates and the first ``scan``
    candidates of each tenant with queued runs of a fair workflow, the latter dealt in
    turns."""
    every, of_tenant = _statements(query)
    rows = {row["id"]: row for row in db.execute(every, args).fetchall()}
    for workflow in fair:
        after, op = "", ">="
        while (found := db.execute(_NEXT_TENANT.format(op), {
                **args, "fair_workflow": workflow, "after": after}).fetchone()) is not None:
            after, op = found["tenant"], ">"
            for row in db.execute(of_tenant, {**args, "fair_workflow": workflow,
                                                    "fair_tenant": after}).fetchall():
                rows.setdefault(row["id"], row)
    ordered = sorted(rows.values(), key=lambda r: (-r["priority"], r["created_at"], r["id"]))
    fair_args = {"namespace": args["namespace"], "fair": _json.dumps(list(fair))}
    running = {(r["workflow"], r["tenant"]): r["n"]
               for r in db.execute(_RUNNING, fair_args).fetchall()}
    weights = {r["tenant"]: r["weight"] for r in db.execute(_WEIGHTS, fair_args).fetchall()}
    wanted = set(fair)
    return fair_order(ordered, lambda r: r["workflow"] in wanted and r["status"] == "queued",
                      lambda r: (r["workflow"], r["tenant"], r["priority"], r["created_at"],
                                 r["id"]),
                      running, weights)

