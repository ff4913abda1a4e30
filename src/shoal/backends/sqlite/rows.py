"""Rows of the SQLite store's tables as shoal's records, and the one statement several parts
make (a step's checkpoint)."""

from __future__ import annotations

import sqlite3

from shoal import _json
from shoal.backends._sql import progress_of, queries
from shoal.types import Fence, OutboxEntry, Pause, Run, RunStatus, Step

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


def _run(row: sqlite3.Row) -> Run:
    return Run(
        id=row["id"], namespace=row["namespace"], tenant=row["tenant"],
        workflow=row["workflow"], input=_json.loads(row["input"]),
        output=_json.loads(row["output"]), error=row["error"], status=RunStatus(row["status"]),
        priority=row["priority"], created_at=float(row["created_at"]),
        run_at=_real(row["run_at"]),
        attempts=row["attempts"], max_attempts=row["max_attempts"],
        concurrency_key=row["concurrency_key"], idempotency_key=row["idempotency_key"],
        owner=row["owner"], lease_expires_at=_real(row["lease_expires_at"]),
        lease_epoch=row["lease_epoch"], cancel_requested=bool(row["cancel_requested"]),
        version=row["version"], parent_id=row["parent_id"], root_id=row["root_id"],
        wait_for=row["wait_for"], held=bool(row["held"]), started_at=_real(row["started_at"]),
        finished_at=_real(row["finished_at"]), resume_reason=row["resume_reason"],
        traceback=row["traceback"],
        progress=progress_of(row["progress"], _real(row["progress_at"])),
        trace_context=row["trace_context"],
    )
