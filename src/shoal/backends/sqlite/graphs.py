"""LangGraph checkpoints (:class:`shoal.ports.GraphCheckpoints`) in the SQLite store's own tables.

The semantics are those of the memory reference (:mod:`shoal.backends.memory.graphs`). Each write
is one ``BEGIN IMMEDIATE`` transaction of the store's connection (its ``tx``), its fence (if
any) checked inside it; a read is one or two ``SELECT`` outside any transaction (pending writes
only ever get added to a checkpoint, so one read after the other is consistent enough).
``graphs.sql`` has the statements.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from shoal.backends._sql import queries
from shoal.backends.sqlite.connection import SQLiteConnection, unavailable_on_failure
from shoal.types import JSON, Fence, GraphCheckpoint, GraphWrite

_Q = queries("sqlite", "graphs.sql")


def _checkpoint(row: sqlite3.Row, writes: tuple[GraphWrite, ...]) -> GraphCheckpoint:
    return GraphCheckpoint(
        thread_id=row["thread_id"], checkpoint_ns=row["checkpoint_ns"],
        checkpoint_id=row["checkpoint_id"], parent_id=row["parent_id"], type=row["type"],
        checkpoint=bytes(row["checkpoint"]), metadata=json.loads(row["metadata"]),
        run_id=row["run_id"], created_at=row["created_at"], writes=writes)


@unavailable_on_failure
class SQLiteGraphCheckpoints:
    """The checkpoints and pending writes of LangGraph threads for
    :class:`~shoal.backends.sqlite.SQLiteStore`. It keeps no state of its own."""

    def __init__(self, connection: SQLiteConnection) -> None:
        self.connection = connection

    @staticmethod
    def _fenced_out(db: sqlite3.Connection, fence: Fence | None) -> bool:
        if fence is None:
            return False
        args = {"run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch}
        return db.execute(_Q["graph_fence"], args).fetchone() is None

    async def put_graph_checkpoint(
        self, namespace: str, tenant: str, checkpoint: GraphCheckpoint, fence: Fence | None,
    ) -> bool:
        c = checkpoint
        args = {"namespace": namespace, "tenant": tenant, "thread_id": c.thread_id,
                "checkpoint_ns": c.checkpoint_ns, "checkpoint_id": c.checkpoint_id,
                "parent_id": c.parent_id, "run_id": c.run_id, "type": c.type,
                "checkpoint": c.checkpoint, "metadata": json.dumps(c.metadata),
                "created_at": c.created_at}
        async with self.connection.tx() as db:
            if self._fenced_out(db, fence):
                return False
            db.execute(_Q["graph_put_checkpoint"], args)
        return True

    async def put_graph_writes(
        self, namespace: str, tenant: str, thread_id: str, checkpoint_ns: str,
        checkpoint_id: str, writes: Sequence[GraphWrite], fence: Fence | None,
    ) -> bool:
        name = {"namespace": namespace, "tenant": tenant, "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}
        async with self.connection.tx() as db:
            if self._fenced_out(db, fence):
                return False
            db.executemany(_Q["graph_put_write"], [
                {**name, "task_id": w.task_id, "idx": w.idx, "channel": w.channel,
                 "type": w.type, "value": w.value, "task_path": w.task_path} for w in writes])
        return True

    def _read(self, rows: list[sqlite3.Row], namespace: str,
              tenant: str) -> list[GraphCheckpoint]:
        found = []
        for row in rows:
            args = {"namespace": namespace, "tenant": tenant, "thread_id": row["thread_id"],
                    "checkpoint_ns": row["checkpoint_ns"], "checkpoint_id": row["checkpoint_id"]}
            writes = tuple(
                GraphWrite(w["task_id"], w["idx"], w["channel"], w["type"], bytes(w["value"]),
                           w["task_path"])
                for w in self.connection.db.execute(_Q["graph_writes"], args).fetchall())
            found.append(_checkpoint(row, writes))
        return found

    async def get_graph_checkpoint(
        self, namespace: str, tenant: str, thread_id: str, checkpoint_ns: str,
        checkpoint_id: str | None,
    ) -> GraphCheckpoint | None:
        args = {"namespace": namespace, "tenant": tenant, "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}
        query = _Q["graph_latest" if checkpoint_id is None else "graph_checkpoint"]
        found = self._read(self.connection.db.execute(query, args).fetchall(), namespace, tenant)
        return found[0] if found else None

    async def list_graph_checkpoints(
        self, namespace: str, tenant: str, *, thread_id: str | None = None,
        checkpoint_ns: str | None = None, checkpoint_id: str | None = None,
        before: str | None = None, metadata: Mapping[str, JSON] | None = None,
        limit: int | None = None,
    ) -> list[GraphCheckpoint]:
        args: dict[str, Any] = {
            "namespace": namespace, "tenant": tenant, "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id, "before": before,
            "metadata": json.dumps(dict(metadata)) if metadata else None,
            "limit": -1 if limit is None else limit}
        return self._read(self.connection.db.execute(_Q["graph_list"], args).fetchall(), namespace,
                          tenant)

    async def delete_graph_threads(
        self, namespace: str, tenant: str, thread_ids: Sequence[str]
    ) -> None:
        args = {"namespace": namespace, "tenant": tenant,
                "thread_ids": json.dumps(list(thread_ids))}
        async with self.connection.tx() as db:
            db.execute(_Q["graph_delete_thread_writes"], args)
            db.execute(_Q["graph_delete_thread_checkpoints"], args)

    async def delete_graph_runs(self, namespace: str, tenant: str, run_ids: Sequence[str]) -> None:
        args = {"namespace": namespace, "tenant": tenant, "run_ids": json.dumps(list(run_ids))}
        async with self.connection.tx() as db:
            db.execute(_Q["graph_delete_run_writes"], args)
            db.execute(_Q["graph_delete_run_checkpoints"], args)

    async def copy_graph_thread(
        self, namespace: str, tenant: str, source: str, target: str
    ) -> None:
        args = {"namespace": namespace, "tenant": tenant, "source": source, "target": target}
        async with self.connection.tx() as db:
            db.execute(_Q["graph_copy_checkpoints"], args)
            db.execute(_Q["graph_copy_writes"], args)

    async def prune_graph_threads(
        self, namespace: str, tenant: str, thread_ids: Sequence[str], *, keep_latest: bool,
    ) -> None:
        if not keep_latest:
            await self.delete_graph_threads(namespace, tenant, thread_ids)
            return
        args = {"namespace": namespace, "tenant": tenant,
                "thread_ids": json.dumps(list(thread_ids))}
        async with self.connection.tx() as db:
            db.execute(_Q["graph_prune_writes"], args)
            db.execute(_Q["graph_prune_checkpoints"], args)
