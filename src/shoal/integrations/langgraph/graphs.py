"""``run_graph``: a compiled LangGraph graph run durably inside a shoal run.

The graph's thread is the run (its id is the ``thread_id``, in the app's namespace and the run's
tenant), checkpointed by a :class:`ShoalCheckpointer` on the app's own store after every
super-step (``durability="sync"``), each write conditional on the run's claim. The graph runs in
*segments*, each one ``ctx.step("langgraph", …)``: a segment runs the graph from its latest
checkpoint until it ends or stops at ``interrupt(...)``, and records which interrupts it stopped
at. Each interrupt then becomes ``ctx.approval(node, value)``: a pause with no worker held, and
the next segment resumes the graph with every decision (``Command(resume={id: decision})``).

So the run's own steps are always ``langgraph``, the approvals of its interrupts, ``langgraph``,
… in the same order, and a replay returns the recorded ones without running anything. A run
delivered again after a crash runs the unfinished segment again, and the graph goes on from its
latest checkpoint: a node whose writes were recorded never runs again.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.types import Command

from shoal.engine.context import RunContext
from shoal.integrations.base import json_value
from shoal.integrations.langgraph._recorded import graph_changes
from shoal.integrations.langgraph.saver import ShoalCheckpointer

STEP = "langgraph"   # the name of each segment's step


def _config(ctx: RunContext, config: RunnableConfig | None) -> RunnableConfig:
    given: dict[str, Any] = dict(config or {})
    configurable = dict(given.get("configurable") or {})
    for key in ("thread_id", "checkpoint_id", "checkpoint_ns"):
        if key in configurable:
            raise ValueError(
                f"run_graph: config['configurable'][{key!r}] is set by run_graph itself (the "
                f"graph's thread is the run, {ctx.run_id!r}); leave it out.")
    configurable["thread_id"] = ctx.run_id
    given["configurable"] = configurable
    return cast(RunnableConfig, given)


async def run_graph(ctx: RunContext, graph: Any, input: Any, config: RunnableConfig | None = None,
                    *, expires_in: float | None = 86400.0) -> Any:
    """Run the compiled LangGraph ``graph`` on ``input`` inside this run, durably, and return
    what ``graph.ainvoke`` returns (the final state). Each ``interrupt(value)`` in a node is a
    pause named after the node, ``value`` its request (JSON), listed by ``shoal pauses`` and
    answered by ``app.resume`` / ``shoal approve`` (or denied with reason ``"expired"`` after
    ``expires_in`` seconds); the node gets the decision as ``interrupt``'s return value: a dict
    ``{"approved", "data", "by", "reason"}``. ``config`` is LangGraph's (``configurable`` keys
    for the nodes, ``recursion_limit``, …) without ``thread_id``: the thread is the run. Call it
    from the workflow function, not from inside a step."""
    if not hasattr(graph, "aget_state") or not hasattr(graph, "copy"):
        raise TypeError(f"run_graph(ctx, graph, ...): graph is a compiled LangGraph graph "
                        f"(builder.compile()), not {graph!r}.")
    if ctx.extension.replaying:
        _check_recorded_graph(ctx, graph)
    runnable = graph.copy(update={"checkpointer": ShoalCheckpointer.for_run(ctx)})
    cfg = _config(ctx, config)
    decisions: dict[str, Any] = {}
    while True:
        stopped = await ctx.step(STEP, _segment, runnable, cfg, input, dict(decisions))
        if not stopped:
            if ctx.extension.replaying:
                # a replay (shoal replay) reads no store: the graph's output is in its
                # checkpoints, so the replay ends here, every recorded step matched
                ctx.extension.end_replay("langgraph.output")
            return await runnable.ainvoke(None, cfg)   # the graph has ended: its output
        for interrupt in stopped:
            decision = await ctx.approval(interrupt["node"], interrupt["value"],
                                          expires_in=expires_in)
            decisions[interrupt["id"]] = dataclasses.asdict(decision)


def _check_recorded_graph(ctx: RunContext, graph: Any) -> None:
    """In a replay (``shoal replay``), where the segments return their recorded results
    without running the graph: check the graph against the super-steps its run recorded, and
    stop the replay at the first segment with what differs. A history without them (exported
    by an older shoal) is said to be unchecked, not passed."""
    ext = ctx.extension
    recorded = ext.recorded_graph_checkpoints
    if recorded is None:
        ext.replay_unchecked(
            "the LangGraph graph's changes: the history holds none of its checkpoints (exported "
            "by an older shoal); export the run again to check them")
        return
    problem, unchecked = graph_changes(graph, recorded)
    for what in unchecked:
        ext.replay_unchecked(what)
    if problem is not None:
        ext.replay_differs(STEP, f"the graph changed: {problem}")


async def _segment(runnable: Any, cfg: RunnableConfig, input: Any,
                   decisions: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the graph from its latest checkpoint until it ends (``[]``) or stops at interrupts
    (each ``{"id", "node", "value"}``): from ``input`` on a thread with no checkpoint yet;
    resumed with ``decisions`` when it waits at interrupts they answer; on from its latest
    checkpoint when it was cut off (a crash); not at all when it has ended, or waits at an
    interrupt not answered yet."""
    state = await runnable.aget_state(cfg)
    if state.created_at is None:
        step_input: Any = input
    elif state.interrupts:
        if any(i.id not in decisions for i in state.interrupts):
            return _interrupts(state)
        step_input = Command(resume={i.id: decisions[i.id] for i in state.interrupts})
    elif state.next:
        step_input = None
    else:
        return []
    await runnable.ainvoke(step_input, cfg, durability="sync")
    return _interrupts(await runnable.aget_state(cfg))


def _interrupts(state: Any) -> list[dict[str, Any]]:
    nodes = {i.id: task.name for task in state.tasks for i in task.interrupts}
    found = []
    for interrupt in state.interrupts:
        node = nodes.get(interrupt.id, "interrupt")
        value = json_value(interrupt.value, f"the value given to interrupt() in node {node!r} "
                                    f"(it becomes the pause's request)")
        found.append({"id": interrupt.id, "node": node, "value": value})
    return found
