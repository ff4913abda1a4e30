"""The counts :mod:`shoal.backends._held` asks of the SQLite store (``held_*`` in
queries.sql), each one bounded statement, reads only."""

from __future__ import annotations

from collections.abc import Sequence

from shoal import _json
from shoal.backends._sql import queries
from shoal.backends.sqlite.connection import SQLiteConnection, unavailable_on_failure

_Q = queries("sqlite")


@unavailable_on_failure
class SQLiteHoldCounts:
    """:class:`~shoal.backends._held.HoldCounts` for :class:`~shoal.backends.sqlite.SQLiteStore`."""

    def __init__(self, connection: SQLiteConnection) -> None:
        self.connection = connection

    def _n(self, name: str, args: dict[str, object]) -> int:
        row = self.connection.one(_Q[name], args)
        return 0 if row is None else int(row["n"])

    async def running_counts(
        self, namespace: str, workflows: Sequence[str]
    ) -> dict[tuple[str, str], int]:
        rows = self.connection.db.execute(_Q["held_running"], {
            "namespace": namespace, "workflows": _json.dumps(list(workflows))}).fetchall()
        return {(row["workflow"], row["tenant"]): int(row["n"]) for row in rows}

    async def first_starts(self, namespace: str, workflow: str, since: float, limit: int) -> int:
        return self._n("held_first_starts", {"namespace": namespace, "workflow": workflow,
                                             "since": since, "limit": limit})

    async def count_due(
        self, namespace: str, workflow: str, now: float, cap: int, *,
        tenants: Sequence[str] | None = None, skip: Sequence[str] = (),
        first_only: bool = False, key_limit: int | None = None,
    ) -> int:
        return self._n("held_count_due", {
            "namespace": namespace, "workflow": workflow, "now": now, "cap": cap,
            "tenants": None if tenants is None else _json.dumps(list(tenants)),
            "skip": _json.dumps(list(skip)), "first_only": int(first_only or key_limit is not None),
            "key_limit": key_limit})

    async def key_holders(self, namespace: str, workflow: str, key: str, cap: int) -> int:
        return self._n("held_key_holders", {"namespace": namespace, "workflow": workflow,
                                            "key": key, "cap": cap})
