"""The outbox of the PostgreSQL store (:class:`shoal.ports.Outbox`): entries a step sent, their
deliveries, the dead letters and their redrive."""

from __future__ import annotations

from collections.abc import Sequence

from shoal.backends.postgres.connections import Connections, Q
from shoal.backends.postgres.records import entry_of
from shoal.types import OutboxEntry


class PostgresOutbox:
    """The outbox entries, on ``db``."""

    def __init__(self, db: Connections) -> None:
        self.db = db

    async def claim_outbox(
        self, namespace: str, topics: Sequence[str], now: float, lease: float, limit: int
    ) -> list[OutboxEntry]:
        if limit <= 0 or not topics:
            return []
        rows = await self.db.retry(lambda: self.db.all(Q["claim_outbox"], {
            "namespace": namespace, "topics": list(topics), "now": now, "until": now + lease,
            "limit": limit}))
        return sorted((entry_of(r) for r in rows), key=lambda e: (e.created_at, e.id))

    async def finish_delivery(
        self, entry_id: str, now: float, error: str | None = None,
        retry_at: float | None = None,
    ) -> None:
        if error is None:
            query, args = Q["outbox_delivered"], {"id": entry_id, "now": now}
        else:
            query, args = Q["outbox_failed"], {
                "id": entry_id, "error": error, "dead": retry_at is None,
                "next_at": retry_at if retry_at is not None else now}
        await self.db.retry(lambda: self.db.all(query, args, fetch=False))

    async def dead_letters(self, namespace: str, limit: int = 100) -> list[OutboxEntry]:
        rows = await self.db.all(Q["dead_letters"], {"namespace": namespace, "limit": limit})
        return [entry_of(r) for r in rows]

    async def redrive(self, namespace: str, entry_id: str,
                      now: float) -> tuple[OutboxEntry | None, bool]:
        async with self.db.connection() as conn, self.db.transaction(conn):
            one = {"id": entry_id, "namespace": namespace}
            row = await (await conn.execute(Q["redrive"], {**one, "now": now})).fetchone()
            if row is not None:
                return entry_of(row), True
            row = await (await conn.execute(Q["get_outbox"], one)).fetchone()
            return (None if row is None else entry_of(row)), False
