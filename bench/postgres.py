"""Benchmarks of shoal's PostgreSQL store against the Postgres queues users know (see
bench/README.md, "PostgreSQL"). One script, one run, on one PostgreSQL server:

1. pgbench simple-update TPS (2 clients), before and after: the commit-rate ceiling;
2. runs/s end to end, N jobs dispatched first, then 2 worker processes: shoal (``App`` over
   ``postgresql://...?schema=...``) vs pgqueuer, procrastinate and DBOS queues (each in the
   benchmark's own virtual environment, bench/.venv-peers, made on first use; never shoal
   dependencies), for no-op jobs and for a workflow of 5 checkpointed steps (``--workflow``;
   shoal and DBOS, the peer with durable steps); beside each system's enqueue rate, shoal's with
   ``app.dispatch_many`` in batches of 100 and 1,000 (``--bulk-batches``);
3. dispatch -> start latency with idle workers, one dispatch every ``--interval``; and with the
   workers saturated: a backlog of N runs, and high-priority probes dispatched while it drains;
4. ``store.claim_runs`` latency over an empty table vs 1,000,000 finished + 100,000 queued rows
   (``--no-large`` skips the large table);
5. ``store.stats`` latency over the same tables, the large one against its 100,000 queued rows
   alone.

Every test gets a new database (``shoalbench_<pid>_...``), dropped on every exit path; worker
processes are subprocesses of this script, ended by pid.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

import shoal
from shoal.app.collector import tune_from_env

HERE = Path(__file__).resolve().parent
PEERS_DIR = HERE / "peers"
PEER_VENV = HERE / ".venv-peers"
PEER_REQUIREMENTS = HERE / "requirements-peers.txt"
PEERS = ("pgqueuer", "procrastinate", "dbos")
WORKFLOWS = ("noop", "steps5", "noop_flow")
STEPS = 5
# The systems that run each workflow (None: all): only shoal and DBOS have durable steps.
RUNS_WORKFLOW: dict[str, tuple[str, ...] | None] = {"noop": None, "steps5": ("shoal", "dbos"),
                                                   "noop_flow": ("shoal",)}
# noop_flow: every flow-control rule on, none of them binding (what the rules cost a claim)
FLOW_ENV = "SHOAL_BENCH_FLOW"   # set while noop_flow is measured (see throughput)
FLOW_LIMITS: dict[str, Any] = {"max_running": 1_000_000, "max_running_per_tenant": 1_000_000,
                               "rate_limit": shoal.Rate(1_000_000_000, per=60.0),
                               "fairness": "tenant"}
# The systems whose jobs have priorities (higher first): the loaded latency's probes jump the
# backlog. DBOS's queue priorities are left out (they need a queue made with priorities on).
PRIORITIES = ("shoal", "pgqueuer", "pgqueuer-asyncpg", "procrastinate")
NAMESPACE = "bench"
FINAL = ("succeeded", "failed", "cancelled")
# Jobs not finished yet, per system (the parent polls this until it is 0).
# The unfinished jobs of each system, counted (the steady rate, the loaded test's early stop) and
# asked for (any left?). The parent asks every 10 ms and counts every COUNT_EVERY polls: a count
# reads every unfinished job's index entry (and its heap row), and at one count every 10 ms the
# poll took a third of a core from the 2 the systems share; "any left?" stops at the first.
# shoal's unfinished runs are counted by the partial indexes that hold them (a parked run is
# queued and held), never by a scan of the finished runs.
_SHOAL_LEFT = ("status = 'queued' AND NOT held", "held", "status IN ('running', 'interrupted')",
               "status IN ('sleeping', 'waiting')")
REMAINING = {
    "shoal": "SELECT " + " + ".join(f"(SELECT count(*) FROM {{schema}}.runs WHERE {w})"
                                    for w in _SHOAL_LEFT),
    "pgqueuer": "SELECT count(*) FROM pgqueuer",   # a finished job leaves the table
    "pgqueuer-defaults": "SELECT count(*) FROM pgqueuer",
    "pgqueuer-asyncpg": "SELECT count(*) FROM pgqueuer",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
    "dbos": "SELECT count(*) FROM dbos.workflow_status WHERE status IN ('ENQUEUED', 'PENDING')",
}
ANY_LEFT = {
    "shoal": "SELECT " + " OR ".join(f"EXISTS (SELECT 1 FROM {{schema}}.runs WHERE {w})"
                                     for w in _SHOAL_LEFT),
    "pgqueuer": "SELECT EXISTS (SELECT 1 FROM pgqueuer)",
    "pgqueuer-defaults": "SELECT EXISTS (SELECT 1 FROM pgqueuer)",
    "pgqueuer-asyncpg": "SELECT EXISTS (SELECT 1 FROM pgqueuer)",
    "procrastinate": "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs "
                     "WHERE status IN ('todo', 'doing'))",
    "dbos": "SELECT EXISTS (SELECT 1 FROM dbos.workflow_status "
            "WHERE status IN ('ENQUEUED', 'PENDING'))",
}
COUNT_EVERY = 5   # polls: a count every 50 ms


# -- shoal's side (this interpreter) ---------------------------------------------------------------


def build_app(store: str, *, instance_id: str | None = None, slots: int = 16,
              tally: Any = None) -> shoal.App:
    """The benchmark's app: a no-op workflow, and one of 5 checkpointed steps, each a trivial
    async function (no hop to a worker thread), as bench/runs.py measures on SQLite."""
    app = shoal.App(NAMESPACE, store=store, instance_id=instance_id, max_concurrent_runs=slots)

    def hit(input: Any) -> None:
        if tally is not None:
            tally.hit(input.get("t") if isinstance(input, dict) else None)

    async def bump(i: int) -> int:
        return i + 1

    @app.workflow(name="noop")
    async def noop(ctx: shoal.RunContext, input: Any) -> None:
        hit(input)

    if os.environ.get(FLOW_ENV) == "1":
        @app.workflow(name="noop_flow", **FLOW_LIMITS)
        async def noop_flow(ctx: shoal.RunContext, input: Any) -> None:
            hit(input)

    @app.workflow(name="steps5")
    async def steps5(ctx: shoal.RunContext, input: Any) -> int:
        hit(input)
        value = 0
        for i in range(STEPS):
            value = await ctx.step(f"step{i}", bump, value)
        return value

    return app


STORE_CALLS = ("claim_runs", "settle_and_claim", "load_steps", "settle_run", "checkpoint_step")


def instrument(store: Any, stats: dict[str, dict[str, float]]) -> None:
    """Count and time (wall, from the call to its answer: waiting for a pooled connection or
    for a batch included) the store calls a no-op run makes."""
    for name in STORE_CALLS:
        fn = getattr(store, name)
        entry = stats.setdefault(name, {"calls": 0, "seconds": 0.0, "rows": 0})

        async def timed(*a: Any, _fn: Any = fn, _entry: dict[str, float] = entry,
                        **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                result = await _fn(*a, **kw)
            finally:
                _entry["calls"] += 1
                _entry["seconds"] += time.perf_counter() - t
            if isinstance(result, list):
                _entry["rows"] += len(result)
            elif result is False:   # checkpoint_step: fenced out
                _entry["refused"] = _entry.get("refused", 0) + 1
            elif isinstance(result, tuple):   # settle_and_claim: (answers, runs claimed)
                _entry["settled"] = _entry.get("settled", 0) + len(result[0])
                _entry["rows"] += len(result[1])
            return result

        setattr(store, name, timed)


def shoal_worker(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(PEERS_DIR))
    from _common import Tally, serve  # the same protocol and tally as the peer runners

    tally = Tally()
    app = build_app(args.store, instance_id=args.instance_id, slots=args.slots, tally=tally)
    stats: dict[str, dict[str, float]] = {}
    instrument(app.store, stats)
    tally.extra["store_calls"] = stats
    # as `shoal worker` does unless told `--gc default` (SHOAL_WORKER_GC=default here too)
    tally.extra["gc"] = "tuned" if tune_from_env() else "default"

    async def main() -> None:
        async def start() -> None:
            await app.start()

        async def stop() -> None:
            await app.close(timeout=5.0)

        await serve(tally, start, stop)

    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.runcall(asyncio.run, main())
        profiler.dump_stats(Path(args.profile) / f"{args.instance_id}.prof")
    else:
        asyncio.run(main())


async def dispatch_concurrently(store: str, workflow: str, n: int, callers: int) -> float:
    """Dispatch ``n`` runs with single ``app.dispatch`` calls from ``callers`` concurrent
    callers (tasks of one process, each awaiting its dispatches one after another; they share
    the store's pool; ``dispatch_bulk`` measures ``dispatch_many``). Returns the seconds."""
    app = build_app(store)
    async with app.open():
        async def caller(first: int) -> None:
            for j in range(first, n, callers):
                await app.dispatch(workflow, {"i": j})

        start = time.perf_counter()
        await asyncio.gather(*(caller(k) for k in range(callers)))
        return time.perf_counter() - start


async def dispatch_bulk(store: str, workflow: str, n: int, batch: int) -> float:
    """Dispatch ``n`` runs with ``app.dispatch_many``, ``batch`` runs per call, one call
    after another (the store's schema migrated before the clock starts). Returns the seconds."""
    app = build_app(store)
    async with app.open():
        start = time.perf_counter()
        for i in range(0, n, batch):
            await app.dispatch_many(workflow, [{"i": j} for j in range(i, min(n, i + batch))])
        return time.perf_counter() - start


def bulk_enqueue(sql_dsn: str, workflow: str, n: int, batches: list[int]) -> dict[str, float]:
    """Enqueues/s with ``app.dispatch_many`` per batch size, each into a schema of its own in the
    test's database (dropped afterwards, before the workers start)."""
    rates = {}
    for batch in batches:
        schema = f"bulk{batch}"
        try:
            rates[str(batch)] = n / asyncio.run(dispatch_bulk(f"{sql_dsn}?schema={schema}",
                                                              workflow, n, batch))
        finally:
            with psycopg.connect(sql_dsn, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]
    return rates


async def dispatch_paced(store: str, n: int, interval: float, priority: int = 0
                         ) -> tuple[float, int]:
    """One dispatch every ``interval`` seconds, each with its time as input, until ``n`` are
    dispatched or ``stop`` comes on stdin (see bench/peers/_common.py: the peers' ``enqueue``
    mode); returns the seconds and the dispatches made."""
    sys.path.insert(0, str(PEERS_DIR))
    from _common import paced

    app = build_app(store)
    async with app.open():
        async def one(i: int) -> None:
            await app.dispatch("noop", {"t": time.time()}, priority=priority)

        return await paced(n, interval, one)


def shoal_paced(args: argparse.Namespace) -> None:
    """The hidden ``--paced N`` mode: the peers' paced ``enqueue`` for shoal, in a process of its
    own, as theirs are."""
    sys.path.insert(0, str(PEERS_DIR))
    from _common import emit

    seconds, count = asyncio.run(dispatch_paced(args.store, args.paced, args.interval,
                                                args.priority))
    emit(event="enqueued", seconds=seconds, count=count)


async def migrate(store: str) -> None:
    app = build_app(store)
    async with app.open():
        pass


def store_times(dsn: str, schema: str) -> list[tuple[float, float | None, float | None]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT created_at, started_at, finished_at FROM {schema}.runs"
                            ).fetchall()


# -- the server ------------------------------------------------------------------------------------


def with_db(url: str, db: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + db, query=""))


class Server:
    """Databases this script creates on the server; ``close`` drops them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = f"shoalbench_{os.getpid()}"
        self.created: list[str] = []

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True)

    def create(self, tag: str) -> str:
        name = f"{self.prefix}_{tag}"
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return with_db(self.url, name)

    def drop(self, dsn: str) -> None:
        name = urlsplit(dsn).path.lstrip("/")
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        with contextlib.suppress(ValueError):
            self.created.remove(name)

    def close(self) -> None:
        for name in list(self.created):
            with contextlib.suppress(psycopg.Error), self.admin() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.created.clear()

    def facts(self) -> dict[str, Any]:
        with self.admin() as conn:
            get = lambda q: conn.execute(q).fetchone()[0]   # noqa: E731
            return {"version": get("SHOW server_version"), "fsync": get("SHOW fsync"),
                    "synchronous_commit": get("SHOW synchronous_commit"),
                    "wal_sync_method": get("SHOW wal_sync_method"),
                    "commit_delay": get("SHOW commit_delay"),
                    "max_connections": get("SHOW max_connections")}


def pgbench(server: Server, seconds: float, clients: int, when: str) -> dict[str, Any]:
    dsn = server.create(f"pgbench_{when}")
    try:
        parts = urlsplit(dsn)
        conn = ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 5432),
                "-U", parts.username or "postgres", parts.path.lstrip("/")]
        subprocess.run(["pgbench", "-i", "-q", *conn], check=True, capture_output=True)
        out = subprocess.run(["pgbench", "-b", "simple-update", "-c", str(clients), "-j",
                              str(clients), "-T", str(max(1, round(seconds))), *conn],
                             check=True, capture_output=True, text=True).stdout
        tps = float(re.search(r"tps = ([\d.]+)", out).group(1))   # type: ignore[union-attr]
        return {"when": when, "clients": clients, "seconds": seconds, "tps": tps}
    finally:
        server.drop(dsn)


# -- processes -------------------------------------------------------------------------------------


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[str]
    log: Path
    lines: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self.name} did not say {event!r} in {timeout}s; "
                                   f"see {self.log}")
            try:
                message = self.lines.get(timeout=min(remaining, 0.2))
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: "
                                       f"{tail(self.log)}") from None
                continue
            if message.get("event") == event:
                return message

    def send(self, text: str) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(text + "\n")
            self.proc.stdin.flush()


def tail(path: Path, lines: int = 12) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class Processes:
    def __init__(self, tmp: Path, profile: Path | None) -> None:
        self.tmp = tmp
        self.profile = profile
        self.all: list[Worker] = []

    def command(self, system: str, dsn: str, *args: str) -> list[str]:
        if system == "shoal":
            return [sys.executable, str(Path(__file__).resolve()), *args]
        script = PEERS_DIR / f"{system.split('-')[0]}_peer.py"
        return [str(PEER_VENV / "bin" / "python"), str(script), dsn, *args]

    def spawn(self, name: str, cmd: list[str]) -> Worker:
        log = self.tmp / f"{name}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=f,
                                    text=True, bufsize=1, cwd=PEERS_DIR)
        worker = Worker(name, proc, log)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                with contextlib.suppress(ValueError):
                    worker.lines.put(json.loads(line))

        threading.Thread(target=read, daemon=True).start()
        self.all.append(worker)
        return worker

    def run(self, name: str, cmd: list[str], timeout: float) -> dict[str, Any]:
        """A one-shot peer command (setup, enqueue): its last JSON line, or {}."""
        w = self.spawn(name, cmd)
        try:
            w.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()
            raise TimeoutError(f"{name} took more than {timeout}s: {tail(w.log)}") from None
        finally:
            self.all.remove(w)
        if w.proc.returncode != 0:
            raise RuntimeError(f"{name} exited with {w.proc.returncode}: {tail(w.log)}")
        last: dict[str, Any] = {}
        while not w.lines.empty():
            last = w.lines.get()
        if not last:
            time.sleep(0.1)
            while not w.lines.empty():
                last = w.lines.get()
        return last

    def workers(self, system: str, dsn: str, count: int, slots: int, tag: str,
                extra: list[str]) -> list[Worker]:
        ws = []
        for i in range(count):
            name = f"{tag}-w{i + 1}"
            if system == "shoal":
                args = ["--worker", "--store", dsn, "--instance-id", name, "--slots", str(slots),
                        *(["--profile", str(self.profile)] if self.profile else [])]
            else:
                # pgqueuer-defaults: pgqueuer with its own run() defaults (no cap on slots)
                args = ["work", "--name", name,
                        "--slots", "0" if system.endswith("-defaults") else str(slots), *extra,
                        *(["--driver", "asyncpg"] if system.endswith("-asyncpg") else [])]
            ws.append(self.spawn(name, self.command(system, dsn, *args)))
        return ws

    def close(self) -> None:
        for w in self.all:
            if w.proc.poll() is None:
                w.proc.terminate()
        for w in self.all:
            try:
                w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        self.all.clear()


def stop(procs: Processes, ws: list[Worker]) -> list[dict[str, Any]]:
    for w in ws:
        w.send("stop")
    reports = [w.expect("done", timeout=60) for w in ws]
    for w in ws:
        try:
            w.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()
        procs.all.remove(w)
    return reports


def wait_done(dsn: str, system: str, ws: list[Worker], timeout: float,
              on_poll: Callable[[int], None] | None = None) -> list[tuple[float, int]]:
    """Poll every 10 ms until no job is left, counting them every COUNT_EVERY polls (and telling
    ``on_poll`` how many are); returns every (time.time(), jobs left) counted, the last with 0
    left unless it timed out."""
    deadline = time.monotonic() + timeout
    seen: list[tuple[float, int]] = []
    count, any_left = (REMAINING[system].format(schema="bench"),
                       ANY_LEFT[system].format(schema="bench"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        polls = 0
        while time.monotonic() < deadline:
            if polls % COUNT_EVERY == 0 or not conn.execute(any_left).fetchone()[0]:  # type: ignore[index]
                left = conn.execute(count).fetchone()[0]   # type: ignore[index]
                seen.append((time.time(), left))
                if on_poll is not None:
                    on_poll(left)
                if left == 0:
                    return seen
            polls += 1
            for w in ws:
                if w.proc.poll() is not None:
                    raise RuntimeError(f"{w.name} exited early: {tail(w.log)}")
            time.sleep(0.01)
    return seen


def steady_rate(seen: list[tuple[float, int]], n: int) -> float | None:
    """Jobs/s between the polls that saw 10 % and 90 % of the jobs done: the rate once the
    workers are going, without their start or the last stragglers."""
    t10 = next((t for t, left in seen if n - left >= 0.1 * n), None)
    t90 = next((t for t, left in seen if n - left >= 0.9 * n), None)
    if t10 is None or t90 is None or t90 <= t10:
        return None
    done10 = next(n - left for t, left in seen if t == t10)
    done90 = next(n - left for t, left in seen if t == t90)
    return (done90 - done10) / (t90 - t10)


def backend_cpu(dsn: str) -> dict[int, float]:
    """CPU seconds (user+sys, from /proc) so far of each server backend connected to this
    database, by pid, this connection's own left out; {} when the server is not on this machine
    (or /proc is not readable)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid()").fetchall()
    for (pid,) in rows:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / tick   # utime, stime
    return out


def wal_position(dsn: str) -> int:
    """The server's current WAL insert position, in bytes."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
                                ).fetchone()[0])  # type: ignore[index]


def machine_cpu() -> float | None:
    """CPU seconds so far of the whole machine, all cores, busy only (/proc/stat: user, nice,
    system, irq, softirq, steal); None without /proc."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def commits(dsn: str) -> int:
    """Transactions committed in this database so far (pg_stat_database)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return int(conn.execute("SELECT xact_commit FROM pg_stat_database "
                                "WHERE datname = current_database()").fetchone()[0])  # type: ignore[index]


# -- measurements ----------------------------------------------------------------------------------


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    if len(values) == 1:
        return {"p50": values[0], "p90": values[0], "p99": values[0], "max": values[0]}
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": q[49], "p90": q[89], "p99": q[98], "max": max(values)}


def prepare(procs: Processes, server: Server, system: str, tag: str, args: argparse.Namespace
            ) -> tuple[str, str]:
    """A new database with the system's schema; returns (dsn for the system, dsn for SQL)."""
    dsn = server.create(tag)
    if system == "shoal":
        store = f"{dsn}?schema=bench" + (f"&{args.store_options}" if args.store_options else "")
        asyncio.run(migrate(store))
        return store, dsn
    extra = ["--poll", str(args.dbos_poll)] if system == "dbos" else []
    procs.run(f"{tag}-setup", procs.command(system, dsn, "setup", "--slots", str(args.slots),
                                            *extra), timeout=120)
    return dsn, dsn


def enqueue(procs: Processes, system: str, dsn: str, n: int, tag: str, args: argparse.Namespace,
            workflow: str = "noop") -> float:
    """Fill the queue with ``n`` jobs, as fast as the system's enqueue goes; returns the
    seconds."""
    if system == "shoal":
        return asyncio.run(dispatch_concurrently(dsn, workflow, n, args.dispatch_batch))
    cmd = procs.command(system, dsn, "enqueue", str(n), "--workflow", workflow)
    return float(procs.run(f"{tag}-enqueue", cmd, timeout=args.timeout)["seconds"])


def paced_command(procs: Processes, system: str, dsn: str, n: int, interval: float,
                  priority: int = 0) -> list[str]:
    """The command of a process that enqueues one no-op job every ``interval`` seconds, each with
    its time, until ``n`` are enqueued or it reads ``stop``; at ``priority`` (higher first)."""
    paced = ["--interval", str(interval), *(["--priority", str(priority)] if priority else [])]
    if system == "shoal":
        return procs.command(system, dsn, "--paced", str(n), "--store", dsn, *paced)
    return procs.command(system, dsn, "enqueue", str(n), *paced)


def start_workers(procs: Processes, system: str, dsn: str, tag: str, args: argparse.Namespace
                  ) -> list[Worker]:
    """``--workers`` worker processes of the system, told to go once all are ready."""
    extra = ["--poll", str(args.dbos_poll)] if system == "dbos" else []
    ws = procs.workers(system, dsn, args.workers, args.slots, tag, extra)
    for w in ws:
        w.expect("ready", timeout=60)
    for w in ws:
        w.send("go")
    return ws


def throughput(procs: Processes, server: Server, system: str, workflow: str,
               args: argparse.Namespace, rep: int) -> dict[str, Any]:
    """One throughput test; for noop_flow, its processes (the workers and the dispatcher,
    which inherit the environment) serve the workflow with the flow-control rules, and only
    then: a claimer serving a workflow with rules claims every run with the flow claim, so the
    plain noop must not be served beside it."""
    os.environ[FLOW_ENV] = "1" if workflow == "noop_flow" else ""
    try:
        return _throughput(procs, server, system=system, workflow=workflow, args=args, rep=rep)
    finally:
        os.environ.pop(FLOW_ENV, None)


def _throughput(procs: Processes, server: Server, system: str, workflow: str,
               args: argparse.Namespace, rep: int) -> dict[str, Any]:
    tag = f"{system}_{workflow}_tp{rep}"
    n = args.steps_runs if workflow == "steps5" else args.runs
    dsn, sql_dsn = prepare(procs, server, system, tag, args)
    try:
        enqueue_s = enqueue(procs, system, dsn, n, tag, args, workflow)
        bulk = (bulk_enqueue(sql_dsn, workflow, n, args.bulk_batches) if system == "shoal"
                else {})
        ws = start_workers(procs, system, dsn, tag, args)
        time.sleep(0.5)   # let the enqueuer's statistics reach pg_stat_database
        commits0 = commits(sql_dsn)
        for w in ws:
            w.expect("started", timeout=60)
        server0 = backend_cpu(sql_dsn)
        machine0, wal0 = machine_cpu(), wal_position(sql_dsn)
        seen = wait_done(sql_dsn, system, ws, args.timeout)
        machine1, wal1 = machine_cpu(), wal_position(sql_dsn)
        server1 = backend_cpu(sql_dsn)
        done_at = seen[-1][0] if seen and seen[-1][1] == 0 else None
        reports = stop(procs, ws)
        time.sleep(0.5)   # the workers' backends have exited and flushed their statistics
        # every commit in the database while the workers ran, the bench's polls included
        tx = commits(sql_dsn) - commits0 - len(seen) - 2
        firsts = [r["first_start"] for r in reports if r["first_start"]]
        executed = sum(r["executed"] for r in reports)
        window = (done_at - min(firsts)) if done_at and firsts else float("nan")
        result = {
            "system": system, "workflow": workflow, "runs": n, "workers": args.workers,
            "slots": args.slots,
            "complete": done_at is not None, "executed": executed,
            "enqueue_seconds": enqueue_s, "enqueues_per_s": n / enqueue_s,
            "bulk_enqueues_per_s": bulk, "seconds": window,
            "runs_per_s": n / window if window > 0 else float("nan"),
            "steady_runs_per_s": steady_rate(seen, n), "commits_per_run": tx / n,
            "cpu_ms_per_run": 1000 * sum(r["cpu"] for r in reports) / max(executed, 1),
            # the workers' backends, those opened during the test included (from 0)
            "server_cpu_ms_per_run": (1000 * sum(t - server0.get(pid, 0.0)
                                                 for pid, t in server1.items()) / n
                                      if server1 else None),
            # every process of the machine (workers, server, kernel, the bench's poll) while the
            # workers ran: with 2 cores, what bounds the rate
            "machine_cpu_ms_per_run": (1000 * (machine1 - machine0) / n
                                       if machine0 is not None and machine1 is not None
                                       else None),
            # WAL the server wrote while the workers ran (every database: the machine's disk)
            "wal_bytes_per_run": (wal1 - wal0) / n,
            "executed_per_worker": [r["executed"] for r in reports],
        }
        if system == "shoal":
            calls: dict[str, dict[str, float]] = {}
            for rep_ in reports:
                for name, entry in rep_.get("store_calls", {}).items():
                    total = calls.setdefault(name, {"calls": 0, "seconds": 0.0, "rows": 0})
                    for k, v in entry.items():
                        total[k] = total.get(k, 0) + v
            result["store_calls"] = calls
            result["gc"] = reports[0].get("gc") if reports else None
            times = store_times(sql_dsn, "bench")
            starts = [s for _, s, _ in times if s is not None]
            ends = [f for _, _, f in times if f is not None]
            if starts and ends:
                result["store_window_seconds"] = max(ends) - min(starts)
                result["store_runs_per_s"] = len(ends) / (max(ends) - min(starts))
        return result
    finally:
        server.drop(sql_dsn)


def latency(procs: Processes, server: Server, system: str, args: argparse.Namespace
            ) -> dict[str, Any]:
    """Idle workers; one job every ``--interval``: the time from just before each enqueue call
    to its start (and for shoal ``started_at - created_at`` from the store too)."""
    tag = f"{system}_lat"
    n = args.latency_runs
    dsn, sql_dsn = prepare(procs, server, system, tag, args)
    try:
        ws = start_workers(procs, system, dsn, tag, args)
        for w in ws:
            w.expect("started", timeout=60)
        time.sleep(1.0)   # idle
        procs.run(f"{tag}-enqueue", paced_command(procs, system, dsn, n, args.interval),
                  timeout=args.timeout)
        seen = wait_done(sql_dsn, system, ws, args.timeout)
        done_at = seen[-1][0] if seen and seen[-1][1] == 0 else None
        reports = stop(procs, ws)
        job_side = [v for r in reports for v in r["latencies"]]
        result = {"system": system, "runs": n, "interval": args.interval,
                  "complete": done_at is not None, "started": len(job_side),
                  "job_side": percentiles(job_side)}
        if system == "shoal":
            times = store_times(sql_dsn, "bench")
            result["store"] = percentiles([s - c for c, s, _ in times if s is not None])
        return result
    finally:
        server.drop(sql_dsn)


def loaded_latency(procs: Processes, server: Server, system: str, args: argparse.Namespace
                   ) -> dict[str, Any]:
    """Saturated workers: ``--runs`` no-op jobs enqueued first (no time carried), the workers
    started, then one probe every ``--loaded-interval`` at a higher priority, carrying its time,
    until ``--loaded-probes`` are sent or only a tenth of the backlog is left (so every slot is
    still busy and more jobs wait); the probes' enqueue -> start times. A probe jumps the
    backlog, so this measures how long a new job waits for a slot of saturated workers and for
    the claim that hands it over, not the length of the queue."""
    tag = f"{system}_loaded"
    n = args.runs
    dsn, sql_dsn = prepare(procs, server, system, tag, args)
    try:
        enqueue(procs, system, dsn, n, tag, args)
        ws = start_workers(procs, system, dsn, tag, args)
        for w in ws:
            w.expect("started", timeout=60)
        probes = procs.spawn(f"{tag}-probes", paced_command(
            procs, system, dsn, args.loaded_probes, args.loaded_interval, priority=1))
        ended: list[int] = []   # the backlog when the probes ended

        def watch(left: int) -> None:
            if ended:
                return
            if left <= n // 10:
                probes.send("stop")
            if left <= n // 10 or probes.proc.poll() is not None:
                ended.append(left)

        seen = wait_done(sql_dsn, system, ws, args.timeout,
                         on_poll=watch)
        sent = probes.expect("enqueued", timeout=60)
        probes.proc.wait(timeout=30)
        procs.all.remove(probes)
        reports = stop(procs, ws)
        job_side = [v for r in reports for v in r["latencies"]]
        return {"system": system, "runs": n, "interval": args.loaded_interval,
                "complete": bool(seen) and seen[-1][1] == 0, "probes": sent["count"],
                "started": len(job_side), "backlog_at_end": ended[0] if ended else 0,
                "job_side": percentiles(job_side)}
    finally:
        server.drop(sql_dsn)


LOAD_SQL = """
INSERT INTO {schema}.runs (id, namespace, tenant, workflow, input, output, status, priority,
    created_at, run_at, attempts, max_attempts, root_id, started_at, finished_at)
SELECT {prefix} || lpad(g::text, 9, '0'), 'bench', 'default', 'noop', '{{}}', {output},
       '{status}', 0, {t0} + g * 0.001, {t0} + g * 0.001, {attempts}, 3,
       {prefix} || lpad(g::text, 9, '0'), {started}, {finished}
FROM generate_series(1, {n}) AS g
"""


def load_rows(dsn: str, schema: str, finished: int, queued: int, t0: float) -> float:
    """Bulk-load ``finished`` succeeded runs (older) and ``queued`` runs (newer) in SQL, then
    ANALYZE. Returns the seconds it took."""
    start = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        if finished:
            conn.execute(LOAD_SQL.format(  # type: ignore[arg-type]
                schema=schema, prefix="'f'", output="'null'", status="succeeded", t0=t0,
                attempts=1, started=f"{t0} + g * 0.001", finished=f"{t0} + g * 0.001 + 0.01",
                n=finished))
        if queued:
            conn.execute(LOAD_SQL.format(  # type: ignore[arg-type]
                schema=schema, prefix="'q'", output="NULL", status="queued", t0=t0 + 2000,
                attempts=0, started="NULL", finished="NULL", n=queued))
        conn.execute(f"ANALYZE {schema}.runs")
    return time.perf_counter() - start


async def time_claims(stores: dict[str, str], count: int, size: int, rounds: int = 10
                      ) -> dict[str, tuple[list[float], int]]:
    """Time ``count`` claims of ``size`` runs per store, back to back, the stores taking turns
    in ``rounds`` (so that load from elsewhere on the machine falls on all of them alike), after
    5 untimed claims each. Returns, per store, the times and how many runs the claims took."""
    from shoal.stores import open_store

    opened = {name: open_store(url) for name, url in stores.items()}
    out: dict[str, tuple[list[float], int]] = {name: ([], 0) for name in stores}
    try:
        for store in opened.values():
            await store.open()
            for _ in range(5):   # warm-up: connections, plans
                await store.claim_runs(NAMESPACE, ["noop"], "claimer", size, 30.0, time.time())
        for r in range(rounds):
            for name, store in opened.items():
                times, claimed = out[name]
                for _ in range(count // rounds + (r < count % rounds)):
                    t = time.perf_counter()
                    runs = await store.claim_runs(NAMESPACE, ["noop"], "claimer", size, 30.0,
                                                  time.time())
                    times.append(time.perf_counter() - t)
                    claimed += len(runs)
                out[name] = (times, claimed)
        return out
    finally:
        for store in opened.values():
            await store.close()


async def time_stats(stores: dict[str, str], count: int, rounds: int = 10
                     ) -> dict[str, list[float]]:
    """Time ``count`` calls of ``store.stats`` per store, the stores taking turns in ``rounds``
    as in time_claims, after 3 untimed calls each."""
    from shoal.stores import open_store

    opened = {name: open_store(url) for name, url in stores.items()}
    out: dict[str, list[float]] = {name: [] for name in stores}
    try:
        for store in opened.values():
            await store.open()
            for _ in range(3):   # warm-up: connections, plans
                await store.stats(NAMESPACE, time.time())
        for r in range(rounds):
            for name, store in opened.items():
                for _ in range(count // rounds + (r < count % rounds)):
                    t = time.perf_counter()
                    await store.stats(NAMESPACE, time.time())
                    out[name].append(time.perf_counter() - t)
        return out
    finally:
        for store in opened.values():
            await store.close()


# The counts of the loaded final runs, as migration 0014 counts the runs already final in a store
# it upgrades (rows inserted by hand are not counted by the store's own statements).
COUNT_LOADED_SQL = """
INSERT INTO {schema}.run_counts (namespace, workflow, status, bucket, n)
SELECT namespace, workflow, status, floor(finished_at), count(*) FROM {schema}.runs
WHERE status IN ('succeeded', 'failed', 'cancelled')
GROUP BY namespace, workflow, status, floor(finished_at)
"""


async def fold_counts(store_url: str, dsn: str, schema: str) -> None:
    """What a store that has run a while has in run_counts for the rows loaded behind its back:
    their counts, folded by the retention service, then autovacuum's pass."""
    from shoal.stores import open_store

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(COUNT_LOADED_SQL.format(schema=schema))  # type: ignore[arg-type]
    store = open_store(store_url)
    await store.open()
    try:
        await store.fold_stats(NAMESPACE, time.time())
    finally:
        await store.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {schema}.run_counts")  # type: ignore[arg-type]


def claim_plan(store_url: str) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of the claim statement exactly as the store sends it (16
    runs), in a transaction rolled back. The statement and its parameters are taken from one
    real call, so the plan follows the store's SQL as it changes; '' if the store is built some
    other way than this expects."""
    from shoal.stores import open_store

    async def capture() -> tuple[str, dict[str, Any]] | None:
        store: Any = open_store(store_url)
        await store.open()
        seen: list[tuple[str, dict[str, Any]]] = []
        db = getattr(store, "db", None)
        real = getattr(db, "tuples", None)
        if real is None:
            await store.close()
            return None

        async def spy(query: Any, params: Any, *a: Any, **kw: Any) -> Any:
            seen.append((query, dict(params)))
            raise _Captured

        db.tuples = spy
        try:
            with contextlib.suppress(_Captured):
                await store.claim_runs(NAMESPACE, ["noop"], "explain", 16, 30.0, time.time())
        finally:
            db.tuples = real
            await store.close()
        return seen[0] if seen else None

    captured = asyncio.run(capture())
    if captured is None:
        return ""
    query, params = captured
    with psycopg.connect(with_db(store_url, urlsplit(store_url).path.lstrip("/"))) as conn:
        conn.execute("SET search_path = bench")
        rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + query, params).fetchall()  # type: ignore[operator]
        conn.rollback()
    return "\n".join(r[0] for r in rows)


class _Captured(Exception):
    pass


def claim_latency(server: Server, args: argparse.Namespace) -> list[dict[str, Any]]:
    """claim_runs over an empty table, over a small one (only the queued runs the claims take)
    and over a large one, each in its own database, measured in turns; before the claims,
    store.stats over each (the large one against a table of only its queued rows)."""
    tables = [("empty", 0, 0), ("small", 0, args.claims * 17 + 200)]
    if args.large:
        tables.append(("queued", 0, args.large_queued))
        tables.append(("large", args.large_finished, args.large_queued))
    t0 = time.time() - 86400
    rows: dict[str, dict[str, Any]] = {}
    stores: dict[str, str] = {}
    dsns: list[str] = []
    try:
        for name, finished, queued in tables:
            dsn = server.create(f"claim_{name}")
            dsns.append(dsn)
            stores[name] = f"{dsn}?schema=bench"
            asyncio.run(migrate(stores[name]))
            print(f"claim latency: loading the {name} table ({finished:,} finished + "
                  f"{queued:,} queued)...", file=sys.stderr)
            rows[name] = {"table": name, "finished": finished, "queued": queued,
                          "load_seconds": load_rows(dsn, "bench", finished, queued, t0)}
            asyncio.run(fold_counts(stores[name], dsn, "bench"))
        print("stats latency: timing...", file=sys.stderr)
        for name, times in asyncio.run(time_stats(stores, args.stats_calls)).items():
            rows[name]["stats"] = percentiles(times)
        print("claim latency: timing...", file=sys.stderr)
        for size in (1, 16):
            for name, (times, claimed) in asyncio.run(time_claims(stores, args.claims,
                                                                  size)).items():
                rows[name][f"claim_{size}"] = percentiles(times)
                rows[name][f"claimed_{size}"] = claimed
        for name, _, queued in tables:
            if queued:
                try:
                    rows[name]["plan"] = claim_plan(stores[name])
                except Exception as e:   # the plan is a diagnostic: never lose the numbers
                    rows[name]["plan"] = f"unavailable: {e!r}"
    finally:
        for dsn in dsns:
            server.drop(dsn)
    return list(rows.values())


# -- the peers' environment ------------------------------------------------------------------------


def peer_env(args: argparse.Namespace) -> dict[str, str]:
    """Make bench/.venv-peers on first use; returns, per peer, why it cannot run ('' if it can)."""
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        print(f"making {PEER_VENV} (pip install -r {PEER_REQUIREMENTS.name})...", file=sys.stderr)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(PEER_VENV)], check=True)
        # keep the environment out of git whatever .gitignore says (Python 3.13 does this itself)
        (PEER_VENV / ".gitignore").write_text("*\n")
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
                       check=False)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-r",
                        str(PEER_REQUIREMENTS)], check=False)
    reasons = {}
    for peer in PEERS:
        try:
            r = subprocess.run([str(python), "-c", f"import {peer}"], capture_output=True,
                               text=True, timeout=120)
            reasons[peer] = "" if r.returncode == 0 else (r.stderr.strip().splitlines() or
                                                          ["import failed"])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            reasons[peer] = str(e)
    return reasons


def git_commit() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=HERE,
                              capture_output=True, text=True, timeout=10).stdout.strip()
    return ""


def peer_versions() -> dict[str, str]:
    python = PEER_VENV / "bin" / "python"
    code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            f"{list(PEERS)!r} if __import__('importlib.util').util.find_spec(p)}}))")
    with contextlib.suppress(Exception):
        return json.loads(subprocess.run([str(python), "-c", code], capture_output=True,
                                         text=True, timeout=60).stdout)
    return {}


# -- output ----------------------------------------------------------------------------------------


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{1000 * s:.1f}"


def render(result: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 170)
    env = result["environment"]
    srv = env["server"]
    console.print(
        f"[bold]shoal PostgreSQL bench[/]: PostgreSQL {srv['version']} at {env['server_url']} "
        f"(fsync={srv['fsync']}, synchronous_commit={srv['synchronous_commit']}, "
        f"wal_sync_method={srv['wal_sync_method']}), Python {env['python']}, {env['cores']} "
        f"cores, shoal {env.get('shoal_commit', '')}, load average "
        f"{env['load_average_before'][0]:.2f} before, "
        f"{env.get('load_average_after', [float('nan')])[0]:.2f} after "
        f"({result.get('bench_seconds', 0):.0f} s in all); peers: "
        + ", ".join(f"{k} {v}" for k, v in env["peers"].items()))

    def table(*names: str) -> Table:
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
        for i, name in enumerate(names):
            t.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
        return t

    console.print("\n[bold]1. Commit-rate ceiling[/]: pgbench -b simple-update, "
                  f"{result['pgbench'][0]['clients'] if result['pgbench'] else '-'} clients")
    t = table("when", "TPS")
    for p in result["pgbench"]:
        t.add_row(p["when"], f"{p['tps']:,.0f}")
    console.print(t)
    ceiling = statistics.fmean([p["tps"] for p in result["pgbench"]]) if result["pgbench"] else 0

    for workflow in result["args"]["workflow"]:
        rows = [r for r in result["throughput"] if r.get("workflow", "noop") == workflow]
        if rows:
            render_throughput(console, table, result, workflow, rows, ceiling)

    console.print("\n[bold]3. Dispatch -> start latency[/]: idle workers, one enqueue every "
                  f"{1000 * result['args']['interval']:.0f} ms")
    t = table("system", "started", "p50 ms", "p90 ms", "p99 ms", "max ms", "measured as")
    for r in result["latency"]:
        if r.get("error"):
            t.add_row(r["system"], "-", "-", "-", "-", "-", r["error"][:60])
            continue
        for label, lat in (("store: started_at - created_at", r.get("store")),
                           ("job: call - enqueue call", r["job_side"])):
            if lat:
                t.add_row(r["system"], f"{r['started']}/{r['runs']}",
                          *(_ms(lat.get(k)) for k in ("p50", "p90", "p99", "max")), label)
    console.print(t)
    if result.get("loaded"):
        args = result["args"]
        console.print(f"\n[bold]3b. Dispatch -> start latency under full load[/]: {args['runs']} "
                      f"no-op jobs enqueued first, then the workers ({args['workers']} x "
                      f"{args['slots']} slots) start; one probe at a higher priority every "
                      f"{1000 * args['loaded_interval']:.0f} ms while more than a tenth of the "
                      f"backlog is left")
        t = table("system", "probes started", "backlog as they ended", "p50 ms", "p90 ms",
                  "p99 ms", "max ms")
        for r in result["loaded"]:
            if r.get("error"):
                t.add_row(r["system"], "-", "-", "-", "-", "-", r["error"][:60])
                continue
            lat = r["job_side"]
            t.add_row(r["system"], f"{r['started']}/{r['probes']}", f"{r['backlog_at_end']:,}",
                      *(_ms(lat.get(k)) for k in ("p50", "p90", "p99", "max")))
        console.print(t)
        console.print("The time from just before a probe's enqueue call to its job function's "
                      "start. Every slot is busy and the backlog waits, so a probe waits for a "
                      "slot to free and for the claim that hands it over; its priority lets it "
                      "pass the backlog, so the number is the system's, not the queue's length.")

    if result.get("claims"):
        console.print("\n[bold]4. store.claim_runs latency[/] (one process, back to back, "
                      f"{result['args']['claims']} claims each)")
        t = table("table", "finished", "queued", "claim 1 p50 ms", "p99", "claim 16 p50 ms",
                  "p99", "runs claimed 1/16", "p50 vs small 1/16", "p50 vs empty 1/16")
        by = {c["table"]: c for c in result["claims"]}

        def ratio(c: dict[str, Any], base: str) -> str:
            b = by.get(base)
            if b is None or b is c:
                return "-"
            return (f"{c['claim_1']['p50'] / b['claim_1']['p50']:.2f}x / "
                    f"{c['claim_16']['p50'] / b['claim_16']['p50']:.2f}x")

        for c in result["claims"]:
            t.add_row(c["table"], f"{c['finished']:,}", f"{c['queued']:,}",
                      _ms(c["claim_1"]["p50"]), _ms(c["claim_1"]["p99"]),
                      _ms(c["claim_16"]["p50"]), _ms(c["claim_16"]["p99"]),
                      f"{c['claimed_1']}/{c['claimed_16']}", ratio(c, "small"),
                      ratio(c, "empty"))
        console.print(t)
        console.print("empty: nothing to claim (the statement finds no row, writes nothing, "
                      "commits nothing). small: only the queued rows the claims take. queued: "
                      "only the large table's queued rows. large: rows bulk-loaded with "
                      "generate_series, then ANALYZE. The tables take turns (10 rounds), so load "
                      "from elsewhere falls on all of them alike.")
        render_stats(console, table, result)


def render_throughput(console: Any, table: Any, result: dict[str, Any], workflow: str,
                      rows: list[dict[str, Any]], ceiling: float) -> None:
    """Tables 2 and 2b of one workflow."""
    args = result["args"]
    rounds = args["repeat"]
    what = {"noop": "no-op jobs",
            "noop_flow": "no-op runs with every flow-control rule on, none binding (shoal)",
            }.get(workflow, f"runs of {STEPS} checkpointed async steps (shoal and DBOS)")
    console.print(f"\n[bold]2. Runs end to end, {workflow}[/]: {rows[0]['runs']} {what} enqueued "
                  f"first, then {args['workers']} worker processes x {args['slots']} slots; "
                  f"runs/s from the first job start to the moment no job is left (median of "
                  f"{rounds} round{'s' * (rounds != 1)})")
    bulk_sizes = args.get("bulk_batches") or []
    t = table("system", "enqueue/s", *(f"bulk {b}/s" for b in bulk_sizes), "runs/s", "range",
              "steady/s", "vs shoal", "%pgbench", "commits/run", "CPU ms/run", "server ms/run",
              "machine ms/run", "WAL B/run", "per proc", "note")
    shoal_rate = next((r["runs_per_s"] for r in rows if r["system"] == "shoal"
                       and not r.get("error")), None)
    for r in rows:
        if r.get("error"):
            t.add_row(r["system"], *["-"] * (12 + len(bulk_sizes)), r["error"][:60])
            continue
        note = "" if r["complete"] else "[red]incomplete[/]"
        if r["system"] == "shoal" and r.get("store_runs_per_s"):
            note = f"store window: {r['store_runs_per_s']:,.0f}/s " + note
        if r["system"] == "shoal" and r.get("gc"):
            note = f"gc {r['gc']}; " + note
        bulk = r.get("bulk_enqueues_per_s") or {}
        t.add_row(r["system"], f"{r['enqueues_per_s']:,.0f}",
                  *(f"{bulk[str(b)]:,.0f}" if str(b) in bulk else "-" for b in bulk_sizes),
                  f"{r['runs_per_s']:,.0f}",
                  "{:,.0f}-{:,.0f}".format(*r["runs_per_s_range"]),
                  f"{r['steady_runs_per_s']:,.0f}" if r.get("steady_runs_per_s") else "-",
                  f"{shoal_rate / r['runs_per_s']:.2f}x" if shoal_rate else "-",
                  f"{100 * r['runs_per_s'] / ceiling:.0f}%" if ceiling else "-",
                  f"{r['commits_per_run']:.2f}", f"{r['cpu_ms_per_run']:.3f}",
                  "-" if r.get("server_cpu_ms_per_run") is None
                  else f"{r['server_cpu_ms_per_run']:.3f}",
                  "-" if r.get("machine_cpu_ms_per_run") is None
                  else f"{r['machine_cpu_ms_per_run']:.3f}",
                  f"{r['wal_bytes_per_run']:,.0f}" if "wal_bytes_per_run" in r else "-",
                  "/".join(map(str, r["executed_per_worker"])),
                  note)
    console.print(t)
    console.print(
        "enqueue/s: shoal single app.dispatch calls from --dispatch-batch concurrent callers "
        f"({args['dispatch_batch']}); pgqueuer and procrastinate one batch call per 500 jobs; "
        "DBOS one client enqueue per job, 8 at a time. bulk N/s: shoal app.dispatch_many, N "
        "runs per call, one call after another (the same number of jobs, into a schema of its "
        "own). vs shoal: shoal's runs/s / this row's "
        "(>1: shoal faster). %pgbench: runs/s / "
        "pgbench TPS. steady/s: jobs/s between 10 % and 90 % done. commits/run: transactions "
        "committed in the test's database while the workers ran (pg_stat_database) / jobs. "
        "CPU ms/run: the workers' user+sys / jobs. server ms/run: the same of the server "
        "backends connected to the test's database (from /proc; '-' when the server is "
        "elsewhere). machine ms/run: the busy CPU time of the whole machine (every core, every "
        "process: workers, server, kernel, this bench's poll) while the workers ran / jobs. "
        "WAL B/run: the bytes of WAL the server wrote meanwhile / jobs. "
        "shoal's store window: first "
        "started_at to last finished_at. pgqueuer-defaults: pgqueuer's own run() defaults "
        "(batch_size 10, no cap on concurrent jobs) instead of the same slots. pgqueuer-asyncpg: "
        "pgqueuer's asyncpg driver, the same slots. DBOS polls its "
        f"queue every {args['dbos_poll']} s (its default is 1 s).")

    shoal_row = next((r for r in rows if r["system"] == "shoal" and r.get("store_calls")), None)
    if shoal_row:
        calls = shoal_row["store_calls"]
        runs = max(shoal_row["executed"], 1)
        console.print(f"\n[bold]2b. Where shoal's workers wait, {workflow}[/] (same round): "
                      "store calls per run, and their wall time from call to answer (pool wait "
                      "included)")
        t = table("call", "calls/run", "runs claimed/call", "runs settled/call", "ms/call",
                  "ms/run")
        for name in STORE_CALLS:
            c = calls.get(name)
            if not c or not c["calls"]:
                continue
            t.add_row(name, f"{c['calls'] / runs:.2f}",
                      f"{c['rows'] / c['calls']:.2f}" if "claim" in name else "-",
                      f"{c['settled'] / c['calls']:.2f}" if "settled" in c else "-",
                      f"{1000 * c['seconds'] / c['calls']:.2f}",
                      f"{1000 * c['seconds'] / runs:.2f}")
        console.print(t)
        console.print("settle_and_claim: the settlements queued since the last batch, and the "
                      "claim of as many runs as they leave slots free, in one statement. "
                      "claim_runs: a claim alone, for slots freed otherwise (at start, after a "
                      "wake-up). load_steps: one read per run that has run before (none here). "
                      "settle_run: a settlement alone (none here). checkpoint_step: a step's "
                      "checkpoint (batched with other runs'). Wall time from call to "
                      "answer, pool wait included.")


def render_stats(console: Any, table: Any, result: dict[str, Any]) -> None:
    timed = [c for c in result["claims"] if c.get("stats")]
    if not timed:
        return
    console.print(f"\n[bold]5. store.stats latency[/] (one process, back to back, "
                  f"{result['args']['stats_calls']} calls each, before the claims)")
    t = table("table", "finished", "queued", "p50 ms", "p90", "p99", "p50 vs queued")
    base = next((c for c in timed if c["table"] == "queued"), None)
    for c in timed:
        ratio = (f"{c['stats']['p50'] / base['stats']['p50']:.2f}x"
                 if base is not None and c is not base else "-")
        t.add_row(c["table"], f"{c['finished']:,}", f"{c['queued']:,}", _ms(c["stats"]["p50"]),
                  _ms(c["stats"]["p90"]), _ms(c["stats"]["p99"]), ratio)
    console.print(t)
    console.print("Each table's counts of final runs (run_counts) folded by fold_stats and "
                  "vacuumed first, as the retention service and autovacuum leave them. The "
                  "queued runs are counted row by row (through the partial indexes): the cost "
                  "follows the live runs, not the finished ones.")


# -- main ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get(
        "SHOAL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="a database on the server to connect to for CREATE/DROP DATABASE "
             "(default $SHOAL_BENCH_PG or postgresql://postgres@127.0.0.1:5432/postgres)")
    parser.add_argument("--runs", type=int, default=10000,
                        help="jobs per throughput test (and backlog of the loaded latency test)")
    parser.add_argument("--workflow", default="noop",
                        help="workflows of the throughput test, comma separated: noop (no-op "
                             "jobs, every system), steps5 (5 checkpointed async steps per run: "
                             "shoal and DBOS), noop_flow (no-op runs of a workflow with every "
                             "flow-control rule on, none binding: shoal); default noop")
    parser.add_argument("--steps-runs", type=int,
                        help="runs per steps5 throughput test (default: --runs)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--slots", type=int, default=16,
                        help="concurrent jobs per worker process, every system (default 16)")
    parser.add_argument("--repeat", type=int, default=3, help="throughput rounds (median)")
    parser.add_argument("--store-options", default="", metavar="QUERY",
                        help="more options of shoal's store URL, e.g. 'pool_max_size=20'")
    parser.add_argument("--dispatch-batch", type=int, default=50,
                        help="concurrent callers of shoal's single app.dispatch while filling "
                             "the queue (default 50)")
    parser.add_argument("--bulk-batches", default="100,1000",
                        help="shoal dispatch_many batch sizes whose enqueue rate the throughput "
                             "test also measures, comma separated ('' for none)")
    parser.add_argument("--latency-runs", type=int, default=200,
                        help="jobs of the idle latency test (default 200)")
    parser.add_argument("--interval", type=float, default=0.02,
                        help="seconds between the idle latency test's jobs (default 0.02)")
    parser.add_argument("--loaded-probes", type=int, default=200,
                        help="high-priority probes of the loaded latency test at most "
                             "(default 200)")
    parser.add_argument("--loaded-interval", type=float, default=0.005,
                        help="seconds between the loaded latency test's probes (default 0.005)")
    parser.add_argument("--dbos-poll", type=float, default=0.01,
                        help="DBOS queue polling interval, seconds (default 0.01)")
    parser.add_argument("--no-pgqueuer-defaults", dest="pgqueuer_defaults", action="store_false",
                        help="skip the extra throughput row of pgqueuer with its own defaults "
                             "(batches of 10, no cap on concurrent jobs)")
    parser.add_argument("--pgbench-seconds", type=float, default=5.0)
    parser.add_argument("--pgbench-clients", type=int, default=2)
    parser.add_argument("--claims", type=int, default=200,
                        help="claims of 1 and of 16 runs timed per table (default 200)")
    parser.add_argument("--stats-calls", type=int, default=50,
                        help="store.stats calls timed per table (default 50)")
    parser.add_argument("--no-large", dest="large", action="store_false",
                        help="skip the 1,000,000 + 100,000 row claim test (about a minute)")
    parser.add_argument("--large-finished", type=int, default=1_000_000)
    parser.add_argument("--large-queued", type=int, default=100_000)
    parser.add_argument("--peers", default=",".join(PEERS),
                        help="peers to run, comma separated ('' for none)")
    parser.add_argument("--only", default="pgbench,throughput,latency,claims",
                        help="parts to run, comma separated (latency: idle and loaded)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    parser.add_argument("--profile", metavar="DIR",
                        help="run each shoal worker under cProfile: DIR/<worker>.prof")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--instance-id", help=argparse.SUPPRESS)
    parser.add_argument("--paced", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--priority", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.bulk_batches = [int(b) for b in args.bulk_batches.split(",") if b]
    args.workflow = [w for w in args.workflow.split(",") if w]
    if unknown := set(args.workflow) - set(WORKFLOWS):
        parser.error(f"--workflow: unknown {', '.join(sorted(unknown))}; choose from "
                     f"{', '.join(WORKFLOWS)}")
    if args.steps_runs is None:
        args.steps_runs = args.runs

    if args.worker:
        shoal_worker(args)
        return 0
    if args.paced is not None:
        shoal_paced(args)
        return 0

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    parts = set(args.only.split(","))
    peers = [p for p in args.peers.split(",") if p]
    tmp = Path(tempfile.mkdtemp(prefix="shoal-pgbench-")).resolve()
    profile = Path(args.profile).resolve() if args.profile else None
    if profile:
        profile.mkdir(parents=True, exist_ok=True)
    procs = Processes(tmp, profile)
    server = Server(args.url)
    result: dict[str, Any] = {"args": vars(args), "started_at": time.time(),
                              "pgbench": [], "throughput": [], "latency": [], "loaded": [],
                              "claims": []}
    began = time.perf_counter()
    try:
        reasons = peer_env(args) if peers else {}
        result["environment"] = {
            "server_url": with_db(args.url, ""), "server": server.facts(),
            "python": platform.python_version(), "platform": platform.platform(),
            "cores": os.cpu_count(), "shoal": shoal.__version__, "shoal_commit": git_commit(),
            "peers": peer_versions() if peers else {}, "peer_unavailable": reasons,
            "load_average_before": os.getloadavg(), "logs": str(tmp),
        }
        if "pgbench" in parts:
            print("pgbench before...", file=sys.stderr)
            result["pgbench"].append(pgbench(server, args.pgbench_seconds, args.pgbench_clients,
                                             "before"))
        systems = ["shoal", *peers]
        if "throughput" in parts:
            if "pgqueuer" in peers and args.pgqueuer_defaults:
                systems.insert(systems.index("pgqueuer") + 1, "pgqueuer-defaults")
            if "pgqueuer" in peers:
                systems.insert(systems.index("pgqueuer") + 1, "pgqueuer-asyncpg")
            tests = [(workflow, system) for workflow in args.workflow for system in systems
                     if system in (RUNS_WORKFLOW[workflow] or systems)]
            trials: dict[tuple[str, str], list[dict[str, Any]]] = {t: [] for t in tests}
            errors: dict[tuple[str, str], str] = {}
            for workflow, system in tests:
                if reasons.get(system.split("-")[0]):
                    errors[workflow, system] = f"not installed: {reasons[system.split('-')[0]]}"
            # Rounds of every test rather than one test repeated: load from elsewhere on the
            # machine then falls on every system alike.
            for rep in range(1, args.repeat + 1):
                for workflow, system in tests:
                    if (workflow, system) in errors:
                        continue
                    print(f"throughput {rep}/{args.repeat}: {workflow}, {system}...",
                          file=sys.stderr)
                    try:
                        trials[workflow, system].append(
                            throughput(procs, server, system, workflow, args, rep))
                    except Exception as e:   # one system failing never loses the others
                        procs.close()
                        errors[workflow, system] = str(e).strip().splitlines()[-1][:300]
                        print(f"  {system} failed: {e}", file=sys.stderr)
            for workflow, system in tests:
                ranked = sorted(trials[workflow, system], key=lambda t: t["runs_per_s"])
                if not ranked:
                    result["throughput"].append({
                        "system": system, "workflow": workflow,
                        "error": errors.get((workflow, system), "no result")})
                    continue
                median = dict(ranked[(len(ranked) - 1) // 2])
                median["runs_per_s_range"] = [ranked[0]["runs_per_s"], ranked[-1]["runs_per_s"]]
                median["trials"] = ranked
                result["throughput"].append(median)
        if "latency" in parts:
            for system in systems:
                if system.endswith(("-defaults", "-asyncpg")):
                    continue
                if reasons.get(system):
                    result["latency"].append({"system": system, "error": reasons[system]})
                    continue
                print(f"latency: {system}...", file=sys.stderr)
                try:
                    result["latency"].append(latency(procs, server, system, args))
                except Exception as e:   # one system failing never loses the others
                    procs.close()
                    result["latency"].append({"system": system,
                                              "error": str(e).strip().splitlines()[-1][:300]})
            for system in PRIORITIES:
                peer = system.split("-")[0]
                if peer != "shoal" and peer not in peers:
                    continue
                if reasons.get(peer):
                    result["loaded"].append({"system": system, "error": reasons[peer]})
                    continue
                print(f"loaded latency: {system}...", file=sys.stderr)
                try:
                    result["loaded"].append(loaded_latency(procs, server, system, args))
                except Exception as e:   # one system failing never loses the others
                    procs.close()
                    result["loaded"].append({"system": system,
                                             "error": str(e).strip().splitlines()[-1][:300]})
        if "claims" in parts:
            try:
                result["claims"] = claim_latency(server, args)
            except Exception as e:
                print(f"claim latency failed: {e!r}", file=sys.stderr)
                result["claims_error"] = repr(e)
        if "pgbench" in parts:
            print("pgbench after...", file=sys.stderr)
            result["pgbench"].append(pgbench(server, args.pgbench_seconds, args.pgbench_clients,
                                             "after"))
        result["environment"]["load_average_after"] = os.getloadavg()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        procs.close()
        server.close()
        if args.json:   # whatever was measured, even if a part failed
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
    result["bench_seconds"] = time.perf_counter() - began
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    render(result)
    if result.get("claims_error"):
        print(f"claim latency failed: {result['claims_error']}", file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
