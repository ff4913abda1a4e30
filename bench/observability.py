"""What Prometheus metrics cost: runs/s with ``App(metrics=True)`` against the same App without,
side by side (``python bench/observability.py``; see bench/README.md).

For each store (memory; SQLite in a temporary folder; PostgreSQL when ``SHOAL_TEST_POSTGRES`` or
the default local server answers, in a schema of its own dropped afterwards) and each workflow
(a no-op, and 5 trivial async steps), N runs are dispatched in batches, then one worker App
(``max_concurrent_runs=8``) starts and the clock runs from its start to the last run's end.
Rounds alternate off, on, off, on... so a machine that slows down or warms up weighs on both
alike; the table shows the median of each and the overhead of metrics on (the target: under
5 %). One process, one worker: the engine's own cost is what is measured, not a store's
parallelism. A scrape (``app.metrics.exposition()``) is timed at the end of each run with
metrics, as a Prometheus server would make one every 15 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import add_workloads, machine
from rich.console import Console
from rich.table import Table

import shoal
from shoal.backends.memory import MemoryStore

POSTGRES = os.environ.get("SHOAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
BATCH = 500


def build_app(store: Any, metrics: bool, done: asyncio.Event, expected: int) -> shoal.App:
    app = shoal.App("bench", store=store, instance_id="bench-worker", max_concurrent_runs=8,
                    metrics=metrics)
    add_workloads(app, expected, done)
    return app


async def one_round(store_url: str, workflow: str, runs: int, metrics: bool
                    ) -> tuple[float, float, float | None]:
    """Runs/s of one worker over ``runs`` runs dispatched beforehand, the CPU time of this
    process per run (microseconds; every thread, so SQLite's work too, not PostgreSQL's), and
    the time of a scrape at the end (None without metrics)."""
    store: Any = MemoryStore() if store_url == "memory://" else store_url
    done = asyncio.Event()
    client = build_app(store, False, asyncio.Event(), runs)    # dispatches, executes nothing
    async with client.open():
        for start in range(0, runs, BATCH):
            await client.dispatch_many(workflow, list(range(start, min(runs, start + BATCH))))
    app = build_app(store, metrics, done, runs)
    began, cpu = time.perf_counter(), time.process_time()
    await app.start()
    try:
        await asyncio.wait_for(done.wait(), timeout=600)
        took = time.perf_counter() - began
        cpu = time.process_time() - cpu
        scrape = None
        if app.metrics is not None:
            t = time.perf_counter()
            app.metrics.exposition()
            scrape = time.perf_counter() - t
    finally:
        await app.close(timeout=5)
    # the settle of the last runs is still being written when the last run returns: the
    # difference is the same with and without metrics
    return runs / took, cpu / runs * 1e6, scrape


@contextlib.contextmanager
def stores(folder: Path, postgres: bool) -> Iterator[list[tuple[str, Any]]]:
    """(name, a function giving a fresh store URL for one round) per store measured."""
    made: list[str] = []

    def sqlite() -> str:
        return f"sqlite:///{folder / f'{uuid.uuid4().hex}.db'}"

    def pg() -> str:
        schema = f"obs_{uuid.uuid4().hex[:12]}"
        made.append(schema)
        return f"{POSTGRES}?schema={schema}"

    chosen: list[tuple[str, Any]] = [("memory", lambda: "memory://"), ("sqlite", sqlite)]
    if postgres:
        chosen.append(("postgres", pg))
    try:
        yield chosen
    finally:
        if made:
            import psycopg
            with psycopg.connect(POSTGRES, autocommit=True) as conn:
                for schema in made:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


def postgres_reachable() -> str | None:
    try:
        import psycopg
        with psycopg.connect(POSTGRES, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as e:
        return " ".join(str(e).split()) or type(e).__name__
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000, help="no-op runs per round; a "
                        "quarter as many 5-step runs (default 2000)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds of each (default 5)")
    parser.add_argument("--no-postgres", action="store_true", help="skip PostgreSQL")
    args = parser.parse_args()
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(machine("Metrics off and on"))
    why = None if args.no_postgres else postgres_reachable()
    if why is not None:
        console.print(f"PostgreSQL skipped: {why}")
    table = Table(title="one worker, metrics off and on (medians of the rounds)",
                  title_justify="left")
    for column in ("store", "workflow", "runs", "runs/s off", "runs/s on", "slower by",
                   "CPU µs/run off", "CPU µs/run on", "more CPU", "scrape"):
        table.add_column(column, justify="left" if column in ("store", "workflow") else "right")
    with tempfile.TemporaryDirectory(prefix="shoal-obs-") as tmp, \
            stores(Path(tmp), postgres=not args.no_postgres and why is None) as chosen:
        for name, fresh in chosen:
            for workflow, runs in (("noop", args.runs), ("steps5", max(1, args.runs // 4))):
                rates: dict[bool, list[float]] = {False: [], True: []}
                cpus: dict[bool, list[float]] = {False: [], True: []}
                scrapes: list[float] = []
                asyncio.run(one_round(fresh(), workflow, min(runs, 200), False))   # warm up
                for _ in range(args.repeat):
                    for metrics in (False, True):
                        rate, cpu, scrape = asyncio.run(
                            one_round(fresh(), workflow, runs, metrics))
                        rates[metrics].append(rate)
                        cpus[metrics].append(cpu)
                        if scrape is not None:
                            scrapes.append(scrape)
                off, on = (statistics.median(rates[m]) for m in (False, True))
                cpu_off, cpu_on = (statistics.median(cpus[m]) for m in (False, True))
                table.add_row(
                    name, workflow, str(runs), f"{off:,.0f}", f"{on:,.0f}",
                    f"{(off - on) / off * 100:+.1f} %", f"{cpu_off:,.0f}", f"{cpu_on:,.0f}",
                    f"{(cpu_on - cpu_off) / cpu_off * 100:+.1f} %",
                    f"{statistics.median(scrapes) * 1e3:.1f} ms")
                console.print(f"{name} {workflow}: runs/s {_spread(rates[False])} off, "
                              f"{_spread(rates[True])} on; CPU µs/run {cpu_off:,.0f} off, "
                              f"{cpu_on:,.0f} on")
    console.print(table)
    console.print("slower by: runs/s lost with metrics on; more CPU: this process's CPU time "
                  "per run (negative values: within the noise); scrape: one exposition of "
                  "the registry at the end of a round. On a busy machine, trust the CPU "
                  "columns over runs/s.")


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


if __name__ == "__main__":
    main()
