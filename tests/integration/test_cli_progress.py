"""A run's progress on the command line: ``shoal run show`` (and ``--json``) prints it, ``shoal run
show --follow`` redraws the run until it ends and exits with its status (0 succeeded, 1 failed or
cancelled; with ``--json``, one line per change), ``shoal runs --watch`` redraws the newest runs
until Ctrl-C. Over a real SQLite file, with a real ``shoal worker`` process executing the runs;
the views run as processes of their own (their output piped: rich draws the last frame)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from shoal.cli import cli

CLI = [sys.executable, "-m", "shoal.cli"]

DESK = '''
import shoal
app = shoal.App.from_env("desk", lease=3.0)

@app.workflow(max_attempts=1)
async def index(ctx, n):
    ctx.progress(0.0, "starting", n=n)
    half = await ctx.step("first half", lambda: n // 2)
    ctx.progress(0.5, "half way", done=half)
    go = await ctx.wait_for("go")          # parked: its progress is written before
    await ctx.step("second half", lambda: n - half)
    ctx.progress(1.0, "all done", done=n)
    if go == "fail":
        raise RuntimeError("told to fail")
    return {"indexed": n}
'''


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, timeout=60)


def view(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    """A view that runs until it ends by itself or is interrupted."""
    return subprocess.Popen([*CLI, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def ended(process: subprocess.Popen[bytes]) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"the view did not end: {out.decode()} {err.decode()}") from None
    return process.returncode, out.decode(), err.decode()


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A ``shoal worker`` serving DESK over a SQLite file (the environment to reach it);
    stopped at the end of the test."""
    (tmp_path / "desk.py").write_text(DESK)
    env = {**os.environ, "SHOAL_STORE": f"sqlite:///{tmp_path / 'desk.db'}",
           "SHOAL_INSTANCE_ID": "w-1", "COLUMNS": "200"}
    env.pop("SHOAL_NAMESPACE", None)
    process = subprocess.Popen([*CLI, "worker", "desk:app"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while b"w-1" not in run(env, "workflows").stdout:
            assert process.poll() is None, process.communicate()[0].decode()
            assert time.monotonic() < deadline, "the worker never registered its workflows"
            time.sleep(0.1)
        yield env
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def waiting(env: dict[str, str], n: int) -> dict[str, Any]:
    """A run of ``index`` dispatched and parked in its wait, as ``run show --json`` gives it."""
    dispatched = run(env, "dispatch", "index", str(n))
    assert dispatched.returncode == 0, dispatched.stderr.decode()
    run_id = dispatched.stdout.decode().strip()
    deadline = time.monotonic() + 30
    while (shown := json.loads(run(env, "run", "show", run_id, "--json").stdout))[
            "status"] != "waiting":
        assert time.monotonic() < deadline, shown
        time.sleep(0.1)
    return shown


def test_run_show_prints_the_progress(worker: dict[str, str]) -> None:
    shown = waiting(worker, 10)
    progress = shown["progress"]
    assert (progress["fraction"], progress["message"], progress["data"]) == (
        0.5, "half way", {"done": 5})
    assert shown["started_at"] <= progress["at"] <= time.time()
    table = run(worker, "run", "show", shown["id"]).stdout.decode()
    line = next(text for text in table.splitlines() if "progress" in text)
    assert "50%" in line and "half way" in line and '{"done": 5}' in line
    assert "█" * 15 in line and "░" * 15 in line
    listed = run(worker, "runs").stdout.decode()
    assert "progress" in listed and "50% half way" in listed


def test_follow_ends_with_the_run_and_exits_with_its_status(worker: dict[str, str]) -> None:
    ok, bad = waiting(worker, 10), waiting(worker, 4)
    follow_ok = view(worker, "run", "show", ok["id"], "--follow", "--interval", "0.2")
    follow_bad = view(worker, "run", "show", bad["id"], "-f", "--interval", "0.2")
    time.sleep(1.0)
    assert follow_ok.poll() is None and follow_bad.poll() is None   # the runs wait: so do they
    assert run(worker, "signal", ok["id"], "go", '"ok"').returncode == 0
    assert run(worker, "signal", bad["id"], "go", '"fail"').returncode == 0

    code, out, err = ended(follow_ok)
    assert code == 0, err
    assert "succeeded" in out and "100% all done" in out and '{"done": 10}' in out
    assert "second half" in out and "Ctrl-C" not in out and err == ""
    code, out, err = ended(follow_bad)
    assert code == 1
    assert "failed" in out and "100% all done" in out
    assert err.strip() == f"Error: Run {bad['id']} failed: RuntimeError: told to fail"


def test_follow_json_prints_a_line_each_time_the_run_changes(worker: dict[str, str]) -> None:
    shown = waiting(worker, 6)
    follow = view(worker, "run", "show", shown["id"], "-f", "--json", "--interval", "0.1")
    time.sleep(0.5)
    assert run(worker, "signal", shown["id"], "go", '"ok"').returncode == 0
    code, out, err = ended(follow)
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0]["status"] == "waiting" and lines[0]["progress"]["message"] == "half way"
    assert lines[-1]["status"] == "succeeded"
    assert lines[-1]["progress"]["message"] == "all done"
    assert [s["name"] for s in lines[-1]["steps"]] == ["first half", "shoal.wait_for:go",
                                                       "second half"]
    assert all(a != b for a, b in itertools.pairwise(lines))   # changes only


def test_runs_watch_redraws_until_ctrl_c(worker: dict[str, str]) -> None:
    shown = waiting(worker, 8)
    watch = view(worker, "-n", "desk", "runs", "--watch", "--interval", "0.2",
                 "--status", "waiting")
    time.sleep(1.5)
    assert watch.poll() is None
    watch.send_signal(signal.SIGINT)
    code, out, err = ended(watch)
    assert code == 0, err
    assert "newest runs of namespace 'desk'" in out
    assert shown["id"] in out and "50% half way" in out and "waiting" in out


# -- without a worker --------------------------------------------------------------------------


def shoal_cli(*args: str) -> Result:
    env: dict[str, str | None] = {"SHOAL_STORE": None, "SHOAL_NAMESPACE": None}
    return CliRunner().invoke(cli, list(args), env=env, prog_name="shoal")


def test_the_live_options_refuse_what_does_not_go_together(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'none.db'}"
    for args, fragment in [
        (("run", "show", "r1", "--interval", "1"), "--interval goes with --follow"),
        (("runs", "--interval", "1"), "--interval goes with --watch"),
        (("runs", "--watch", "--json"), "--watch draws a table"),
        (("runs", "--watch", "--interval", "0"), "Invalid value for '--interval'"),
        (("run", "show", "r1", "-f", "--interval", "-1"), "Invalid value for '--interval'"),
    ]:
        got = shoal_cli("--store", url, *args)
        assert got.exit_code == 2, (args, got.output)
        assert fragment in got.output, (args, got.output)
    unknown = shoal_cli("--store", "memory://", "run", "show", "nope", "--follow")
    assert unknown.exit_code == 1 and "nope" in unknown.output
