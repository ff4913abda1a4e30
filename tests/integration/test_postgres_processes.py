"""Several worker processes over one PostgreSQL schema: killed with SIGKILL, frozen with SIGSTOP
past their lease, and (on a private cluster this test starts itself) the server stopped and
started again under load. Then the same invariants as over SQLite are checked from the rows and
from the log of side effects (``proc_app.py`` is the worker, ``harness.py`` holds the processes
and the chaos monkey, ``test_sqlite_processes.py`` the plan and the checks, reused here as they
are).

Checked after the chaos: every run succeeded (invariant 2); no finished step started again under
a later claim, every step has one checkpoint written by the one execution at its epoch (3); no two
runs of one concurrency key overlapped in time (4); one run per idempotency key (5). After a
restart of the server, every worker has its LISTEN connection back and a dispatch reaches an idle
worker without waiting for a poll.

The shared server is ``SHOAL_TEST_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/test``);
each test uses a schema of its own, dropped afterwards. The restart test runs ``initdb`` and
``pg_ctl`` from ``SHOAL_TEST_PG_BIN`` (default: ``pg_config --bindir``, then
``/usr/lib/postgresql/*/bin``, then ``PATH``), as the ``postgres`` user when run as root. Without a
server or the binaries the tests skip with a message, except under ``CI``, where they fail.
``PROC_SEED`` replays a plan (and the chaos schedule); ``PROC_PG_DOWN`` sets how long the first
outage of the restart test lasts (default: the lease + 0.5 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import pwd
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import proc_app
import psycopg
import pytest
import test_sqlite_processes as sq  # make_plan, check_invariants
from backends import postgres_schema, skip_or_fail
from harness import Monkey, Processes, read_log, wait_all_final, wait_until

HERE = Path(__file__).resolve().parent
PROC_APP = HERE / "proc_app.py"
SLOTS = 8   # max_concurrent_runs of a worker (proc_app.make_app)


NAMESPACE = proc_app.NAMESPACE


def _with_query(url: str, **options: str) -> str:
    parts = urlsplit(url)
    pairs = [*parse_qsl(parts.query), *options.items()]
    return urlunsplit(parts._replace(query=urlencode(pairs)))


@pytest.fixture
def schema_url() -> Iterator[str]:
    """A store URL on the shared server with a schema of its own, dropped afterwards."""
    with postgres_schema("shoal_p_") as url:
        yield url


# -- 1. kill -9 and SIGSTOP over the shared server ---------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_kill9_and_frozen_workers_over_one_postgres_schema(
    tmp_path: Path, schema_url: str
) -> None:
    """3 workers; 1000 runs with steps, durable sleeps, failures, concurrency and idempotency
    keys (each idempotency key dispatched by this process and by another one at once);
    meanwhile a worker is killed (SIGKILL, then restarted) or frozen past its lease (SIGSTOP,
    later SIGCONT: it comes back as a zombie the store must fence out)."""
    seed = int(os.environ.get("PROC_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (set PROC_SEED to replay the plan and the chaos schedule)")
    rng = random.Random(seed)
    n_runs, n_idem, n_workers, lease = 1000, 100, 3, 2.0
    log = tmp_path / "effects.log"
    app = proc_app.make_app(schema_url)
    plan = sq.make_plan(rng, n_runs, n_keys=20, n_idem=n_idem)
    calls = [*plan, *plan[:n_idem]]
    rng.shuffle(calls)
    procs = Processes(tmp_path, PROC_APP, "PROC",
                      {"PROC_STORE": schema_url, "PROC_LOG": str(log), "PROC_LEASE": str(lease),
                       "PROC_DRAIN": "5", "PROC_MAX_LIFE": "260"})
    monkey = Monkey(procs, rng, max_events=30)
    try:
        async with app.open():   # migrates the schema before the workers open it
            for n in range(n_workers):
                procs.start_worker(f"w{n}")
            monkey.start()
            other = procs.spawn(["dispatch"], "dispatcher", pipe=True)
            others = asyncio.create_task(asyncio.to_thread(
                other.communicate, json.dumps(plan[:n_idem]).encode(), 60))
            returned: dict[str, set[str]] = defaultdict(set)
            ids: set[str] = set()
            for i, call in enumerate(calls):
                if i == len(calls) * 9 // 10:
                    # the chaos asked for below (7 events, ~9 s on average, 16 s at worst) while
                    # runs still flow: on a fast machine every run may be final sooner (10-15 s
                    # seen with 11-16 events, under load 30-40 s with 25-30); the last tenth
                    # waits for it, which costs nothing when the chaos is ahead
                    await monkey.reached(kills=5, freezes=2, timeout=30.0)
                run = await app.dispatch(call["workflow"], call["input"],
                                         idempotency_key=call["idempotency_key"])
                ids.add(run.id)
                if call["idempotency_key"] is not None:
                    returned[call["idempotency_key"]].add(run.id)
                if i % 20 == 19:
                    await asyncio.sleep(0.1)
            dispatched = time.monotonic() - monkey.began
            out, _ = await others
            assert other.returncode == 0, procs.stderr_tail()
            for call, run_id in zip(plan[:n_idem], json.loads(out), strict=True):
                returned[call["idempotency_key"]].add(run_id)
            assert len(ids) == n_runs
            assert all(len(v) == 1 for v in returned.values()), \
                {k: v for k, v in returned.items() if len(v) != 1}

            try:
                runs = await wait_all_final(app.store, NAMESPACE, n_runs, timeout=150)
            finally:
                await asyncio.to_thread(monkey.stop)
            finished = time.monotonic() - monkey.began
            await procs.wait_started(log)
            codes = procs.stop_workers()
            assert all(code == 0 for code in codes.values()), (codes, procs.stderr_tail())

            assert {r.id for r in runs} == ids
            steps = {r.id: await app.store.load_steps(r.id) for r in runs}
        records = read_log(log)
        problems, stats = sq.check_invariants(runs, steps, records)
        events = Counter(r["event"] for r in records if r["kind"] == "event")
        chaos = monkey.chaos
        kills = sum(1 for c in chaos if c.what == "kill")
        print(f"dispatched in {dispatched:.1f}s, all final at {finished:.1f}s; chaos "
              f"{[(round(c.t, 1), c.what) for c in chaos]}; {stats}; events {dict(events)}; "
              f"attempts {sorted(Counter(r.attempts for r in runs).items())}; workers that "
              f"exited by themselves {monkey.exited}")
        assert not problems, "\n".join(problems[:30])
        assert kills >= 5 and len(chaos) - kills >= 2, "too little chaos while runs flowed"
        assert stats.get("re-executed steps", 0) <= SLOTS * len(chaos) + events["lease.lost"]
        assert stats.get("keyed runs", 0) > n_runs // 2
        assert monkey.exited == [], "a worker exited by itself"
    except BaseException:
        print(procs.stderr_tail())
        raise
    finally:
        monkey.halt.set()
        if monkey.is_alive():
            monkey.join(timeout=30)
        procs.cleanup()


# -- 2. a private cluster stopped and started again under load ----------------------------------


def _pg_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``."""
    candidates = []
    if os.environ.get("SHOAL_TEST_PG_BIN"):
        candidates.append(os.environ["SHOAL_TEST_PG_BIN"])
    if shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            candidates.append(subprocess.run(["pg_config", "--bindir"], capture_output=True,
                                             text=True, timeout=10).stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                         key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit()
                         else 0, reverse=True)
    if shutil.which("initdb"):
        candidates.append(str(Path(shutil.which("initdb") or "").parent))
    for c in candidates:
        if c and (Path(c) / "initdb").is_file() and (Path(c) / "pg_ctl").is_file():
            return Path(c)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Runs in a process of its own: once the test process is gone (even killed), stop the cluster
# and remove its directory. argv: test pid, pg_ctl command prefix (JSON), data dir, base dir.
_GUARD = """
import json, os, shutil, subprocess, sys, time
parent, prefix, data, base = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
while os.getppid() == parent:
    time.sleep(0.3)
if os.path.exists(os.path.join(data, "postmaster.pid")):
    subprocess.run([*prefix, "stop", "-D", data, "-m", "immediate", "-w", "-t", "30"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
shutil.rmtree(base, ignore_errors=True)
"""


class Cluster:
    """A throwaway PostgreSQL cluster in a temporary directory, on a free port, listening on
    127.0.0.1 only (its socket in its own directory), fsync off (synchronous_commit on). As
    root, its binaries run as the ``postgres`` user (the server refuses to run as root)."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.prefix: list[str] = []
        user = None
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                skip_or_fail("running as root and no 'postgres' user to run initdb/pg_ctl as")
        self.base = Path(tempfile.mkdtemp(prefix="shoal-pg-"))
        self.data = self.base / "data"
        self.logfile = self.base / "server.log"
        self.port = 0
        self.guard: subprocess.Popen[bytes] | None = None
        self.restarts: list[tuple[str, float, float]] = []   # (mode, down at, up at), epoch s
        if user is not None:
            os.chown(self.base, user.pw_uid, user.pw_gid)
            runuser = shutil.which("runuser")
            self.prefix = ([runuser, "-u", "postgres", "--"] if runuser
                           else ["su", "postgres", "-s", "/bin/sh", "-c", 'exec "$0" "$@"'])

    def _run(self, tool: str, *args: str, timeout: float = 60) -> str:
        cmd = [*self.prefix, str(self.bindir / tool), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, cwd=self.base)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n"
                               f"{done.stderr}\n{self.log_tail()}")
        return done.stdout

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
                  "--no-sync", "--no-instructions")
        self.start_guard()
        self.configure_and_start()

    def start_guard(self) -> None:
        """The guard process that stops the cluster and removes its directory should the test
        process die."""
        self.guard = subprocess.Popen(
            [sys.executable, "-c", _GUARD, str(os.getpid()),
             json.dumps([*self.prefix, str(self.bindir / "pg_ctl")]), str(self.data),
             str(self.base)],
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)

    def configure_and_start(self, extra: str = "") -> None:
        """Append the settings (a free port, ``extra``) to postgresql.conf and start; another
        port when the one picked was taken meanwhile."""
        for attempt in range(3):
            self.port = _free_port()
            with (self.data / "postgresql.conf").open("a") as f:
                f.write(f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                        f"unix_socket_directories = '{self.base}'\nmax_connections = 100\n"
                        # fsync off only risks an OS crash; synchronous_commit stays on, or
                        # an immediate stop (a crash of the server) loses acknowledged commits
                        "fsync = off\nfull_page_writes = off\n"
                        f"logging_collector = off\n{extra}")
            try:
                self.start()
                return
            except RuntimeError:
                if attempt == 2:
                    raise

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        self._run("pg_ctl", "start", "-D", str(self.data), "-l", str(self.logfile), "-w",
                  "-t", "30")

    def stop(self, mode: str) -> None:
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", mode, "-w", "-t", "30")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.logfile.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "--- server.log\n" + "\n".join(text[-lines:])

    def destroy(self) -> None:
        try:
            if self.running():
                self.stop("immediate")
        finally:
            if self.guard is not None:
                with contextlib.suppress(ProcessLookupError):
                    self.guard.kill()
                self.guard.wait(timeout=10)
            shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    bindir = _pg_bin()
    if bindir is None:
        skip_or_fail("initdb/pg_ctl not found; set SHOAL_TEST_PG_BIN to PostgreSQL's bin "
                      "directory to run the restart test")
    assert bindir is not None
    c = Cluster(bindir)
    try:
        c.init()
        yield c
    finally:
        c.destroy()


async def _listeners(url: str, schema: str) -> Counter[str]:
    """The store's connections on the server, by application name."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity "
            "WHERE application_name LIKE %s GROUP BY 1", (f"% {schema}",))
        return Counter({name: n for name, n in await cur.fetchall()})


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_server_restarts_under_load(tmp_path: Path, cluster: Cluster) -> None:
    """3 workers over a private cluster; 600 runs (steps, sleeps, failures, concurrency keys,
    each with an idempotency key) dispatched in a stream; the server is stopped (``-m fast``,
    then ``-m immediate``: a crash) and started again twice while runs flow and while the
    stream goes on (a dispatch that fails is dispatched again: its idempotency key makes that
    safe). Afterwards every run finishes, the invariants hold, every worker listens again and
    an idle worker starts a new run at once (NOTIFY), not at its next poll."""
    seed = int(os.environ.get("PROC_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (set PROC_SEED to replay the plan)")
    rng = random.Random(seed)
    n_runs, n_workers, lease, schema = 600, 3, 2.0, "shoal_restart"
    # the first outage lasts past the lease: the leases of the runs in flight expire meanwhile
    down = float(os.environ.get("PROC_PG_DOWN", lease + 0.5))
    url = _with_query(cluster.url, schema=schema, connect_timeout="3")
    log = tmp_path / "effects.log"
    app = proc_app.make_app(url)
    plan = sq.make_plan(rng, n_runs, n_keys=20, n_idem=n_runs)
    calls = [*plan, *rng.sample(plan, 100)]   # 100 idempotency keys dispatched twice
    rng.shuffle(calls)
    procs = Processes(tmp_path, PROC_APP, "PROC",
                      {"PROC_STORE": url, "PROC_LOG": str(log), "PROC_LEASE": str(lease),
                       "PROC_DRAIN": "5", "PROC_MAX_LIFE": "230"})
    began = time.monotonic()
    redispatched = 0

    async def dispatch(call: dict[str, Any]) -> str:
        nonlocal redispatched
        deadline = time.monotonic() + 60 + 3 * down
        while True:
            try:
                run = await app.dispatch(call["workflow"], call["input"],
                                         idempotency_key=call["idempotency_key"])
                return str(run.id)
            except Exception as e:
                if time.monotonic() > deadline:
                    raise AssertionError(f"cannot dispatch until {deadline}: {e}") from e
                redispatched += 1
                await asyncio.sleep(0.2)

    async def restart(mode: str, down: float) -> None:
        at = time.time()
        await asyncio.to_thread(cluster.stop, mode)
        await asyncio.sleep(down)
        await asyncio.to_thread(cluster.start)
        cluster.restarts.append((mode, at, time.time()))

    try:
        async with app.open():
            for n in range(n_workers):
                procs.start_worker(f"w{n}")
            await procs.wait_started(log)
            returned: dict[str, set[str]] = defaultdict(set)

            async def stream() -> None:
                for i, call in enumerate(calls):
                    returned[call["idempotency_key"]].add(await dispatch(call))
                    if i % 10 == 9:
                        await asyncio.sleep(0.05)

            streaming = asyncio.create_task(stream())
            try:
                await asyncio.sleep(2.5)
                await restart("fast", down)
                await asyncio.sleep(4.0)
                await restart("immediate", 1.0)
                await streaming
            finally:
                streaming.cancel()
                with contextlib.suppress(BaseException):
                    await streaming
            dispatched = time.monotonic() - began
            assert all(len(v) == 1 for v in returned.values()), \
                {k: v for k, v in returned.items() if len(v) != 1}
            ids = {next(iter(v)) for v in returned.values()}
            assert len(ids) == n_runs

            runs = await wait_all_final(app.store, NAMESPACE, n_runs, timeout=90 + 2 * down)
            finished = time.monotonic() - began
            assert {r.id for r in runs} == ids

            # every worker listens again (one LISTEN connection each) and an idle worker
            # starts a fresh run at once: dispatch one at a time, the start follows the NOTIFY
            async def listening() -> bool:
                conns = await _listeners(cluster.url, schema)
                return conns[f"shoal-listen {schema}"] == n_workers
            await wait_until(listening, 15, f"{n_workers} LISTEN connections again")
            latencies = []
            offset = log.stat().st_size
            for i in range(20):
                at = time.time()
                probe = await app.dispatch("chaos", {"i": n_runs + i, "probe": True})
                probe_start = None
                while probe_start is None and time.time() - at < 10:
                    await asyncio.sleep(0.005)
                    with log.open("rb") as f:   # only the lines written since
                        f.seek(offset)
                        fresh = f.read()
                    offset += fresh.rfind(b"\n") + 1
                    lines = [json.loads(x) for x in fresh.split(b"\n")[:-1]]
                    probe_start = next((r["t"] for r in lines
                                        if r["kind"] == "start" and r["run"] == probe.id), None)
                assert probe_start is not None, f"probe run {probe.id} did not start in 10 s"
                latencies.append(probe_start - at)
            runs = await wait_all_final(app.store, NAMESPACE, n_runs + 20, timeout=30)

            codes = procs.stop_workers()
            assert all(code == 0 for code in codes.values()), (codes, procs.stderr_tail())
            steps = {r.id: await app.store.load_steps(r.id) for r in runs}
        records = read_log(log)
        problems, stats = sq.check_invariants(runs, steps, records)
        events = Counter(r["event"] for r in records if r["kind"] == "event")
        p50 = statistics.median(latencies)
        # how long after the server was back a step started again (work was waiting)
        starts = sorted(r["t"] for r in records if r["kind"] == "start" and r["run"] in ids)
        resumed = []
        for mode, down_at, up_at in cluster.restarts:
            after = [t for t in starts if t > up_at]
            resumed.append((mode, round(up_at - down_at, 1),
                            round(after[0] - up_at, 2) if after else None))
        print(f"dispatched in {dispatched:.1f}s ({redispatched} dispatches retried), all final "
              f"at {finished:.1f}s; restarts (mode, down for, first step after up in s) "
              f"{resumed}; {stats}; events {dict(events)}; attempts "
              f"{sorted(Counter(r.attempts for r in runs).items())}; dispatch->start after "
              f"the restarts p50 {p50 * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms")
        assert not problems, "\n".join(problems[:30])
        assert len(cluster.restarts) == 2
        assert events["worker.exited"] == n_workers, "a worker exited before its SIGTERM"
        # the engine also kicks itself every second and polls every lease/3: a start within
        # 50 ms at the median is the NOTIFY's doing
        assert p50 < 0.05, f"dispatch->start p50 {p50:.3f}s after the restarts: no NOTIFY?"
        # the instances reconnect soon after the server is back, whatever the outage lasted
        assert all(r is None or r < 6.0 for _, _, r in resumed), resumed
    except BaseException:
        print(procs.stderr_tail(40))
        print(cluster.log_tail())
        raise
    finally:
        procs.cleanup()
