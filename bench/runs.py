"""Benchmarks of shoal's durable runs on SQLite (run by ``./dev bench``; see bench/README.md).

Measures, on one file system (a temporary folder, the system temp dir unless --dir says otherwise):

1. the raw SQLite commit rate (WAL, ``BEGIN IMMEDIATE; INSERT; COMMIT``) with synchronous FULL and
   NORMAL, before and after the shoal tests: the ceiling that every shoal write transaction shares;
2. dispatches/s from one process (sequential awaits; and with ``app.dispatch_many`` in batches of
   100 and 1,000), then runs/s end to end with 1 and 3 worker processes for a no-op workflow and
   a 5-step workflow, from the first claim to the last finish as the ``runs`` table records them
   (``started_at``, ``finished_at``); also the no-op runs over a table that already holds
   finished runs (``--history``); with where the workers' time goes (CPU, write transactions,
   waits for SQLite's write lock);
3. dispatch -> start latency (``started_at - created_at``) with idle workers already running.

Every worker is a subprocess of this script (``--worker``); the script ends them and removes its
temporary files on every exit path (Ctrl-C and SIGTERM included).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import queue
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import shoal

NAMESPACE = "bench"
FINAL = ("succeeded", "failed", "cancelled")
STEPS = 5
# Write transactions a run costs once the workers have it (dispatch is measured apart) when it
# shares none: a claim, one checkpoint per step, the settle. The store writes those of several
# runs together, so the table shows the measured number; this is the fallback when the store
# could not be instrumented.
COMMITS_PER_RUN = {"noop": 2, "steps5": 2 + STEPS, "noop_flow": 2}
# every flow-control rule on, none of them binding: what the rules cost a claim (--flow)
FLOW_ENV = "SHOAL_BENCH_FLOW"   # set while noop_flow is measured (see throughput)
FLOW_LIMITS: dict[str, Any] = {"max_running": 1_000_000, "max_running_per_tenant": 1_000_000,
                               "rate_limit": shoal.Rate(1_000_000_000, per=60.0),
                               "fairness": "tenant"}


# -- the workflows (the same code in the dispatcher and in every worker) ---------------------------


def build_app(store: str, *, instance_id: str | None = None, slots: int = 8,
              executed: list[int] | None = None) -> shoal.App:
    """The benchmark's app: a no-op workflow and a workflow of 5 trivial async steps (async, so a
    step runs on the event loop with no hop to a worker thread)."""
    app = shoal.App(NAMESPACE, store=store, instance_id=instance_id, max_concurrent_runs=slots)
    count = executed if executed is not None else [0]

    async def bump(i: int) -> int:
        return i + 1

    @app.workflow(name="noop")
    async def noop(ctx: shoal.RunContext, input: Any) -> None:
        count[0] += 1

    if os.environ.get(FLOW_ENV) == "1":
        @app.workflow(name="noop_flow", **FLOW_LIMITS)
        async def noop_flow(ctx: shoal.RunContext, input: Any) -> None:
            count[0] += 1

    @app.workflow(name="steps5")
    async def steps5(ctx: shoal.RunContext, input: Any) -> int:
        count[0] += 1
        value = 0
        for i in range(STEPS):
            value = await ctx.step(f"step{i}", bump, value)
        return value

    return app


# -- worker process --------------------------------------------------------------------------------


def _emit(**message: Any) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class _Counter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.first: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if self.first is None:
            self.first = record.getMessage()[:300]


class TimedConnection:
    """Stands in for the SQLite store's connection to count write transactions and time the
    wait for the write lock (``BEGIN IMMEDIATE``) and how long it is held (to COMMIT/ROLLBACK).
    Everything else goes to the real connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.transactions = 0
        self.lock_wait = 0.0
        self.lock_wait_max = 0.0
        self.waits_over_1ms = 0
        self.lock_held = 0.0
        self._since: float | None = None

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "BEGIN IMMEDIATE":
            start = time.perf_counter()
            cursor = self._conn.execute(sql)
            self._since = time.perf_counter()
            waited = self._since - start
            self.transactions += 1
            self.lock_wait += waited
            self.lock_wait_max = max(self.lock_wait_max, waited)
            self.waits_over_1ms += waited > 0.001
            return cursor
        cursor = self._conn.execute(sql, *args)
        if sql in ("COMMIT", "ROLLBACK") and self._since is not None:
            self.lock_held += time.perf_counter() - self._since
            self._since = None
        return cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def report(self) -> dict[str, Any]:
        return {"transactions": self.transactions, "lock_wait": self.lock_wait,
                "lock_wait_max": self.lock_wait_max, "waits_over_1ms": self.waits_over_1ms,
                "lock_held": self.lock_held}


def instrument(store: Any) -> TimedConnection | None:
    """Wrap the open SQLite store's connection; None (no numbers) if the store is built some
    other way than this bench expects."""
    connection = getattr(store, "_connection", None)   # the SQLiteConnection
    conn = getattr(connection, "conn", None)
    if not isinstance(conn, sqlite3.Connection):
        return None
    timed = TimedConnection(conn)
    connection.conn = timed
    return timed


def worker_main(args: argparse.Namespace) -> None:
    """Build the app, say ``ready``, wait for ``go`` on stdin, then serve until ``stop`` (or EOF:
    the parent is gone, or SIGTERM/SIGINT), close gracefully and report what it did."""
    executed = [0]
    app = build_app(args.store, instance_id=args.instance_id, slots=args.slots, executed=executed)
    counter = _Counter()
    logging.getLogger("shoal").addHandler(counter)
    _emit(event="ready")
    fd = sys.stdin.fileno()
    if b"go" not in os.read(fd, 64):
        return

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_stdin() -> None:
            data = os.read(fd, 64)
            if not data or b"stop" in data:
                stop.set()

        loop.add_reader(fd, on_stdin)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        cpu0 = time.process_time()
        await app.store.open()   # app.start() then finds it open
        timed = instrument(app.store)
        await app.start()
        _emit(event="started")
        await stop.wait()
        loop.remove_reader(fd)
        cpu = time.process_time() - cpu0
        sql = timed.report() if timed is not None else None
        await app.close(timeout=5.0)
        _emit(event="done", executed=executed[0], cpu=cpu, sql=sql, warnings=counter.count,
              first_warning=counter.first)

    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.runcall(asyncio.run, serve())
        profiler.dump_stats(Path(args.profile) / f"{args.instance_id}.prof")
    else:
        asyncio.run(serve())


# -- parent side: processes ------------------------------------------------------------------------


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[str]
    lines: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"worker {self.name} did not say {event!r} in {timeout}s")
            try:
                message = self.lines.get(timeout=min(remaining, 0.2))
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    raise RuntimeError(f"worker {self.name} exited with {self.proc.returncode}; "
                                       f"see its log for why") from None
                continue
            if message.get("event") == event:
                return message

    def send(self, text: str) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(text + "\n")
            self.proc.stdin.flush()


class Processes:
    """Every subprocess this script starts; ``close`` ends those still alive, by pid."""

    def __init__(self, tmp: Path, profile: Path | None = None) -> None:
        self.tmp = tmp
        self.profile = profile
        self.all: list[Worker] = []

    def spawn(self, name: str, store: str, slots: int) -> Worker:
        with open(self.tmp / f"{name}.log", "w") as log:
            proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--worker", "--store", store,
                 "--instance-id", name, "--slots", str(slots),
                 *(["--profile", str(self.profile)] if self.profile else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1,
            )
        worker = Worker(name, proc)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                with contextlib.suppress(ValueError):
                    worker.lines.put(json.loads(line))

        threading.Thread(target=read, daemon=True).start()
        self.all.append(worker)
        return worker

    def log_tail(self, worker: Worker, lines: int = 15) -> str:
        path = self.tmp / f"{worker.name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        for w in self.all:
            if w.proc.poll() is None:
                w.proc.terminate()
        for w in self.all:
            try:
                w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        self.all.clear()


@contextlib.contextmanager
def workers(procs: Processes, count: int, store: str, slots: int, tag: str) -> Iterator[
        list[Worker]]:
    started = [procs.spawn(f"{tag}-w{i + 1}", store, slots) for i in range(count)]
    try:
        for w in started:
            w.expect("ready", timeout=30)
        yield started
    finally:
        for w in started:
            if w.proc.poll() is None:
                w.send("stop")


def stop_workers(ws: list[Worker]) -> list[dict[str, Any]]:
    for w in ws:
        w.send("stop")
    return [w.expect("done", timeout=30) for w in ws]


def wait_final(db: Path, total: int, ws: list[Worker], timeout: float,
               after: str = "") -> bool:
    """Poll the runs table (a plain read; WAL readers do not block the writers) until the
    ``total`` runs with ids above ``after`` are final. False on timeout."""
    conn = sqlite3.connect(db, timeout=5)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = conn.execute(
                f"SELECT count(*) FROM runs WHERE id > ? AND status IN "
                f"({','.join('?' * len(FINAL))})", (after, *FINAL)).fetchone()[0]
            if done >= total:
                return True
            for w in ws:
                if w.proc.poll() is not None:
                    raise RuntimeError(f"worker {w.name} exited early with {w.proc.returncode}")
            time.sleep(0.05)
        return False
    finally:
        conn.close()


# -- parent side: measurements ---------------------------------------------------------------------


def commit_rate(tmp: Path, synchronous: str, seconds: float, when: str) -> dict[str, Any]:
    """Small write transactions back to back on one connection, as shoal writes them, once
    the WAL file has reached its steady size."""
    path = tmp / f"commits-{synchronous}-{when}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        # Untimed warm-up: until the WAL has grown to its checkpoint size (1000 pages) every
        # commit also grows the file, and commits at about half the steady rate.
        for _ in range(1500):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (v) VALUES ('x')")
            conn.execute("COMMIT")
        n = 0
        start = time.perf_counter()
        end = start + seconds
        while True:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (v) VALUES ('x')")
            conn.execute("COMMIT")
            n += 1
            if n % 64 == 0 and time.perf_counter() >= end:
                break
        elapsed = time.perf_counter() - start
    finally:
        conn.close()
    return {"synchronous": synchronous, "when": when, "commits": n, "seconds": elapsed,
            "commits_per_s": n / elapsed}


def store_url(db: Path, synchronous: str) -> str:
    return f"sqlite:///{db}?synchronous={synchronous}"


async def dispatch_many(store: str, workflow: str, n: int) -> tuple[float, str]:
    """Dispatch ``n`` runs one after another from this process; returns the seconds it took and
    the id of the last run."""
    app = build_app(store)
    last = ""
    async with app.open():
        start = time.perf_counter()
        for i in range(n):
            last = (await app.dispatch(workflow, {"i": i})).id
        return time.perf_counter() - start, last


async def dispatch_bulk(store: str, workflow: str, n: int, batch: int) -> float:
    """Dispatch ``n`` runs with ``app.dispatch_many``, ``batch`` per call, one call after
    another from this process; returns the seconds it took."""
    app = build_app(store)
    async with app.open():
        start = time.perf_counter()
        for i in range(0, n, batch):
            await app.dispatch_many(workflow, [{"i": j} for j in range(i, min(n, i + batch))])
        return time.perf_counter() - start


def bulk_rates(tmp: Path, tag: str, synchronous: str, workflow: str, n: int,
               batches: list[int]) -> dict[str, float]:
    """Dispatches/s with ``app.dispatch_many`` per batch size, each into a file of its own
    (removed afterwards)."""
    rates = {}
    for batch in batches:
        db = tmp / f"{tag}-bulk{batch}.db"
        try:
            rates[str(batch)] = n / asyncio.run(dispatch_bulk(store_url(db, synchronous),
                                                              workflow, n, batch))
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
    return rates


def add_history(db: Path, n: int) -> str:
    """Give the table ``n`` finished runs, as a store that keeps finished runs for
    ``run_retention`` (7 days by default) has: dispatched through the API (synchronous=off, to be
    quick), then marked succeeded in one UPDATE. Returns the last history id."""
    _, last = asyncio.run(dispatch_many(store_url(db, "off"), "noop", n))
    conn = sqlite3.connect(db, timeout=5)
    try:
        with conn:
            conn.execute("UPDATE runs SET status = 'succeeded', attempts = 1, output = 'null', "
                         "started_at = created_at, finished_at = created_at, run_at = created_at")
    finally:
        conn.close()
    return last


async def dispatch_paced(store: str, n: int, interval: float) -> None:
    """Dispatch ``n`` no-op runs one at a time, one every ``interval`` seconds (no drift)."""
    app = build_app(store)
    async with app.open():
        start = time.perf_counter()
        for i in range(n):
            delay = start + i * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await app.dispatch("noop", {"i": i})


async def read_runs(store: str, after: str | None = None) -> list[shoal.Run]:
    """Every run with an id above ``after``, through ``app.list_runs`` pages."""
    app = build_app(store)
    runs: list[shoal.Run] = []
    async with app.open():
        while True:
            page = await app.list_runs(limit=1000, after=after)
            runs.extend(page)
            if len(page) < 1000:
                return runs
            after = page[-1].id


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    if len(values) == 1:
        v = values[0]
        return {"p50": v, "p90": v, "p99": v, "max": v, "mean": v}
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": q[49], "p90": q[89], "p99": q[98], "max": max(values),
            "mean": statistics.fmean(values)}


def throughput(procs: Processes, tmp: Path, workflow: str, n: int, count: int, slots: int,
               synchronous: str, timeout: float, history: int = 0, rep: int = 1,
               bulk: list[int] | None = None) -> dict[str, Any]:
    """One throughput test; for noop_flow, its processes (the workers and the dispatcher,
    which inherit the environment) serve the workflow with the flow-control rules, and only
    then: a claimer serving a workflow with rules claims every run with the flow claim, so the
    plain noop must not be served beside it."""
    os.environ[FLOW_ENV] = "1" if workflow == "noop_flow" else ""
    try:
        return _throughput(procs, tmp, workflow, n, count, slots, synchronous, timeout,
                           history=history, rep=rep, bulk=bulk)
    finally:
        os.environ.pop(FLOW_ENV, None)


def _throughput(procs: Processes, tmp: Path, workflow: str, n: int, count: int, slots: int,
               synchronous: str, timeout: float, history: int = 0, rep: int = 1,
               bulk: list[int] | None = None) -> dict[str, Any]:
    """Dispatch ``n`` runs, then start ``count`` workers and time the runs from the first claim
    to the last finish as the store recorded them."""
    tag = f"{workflow}-{count}w" + (f"-h{history}" if history else "") + f"-r{rep}"
    db = tmp / f"{tag}.db"
    store = store_url(db, synchronous)
    after = add_history(db, history) if history else ""
    dispatch_s, _ = asyncio.run(dispatch_many(store, workflow, n))
    bulk_per_s = bulk_rates(tmp, tag, synchronous, workflow, n, bulk or [])
    with workers(procs, count, store, slots, tag) as ws:
        for w in ws:
            w.send("go")
        for w in ws:
            w.expect("started", timeout=30)
        complete = wait_final(db, n, ws, timeout, after)
        reports = stop_workers(ws)
    runs = asyncio.run(read_runs(store, after or None))
    starts = [r.started_at for r in runs if r.started_at is not None]
    ends = [r.finished_at for r in runs if r.finished_at is not None]
    succeeded = sum(r.status == shoal.RunStatus.SUCCEEDED for r in runs)
    window = (max(ends) - min(starts)) if starts and ends else float("nan")
    durations = [r.finished_at - r.started_at for r in runs
                 if r.started_at is not None and r.finished_at is not None]
    cpu = sum(rep["cpu"] for rep in reports)
    sql = [rep["sql"] for rep in reports if rep.get("sql")]
    tx = sum(q["transactions"] for q in sql)
    diagnostics = {
        "write_transactions_per_run": tx / max(succeeded, 1),
        "write_lock_busy": sum(q["lock_held"] for q in sql) / window,
        "lock_wait_share": sum(q["lock_wait"] for q in sql) / (window * count),
        "lock_wait_max": max((q["lock_wait_max"] for q in sql), default=0.0),
        "lock_waits_over_1ms": sum(q["waits_over_1ms"] for q in sql),
    } if len(sql) == len(reports) and window > 0 else None
    return {
        "workflow": workflow, "workers": count, "slots": slots, "runs": n, "history": history,
        "succeeded": succeeded, "complete": complete,
        "dispatch_seconds": dispatch_s, "dispatches_per_s": n / dispatch_s,
        "bulk_dispatches_per_s": bulk_per_s, "seconds": window,
        "runs_per_s": succeeded / window if window > 0 else float("nan"),
        "commits_per_run": COMMITS_PER_RUN[workflow], "sql": diagnostics,
        "run_duration": percentiles(durations),
        "worker_cpu_seconds": cpu, "worker_cpu_ms_per_run": 1000 * cpu / max(succeeded, 1),
        "executed_per_worker": {w.name: rep["executed"] for w, rep in zip(ws, reports,
                                                                          strict=True)},
        "warnings": sum(rep["warnings"] for rep in reports),
        "first_warning": next((rep["first_warning"] for rep in reports if rep["first_warning"]),
                              None),
    }


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The trial with the median runs/s, with the range over all trials and every trial."""
    ranked = sorted(trials, key=lambda t: t["runs_per_s"])
    median = dict(ranked[(len(ranked) - 1) // 2])
    median["runs_per_s_range"] = [ranked[0]["runs_per_s"], ranked[-1]["runs_per_s"]]
    median["trials"] = trials
    median["complete"] = all(t["complete"] and t["succeeded"] == t["runs"] for t in trials)
    median["warnings"] = sum(t["warnings"] for t in trials)
    return median


def latency(procs: Processes, tmp: Path, n: int, interval: float, count: int, slots: int,
            synchronous: str, timeout: float) -> dict[str, Any]:
    tag = f"latency-{count}w"
    db = tmp / f"{tag}.db"
    store = store_url(db, synchronous)
    # Create the schema before the workers look at the file.
    asyncio.run(dispatch_many(store, "noop", 0))
    with workers(procs, count, store, slots, tag) as ws:
        for w in ws:
            w.send("go")
        for w in ws:
            w.expect("started", timeout=30)
        time.sleep(0.5)   # idle, polling
        asyncio.run(dispatch_paced(store, n, interval))
        complete = wait_final(db, n, ws, timeout)
        reports = stop_workers(ws)
    runs = asyncio.run(read_runs(store))
    waits = [r.started_at - r.created_at for r in runs if r.started_at is not None]
    sql = [rep["sql"] for rep in reports if rep.get("sql")]
    return {
        "workers": count, "slots": slots, "runs": n, "interval": interval, "complete": complete,
        "started": len(waits), "latency": percentiles(waits),
        "write_transactions_per_run": (sum(q["transactions"] for q in sql) / max(len(waits), 1)
                                       if len(sql) == len(reports) else None),
        "lock_wait_max": max((q["lock_wait_max"] for q in sql), default=None),
        "warnings": sum(rep["warnings"] for rep in reports),
    }


# -- output ----------------------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


def render(result: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 120)
    env = result["environment"]
    console.print(
        f"[bold]shoal bench[/]: SQLite {env['sqlite']}, Python {env['python']}, "
        f"{env['cores']} cores ({env['usable_cores']} usable), files in {env['dir']} on "
        f"{env['filesystem']}; shoal tests use synchronous=[bold]{result['synchronous'].upper()}"
        f"[/]; load average {env['load_average_before'][0]:.2f} before, "
        f"{env['load_average_after'][0]:.2f} after ({result['bench_seconds']:.0f} s in all)")

    def table() -> Table:
        return Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))

    console.print("\n[bold]1. Raw SQLite commits[/]: WAL, BEGIN IMMEDIATE; INSERT; COMMIT, "
                  "one connection")
    t = table()
    t.add_column("synchronous")
    t.add_column("commits/s before", justify="right")
    t.add_column("after the shoal tests", justify="right")
    rates: dict[str, list[float]] = {}
    for c in result["commit_rate"]:
        rates.setdefault(c["synchronous"], []).append(c["commits_per_s"])
    for sync, values in rates.items():
        t.add_row(sync.upper(), *(f"{v:,.0f}" for v in values))
    console.print(t)

    rate = statistics.fmean(rates[result["synchronous"]])
    rounds = len(result["throughput"][0]["trials"]) if result["throughput"] else 0
    console.print("\n[bold]2. Runs end to end[/]: N runs dispatched first, then the worker "
                  "processes start; runs/s from the first claim to the last finish, median of "
                  f"{rounds} round{'s' if rounds != 1 else ''} (the other columns: that round)")
    t = table()
    bulk_sizes = result.get("bulk_batches", [])
    for name in ("workflow", "procs", "runs", "dispatch/s", *(f"bulk {b}/s" for b in bulk_sizes),
                 "runs/s", "range", "tx/run", "ceiling", "%ceil", "%raw", "p50 ms", "p99 ms"):
        t.add_column(name, justify="left" if name == "workflow" else "right", no_wrap=True,
                     min_width=len(name))
    diag = table()
    for name in ("workflow", "procs", "CPU ms/run", "lock busy", "lock wait", "max wait ms",
                 "waits >1ms", "runs per proc"):
        diag.add_column(name, justify="left" if name in ("workflow", "runs per proc") else
                        "right", no_wrap=True, min_width=len(name))
    for r in result["throughput"]:
        sql = r["sql"] or {}
        per_run = sql.get("write_transactions_per_run", r["commits_per_run"])
        cap = rate / per_run
        ok = r["complete"] and r["succeeded"] == r["runs"]
        label = r["workflow"] + (f"+{r['history'] // 1000}k" if r["history"] else "")
        procs = f"{r['workers']}x{r['slots']}"
        t.add_row(
            label, procs,
            f"{r['succeeded']}" + ("" if ok else f"/{r['runs']} [red]incomplete[/]"),
            f"{r['dispatches_per_s']:,.0f}",
            *(f"{r['bulk_dispatches_per_s'][str(b)]:,.0f}"
              if str(b) in r.get("bulk_dispatches_per_s", {}) else "-" for b in bulk_sizes),
            f"{r['runs_per_s']:,.0f}",
            "{:,.0f}-{:,.0f}".format(*r["runs_per_s_range"]), f"{per_run:.2f}",
            f"{cap:,.0f}", f"{100 * r['runs_per_s'] / cap:.0f}%",
            f"{100 * r['runs_per_s'] / rate:.0f}%",
            _ms(r["run_duration"].get("p50")), _ms(r["run_duration"].get("p99")))
        diag.add_row(
            label, procs, f"{r['worker_cpu_ms_per_run']:.2f}",
            f"{100 * sql['write_lock_busy']:.0f}%" if sql else "-",
            f"{100 * sql['lock_wait_share']:.0f}%" if sql else "-",
            _ms(sql.get("lock_wait_max")), str(sql.get("lock_waits_over_1ms", "-")),
            "/".join(str(v) for v in r["executed_per_worker"].values()))
    console.print(t)
    console.print(
        "procs: worker processes x max_concurrent_runs. dispatch/s: app.dispatch awaited one "
        "after another from one process; bulk N/s: app.dispatch_many, N runs per call, the same "
        "number of runs into a file of its own. tx/run: write transactions (BEGIN IMMEDIATE) of "
        "the workers per run: a run's claim, its settlement and (steps5) its "
        f"{STEPS} checkpoints, each transaction shared by as many runs' writes as were queued "
        f"(1 + 1 + {STEPS} unshared). ceiling: {result['synchronous'].upper()} commits/s (mean "
        "of before and after) / tx/run; %ceil: runs/s / ceiling. %raw: runs/s / those "
        "commits/s, the share of the ceiling of one commit per run (over 100%: several runs per "
        "commit). p50/p99: run duration, claim -> finish. steps5 steps are async "
        "functions (no thread hop). noop+Nk: the table already holds N thousand finished runs.")
    console.print("\n[bold]2b. Where the workers' time goes[/] (same rounds)")
    console.print(diag)
    console.print(
        "CPU ms/run: user+sys of all workers / runs. lock busy: share of the window in which "
        "some worker held the write lock (BEGIN IMMEDIATE -> COMMIT). lock wait: share of the "
        "workers' time spent waiting in BEGIN IMMEDIATE (SQLite's busy handler sleeps, and the "
        "worker's event loop with it). runs per proc: runs each worker executed.")

    console.print("\n[bold]3. Dispatch -> start latency[/] (started_at - created_at): idle "
                  "workers already running, one dispatch at a time")
    t = table()
    for name in ("procs", "runs", "one every", "p50 ms", "p90 ms", "p99 ms", "max ms", "tx/run",
                 "max wait ms"):
        t.add_column(name, justify="right")
    for r in result["latency"]:
        lat = r["latency"]
        per_run = r["write_transactions_per_run"]
        t.add_row(f"{r['workers']}x{r['slots']}", f"{r['started']}/{r['runs']}",
                  f"{1000 * r['interval']:.0f} ms",
                  *(_ms(lat.get(k)) for k in ("p50", "p90", "p99", "max")),
                  "-" if per_run is None else f"{per_run:.2f}", _ms(r["lock_wait_max"]))
    console.print(t)
    console.print("tx/run: the workers' write transactions per run (1 claim + 1 settle when only "
                  "the worker that gets the run takes the write lock). max wait ms: longest wait "
                  "for the write lock.")
    warnings = sum(r["warnings"] for r in result["throughput"] + result["latency"])
    if warnings:
        first = next((r["first_warning"] for r in result["throughput"] if r["first_warning"]), "")
        console.print(f"[yellow]{warnings} warnings logged by the workers[/] (first: {first})")


def filesystem_of(path: Path) -> str:
    best, kind = "", "unknown"
    with contextlib.suppress(OSError), open("/proc/mounts") as mounts:
        for line in mounts:
            parts = line.split()
            if len(parts) >= 3 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                best, kind = parts[1], f"{parts[2]} ({parts[0]} at {parts[1]})"
    return kind


# -- main ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000,
                        help="no-op runs per throughput test (default 2000)")
    parser.add_argument("--step-runs", type=int, default=None,
                        help="5-step runs per throughput test (default --runs / 4)")
    parser.add_argument("--workers", default="1,3",
                        help="worker process counts, comma separated (default 1,3)")
    parser.add_argument("--slots", type=int, default=8,
                        help="max_concurrent_runs of each worker (default 8)")
    parser.add_argument("--synchronous", choices=("full", "normal"), default="full",
                        help="SQLite synchronous for the shoal tests (default full, "
                             "shoal's default)")
    parser.add_argument("--history", type=int, default=20000,
                        help="also time the no-op runs with 1 worker over a table that already "
                             "holds this many finished runs (default 20000; 0: skip)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds of the throughput tests; the table shows the median "
                             "(default 3)")
    parser.add_argument("--bulk-batches", default="100,1000",
                        help="app.dispatch_many batch sizes whose dispatch rate each throughput "
                             "test also measures, comma separated ('' for none)")
    parser.add_argument("--latency-runs", type=int, default=200,
                        help="runs dispatched one at a time in the latency test (default 200)")
    parser.add_argument("--interval", type=float, default=0.02,
                        help="seconds between dispatches in the latency test (default 0.02)")
    parser.add_argument("--commit-seconds", type=float, default=2.0,
                        help="length of each raw commit-rate loop (default 2)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="give up on one test after this many seconds")
    parser.add_argument("--dir", default=None,
                        help="make the temporary folder here (default: the system temp dir)")
    parser.add_argument("--flow", action="store_true",
                        help="also noop_flow: no-op runs of a workflow with every flow-control "
                             "rule on (max_running, max_running_per_tenant, rate_limit, "
                             "fairness), none of them binding")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--profile", metavar="DIR",
                        help="run each worker under cProfile and save DIR/<worker>.prof")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--instance-id", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        worker_main(args)
        return 0

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # Ctrl-C or a SIGTERM still runs the clean-up below (a shell may start us ignoring SIGINT).
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    counts = [int(c) for c in args.workers.split(",") if c.strip()]
    step_runs = args.step_runs if args.step_runs is not None else max(1, args.runs // 4)
    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-", dir=args.dir)).resolve()
    profile = None
    if args.profile:
        profile = Path(args.profile).resolve()
        profile.mkdir(parents=True, exist_ok=True)
    procs = Processes(tmp, profile)
    result: dict[str, Any] = {
        "environment": {
            "dir": str(tmp), "filesystem": filesystem_of(tmp), "sqlite": sqlite3.sqlite_version,
            "python": platform.python_version(), "platform": platform.platform(),
            "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
            "shoal": shoal.__version__, "load_average_before": os.getloadavg(),
        },
        "synchronous": args.synchronous,
        "bulk_batches": [int(b) for b in args.bulk_batches.split(",") if b.strip()],
        "started_at": time.time(),
    }
    began = time.perf_counter()
    try:
        print(f"temporary folder {tmp} ({result['environment']['filesystem']})", file=sys.stderr)
        result["commit_rate"] = [commit_rate(tmp, s, args.commit_seconds, "before")
                                 for s in ("full", "normal")]
        configs = [(workflow, n, count, 0) for workflow, n in (("noop", args.runs),
                                                               ("steps5", step_runs))
                   for count in counts]
        if args.flow:
            configs += [("noop_flow", args.runs, count, 0) for count in counts]
        if args.history:
            configs.append(("noop", args.runs, 1, args.history))
        # Rounds of every test rather than one test repeated: load from elsewhere on the machine
        # then spreads over all of them.
        trials: dict[tuple[str, int, int, int], list[dict[str, Any]]] = {c: [] for c in configs}
        for rep in range(1, args.repeat + 1):
            for config in configs:
                workflow, n, count, history = config
                print(f"throughput {rep}/{args.repeat}: {workflow} x {n}, {count} worker(s)"
                      + (f", over {history} finished runs" if history else "") + "...",
                      file=sys.stderr)
                trials[config].append(throughput(procs, tmp, workflow, n, count, args.slots,
                                                 args.synchronous, args.timeout, history, rep,
                                                 result["bulk_batches"]))
        result["throughput"] = [summarize(t) for t in trials.values()]
        result["latency"] = []
        for count in counts:
            print(f"latency: {args.latency_runs} runs, {count} worker(s)...", file=sys.stderr)
            result["latency"].append(latency(procs, tmp, args.latency_runs, args.interval, count,
                                             args.slots, args.synchronous, args.timeout))
        result["commit_rate"] += [commit_rate(tmp, s, args.commit_seconds, "after")
                                  for s in ("full", "normal")]
        result["environment"]["load_average_after"] = os.getloadavg()
    except (RuntimeError, TimeoutError) as e:
        print(f"bench failed: {e}", file=sys.stderr)
        for w in procs.all:
            tail = procs.log_tail(w)
            if tail:
                print(f"--- {w.name} log ---\n{tail}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        procs.close()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    result["bench_seconds"] = time.perf_counter() - began
    render(result)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
