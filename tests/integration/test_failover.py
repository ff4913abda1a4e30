"""Failover to a promoted standby: two worker processes over a PostgreSQL primary and its
synchronous standby, named in one URL as a libpq host list with
``target_session_attrs=read-write``; the primary is killed with SIGKILL while runs flow, the
standby is promoted (``pg_ctl promote``) and the workers must follow it by themselves.

The test builds the pair itself (``initdb``, then ``pg_basebackup`` of the running primary)
under a temporary directory, on free ports, as the ``postgres`` user when run as root, with the
binaries ``test_postgres_processes._pg_bin`` finds (``SHOAL_TEST_PG_BIN``, ``pg_config``,
``/usr/lib/postgresql/*/bin``). Without them it skips with a message, except under ``CI``, where
it fails. ``failover_app.py`` is the worker: its steps log their side effects, its store logs
every checkpoint and settlement the server acknowledged. ``FAILOVER_SEED`` replays a plan;
``FAILOVER_DOWN`` sets how long no primary exists (default: the lease + 0.5 s, so the leases of
the runs in flight lapse meanwhile).

Checked afterwards, from the rows and the log: every acknowledged dispatch is a run, and every
run succeeded, once (invariants 2, 5); no acknowledged checkpoint or settlement was lost, and a
step ran again only under a later claim when its checkpoint was never acknowledged (3); no two
executions of a run overlapped in time, and no two runs of a concurrency key (1, 11, 4); both
workers executed steps before the kill and after the promotion, and listen (LISTEN) on the new
primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import failover_app
import psycopg
import pytest
import test_postgres_processes as tp  # Cluster, _pg_bin, _listeners
import test_sqlite_processes as sq  # check_invariants, fake_run, fake_history
from backends import skip_or_fail
from harness import Processes, read_log, wait_all_final, wait_until

import shoal

HERE = Path(__file__).resolve().parent
FAILOVER_APP = HERE / "failover_app.py"
STANDBY_NAME = "shoal_standby"   # the standby's application_name: synchronous_standby_names


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a postmaster's backends and helpers)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            # the name (2nd field) may hold spaces: the parent is the 2nd field after its ")"
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry))
    return found


class Server(tp.Cluster):
    """``tp.Cluster`` made a primary with a synchronous standby, or that standby."""

    def query(self, text: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(text.encode())   # not a LiteralString: the test's own SQL
            return cur.fetchall() if cur.description else []

    def init_standby(self, primary: Server) -> None:
        """A base backup of the running ``primary``, started as its streaming standby."""
        self._run("pg_basebackup", "-D", str(self.data), "-h", "127.0.0.1", "-p",
                  str(primary.port), "-U", "postgres", "-X", "stream", "-c", "fast",
                  "--no-sync")
        self.start_guard()
        signal_file = self.data / "standby.signal"
        signal_file.touch()
        with contextlib.suppress(OSError):   # as root: the server's user owns its files
            stat = self.data.stat()
            os.chown(signal_file, stat.st_uid, stat.st_gid)
        self.configure_and_start(
            f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres "
            f"application_name={STANDBY_NAME}'\nhot_standby = on\n")

    def make_synchronous(self, timeout: float = 30.0) -> None:
        """Commits on this primary wait for the standby to have flushed them."""
        self.query(f"ALTER SYSTEM SET synchronous_standby_names TO '{STANDBY_NAME}'")
        self.query("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        while self.query("SELECT sync_state FROM pg_stat_replication WHERE application_name = "
                         f"'{STANDBY_NAME}'") != [("sync",)]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby is not synchronous after {timeout}s\n"
                                   f"{self.log_tail()}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the postmaster and every process of it at once, as a machine dies: no
        shutdown, no goodbye to the clients or the standby."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGSTOP)   # it starts no new process while its own are found
        pids = [postmaster, *_children(postmaster)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in pids):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the primary's processes {pids} outlived SIGKILL")
            time.sleep(0.02)
        # dead for good: never started again (it would be a second primary), never stopped
        (self.data / "postmaster.pid").unlink()

    def cut_replication(self, primary: Server, timeout: float = 30.0) -> None:
        """This standby stops receiving the primary's WAL (it stays a standby): what the
        primary commits from now on, it never gets."""
        self.query("ALTER SYSTEM SET primary_conninfo TO ''")
        self.query("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        while primary.query("SELECT 1 FROM pg_stat_replication"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby still streams after {timeout}s")
            time.sleep(0.05)

    def promote(self) -> None:
        self._run("pg_ctl", "promote", "-D", str(self.data), "-w", "-t", "30")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "Z"


@contextlib.contextmanager
def _pair(synchronous: bool) -> Iterator[tuple[Server, Server]]:
    """A primary and its standby, each in a temporary directory on a free port; stopped and
    removed afterwards whatever happened (by guard processes should the test process die)."""
    bindir = tp._pg_bin()
    if bindir is None:
        skip_or_fail("initdb/pg_ctl/pg_basebackup not found; set SHOAL_TEST_PG_BIN to "
                     "PostgreSQL's bin directory to run the failover test")
    assert bindir is not None
    if not (bindir / "pg_basebackup").is_file():
        skip_or_fail(f"no pg_basebackup in {bindir}: the failover test needs it")
    primary, standby = Server(bindir), Server(bindir)
    try:
        primary.init()
        standby.init_standby(primary)
        if synchronous:
            primary.make_synchronous()
        yield primary, standby
    finally:
        try:
            standby.destroy()
        finally:
            primary.destroy()


@pytest.fixture
def pair() -> Iterator[tuple[Server, Server]]:
    """A primary and its synchronous standby."""
    with _pair(synchronous=True) as servers:
        yield servers


@pytest.fixture
def async_pair() -> Iterator[tuple[Server, Server]]:
    """A primary and its asynchronous standby (PostgreSQL's default)."""
    with _pair(synchronous=False) as servers:
        yield servers


# -- the checks (pure functions of the rows and the log, so they can be shown to fail) -------------


def check_failover(runs: list[Any], steps: dict[str, list[Any]],
                   records: list[dict[str, Any]]) -> tuple[list[str], dict[str, int]]:
    """What a failover must not break beyond ``sq.check_invariants``: an acknowledged
    checkpoint or settlement is never lost (the step or run never executed again after it),
    a run is acknowledged succeeded at most once, and no two executions of a run overlap."""
    problems: list[str] = []
    stats: Counter[str] = Counter()
    by_id = {r.id: r for r in runs}
    rows = {(run_id, s.seq): s for run_id, got in steps.items() for s in got}
    starts: dict[tuple[str, int], list[int]] = defaultdict(list)   # step -> epochs started
    latest: dict[str, int] = defaultdict(int)                       # run -> latest epoch started
    for rec in records:
        if rec["kind"] == "start":
            starts[(rec["run"], int(rec["step"].rpartition(":")[2]))].append(rec["epoch"])
            latest[rec["run"]] = max(latest[rec["run"]], rec["epoch"])

    for rec in records:
        if rec["kind"] == "ack":
            where = (rec["run"], rec["seq"])
            row = rows.get(where)
            if row is None or not row.finished or row.epoch != rec["epoch"]:
                problems.append(f"acknowledged checkpoint {where} at epoch {rec['epoch']} was "
                                f"lost: the store has {row}")
            again = [e for e in starts[where] if e > rec["epoch"]]
            if again:
                problems.append(f"step {where}, acknowledged at epoch {rec['epoch']}, ran again "
                                f"at epochs {again}")
            stats["acknowledged checkpoints"] += 1
    settled = Counter(rec["run"] for rec in records
                      if rec["kind"] == "settled" and rec["status"] == "succeeded")
    for rec in records:
        if rec["kind"] != "settled":
            continue
        run = by_id.get(rec["run"])
        if run is None or run.status.value != rec["status"] or run.lease_epoch != rec["epoch"]:
            problems.append(f"acknowledged settlement of {rec['run']} ({rec['status']} at epoch "
                            f"{rec['epoch']}) was lost: the store has "
                            f"{None if run is None else (run.status.value, run.lease_epoch)}")
        if latest[rec["run"]] > rec["epoch"]:
            problems.append(f"run {rec['run']}, acknowledged {rec['status']} at epoch "
                            f"{rec['epoch']}, executed again at epoch {latest[rec['run']]}")
    for run_id, count in settled.items():
        if count > 1:
            problems.append(f"run {run_id} was acknowledged succeeded {count} times")
    stats["acknowledged settlements"] = sum(settled.values())

    # invariants 1 and 11: one execution (epoch) of a run at a time, from its first step's
    # start to its last step's end or cancellation
    spans: dict[str, dict[int, list[float]]] = defaultdict(dict)
    for rec in records:
        if rec["kind"] in ("start", "end", "abort") and rec["run"] in by_id:
            begin = rec["t"] if rec["kind"] == "start" else rec["start"]
            end = rec["end"] if rec["kind"] == "end" else rec["t"]
            span = spans[rec["run"]].setdefault(rec["epoch"], [begin, end])
            span[0], span[1] = min(span[0], begin), max(span[1], end)
    for run_id, by_epoch in spans.items():
        ordered = sorted(by_epoch.items())
        latest_end, latest_epoch = ordered[0][1][1], ordered[0][0]
        for epoch, (begin, end) in ordered[1:]:
            if begin < latest_end:
                problems.append(f"run {run_id}: epoch {epoch} began at {begin:.3f} while epoch "
                                f"{latest_epoch} executed until {latest_end:.3f}")
            if end > latest_end:
                latest_end, latest_epoch = end, epoch
        stats["executions"] += len(ordered)
    return problems, dict(stats)


def _acks(steps: dict[str, list[Any]], epoch: int = 1) -> list[dict[str, Any]]:
    return [{"kind": "ack", "run": run_id, "seq": s.seq, "name": s.name, "epoch": epoch}
            for run_id, got in steps.items() for s in got]


def test_the_failover_checks_catch_violations() -> None:
    """Each check fails on a history that breaks it (so none is vacuous)."""
    run = sq.fake_run("a", None, lease_epoch=1)
    steps, lines = sq.fake_history("a", None, 0.0)
    settled = {"kind": "settled", "run": "a", "epoch": 1, "status": "succeeded"}
    good = [*lines, *_acks({"a": steps}), settled]
    assert check_failover([run], {"a": steps}, good) == ([], {
        "acknowledged checkpoints": 4, "acknowledged settlements": 1, "executions": 1})

    def problems(runs: list[Any] = [run], got: list[Any] = steps,   # noqa: B006
                 records: list[dict[str, Any]] = good) -> list[str]:
        return check_failover(runs, {"a": got}, records)[0]

    # an acknowledged checkpoint missing, or replaced by a later execution's
    assert any("was lost" in p for p in problems(got=steps[:3]))
    later = [*steps[:3], SimpleNamespace(**{**vars(steps[3]), "epoch": 2})]
    assert any("was lost" in p for p in problems(got=later))
    # an acknowledged step that ran again under a later claim
    again = {**lines[6], "epoch": 2, "t": 10.0}
    assert any("ran again" in p for p in problems(records=[*good, again]))
    # but a step whose checkpoint was never acknowledged may run again
    unacked = [r for r in good if r["kind"] != "settled" and
               not (r["kind"] == "ack" and r["seq"] == 4)]
    assert problems(records=[*unacked, again]) == []
    # an acknowledged settlement lost (the run ran again) or given twice
    assert any("settlement" in p for p in problems(
        runs=[sq.fake_run("a", None, lease_epoch=2)]))
    assert any("2 times" in p for p in problems(records=[*good, settled]))
    # two executions of one run at once: epoch 2 retrying the last step while epoch 1 runs it
    overlap = {**lines[6], "epoch": 2, "t": 3.2}
    assert any("while epoch 1" in p for p in problems(records=[*unacked, overlap]))
    # a cancellation ends an execution too: epoch 1 cancelled at 3.4, epoch 2 at 3.2
    cut = [r for r in unacked if not (r["kind"] == "end" and r["n"] == 3)]
    cancelled = {**lines[6], "kind": "abort", "start": 3.0, "t": 3.4}
    assert any("while epoch 1" in p for p in problems(records=[*cut, cancelled, overlap]))
    assert problems(records=[*cut, cancelled, {**overlap, "t": 3.5}]) == []


# -- the test with real servers and processes ---------------------------------------------------


def make_plan(rng: random.Random, n_runs: int, n_keys: int) -> list[dict[str, Any]]:
    plan = []
    for i in range(n_runs):
        inp: dict[str, Any] = {"i": i}
        if rng.random() < 0.6:
            inp["key"] = f"k{rng.randrange(n_keys)}"
        if rng.random() < 0.3:
            inp["sleep"] = round(rng.uniform(0.05, 0.3), 3)
        plan.append({"workflow": "chaos", "input": inp, "idempotency_key": f"idem-{i}"})
    return plan


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_workers_follow_a_promoted_synchronous_standby(
    tmp_path: Path, pair: tuple[Server, Server]
) -> None:
    """2 workers, 80 runs (steps, durable sleeps, concurrency keys, an idempotency key each)
    dispatched in a stream; once half of them are dispatched and steps are checkpointed, the
    primary is killed (SIGKILL), and ``down`` seconds later the standby is promoted. The stream
    goes on meanwhile: a dispatch that fails is dispatched again (its idempotency key makes that
    safe)."""
    primary, standby = pair
    seed = int(os.environ.get("FAILOVER_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (set FAILOVER_SEED to replay the plan)")
    rng = random.Random(seed)
    n_runs, n_workers, lease, schema = 80, 2, 2.0, "shoal_failover"
    down = float(os.environ.get("FAILOVER_DOWN", lease + 0.5))
    url = (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
           f"?target_session_attrs=read-write&connect_timeout=3&schema={schema}")
    log = tmp_path / "effects.log"
    plan = make_plan(rng, n_runs, n_keys=8)
    procs = Processes(tmp_path, FAILOVER_APP, "FAILOVER",
                      {"FAILOVER_STORE": url, "FAILOVER_LOG": str(log),
                       "FAILOVER_LEASE": str(lease), "FAILOVER_DRAIN": "10",
                       "FAILOVER_MAX_LIFE": "170"})
    app = failover_app.make_app(url, lease=lease)
    acknowledged: dict[str, str] = {}   # idempotency key -> the run id dispatch returned
    redispatched = 0

    async def dispatch(call: dict[str, Any]) -> None:
        nonlocal redispatched
        deadline = time.monotonic() + 60 + down
        while True:
            try:
                run = await app.dispatch(call["workflow"], call["input"],
                                         idempotency_key=call["idempotency_key"])
                acknowledged[call["idempotency_key"]] = run.id
                return
            except Exception as e:
                if time.monotonic() > deadline:
                    raise AssertionError(f"cannot dispatch for 60 s after the failover: {e}") \
                        from e
                redispatched += 1
                await asyncio.sleep(0.2)

    async def stream() -> None:
        for i, call in enumerate(plan):
            await dispatch(call)
            if i % 4 == 3:
                await asyncio.sleep(0.1)

    async def checkpointed(n: int) -> bool:
        return sum(1 for r in read_log(log) if r["kind"] == "ack") >= n

    try:
        async with app.open():   # migrates the schema before the workers open it
            for n in range(n_workers):
                procs.start_worker(f"w{n}")
            await procs.wait_started(log)
            began = time.time()
            streaming = asyncio.create_task(stream())
            try:
                async def halfway() -> bool:
                    return len(acknowledged) >= n_runs // 2 and await checkpointed(20)
                await wait_until(halfway, 60, "half of the runs dispatched, 20 checkpoints")
                killed_at = time.time()
                await asyncio.to_thread(primary.kill)
                await asyncio.sleep(down)
                await asyncio.to_thread(standby.promote)
                promoted_at = time.time()
                await streaming
            finally:
                streaming.cancel()
                with contextlib.suppress(BaseException):
                    await streaming
            assert standby.query("SELECT pg_is_in_recovery()") == [(False,)]
            runs = await wait_all_final(app.store, failover_app.NAMESPACE, n_runs, timeout=90)
            finished = time.time()

            # the workers' LISTEN connections followed too (one each, on the new primary)
            async def listening() -> bool:
                conns = await tp._listeners(standby.url, schema)
                return conns[f"shoal-listen {schema}"] == n_workers
            await wait_until(listening, 20, f"{n_workers} LISTEN connections on the standby")

            codes = procs.stop_workers()
            assert all(code == 0 for code in codes.values()), (codes, procs.stderr_tail())
            steps = {r.id: await app.store.load_steps(r.id) for r in runs}
        await app.store.close()
        records = read_log(log)

        # every acknowledged dispatch is a run, and there is no other
        assert len(acknowledged) == n_runs
        assert {r.id for r in runs} == set(acknowledged.values())
        problems, stats = sq.check_invariants(runs, steps, records)
        more, failover_stats = check_failover(runs, steps, records)
        problems += more

        # the kill caught steps in flight: started before it, never acknowledged before it
        acked_before = {(r["run"], r["seq"], r["epoch"]) for r in records
                        if r["kind"] == "ack" and r["t"] < killed_at}
        in_flight = [r for r in records if r["kind"] == "start" and r["t"] < killed_at and
                     (r["run"], int(r["step"].rpartition(":")[2]), r["epoch"])
                     not in acked_before]
        pids_before = {r["pid"] for r in records if r["kind"] == "start" and r["t"] < killed_at}
        pids_after = {r["pid"] for r in records if r["kind"] == "start" and r["t"] > promoted_at}
        events = Counter(r["event"] for r in records if r["kind"] == "event")
        print(f"killed at {killed_at - began:.1f}s, promoted {promoted_at - killed_at:.1f}s "
              f"later, all final {finished - promoted_at:.1f}s after; {len(in_flight)} steps in "
              f"flight at the kill; {redispatched} dispatches retried; {stats}; "
              f"{failover_stats}; events {dict(events)}; attempts "
              f"{sorted(Counter(r.attempts for r in runs).items())}")
        assert not problems, "\n".join(problems[:30])
        assert in_flight, "the kill caught no step in flight"
        assert len(pids_before) == n_workers, f"steps ran in {pids_before} before the kill"
        assert len(pids_after) == n_workers, \
            f"only {pids_after} ran steps after the promotion: a worker did not follow it"
        assert events["worker.exited"] == n_workers, "a worker exited before its SIGTERM"
    except BaseException:
        print(procs.stderr_tail(40))
        print(primary.log_tail(15))
        print(standby.log_tail(30))
        raise
    finally:
        procs.cleanup()


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_what_asynchronous_replication_loses(async_pair: tuple[Server, Server]) -> None:
    """With asynchronous replication, what the primary acknowledged last may be missing on
    the promoted standby, as docs/postgres.md says: a lost checkpoint runs its step again, a
    lost dispatch is gone (``get_run`` raises UnknownRunError, and dispatching its idempotency
    key again makes a new run). Made certain here: the standby stops receiving WAL (as a
    standby lagging behind would) before the commits that are to be lost."""
    primary, standby = async_pair
    schema, lease = "shoal_async", 2.0
    url = (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
           f"?target_session_attrs=read-write&connect_timeout=3&schema={schema}")
    ran: Counter[str] = Counter()
    cut, promoted = asyncio.Event(), asyncio.Event()
    app = shoal.App("async-loss", store=url, lease=lease)

    async def mark(name: str) -> str:
        ran[name] += 1
        return name

    @app.workflow(name="three", max_attempts=5)
    async def three(ctx: shoal.RunContext, input: dict[str, Any]) -> list[str]:
        first = await ctx.step("first", mark, "first")
        await cut.wait()
        second = await ctx.step("second", mark, "second")
        await promoted.wait()   # the first execution is aborted here, its lease lost
        return [first, second, await ctx.step("third", mark, "third")]

    async def on_standby(run_id: str) -> int:
        try:
            rows = standby.query(f"SELECT count(*) FROM {schema}.steps WHERE run_id = '{run_id}'")
        except psycopg.errors.UndefinedTable:   # the schema is not replayed there yet
            return 0
        return int(rows[0][0])

    async def checkpoints(run_id: str) -> list[str]:
        return [s.name for s in await app.store.load_steps(run_id)]

    try:
        async with app:
            run = await app.dispatch("three", {}, idempotency_key="run-1")
            await wait_until(lambda: on_standby(run.id), 30, "the first step on the standby")
            await asyncio.to_thread(standby.cut_replication, primary)
            cut.set()

            async def second_checkpointed() -> bool:
                return await checkpoints(run.id) == ["first", "second"]
            await wait_until(second_checkpointed, 30, "the second step checkpointed")
            later = await app.dispatch("three", {}, idempotency_key="run-2", delay=3600)
            assert (await app.get_run(later.id)).status == "queued"   # acknowledged

            await asyncio.to_thread(primary.kill)
            await asyncio.sleep(lease + 0.5)
            await asyncio.to_thread(standby.promote)
            promoted.set()

            assert await app.result(run.id, timeout=60) == ["first", "second", "third"]
            assert ran == {"first": 1, "second": 2, "third": 1}, ran
            with pytest.raises(shoal.UnknownRunError):
                await app.get_run(later.id)
            again = await app.dispatch("three", {}, idempotency_key="run-2", delay=3600)
            assert again.id != later.id
            await app.cancel(again.id)
    except BaseException:
        print(primary.log_tail(15))
        print(standby.log_tail(30))
        raise
