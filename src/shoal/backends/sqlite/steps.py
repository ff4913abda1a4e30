"""Checkpoints, signals and tree state (:class:`shoal.ports.Checkpoints`,
:class:`shoal.ports.Trees`) in the SQLite store's tables. Each write is fenced on the run's
(owner, lease_epoch); checkpoints, progress and suspensions go through the group commit
(:mod:`shoal.backends.sqlite.batches`), with the settlements of other runs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from shoal import _json
from shoal.backends._sql import queries
from shoal.backends.sqlite.batches import GroupCommit
from shoal.backends.sqlite.connection import SQLiteConnection, unavailable_on_failure
from shoal.backends.sqlite.rows import _run, put_step
from shoal.types import (
    JSON,
    Fence,
    OutboxEntry,
    Progress,
    Run,
    SignalWait,
    Step,
)

_Q = queries("sqlite")


@unavailable_on_failure
class SQLiteSteps:
    """A run's steps, signals, tree keys and children for
    :class:`~shoal.backends.sqlite.SQLiteStore`."""

    def __init__(self, connection: SQLiteConnection, writes: GroupCommit) -> None:
        self.connection = connection
        self.writes = writes   # shared with the settlements (SQLiteRuns)

    async def load_steps(self, run_id: str) -> list[Step]:
        rows = self.connection.db.execute(_Q["load_steps"], {"run_id": run_id}).fetchall()
        return [Step(r["seq"], r["name"], _json.loads(r["output"]), bool(r["finished"]),
                     r["epoch"], r["started_at"], r["attempt"], r["retries"]) for r in rows]

    def _fenced(self, db: sqlite3.Connection, fence: Fence, lease: float, now: float) -> bool:
        cur = db.execute(_Q["fence_extend"], {"expires": now + self.connection.waited + lease,
                                              "run_id": fence.run_id,
                                              "owner": fence.owner, "epoch": fence.epoch})
        return cur.rowcount == 1

    async def checkpoint_step(
        self, fence: Fence, step: Step, lease: float, now: float,
        outbox: Sequence[OutboxEntry] = (),
    ) -> bool:
        # with the checkpoints and settlements of other runs, each fenced on its own
        return await self.writes.write(
            lambda db: self._checkpoint(db, fence, step, lease, now, outbox))

    def _checkpoint(
        self, db: sqlite3.Connection, fence: Fence, step: Step, lease: float, now: float,
        outbox: Sequence[OutboxEntry],
    ) -> bool:
        """``checkpoint_step``'s statements, in the caller's write transaction."""
        if not self._fenced(db, fence, lease, now):
            return False
        if outbox:
            # the transaction holds the write lock: this reads the step as it is, and no other
            # writer can finish it before the entries and the step are written
            done = db.execute(_Q["step_finished"], {"run_id": fence.run_id,
                                                    "seq": step.seq}).fetchone()
            if done is None or not done["finished"]:
                for e in outbox:
                    db.execute(_Q["insert_outbox"], {
                        "id": e.id, "namespace": e.namespace, "run_id": e.run_id,
                        "seq": e.seq, "idx": e.index, "topic": e.topic,
                        "payload": _json.dumps(e.payload), "created_at": e.created_at,
                        "now": now, "trace_context": e.trace_context})
        put_step(db, fence, step, now)
        return True

    async def record_progress(self, fence: Fence, progress: Progress) -> bool:
        # with the checkpoints and settlements of other runs (group commit)
        args = {"progress": _json.dumps(progress.to_json()), "progress_at": progress.at,
                "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch}
        return await self.writes.write(
            lambda db: db.execute(_Q["record_progress"], args).rowcount == 1)

    async def suspend_run(
        self,
        fence: Fence,
        step: Step,
        status: Literal["sleeping", "waiting"],
        run_at: float | None,
        wait_for: str | None,
        now: float,
    ) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            cur = db.execute(_Q["suspend"], {
                "status": status, "run_at": run_at, "wait_for": wait_for,
                "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
            })
            if cur.rowcount != 1:
                return False
            put_step(db, fence, step, now)
            return True

        return await self.writes.write(write)

    async def wait_signal(
        self, fence: Fence, step: Step, signal: str, deadline: float | None, now: float
    ) -> SignalWait | None:
        async with self.connection.tx() as db:
            held = db.execute(_Q["fence_check"], {"run_id": fence.run_id, "owner": fence.owner,
                                                  "epoch": fence.epoch}).fetchone()
            if held is None:
                return None
            row = db.execute(_Q["next_signal"], {"run_id": fence.run_id,
                                                 "name": signal}).fetchone()
            if row is not None:
                db.execute(_Q["consume_signal"], {"id": row["id"]})
                payload = _json.loads(row["payload"])
                put_step(db, fence, replace(step, output={"payload": payload},
                                            finished=True), now)
                return SignalWait(received=True, payload=payload)
            if deadline is not None and deadline <= now:
                return SignalWait(received=False, parked=False)
            db.execute(_Q["suspend"], {
                "status": "waiting", "run_at": deadline, "wait_for": signal,
                "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
            })
            put_step(db, fence, step, now)
            return SignalWait(received=False, parked=True)

    async def send_signal(
        self, run_id: str, name: str, payload: JSON, signal_id: str, now: float
    ) -> Run | None:
        async with self.connection.tx() as db:
            row = db.execute(_Q["get_run"], {"id": run_id}).fetchone()
            if row is None:
                return None
            db.execute(_Q["insert_signal"], {"id": signal_id, "run_id": run_id, "name": name,
                                             "payload": _json.dumps(payload), "now": now})
            woken = db.execute(_Q["wake_waiter"], {"run_id": run_id, "name": name,
                                                   "now": now}).fetchone()
            return _run(woken if woken is not None else row)

    async def save_tree_key(
        self, root_id: str, key: str, value: JSON, claimant: str, now: float
    ) -> bool:
        async with self.connection.tx() as db:
            cur = db.execute(_Q["insert_tree_key"], {
                "root_id": root_id, "key": key, "value": _json.dumps(value),
                "claimant": claimant, "now": now})
            if cur.rowcount == 1:
                return True
            row = db.execute(_Q["get_tree_key"], {"root_id": root_id, "key": key}).fetchone()
            return row is not None and row["claimant"] == claimant

    async def get_tree_key(self, root_id: str, key: str) -> JSON:
        row = self.connection.one(_Q["get_tree_key"], {"root_id": root_id, "key": key})
        return None if row is None else _json.loads(row["value"])

    async def tree_keys(self, root_id: str) -> list[tuple[str, str]]:
        rows = self.connection.db.execute(_Q["list_tree_keys"], {"root_id": root_id}).fetchall()
        return [(row["key"], row["tenant"]) for row in rows]

    async def wait_child(self, fence: Fence, step: Step, child_id: str, now: float) -> Run | None:
        async with self.connection.tx() as db:
            held = db.execute(_Q["fence_check"], {"run_id": fence.run_id, "owner": fence.owner,
                                                  "epoch": fence.epoch}).fetchone()
            if held is None:
                return None
            row = db.execute(_Q["get_run"], {"id": child_id}).fetchone()
            if row is None:
                raise KeyError(f"no child run {child_id!r}")
            child = _run(row)
            if child.status.final:
                done = replace(step, output={"status": child.status.value,
                                             "output": child.output, "error": child.error},
                               finished=True)
                put_step(db, fence, done, now)
            else:
                db.execute(_Q["suspend"], {
                    "status": "waiting", "run_at": None, "wait_for": f"shoal.child:{child_id}",
                    "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch})
                put_step(db, fence, step, now)
            return child
