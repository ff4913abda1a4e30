"""The outbox (:class:`shoal.ports.Outbox`) in the SQLite store's tables: entries written with
their step's checkpoint (:mod:`shoal.backends.sqlite.steps`), claimed, delivered, redriven.
"""

from __future__ import annotations

from collections.abc import Sequence

from shoal import _json
from shoal.backends._sql import queries
from shoal.backends.sqlite.connection import SQLiteConnection, unavailable_on_failure
from shoal.backends.sqlite.rows import _entry
from shoal.types import (
    OutboxEntry,
)

_Q = queries("sqlite")


@unavailable_on_failure
class SQLiteOutbox:
    """Outbox deliveries for :class:`~shoal.backends.sqlite.SQLiteStore`."""

    def __init__(self, connection: SQLiteConnection) -> None:
        self.connection = connection

    async def claim_outbox(
        self, namespace: str, topics: Sequence[str], now: float, lease: float, limit: int
    ) -> list[OutboxEntry]:
        args = {"namespace": namespace, "now": now, "limit": limit,
                "topics": _json.dumps(list(topics))}
        if not topics or self.connection.one(_Q["outbox_candidates"], args) is None:
            return []
        out = []
        async with self.connection.tx() as db:
            for row in db.execute(_Q["outbox_candidates"], args).fetchall():
                taken = db.execute(_Q["take_outbox"], {"id": row["id"], "now": now,
                                                       "until": now + lease}).fetchone()
                if taken is not None:
                    out.append(_entry(taken))
        return out

    async def finish_delivery(
        self, entry_id: str, now: float, error: str | None = None,
        retry_at: float | None = None,
    ) -> None:
        async with self.connection.tx() as db:
            if error is None:
                db.execute(_Q["outbox_delivered"], {"id": entry_id, "now": now})
            else:
                db.execute(_Q["outbox_failed"], {
                    "id": entry_id, "error": error, "dead": int(retry_at is None),
                    "next_at": retry_at if retry_at is not None else now})

    async def dead_letters(self, namespace: str, limit: int = 100) -> list[OutboxEntry]:
        rows = self.connection.db.execute(_Q["dead_letters"], {"namespace": namespace,
                                                               "limit": limit}).fetchall()
        return [_entry(r) for r in rows]

    async def redrive(self, namespace: str, entry_id: str,
                      now: float) -> tuple[OutboxEntry | None, bool]:
        async with self.connection.tx() as db:
            one = {"id": entry_id, "namespace": namespace}
            row = db.execute(_Q["redrive"], {**one, "now": now}).fetchone()
            if row is not None:
                return _entry(row), True
            row = db.execute(_Q["get_outbox"], one).fetchone()
            return (None if row is None else _entry(row)), False
