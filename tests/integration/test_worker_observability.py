"""A real ``shoal worker`` process with ``--health-port`` and ``--log-format json``: the probes
of docs/health.md answered over HTTP (200 while serving, 503 while it stops), and its stderr
one JSON object per line with the fields of docs/health.md."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import shoal

CLI = [sys.executable, "-m", "shoal.cli"]

APP = """\
import asyncio
import logging

import shoal

app = shoal.App.from_env("obs", lease=3.0)
log = logging.getLogger("obs.app")


@app.workflow(max_attempts=1)
async def greet(ctx, name):
    log.info("greeting %s", name, extra={"event": "greet.start"})
    if name == "boom":
        try:
            raise ValueError("no such name")
        except ValueError:
            log.exception("greet failed")
            raise
    return await ctx.step("greet", lambda: f"hello {name}")


@app.workflow(max_attempts=1)
async def hold(ctx, seconds):
    async def wait():
        await asyncio.sleep(seconds)

    await ctx.step("wait", wait)
"""



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, Any]:
    """GET with urllib: the status and the JSON body (status 0: nothing listens yet)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except (urllib.error.URLError, ConnectionError):
        return 0, None


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def start_worker(tmp_path: Path, processes: list[subprocess.Popen[bytes]], *args: str,
                 **env: str) -> tuple[subprocess.Popen[bytes], Path, str]:
    """``shoal worker obsapp:app *args`` over a SQLite file in ``tmp_path``; its stderr goes
    to a file. Returns the process, that file and the store URL."""
    (tmp_path / "obsapp.py").write_text(APP)
    url = f"sqlite:///{tmp_path / 'obs.db'}"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    environment.update(SHOAL_STORE=url, SHOAL_INSTANCE_ID="obs-1", **env)
    stderr = tmp_path / f"worker-{len(processes)}.stderr"
    with stderr.open("wb") as err:
        worker = subprocess.Popen([*CLI, "worker", *args, "obsapp:app"], cwd=tmp_path,
                                  env=environment, stdout=subprocess.DEVNULL, stderr=err,
                                  start_new_session=True)
    processes.append(worker)
    return worker, stderr, url


def stop(worker: subprocess.Popen[bytes]) -> None:
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


async def _run(url: str, workflow: str, input: Any, wait: bool = True) -> shoal.Run:
    client = shoal.App("obs", store=url)
    async with client.open():
        run = await client.dispatch(workflow, input)
        if wait:
            with contextlib.suppress(shoal.RunFailedError):
                await client.result(run.id, timeout=20)
        return await client.get_run(run.id)


def run(url: str, workflow: str, input: Any, wait: bool = True) -> shoal.Run:
    return asyncio.run(_run(url, workflow, input, wait))


@pytest.mark.slow
def test_worker_serves_probes_and_writes_json_logs(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    worker, stderr, url = start_worker(
        tmp_path, processes, "--log-format", "json", "--health-port", str(port),
        "--health-host", "127.0.0.1", "--shutdown-timeout", "5")
    base = f"http://127.0.0.1:{port}"
    # the Kubernetes probes of docs/health.md: livez and readyz on the health port
    assert wait_for(lambda: get(base + "/livez")[0] == 200 and get(base + "/livez"),
                    "the worker's liveness") == (
        200, {"status": "healthy", "reason": "ok", "checks": {}})
    assert get(base + "/readyz") == (
        200, {"status": "healthy", "reason": "ok", "checks": {"liveness": "ok", "store": "ok"}})
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(base + "/metricz", timeout=5)
    assert missing.value.code == 404

    ok = run(url, "greet", "shoal")
    failed = run(url, "greet", "boom")
    assert (ok.status, ok.output, failed.status) == ("succeeded", "hello shoal", "failed")

    # a stop drains a held run: meanwhile the probes say "stopping" with 503
    held = run(url, "hold", 60, wait=False)
    wait_for(lambda: asyncio.run(_status(url, held.id)) == "running", "the held run to start")
    worker.send_signal(signal.SIGTERM)
    assert wait_for(lambda: get(base + "/livez")[0] == 503 and get(base + "/livez"),
                    "liveness to turn unhealthy") == (
        503, {"status": "unhealthy", "reason": "stopping", "checks": {}})
    assert get(base + "/readyz") == (
        503, {"status": "unhealthy", "reason": "stopping", "checks": {"liveness": "stopping"}})
    assert worker.wait(timeout=30) == 0
    assert get(base + "/livez") == (0, None)              # the port is closed at exit

    text = stderr.read_text()
    lines = [json.loads(line) for line in text.splitlines()]    # every line is JSON
    for line in lines:
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", line["time"]), line
        assert line["level"] in ("debug", "info", "warning", "error") and "message" in line
        assert None not in line.values()
    events = [line.get("event") for line in lines]
    for event in ("worker.serving", "health.serving", "app.started", "app.stopping",
                  "run.failed", "run.interrupted"):
        assert event in events, (event, events)

    def one(**fields: Any) -> dict[str, Any]:
        found = [line for line in lines if fields.items() <= line.items()]
        assert len(found) == 1, (fields, found)
        return found[0]

    for event in ("worker.serving", "health.serving", "app.started", "app.stopping"):
        assert one(event=event)["instance"] == "obs-1"
    assert one(event="health.serving")["port"] == port
    # the application's own records inside a run carry the run's fields
    greeting = one(event="greet.start", message="greeting shoal")
    assert greeting["logger"] == "obs.app" and greeting["level"] == "info"
    assert (greeting["run_id"], greeting["workflow"], greeting["tenant"],
            greeting["instance"]) == (ok.id, "greet", "default", "obs-1")
    error = one(message="greet failed")
    assert (error["level"], error["run_id"], error["workflow"]) == ("error", failed.id, "greet")
    assert error["error"].startswith("Traceback") and "ValueError: no such name" in error["error"]
    assert one(event="run.failed")["run_id"] == failed.id
    assert "ValueError: no such name" in one(event="run.failed")["error"]   # the traceback
    # INFO lines as each run starts and ends, with its status and duration
    assert one(event="run.started", run_id=ok.id)["workflow"] == "greet"
    ended = one(event="run.ended", run_id=ok.id)
    assert ended["status"] == "succeeded" and ended["duration"] >= 0
    assert one(event="run.ended", run_id=failed.id)["status"] == "failed"
    assert one(event="run.interrupted").get("instance") == "obs-1"


async def _status(url: str, run_id: str) -> str:
    client = shoal.App("obs", store=url)
    async with client.open():
        return str((await client.get_run(run_id)).status)


@pytest.mark.slow
def test_the_log_format_from_the_environment_and_the_flag_winning(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    worker, stderr, _ = start_worker(tmp_path, processes, SHOAL_LOG_FORMAT="json")
    wait_for(lambda: '"event":"app.started"' in stderr.read_text(), "a JSON app.started")
    stop(worker)
    assert all(json.loads(line) for line in stderr.read_text().splitlines())

    worker, stderr, _ = start_worker(tmp_path, processes, "--log-format", "text",
                                     SHOAL_LOG_FORMAT="json")
    wait_for(lambda: "app.started" in stderr.read_text(), "a text app.started")
    stop(worker)
    lines = stderr.read_text().splitlines()
    serving = [i for i, line in enumerate(lines)
               if line.startswith("shoal worker: serving <shoal.App 'obs' instance='obs-1'")]
    started = [i for i, line in enumerate(lines) if "app.started" in line]
    assert serving and started and started[0] < serving[0], lines   # said once it has started
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO    shoal: app\.started: ",
                     stderr.read_text(), re.M), lines
    assert not any(line.startswith("{") for line in lines)


def test_worker_refuses_a_bad_log_format_or_health_port(tmp_path: Path) -> None:
    def fails(*args: str, **env: str) -> str:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
        done = subprocess.run([*CLI, "worker", *args], cwd=tmp_path,
                              env={**environment, **env}, capture_output=True, timeout=60)
        assert done.returncode != 0
        err = done.stderr.decode()
        assert "Traceback" not in err, err
        return err

    err = fails("json:loads", SHOAL_LOG_FORMAT="yaml")
    assert "The log format (SHOAL_LOG_FORMAT) is 'text' or 'json', not 'yaml'" in err, err
    assert "'xml' is not one of 'text', 'json'" in fails("--log-format", "xml", "json:loads")
    assert "65536 is not in the range 0<=x<=65535" in fails("--health-port", "65536",
                                                             "json:loads")

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        (tmp_path / "portapp.py").write_text(
            "import shoal\napp = shoal.App('p', store='memory://')\n")
        err = fails("--health-port", str(port), "--health-host", "127.0.0.1", "portapp:app")
    finally:
        taken.close()
    assert f"cannot listen on 127.0.0.1:{port}" in err, err
