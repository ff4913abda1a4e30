"""The claim of a claimer with flow rules (``claim_runs(flow=)``) on SQLite: the candidates query
derived from the plain one (``claim_candidates``, or ``claim_candidates_limited``), so that a fix
of the plain claim carries over, and the walk of its rows in Python.

SQLite writes under BEGIN IMMEDIATE: one writer at a time, so the counts read in the claim's
write transaction are exact against every other claimer. Each rule contributes

- a condition on the candidate ``r`` in both branches of the query (``_HELD``), so that a run it
  holds back is skipped by the scan and takes no room of its ``LIMIT :scan``, and
- a check in :class:`~shoal.backends._flow.Shares` of each row walked, so that a batch does not
  overshoot (the k-th run of a workflow taken needs count + k <= N).

When the walk skipped a row because the batch filled a workflow or tenant, and the scan may
have left runs behind it, the query runs again (those now excluded): each round fills at least
one more, so it ends, and its result is the memory reference's.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from shoal import _json
from shoal.backends._flow import Shares, capped
from shoal.types import FlowLimits

# what a scan skips: a workflow or a (workflow, tenant) with no share left, and the runs this
# claim took already (a query run again)
_HELD = """
          AND r.workflow NOT IN (SELECT value FROM json_each(:flow_full))
          AND r.workflow || char(31) || r.tenant NOT IN (
                SELECT value FROM json_each(:flow_full_tenants))
          AND r.id NOT IN (SELECT value FROM json_each(:flow_taken))"""

COUNT_RUNNING = """
SELECT workflow, tenant, count(*) FROM runs INDEXED BY runs_running
WHERE namespace = :namespace AND status = 'running'
  AND workflow IN (SELECT value FROM json_each(:capped))
GROUP BY workflow, tenant"""


def derive(text: str) -> str:
    """The flow claim's candidates query from the plain one ``text``: each branch's WHERE gains
    ``_HELD`` (before its ORDER BY), and the rows carry the run's tenant."""
    columns = "r.id, r.workflow, r.concurrency_key, r.priority, r.created_at, r.started_at"
    assert text.count(columns) == 2, "the claim's branches changed: derive() must follow"
    text = text.replace(columns, columns + ", r.tenant")
    outer = "SELECT id, workflow, concurrency_key, started_at FROM ("
    assert text.count(outer) == 1
    text = text.replace(outer, "SELECT id, workflow, concurrency_key, started_at, tenant FROM (")
    order = "\n        ORDER BY r.priority DESC, r.created_at, r.id\n        LIMIT :scan)"
    assert text.count(order) == 2
    return text.replace(order, _HELD + order)


def shares(db: sqlite3.Connection, namespace: str,
           flow: Mapping[str, FlowLimits] | None) -> Shares:
    """The shares the runs in ``running`` hold, read in the write transaction ``db``."""
    caps = capped(flow)
    if not caps:
        return Shares(caps)
    rows = db.execute(COUNT_RUNNING, {"namespace": namespace,
                                      "capped": _json.dumps(sorted(caps))}).fetchall()
    return Shares(caps, ((w, t, n) for w, t, n in rows))


def args(base: Mapping[str, Any], held: Shares, taken: list[str]) -> dict[str, Any]:
    """The flow query's arguments: the plain ones and what the scan skips."""
    full, full_tenants = held.full()
    return {**base, "flow_full": _json.dumps(full), "flow_full_tenants": _json.dumps(full_tenants),
            "flow_taken": _json.dumps(taken)}
