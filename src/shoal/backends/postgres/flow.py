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

The statement returns ``flow_cut`` (how many rows of the batch the rank filters cut) on a first
row of its own: when some were cut and the batch is not full, the claim runs the statement again
in the same transaction (it sees its own claims: the workflows filled are skipped), so the
result is the memory reference's. Candidates of workflows not in ``flow`` pass every rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


def claim_args(flow: Mapping[str, FlowLimits]) -> dict[str, Any]:
    """The rules' arguments of the flow claim statement (besides the plain claim's)."""
    caps = capped(flow)
    names = sorted(caps)
    return {"capped": names, "caps": [caps[n].max_running for n in names],
            "tenant_caps": [caps[n].max_running_per_tenant for n in names]}
