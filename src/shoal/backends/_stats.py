"""What the SQL stores share for ``stats``: the windows of its counts of final runs (whole
seconds of the app's clock) and the :class:`~shoal.types.Stats` built from the rows of their one
``stats`` statement.

The statement returns rows of ``part, status, workflow, tenant, held, n, due, oldest_due``:

- ``live``: per (status, workflow, tenant, held) of the runs that have not ended, ``n`` runs,
  ``due`` of them due at ``now`` and the earliest ``run_at`` among those (``oldest_due``);
- ``final``: per (status, workflow) of the final runs, ``n`` runs, ``due`` of them finished in
  the last minute;
- ``pauses``, ``outbox``, ``dead``: ``n`` pending pauses, outbox entries to deliver,
  dead-lettered entries.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from shoal.types import QueueDepth, RunStatus, Stats

# a run "finished in the last minute" when finished_at >= floor(now) - LAST_MINUTE
LAST_MINUTE = 59
# fold_stats keeps per-second counts this long, so a reader whose clock is behind the folding
# instance's by a minute at most still finds every second of its last minute (one ahead always
# does)
KEEP_SECONDS = 120


def since(now: float) -> int:
    """The first second of the last minute at ``now``."""
    return math.floor(now) - LAST_MINUTE


def keep(now: float) -> int:
    """The first second whose counts fold_stats keeps apart at ``now``."""
    return math.floor(now) - KEEP_SECONDS


def stats_from_rows(namespace: str, now: float, rows: Iterable[Mapping[str, Any]]) -> Stats:
    """The :class:`Stats` that the rows of a store's ``stats`` statement describe."""
    by_status = {s.value: 0 for s in RunStatus}
    by_workflow: dict[str, dict[str, int]] = {}
    last_minute = {s.value: 0 for s in RunStatus if s.final}
    queued: dict[str, list[int]] = {}   # tenant -> [due, delayed, held]
    other = {"pauses": 0, "outbox": 0, "dead": 0}
    oldest: float | None = None
    for row in rows:
        part, n = row["part"], int(row["n"])
        if part in other:
            other[part] = n
            continue
        status, workflow = row["status"], row["workflow"]
        if n == 0:
            continue   # final runs all retried or pruned since
        by_status[status] += n
        counts = by_workflow.setdefault(workflow, {})
        counts[status] = counts.get(status, 0) + n
        due = int(row["due"])
        if part == "final":
            last_minute[status] += due
            continue
        if status == RunStatus.QUEUED:
            depth = queued.setdefault(row["tenant"], [0, 0, 0])
            if row["held"]:
                depth[2] += n
            else:
                depth[0] += due
                depth[1] += n - due
        if row["oldest_due"] is not None and status in ("queued", "sleeping", "waiting"):
            oldest = row["oldest_due"] if oldest is None else min(oldest, row["oldest_due"])
    return Stats(
        namespace=namespace, at=now, by_status=by_status, by_workflow=by_workflow,
        queued={t: QueueDepth(*q) for t, q in sorted(queued.items())},
        oldest_due_age=None if oldest is None else now - oldest,
        finished_last_minute=last_minute, pending_pauses=other["pauses"],
        outbox_backlog=other["outbox"], dead_letters=other["dead"])
