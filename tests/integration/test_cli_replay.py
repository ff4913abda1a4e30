"""``shoal export RUN_ID`` and ``shoal replay FILE --app MODULE:APP`` as real processes over a
SQLite file: a run recorded by the deployed code is exported, then replayed against the deployed
code (exit 0) and against a change that would take another path (exit 1, the checkpoint named)."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import shoal
from shoal.testing import VirtualClock

CLI = [sys.executable, "-m", "shoal.cli"]

V1 = '''
import shoal
app = shoal.App("shop", store="memory://")

async def charge(amount: int) -> int:
    return amount

@app.workflow
async def order(ctx: shoal.RunContext, amount: int) -> int:
    charged = await ctx.step("charge", charge, amount)
    await ctx.sleep(3600)
    return await ctx.step("ship", charge, charged)
'''

V2 = V1.replace('''    await ctx.sleep(3600)''',
                '''    await ctx.step("fraud_check", charge, charged)
    await ctx.sleep(3600)''')


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


async def record(url: str, module: Path) -> str:
    """Run v1's ``order`` until it sleeps, on the SQLite store at ``url``."""
    sys.path.insert(0, str(module.parent))
    try:
        v1 = importlib.import_module(module.stem)
    finally:
        sys.path.remove(str(module.parent))
    clock = VirtualClock()
    app = shoal.App("shop", store=url, clock=clock)
    app.workflow(v1.order.spec.fn)
    async with app:
        run = await app.dispatch("order", 40)
        await clock.advance(1)
        assert (await app.get_run(run.id)).status == "sleeping"
        return run.id


def test_export_then_replay_old_and_new_code(tmp_path: Path) -> None:
    (tmp_path / "shop_v1.py").write_text(V1)
    (tmp_path / "shop_v2.py").write_text(V2)
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    run_id = asyncio.run(record(url, tmp_path / "shop_v1.py"))

    exported = run_cli(tmp_path, "export", run_id, "--store", url)
    assert exported.returncode == 0, exported.stderr
    history = json.loads(exported.stdout)
    assert (history["format"], history["version"]) == ("shoal.history", 1)
    assert history["run"]["id"] == run_id and history["run"]["status"] == "sleeping"
    assert [s["name"] for s in history["steps"]] == ["charge", "shoal.sleep"]
    (tmp_path / "run.json").write_text(exported.stdout)

    same = run_cli(tmp_path, "replay", "run.json", "--app", "shop_v1:app")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "ok run.json" in same.stdout and "follows the history to its end" in same.stdout

    changed = run_cli(tmp_path, "replay", "run.json", "--app", "shop_v2:app", "--json")
    assert changed.returncode == 1, changed.stdout + changed.stderr
    report = json.loads(changed.stdout)
    assert report["ok"] is False and report["file"] == "run.json"
    assert report["mismatch"] == {"seq": 2, "recorded": "shoal.sleep", "new": "fraud_check",
                                  "detail": None}

    human = run_cli(tmp_path, "replay", "run.json", "--app", "shop_v2:app")
    assert human.returncode == 1
    assert ("nondeterministic at #2: recorded 'shoal.sleep', the code reached 'fraud_check'"
            in " ".join(human.stdout.split()))


def test_bad_histories_and_unknown_runs_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "shop_v1.py").write_text(V1)
    (tmp_path / "notes.json").write_text('{"hello": 1}')
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    run_cli(tmp_path, "--store", url, "migrate")
    unknown = run_cli(tmp_path, "export", "no-such-run", "--store", url)
    assert unknown.returncode == 1 and "no-such-run" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    bad = run_cli(tmp_path, "replay", "notes.json", "missing.json", "--app", "shop_v1:app",
                  "--json")
    assert bad.returncode == 1
    lines = [json.loads(line) for line in bad.stdout.splitlines()]
    assert [r["ok"] for r in lines] == [False, False]
    assert "not a shoal run history" in lines[0]["error"]
    assert "missing.json" in lines[1]["error"]


GRAPH_V1 = '''
import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import shoal
from shoal.integrations.langgraph import run_graph

app = shoal.App("posts", store="memory://")


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def draft(state: State) -> dict:
    return {"log": ["draft"]}


def review(state: State) -> dict:
    return {"log": [f"review:{interrupt({'draft': state['log'][-1]})['approved']}"]}


def publish(state: State) -> dict:
    return {"log": ["publish"]}


builder = StateGraph(State)
builder.add_node("draft", draft)
builder.add_node("review", review)
builder.add_node("publish", publish)
builder.add_edge(START, "draft")
builder.add_edge("draft", "review")
builder.add_edge("review", "publish")
builder.add_edge("publish", END)
graph = builder.compile()


@app.workflow
async def post(ctx: shoal.RunContext, topic: str) -> list:
    return list((await run_graph(ctx, graph, {"log": [topic]}))["log"])
'''

GRAPH_RENAMED = GRAPH_V1.replace('"review"', '"check"')


async def record_graph(url: str, module: Path) -> str:
    """Run the graph of ``module`` to its end on the SQLite store at ``url``: three
    checkpoints, langgraph, the review's approval, langgraph."""
    sys.path.insert(0, str(module.parent))
    try:
        v1 = importlib.import_module(module.stem)
    finally:
        sys.path.remove(str(module.parent))
    app = shoal.App("posts", store=url, clock=VirtualClock())
    app.workflow(v1.post.spec.fn)
    async with app:
        run = await app.dispatch("post", "t")
        for _ in range(200):
            if pauses := await app.pending_pauses():
                break
            await asyncio.sleep(0.01)
        await app.resume(pauses[0].id, approved=True, by="ana")
        assert await app.result(run.id, timeout=10) == ["t", "draft", "review:True", "publish"]
        return run.id


def test_a_graph_changed_since_its_run_fails_the_replay(tmp_path: Path) -> None:
    """A LangGraph run recorded on SQLite, then its graph's node renamed: the replay fails,
    names the node, exits 1 and counts the history as failed."""
    (tmp_path / "posts_v1.py").write_text(GRAPH_V1)
    (tmp_path / "posts_v2.py").write_text(GRAPH_RENAMED)
    url = f"sqlite:///{tmp_path / 'posts.db'}"
    run_id = asyncio.run(record_graph(url, tmp_path / "posts_v1.py"))
    exported = run_cli(tmp_path, "export", run_id, "--store", url)
    assert exported.returncode == 0, exported.stderr
    assert len(json.loads(exported.stdout)["graph"]) == 5    # input, then 4 super-steps
    (tmp_path / "run.json").write_text(exported.stdout)

    same = run_cli(tmp_path, "replay", "run.json", "--app", "posts_v1:app")
    assert same.returncode == 0, same.stdout + same.stderr
    out = " ".join(same.stdout.split())
    assert "ok run.json" in out and "3 of 3 recorded checkpoints replayed" in out
    assert out.endswith("1 history: 1 ok, 0 failed")

    renamed = run_cli(tmp_path, "replay", "run.json", "run.json", "--app", "posts_v2:app")
    assert renamed.returncode == 1, renamed.stdout + renamed.stderr
    out = " ".join(renamed.stdout.split())
    assert out.count("FAILED run.json") == 2 and "ok run.json" not in out
    assert ("nondeterministic at #1 ('langgraph'): the graph changed: super-step 1: node "
            "'draft' went on to 'review', which the current graph does not have") in out
    assert out.endswith("2 histories: 0 ok, 2 failed")
