"""``ShoalCheckpointer``: a LangGraph checkpoint saver on shoal's stores.

The checkpoints live in the store's own tables (``graph_checkpoints``, ``graph_writes``), in the
same SQLite file or PostgreSQL schema as the runs, scoped by namespace and tenant. A checkpoint
is kept whole (channel values included), serialized by LangGraph's serializer
(``JsonPlusSerializer`` unless another is given); its metadata is kept as JSON, which ``list``
filters on.

The store is asynchronous. The async methods (``aget_tuple``, ``aput``, …, what ``ainvoke`` and
``astream`` call) run on the event loop that opened the store; the sync methods (what ``invoke``
and ``stream`` call) hand their work to that loop from another thread, or, when they are the
first to use the checkpointer, to a loop of its own in a thread it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from shoal.clock import Clock, SystemClock
from shoal.engine.context import RunContext, RunExtension
from shoal.errors import ConfigurationError
from shoal.ports import GraphCheckpoints
from shoal.stores import mask_url, open_store
from shoal.types import Fence, GraphCheckpoint, GraphWrite

T = TypeVar("T")


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"ShoalCheckpointer: {what} is a str, not {value!r}.")
    return value


def _json_object(metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata`` as JSON keeps it: values JSON cannot hold become their text."""
    kept: dict[str, Any] = json.loads(json.dumps(metadata, default=str))
    return kept


class ShoalCheckpointer(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on a shoal store: ``store`` is a store URL (``sqlite:///…``,
    ``postgresql://…``, ``memory://``) or a store object (an open app's ``app.store``). Threads
    belong to ``namespace`` (an app's name) and ``tenant``: another tenant's threads are never
    read, listed, copied or deleted. A store named by URL is opened (and migrated, like an
    app's) on first use and closed by :meth:`close` / :meth:`aclose`; a store object is the
    caller's to open and close.

    Supports every capability of LangGraph's conformance suite: put, put_writes, get_tuple,
    list, delete_thread, delete_for_runs, copy_thread and prune."""

    # the run whose claim every write is conditional on (:meth:`for_run`), else None
    _run: RunExtension | None = None

    def __init__(
        self,
        store: str | GraphCheckpoints,
        *,
        namespace: str = "default",
        tenant: str = "default",
        serde: SerializerProtocol | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(serde=serde)
        if not isinstance(namespace, str) or not namespace:
            raise ConfigurationError(f"ShoalCheckpointer(namespace=…) is a non-empty str, not "
                                     f"{namespace!r}.")
        if not isinstance(tenant, str) or not tenant:
            raise ConfigurationError(f"ShoalCheckpointer(tenant=…) is a non-empty str, not "
                                     f"{tenant!r}.")
        self.namespace = namespace
        self.tenant = tenant
        self.clock: Clock = clock or SystemClock()
        self._url: str | None = None
        self._store: GraphCheckpoints | None = None
        self._loop: asyncio.AbstractEventLoop | None = None   # the loop the store is used on
        self._thread: threading.Thread | None = None          # the loop's, if ours
        if isinstance(store, str):
            self._url = store
            open_store(store)   # a bad URL is refused now, not at first use
        elif isinstance(store, GraphCheckpoints):
            self._store = store
            with contextlib.suppress(RuntimeError):   # a store object serves on its loop
                self._loop = asyncio.get_running_loop()
        else:
            raise ConfigurationError(
                f"ShoalCheckpointer(store) takes a store URL or a shoal store object that keeps "
                f"LangGraph checkpoints (memory, SQLite, PostgreSQL), not {store!r}.")
        self._opening = threading.Lock()

    def __repr__(self) -> str:
        where = mask_url(self._url) if self._url else repr(self._store)
        return (f"<shoal ShoalCheckpointer {where} namespace={self.namespace!r} "
                f"tenant={self.tenant!r}>")

    @staticmethod
    def for_run(ctx: RunContext) -> ShoalCheckpointer:
        """The checkpointer of a graph run inside ``ctx``'s run (what :func:`run_graph` gives
        the graph): on the app's store, in the run's namespace and tenant, every write
        conditional on the run's claim. A write refused because the claim was lost raises
        ``LeaseLostError`` and aborts the run, as the engine's own writes do. Make it in the
        workflow function, on the run's event loop."""
        return _RunCheckpointer(ctx.extension, ctx.tenant)

    @property
    def _fence(self) -> Fence | None:
        return None if self._run is None else self._run.fence

    # -- the store and its loop -----------------------------------------------------------------

    async def _open(self) -> GraphCheckpoints:
        if self._store is None:
            assert self._url is not None
            store = open_store(self._url)
            await store.open()
            if not isinstance(store, GraphCheckpoints):
                await store.close()
                raise ConfigurationError(
                    f"The store {mask_url(self._url)!r} keeps no LangGraph checkpoints.")
            self._store = store
        return self._store

    async def _call(self, work: Callable[[GraphCheckpoints], Awaitable[T]]) -> T:
        """``work(store)`` on the store's loop (this one if the store is not in use yet)."""
        here = asyncio.get_running_loop()
        with self._opening:
            if self._loop is None or self._loop.is_closed():
                self._forget_closed_loop()
                self._loop = here
        if self._loop is here:
            return await work(await self._open())
        return await asyncio.wrap_future(self._submit(work))

    def _submit(self, work: Callable[[GraphCheckpoints], Awaitable[T]]) -> Future[T]:
        async def run() -> T:
            return await work(await self._open())
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    def _sync(self, work: Callable[[GraphCheckpoints], Awaitable[T]]) -> T:
        """``work(store)`` from sync code: on the store's loop, from this thread."""
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        with self._opening:
            if self._loop is None or self._loop.is_closed():
                if self._url is None:
                    raise RuntimeError(
                        "ShoalCheckpointer: a store object serves on its own event loop; make "
                        "the checkpointer in async code (on that loop) to use its sync methods "
                        "from other threads, or give it the store's URL.")
                self._forget_closed_loop()
                self._start_loop()
        if here is not None and here is self._loop:
            raise RuntimeError(
                "ShoalCheckpointer: a sync method (graph.invoke, graph.stream, get_state) was "
                "called on the event loop that serves this checkpointer, which it would block "
                "for ever: use ainvoke, astream and aget_state in async code.")
        return self._submit(work).result()

    def _forget_closed_loop(self) -> None:
        """The loop that served the store has ended (an ``asyncio.run`` returned): a store
        opened from a URL on it is opened again on the next loop (its connections went with
        the old one)."""
        if self._loop is not None and self._url is not None:
            self._store = None

    def _start_loop(self) -> None:
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            loop.run_forever()

        self._thread = threading.Thread(target=serve, name="shoal-checkpointer", daemon=True)
        self._thread.start()
        started.wait()
        self._loop = loop

    async def aclose(self) -> None:
        """Close the store if this checkpointer opened it (a URL). Idempotent."""
        if self._url is None or self._store is None:
            return
        if self._thread is not None:
            self.close()
            return
        store, self._store = self._store, None
        await cast(Any, store).close()

    def close(self) -> None:
        """Close the store if this checkpointer opened it (a URL), and stop its own loop."""
        loop, thread = self._loop, self._thread
        if self._url is not None and self._store is not None and loop is not None \
                and not loop.is_closed():
            store, self._store = self._store, None
            if thread is None:
                raise RuntimeError("ShoalCheckpointer: this store was opened by async code; "
                                   "close it with `await checkpointer.aclose()`.")
            asyncio.run_coroutine_threadsafe(cast(Any, store).close(), loop).result()
        if thread is not None and loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            self._thread = self._loop = None

    def __enter__(self) -> ShoalCheckpointer:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> ShoalCheckpointer:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    def _held(self, held: bool) -> None:
        if not held:
            assert self._run is not None
            self._run.lease_lost()

    # -- from LangGraph's records to the store's and back ----------------------------------------

    def _tuple(self, c: GraphCheckpoint) -> CheckpointTuple:
        def config(checkpoint_id: str) -> RunnableConfig:
            return {"configurable": {"thread_id": c.thread_id, "checkpoint_ns": c.checkpoint_ns,
                                     "checkpoint_id": checkpoint_id}}

        writes: list[PendingWrite] = [
            (w.task_id, w.channel, self.serde.loads_typed((w.type, w.value))) for w in c.writes]
        return CheckpointTuple(
            config=config(c.checkpoint_id),
            checkpoint=self.serde.loads_typed((c.type, c.checkpoint)),
            metadata=cast(CheckpointMetadata, c.metadata),
            parent_config=config(c.parent_id) if c.parent_id else None,
            pending_writes=writes)

    @staticmethod
    def _where(config: RunnableConfig) -> tuple[str, str, str | None]:
        """(thread_id, checkpoint_ns, checkpoint_id) of a config."""
        configurable = config.get("configurable") or {}
        if "thread_id" not in configurable:
            raise ValueError(
                "ShoalCheckpointer: the config names no thread: pass "
                "{'configurable': {'thread_id': ...}} to invoke, stream or get_state.")
        thread_id = _text(configurable["thread_id"], "configurable['thread_id']")
        return (thread_id, _text(configurable.get("checkpoint_ns", ""), "checkpoint_ns"),
                get_checkpoint_id(config))

    def _record(self, config: RunnableConfig, checkpoint: Checkpoint,
                metadata: CheckpointMetadata) -> GraphCheckpoint:
        thread_id, checkpoint_ns, parent_id = self._where(config)
        type_, blob = self.serde.dumps_typed(checkpoint)
        kept = _json_object(dict(get_serializable_checkpoint_metadata(config, metadata)))
        run_id = kept.get("run_id")
        return GraphCheckpoint(
            thread_id=thread_id, checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint["id"],
            parent_id=parent_id, type=type_, checkpoint=blob, metadata=kept,
            run_id=run_id if isinstance(run_id, str) else None, created_at=self.clock.now())

    def _put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
             ) -> tuple[Callable[[GraphCheckpoints], Awaitable[bool]], RunnableConfig]:
        """The store call of ``put`` (it answers whether the run's claim held) and the config
        ``put`` returns: the checkpoint saved."""
        record = self._record(config, checkpoint, metadata)
        saved: RunnableConfig = {"configurable": {"thread_id": record.thread_id,
                                                  "checkpoint_ns": record.checkpoint_ns,
                                                  "checkpoint_id": record.checkpoint_id}}
        return (lambda s: s.put_graph_checkpoint(self.namespace, self.tenant, record,
                                                 self._fence)), saved

    def _put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                    task_id: str, task_path: str
                    ) -> Callable[[GraphCheckpoints], Awaitable[bool]]:
        """The store call of ``put_writes``: it answers whether the run's claim held."""
        thread_id, checkpoint_ns, checkpoint_id = self._where(config)
        if checkpoint_id is None:
            raise ValueError("ShoalCheckpointer.put_writes: the config names no checkpoint_id.")
        rows = self._writes(writes, task_id, task_path)
        return lambda s: s.put_graph_writes(self.namespace, self.tenant, thread_id,
                                            checkpoint_ns, checkpoint_id, rows, self._fence)

    def _writes(self, writes: Sequence[tuple[str, Any]], task_id: str,
                task_path: str) -> list[GraphWrite]:
        return [GraphWrite(task_id, WRITES_IDX_MAP.get(channel, i), channel,
                           *self.serde.dumps_typed(value), task_path)
                for i, (channel, value) in enumerate(writes)]

    # -- the async methods ---------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, checkpoint_ns, checkpoint_id = self._where(config)
        found = await self._call(lambda s: s.get_graph_checkpoint(
            self.namespace, self.tenant, thread_id, checkpoint_ns, checkpoint_id))
        return None if found is None else self._tuple(found)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        where = self._list_where(config, filter, before, limit)
        found = await self._call(lambda s: s.list_graph_checkpoints(
            self.namespace, self.tenant, **where))
        for c in found:
            yield self._tuple(c)

    @staticmethod
    def _list_where(config: RunnableConfig | None, filter: dict[str, Any] | None,
                    before: RunnableConfig | None, limit: int | None) -> dict[str, Any]:
        configurable = (config or {}).get("configurable") or {}
        thread_id = configurable.get("thread_id")
        return {
            "thread_id": None if thread_id is None else _text(thread_id, "thread_id"),
            "checkpoint_ns": configurable.get("checkpoint_ns"),
            "checkpoint_id": get_checkpoint_id(config) if config else None,
            "before": get_checkpoint_id(before) if before else None,
            "metadata": _json_object(filter) if filter else None,
            "limit": limit,
        }

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        work, saved = self._put(config, checkpoint, metadata)
        self._held(await self._call(work))
        return saved

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._held(await self._call(self._put_writes(config, writes, task_id, task_path)))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._call(lambda s: s.delete_graph_threads(
            self.namespace, self.tenant, [thread_id]))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        if run_ids:
            await self._call(lambda s: s.delete_graph_runs(
                self.namespace, self.tenant, list(run_ids)))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._call(lambda s: s.copy_graph_thread(
            self.namespace, self.tenant, source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Delete the checkpoints of these threads: ``"keep_latest"`` keeps the latest of each
        checkpoint namespace (with its pending writes), ``"delete"`` keeps none. The parent
        chain behind a kept checkpoint goes, so a LangGraph ``DeltaChannel`` (beta) that needs
        it cannot be rebuilt from there: prune those threads with ``"delete"`` only."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"ShoalCheckpointer.prune: strategy is 'keep_latest' or 'delete', "
                             f"not {strategy!r}.")
        if thread_ids:
            await self._call(lambda s: s.prune_graph_threads(
                self.namespace, self.tenant, list(thread_ids),
                keep_latest=strategy == "keep_latest"))

    # -- the sync methods: the same, from sync code ----------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, checkpoint_ns, checkpoint_id = self._where(config)
        found = self._sync(lambda s: s.get_graph_checkpoint(
            self.namespace, self.tenant, thread_id, checkpoint_ns, checkpoint_id))
        return None if found is None else self._tuple(found)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        where = self._list_where(config, filter, before, limit)
        found = self._sync(lambda s: s.list_graph_checkpoints(
            self.namespace, self.tenant, **where))
        return iter([self._tuple(c) for c in found])

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        work, saved = self._put(config, checkpoint, metadata)
        self._held(self._sync(work))
        return saved

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._held(self._sync(self._put_writes(config, writes, task_id, task_path)))

    def delete_thread(self, thread_id: str) -> None:
        self._sync(lambda s: s.delete_graph_threads(self.namespace, self.tenant, [thread_id]))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        if run_ids:
            self._sync(lambda s: s.delete_graph_runs(self.namespace, self.tenant,
                                                     list(run_ids)))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._sync(lambda s: s.copy_graph_thread(self.namespace, self.tenant,
                                                 source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"ShoalCheckpointer.prune: strategy is 'keep_latest' or 'delete', "
                             f"not {strategy!r}.")
        if thread_ids:
            self._sync(lambda s: s.prune_graph_threads(
                self.namespace, self.tenant, list(thread_ids),
                keep_latest=strategy == "keep_latest"))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A version greater than ``current``: its counter plus one, then a random part (as
        LangGraph's own savers make them)."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"


class _RunCheckpointer(ShoalCheckpointer):
    """:meth:`ShoalCheckpointer.for_run`'s checkpointer: fenced by ``run``'s claim."""

    def __init__(self, run: RunExtension, tenant: str) -> None:
        super().__init__(cast(GraphCheckpoints, run.store), namespace=run.namespace,
                         tenant=tenant, clock=run.clock)
        self._loop = asyncio.get_running_loop()
        self._run = run
