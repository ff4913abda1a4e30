"""The PostgreSQL store's rows as records, and the arguments its statements share.

A run's columns are declared once, in :mod:`shoal.backends._runs`; :data:`RUNS` reads them with
PostgreSQL's decoders (psycopg hands over numbers, booleans and NULLs as Python values already:
only JSON text and a status's text are decoded).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.rows import DictRow

from shoal import _json
from shoal.backends._runs import STATUSES, RunRows
from shoal.backends._sql import progress_of
from shoal.types import Fence, NewRun, OutboxEntry, Pause, Run, Step

RUNS = RunRows({"json": _json.loads, "status": STATUSES.__getitem__}, progress_of)


def run_of(row: DictRow) -> Run:
    """The Run of a row of runs read as a dict."""
    return RUNS.of_mapping(row)


def claimed(names: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> list[Run]:
    """The Runs of a claim's rows, read as tuples whose columns are ``names``, in claim order
    (the order the engine starts them in)."""
    runs = RUNS.of_tuples(names, rows)
    runs.sort(key=lambda r: (-r.priority, r.created_at, r.id))
    return runs


def entry_of(row: DictRow) -> OutboxEntry:
    return OutboxEntry(
        id=row["id"], namespace=row["namespace"], run_id=row["run_id"], seq=row["seq"],
        index=row["idx"], topic=row["topic"], payload=_json.loads(row["payload"]),
        created_at=row["created_at"], attempts=row["attempts"], next_at=row["next_at"],
        delivered_at=row["delivered_at"], dead=row["dead"], error=row["error"],
        trace_context=row["trace_context"],
    )


def pause_of(row: DictRow) -> Pause:
    return Pause(
        id=row["id"], namespace=row["namespace"], tenant=row["tenant"], run_id=row["run_id"],
        name=row["name"], request=_json.loads(row["request"]), status=row["status"],
        decision=_json.loads(row["decision"]), created_at=row["created_at"],
        expires_at=row["expires_at"], resolved_at=row["resolved_at"], notified=row["notified"],
    )


def step_args(fence: Fence, step: Step, now: float) -> dict[str, Any]:
    """The arguments of the statements that write a step under a run's fence (put_step,
    suspend, park_on_pause, checkpoint_outbox)."""
    return {
        "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
        "seq": step.seq, "name": step.name, "output": _json.dumps(step.output),
        "finished": step.finished, "finished_at": now if step.finished else None,
        "started_at": step.started_at, "attempt": step.attempt, "retries": step.retries,
    }


def input_text(new: NewRun) -> str:
    """The JSON text of a new run's input (the caller's, when it gave it)."""
    return new.input_json if new.input_json is not None else _json.dumps(new.input)


def pause_wait(pause_id: str) -> str:
    """What a run parked on a pause waits for (``Run.wait_for``)."""
    return f"shoal.pause:{pause_id}"


def child_wait(child_id: str) -> str:
    """What a run parked on a child run waits for (``Run.wait_for``); the runs_ended trigger
    (0003_trees.sql) matches it."""
    return f"shoal.child:{child_id}"
