"""LangGraph checkpoints (:class:`shoal.ports.GraphCheckpoints`) in the PostgreSQL store's own
tables.

The semantics are those of the memory reference (:mod:`shoal.backends.memory.graphs`). A put is
one statement, its fence (if any) checked in it (``graphs.sql`` says how); a read is one
statement, checkpoints and their pending writes together; a delete, copy or prune is one
pipeline, so one transaction and one round trip.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.rows import DictRow

from shoal.backends._sql import queries
from shoal.backends.postgres.connections import Connections
from shoal.types import JSON, Fence, GraphCheckpoint, GraphWrite

_Q = queries("postgres", "graphs.sql")


def _fence_args(fence: Fence | None) -> dict[str, Any]:
    if fence is None:
        return {"run_id": None, "owner": None, "epoch": None}
    return {"run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch}


def _checkpoint(row: DictRow) -> GraphCheckpoint:
    writes = tuple(
        GraphWrite(task_id, idx, channel, type_, bytes(value), task_path)
        for task_id, idx, channel, type_, value, task_path in zip(
            row["task_ids"], row["idxs"], row["channels"], row["types"], row["vals"],
            row["task_paths"], strict=True))
    return GraphCheckpoint(
        thread_id=row["thread_id"], checkpoint_ns=row["checkpoint_ns"],
        checkpoint_id=row["checkpoint_id"], parent_id=row["parent_id"], type=row["type"],
        checkpoint=bytes(row["checkpoint"]), metadata=row["metadata"], run_id=row["run_id"],
        created_at=row["created_at"], writes=writes)


class PostgresGraphCheckpoints:
    """The checkpoints and pending writes of LangGraph threads for
    :class:`~shoal.backends.postgres.PostgresStore`, on ``db``. It keeps no state of its
    own."""

    def __init__(self, db: Connections) -> None:
        self.db = db

    async def _graph_run(self, steps: Sequence[tuple[str, dict[str, Any]]]) -> list[DictRow]:
        return await self.db.retried(steps)

    async def put_graph_checkpoint(
        self, namespace: str, tenant: str, checkpoint: GraphCheckpoint, fence: Fence | None,
    ) -> bool:
        c = checkpoint
        args = {"namespace": namespace, "tenant": tenant, "thread_id": c.thread_id,
                "checkpoint_ns": c.checkpoint_ns, "checkpoint_id": c.checkpoint_id,
                "parent_id": c.parent_id, "graph_run_id": c.run_id, "type": c.type,
                "checkpoint": c.checkpoint, "metadata": json.dumps(c.metadata),
                "created_at": float(c.created_at), **_fence_args(fence)}
        [row] = await self._graph_run([(_Q["graph_put_checkpoint"], args)])
        return bool(row["held"])

    async def put_graph_writes(
        self, namespace: str, tenant: str, thread_id: str, checkpoint_ns: str,
        checkpoint_id: str, writes: Sequence[GraphWrite], fence: Fence | None,
    ) -> bool:
        args = {"namespace": namespace, "tenant": tenant, "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id,
                "task_ids": [w.task_id for w in writes], "idxs": [w.idx for w in writes],
                "channels": [w.channel for w in writes], "types": [w.type for w in writes],
                "values": [w.value for w in writes],
                "task_paths": [w.task_path for w in writes], **_fence_args(fence)}
        [row] = await self._graph_run([(_Q["graph_put_writes"], args)])
        return bool(row["held"])

    async def _graph_read(self, namespace: str, tenant: str, **where: Any) -> list[DictRow]:
        args = {"namespace": namespace, "tenant": tenant, "thread_id": None,
                "checkpoint_ns": None, "checkpoint_id": None, "before": None,
                "metadata": None, "limit": None, **where}
        return await self._graph_run([(_Q["graph_checkpoints"], args)])

    async def get_graph_checkpoint(
        self, namespace: str, tenant: str, thread_id: str, checkpoint_ns: str,
        checkpoint_id: str | None,
    ) -> GraphCheckpoint | None:
        rows = await self._graph_read(namespace, tenant, thread_id=thread_id,
                                      checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id,
                                      limit=1)
        return _checkpoint(rows[0]) if rows else None

    async def list_graph_checkpoints(
        self, namespace: str, tenant: str, *, thread_id: str | None = None,
        checkpoint_ns: str | None = None, checkpoint_id: str | None = None,
        before: str | None = None, metadata: Mapping[str, JSON] | None = None,
        limit: int | None = None,
    ) -> list[GraphCheckpoint]:
        rows = await self._graph_read(
            namespace, tenant, thread_id=thread_id, checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint_id, before=before,
            metadata=json.dumps(dict(metadata)) if metadata else None, limit=limit)
        return [_checkpoint(row) for row in rows]

    async def delete_graph_threads(
        self, namespace: str, tenant: str, thread_ids: Sequence[str]
    ) -> None:
        args = {"namespace": namespace, "tenant": tenant, "thread_ids": list(thread_ids)}
        await self._graph_run([(_Q["graph_delete_thread_writes"], args),
                               (_Q["graph_delete_thread_checkpoints"], args)])

    async def delete_graph_runs(self, namespace: str, tenant: str, run_ids: Sequence[str]) -> None:
        args = {"namespace": namespace, "tenant": tenant, "run_ids": list(run_ids)}
        await self._graph_run([(_Q["graph_delete_run_writes"], args),
                               (_Q["graph_delete_run_checkpoints"], args)])

    async def copy_graph_thread(
        self, namespace: str, tenant: str, source: str, target: str
    ) -> None:
        args = {"namespace": namespace, "tenant": tenant, "source": source, "target": target}
        await self._graph_run([(_Q["graph_copy_checkpoints"], args),
                               (_Q["graph_copy_writes"], args)])

    async def prune_graph_threads(
        self, namespace: str, tenant: str, thread_ids: Sequence[str], *, keep_latest: bool,
    ) -> None:
        if not keep_latest:
            await self.delete_graph_threads(namespace, tenant, thread_ids)
            return
        args = {"namespace": namespace, "tenant": tenant, "thread_ids": list(thread_ids)}
        await self._graph_run([(_Q["graph_prune_writes"], args),
                               (_Q["graph_prune_checkpoints"], args)])
