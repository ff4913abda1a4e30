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
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from shoal import _json
from shoal.backends._flow import Shares, capped, rated
from shoal.types import FlowLimits

# How many runs of a (workflow, rate key) first started after the window's start: a walk of
# runs_rate_starts.
_STARTS = ("SELECT count(*) FROM runs o INDEXED BY runs_rate_starts "
           "WHERE o.namespace = {ns} AND o.workflow = {wf} AND o.rate_key IS {key} "
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
SELECT workflow, tenant, count(*) FROM runs INDEXED BY runs_running
WHERE namespace = :namespace AND status = 'running'
  AND workflow IN (SELECT value FROM json_each(:capped))
GROUP BY workflow, tenant"""


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
