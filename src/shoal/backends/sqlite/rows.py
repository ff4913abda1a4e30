"""Rows of the SQLite store's tables as shoal's records, and the one statement several parts
make (a step's checkpoint)."""

from __future__ import annotations

import sqlite3

from shoal import _json
from shoal.backends._runs import STATUSES, RunRows
from shoal.backends._sql import progress_of, queries
from shoal.types import Fence, OutboxEntry, Pause, Run, Step

_Q = queries("sqlite")


def put_step(db: sqlite3.Connection, fence: Fence, step: Step, now: float) -> None:
    """Write ``step`` of the fenced run, in the caller's write transaction."""
    db.execute(_Q["put_step"], {
        "run_id": fence.run_id, "seq": step.seq, "name": step.name,
        "output": _json.dumps(step.output), "finished": int(step.finished),
        "epoch": fence.epoch, "finished_at": now if step.finished else None,
        "started_at": step.started_at, "attempt": step.attempt, "retries": step.retries,
    })


def _real(value: float | None) -> float | None:
    """A REAL column's value (a time) as a float: ``RETURNING`` gives a whole number kept in
    one as an int, where a SELECT of the same row gives a float (SQLite stores such a value as
    an integer and converts it back on reads, but not in RETURNING)."""
    return None if value is None else float(value)


def _entry(row: sqlite3.Row) -> OutboxEntry:
    return OutboxEntry(
        id=row["id"], namespace=row["namespace"], run_id=row["run_id"], seq=row["seq"],
        index=row["idx"], topic=row["topic"], payload=_json.loads(row["payload"]),
        created_at=float(row["created_at"]), attempts=row["attempts"],
        next_at=float(row["next_at"]), delivered_at=_real(row["delivered_at"]),
        dead=bool(row["dead"]), error=row["error"],
        trace_context=row["trace_context"],
    )


def _pause(row: sqlite3.Row) -> Pause:
    return Pause(
        id=row["id"], namespace=row["namespace"], tenant=row["tenant"], run_id=row["run_id"],
        name=row["name"], request=_json.loads(row["request"]), status=row["status"],
        decision=_json.loads(row["decision"]), created_at=float(row["created_at"]),
        expires_at=_real(row["expires_at"]), resolved_at=_real(row["resolved_at"]),
        notified=bool(row["notified"]),
    )


# A run's row as SQLite gives it: JSON as text, 0/1 for bools, a time kept as a whole number
# as an int (see _real), a status as its text.
_RUNS = RunRows({"json": _json.loads, "status": STATUSES.__getitem__, "real": _real,
                 "bool": bool}, lambda progress, at: progress_of(progress, _real(at)))


def _run(row: sqlite3.Row) -> Run:
    """The Run of a row of runs (every column of :data:`shoal.backends._runs.COLUMNS`)."""
    return _RUNS.of_mapping(row)
