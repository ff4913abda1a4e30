"""A run's steps in the PostgreSQL store (:class:`shoal.ports.Checkpoints`): checkpoints and
progress (batched: :class:`~shoal.backends.postgres.batcher.Batcher`), sleeps, signals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from shoal import _json
from shoal.backends.postgres.batcher import Batcher
from shoal.backends.postgres.connections import Connections, Q
from shoal.backends.postgres.records import run_of, step_args
from shoal.types import JSON, Fence, OutboxEntry, Progress, Run, SignalWait, Step


class PostgresCheckpoints:
    """The steps of runs, on ``db``, a signal announced on ``channel``."""

    def __init__(self, db: Connections, channel: str) -> None:
        self.db = db
        self.channel = channel
        self.checkpoints = Batcher(db, channel, "checkpoint", (
            "id", "owner", "epoch", "expires", "seq", "name", "output", "finished",
            "finished_at", "started_at", "attempt", "retries"))
        self.progress = Batcher(db, channel, "record_progress",
                                ("id", "owner", "epoch", "progress", "progress_at"))

    async def load_steps(self, run_id: str) -> list[Step]:
        rows = await self.db.all(Q["load_steps"], {"run_id": run_id})
        return [Step(r["seq"], r["name"], _json.loads(r["output"]), r["finished"], r["epoch"],
                     r["started_at"], r["attempt"], r["retries"]) for r in rows]

    async def checkpoint_step(
        self, fence: Fence, step: Step, lease: float, now: float,
        outbox: Sequence[OutboxEntry] = (),
    ) -> bool:
        if outbox:
            # A step that sent entries takes a transaction of its own rather than the batch: the
            # batch statement takes one row per run, and checking "this step is not finished
            # yet" in it would read the steps as of before its row locks were granted. Here the
            # run row is locked (fence_extend) before the statement that checks the step and
            # writes entries and step together, so it sees every committed write of the run;
            # fenced and atomic as a batched row is. Such steps are the few; the rest keep the
            # group commit.
            return await self.db.retry(
                lambda: self._checkpoint_outbox(fence, step, lease, now, outbox))
        return await self.checkpoints.write(fence.run_id, {
            "id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
            "expires": now + lease, "seq": step.seq, "name": step.name,
            "output": _json.dumps(step.output), "finished": step.finished,
            "finished_at": now if step.finished else None, "started_at": step.started_at,
            "attempt": step.attempt, "retries": step.retries,
        })

    async def _checkpoint_outbox(
        self, fence: Fence, step: Step, lease: float, now: float, outbox: Sequence[OutboxEntry]
    ) -> bool:
        async with self.db.connection() as conn, self.db.transaction(conn):
            fenced = {"run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
                      "expires": now + lease}
            if await (await conn.execute(Q["fence_extend"], fenced)).fetchone() is None:
                return False
            await conn.execute(Q["checkpoint_outbox"], {
                **step_args(fence, step, now), "now": now,
                "o_id": [e.id for e in outbox], "o_namespace": [e.namespace for e in outbox],
                "o_run_id": [e.run_id for e in outbox], "o_seq": [e.seq for e in outbox],
                "o_idx": [e.index for e in outbox], "o_topic": [e.topic for e in outbox],
                "o_payload": [_json.dumps(e.payload) for e in outbox],
                "o_created_at": [e.created_at for e in outbox],
                "o_trace_context": [e.trace_context for e in outbox],
            })
            return True

    async def record_progress(self, fence: Fence, progress: Progress) -> bool:
        # batched with the progress of other runs: one statement, one commit
        return await self.progress.write(fence.run_id, {
            "id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
            "progress": _json.dumps(progress.to_json()), "progress_at": progress.at,
        })

    async def suspend_run(
        self,
        fence: Fence,
        step: Step,
        status: Literal["sleeping", "waiting"],
        run_at: float | None,
        wait_for: str | None,
        now: float,
    ) -> bool:
        args = {**step_args(fence, step, now), "status": status, "run_at": run_at,
                "wait_for": wait_for}
        row = await self.db.retry(lambda: self.db.one(Q["suspend"], args))
        return row is not None and row["held"] == 1

    async def wait_signal(
        self, fence: Fence, step: Step, signal: str, deadline: float | None, now: float
    ) -> SignalWait | None:
        return await self.db.retry(lambda: self._wait_signal(fence, step, signal, deadline, now))

    async def _wait_signal(
        self, fence: Fence, step: Step, signal: str, deadline: float | None, now: float
    ) -> SignalWait | None:
        async with self.db.connection() as conn, self.db.transaction(conn):
            fenced = {"run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch}
            if await (await conn.execute(Q["fence_lock"], fenced)).fetchone() is None:
                return None
            row = await (await conn.execute(Q["consume_signal"], {
                "run_id": fence.run_id, "name": signal})).fetchone()
            if row is not None:
                payload = _json.loads(row["payload"])
                done = replace(step, output={"payload": payload}, finished=True)
                await conn.execute(Q["put_step"], step_args(fence, done, now))
                return SignalWait(received=True, payload=payload)
            if deadline is not None and deadline <= now:
                return SignalWait(received=False, parked=False)
            await conn.execute(Q["suspend"], {
                **step_args(fence, step, now), "status": "waiting", "run_at": deadline,
                "wait_for": signal,
            })
            return SignalWait(received=False, parked=True)

    async def send_signal(
        self, run_id: str, name: str, payload: JSON, signal_id: str, now: float
    ) -> Run | None:
        return await self.db.retry(lambda: self._send_signal(run_id, name, payload, signal_id, now))

    async def _send_signal(
        self, run_id: str, name: str, payload: JSON, signal_id: str, now: float
    ) -> Run | None:
        async with self.db.connection() as conn, self.db.transaction(conn):
            row = await (await conn.execute(Q["lock_run"], {"id": run_id})).fetchone()
            if row is None:
                return None
            woken = await (await conn.execute(Q["signal_and_wake"], {
                "id": signal_id, "run_id": run_id, "name": name,
                "payload": _json.dumps(payload), "now": now, "channel": self.channel,
            })).fetchone()
            return run_of(woken if woken is not None else row)
