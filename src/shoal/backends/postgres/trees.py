"""A run tree's shared state and its children in the PostgreSQL store
(:class:`shoal.ports.Trees`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shoal import _json
from shoal.backends.postgres.connections import Connections, Q
from shoal.backends.postgres.records import child_wait, run_of, step_args
from shoal.types import JSON, Fence, Run, Step


class PostgresTrees:
    """The keys of run trees and the waits for children, on ``db``."""

    def __init__(self, db: Connections) -> None:
        self.db = db

    async def save_tree_key(
        self, root_id: str, key: str, value: JSON, claimant: str, now: float
    ) -> bool:
        args = {"root_id": root_id, "key": key, "value": _json.dumps(value),
                "claimant": claimant, "now": now}
        return await self.db.retry(lambda: self._save_tree_key(args, claimant))

    async def _save_tree_key(self, args: dict[str, Any], claimant: str) -> bool:
        # Two statements, each its own transaction: when the insert meets a concurrent insert of
        # the key it waits for it and inserts nothing, and only a later statement's snapshot is
        # sure to see the row that won.
        async with self.db.connection() as conn:
            execute = self.db.on(conn)
            if await execute("insert_tree_key", args):
                return True
            rows = await execute("get_tree_key", args)
            return bool(rows) and rows[0]["claimant"] == claimant

    async def get_tree_key(self, root_id: str, key: str) -> JSON:
        row = await self.db.one(Q["get_tree_key"], {"root_id": root_id, "key": key})
        return None if row is None else _json.loads(row["value"])

    async def tree_keys(self, root_id: str) -> list[tuple[str, str]]:
        rows = await self.db.all(Q["list_tree_keys"], {"root_id": root_id})
        return [(row["key"], row["tenant"]) for row in rows]

    async def wait_child(self, fence: Fence, step: Step, child_id: str, now: float) -> Run | None:
        return await self.db.retry(lambda: self._wait_child(fence, step, child_id, now))

    async def _wait_child(
        self, fence: Fence, step: Step, child_id: str, now: float
    ) -> Run | None:
        async with self.db.connection() as conn, self.db.transaction(conn):
            fenced = {"run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch}
            if await (await conn.execute(Q["fence_lock"], fenced)).fetchone() is None:
                return None
            # The child's row is locked (after the parent's, as a statement ending the child
            # locks them) until the park commits, so the child cannot end between this check
            # and the park unseen: the runs_ended trigger of a statement ending it runs after
            # this commit and finds the parent waiting.
            row = await (await conn.execute(Q["lock_child"], {"id": child_id})).fetchone()
            if row is None:
                raise KeyError(f"no child run {child_id!r}")
            child = run_of(row)
            if child.status.final:
                done = replace(step, output={"status": child.status.value,
                                             "output": child.output, "error": child.error},
                               finished=True)
                await conn.execute(Q["put_step"], step_args(fence, done, now))
            else:
                await conn.execute(Q["suspend"], {
                    **step_args(fence, step, now), "status": "waiting", "run_at": None,
                    "wait_for": child_wait(child_id)})
            return child
