"""Traces across real processes.

- A run dispatched under a span by this test's process is started by worker process a, which is
  killed with SIGKILL mid-step; worker process b recovers it after the lease. The trace context
  stored with the run survives the crash, and b's attempt continues the dispatch trace: its span
  has the dispatching span as parent and tells the recovery (attempt 2, epoch 2, ``recovered``).
  Each worker exports its spans through the OpenTelemetry SDK into the shared log
  (``trace_app.py``).
- ``shoal worker --tracing`` traces an app built without tracing through the global tracer
  provider its module set up (as ``opentelemetry-instrument`` would).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trace_app
from harness import Processes, read_log, wait_until
from opentelemetry.sdk.trace import TracerProvider

import shoal

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_a_recovered_run_continues_its_trace_after_kill_9(tmp_path: Path) -> None:
    db, log = tmp_path / "traced.db", tmp_path / "log.jsonl"
    procs = Processes(tmp_path, HERE / "trace_app.py", "TRACE",
                      {"TRACE_DB": str(db), "TRACE_LOG": str(log), "TRACE_MAX_LIFE": "80"})
    provider = TracerProvider()   # the dispatching side's (exports nowhere: only its ids count)
    try:
        procs.start_worker("a")
        await procs.wait_started(log)
        front = trace_app.make_app(str(db), "front", tracing=provider)
        async with front.open():
            with provider.get_tracer("test").start_as_current_span("request") as request:
                run = await front.dispatch("traced")
            ctx = request.get_span_context()
            trace_id, span_id = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"

            async def blocked() -> bool:
                return any(r["kind"] == "blocked" for r in read_log(log))
            await wait_until(blocked, 20, "worker a to reach step two")
            procs.kill("a")
            with sqlite3.connect(db) as conn:
                [(stored,)] = conn.execute("SELECT trace_context FROM runs WHERE id = ?",
                                           (run.id,)).fetchall()
            conn.close()
            assert json.loads(stored)["traceparent"].split("-")[1:3] == [trace_id, span_id]

            procs.start_worker("b")

            async def succeeded() -> bool:
                return (await front.get_run(run.id)).status == "succeeded"
            await wait_until(succeeded, 30, "worker b to finish the run")
        assert procs.stop_workers() == {"b": 0}
        spans = [r for r in read_log(log) if r["kind"] == "span"]
        a, b = procs.every[0].pid, procs.every[1].pid
        by = {(s["pid"], s["name"]): s for s in spans}
        # a exported the step that ended before it died, never its attempt
        one = by[(a, "shoal.step one")]
        assert one["trace"] == trace_id and (a, "shoal.run traced") not in by
        attempt = by[(b, "shoal.run traced")]
        attributes: dict[str, Any] = attempt["attributes"]
        assert (attempt["trace"], attempt["parent"], attempt["status"]) == (
            trace_id, span_id, "UNSET")
        assert (attributes["shoal.run_id"], attributes["shoal.attempt"],
                attributes["shoal.lease_epoch"], attributes["shoal.resume_reason"],
                attributes["shoal.outcome"], attributes["shoal.instance"]) == (
            run.id, 2, 2, "recovered", "succeeded", procs.instances["b"])
        # b runs step two again (one replays), under its attempt
        two = by[(b, "shoal.step two")]
        assert (two["trace"], two["parent"]) == (trace_id, attempt["span"])
        assert (b, "shoal.step one") not in by
    finally:
        procs.cleanup()
        provider.shutdown()


WORKER_MODULE = """
import json, os
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
import shoal

class Lines(SpanExporter):
    def export(self, spans):
        with open(os.environ["SPANS"], "a") as f:
            for s in spans:
                f.write(json.dumps({"name": s.name, "trace": s.context.trace_id,
                                    "span": s.context.span_id,
                                    "parent": s.parent and s.parent.span_id}) + "\\n")
        return SpanExportResult.SUCCESS

provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(Lines()))
trace.set_tracer_provider(provider)   # what opentelemetry-instrument's set-up does

app = shoal.App("cli", store=os.environ["SHOAL_STORE"], lease=3.0)   # no tracing=

@app.workflow
async def hello(ctx, input):
    return await ctx.step("greet", lambda: "hi")
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_worker_tracing_flag_traces_through_the_global_provider(tmp_path: Path) -> None:
    (tmp_path / "greeter.py").write_text(WORKER_MODULE)
    url, spans = f"sqlite:///{tmp_path / 'g.db'}", tmp_path / "spans.jsonl"
    env = {**os.environ, "SHOAL_STORE": url, "SPANS": str(spans)}
    worker = subprocess.Popen([sys.executable, "-m", "shoal.cli", "worker", "--tracing",
                               "greeter:app"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    provider = TracerProvider()
    try:
        async def dispatch() -> tuple[int, int]:
            client = shoal.App("cli", store=url, tracing=provider)
            async with client.open():
                for _ in range(200):   # the workflow is known once the worker has started
                    try:
                        with provider.get_tracer("t").start_as_current_span("request") as r:
                            run = await client.dispatch("hello")
                        break
                    except shoal.UnknownWorkflowError:
                        await asyncio.sleep(0.05)
                else:
                    raise AssertionError("the worker never registered its workflow")
                assert await client.result(run.id, timeout=30) == "hi"
            return r.get_span_context().trace_id, r.get_span_context().span_id

        trace_id, span_id = asyncio.run(dispatch())
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=15)
        assert worker.returncode == 0, out.decode()
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
        provider.shutdown()
    got = {s["name"]: s for s in map(json.loads, spans.read_text().splitlines())}
    attempt = got["shoal.run hello"]
    assert (attempt["trace"], attempt["parent"]) == (trace_id, span_id)
    assert got["shoal.step greet"]["parent"] == attempt["span"]
