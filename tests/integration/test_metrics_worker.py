"""``shoal worker --metrics-port``: a real worker process over a SQLite file serves Prometheus
metrics over HTTP; scraped after it ran workflows, they count its runs, steps and store calls
and, once it is the store's sampler, the store's gauges. An app without metrics gets them from
the flag; a port that cannot be bound is a clear error."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import shoal

CLI = [sys.executable, "-m", "shoal.cli"]

APP = '''
import os
import shoal
from shoal.telemetry.metrics import PrometheusMetrics

STORE = os.environ["SHOAL_STORE"]

# stats every second and a quick membership, so the store's gauges come within seconds
measured = shoal.App("shop", store=STORE, instance_id="w-1", lease=3.0,
                     membership_interval=0.5,
                     metrics=PrometheusMetrics(stats_interval=1.0))
plain = shoal.App("shop", store=STORE, instance_id="w-2", lease=3.0)

for app in (measured, plain):
    @app.workflow(name="pack")
    async def pack(ctx, n):
        box = await ctx.step("pick", lambda: n * 2)
        return await ctx.step("seal", lambda: box + 1)

    @app.workflow(name="refund")
    async def refund(ctx, n):
        return (await ctx.approval("refund", {"n": n})).approved
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



def start_worker(tmp: Path, spec: str, port: int,
                 processes: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SHOAL_STORE": f"sqlite:///{tmp / 'shop.db'}"}
    worker = subprocess.Popen([*CLI, "worker", spec, "--metrics-port", str(port),
                               "--metrics-host", "127.0.0.1"], cwd=tmp, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    processes.append(worker)
    return worker


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The metrics served on ``port``: sample name -> labels -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        text = response.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def scrape_until(port: int, check: Any, worker: subprocess.Popen[bytes],
                 limit: float = 30.0) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    deadline = time.monotonic() + limit
    last: Any = None
    while time.monotonic() < deadline:
        assert worker.poll() is None, worker.communicate()[0].decode()
        try:
            last = scrape(port)
            if check(last):
                return dict(last)
        except (urllib.error.URLError, ConnectionError):
            pass   # not listening yet
        time.sleep(0.1)
    raise AssertionError(f"the scrape never showed it; last: {last}")


def one(samples: dict[str, Any], name: str, **labels: str) -> float | None:
    return samples.get(name, {}).get(tuple(sorted(labels.items())))


async def dispatch(url: str) -> None:
    client = shoal.App("shop", store=url, instance_id="client")
    async with client.open():
        for _ in range(200):   # the workflow's name is known once the worker has started
            try:
                runs = [await client.dispatch("pack", n) for n in range(5)]
                break
            except (shoal.UnknownWorkflowError, shoal.StoreUnavailableError):
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("the worker never registered its workflows")
        await client.dispatch("refund", 1, tenant="acme")
        for run in runs:
            assert await client.result(run.id, timeout=15) == run.input * 2 + 1


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_serves_its_metrics_over_http(
        tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    (tmp_path / "shopapp.py").write_text(APP)
    port = free_port()
    worker = start_worker(tmp_path, "shopapp:measured", port, processes)
    asyncio.run(dispatch(f"sqlite:///{tmp_path / 'shop.db'}"))
    got = scrape_until(port, lambda s: one(s, "shoal_pending_approvals") == 1, worker)
    assert one(got, "shoal_runs_finished_total", workflow="pack", status="succeeded") == 5
    assert one(got, "shoal_runs_claimed_total", workflow="pack") == 5
    assert one(got, "shoal_attempts_total", workflow="refund", outcome="waiting") == 1
    assert one(got, "shoal_runs_parked_total", workflow="refund", kind="approval") == 1
    assert one(got, "shoal_step_duration_seconds_count", workflow="pack") == 10
    assert one(got, "shoal_run_start_latency_seconds_count", workflow="pack") == 5
    assert (one(got, "shoal_store_call_duration_seconds_count", operation="checkpoint_step")
            or 0) >= 10
    assert one(got, "shoal_run_slots") == 4
    assert one(got, "shoal_stats_sampler") == 1
    assert one(got, "shoal_runs", workflow="pack", status="succeeded") == 5
    assert one(got, "shoal_runs", workflow="refund", status="waiting") == 1
    worker.send_signal(signal.SIGTERM)
    out, _ = worker.communicate(timeout=20)
    assert worker.returncode == 0, out.decode()
    assert f"metrics on http://127.0.0.1:{port}/metrics".encode() in out


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_flag_turns_metrics_on_and_a_taken_port_is_a_clear_error(
        tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    (tmp_path / "shopapp.py").write_text(APP)
    port = free_port()
    worker = start_worker(tmp_path, "shopapp:plain", port, processes)
    got = scrape_until(port, lambda s: one(s, "shoal_run_slots") == 4, worker)
    assert "shoal_runs_executing" in got
    # the same port again: taken
    second = start_worker(tmp_path, "shopapp:plain", port, processes)
    out, _ = second.communicate(timeout=30)
    assert second.returncode == 1
    assert f"--metrics-port: cannot listen on 127.0.0.1:{port}".encode() in out
    assert b"Traceback" not in out
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=20)
    assert worker.returncode == 0
