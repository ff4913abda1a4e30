"""Approvals (:class:`shoal.ports.Pauses`) in the SQLite store's tables: each write one
``BEGIN IMMEDIATE`` transaction of the store, a pause resolved exactly once.
"""

from __future__ import annotations

import sqlite3

from shoal import _json
from shoal.backends._sql import queries
from shoal.backends.sqlite.connection import SQLiteConnection, unavailable_on_failure
from shoal.backends.sqlite.rows import _pause, put_step
from shoal.types import (
    JSON,
    Fence,
    Pause,
    PauseWait,
    Step,
)

_Q = queries("sqlite")


@unavailable_on_failure
class SQLitePauses:
    """Pauses and their notifications for :class:`~shoal.backends.sqlite.SQLiteStore`."""

    def __init__(self, connection: SQLiteConnection) -> None:
        self.connection = connection

    async def create_pause(self, fence: Fence, step: Step, pause: Pause, now: float) -> bool:
        async with self.connection.tx() as db:
            cur = db.execute(_Q["suspend"], {
                "status": "waiting", "run_at": None, "wait_for": f"shoal.pause:{pause.id}",
                "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
            })
            if cur.rowcount != 1:
                return False
            db.execute(_Q["insert_pause"], {
                "id": pause.id, "namespace": pause.namespace, "tenant": pause.tenant,
                "run_id": pause.run_id, "name": pause.name,
                "request": _json.dumps(pause.request), "created_at": pause.created_at,
                "expires_at": pause.expires_at,
            })
            put_step(db, fence, step, now)
            return True

    async def get_pause(self, pause_id: str) -> Pause | None:
        row = self.connection.one(_Q["get_pause"], {"id": pause_id})
        return None if row is None else _pause(row)

    async def wait_pause(
        self, fence: Fence, step: Step, pause_id: str, now: float
    ) -> PauseWait | None:
        async with self.connection.tx() as db:
            held = db.execute(_Q["fence_check"], {"run_id": fence.run_id, "owner": fence.owner,
                                                  "epoch": fence.epoch}).fetchone()
            if held is None:
                return None
            row = db.execute(_Q["get_pause"], {"id": pause_id}).fetchone()
            pause = None if row is None else _pause(row)
            if pause is None or pause.status != "pending":
                return PauseWait(pause, parked=False)
            db.execute(_Q["suspend"], {
                "status": "waiting", "run_at": None, "wait_for": f"shoal.pause:{pause_id}",
                "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch})
            put_step(db, fence, step, now)
            return PauseWait(pause, parked=True)

    def _resolve(self, db: sqlite3.Connection, pause_id: str, decision: JSON,
                 now: float) -> Pause | None:
        row = db.execute(_Q["resolve_pause"], {"id": pause_id, "decision": _json.dumps(decision),
                                               "now": now}).fetchone()
        if row is None:
            return None
        db.execute(_Q["wake_paused"], {"run_id": row["run_id"], "now": now,
                                       "wait_for": f"shoal.pause:{pause_id}"})
        return _pause(row)

    async def resolve_pause(
        self, pause_id: str, decision: JSON, now: float
    ) -> tuple[Pause | None, bool]:
        async with self.connection.tx() as db:
            resolved = self._resolve(db, pause_id, decision, now)
            if resolved is not None:
                return resolved, True
            row = db.execute(_Q["get_pause"], {"id": pause_id}).fetchone()
            return (None if row is None else _pause(row)), False

    async def list_pauses(
        self, namespace: str, *, tenant: str | None = None, limit: int = 100
    ) -> list[Pause]:
        rows = self.connection.db.execute(_Q["list_pauses"], {
            "namespace": namespace, "tenant": tenant, "limit": limit}).fetchall()
        return [_pause(r) for r in rows]

    async def expire_pauses(self, namespace: str, now: float) -> list[Pause]:
        args = {"namespace": namespace, "now": now}
        if self.connection.one(_Q["expiring_pauses"], args) is None:
            return []
        decision = {"approved": False, "data": None, "by": None, "reason": "expired"}
        out = []
        async with self.connection.tx() as db:
            for row in db.execute(_Q["expiring_pauses"], args).fetchall():
                resolved = self._resolve(db, row["id"], decision, now)
                if resolved is not None:
                    out.append(resolved)
        return out

    async def claim_notifications(
        self, namespace: str, now: float, lease: float, limit: int
    ) -> list[Pause]:
        args = {"namespace": namespace, "now": now, "limit": limit}
        if self.connection.one(_Q["notification_candidates"], args) is None:
            return []
        out = []
        async with self.connection.tx() as db:
            for row in db.execute(_Q["notification_candidates"], args).fetchall():
                taken = db.execute(_Q["take_notification"], {"id": row["id"], "now": now,
                                                             "until": now + lease}).fetchone()
                if taken is not None:
                    out.append(_pause(taken))
        return out

    async def mark_notified(self, pause_id: str) -> None:
        async with self.connection.tx() as db:
            db.execute(_Q["mark_notified"], {"id": pause_id})

    async def prune_pauses(self, namespace: str, before: float, limit: int) -> int:
        # an idle poll takes no write lock to find nothing to prune
        args = {"namespace": namespace, "before": before}
        if self.connection.one(_Q["any_pause_to_prune"], args) is None:
            return 0
        async with self.connection.tx() as db:
            return db.execute(_Q["prune_pauses"], {**args, "limit": limit}).rowcount
