"""``ShoalCheckpointer`` on the memory, SQLite and PostgreSQL stores: LangGraph's own conformance
suite (``langgraph-checkpoint-conformance``, every capability), tenants and namespaces kept
apart, writes fenced by a run's claim, the sync methods (``graph.invoke``) beside the async ones,
and a checkpointer's graph read back by a new one. PostgreSQL schemas are test_postgres.py's (one
per test, dropped afterwards; its server, skip and CI failure)."""

from __future__ import annotations

import asyncio
import operator
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.graph import END, START, StateGraph
from test_postgres import _url

from shoal.integrations.langgraph import ShoalCheckpointer
from shoal.stores import open_store
from shoal.testing.contract.support import NS, T0, new_run
from shoal.types import Fence, GraphCheckpoint, GraphWrite, Settlement


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shoal.db'}"
    return _url(request.getfixturevalue("schema"))


async def test_the_conformance_suite_passes_every_capability(url: str) -> None:
    @checkpointer_test(name=f"ShoalCheckpointer {url.split(':')[0]}")
    async def saver() -> AsyncIterator[ShoalCheckpointer]:
        checkpointer = ShoalCheckpointer(url)
        yield checkpointer
        await checkpointer.aclose()

    report = await validate(saver)
    failures = {cap: r.failures for cap, r in report.results.items() if r.passed is not True}
    assert failures == {}, failures
    assert {cap for cap, r in report.results.items() if r.detected} == {
        c.value for c in ALL_CAPABILITIES}
    assert report.conformance_level() == "FULL"


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver: ShoalCheckpointer) -> Any:
    builder = StateGraph(State)
    builder.add_node("one", lambda s: {"log": ["one"]})
    builder.add_node("two", lambda s: {"log": ["two"]})
    builder.add_edge(START, "one")
    builder.add_edge("one", "two")
    builder.add_edge("two", END)
    return builder.compile(checkpointer=saver)


async def test_tenants_and_namespaces_never_meet(url: str) -> None:
    config: Any = {"configurable": {"thread_id": "t1"}}
    store: Any = open_store(url)   # one store object, as an app's (app.store)
    await store.open()
    try:
        acme = ShoalCheckpointer(store, namespace="app", tenant="acme")
        globex = ShoalCheckpointer(store, namespace="app", tenant="globex")
        other_app = ShoalCheckpointer(store, namespace="other", tenant="acme")
        assert (await _graph(acme).ainvoke({"log": ["acme"]}, config))["log"] == [
            "acme", "one", "two"]
        for stranger in (globex, other_app):
            assert await stranger.aget_tuple(config) is None
            assert [t async for t in stranger.alist(None)] == []
            await stranger.adelete_thread("t1")
            await stranger.aprune(["t1"], strategy="delete")
            await stranger.acopy_thread("t1", "t2")
        assert len([t async for t in acme.alist(None)]) == 4   # the input, then 3 super-steps
        assert (await _graph(globex).ainvoke({"log": ["globex"]}, config))["log"] == [
            "globex", "one", "two"]
        found = await acme.aget_tuple(config)
        assert found is not None
        assert found.checkpoint["channel_values"]["log"] == ["acme", "one", "two"]
        await acme.aclose()   # the store object is the caller's: still open
        assert await acme.aget_tuple(config) is not None
    finally:
        await store.close()


async def test_a_fenced_write_holds_only_while_the_run_is_claimed(url: str) -> None:
    store: Any = open_store(url)
    await store.open()
    try:
        [(run, _)] = [await store.create_run(new_run(T0), max_queued=None, admission="reject")]
        [claimed] = await store.claim_runs(NS, ["wf"], "w1", 1, 30.0, T0)
        held = Fence(run.id, "w1", claimed.lease_epoch)
        stale = Fence(run.id, "w1", claimed.lease_epoch - 1)
        other = Fence(run.id, "w2", claimed.lease_epoch)

        def checkpoint(cid: str) -> GraphCheckpoint:
            return GraphCheckpoint(run.id, "", cid, None, "json", b"{}", {"step": 1})

        write = [GraphWrite("task", 0, "ch", "json", b"1")]
        for fence in (stale, other):
            assert not await store.put_graph_checkpoint(NS, "default", checkpoint("a"), fence)
            assert not await store.put_graph_writes(NS, "default", run.id, "", "a", write, fence)
        assert await store.get_graph_checkpoint(NS, "default", run.id, "", None) is None
        assert await store.put_graph_checkpoint(NS, "default", checkpoint("a"), held)
        assert await store.put_graph_writes(NS, "default", run.id, "", "a", write, held)
        found = await store.get_graph_checkpoint(NS, "default", run.id, "", None)
        assert found is not None and found.writes == tuple(write)
        # the run recovered by another owner after its lease: the old claim writes nothing
        assert [r.id for r in await store.recover_runs(NS, T0 + 31)] == [run.id]
        [again] = await store.claim_runs(NS, ["wf"], "w2", 1, 30.0, T0 + 31)
        assert again.lease_epoch == claimed.lease_epoch + 1
        assert not await store.put_graph_checkpoint(NS, "default", checkpoint("b"), held)
        assert await store.put_graph_checkpoint(
            NS, "default", checkpoint("b"), Fence(run.id, "w2", again.lease_epoch))
        assert [c.checkpoint_id for c in await store.list_graph_checkpoints(
            NS, "default", thread_id=run.id)] == ["b", "a"]
    finally:
        await store.close()


async def test_a_pruned_run_takes_its_graph_along(url: str) -> None:
    """``prune_runs`` deletes the checkpoints of the thread that is the run (in its namespace and
    tenant), and nobody else's."""
    store: Any = open_store(url)
    await store.open()
    try:
        runs = [run for run, _ in [await store.create_run(new_run(T0, tenant=tenant),
                                                          max_queued=None, admission="reject")
                                   for tenant in ("acme", "acme")]]
        claimed = await store.claim_runs(NS, ["wf"], "w1", 2, 30.0, T0)
        for run in claimed:
            fence = Fence(run.id, "w1", run.lease_epoch)
            for namespace, tenant in [(NS, "acme"), (NS, "globex"), ("other", "acme")]:
                checkpoint = GraphCheckpoint(run.id, "", "c1", None, "json", b"{}", {})
                assert await store.put_graph_checkpoint(namespace, tenant, checkpoint, fence)
                assert await store.put_graph_writes(
                    namespace, tenant, run.id, "", "c1",
                    [GraphWrite("task", 0, "ch", "json", b"1")], fence)
        ended = runs[0].id
        [first] = [r for r in claimed if r.id == ended]
        assert await store.settle_run(Fence(ended, "w1", first.lease_epoch),
                                      Settlement("succeeded"), T0 + 1)
        assert await store.prune_runs(NS, T0 + 2, 10) == 1
        assert await store.get_graph_checkpoint(NS, "acme", ended, "", None) is None
        for namespace, tenant, thread in [(NS, "globex", ended), ("other", "acme", ended),
                                          (NS, "acme", runs[1].id)]:
            kept = await store.get_graph_checkpoint(namespace, tenant, thread, "", None)
            assert kept is not None and len(kept.writes) == 1, (namespace, tenant, thread)
    finally:
        await store.close()


async def test_the_sync_methods_serve_graph_invoke(url: str) -> None:
    """``graph.invoke`` (sync) in a thread of its own, the checkpointer first used there: it
    runs its store on a loop of its own; a second checkpointer reads the graph back (from a
    file or a server: a memory store is its checkpointer's own)."""
    config: Any = {"configurable": {"thread_id": "sync"}}
    out: dict[str, Any] = {}

    def invoke() -> None:
        with ShoalCheckpointer(url, tenant="acme") as saver:
            graph = _graph(saver)
            out["first"] = graph.invoke({"log": ["a"]}, config)
            out["history"] = [s.metadata["step"] for s in graph.get_state_history(config)]
            saver.delete_for_runs([])   # nothing to do
            saver.copy_thread("sync", "copy")
            saver.prune(["copy"], strategy="keep_latest")
            out["copied"] = len(list(saver.list({"configurable": {"thread_id": "copy"}})))

    thread = threading.Thread(target=invoke)
    thread.start()
    await asyncio.to_thread(thread.join)
    assert out == {"first": {"log": ["a", "one", "two"]}, "history": [2, 1, 0, -1],
                   "copied": 1}
    if url == "memory://":
        return
    async with ShoalCheckpointer(url, tenant="acme") as later:
        state = await _graph(later).aget_state(config)
        assert state.values == {"log": ["a", "one", "two"]} and state.next == ()


async def test_a_sync_call_on_the_loop_that_serves_the_store_is_refused() -> None:
    saver = ShoalCheckpointer("memory://")
    assert await saver.aget_tuple({"configurable": {"thread_id": "x"}}) is None
    with pytest.raises(RuntimeError, match="use ainvoke, astream and aget_state"):
        saver.get_tuple({"configurable": {"thread_id": "x"}})
    with pytest.raises(ValueError, match="names no thread"):
        await saver.aget_tuple({"configurable": {}})
    with pytest.raises(ValueError, match="'keep_latest' or 'delete'"):
        await saver.aprune(["x"], strategy="all")
