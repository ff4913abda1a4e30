"""The claim of a claimer with flow rules (``claim_runs(flow=)``) on SQLite: the candidates query
derived from the plain one (``claim_candidates``, or ``claim_candidates_limited``), so that a fix
of the plain claim carries over, and the walk of its rows in Python.

SQLite writes under BEGIN IMMEDIATE: one writer at a time, so the counts read in the claim's
write transaction are exact against every other claimer. Each rule contributes

- a condition on the candidate ``r`` in both branches of the query (``_HELD``), so that a run it
  holds back is skipped by the scan and takes no room of its ``LIMIT :scan``:
  ``max_running`` / ``max_running_per_tenant``, a workflow or (workflow, tenant) with no share
  left (``:flow_full``, ``:flow_full_tenants``, from the counts); ``rate_limit``, a first start
  (``started_at`` NULL) of a (workflow, rate key) whose window (``:rates``: each rated
  workflow's limit and window start) holds its limit of first starts (a probe of
  ``runs_rate_starts``) or that this claim filled (``:flow_full_windows``); and
- a check in :class:`~shoal.backends._flow.Shares` of each row walked, so that a batch does not
  overshoot (the k-th run of a workflow taken needs count + k <= N).

When the walk skipped a row because the batch filled a workflow, tenant or window, and the scan
may have left runs behind it, the query runs again (those now excluded, and the runs taken):
each round fills at least one more, so it ends, and its result is the memory reference's.

``fairness="tenant"`` (the rule: :mod:`shoal.backends._fairness`) reorders the rows walked
(:func:`fair_candidates`): to the flow query's rows it adds the first ``scan`` candidates of
the first tenants with queued runs of a fair workflow (the same conditions, for one workflow
and tenant, walking ``runs_fair_queued``; the tenants found by a skip scan of that index and
ranked by their first candidate, one probe and one run a tenant, so a long backlog of one
tenant is never read beyond its first runs), then deals them.
"""

from __future__ import annotations

import functools
import sqlite3
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from shoal import _json
from shoal.backends._fairness import fair_order
from shoal.backends._flow import Shares, capped, rated
from shoal.types import FlowLimits

# How many runs of a (workflow, rate key) first started after the window's start: a walk of
# runs_rate_starts.
_STARTS = ("SELECT count(*) FROM runs o INDEXED BY runs_rate_starts "
           "WHERE o.namespace = {ns} AND o.workflow = {wf} "
           "AND o.rate_key IS NOT NULL AND o.rate_key = coalesce({key}, '') "
           "AND o.started_at IS NOT NULL AND o.started_at > {since}")
_RATE = "json_extract(value, '$[{i}]') FROM json_each(:rates) WHERE key = r.workflow"

# what a scan skips: a workflow or a (workflow, tenant) with no share left; a first start of a
# full window; the runs this claim took already (a query run again)
_HELD = """
          AND r.workflow NOT IN (SELECT value FROM json_each(:flow_full))
          AND r.workflow || char(31) || r.tenant NOT IN (
                SELECT value FROM json_each(:flow_full_tenants))
          AND (r.started_at IS NOT NULL OR NOT EXISTS (
                SELECT 1 FROM json_each(:rates) WHERE key = r.workflow) OR (
                r.workflow || char(31) || coalesce(r.rate_key, '') NOT IN (
                    SELECT value FROM json_each(:flow_full_windows))
                AND (""" + _STARTS.format(ns="r.namespace", wf="r.workflow", key="r.rate_key",
                                          since=f"(SELECT {_RATE.format(i=1)})") + f""")
                    < (SELECT {_RATE.format(i=0)})))
          AND r.id NOT IN (SELECT value FROM json_each(:flow_taken))"""

_COUNT_STARTS = _STARTS.format(ns=":namespace", wf=":workflow", key=":key", since=":since")

COUNT_RUNNING = """
SELECT workflow, tenant, count(*) FROM runs INDEXED BY runs_claimed
WHERE namespace = :namespace AND status IN ('running', 'interrupted') AND status = 'running'
  AND workflow IN (SELECT value FROM json_each(:capped))
GROUP BY workflow, tenant"""

# the first starts of a rated workflow's runs dispatched before it had a rate (rate_key NULL)
# count under '' (no key), in runs_rate_starts
NO_RATE_KEY = ("UPDATE runs SET rate_key = '' "
               "WHERE id IN (SELECT value FROM json_each(:ids)) AND rate_key IS NULL")


def derive(text: str) -> str:
    """The flow claim's candidates query from the plain one ``text``: each branch's WHERE gains
    ``_HELD`` (before its ORDER BY), and the rows carry the run's tenant and rate key."""
    columns = "r.id, r.workflow, r.concurrency_key, r.priority, r.created_at, r.started_at"
    assert text.count(columns) == 2, "the claim's branches changed: derive() must follow"
    text = text.replace(columns, columns + ", r.tenant, r.rate_key")
    outer = "SELECT id, workflow, concurrency_key, started_at FROM ("
    assert text.count(outer) == 1
    text = text.replace(outer, "SELECT id, workflow, concurrency_key, started_at, tenant, rate_key "
                               "FROM (")
    order = "\n        ORDER BY r.priority DESC, r.created_at, r.id\n        LIMIT :scan)"
    assert text.count(order) == 2
    return text.replace(order, _HELD + order)


def shares(db: sqlite3.Connection, namespace: str, flow: Mapping[str, FlowLimits] | None,
           now: float) -> Shares:
    """The shares the runs in ``running`` hold, and the first starts of each window (counted
    when the walk meets it), read in the write transaction ``db``."""
    caps = capped(flow)
    rows = db.execute(COUNT_RUNNING, {"namespace": namespace,
                                      "capped": _json.dumps(sorted(caps))}).fetchall() \
        if caps else []

    def first_starts(workflow: str, key: str | None, since: float) -> int:
        return int(db.execute(_COUNT_STARTS, {"namespace": namespace, "workflow": workflow,
                                              "key": key, "since": since}).fetchone()[0])

    return Shares(flow, ((w, t, n) for w, t, n in rows), now, first_starts)


def args(base: Mapping[str, Any], flow: Mapping[str, FlowLimits], now: float, held: Shares,
         taken: list[str]) -> dict[str, Any]:
    """The flow query's arguments: the plain ones, the rates and what the scan skips."""
    full, full_tenants, full_windows = held.full()
    return {**base, "flow_full": _json.dumps(full), "flow_full_tenants": _json.dumps(full_tenants),
            "flow_full_windows": _json.dumps(full_windows),
            "rates": _json.dumps({w: list(r) for w, r in rated(flow, now).items()}),
            "flow_taken": _json.dumps(taken)}


# -- fairness="tenant" ---------------------------------------------------------------------------

_FLOW_COLUMNS = "r.created_at, r.started_at, r.tenant, r.rate_key\n"
_FLOW_OUTER = "SELECT id, workflow, concurrency_key, started_at, tenant, rate_key FROM ("


def _with_status(text: str) -> str:
    """The flow query ``text`` (:func:`derive`'s) answering each row's status, priority and
    created_at too."""
    assert text.count(_FLOW_OUTER) == 1 and text.count(_FLOW_COLUMNS) == 2
    text = text.replace(_FLOW_OUTER, _FLOW_OUTER.replace(" FROM (",
                                                         ", status, priority, created_at FROM ("))
    return text.replace(_FLOW_COLUMNS, _FLOW_COLUMNS.replace("\n", ", r.status\n"))


def _of_tenant(text: str) -> str:
    """The queued branch of ``_with_status(text)`` for one workflow and tenant
    (``:fair_workflow``, ``:fair_tenant``), by ``runs_fair_queued``."""
    text = _with_status(text)
    start = text.index("SELECT r.id, r.workflow")
    end = text.index("LIMIT :scan)", start) + len("LIMIT :scan")
    branch = text[start:end]
    index, where = "INDEXED BY runs_queued", "WHERE r.namespace = :namespace AND"
    assert branch.count(index) == 1 and branch.count(where) == 1
    return (branch.replace(index, "INDEXED BY runs_fair_queued")
            .replace(where, f"{where} r.workflow = :fair_workflow AND r.tenant = :fair_tenant AND"))


@functools.cache
def _fair_statements(query: str) -> tuple[str, str]:
    return _with_status(query), _of_tenant(query)


_NEXT_TENANT = """SELECT tenant FROM runs INDEXED BY runs_fair_queued
WHERE namespace = :namespace AND workflow = :fair_workflow AND status = 'queued' AND held = 0
  AND tenant {} :after
ORDER BY tenant LIMIT 1"""
_FAIR_RUNNING = """SELECT workflow, tenant, count(*) AS n FROM runs INDEXED BY runs_claimed
WHERE namespace = :namespace AND status IN ('running', 'interrupted') AND status = 'running'
  AND workflow IN (SELECT value FROM json_each(:fair))
GROUP BY workflow, tenant"""
_WEIGHTS = "SELECT tenant, weight FROM tenant_weights WHERE namespace = :namespace"


def fair_candidates(db: sqlite3.Connection, query: str, args: Mapping[str, Any],
                    fair: Sequence[str], taken: Counter[tuple[str, str]],
                    limit: int) -> list[sqlite3.Row]:
    """The rows of the flow query ``query`` (:func:`derive`'s) with ``args``, in the order of
    the claim under fairness for the workflows ``fair``, read in the write transaction ``db``:
    its rows and the first ``scan`` candidates of the first ``limit`` tenants of each fair
    workflow (by their first candidate: priority, running / weight, age; no other tenant can
    have a run among the first ``limit`` dealt), dealt in turns. ``taken``: the runs of each
    (workflow, tenant) an earlier round of this claim took, which count as running."""
    every, of_tenant = _fair_statements(query)
    rows = {row["id"]: row for row in db.execute(every, args).fetchall()}
    fair_args = {"namespace": args["namespace"], "fair": _json.dumps(list(fair))}
    running = Counter(taken)
    for r in db.execute(_FAIR_RUNNING, fair_args).fetchall():
        running[(r["workflow"], r["tenant"])] += r["n"]
    weights = {r["tenant"]: r["weight"] for r in db.execute(_WEIGHTS, fair_args).fetchall()}
    for workflow in fair:
        firsts = []
        after, op = "", ">="
        while (found := db.execute(_NEXT_TENANT.format(op), {
                "namespace": args["namespace"], "fair_workflow": workflow,
                "after": after}).fetchone()) is not None:
            after, op = found["tenant"], ">"
            first = db.execute(of_tenant, {**args, "fair_workflow": workflow,
                                           "fair_tenant": after, "scan": 1}).fetchone()
            if first is not None:
                firsts.append(first)
        firsts.sort(key=lambda r: (-r["priority"],
                                   running[(workflow, r["tenant"])] / weights.get(r["tenant"], 1.0),
                                   r["created_at"], r["id"]))
        for first in firsts[:limit]:
            for row in db.execute(of_tenant, {**args, "fair_workflow": workflow,
                                              "fair_tenant": first["tenant"]}).fetchall():
                rows.setdefault(row["id"], row)
    ordered = sorted(rows.values(), key=lambda r: (-r["priority"], r["created_at"], r["id"]))
    wanted = set(fair)
    return fair_order(ordered, lambda r: r["workflow"] in wanted and r["status"] == "queued",
                      lambda r: (r["workflow"], r["tenant"], r["priority"], r["created_at"],
                                 r["id"]),
                      running, weights)
