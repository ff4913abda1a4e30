"""LangGraph checkpoints (:class:`shoal.ports.GraphCheckpoints`) in the memory store: the
reference semantics the SQL stores match. Every method runs without an await, so each is atomic
on the event loop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from shoal import _json
from shoal.types import JSON, Fence, GraphCheckpoint, GraphWrite, Run

# (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id)
_Name = tuple[str, str, str, str, str]


class MemoryGraphCheckpoints:
    """The checkpoints and pending writes of LangGraph threads, by name."""

    if TYPE_CHECKING:   # provided by MemoryStore
        def _holds(self, fence: Fence) -> Run | None: ...

    def __init__(self) -> None:
        super().__init__()
        self._graph_checkpoints: dict[_Name, GraphCheckpoint] = {}
        self._graph_writes: dict[_Name, dict[tuple[str, int], GraphWrite]] = {}

    def _graph_fenced_out(self, fence: Fence | None) -> bool:
        return fence is not None and self._holds(fence) is None

    async def put_graph_checkpoint(
        self, namespace: str, tenant: str, checkpoint: GraphCheckpoint, fence: Fence | None,
    ) -> bool:
        if self._graph_fenced_out(fence):
            return False
        c = checkpoint
        name = (namespace, tenant, c.thread_id, c.checkpoint_ns, c.checkpoint_id)
        self._graph_checkpoints[name] = replace(c, metadata=_json.copy(c.metadata), writes=())
        return True

    async def put_graph_writes(
        self, namespace: str, tenant: str, thread_id: str, checkpoint_ns: str,
        checkpoint_id: str, writes: Sequence[GraphWrite], fence: Fence | None,
    ) -> bool:
        if self._graph_fenced_out(fence):
            return False
        kept = self._graph_writes.setdefault(
            (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id), {})
        for w in writes:
            if w.idx < 0 or (w.task_id, w.idx) not in kept:
                kept[(w.task_id, w.idx)] = w
        return True

    def _with_writes(self, name: _Name) -> GraphCheckpoint:
        writes = self._graph_writes.get(name, {}).values()
        ordered = sorted(writes, key=lambda w: (w.task_path, w.task_id, w.idx))
        c = self._graph_checkpoints[name]
        return replace(c, metadata=_json.copy(c.metadata), writes=tuple(ordered))

    async def get_graph_checkpoint(
        self, namespace: str, tenant: str, thread_id: str, checkpoint_ns: str,
        checkpoint_id: str | None,
    ) -> GraphCheckpoint | None:
        if checkpoint_id is None:
            ids = [n[4] for n in self._graph_checkpoints
                   if n[:4] == (namespace, tenant, thread_id, checkpoint_ns)]
            if not ids:
                return None
            checkpoint_id = max(ids)
        name = (namespace, tenant, thread_id, checkpoint_ns, checkpoint_id)
        return self._with_writes(name) if name in self._graph_checkpoints else None

    async def list_graph_checkpoints(
        self, namespace: str, tenant: str, *, thread_id: str | None = None,
        checkpoint_ns: str | None = None, checkpoint_id: str | None = None,
        before: str | None = None, metadata: Mapping[str, JSON] | None = None,
        limit: int | None = None,
    ) -> list[GraphCheckpoint]:
        found = [
            name for name, c in self._graph_checkpoints.items()
            if name[:2] == (namespace, tenant)
            and thread_id in (None, name[2]) and checkpoint_ns in (None, name[3])
            and checkpoint_id in (None, name[4]) and (before is None or name[4] < before)
            and all(k in c.metadata and c.metadata[k] == v for k, v in (metadata or {}).items())
        ]
        found.sort(key=lambda n: n[4], reverse=True)
        return [self._with_writes(n) for n in found[:limit]]

    def _drop_graph(self, names: list[_Name]) -> None:
        for name in names:
            self._graph_checkpoints.pop(name, None)
            self._graph_writes.pop(name, None)

    async def delete_graph_threads(
        self, namespace: str, tenant: str, thread_ids: Sequence[str]
    ) -> None:
        threads = set(thread_ids)
        self._drop_graph([n for n in [*self._graph_checkpoints, *self._graph_writes]
                          if n[:2] == (namespace, tenant) and n[2] in threads])

    async def delete_graph_runs(self, namespace: str, tenant: str, run_ids: Sequence[str]) -> None:
        runs = set(run_ids)
        self._drop_graph([n for n, c in self._graph_checkpoints.items()
                          if n[:2] == (namespace, tenant) and c.run_id in runs])

    async def copy_graph_thread(
        self, namespace: str, tenant: str, source: str, target: str
    ) -> None:
        for name in [n for n in self._graph_checkpoints if n[:3] == (namespace, tenant, source)]:
            to = (namespace, tenant, target, name[3], name[4])
            self._graph_checkpoints[to] = replace(self._graph_checkpoints[name],
                                                  thread_id=target)
            self._graph_writes[to] = dict(self._graph_writes.get(name, {}))

    async def prune_graph_threads(
        self, namespace: str, tenant: str, thread_ids: Sequence[str], *, keep_latest: bool,
    ) -> None:
        threads = set(thread_ids)
        names = [n for n in self._graph_checkpoints
                 if n[:2] == (namespace, tenant) and n[2] in threads]
        latest: dict[tuple[str, str], str] = {}
        for n in names:
            latest[n[2:4]] = max(latest.get(n[2:4], ""), n[4])
        self._drop_graph([n for n in names if not keep_latest or n[4] != latest[n[2:4]]])

    def _prune_graphs(self, namespace: str, runs: set[tuple[str, str]]) -> None:
        """With prune_runs: the graphs of these runs (``(tenant, id)``), whose thread is the
        run."""
        if runs:
            self._drop_graph([n for n in [*self._graph_checkpoints, *self._graph_writes]
                              if n[0] == namespace and (n[1], n[2]) in runs])
