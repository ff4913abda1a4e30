"""What a LangGraph node costs on shoal, beside the graph alone with LangGraph's InMemorySaver.

    python bench/agents.py                      # SQLite, and PostgreSQL if reachable
    python bench/agents.py --nodes 50 --graphs 20

A graph of ``--nodes`` no-op nodes in a line runs ``--graphs`` times, one graph after the other,
each on a thread of its own, with ``durability="sync"`` (each super-step's checkpoint written
before the next step starts, as ``run_graph`` runs graphs):

- ``InMemorySaver``: the graph alone, its checkpoints in this process's memory;
- ``ShoalCheckpointer``: the same graph checkpointed in a SQLite file (``synchronous=FULL``, an
  fsync per commit) or a PostgreSQL schema;
- ``run_graph``: the graph inside a shoal run, dispatched and awaited (``app.result``) on an
  app with one worker: the run's claim and settlement, its segment step, and the fenced writes.

Each row gives the milliseconds per node (the wall time of a graph divided by its nodes, median
of the graphs) and the store writes per node (checkpoints plus pending-write batches, counted at
the store). The node itself does nothing: the numbers are the checkpointing's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from rich.console import Console
from rich.table import Table

import shoal
from shoal.integrations.langgraph import ShoalCheckpointer, run_graph

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine

PG = os.environ.get("SHOAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


class State(TypedDict):
    n: int


def line_graph(nodes: int, checkpointer: Any = None) -> Any:
    builder = StateGraph(State)
    for i in range(nodes):
        builder.add_node(f"n{i}", lambda s: {"n": s["n"] + 1})
    builder.add_edge(START, "n0")
    for i in range(1, nodes):
        builder.add_edge(f"n{i - 1}", f"n{i}")
    builder.add_edge(f"n{nodes - 1}", END)
    return builder.compile(checkpointer=checkpointer)


class Counted:
    """Counts the graph writes of a store (its put_graph_checkpoint / put_graph_writes)."""

    def __init__(self, store: Any) -> None:
        self.writes = 0
        for name in ("put_graph_checkpoint", "put_graph_writes"):
            original = getattr(store, name)

            async def counted(*args: Any, _original: Any = original) -> Any:
                self.writes += 1
                return await _original(*args)

            setattr(store, name, counted)


async def alone(nodes: int, graphs: int) -> tuple[float, float]:
    saver = InMemorySaver()
    graph = line_graph(nodes, saver)
    writes = 0
    put, put_writes = saver.aput, saver.aput_writes

    async def aput(*args: Any) -> Any:
        nonlocal writes
        writes += 1
        return await put(*args)

    async def aput_writes(*args: Any) -> Any:
        nonlocal writes
        writes += 1
        return await put_writes(*args)

    saver.aput, saver.aput_writes = aput, aput_writes   # type: ignore[method-assign]
    times = []
    for g in range(graphs):
        began = time.perf_counter()
        out = await graph.ainvoke({"n": 0}, {"configurable": {"thread_id": f"t{g}"}},
                                  durability="sync")
        times.append(time.perf_counter() - began)
        assert out == {"n": nodes}
    return statistics.median(times) * 1000 / nodes, writes / (graphs * nodes)


async def checkpointer(url: str, nodes: int, graphs: int) -> tuple[float, float]:
    store: Any = shoal.stores.open_store(url)
    await store.open()
    counted = Counted(store)
    try:
        graph = line_graph(nodes, ShoalCheckpointer(store, namespace="bench"))
        times = []
        for g in range(graphs):
            began = time.perf_counter()
            out = await graph.ainvoke({"n": 0}, {"configurable": {"thread_id": f"t{g}"}},
                                      durability="sync")
            times.append(time.perf_counter() - began)
            assert out == {"n": nodes}
    finally:
        await store.close()
    return statistics.median(times) * 1000 / nodes, counted.writes / (graphs * nodes)


async def in_runs(url: str, nodes: int, graphs: int) -> tuple[float, float]:
    app = shoal.App("bench", store=url, max_concurrent_runs=1)
    graph = line_graph(nodes)

    @app.workflow
    async def walk(ctx: shoal.RunContext, _: Any) -> int:
        return int((await run_graph(ctx, graph, {"n": 0}))["n"])

    times = []
    async with app:
        counted = Counted(app.store)
        for _ in range(graphs):
            began = time.perf_counter()
            run = await app.dispatch(walk)
            assert await app.result(run.id, timeout=120) == nodes
            times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000 / nodes, counted.writes / (graphs * nodes)


def _pg_url() -> tuple[str, str] | None:
    try:
        import psycopg

        with psycopg.connect(PG, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception:
        return None
    schema = f"shoal_bench_{os.getpid()}"
    sep = "&" if "?" in PG else "?"
    return f"{PG}{sep}schema={schema}", schema


def _drop(schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--graphs", type=int, default=10)
    args = parser.parse_args()
    console = Console()
    console.print(machine("LangGraph on shoal"))
    table = Table(title=f"a line of {args.nodes} no-op nodes, {args.graphs} graphs, "
                        f"durability='sync'")
    for column in ("checkpoints", "store", "ms / node", "store writes / node"):
        table.add_column(column, justify="right" if "/" in column else "left")

    def row(what: str, where: str, result: tuple[float, float]) -> None:
        table.add_row(what, where, f"{result[0]:.2f}", f"{result[1]:.1f}")

    row("InMemorySaver (the graph alone)", "memory", await alone(args.nodes, args.graphs))
    with tempfile.TemporaryDirectory() as folder:
        for what, run in (("ShoalCheckpointer", checkpointer), ("run_graph", in_runs)):
            url = f"sqlite:///{folder}/{what}.db"
            row(what, "SQLite", await run(url, args.nodes, args.graphs))
    pg = _pg_url()
    if pg is None:
        console.print(f"[yellow]PostgreSQL at {shoal.stores.mask_url(PG)} is not reachable: "
                      f"skipped[/]")
    else:
        url, schema = pg
        try:
            for what, run in (("ShoalCheckpointer", checkpointer), ("run_graph", in_runs)):
                row(what, "PostgreSQL", await run(url, args.nodes, args.graphs))
                _drop(schema)
        finally:
            _drop(schema)
    console.print(table)


if __name__ == "__main__":
    asyncio.run(main())
