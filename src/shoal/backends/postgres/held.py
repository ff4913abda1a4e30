"""The counts :mod:`shoal.backends._held` asks of the PostgreSQL store (``held_*`` in
queries.sql), each one bounded statement, reads only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, LiteralString

from shoal.backends.postgres.connections import Connections, Q


class PostgresHoldCounts:
    """:class:`~shoal.backends._held.HoldCounts` on ``db``."""

    def __init__(self, db: Connections) -> None:
        self.db = db

    async def _n(self, query: LiteralString, args: dict[str, Any]) -> int:
        row = await self.db.one(query, args)
        return 0 if row is None else int(row["n"])

    async def running_counts(
        self, namespace: str, workflows: Sequence[str]
    ) -> dict[tuple[str, str], int]:
        rows = await self.db.all(Q["held_running"], {"namespace": namespace,
                                                     "workflows": list(workflows)})
        return {(row["workflow"], row["tenant"]): int(row["n"]) for row in rows}

    async def first_starts(self, namespace: str, workflow: str, since: float, limit: int) -> int:
        return await self._n(Q["held_first_starts"], {
            "namespace": namespace, "workflow": workflow, "since": since, "limit": limit})

    async def count_due(
        self, namespace: str, workflow: str, now: float, cap: int, *,
        tenants: Sequence[str] | None = None, skip: Sequence[str] = (),
        first_only: bool = False, key_limit: int | None = None,
    ) -> int:
        return await self._n(Q["held_count_due"], {
            "namespace": namespace, "workflow": workflow, "now": now, "cap": cap,
            "tenants": None if tenants is None else list(tenants), "skip": list(skip),
            "first_only": first_only or key_limit is not None, "key_limit": key_limit})

    async def key_holders(self, namespace: str, workflow: str, key: str, cap: int) -> int:
        return await self._n(Q["held_key_holders"], {
            "namespace": namespace, "workflow": workflow, "key": key, "cap": cap})
