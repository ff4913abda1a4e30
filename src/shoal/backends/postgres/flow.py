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

``fairness="tenant"`` (the rule: :mod:`shoal.backends._fairness`) is not a filter but an order,
added by :func:`derive` only for a claimer with a fair workflow (the rule ``fair``):
``fair_tenants`` finds the tenants with queued runs of each fair workflow by a recursive skip
scan of ``runs_fair_queued`` (one probe a tenant: a backlog is never read); ``fair_first``
takes each one's first candidate under the ``queued`` scan's conditions (key, version, pause,
every rule's ``held``) and ranks the tenants by it (priority, ``running / weight``, age); the
first ``limit`` tenants (no other can have a run among the first ``limit`` dealt) give their
first ``limit`` candidates to ``fair_scored``, which scores them ``(running + k) / weight``;
``fair_dealt`` deals them, by score, the places the ``queued`` scan found for the workflow's
runs (first come, first served, in each priority), and ``fair_locked`` locks them (SKIP LOCKED,
their status checked again). The batch is ranked over the plain scans' rows (less the fair
workflows' own, whose places are dealt again) and those, by place: the rank filters count in
that order. So a claim reads a probe and
a run a tenant with queued runs, and ``limit`` runs of at most ``limit`` tenants.

The statement is built from the rules the claim's ``flow`` has only (:func:`rules_of`; the
store keeps one text per combination), so that a claimer with one rule sends a statement of one
rule. A rank counts the rows before it that a filter cut, so a row after the first cut one may
be cut when the reference would take it: the batch is the rows before the first cut one (every
rank there is exact), and the statement returns ``flow_cut`` (how many rows the scans chose are
at or after the first cut one) on a first row of its own. When some were cut and the batch is
not full, the claim runs the statement again in the same transaction (it sees its own claims:
the workflow, tenant or window that cut a row is now full and skipped by the scans), so the
result is the memory reference's. Under fairness a rerun would deal the places of the runs left
again (the reference deals once): there the scans read ``%(scan)s`` rows (4 x limit + 16, as
SQLite's do) and the batch is every row that fits, so that one statement answers as the
reference does unless a rank counted a row cut before it (a rerun then takes what is left).
Candidates of workflows not in ``flow`` pass every rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shoal.backends._fairness import fair_workflows
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
# of runs_rate_starts (its predicate, said; a NULL key is a run dispatched before its workflow
# had a rate: its first start counts under '', as the claim then writes).
_STARTS = """(SELECT count(*) FROM runs o
              WHERE o.namespace = %(namespace)s AND o.workflow = {run}.workflow
                AND o.rate_key IS NOT NULL AND o.rate_key = coalesce({run}.rate_key, '')
                AND o.started_at IS NOT NULL AND o.started_at > q.since)"""

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


# -- fairness="tenant" ---------------------------------------------------------------------------

FAIR = "fair"   # the rule's name in rules_of()
_FAIR_COLUMNS = ("workflow", "tenant")
_FAIR_BATCH = """(SELECT *, id AS place FROM queued
          WHERE NOT (workflow = ANY(%(fair)s::text[]))
          UNION ALL SELECT *, id AS place FROM timed
          UNION ALL SELECT * FROM fair_locked)"""
_QUEUED_TAIL = ("\n    ORDER BY r.priority DESC, r.created_at, r.id\n    LIMIT %(limit)s\n"
                "    FOR UPDATE SKIP LOCKED\n), timed AS (")

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
    SELECT r.id, f.priority, f.created_at{columns}, f.place
    FROM runs r JOIN fair_dealt f ON f.id = r.id
    WHERE r.status = 'queued' AND NOT r.held AND r.run_at <= %(now)s
    ORDER BY f.priority DESC, f.created_at, f.place
    LIMIT %(scan)s
    FOR UPDATE OF r SKIP LOCKED
)"""


# every rule that filters, in the order their parts appear in the statement
RULES: tuple[Rule, ...] = (CAPS, RATE)
_BY_NAME = {rule.name: rule for rule in RULES}

# the claim order of the batch's rows
_ORDER = "c.priority DESC, c.created_at, c.id"


def _fair(f: FlowLimits) -> bool:
    return f.fairness == "tenant"


def rules_of(flow: Mapping[str, FlowLimits]) -> frozenset[str]:
    """The names of the rules some workflow of ``flow`` has (:data:`FAIR` for fairness)."""
    names = {rule.name for rule in RULES if any(rule.applies(f) for f in flow.values())}
    if any(_fair(f) for f in flow.values()):
        names.add(FAIR)
    return frozenset(names)


def derive(text: str, names: frozenset[str] = frozenset({*_BY_NAME, FAIR})) -> str:
    """The flow claim statement from the plain claim ``text`` (``claim`` or ``claim_limited``,
    as queries.sql keeps it) with the rules ``names``: their CTEs first; their ``held``
    conditions in the ``queued`` and ``timed`` scans and in the search of a key's first due
    run; with :data:`FAIR`, the fair workflows' queued runs found by tenant and dealt their
    places (the ``fair_*`` CTEs); the batch ranked and filtered by the rules' ``fits`` (in
    claim order, by place under fairness), cut at its first row a filter cuts, before its
    LIMIT; the update's rows after a first row carrying ``flow_cut``."""
    rules = [rule for rule in RULES if rule.name in names]
    fair = FAIR in names
    assert len(rules) + fair == len(names) and names, names
    start = text.index("WITH ") + len("WITH ")
    at = text.rindex("\nUPDATE runs\n")
    body, update = text[start:at], text[at + 1:].rstrip().rstrip(";")
    if RATE in rules:
        # a first start of a rated workflow's run dispatched before it had a rate (rate_key
        # NULL) counts under '' (no key), in runs_rate_starts
        assert update.count("\nSET status = 'running',") == 1
        update = update.replace("\nSET status = 'running',", """
SET rate_key = CASE WHEN runs.started_at IS NULL AND runs.workflow = ANY(%(rated)s::text[])
                    THEN coalesce(runs.rate_key, '') ELSE runs.rate_key END,
    status = 'running',""")

    def held(run: str) -> str:
        return "".join(f"\n      AND {rule.held.format(run=run)}" for rule in rules)

    # the candidates carry what the rules read
    columns = "SELECT r.id, r.priority, r.created_at FROM runs r"
    assert body.count(columns) == 2, "the claim's scans changed: derive() must follow"
    read = [c for rule in rules for c in rule.columns] + list(_FAIR_COLUMNS if fair else ())
    extra = "".join(f", r.{c}" for c in dict.fromkeys(read))
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
    chosen_order = "\n    ORDER BY c.priority DESC, c.created_at, c.id\n    LIMIT %(limit)s\n)"
    assert body.count(batch) == 1 and body.count("), chosen AS (") == 1
    assert body.count(chosen_order) == 1
    source, order, fair_ctes, place = ("(SELECT * FROM queued UNION ALL SELECT * FROM timed)",
                                       _ORDER, "", "")
    if fair:
        # the queued scan's conditions (the rules' held among them) for each tenant's runs
        head = f"queued AS (\n    {columns.replace('r.created_at', 'r.created_at' + extra)}"
        head += "\n    WHERE "
        assert body.count(head) == 1 and body.count(_QUEUED_TAIL) == 1
        where = body[body.index(head) + len(head):body.index(_QUEUED_TAIL)]
        fair_ctes = _FAIR.format(where=where, columns=extra)
        source, order, place = _FAIR_BATCH, "c.priority DESC, c.created_at, c.place", ", c.place"
        # the scans read further (%(scan)s), so that the places dealt are those of the runs the
        # reference walks past held ones (a rerun would deal the places left again)
        locked = "\n    LIMIT %(limit)s\n    FOR UPDATE SKIP LOCKED"
        assert body.count(locked) == 2
        body = body.replace(locked, locked.replace("%(limit)s", "%(scan)s"))
    body = body.replace(batch, "SELECT c.id FROM fits c WHERE c.ok")
    body = body.replace(chosen_order, chosen_order.replace(_ORDER, order))
    if rules:
        ranks = ",\n           ".join(rule.ranks.format(order=order) for rule in rules)
        fits = "\n        AND ".join(rule.fits for rule in rules)
        # ok: the row and every row before it pass every filter (under fairness, the row: a
        # rerun would deal the places of the runs left again, where the reference walks on)
        ok = f"({fits})" if fair else f"bool_and({fits}) OVER (ORDER BY {order})"
        batch_ctes = f"""ranked AS (
    SELECT c.*, {ranks}
    FROM {source} c
), fits AS (
    SELECT c.id, c.priority, c.created_at{place}, {ok} AS ok
    FROM ranked c
)"""
    else:
        batch_ctes = f"fits AS (\n    SELECT c.*, true AS ok FROM {source} c\n)"
    body = body.replace("), chosen AS (", f"){fair_ctes}, {batch_ctes}, chosen AS (")
    ctes = "".join(f"{rule.ctes}, " for rule in rules)
    recursive = "RECURSIVE " if fair else ""
    return (f"WITH {recursive}{ctes}{body}, claimed AS (\n{update}\n)\n"
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
            if w in workflows and (_fair(f) or any(rule.applies(f) for rule in RULES))}


def lock_args(namespace: str, flow: Mapping[str, FlowLimits]) -> dict[str, Any]:
    """:data:`LOCK`'s arguments: the workflows of ``flow`` (those the claimer serves), sorted."""
    return {"namespace": namespace, "flowed": sorted(flow)}


def claim_args(flow: Mapping[str, FlowLimits], now: float,
               names: frozenset[str]) -> dict[str, Any]:
    """The arguments of the flow claim statement of the rules ``names`` (besides the plain
    claim's)."""
    args: dict[str, Any] = {}
    for name in sorted(names - {FAIR}):
        args.update(_BY_NAME[name].args(flow, now))
    if FAIR in names:
        args["fair"] = fair_workflows(flow, list(flow))
    return args
