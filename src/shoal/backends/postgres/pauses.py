"""Pauses (human approvals) in the PostgreSQL store (:class:`shoal.ports.Pauses`)."""

from __future__ import annotations

from typing import Any

from shoal import _json
from shoal.backends.postgres.connections import Connections, Q
from shoal.backends.postgres.records import pause_of, pause_wait, step_args
from shoal.types import JSON, Fence, Pause, PauseWait, Step

_EXPIRED = {"approved": False, "data": None, "by": None, "reason": "expired"}


class PostgresPauses:
    """Pauses and the runs parked on them, on ``db``, a resolution announced on ``channel``."""

    def __init__(self, db: Connections, channel: str) -> None:
        self.db = db
        self.channel = channel

    async def create_pause(self, fence: Fence, step: Step, pause: Pause, now: float) -> bool:
        args = {**step_args(fence, step, now), "wait_for": pause_wait(pause.id),
                "pause_id": pause.id, "namespace": pause.namespace, "tenant": pause.tenant,
                "pause_name": pause.name, "request": _json.dumps(pause.request),
                "created_at": pause.created_at, "expires_at": pause.expires_at}
        row = await self.db.retry(lambda: self.db.one(Q["park_on_pause"], args))
        return row is not None and row["held"] == 1

    async def get_pause(self, pause_id: str) -> Pause | None:
        row = await self.db.one(Q["get_pause"], {"id": pause_id})
        return None if row is None else pause_of(row)

    async def wait_pause(
        self, fence: Fence, step: Step, pause_id: str, now: float
    ) -> PauseWait | None:
        return await self.db.retry(lambda: self._wait_pause(fence, step, pause_id, now))

    async def _wait_pause(
        self, fence: Fence, step: Step, pause_id: str, now: float
    ) -> PauseWait | None:
        async with self.db.connection() as conn, self.db.transaction(conn):
            fenced = {"run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch}
            if await (await conn.execute(Q["fence_lock"], fenced)).fetchone() is None:
                return None
            # The run row is locked until the park commits. resolve_pause locks it before the
            # pause, so it resolves either before this read (seen here) or after the park; an
            # expiry resolving the pause meanwhile updates the run last, waiting for this
            # commit, and then finds it parked: either way the run is woken, never left behind.
            row = await (await conn.execute(Q["get_pause"], {"id": pause_id})).fetchone()
            pause = None if row is None else pause_of(row)
            if pause is None or pause.status != "pending":
                return PauseWait(pause, parked=False)
            await conn.execute(Q["suspend"], {
                **step_args(fence, step, now), "status": "waiting", "run_at": None,
                "wait_for": pause_wait(pause_id)})
            return PauseWait(pause, parked=True)

    async def resolve_pause(
        self, pause_id: str, decision: JSON, now: float
    ) -> tuple[Pause | None, bool]:
        return await self.db.retry(lambda: self._resolve_pause(pause_id, decision, now))

    async def _resolve_pause(
        self, pause_id: str, decision: JSON, now: float
    ) -> tuple[Pause | None, bool]:
        async with self.db.connection() as conn, self.db.transaction(conn):
            # the run row first: a resolution racing the park or a cancel waits for it
            await conn.execute(Q["lock_pause_run"], {"id": pause_id})
            row = await (await conn.execute(Q["resolve_pause"], {
                "id": pause_id, "decision": _json.dumps(decision), "now": now,
                "channel": self.channel})).fetchone()
            if row is not None:
                return pause_of(row), True
            # unknown, or resolved already (by another call: exactly one wins)
            row = await (await conn.execute(Q["get_pause"], {"id": pause_id})).fetchone()
            return (None if row is None else pause_of(row)), False

    async def list_pauses(
        self, namespace: str, *, tenant: str | None = None, limit: int = 100
    ) -> list[Pause]:
        rows = await self.db.all(Q["list_pauses"], {"namespace": namespace, "tenant": tenant,
                                                   "limit": limit})
        return [pause_of(r) for r in rows]

    async def expire_pauses(self, namespace: str, now: float) -> list[Pause]:
        args: dict[str, Any] = {"namespace": namespace, "now": now}
        # one cheap statement on every poll; a transaction only when something has expired
        if await self.db.one(Q["expiring_pauses"], args) is None:
            return []
        return await self.db.retry(lambda: self._expire_pauses(args))

    async def _expire_pauses(self, args: dict[str, Any]) -> list[Pause]:
        async with self.db.connection() as conn, self.db.transaction(conn):
            locked = await (await conn.execute(Q["lock_expiring_runs"], args)).fetchall()
            if not locked:
                return []
            rows = await (await conn.execute(Q["expire_pauses"], {
                **args, "run_ids": [r["id"] for r in locked], "decision": _json.dumps(_EXPIRED),
                "channel": self.channel})).fetchall()
            return [pause_of(r) for r in rows]

    async def claim_notifications(
        self, namespace: str, now: float, lease: float, limit: int
    ) -> list[Pause]:
        if limit <= 0:
            return []
        rows = await self.db.retry(lambda: self.db.all(Q["claim_notifications"], {
            "namespace": namespace, "now": now, "until": now + lease, "limit": limit}))
        return sorted((pause_of(r) for r in rows), key=lambda p: (p.created_at, p.id))

    async def mark_notified(self, pause_id: str) -> None:
        await self.db.retry(lambda: self.db.all(Q["mark_notified"], {"id": pause_id}, fetch=False))

    async def prune_pauses(self, namespace: str, before: float, limit: int) -> int:
        args = {"namespace": namespace, "before": before, "limit": limit}
        return len(await self.db.retry(lambda: self.db.all(Q["prune_pauses"], args)))
