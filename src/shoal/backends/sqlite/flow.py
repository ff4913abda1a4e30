"""The flow-control rules of a SQLite claim (``claim_runs(flow=)``): the claim of a claimer
with no rules is the plain one, and a claimer with rules uses a candidates query derived from
the plain one, with each rule's condition on a queued candidate (so a run a rule holds back is
skipped by the scan and takes no room of it), and a check in Python of the batch it chooses,
in the claim's write transaction (BEGIN IMMEDIATE: one writer, so every count is exact).

- ``rate_limit``: a run's first start is claimed only while its workflow and rate key
  (``runs.rate_key``) have fewer than ``rate_limit`` first starts (``runs.started_at``) after
  ``now - rate_per``, this claim's own included. A run that started before is never held.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from shoal import _json
from shoal.types import FlowLimits

# How many runs of a (workflow, rate key) first started after the window's start (`since`).
_STARTS = ("SELECT count(*) FROM runs o INDEXED BY runs_rate_starts "
           "WHERE o.namespace = {ns} AND o.workflow = {wf} AND o.rate_key IS {key} "
           "AND o.started_at IS NOT NULL AND o.started_at > {since}")

_RATE = ("json_extract(value, '$[{i}]') FROM json_each(:rates) WHERE key = r.workflow")
# A queued candidate whose first start its rate allows (or that is no first start, or has no
# rate): placed before the scan's LIMIT, so a full window holds back nothing behind it.
_RATE_ALLOWS = (
    "AND (r.started_at IS NOT NULL OR NOT EXISTS (SELECT 1 FROM json_each(:rates) "
    "WHERE key = r.workflow) OR ("
    + _STARTS.format(ns="r.namespace", wf="r.workflow", key="r.rate_key",
                     since=f"(SELECT {_RATE.format(i=1)})")
    + f") < (SELECT {_RATE.format(i=0)}))\n          ")
_COUNT = _STARTS.format(ns=":namespace", wf=":workflow", key=":key", since=":since")

_PAUSED = "AND NOT EXISTS (SELECT 1 FROM paused_workflows p"


def flowed(text: str) -> str:
    """A candidates query (``claim_candidates`` or its limited variant) with the conditions of
    the flow rules on the queued runs (the first branch: sleeping and waiting runs have started
    before, and no rule here holds them), given the argument ``:rates``."""
    at = text.index(_PAUSED)   # the queued branch's first
    return text[:at] + _RATE_ALLOWS + text[at:]


def rates(flow: Mapping[str, FlowLimits] | None, now: float) -> dict[str, tuple[int, float]]:
    """The workflows of ``flow`` with a rate: their limit and the start of their window."""
    return {w: (f.rate_limit, now - f.rate_per) for w, f in (flow or {}).items()
            if f.rate_limit is not None and f.rate_per is not None}


def flow_args(args: dict[str, Any], flow: Mapping[str, FlowLimits] | None,
              now: float) -> dict[str, Any]:
    """``args`` of the candidates query with the flow rules' own (``:rates``)."""
    return {**args, "rates": _json.dumps({w: list(r) for w, r in rates(flow, now).items()})}


class RateWindows:
    """The first starts of each (workflow, rate key) in its window, counted once per claim in
    the claim's write transaction, and those the claim takes added as it takes them."""

    def __init__(self, db: sqlite3.Connection, namespace: str,
                 rated: Mapping[str, tuple[int, float]]) -> None:
        self.db, self.namespace, self.rated = db, namespace, rated
        self.starts: dict[tuple[str, str | None], int] = {}

    def window(self, run_id: str, workflow: str, started_at: float | None,
               ) -> tuple[str, str | None] | None:
        """The window a candidate's start counts in; None when no rate holds it (it started
        before, or its workflow has none)."""
        if started_at is not None or workflow not in self.rated:
            return None
        row = self.db.execute("SELECT rate_key FROM runs WHERE id = ?", (run_id,)).fetchone()
        return (workflow, row[0])

    def allows(self, window: tuple[str, str | None]) -> bool:
        """Whether one more first start fits the window."""
        limit, since = self.rated[window[0]]
        if window not in self.starts:
            self.starts[window] = self.db.execute(_COUNT, {
                "namespace": self.namespace, "workflow": window[0], "key": window[1],
                "since": since}).fetchone()[0]
        return self.starts[window] < limit

    def take(self, window: tuple[str, str | None]) -> None:
        self.starts[window] += 1
