"""The claim of a claimer with flow rules (``claim_runs(flow=)``) on PostgreSQL.

A claim with a non-empty ``flow`` runs as one transaction of two statements on one connection:

1. :data:`LOCK`: ``pg_advisory_xact_lock`` of each workflow of ``flow`` the claimer serves
   (``'shoal.flow/' || namespace || '/' || workflow``), in sorted order, held to the commit;
2. the flow claim statement (:func:`derive`, from the plain ``claim`` or ``claim_limited``
   text, so that a later fix of the plain claim carries over). Under READ COMMITTED it takes its
   snapshot after the locks are granted, so it sees every flow claim of those workflows
   committed before: the counts it makes (runs in ``running`` of a workflow or tenant, ...) are
   exact against every other claimer. A transaction that only lowers a count (a settlement)
   takes no lock: a stale count errs on the safe side.

Each rule (:class:`Rule`, in :data:`RULES`) contributes, in one place each:

- ``ctes``: what it counts, as CTEs placed before the claim's ``queued`` CTE;
- ``held``: a condition on a candidate (``{run}``: ``r`` in the ``queued`` and ``timed`` scans,
  ``e`` in the search of a key's first due run) that is true when the rule lets it start, so
  that a full workflow, tenant or window is skipped by the scan and takes no room of its LIMIT;
- ``ranks`` and ``fits``: window columns over the batch the scans chose (``c``: its rows, in
  claim order) and a condition on them, so that a batch does not overshoot (the k-th chosen
  run of a workflow needs count + k <= N).

``fairness="tenant"`` (the rule: :mod:`shoal.backends._fairness`) is not a filter but an order,
added by :func:`fair` to a derived statement only for a claimer with a fair workflow:
``fair_tenants`` finds the tenants with queued runs of each fair workflow by a recursive skip
scan of ``runs_fair_queued`` (one probe a tenant: a backlog is never read); ``fair_first``
takes each one's first candidate under the ``queued`` scan's conditions (key, version, pause,
every rule's ``held``) and ranks the tenants by it (priority, ``running / weight``, age); the
first ``limit`` tenants (no other can have a run among the first ``limit`` dealt) give their
first ``limit`` candidates to ``fair_scored``, which scores them ``(running + k) / weight``;
``fair_dealt`` deals them, by score, the places the ``queued`` scan found for the workflow's
runs (first come, first served, in each priority), and ``fair_locked`` locks them (SKIP LOCKED,
their status checked again). The batch is ranked over the plain scans' rows (less the fair
workflows' own, whose places are dealt again) and those, by place. So a claim reads a probe and
a run a tenant with queued runs, and ``limit`` runs of at most ``limit`` tenants.

The statement returns ``flow_cut`` (how many rows of the batch the rank filters cut) on a first
row of its own: when some were cut and the batch is not full, the claim runs the statement again
in the same transaction (it sees its own claims: the workflows filled are skipped), so the
result is the memory reference's. Candidates of workflows not in ``flow`` pass every rule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shoal.backends._fairness import fair_workflows
from shoal.backends._flow import capped
from shoal.types import FlowLimits

LOCK = ("SELECT pg_advisory_xact_lock(hashtextextended("
        "'shoal.flow/' || %(namespace)s || '/' || w, 0)) "
        "FROM (SELECT w FROM unnest(%(flowed)s::text[]) AS w ORDER BY w) AS l")


@dataclass(frozen=True)
class Rule:
    """One flow rule's parts of the flow claim statement (see the module)."""

    ctes: str
    held: str
    ranks: str
    fits: str


# max_running / max_running_per_tenant: fc the caps, fr the runs in `running` of each capped
# workflow and tenant, fw each capped workflow's count, ff what has no share left ('' for a
# whole workflow, as paused_workflows writes every tenant)
CAPS = Rule(
    ctes="""fc AS (
    SELECT * FROM unnest(%(capped)s::text[], %(caps)s::int[], %(tenant_caps)s::int[])
        AS c(workflow, n, tn)
), fr AS (
    SELECT r.workflow, r.tenant, count(*) AS n FROM runs r
    WHERE r.namespace = %(namespace)s AND r.status = 'running'
      AND r.workflow = ANY(%(capped)s::text[])
    GROUP BY r.workflow, r.tenant
), fw AS (
    SELECT c.*, coalesce((SELECT sum(u.n) FROM fr u WHERE u.workflow = c.workflow), 0) AS used
    FROM fc c
), ff AS (
    SELECT w.workflow, '' AS tenant FROM fw w WHERE w.used >= w.n
    UNION ALL
    SELECT u.workflow, u.tenant FROM fr u JOIN fc c USING (workflow) WHERE u.n >= c.tn
)""",
    held="""NOT EXISTS (SELECT FROM ff f
                      WHERE f.workflow = {run}.workflow AND f.tenant IN ('', {run}.tenant))""",
    ranks="""row_number() OVER (PARTITION BY c.workflow ORDER BY c.priority DESC, c.created_at,
                                c.id) AS wk,
           row_number() OVER (PARTITION BY c.workflow, c.tenant ORDER BY c.priority DESC,
                              c.created_at, c.id) AS tk""",
    fits="""NOT EXISTS (SELECT FROM fw w WHERE w.workflow = c.workflow
                AND (w.used + c.wk > w.n OR c.tk + coalesce((SELECT u.n FROM fr u
                     WHERE (u.workflow, u.tenant) = (c.workflow, c.tenant)), 0) > w.tn))""",
)

# every rule, in the order their parts appear in the statement
RULES: tuple[Rule, ...] = (CAPS,)

# the candidate columns the rules read (besides the plain claim's id, priority, created_at)
_COLUMNS = ", r.workflow, r.tenant"


def derive(text: str) -> str:
    """The flow claim statement from the plain claim ``text`` (``claim`` or ``claim_limited``,
    as queries.sql keeps it): the rules' CTEs first; their ``held`` conditions in the ``queued``
    and ``timed`` scans and in the search of a key's first due run; the batch ranked and
    filtered by their ``fits`` before its LIMIT; the update's rows after a first row carrying
    ``flow_cut``."""
    start = text.index("WITH ") + len("WITH ")
    at = text.rindex("\nUPDATE runs\n")
    body, update = text[start:at], text[at + 1:].rstrip().rstrip(";")

    def held(run: str) -> str:
        return "".join(f"\n      AND {rule.held.format(run=run)}" for rule in RULES)

    # the candidates carry what the rules read
    columns = "SELECT r.id, r.priority, r.created_at FROM runs r"
    assert body.count(columns) == 2, "the claim's scans changed: derive() must follow"
    body = body.replace(columns, columns.replace("r.created_at", "r.created_at" + _COLUMNS))
    # the scans skip what a rule holds back (before their LIMIT)
    scan_end = "\n    ORDER BY r.priority DESC, r.created_at, r.id\n    LIMIT %(limit)s"
    assert body.count(scan_end) == 2
    body = body.replace(scan_end, held("r") + scan_end)
    # a run a rule holds back does not stand in front of its key's next one
    key_end = "\n                ORDER BY e.priority DESC, e.created_at, e.id"
    assert body.count(key_end) == 1
    body = body.replace(key_end, held("e").replace("\n", "\n            ") + key_end)
    # the batch, ranked, and filtered by every rule before its LIMIT
    batch = "SELECT c.id FROM (SELECT * FROM queued UNION ALL SELECT * FROM timed) c"
    assert body.count(batch) == 1 and body.count("), chosen AS (") == 1
    ranks = ",\n           ".join(rule.ranks for rule in RULES)
    fits = "\n        AND ".join(rule.fits for rule in RULES)
    body = body.replace(batch, "SELECT c.id FROM fits c WHERE c.ok")
    body = body.replace("), chosen AS (", f"""), ranked AS (
    SELECT c.*, {ranks}
    FROM (SELECT * FROM queued UNION ALL SELECT * FROM timed) c
), fits AS (
    SELECT c.*, ({fits}) AS ok FROM ranked c
), chosen AS (""")
    ctes = ", ".join(rule.ctes for rule in RULES)
    return (f"WITH {ctes}, {body}, claimed AS (\n{update}\n)\n"
            f"SELECT (SELECT count(*) FROM fits WHERE NOT ok) AS flow_cut, claimed.*\n"
            f"FROM (VALUES (1)) AS one (x) LEFT JOIN claimed ON true")


def lock_args(namespace: str, workflows: Sequence[str],
              flow: Mapping[str, FlowLimits]) -> dict[str, Any]:
    """:data:`LOCK`'s arguments: the workflows of ``flow`` the claimer serves, sorted."""
    return {"namespace": namespace, "flowed": sorted(set(flow) & set(workflows))}


def claim_args(flow: Mapping[str, FlowLimits], workflows: Sequence[str]) -> dict[str, Any]:
    """The rules' arguments of the flow claim statement (besides the plain claim's); ``fair``,
    the workflows it serves with ``fairness="tenant"``, empty when none (the statement without
    :func:`fair` then)."""
    caps = capped(flow)
    names = sorted(caps)
    return {"capped": names, "caps": [caps[n].max_running for n in names],
            "tenant_caps": [caps[n].max_running_per_tenant for n in names],
            "fair": fair_workflows(flow, workflows)}


# -- fairness="tenant" ---------------------------------------------------------------------------

_QUEUED_HEAD = ("queued AS (\n    SELECT r.id, r.priority, r.created_at, r.workflow, r.tenant"
                " FROM runs r\n    WHERE ")
_QUEUED_TAIL = ("\n    ORDER BY r.priority DESC, r.created_at, r.id\n    LIMIT %(limit)s\n"
                "    FOR UPDATE SKIP LOCKED\n), timed AS (")
_BATCH = "FROM (SELECT * FROM queued UNION ALL SELECT * FROM timed) c"
_FAIR_BATCH = """FROM (SELECT *, id AS place FROM queued
          WHERE NOT (workflow = ANY(%(fair)s::text[]))
          UNION ALL SELECT *, id AS place FROM timed
          UNION ALL SELECT * FROM fair_locked) c"""
_BATCH_ORDER = re.compile(r"ORDER BY c\.priority DESC,\s*c\.created_at,\s*c\.id\b")

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
), fair_running AS (
    SELECT r.workflow, r.tenant, count(*) AS n FROM runs r
    WHERE r.namespace = %(namespace)s AND r.status = 'running'
      AND r.workflow = ANY(%(fair)s::text[])
    GROUP BY r.workflow, r.tenant
), fair_first AS (
    SELECT c.*, coalesce(n.n, 0) AS running, coalesce(w.weight, 1) AS weight,
           row_number() OVER (PARTITION BY c.workflow
                              ORDER BY c.priority DESC, coalesce(n.n, 0) / coalesce(w.weight, 1),
                                       c.created_at, c.id) AS turn
    FROM fair_tenants t CROSS JOIN LATERAL (
        SELECT r.id, r.workflow, r.tenant, r.priority, r.created_at FROM runs r
        WHERE r.workflow = t.workflow AND r.tenant = t.tenant AND {where}
        ORDER BY r.priority DESC, r.created_at, r.id
        LIMIT 1) c
    LEFT JOIN fair_running n ON (n.workflow, n.tenant) = (c.workflow, c.tenant)
    LEFT JOIN tenant_weights w ON (w.namespace, w.tenant) = (%(namespace)s, c.tenant)
    WHERE t.tenant IS NOT NULL
), fair_scored AS (
    SELECT c.*, (t.running + row_number() OVER (
                    PARTITION BY c.workflow, c.tenant
                    ORDER BY c.priority DESC, c.created_at, c.id) - 1)::float8
                / t.weight AS score
    FROM fair_first t CROSS JOIN LATERAL (
        SELECT r.id, r.workflow, r.tenant, r.priority, r.created_at FROM runs r
        WHERE r.workflow = t.workflow AND r.tenant = t.tenant AND {where}
        ORDER BY r.priority DESC, r.created_at, r.id
        LIMIT %(limit)s) c
    WHERE t.turn <= %(limit)s
), fair_dealt AS (
    SELECT d.id, p.priority, p.created_at, p.id AS place FROM (
        SELECT id, workflow, priority, row_number() OVER (
            PARTITION BY workflow, priority ORDER BY score, created_at, id) AS j
        FROM fair_scored) d
    JOIN (SELECT q.id, q.workflow, q.priority, q.created_at, row_number() OVER (
              PARTITION BY q.workflow, q.priority ORDER BY q.created_at, q.id) AS j
          FROM queued q WHERE q.workflow = ANY(%(fair)s::text[])) p USING (workflow, priority, j)
), fair_locked AS (
    SELECT r.id, f.priority, f.created_at, r.workflow, r.tenant, f.place
    FROM runs r JOIN fair_dealt f ON f.id = r.id
    WHERE r.status = 'queued' AND NOT r.held AND r.run_at <= %(now)s
    ORDER BY f.priority DESC, f.created_at, f.place
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
)"""


def fair(text: str) -> str:
    """The flow claim ``text`` (:func:`derive`'s) for a claimer with fair workflows
    (``%(fair)s``): their queued runs found by tenant, scored, dealt the places the ``queued``
    scan's order gives them, and ranked with the other candidates by place."""
    assert text.startswith("WITH ") and text.count(_QUEUED_HEAD) == 1
    assert text.count(_QUEUED_TAIL) == 1 and text.count(_BATCH) == 1
    assert text.count("\n), ranked AS (") == 1
    start = text.index(_QUEUED_HEAD) + len(_QUEUED_HEAD)
    where = text[start:text.index(_QUEUED_TAIL)]
    text = "WITH RECURSIVE " + text[len("WITH "):]
    text = text.replace("\n), ranked AS (", "\n)" + _FAIR.format(where=where) + ", ranked AS (")
    head, batch = text.split(", ranked AS (")
    batch = _BATCH_ORDER.sub("ORDER BY c.priority DESC, c.created_at, c.place", batch)
    assert batch.count("c.place") == 3, "the batch's ranks changed: fair() must follow"
    return head + ", ranked AS (" + batch.replace(_BATCH, _FAIR_BATCH)
