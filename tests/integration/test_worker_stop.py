"""``shoal worker`` stopped (SIGINT) while a plain-function step runs in its thread, in real
processes over one SQLite file: the process exits on time (``--shutdown-timeout`` plus the
thread's short grace, never the thread's own length), a step whose thread returns within the
grace is checkpointed (the next worker replays it instead of running it again), and one that
outlives it leaves its run to its lease, named by its step's name in ``step.thread_running``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import shoal

CLI = [sys.executable, "-m", "shoal.cli"]

APP = '''
import os, time
import shoal

app = shoal.App.from_env("stops", lease=30.0)

def note(line):
    with open(os.environ["STEPS_LOG"], "a") as f:
        f.write(line + "\\n")

@app.workflow
async def job(ctx, input):
    def block():
        note("block started")
        began = time.monotonic()
        while time.monotonic() - began < input["seconds"]:
            if input["cooperative"] and ctx.signal.aborted:   # the stop: return what we have
                note("block returned")
                return "partial"
            time.sleep(0.02)
        note("block returned")
        return "complete"

    result = await ctx.step("block", block)
    return await ctx.step("after", lambda: f"{result} then after")
'''



def _worker(tmp_path: Path, name: str, started: list[subprocess.Popen[bytes]]
            ) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SHOAL_STORE": f"sqlite:///{tmp_path / 'w.db'}",
           "SHOAL_INSTANCE_ID": name, "STEPS_LOG": str(tmp_path / "steps.log")}
    env.pop("SHOAL_NAMESPACE", None)
    worker = subprocess.Popen([*CLI, "worker", "stops_app:app", "--shutdown-timeout", "2"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    started.append(worker)
    return worker


def _steps(tmp_path: Path) -> list[str]:
    log = tmp_path / "steps.log"
    return log.read_text().splitlines() if log.exists() else []


def _dispatch_and_wait_for_the_step(tmp_path: Path, input: dict[str, object]) -> str:
    async def go() -> str:
        client = shoal.App("stops", store=f"sqlite:///{tmp_path / 'w.db'}")
        async with client.open():
            for _ in range(400):
                try:
                    run = await client.dispatch("job", input)
                    break
                except (shoal.UnknownWorkflowError, shoal.StoreUnavailableError):
                    await asyncio.sleep(0.05)
            else:
                raise AssertionError("the worker never registered 'job'")
        return run.id

    run_id = asyncio.run(go())
    for _ in range(400):
        if _steps(tmp_path):
            return run_id
        time.sleep(0.025)
    raise AssertionError("the step never started")


def _stop_during_the_step(tmp_path: Path, processes: list[subprocess.Popen[bytes]],
                          seconds: float, cooperative: bool) -> tuple[str, float, str]:
    """Start worker w-1, dispatch a run whose step 'block' lasts ``seconds``, SIGINT the worker
    once the step runs: the run's id, how long the worker took to exit (cleanly), its output."""
    (tmp_path / "stops_app.py").write_text(APP)
    worker = _worker(tmp_path, "w-1", processes)
    run_id = _dispatch_and_wait_for_the_step(tmp_path, {"seconds": seconds,
                                                        "cooperative": cooperative})
    began = time.monotonic()
    worker.send_signal(signal.SIGINT)
    out, _ = worker.communicate(timeout=60)
    took = time.monotonic() - began
    assert worker.returncode == 0, out.decode()
    return run_id, took, out.decode()


def _run(tmp_path: Path, run_id: str) -> shoal.Run:
    async def get() -> shoal.Run:
        client = shoal.App("stops", store=f"sqlite:///{tmp_path / 'w.db'}")
        async with client.open():
            return await client.get_run(run_id)
    return asyncio.run(get())


def test_a_step_thread_that_returns_at_the_stop_is_checkpointed_and_not_run_again(
        tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    run_id, took, out = _stop_during_the_step(tmp_path, processes, seconds=60,
                                              cooperative=True)
    assert took < 2 + 5, out                       # the drain, then the thread returned at once
    left = _run(tmp_path, run_id)
    assert left.status == shoal.RunStatus.INTERRUPTED and left.owner is None, out
    assert _steps(tmp_path) == ["block started", "block returned"]

    second = _worker(tmp_path, "w-2", processes)
    async def result() -> object:
        client = shoal.App("stops", store=f"sqlite:///{tmp_path / 'w.db'}")
        async with client.open():
            return await client.result(run_id, timeout=30)
    assert asyncio.run(result()) == "partial then after"   # the checkpointed result, replayed
    assert _steps(tmp_path) == ["block started", "block returned"]   # the step ran once
    assert _run(tmp_path, run_id).attempts == 1              # a stop costs no attempt
    second.send_signal(signal.SIGTERM)
    second.communicate(timeout=30)


def test_a_step_thread_that_outlives_the_stop_does_not_hold_the_process(
        tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    run_id, took, out = _stop_during_the_step(tmp_path, processes, seconds=45,
                                              cooperative=False)
    # the 2 s drain and the thread's grace of 1 s, not the 45 s the thread still needs
    assert took < 2 + 1 + 5, (took, out)
    assert "step.thread_running" in out and "step 'block' of run" in out, out
    left = _run(tmp_path, run_id)                  # not released: left to its lease
    assert left.status == shoal.RunStatus.RUNNING and left.owner == "w-1", out
    assert _steps(tmp_path) == ["block started"]   # the thread died with its process
