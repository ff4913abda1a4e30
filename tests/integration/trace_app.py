"""The worker side of ``test_trace_processes.py``: a shoal App over a SQLite file, traced by an
OpenTelemetry SDK whose exporter appends each finished span as a JSON line to the shared log
(``harness.LineLog``), beside shoal's events and the steps' own records.

``python trace_app.py worker``  serve until SIGTERM (``App.run_forever``)

Configured by ``TRACE_DB`` (the SQLite file), ``TRACE_LOG`` (the log), ``TRACE_INSTANCE`` and
``TRACE_MAX_LIFE`` (see ``harness.py``). Workflow ``traced``: step ``one``, then step ``two``,
which on the first attempt logs ``blocked`` and waits for an hour (the test kills the process
then); on a later attempt it returns at once.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from typing import Any

import harness
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import shoal

NAMESPACE = "traced"
LEASE = 2.0
emit = harness.LineLog("TRACE_LOG")


class LineExporter(SpanExporter):
    """Each span, as it ends, one line of the log."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for s in spans:
            assert s.context is not None
            emit({"kind": "span", "name": s.name, "pid": os.getpid(),
                  "trace": f"{s.context.trace_id:032x}", "span": f"{s.context.span_id:016x}",
                  "parent": None if s.parent is None else f"{s.parent.span_id:016x}",
                  "attributes": dict(s.attributes or {}), "status": s.status.status_code.name})
        return SpanExportResult.SUCCESS


def make_app(db: str, instance_id: str | None = None,
             tracing: Any = True) -> shoal.App:
    """The app of the workers (``tracing``: their SDK's provider) and of the test's dispatch
    (its own)."""
    app = shoal.App(NAMESPACE, store=f"sqlite:///{db}", instance_id=instance_id, lease=LEASE,
                    tracing=tracing)

    @app.workflow(name="traced", max_attempts=3)
    async def traced(ctx: shoal.RunContext, input: Any) -> str:
        await ctx.step("one", lambda: 1)

        async def two() -> str:
            if ctx.attempt == 1:
                emit({"kind": "blocked", "run": ctx.run_id, "pid": os.getpid()})
                await asyncio.sleep(3600)
            return "done"

        return str(await ctx.step("two", two))

    return app


def worker() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(LineExporter()))
    harness.serve(lambda: make_app(os.environ["TRACE_DB"], os.environ["TRACE_INSTANCE"],
                                   provider), emit, "TRACE", drain=5.0)


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        worker()
    else:
        sys.exit(f"usage: {sys.argv[0]} worker")
