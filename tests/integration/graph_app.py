"""The worker side of ``test_langgraph_processes.py``: one shoal App over a shared store (a SQLite
file or a PostgreSQL schema) running a LangGraph graph with ``run_graph``:
draft -> research -> review (``interrupt``: a pause) -> publish.

Each node appends to the shared log (one ``os.write`` per JSON line, O_APPEND) a ``started``
line when it begins and an ``effect`` line, its side effect, when it ends. The node named by
``GRAPH_HANG_AT`` hangs after its ``started`` line in the process whose instance id starts with
``GRAPH_HANG_IN``: the test kills that process there, with the nodes before it recorded.

``python graph_app.py worker``   serve until SIGTERM (``App.run_forever``), then close

Configured by environment variables: ``GRAPH_STORE`` (a store URL), ``GRAPH_LOG`` (the log),
``GRAPH_INSTANCE`` (instance id), ``GRAPH_LEASE`` (seconds), ``GRAPH_HANG_AT``,
``GRAPH_HANG_IN``, ``GRAPH_MAX_LIFE`` (seconds; the process exits by itself after that).
"""

from __future__ import annotations

import asyncio
import itertools
import operator
import os
import sys
import time
from typing import Annotated, Any, TypedDict

import harness
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import shoal
from shoal.integrations.langgraph import run_graph

NAMESPACE = "graphs"
NODES = ["draft", "research", "review", "publish"]
emit = harness.LineLog("GRAPH_LOG")


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _node(name: str) -> Any:
    async def run(state: State, config: RunnableConfig) -> dict[str, list[str]]:
        run_id = config["configurable"]["thread_id"]
        instance = os.environ["GRAPH_INSTANCE"]
        emit({"kind": "started", "node": name, "run": run_id, "instance": instance,
              "t": time.time()})
        if name == os.environ.get("GRAPH_HANG_AT") and instance.startswith(
                os.environ.get("GRAPH_HANG_IN", "-")):
            await asyncio.sleep(3600)   # killed here
        answer = interrupt({"draft": state["log"][-1]}) if name == "review" else None
        emit({"kind": "effect", "node": name, "run": run_id, "instance": instance,
              "answer": answer, "t": time.time()})
        return {"log": [name if answer is None else f"{name}:{answer['by']}"]}
    return run


def build_graph() -> Any:
    builder = StateGraph(State)
    for name in NODES:
        builder.add_node(name, _node(name))
    builder.add_edge(START, NODES[0])
    for before, after in itertools.pairwise(NODES):
        builder.add_edge(before, after)
    builder.add_edge(NODES[-1], END)
    return builder.compile()


def make_app(url: str | None = None) -> shoal.App:
    app = shoal.App(NAMESPACE, store=url or os.environ["GRAPH_STORE"],
                    instance_id=os.environ.get("GRAPH_INSTANCE"),
                    lease=float(os.environ.get("GRAPH_LEASE", "2.0")))
    graph = build_graph()

    @app.workflow(max_attempts=5)
    async def write(ctx: shoal.RunContext, topic: str) -> list[str]:
        out = await run_graph(ctx, graph, {"log": [topic]})
        return list(out["log"])

    return app


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        harness.serve(make_app, emit, "GRAPH", drain=5.0)
    else:
        sys.exit(f"usage: {sys.argv[0]} worker")
