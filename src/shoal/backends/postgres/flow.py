"""The claim of a claimer with flow rules (``claim_runs(flow=)``) on PostgreSQL.

A claim with a non-empty ``flow`` runs as one transaction of two statements on one connection:

1. :data:`LOCK`: ``pg_advisory_xact_lock`` of each workflow of ``flow`` the claimer serves
   (``'shoal.flow/' || namespace || '/' || workflow``), in sorted order, held to the commit;
2. the flow claim statement (:func:`derive`, from the plain ``claim`` or ``claim_limited``
   text, so that a later fix of the plain claim carries over). Under READ COMMITTED it takes its
   snapshot after the locks are granted, so it sees every flow claim of those workflows
   committed before: the counts it makes (first starts in a window, ...) are exact against
   every other claimer. A transaction that only lowers a count takes no lock.

Each rule (:class:`Rule`, in :data:`RULES`) contributes, in one place each:

- ``ctes``: what it reads, as CTEs placed before the claim's ``queued`` CTE;
- ``held``: a condition on a candidate (``{run}``: ``r`` in the ``queued`` and ``timed`` scans,
  ``e`` in the search of a key's first due run) that is true when the rule lets it start, so
  that a full window is skipped by the scan and takes no room of its LIMIT;
- ``ranks`` and ``fits``: window columns over the batch the scans chose (``c``: its rows, in
  claim order) and a condition on them, so that a batch does not overshoot (the k-th chosen
  first start of a window needs count + k <= N).

The statement returns ``flow_cut`` (how many rows of the batch the rank filters cut) on a first
row of its own: when some were cut and the batch is not full, the claim runs the statement again
in the same transaction (it sees its own claims: the windows filled are skipped), so the result
is the memory reference's. Candidates of workflows not in ``flow`` pass every rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


# The first starts of {run}'s workflow and rate key after its window's start (q.since): a walk
# of runs_rate_starts (its expression and predicate, so that the index serves it).
_STARTS = """(SELECT count(*) FROM runs o
              WHERE o.namespace = {run}.namespace AND o.workflow = {run}.workflow
                AND coalesce(o.rate_key, '') = coalesce({run}.rate_key, '')
                AND o.started_at IS NOT NULL AND o.started_at > q.since)"""

# rate_limit: fq each rated workflow's limit and window start (now - rate_per, computed by the
# claimer, as the memory reference computes it). Only a first start (started_at NULL) is held.
RATE = Rule(
    ctes="""fq AS (
    SELECT * FROM unnest(%(rated)s::text[], %(rate_limits)s::int[], %(rate_since)s::float8[])
        AS q(workflow, n, since)
)""",
    held="""({run}.started_at IS NOT NULL OR NOT EXISTS (SELECT FROM fq q
                      WHERE q.workflow = {run}.workflow AND """
         + _STARTS.format(run="{run}") + """ >= q.n))""",
    ranks="""row_number() OVER (PARTITION BY c.workflow, coalesce(c.rate_key, ''),
                                c.started_at IS NULL
                                ORDER BY c.priority DESC, c.created_at, c.id) AS rk""",
    fits="""(c.started_at IS NOT NULL OR NOT EXISTS (SELECT FROM fq q
                WHERE q.workflow = c.workflow AND """
         + _STARTS.format(run="c") + """ + c.rk > q.n))""",
)

# every rule, in the order their parts appear in the statement
RULES: tuple[Rule, ...] = (RATE,)

# the candidate columns the rules read (besides the plain claim's id, priority, created_at)
_COLUMNS = ", r.namespace, r.workflow, r.rate_key, r.started_at"


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


def claim_args(flow: Mapping[str, FlowLimits], now: float) -> dict[str, Any]:
    """The rules' arguments of the flow claim statement (besides the plain claim's)."""
    rated = sorted(w for w, f in flow.items()
                   if f.rate_limit is not None and f.rate_per is not None)
    return {"rated": rated, "rate_limits": [flow[w].rate_limit for w in rated],
            "rate_since": [now - flow[w].rate_per for w in rated]}  # type: ignore[operator]
