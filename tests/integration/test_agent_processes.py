"""An OpenAI Agents SDK agent run by ``shoal.integrations.openai_agents`` across real processes
(``agent_app.py``), over a SQLite file and a PostgreSQL schema of the test's own:

1. A worker is killed with SIGKILL while the agent's second model call is in flight (after a
   tool call); another worker recovers the run once its lease expires and finishes it. Every
   recorded model step was answered once, only the interrupted call was made again, and each
   tool's side effect happened once; the ledger has one row per answered call, with its tokens.
2. A tool that needs approval pauses the run; ``shoal approve`` answers it from another process
   (the CLI), and the worker finishes the run: the tool ran once, after the approval.
3. The example, ``examples/openai_agent/support_agent.py`` with its offline model, served by
   ``shoal worker`` and driven by the CLI as its README says.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("agents")

import agent_app
import backends
from backends import Backend
from harness import Processes, read_log, wait_until

HERE = Path(__file__).resolve().parent
AGENT_APP = HERE / "agent_app.py"
SHOAL = Path(sys.executable).parent / "shoal"
EXAMPLE = HERE.parent.parent / "examples" / "openai_agent"

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    with backends.backend(request.param, tmp_path / "agents.db", "AGENT", "shoal_ag_") as b:
        yield b


@pytest.fixture
def procs(tmp_path: Path, backend: Backend) -> Iterator[Processes]:
    p = Processes(tmp_path, AGENT_APP, "AGENT", {
        **backend.env, "AGENT_LOG": str(tmp_path / "log.jsonl"), "AGENT_MAX_LIFE": "120"})
    try:
        yield p
    finally:
        p.cleanup()


def events(log: Path, ev: str) -> list[dict[str, object]]:
    return [r for r in read_log(log) if r.get("ev") == ev]


async def test_a_worker_killed_mid_agent_leaves_the_run_to_another_that_repeats_nothing(
    tmp_path: Path, backend: Backend, procs: Processes
) -> None:
    log = tmp_path / "log.jsonl"
    store = backend.env["AGENT_STORE"]
    client = agent_app.make_app(store, instance_id="test")
    async with client.open():
        procs.spawn(["worker"], "worker-a", AGENT_INSTANCE="a", AGENT_HANG_AT="2")
        run = await client.dispatch("support", {"question": "Is A1 paid?", "mode": "crash"})

        async def hanging() -> bool:
            return bool(events(log, "hang"))

        try:
            await wait_until(hanging, 30, "worker a to reach the second model call")
            [a] = [p for p in procs.every if p.poll() is None]
            procs.live["a"] = a
            procs.kill("a")                                  # SIGKILL, mid model call
            procs.spawn(["worker"], "worker-b", AGENT_INSTANCE="b")
            out = await client.result(run.id, timeout=60)
        except BaseException:
            print(procs.stderr_tail())
            raise
        assert out == "done: noted"
        finished = await client.get_run(run.id)
        steps = [s.name for s in await client.store.load_steps(run.id)]
        ledger = await client.ledger(run_id=run.id)

    assert steps == ["agent.model:support:1", "agent.tool:lookup", "agent.model:support:2",
                     "agent.tool:note", "agent.model:support:3"]
    asked = [(r["instance"], r["turn"]) for r in events(log, "model")]
    answered = [(r["instance"], r["turn"]) for r in events(log, "answered")]
    # worker a made calls 1 and 2 (killed in 2); b made 2 again and 3; call 1 was replayed
    assert asked == [("a", 1), ("a", 2), ("b", 2), ("b", 3)]
    assert answered == [("a", 1), ("b", 2), ("b", 3)]
    assert Counter(turn for _, turn in answered) == {1: 1, 2: 1, 3: 1}   # one per model step
    tools = [(r["instance"], r["name"]) for r in events(log, "tool")]
    assert tools == [("a", "lookup"), ("b", "note")]                     # each effect once
    assert finished.attempts == 2 and finished.status == "succeeded"
    tokens = sum(agent_app.TOKENS)
    assert [(r.provider, r.tokens) for r in ledger] == [("openai", tokens)] * 3


async def test_a_tool_approval_answered_from_the_cli_in_another_process(
    tmp_path: Path, backend: Backend, procs: Processes
) -> None:
    log = tmp_path / "log.jsonl"
    store = backend.env["AGENT_STORE"]
    client = agent_app.make_app(store, instance_id="test")
    async with client.open():
        procs.spawn(["worker"], "worker-a", AGENT_INSTANCE="a")
        run = await client.dispatch("support", {"question": "Refund A1", "mode": "approval"})

        async def asked() -> bool:
            return bool(await client.pending_pauses())

        try:
            await wait_until(asked, 30, "the refund to ask for approval")
            [pause] = await client.pending_pauses()
            assert pause.run_id == run.id and pause.name == "agent.tool:refund"
            assert pause.request["arguments"] == {"order": "A1", "amount": 40}
            assert events(log, "tool") and not [r for r in events(log, "tool")
                                                 if r["name"] == "refund"]
            answer = await asyncio.to_thread(subprocess.run, [
                str(SHOAL), "--store", store, "-n", agent_app.NAMESPACE, "approve", pause.id,
                "--by", "ana", "--json"], capture_output=True, text=True, timeout=60)
            assert answer.returncode == 0, answer.stderr
            assert json.loads(answer.stdout)["decision"]["by"] == "ana"
            out = await client.result(run.id, timeout=60)
        except BaseException:
            print(procs.stderr_tail())
            raise
    assert out == "done: refunded 40"
    assert [r["name"] for r in events(log, "tool")] == ["lookup", "refund"]
    assert Counter(r["turn"] for r in events(log, "answered")) == {1: 1, 2: 1, 3: 1}


async def shoal_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(subprocess.run, [str(SHOAL), *args], capture_output=True,
                                   text=True, timeout=60, env=env)


async def test_the_example_serves_with_shoal_worker_and_is_answered_from_the_cli(
    tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path / 'support.db'}"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SHOAL_", "OPENAI_"))}
    env.update(SHOAL_STORE=store, SUPPORT_FAKE_MODEL="1", PYTHONPATH=str(EXAMPLE))
    procs = Processes(tmp_path, SHOAL, "SUPPORT", {**env, "SUPPORT_MAX_LIFE": "120"})
    try:
        procs.spawn(["worker", "support_agent:app"], "worker")

        async def dispatched() -> str | None:    # once the worker registered the workflow
            got = await shoal_cli(env, "dispatch", "ticket", '"Please refund order A1"')
            return got.stdout.strip() if got.returncode == 0 else None

        async def paused() -> list[dict[str, object]]:
            got = await shoal_cli(env, "-n", "support", "pauses", "--json")
            return [json.loads(line) for line in got.stdout.splitlines()]

        async def shown() -> dict[str, object] | None:
            got = await shoal_cli(env, "run", "show", run_id, "--json")
            run = json.loads(got.stdout)
            return run if run["status"] == "succeeded" else None

        try:
            run_id = await wait_until(dispatched, 30, "the worker to register", step=0.2)
            [pause] = await wait_until(paused, 30, "the refund to ask", step=0.2)
            assert pause["name"] == "agent.tool:refund" and pause["run_id"] == run_id
            approved = await shoal_cli(env, "approve", str(pause["id"]), "--by", "you")
            assert approved.returncode == 0, approved.stderr
            run = await wait_until(shown, 30, "the run to finish", step=0.2)
        except BaseException:
            print(procs.stderr_tail())
            raise
        assert run["output"] == "Done: refunded 40 usd on order A1."
        assert [s["name"] for s in run["steps"]] == [  # type: ignore[union-attr]
            "agent.model:support:1", "agent.tool:lookup_order", "agent.model:support:2",
            "shoal.approval:agent.tool:refund", "agent.tool:refund", "agent.model:support:3"]
        ledger = await shoal_cli(env, "-n", "support", "ledger", "--json")
        rows = [json.loads(line) for line in ledger.stdout.splitlines()]
        assert [(r["provider"], r["tokens"]) for r in rows] == [("openai", 220)] * 3
    finally:
        procs.cleanup()
