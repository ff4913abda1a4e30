"""A LangGraph graph run by ``run_graph`` in real worker processes (``graph_app.py``), on a SQLite
file and on a PostgreSQL schema: the worker running it is killed with SIGKILL in the middle of
the graph, another worker continues the run from its last super-step, the graph's interrupt is a
pause answered by ``shoal approve`` from a third process, and each node's side effect happened
exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import graph_app
import pytest
from backends import backend
from harness import Processes, read_log, wait_until

import shoal

HERE = Path(__file__).resolve().parent
SHOAL = Path(sys.executable).parent / "shoal"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with backend(request.param, tmp_path / "graphs.db", "GRAPH", "shoal_lg_") as b:
        yield b.env["GRAPH_STORE"]


@pytest.mark.slow
async def test_kill9_mid_graph_then_approve_from_the_cli(store_url: str, tmp_path: Path) -> None:
    log = tmp_path / "graph.log"
    procs = Processes(tmp_path, HERE / "graph_app.py", "GRAPH",
                      {"GRAPH_STORE": store_url, "GRAPH_LOG": str(log), "GRAPH_LEASE": "2.0",
                       "GRAPH_HANG_AT": "research", "GRAPH_HANG_IN": "first",
                       "GRAPH_MAX_LIFE": "120"})
    app = graph_app.make_app(store_url)
    try:
        async with app.open():   # migrates the store before the workers open it
            procs.start_worker("first")
            await procs.wait_started(log)
            run = await app.dispatch("write", "shoal")

            def lines(kind: str) -> list[tuple[str, str]]:
                return [(r["node"], r["instance"]) for r in read_log(log)
                        if r["kind"] == kind and r.get("run") == run.id]

            async def hanging() -> bool:
                return ("research", procs.instances["first"]) in lines("started")

            await wait_until(hanging, 30, "research to start on the first worker")
            assert [n for n, _ in lines("effect")] == ["draft"]
            procs.kill("first")                     # SIGKILL in the middle of the graph
            procs.start_worker("second")

            async def paused() -> list[shoal.Pause]:
                return await app.pending_pauses()

            [pause] = await wait_until(paused, 60, "the review's pause")
            assert (pause.run_id, pause.name, pause.request) == (
                run.id, "review", {"draft": "research"})
            answered = await asyncio.to_thread(subprocess.run, [
                str(SHOAL), "--store", store_url, "-n", graph_app.NAMESPACE, "approve", pause.id,
                "--by", "ana", "--json"], capture_output=True, text=True, timeout=60)
            assert answered.returncode == 0, answered.stderr
            assert json.loads(answered.stdout)["decision"]["by"] == "ana"

            assert await app.result(run.id, timeout=60) == [
                "shoal", "draft", "research", "review:ana", "publish"]
            second = procs.instances["second"]
            # each node's side effect once: draft on the killed worker, the others after it
            assert lines("effect") == [("draft", procs.instances["first"]),
                                       ("research", second), ("review", second),
                                       ("publish", second)]
            done = await app.get_run(run.id)
            assert done.status == "succeeded" and done.attempts == 2
        assert procs.stop_workers() == {"second": 0}
    except BaseException:
        print(procs.stderr_tail())
        raise
    finally:
        procs.cleanup()


def test_the_example_agent_runs(tmp_path: Path) -> None:
    """examples/langgraph_agent/agent.py's demo, in a folder of its own."""
    example = HERE.parent.parent / "examples" / "langgraph_agent" / "agent.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    done = subprocess.run([sys.executable, str(example)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "'refund': {'approved': True, 'by': 'ana'}" in done.stdout
    assert "2 model calls" in done.stdout
