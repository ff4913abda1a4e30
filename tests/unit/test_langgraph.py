"""LangGraph graphs run durably inside shoal runs (``run_graph``), on the memory store with a
virtual clock: interrupts are pauses resolved from another instance, expiry, a failed attempt
continuing from the last super-step, budgets through ``metered`` models, bad input."""

from __future__ import annotations

import dataclasses
import math
import operator
from collections import Counter
from typing import Annotated, Any, TypedDict

import pytest
from helpers import status_is, until
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

import shoal
from shoal.integrations.langgraph import ShoalCheckpointer, metered, run_graph
from shoal.testing import VirtualClock, cluster


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def review_graph(ran: Counter[str], fail_once: set[str]) -> Any:
    """draft -> review (asks a human) -> publish; each node counts its runs in ``ran`` and a node
    named in ``fail_once`` raises on its first run."""
    def node(name: str, ask: bool = False) -> Any:
        def run(state: State) -> dict[str, list[str]]:
            answer = interrupt({"draft": state["log"][-1]}) if ask else None
            ran[name] += 1
            if name in fail_once:
                fail_once.discard(name)
                raise RuntimeError(f"{name} failed")
            return {"log": [f"{name}:{answer['approved']}" if ask else name]}
        return run

    builder = StateGraph(State)
    builder.add_node("draft", node("draft"))
    builder.add_node("review", node("review", ask=True))
    builder.add_node("publish", node("publish"))
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "review")
    builder.add_edge("review", "publish")
    builder.add_edge("publish", END)
    return builder.compile()


def maker(graph: Any) -> Any:
    def make(store: shoal.Store, clock: shoal.Clock, instance_id: str) -> shoal.App:
        app = shoal.App("graphs", store=store, clock=clock, instance_id=instance_id, lease=30.0)

        @app.workflow(max_attempts=3)
        async def post(ctx: shoal.RunContext, topic: str) -> list[str]:
            out = await run_graph(ctx, graph, {"log": [topic]}, expires_in=600)
            return list(out["log"])

        return app
    return make


async def test_an_interrupt_is_a_pause_resolved_on_another_instance() -> None:
    ran: Counter[str] = Counter()
    clock = VirtualClock()
    async with cluster(maker(review_graph(ran, set())), instances=2, clock=clock) as (a, b):
        run = await a.dispatch("post", "shoal")
        await until(status_is(a, run.id, "waiting"))
        [pause] = await b.pending_pauses()
        assert (pause.run_id, pause.name, pause.request) == (run.id, "review", {"draft": "draft"})
        assert pause.expires_at == pause.created_at + 600
        await b.resume(pause.id, approved=True, by="ana")
        assert await b.result(run.id) == ["shoal", "draft", "review:True", "publish"]
        # the node that asked ran again when resumed (LangGraph re-runs it from its start); the
        # others ran once
        assert ran == {"draft": 1, "review": 1, "publish": 1}
        steps = [s.name for s in await a.store.load_steps(run.id)]
        assert steps == ["langgraph", "shoal.approval:review", "langgraph"]
        # the graph's thread is the run, in the app's namespace and the run's tenant
        saver = ShoalCheckpointer(a.store, namespace="graphs", tenant="default")
        latest = await saver.aget_tuple({"configurable": {"thread_id": run.id}})
        assert latest is not None and latest.checkpoint["channel_values"]["log"][-1] == "publish"
        other = ShoalCheckpointer(a.store, namespace="graphs", tenant="acme")
        assert await other.aget_tuple({"configurable": {"thread_id": run.id}}) is None


async def test_an_unanswered_interrupt_expires_and_the_node_gets_the_denial() -> None:
    clock = VirtualClock()
    async with cluster(maker(review_graph(Counter(), set())), instances=1, clock=clock) as (a,):
        run = await a.dispatch("post", "late")
        await until(status_is(a, run.id, "waiting"))
        await clock.advance(601)
        assert await a.result(run.id) == ["late", "draft", "review:False", "publish"]
        [step] = [s for s in await a.store.load_steps(run.id) if s.name.startswith("shoal.a")]
        assert step.output["reason"] == "expired"


async def test_a_failed_attempt_goes_on_from_the_last_super_step() -> None:
    ran: Counter[str] = Counter()
    clock = VirtualClock()
    graph = review_graph(ran, {"publish"})
    async with cluster(maker(graph), instances=1, clock=clock) as (a,):
        run = await a.dispatch("post", "retry")
        await until(status_is(a, run.id, "waiting"))
        [pause] = await a.pending_pauses()
        await a.resume(pause.id, approved=True)
        await until(status_is(a, run.id, "queued"))   # publish raised: a retry, with backoff
        await clock.advance(60)
        assert await a.result(run.id) == ["retry", "draft", "review:True", "publish"]
        assert (await a.get_run(run.id)).attempts == 2
        # draft and review were recorded before publish failed: neither ran again
        assert ran == {"draft": 1, "review": 1, "publish": 2}


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _reply(n: int) -> AIMessage:
    return AIMessage(f"thought {n}", usage_metadata={"input_tokens": 300, "output_tokens": 500,
                                                     "total_tokens": 800})


async def test_model_calls_go_through_the_provider_and_a_budget_ends_the_run() -> None:
    """Each call reserves 1000 tokens (1 cent) and costs what it used (800 tokens, 0.8 cents):
    after four answers 3.2 cents are spent, the fifth estimate would pass 4 cents, and the run
    fails at once (no retry: it would be refused again), its spend in the ledger."""
    clock = VirtualClock()
    model = GenericFakeChatModel(messages=iter([_reply(n) for n in range(10)]))

    def make(store: shoal.Store, clock: shoal.Clock, instance_id: str) -> shoal.App:
        app = shoal.App("agents", store=store, clock=clock, instance_id=instance_id)
        llm = metered(model, app.provider("fake", price_per_token=0.00001), tokens=1000)
        app.budget(per_run=0.04)

        async def think(state: Chat) -> dict[str, list[AnyMessage]]:
            return {"messages": [await llm.ainvoke(state["messages"])]}

        builder = StateGraph(Chat)
        builder.add_node("think", think)
        builder.add_edge(START, "think")
        builder.add_edge("think", "think")   # until the budget says no
        graph = builder.compile()

        @app.workflow(max_attempts=3)
        async def agent(ctx: shoal.RunContext, task: str) -> Any:
            await run_graph(ctx, graph, {"messages": [("user", task)]})

        return app

    async with cluster(make, instances=1, clock=clock) as (a,):
        run = await a.dispatch("agent", "plan a trip", tenant="acme")
        with pytest.raises(shoal.RunFailedError, match="BudgetExceededError"):
            await a.result(run.id)
        assert (await a.get_run(run.id)).attempts == 1
        ledger = await a.ledger(run_id=run.id)
        assert len(ledger) == 4 and all(math.isclose(e.amount, 0.008) for e in ledger)
        assert {e.tenant for e in ledger} == {"acme"}
        # each model call's row names its provider and the tokens it used
        assert [(e.provider, e.tokens) for e in ledger] == [("fake", 800)] * 4
        spent = await a.spent(tenant="acme", run_id=run.id)
        assert math.isclose(spent[f"the per-run budget of run {run.id}"], 0.032)


async def test_bad_input_is_refused_with_what_to_do() -> None:
    clock = VirtualClock()
    graph = review_graph(Counter(), set())

    def make(store: shoal.Store, clock: shoal.Clock, instance_id: str) -> shoal.App:
        app = shoal.App("bad", store=store, clock=clock, instance_id=instance_id)

        @app.workflow(max_attempts=1)
        async def own_thread(ctx: shoal.RunContext, _: Any) -> Any:
            return await run_graph(ctx, graph, {"log": []},
                                   {"configurable": {"thread_id": "mine"}})

        @app.workflow(max_attempts=1)
        async def not_a_graph(ctx: shoal.RunContext, _: Any) -> Any:
            return await run_graph(ctx, object(), {})

        return app

    async with cluster(make, instances=1, clock=clock) as (a,):
        for name, says in [("own_thread", "set by run_graph itself"),
                           ("not_a_graph", "compiled LangGraph graph")]:
            run = await a.dispatch(name)
            with pytest.raises(shoal.RunFailedError, match=says):
                await a.result(run.id)
    with pytest.raises(shoal.ConfigurationError, match="tenant"):
        ShoalCheckpointer("memory://", tenant="")
    with pytest.raises(shoal.ConfigurationError, match="Unknown store URL"):
        ShoalCheckpointer("mysql://x")
    with pytest.raises(TypeError, match=r"app.provider\(...\) returns"):
        metered(GenericFakeChatModel(messages=iter([])), object())  # type: ignore[arg-type]


class Inner(TypedDict):
    answer: str


async def test_two_interrupts_in_a_node_and_one_in_a_subgraph_are_three_pauses() -> None:
    def twice(state: State) -> dict[str, list[str]]:
        first = interrupt({"ask": 1})
        second = interrupt({"ask": 2})
        return {"log": [first["by"], second["by"]]}

    def ask(state: Inner) -> Inner:
        return {"answer": interrupt({"ask": "inner"})["by"]}

    inner = StateGraph(Inner)
    inner.add_node("ask", ask)
    inner.add_edge(START, "ask")
    inner.add_edge("ask", END)
    compiled_inner = inner.compile()

    async def nested(state: State) -> dict[str, list[str]]:
        return {"log": [(await compiled_inner.ainvoke({"answer": ""}))["answer"]]}

    builder = StateGraph(State)
    builder.add_node("twice", twice)
    builder.add_node("nested", nested)
    builder.add_edge(START, "twice")
    builder.add_edge("twice", "nested")
    builder.add_edge("nested", END)
    graph = builder.compile()
    clock = VirtualClock()
    async with cluster(maker(graph), instances=2, clock=clock) as (a, b):
        run = await a.dispatch("post", "start")
        asked = []
        for who, app in [("ann", a), ("bob", b), ("cy", a)]:
            async def asks(app: shoal.App = app) -> bool:
                return bool(await app.pending_pauses())

            await until(asks)
            [pause] = await app.pending_pauses()
            asked.append((pause.name, pause.request))
            await app.resume(pause.id, approved=True, by=who)
        assert await a.result(run.id) == ["start", "ann", "bob", "cy"]
        assert asked == [("twice", {"ask": 1}), ("twice", {"ask": 2}),
                         ("nested", {"ask": "inner"})]
        steps = [s.name for s in await a.store.load_steps(run.id)]
        assert steps == ["langgraph", "shoal.approval:twice"] * 2 + [
            "langgraph", "shoal.approval:nested", "langgraph"]


async def test_a_lost_claim_writes_nothing_more_of_the_graph() -> None:
    """While a node runs, another owner takes the run over (here: its row changed under the
    engine, as a recovery after a frozen process would): the node's writes and the next
    checkpoint are refused, and the attempt ends as a lost lease, not a failure."""
    clock = VirtualClock()
    holder: dict[str, Any] = {}

    def steal(state: State) -> dict[str, list[str]]:
        store, run_id = holder["store"], holder["run"]
        run = store._runs[run_id]
        store._runs[run_id] = dataclasses.replace(run, owner="thief",
                                                  lease_epoch=run.lease_epoch + 1)
        return {"log": ["stolen"]}

    builder = StateGraph(State)
    builder.add_node("steal", steal)
    builder.add_edge(START, "steal")
    builder.add_edge("steal", END)
    lost: list[BaseException] = []
    async with cluster(maker(builder.compile()), instances=1, clock=clock) as (a,):
        a.on_error(lost.append)
        holder["store"] = a.store
        run = await a.dispatch("post", "x")
        holder["run"] = run.id
        await until(lambda: _true(bool(lost)))
        assert isinstance(lost[0], shoal.LeaseLostError)
        taken = await a.get_run(run.id)
        assert (taken.status, taken.owner) == ("running", "thief")
        saver = ShoalCheckpointer(a.store, namespace="graphs")
        latest = await saver.aget_tuple({"configurable": {"thread_id": run.id}})
        assert latest is not None and latest.pending_writes == []
        assert latest.checkpoint["channel_values"]["log"] == ["x"]   # the input's only


async def _true(value: bool) -> bool:
    return value


async def test_replaying_a_finished_graph_run_reads_no_store_and_passes() -> None:
    """``shoal replay`` of a run whose graph ended: the graph's output lives in its
    checkpoints, which a replay does not read; the replay ends there, every step matched."""
    from shoal.app.history import export
    from shoal.testing import replay

    def register(app: shoal.App) -> None:
        builder = StateGraph(State)
        builder.add_node("a", lambda s: {"log": ["a"]})
        builder.add_node("b", lambda s: {"log": ["b"]})
        builder.add_edge(START, "a")
        builder.add_edge("a", "b")
        builder.add_edge("b", END)
        graph = builder.compile()

        @app.workflow(name="post")
        async def post(ctx: shoal.RunContext, topic: str) -> list[str]:
            out = await run_graph(ctx, graph, {"log": [topic]})
            return list(out["log"])

    app = shoal.App("graphs", store="memory://", clock=VirtualClock())
    register(app)
    async with app:
        run = await app.dispatch("post", "t")
        assert await app.result(run.id) == ["t", "a", "b"]
        history = await export(app, run.id)
    again = shoal.App("graphs", store="memory://")
    register(again)
    result = await replay(again, history)
    assert result.ok and result.outcome == "ended", result


def changed_graph(change: str) -> Any:
    """``review_graph``'s shape (draft -> review, which asks -> publish) as a deploy may change
    it: ``same``, ``removed`` (no review), ``renamed`` (review is ``check``), ``moved`` (review
    goes to ``audit``), ``added`` (publish goes on to ``audit``), ``conditional`` (review goes
    where a function says, declared as ``publish`` or ``audit``)."""
    def node(name: str, ask: bool = False) -> Any:
        def run(state: State) -> dict[str, list[str]]:
            answer = interrupt({"draft": state["log"][-1]}) if ask else None
            return {"log": [f"{name}:{answer['approved']}" if ask else name]}
        return run

    review = "check" if change == "renamed" else "review"
    builder = StateGraph(State)
    builder.add_node("draft", node("draft"))
    if change != "removed":
        builder.add_node(review, node(review, ask=True))
    builder.add_node("publish", node("publish"))
    builder.add_node("audit", node("audit"))
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "publish" if change == "removed" else review)
    if change == "conditional":
        builder.add_conditional_edges(review, lambda s: "a", {"p": "publish", "a": "audit"})
    elif change != "removed":
        builder.add_edge(review, "audit" if change == "moved" else "publish")
    builder.add_edge("publish", "audit" if change == "added" else END)
    builder.add_edge("audit", END)
    return builder.compile()


def graph_app(graph: Any, clock: VirtualClock | None = None) -> shoal.App:
    app = shoal.App("graphs", store="memory://", clock=clock or VirtualClock())

    @app.workflow(name="post")
    async def post(ctx: shoal.RunContext, topic: str) -> list[str]:
        return list((await run_graph(ctx, graph, {"log": [topic]}))["log"])

    return app


async def recorded_graph_run(until: str) -> dict[str, Any]:
    """A run of ``changed_graph("same")`` to ``until`` ("waiting": at the review, "done"),
    exported: its steps are langgraph, shoal.approval:review, langgraph."""
    from shoal.app.history import export
    clock = VirtualClock()
    app = graph_app(changed_graph("same"), clock)
    async with app:
        run = await app.dispatch("post", "t")
        await until_waiting(app, run.id)
        if until == "done":
            [pause] = await app.pending_pauses()
            await app.resume(pause.id, approved=True, by="ana")
            assert await app.result(run.id) == ["t", "draft", "review:True", "publish"]
        return await export(app, run.id)


async def until_waiting(app: shoal.App, run_id: str) -> None:
    await until(status_is(app, run_id, "waiting"))


@pytest.mark.parametrize(("change", "detail"), [
    ("removed", "super-step 1: node 'draft' went on to 'review', which the current graph does "
                "not have (its nodes: 'audit', 'draft', 'publish')"),
    ("renamed", "super-step 1: node 'draft' went on to 'review', which the current graph does "
                "not have (its nodes: 'audit', 'check', 'draft', 'publish')"),
    ("moved", "super-step 2: node 'review' went on to 'publish', but the current graph has no "
              "edge from 'review' there (it goes to 'audit')"),
    ("added", "super-step 3: node 'publish' went on to nothing, but the current graph has an "
              "edge from 'publish' to 'audit', which the recorded run did not take"),
])
async def test_a_replay_checks_the_graph_against_its_recorded_super_steps(
        change: str, detail: str) -> None:
    """``shoal replay`` of a finished graph run (3 checkpoints: langgraph, the approval,
    langgraph) against a graph changed since: the recorded segments return without running the
    graph, so the graph's own recorded super-steps are what show the change, as a mismatch at
    the first segment."""
    from shoal.testing import replay
    history = await recorded_graph_run("done")
    assert [s["name"] for s in history["steps"]] == [
        "langgraph", "shoal.approval:review", "langgraph"]

    result = await replay(graph_app(changed_graph(change)), history)
    assert not result.ok and result.outcome == "mismatch", result
    assert result.mismatch is not None
    assert (result.mismatch.seq, result.mismatch.recorded, result.mismatch.new) == (
        1, "langgraph", "langgraph")
    assert result.mismatch.detail is not None and detail in result.mismatch.detail, result
    assert "nondeterministic at #1 ('langgraph'): the graph changed: " + detail in str(result)
    assert detail in result.to_json()["mismatch"]["detail"]

    same = await replay(graph_app(changed_graph("same")), history)
    assert (same.ok, same.outcome, same.replayed, same.unchecked) == (True, "ended", 3, ())


async def test_a_run_waiting_in_a_renamed_node_does_not_replay() -> None:
    """A run waiting at the review's interrupt would resume in a node the new graph does not
    have: the interrupted task is in the record's pending writes."""
    from shoal.testing import replay
    history = await recorded_graph_run("waiting")
    assert [s["name"] for s in history["steps"]] == ["langgraph", "shoal.approval:review"]
    assert (await replay(graph_app(changed_graph("same")), history)).ok
    result = await replay(graph_app(changed_graph("renamed")), history)
    assert not result.ok and result.mismatch is not None and result.mismatch.detail
    assert "'review'" in result.mismatch.detail


async def test_a_conditional_edge_is_checked_by_its_declared_destinations() -> None:
    """Its function is not called (it may call a model): the destination it took must still
    be one it declares."""
    from shoal.testing import replay
    history = await recorded_graph_run("done")
    result = await replay(graph_app(changed_graph("conditional")), history)
    assert result.ok, result      # review -> publish is still declared


async def test_a_history_without_the_graph_says_the_graph_is_not_checked() -> None:
    """A history exported before the graph's checkpoints were: the replay cannot check the
    graph, and says so rather than passing it."""
    from shoal.testing import replay
    history = await recorded_graph_run("done")
    del history["graph"]
    result = await replay(graph_app(changed_graph("removed")), history)
    assert result.ok and len(result.unchecked) == 1
    assert "NOT CHECKED: the LangGraph graph's changes: the history holds none of its " \
           "checkpoints" in str(result)


async def test_sends_joins_and_conditional_loops_replay_on_the_same_graph() -> None:
    """No false alarm: a graph with a loop through a conditional edge, a fan-out of ``Send``
    and a join replays ok on itself; its join moved elsewhere does not."""
    from langgraph.types import Send

    from shoal.app.history import export
    from shoal.testing import replay

    def graph(join_from: str) -> Any:
        b = StateGraph(State)
        for name in ("split", "work", "x", "y", "join"):
            b.add_node(name, lambda s, name=name: {"log": [name]})
        b.add_edge(START, "split")
        b.add_conditional_edges("split", lambda s: [Send("work", {"log": [str(i)]})
                                                    for i in range(3)])
        b.add_conditional_edges("work", lambda s: "x", {"x": "x", "again": "split"})
        b.add_edge("split", "y")
        b.add_edge([join_from, "y"], "join")
        b.add_edge("join", END)
        return b.compile()

    app = graph_app(graph("x"))
    async with app:
        run = await app.dispatch("post", "t")
        assert (await app.result(run.id))[-1] == "join"
        history = await export(app, run.id)
    assert (await replay(graph_app(graph("x")), history)).ok
    moved = await replay(graph_app(graph("work")), history)
    assert not moved.ok and moved.mismatch is not None and moved.mismatch.detail
    assert "join:x+y:join" in moved.mismatch.detail, moved
