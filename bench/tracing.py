"""What OpenTelemetry tracing costs a run: a no-op workflow and a 5-step workflow on SQLite with
tracing off; on without an SDK (``App(tracing=True)`` and the API's no-op provider: ``api``); and
on with the SDK, an exporter that drops the spans (an application's export minus the network),
every trace sampled through the synchronous ``SimpleSpanProcessor`` (``sdk simple``) or the
``BatchSpanProcessor`` (``sdk batch``, the usual production set-up), and one trace in ten sampled
(``ParentBased(TraceIdRatioBased(0.1))``, batch: ``sdk10 batch``).

    .venv/bin/python bench/tracing.py                    # 4000 no-op runs, 5 rounds
    .venv/bin/python bench/tracing.py --runs 10000 --rounds 9

In one process: each round dispatches the runs (in batches of 10, each under a span of its own as
a request's would be, so every run carries a trace context, sampled or not) into a fresh SQLite
file (``synchronous=normal``, so fsyncs do not hide the CPU cost; in a temporary folder), then
starts one app with ``max_concurrent_runs=8`` and measures from its start until the last run
ended and its spans were handed to the exporter: runs/s (wall clock), and CPU time per run (the
process's, every thread's), which the other processes of a shared machine disturb far less. The
cost column compares CPU per run against ``off``. The modes take turns within each round, so the
machine's drift falls on all of them alike; the table shows medians.

The batch processor frees its spans in batches, which makes glibc's malloc give memory back to
the system and take it again (page faults: the ``faults/run`` column);
``MALLOC_TRIM_THRESHOLD_=268435456 MALLOC_MMAP_THRESHOLD_=268435456`` in the environment stops
that. (``--store memory``: the memory store, whose claim scans every run, so its numbers say
more about it than about tracing.)
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import add_workloads
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

import shoal

MODES = ("off", "api", "sdk simple", "sdk batch", "sdk10 batch")
BATCH = 10   # runs dispatched under one request span


class Dropped(SpanExporter):
    """Counts the spans and sends them nowhere."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def build(store: str, tracing: Any, runs: int, done: asyncio.Event) -> shoal.App:
    app = shoal.App("bench", store=store, max_concurrent_runs=8, tracing=tracing)
    add_workloads(app, runs, done)
    return app


async def one_round(kind: str, mode: str, workflow: str, runs: int,
                    folder: Path) -> tuple[float, float, float]:
    """runs/s, CPU microseconds and page faults per run of ``runs`` runs of ``workflow`` on a
    fresh store of ``kind``, tracing ``mode``."""
    exporter, provider = Dropped(), None
    tracing: Any = False
    if mode == "api":
        tracing = True   # the global provider, which no SDK set up: the API's no-op
    elif mode.startswith("sdk"):
        provider = TracerProvider(sampler=ALWAYS_ON if mode.startswith("sdk ") else
                                  ParentBased(TraceIdRatioBased(0.1)))
        provider.add_span_processor(
            SimpleSpanProcessor(exporter) if mode.endswith("simple") else
            BatchSpanProcessor(exporter, max_queue_size=65536))
        tracing = provider
    if kind == "memory":
        store = "memory://"
    else:
        path = folder / f"{mode}-{workflow}-{time.monotonic_ns()}.db"
        store = f"sqlite:///{path}?synchronous=normal"
    done = asyncio.Event()
    app = build(store, tracing, runs, done)
    # the span a request would be in: the runs' attempts continue it (with the SDK)
    tracer = (provider or TracerProvider()).get_tracer("bench")
    async with app.open():
        for i in range(0, runs, BATCH):
            with tracer.start_as_current_span("request"):
                await app.dispatch_many(workflow, [None] * min(BATCH, runs - i))
    began, cpu = time.perf_counter(), time.process_time()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    await app.start()
    await done.wait()
    if provider is not None:
        provider.force_flush()   # the spans of every run made and handed to the exporter
    took, used = time.perf_counter() - began, time.process_time() - cpu
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    await app.close()
    if provider is not None:
        provider.shutdown()
        if mode.startswith("sdk "):
            assert exporter.spans >= runs, exporter.spans
    return runs / took, used / runs * 1e6, faults / runs


async def main(stores: list[str], runs: int, rounds: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="shoal-bench-tracing-"))
    try:
        print(f"SQLite (synchronous=normal), one app, max_concurrent_runs=8, medians of "
              f"{rounds} rounds")
        print(f"{'workflow':8} {'runs':>5} {'tracing':12} {'runs/s':>8} {'CPU us/run':>11} "
              f"{'cost':>7} {'faults/run':>11}")
        for kind in stores:
            for workflow, n in (("noop", runs), ("steps5", max(1, runs // 4))):
                got: dict[str, list[tuple[float, float, float]]] = {m: [] for m in MODES}
                for _ in range(rounds):
                    for mode in MODES:
                        got[mode].append(await one_round(kind, mode, workflow, n, folder))
                med = {m: [statistics.median(x[i] for x in v) for i in range(3)]
                       for m, v in got.items()}
                for mode in MODES:
                    rate, cpu, faults = med[mode]
                    cost = "" if mode == "off" else f"{100.0 * (cpu / med['off'][1] - 1):+6.1f}%"
                    print(f"{workflow:8} {n:>5} {mode:12} {rate:8.0f} {cpu:11.0f} {cost:>7} "
                          f"{faults:11.1f}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["sqlite", "memory"], default="sqlite")
    parser.add_argument("--runs", type=int, default=4000, help="no-op runs per round; a "
                        "quarter as many 5-step runs")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main([args.store], args.runs, args.rounds))
