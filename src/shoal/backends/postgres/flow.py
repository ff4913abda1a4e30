"""The claim of a claimer with flow rules (``claim_runs(flow=)``) on PostgreSQL.

A claim with a non-empty ``flow`` runs as one transaction of two statements on one connection:

1. :data:`LOCK`: ``pg_advisory_xact_lock`` of each workflow of ``flow`` the claimer serves
   (``'shoal.flow/' || namespace || '/' || workflow``), in sorted order, held to the commit;
2. the flow claim statement (:func:`derive`, from the plain ``claim`` or ``claim_limited``
   text, so that a later fix of the plain claim carries over). Under READ COMMITTED it takes its
   snapshot after the locks are granted, so it sees every flow claim of those workflows
   committed before: the counts it makes (runs in ``running`` of a workflow or tenant, first
   starts in a window) are exact against every other claimer. A transaction that only lowers a
   count (a settlement) takes no lock: a stale count errs on the safe side.

Each rule (:class:`Rule`, in :data:`RULES`) contributes, in one place each:

- ``ctes``: what it counts, as CTEs placed before the claim's ``queued`` CTE;
- ``held``: a condition on a candidate (``{run}``: ``r`` in the ``queued`` and ``timed`` scans,
  ``e`` in the search of a key's first due run) that is true when the rule lets it start, so
  that a full workflow, tenant or window is skipped by the scan and takes no room of its LIMIT;
- ``ranks`` and ``fits``: window columns over the batch the scans chose (``c``: its rows, in
  claim order) and a condition on them, so that a batch does not overshoot (the k-th chosen
  run of a workflow needs count + k <= N).

The statement is built from the rules the claim's ``flow`` has only (:func:`rules_of`; the
store keeps one text per combination), so that a claimer with one rule sends a statement of one
rule. A rank counts the rows before it that a filter cut, so a row after the first cut one may
be cut when the reference would take it: the batch is the rows before the first cut one (every
rank there is exact), and the statement returns ``flow_cut`` (how many rows the scans chose are
at or after the first cut one) on a first row of its own. When some were cut and the batch is
not full, the claim runs the statement again in the same transaction (it sees its own claims:
the workflow, tenant or window that cut a row is now full and skipped by the scans), so the
result is the memory reference's.
Candidates of workflows not in ``flow`` pass every rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shoal.backends._flow import capped, rated
from shoal.types import FlowLimits

LOCK = ("SELECT pg_advisory_xact_lock(hashtextextended("
        "'shoal.flow/' || %(namespace)s || '/' || w, 0)) "
        "FROM (SELECT w FROM unnest(%(flowed)s::text[]) AS w ORDER BY w) AS l")


@dataclass(frozen=True)
class Rule:
    """One flow rule's parts of the flow claim statement (see the module): ``applies``, whether
    a workflow's limits have the rule; ``args``, its arguments of the statement (from the
    claim's ``flow`` and ``now``); ``columns``, the candidate columns it reads."""

    name: str
    applies: Callable[[FlowLimits], bool]
    args: Callable[[Mapping[str, FlowLimits], float], dict[str, Any]]
    columns: tuple[str, ...]
    ctes: str
    held: str
    ranks: str
    fits: str


def _caps_args(flow: Mapping[str, FlowLimits], now: float) -> dict[str, Any]:
    caps = capped(flow)
    names = sorted(caps)
    return {"capped": names, "caps": [caps[n].max_running for n in names],
            "tenant_caps": [caps[n].max_running_per_tenant for n in names]}


# max_running / max_running_per_tenant: fc the caps, fr the runs in `running` of each capped
# workflow and tenant, fw each capped workflow's count, ff what has no share left ('' for a
# whole workflow, as paused_workflows writes every tenant)
CAPS = Rule(
    name="caps",
    applies=lambda f: f.max_running is not None or f.max_running_per_tenant is not None,
    args=_caps_args,
    columns=("workflow", "tenant"),
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
    ranks="""row_number() OVER (PARTITION BY c.workflow ORDER BY {order}) AS wk,
           row_number() OVER (PARTITION BY c.workflow, c.tenant ORDER BY {order}) AS tk""",
    fits="""NOT EXISTS (SELECT FROM fw w WHERE w.workflow = c.workflow
                AND (w.used + c.wk > w.n OR c.tk + coalesce((SELECT u.n FROM fr u
                     WHERE (u.workflow, u.tenant) = (c.workflow, c.tenant)), 0) > w.tn))""",
)


def _rate_args(flow: Mapping[str, FlowLimits], now: float) -> dict[str, Any]:
    rates = rated(flow, now)
    names = sorted(rates)
    return {"rated": names, "rate_limits": [rates[n][0] for n in names],
            "rate_since": [rates[n][1] for n in names]}


# The first starts of {run}'s workflow and rate key after its window's start (q.since): a walk
# of runs_rate_starts (its expression; `started_at >` implies its predicate, IS NOT NULL).
_STARTS = """(SELECT count(*) FROM runs o
              WHERE o.namespace = %(namespace)s AND o.workflow = {run}.workflow
                AND coalesce(o.rate_key, '') = coalesce({run}.rate_key, '')
                AND o.started_at > q.since)"""

# rate_limit: fq each rated workflow's limit and window start (now - rate_per, computed by the
# claimer, as the memory reference computes it). Only a first start (started_at NULL) is held
# by a rate, and only a first start counts in it.
RATE = Rule(
    name="rate",
    applies=lambda f: f.rate_limit is not None and f.rate_per is not None,
    args=_rate_args,
    columns=("workflow", "rate_key", "started_at"),
    ctes="""fq AS (
    SELECT * FROM unnest(%(rated)s::text[], %(rate_limits)s::int[], %(rate_since)s::float8[])
        AS q(workflow, n, since)
)""",
    held="""({run}.started_at IS NOT NULL OR NOT EXISTS (SELECT FROM fq q
                      WHERE q.workflow = {run}.workflow AND """
         + _STARTS.format(run="{run}") + """ >= q.n))""",
    ranks="""row_number() OVER (PARTITION BY c.workflow, coalesce(c.rate_key, ''),
                                c.started_at IS NULL ORDER BY {order}) AS rk""",
    fits="""(c.started_at IS NOT NULL OR NOT EXISTS (SELECT FROM fq q
                WHERE q.workflow = c.workflow AND """
         + _STARTS.format(run="c") + """ + c.rk > q.n))""",
)

# every rule, in the order their parts appear in the statement
RULES: tuple[Rule, ...] = (CAPS, RATE)
_BY_NAME = {rule.name: rule for rule in RULES}

# the claim order of the batch's rows
_ORDER = "c.priority DESC, c.created_at, c.id"


def rules_of(flow: Mapping[str, FlowLimits]) -> frozenset[str]:
    """The names of the rules some workflow of ``flow`` has."""
    return frozenset(rule.name for rule in RULES if any(rule.applies(f) for f in flow.values()))


def derive(text: str, names: frozenset[str] = frozenset(_BY_NAME)) -> str:
    """The flow claim statement from the plain claim ``text`` (``claim`` or ``claim_limited``,
    as queries.sql keeps it) with the rules ``names``: their CTEs first; their ``held``
    conditions in the ``queued`` and ``timed`` scans and in the search of a key's first due
    run; the batch ranked and filtered by their ``fits``, cut at its first row a filter cuts,
    before its LIMIT; the update's rows after a first row carrying ``flow_cut``."""
    rules = [rule for rule in RULES if rule.name in names]
    assert rules and len(rules) == len(names), names
    start = text.index("WITH ") + len("WITH ")
    at = text.rindex("\nUPDATE runs\n")
    body, update = text[start:at], text[at + 1:].rstrip().rstrip(";")

    def held(run: str) -> str:
        return "".join(f"\n      AND {rule.held.format(run=run)}" for rule in rules)

    # the candidates carry what the rules read
    columns = "SELECT r.id, r.priority, r.created_at FROM runs r"
    assert body.count(columns) == 2, "the claim's scans changed: derive() must follow"
    extra = "".join(f", r.{c}" for c in dict.fromkeys(c for rule in rules for c in rule.columns))
    body = body.replace(columns, columns.replace("r.created_at", "r.created_at" + extra))
    # the scans skip what a rule holds back (before their LIMIT)
    scan_end = "\n    ORDER BY r.priority DESC, r.created_at, r.id\n    LIMIT %(limit)s"
    assert body.count(scan_end) == 2
    body = body.replace(scan_end, held("r") + scan_end)
    # a run a rule holds back does not stand in front of its key's next one
    key_end = "\n                ORDER BY e.priority DESC, e.created_at, e.id"
    assert body.count(key_end) == 1
    body = body.replace(key_end, held("e").replace("\n", "\n            ") + key_end)
    # the batch, ranked, filtered by every rule, and cut at its first row a filter cuts
    batch = "SELECT c.id FROM (SELECT * FROM queued UNION ALL SELECT * FROM timed) c"
    assert body.count(batch) == 1 and body.count("), chosen AS (") == 1
    ranks = ",\n           ".join(rule.ranks.format(order=_ORDER) for rule in rules)
    fits = "\n        AND ".join(rule.fits for rule in rules)
    body = body.replace(batch, "SELECT c.id FROM fits c WHERE c.ok")
    # ok: the row and every row before it pass every filter
    body = body.replace("), chosen AS (", f"""), ranked AS (
    SELECT c.*, {ranks}
    FROM (SELECT * FROM queued UNION ALL SELECT * FROM timed) c
), fits AS (
    SELECT c.id, c.priority, c.created_at, bool_and({fits}) OVER (ORDER BY {_ORDER}) AS ok
    FROM ranked c
), chosen AS (""")
    ctes = ", ".join(rule.ctes for rule in rules)
    return (f"WITH {ctes}, {body}, claimed AS (\n{update}\n)\n"
            f"SELECT (SELECT count(*) FROM fits WHERE NOT ok) AS flow_cut, claimed.*\n"
            f"FROM (VALUES (1)) AS one (x) LEFT JOIN claimed ON true")


def compact(text: str) -> str:
    """A flow claim statement compacted (``text``: as runs.py's ``_compact`` left it) further:
    no space around its comparison and arithmetic operators or after ``SELECT *`` (its texts
    have no string literal this would change)."""
    text = re.sub(r" ?(<=|>=|<>|[<>+]) ?", r"\1", text)
    return text.replace("SELECT * FROM", "SELECT*FROM")


def served(flow: Mapping[str, FlowLimits] | None,
           workflows: Sequence[str]) -> dict[str, FlowLimits]:
    """The limits of ``flow`` of the workflows the claimer serves that have a rule."""
    return {w: f for w, f in (flow or {}).items()
            if w in workflows and any(rule.applies(f) for rule in RULES)}


def lock_args(namespace: str, flow: Mapping[str, FlowLimits]) -> dict[str, Any]:
    """:data:`LOCK`'s arguments: the workflows of ``flow`` (those the claimer serves), sorted."""
    return {"namespace": namespace, "flowed": sorted(flow)}


def claim_args(flow: Mapping[str, FlowLimits], now: float,
               names: frozenset[str]) -> dict[str, Any]:
    """The arguments of the flow claim statement of the rules ``names`` (besides the plain
    claim's)."""
    args: dict[str, Any] = {}
    for name in sorted(names):
        args.update(_BY_NAME[name].args(flow, now))
    return args
