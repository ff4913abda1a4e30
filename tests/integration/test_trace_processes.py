"""Traces across real processes: a run dispatched under a span by this test's process is started by
worker process a, which is killed with SIGKILL mid-step; worker process b recovers it after the
lease. The trace context stored with the run survives the crash, and b's attempt continues the
dispatch trace: its span has the dispatching span as parent and tells the recovery (attempt 2,
epoch 2, ``recovered``). Each worker exports its spans through the OpenTelemetry SDK into the
shared log (``trace_app.py``)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trace_app
from harness import Processes, read_log, wait_until
from opentelemetry.sdk.trace import TracerProvider

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
