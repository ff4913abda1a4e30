"""The flow claim of the PostgreSQL store: the claim of a claimer whose ``flow`` has a rule that
the plain claim (``claim``/``claim_limited`` in queries.sql) does not hold. A claimer without
one sends the plain statements, unchanged.

One transaction of two statements on one connection: first ``pg_advisory_xact_lock`` of
``shoal.flow/<namespace>/<workflow>`` for every workflow of ``flow`` the claimer serves, in
name order, then the flow claim. Under READ COMMITTED the second statement's snapshot is taken
after the locks are granted, so it sees every flow claim of those workflows committed before it:
the counts it makes (runs in ``running`` of a workflow and tenant) are exact against every other
flow claimer. The flow claim is derived from the plain one (``flow_claim``), so a later change of
the plain claim carries over.

``fairness="tenant"`` (the rule: :mod:`shoal.backends._fairness`): ``chosen`` drops the fair
workflows' runs the plain ``queued`` scan found (their places are dealt again);
``fair_tenants`` finds the tenants with queued runs of each fair workflow by a recursive skip
scan of ``runs_fair_queued`` (one probe a tenant: a backlog is
never read), ``fair_runs`` takes each tenant's first ``limit`` candidates under the plain
``queued`` conditions (key, version, pause), ``fair_dealt`` scores them
``(running + k) / weight`` and deals the workflow's FIFO places of each priority by score, and
``fair_locked`` locks the first ``limit`` of them (SKIP LOCKED, their status checked again), which
``chosen`` merges with the plain candidates by place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shoal.types import FlowLimits

LOCK = ("SELECT pg_advisory_xact_lock(hashtextextended('shoal.flow/' || %(namespace)s || '/' || w,"
        " 0)) FROM unnest(%(flowed)s::text[]) w ORDER BY w")

_QUEUED_HEAD = "WITH queued AS (\n    SELECT r.id, r.priority, r.created_at FROM runs r\n    WHERE "
_QUEUED_TAIL = ("\n    ORDER BY r.priority DESC, r.created_at, r.id\n    LIMIT %(limit)s\n"
                "    FOR UPDATE SKIP LOCKED\n), timed AS (")
_PLAIN_CHOSEN = """SELECT c.id FROM (SELECT * FROM queued UNION ALL SELECT * FROM timed) c
    ORDER BY c.priority DESC, c.created_at, c.id"""

_FAIR = """, fair_tenants AS (
    SELECT w AS workflow, (SELECT min(r.tenant) FROM runs r
                           WHERE r.namespace = %(namespace)s AND r.workflow = w
                             AND r.status = 'queued' AND NOT r.held) AS tenant
    FROM unnest(%(fair)s::text[]) w
    UNION ALL
    SELECT t.workflow, (SELECT min(r.tenant) FROM runs r
                        WHERE r.namespace = %(namespace)s AND r.workflow = t.workflow
                          AND r.status = 'queued' AND NOT r.held AND r.tenant > t.tenant)
    FROM fair_tenants t WHERE t.tenant IS NOT NULL
), fair_runs AS (
    SELECT c.* FROM fair_tenants t CROSS JOIN LATERAL (
        SELECT r.id, r.workflow, r.tenant, r.priority, r.created_at FROM runs r
        WHERE r.workflow = t.workflow AND r.tenant = t.tenant AND {where}
        ORDER BY r.priority DESC, r.created_at, r.id
        LIMIT %(limit)s) c
    WHERE t.tenant IS NOT NULL
), fair_running AS (
    SELECT r.workflow, r.tenant, count(*) AS n FROM runs r
    WHERE r.namespace = %(namespace)s AND r.status = 'running'
      AND r.workflow = ANY(%(fair)s::text[])
    GROUP BY r.workflow, r.tenant
), fair_scored AS (
    SELECT f.*, (coalesce(n.n, 0) + row_number() OVER (
                    PARTITION BY f.workflow, f.tenant
                    ORDER BY f.priority DESC, f.created_at, f.id) - 1)::float8
                / coalesce(w.weight, 1) AS score
    FROM fair_runs f
    LEFT JOIN fair_running n ON (n.workflow, n.tenant) = (f.workflow, f.tenant)
    LEFT JOIN tenant_weights w ON (w.namespace, w.tenant) = (%(namespace)s, f.tenant)
), fair_dealt AS (
    SELECT d.id, p.priority, p.created_at, p.id AS place FROM (
        SELECT id, workflow, priority, row_number() OVER (
            PARTITION BY workflow, priority ORDER BY score, created_at, id) AS j
        FROM fair_scored) d
    JOIN (SELECT id, workflow, priority, created_at, row_number() OVER (
              PARTITION BY workflow, priority ORDER BY created_at, id) AS j
          FROM fair_scored) p USING (workflow, priority, j)
), fair_locked AS (
    SELECT r.id, f.priority, f.created_at, f.place FROM runs r JOIN fair_dealt f ON f.id = r.id
    WHERE r.status = 'queued' AND NOT r.held AND r.run_at <= %(now)s
    ORDER BY f.priority DESC, f.created_at, f.place
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
)"""
_FAIR_CHOSEN = """SELECT c.id FROM (SELECT q.*, q.id AS place FROM queued q
                       JOIN runs r ON r.id = q.id WHERE NOT (r.workflow = ANY(%(fair)s::text[]))
                       UNION ALL SELECT *, id AS place FROM timed
                       UNION ALL SELECT * FROM fair_locked) c
    ORDER BY c.priority DESC, c.created_at, c.place"""


def flow_claim(text: str) -> str:
    """The flow claim derived from the plain claim ``text`` (``claim`` or ``claim_limited``):
    the runs of ``%(fair)s``, the fair workflows, that ``queued`` finds keep their places but
    are dealt by tenant (``queued`` is not told to skip them: its scan would then walk a fair
    workflow's whole backlog to find other runs, when the first ``limit`` places are all the
    claim needs)."""
    assert text.count(_QUEUED_HEAD) == 1 and text.count(_QUEUED_TAIL) == 1
    assert text.count(_PLAIN_CHOSEN) == 1 and text.count("\n), chosen AS (") == 1
    start = text.index(_QUEUED_HEAD) + len(_QUEUED_HEAD)
    where = text[start:text.index(_QUEUED_TAIL)]
    text = text.replace("WITH queued AS (", "WITH RECURSIVE queued AS (", 1)
    text = text.replace("\n), chosen AS (", "\n)" + _FAIR.format(where=where) + ", chosen AS (")
    return text.replace(_PLAIN_CHOSEN, _FAIR_CHOSEN)


def flow_args(flow: Mapping[str, FlowLimits] | None, workflows: Sequence[str]
              ) -> dict[str, Any]:
    """The flow claim's own arguments (none: the claimer sends the plain claim): the workflows
    of ``flow`` it serves, to lock, and those with ``fairness="tenant"``."""
    if not flow:
        return {}
    flowed = sorted(set(workflows) & set(flow))
    if not flowed:
        return {}
    return {"flowed": flowed,
            "fair": [w for w in flowed if flow[w].fairness == "tenant"]}
