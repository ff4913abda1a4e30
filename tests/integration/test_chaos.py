"""Chaos, all at once: 3 worker processes (``chaos_app.py``, the real ``SystemClock``, lease 3 s)
over a private PostgreSQL server (the test restarts it: never the shared one), each through a
proxy of its own that can cut a partition (``blackhole.py``; all of them, so that none is the
slowest to claim every time). While runs with steps (in threads and async), durable sleeps,
signals, approvals, child runs, concurrency keys and idempotency keys flow, a seeded random
schedule (printed; ``CHAOS_SEED`` replays it) does, one after another, each to the worker with
the most steps in flight:

- ``kill``: SIGKILL a worker, and start it again;
- ``freeze``: SIGSTOP a worker for longer than the lease and a poll, then SIGCONT;
- ``restart``: stop the server the way a crash does (``pg_ctl stop -m immediate``) and start it
  again, after an outage of up to the lease and a second;
- ``partition``: a worker in a long step (5 s or more) is cut off: its proxy holds its
  bytes (nothing is refused or reset) for longer than the lease, until another worker has
  taken over one of its runs, then delivers them.

The test signals the runs that wait for a signal, answers every approval, and dispatches some
idempotency keys twice; orders flow for as long as the chaos lasts, and a few after. Then every
run must end; the worker cut off last, alone, runs one more (it serves on after a partition);
and every invariant of DESIGN.md that applies
is checked from the rows and the log (``check_chaos``, which ``test_the_chaos_checks_catch_
violations`` shows failing on histories that break each one):

- 2: every run succeeded, with the output its signals, approvals and children make;
- 3: no step ran again once checkpointed (or once its checkpoint was acknowledged), and every
  checkpoint is the output of the one execution at its epoch; no acknowledged write was lost;
- 1, 11: no two executions of a run overlap: every side effect of an execution comes before the
  first one of any later execution of the run. One exception can be neither prevented nor
  fenced: a worker frozen past its lease knows nothing of the time that passed until its event
  loop turns again after SIGCONT, and its watchdog (due at the lease's end less
  ``DRIFT_MARGIN``) aborts the run at that first turn. A step's thread or task can make its
  next side effect in that instant: at most ``LATE_PER_STEP`` lines per step, within
  ``LATE_WINDOW`` s of the SIGCONT, are counted (``late effects``), never more, and never from a
  worker that was not frozen (a partitioned worker stops before its lease ends);
- 4: no two runs of a concurrency key execute at once; 5: an idempotency key is one run (a
  second dispatch returns the first), and a parent has one child per ``start_child``;
- 6: the signal and the decision a run got are the ones sent, once;
- attempts are bounded: no run used more than one attempt per chaos event, plus one.

The summary is one line: ``chaos: seed=… kills=… freezes=… restarts=… partitions=… re-run
steps=… late effects=… runs=… ok``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import chaos_app
import pytest
import test_postgres_processes as tp  # Cluster, _pg_bin
from backends import skip_or_fail
from blackhole import Blackhole
from harness import Processes, read_log, wait_all_final, wait_until

import shoal

HERE = Path(__file__).resolve().parent
LEASE = 3.0
PACE = 0.8            # seconds between two dispatches while the chaos goes on
TAIL = 8              # orders dispatched after the last event
TWICE = 6             # every 6th order's idempotency key is dispatched again, 3 orders later
LATE_WINDOW = 3.0     # seconds after a SIGCONT in which a late side effect is told apart
LATE_PER_STEP = 2     # late side effects of one step's execution, at most
EFFECTS = ("start", "effect", "end")   # the lines that are side effects
LONG = 100            # effects of a long step, at least (5 s: more than the lease)


@pytest.fixture
def cluster() -> Iterator[tp.Cluster]:
    """A private PostgreSQL server (never the shared one: the test restarts it)."""
    bindir = tp._pg_bin()
    if bindir is None:
        skip_or_fail("initdb/pg_ctl not found; set SHOAL_TEST_PG_BIN to PostgreSQL's bin "
                     "directory to run the chaos test")
    assert bindir is not None
    c = tp.Cluster(bindir)
    try:
        c.init()
        yield c
    finally:
        c.destroy()


# -- the plan -----------------------------------------------------------------------------------


def make_plan(rng: random.Random, n: int = 400) -> list[dict[str, Any]]:
    """The orders to dispatch (as many of them as the chaos lasts), each with an idempotency
    key of its own."""
    plan = []
    for i in range(n):
        inp: dict[str, Any] = {"i": i, "effects": [rng.randint(4, 16) for _ in range(3)],
                               "part_effects": [rng.randint(4, 16) for _ in range(2)]}
        if rng.random() < 0.12:   # a step that outlasts the lease (5-7.5 s), in a thread or not
            inp["effects"][rng.randrange(2)] = rng.randint(LONG, LONG * 3 // 2)
        if rng.random() < 0.5:
            inp["key"] = f"k{rng.randrange(6)}"
        if rng.random() < 0.3:
            inp["sleep"] = round(rng.uniform(0.3, 2.5), 2)
        if rng.random() < 0.3:
            inp["signal"] = True
        if rng.random() < 0.25:
            inp["approval"] = True
        if rng.random() < 0.3:
            inp["children"] = rng.randint(1, 3)
        plan.append({"input": inp, "idempotency_key": f"order-{i}"})
    return plan


def make_schedule(rng: random.Random) -> list[tuple[float, str]]:
    """(pause before it, what) for each chaos event: at least one of each kind."""
    kinds = ["kill", "kill", "freeze", "restart", "partition",
             *rng.choices(["kill", "freeze", "restart", "partition"], k=3)]
    rng.shuffle(kinds)
    return [(round(rng.uniform(3.0, 6.0), 1), what) for what in kinds]


# -- the checks (pure functions of the rows and the log, so they can be shown to fail) -----------


@dataclass
class Expected:
    """What the test did that the checks compare the rows with."""
    returned: dict[str, set[str]]             # idempotency key -> the run ids dispatch returned
    inputs: dict[str, dict[str, Any]]         # idempotency key -> the order's input
    signals: dict[str, Any]                   # run id -> the payload sent
    freezes: list[tuple[int, float, float]]   # (pid, SIGSTOP at, SIGCONT at)
    events: int                               # chaos events


def expected_steps(run: Any, children: list[Any]) -> list[str]:
    """The names of a run's checkpoints, in order."""
    if run.workflow == "part":
        return ["load", "store"]
    inp = run.input
    names = ["fetch", "write"]
    names += ["shoal.sleep"] if inp.get("sleep") else []
    names += ["shoal.wait_for:go"] if inp.get("signal") else []
    names += ["shoal.approval:ship"] if inp.get("approval") else []
    names += ["shoal.start_child:part"] * len(children)
    names += [f"shoal.child:{c.id}" for c in children]
    return [*names, "notify"]


def check_runs(runs: list[Any], steps: dict[str, list[Any]],
               expected: Expected) -> list[str]:
    """Invariants 2, 5 and 6, from the rows: every run succeeded once, with the output its
    signal, its approval and its children make; one run per idempotency key; one child per
    ``start_child``; the checkpoints a replay must find."""
    problems: list[str] = []
    by_id = {r.id: r for r in runs}
    for key, ids in expected.returned.items():
        if len(ids) != 1:
            problems.append(f"idempotency key {key} was answered with runs {sorted(ids)}")
    orders = {r.id for r in runs if r.workflow == "order"}
    dispatched = {i for ids in expected.returned.values() for i in ids}
    if orders != dispatched:
        problems.append(f"runs of 'order' {sorted(orders ^ dispatched)[:5]}… are not the ones "
                        f"dispatch returned")
    idem = Counter((r.tenant, r.workflow, r.idempotency_key) for r in runs
                   if r.idempotency_key is not None)
    problems += [f"idempotency key {k} has {n} runs" for k, n in idem.items() if n != 1]
    children: dict[str, list[Any]] = defaultdict(list)
    for r in runs:
        if r.workflow == "part":
            if r.parent_id not in by_id or r.root_id != r.parent_id:
                problems.append(f"child {r.id} has parent {r.parent_id}, root {r.root_id}")
            children[r.parent_id].append(r)
    for r in runs:
        if r.status.value != "succeeded":
            problems.append(f"run {r.id} ({r.workflow}) ended {r.status.value}: {r.error}")
            continue
        kids = sorted(children.get(r.id, []), key=lambda c: c.input["k"])
        got = [s.name for s in steps.get(r.id, [])]
        if got != expected_steps(r, kids) or not all(s.finished for s in steps.get(r.id, [])):
            problems.append(f"run {r.id}: checkpoints {got}, expected "
                            f"{expected_steps(r, kids)}, all finished")
        if r.workflow == "part":
            continue
        inp = r.input
        if inp != expected.inputs.get(r.idempotency_key):
            problems.append(f"run {r.id}: input {inp} is not the one dispatched")
        if [c.input["k"] for c in kids] != list(range(inp.get("children", 0))):
            problems.append(f"run {r.id} has children {[c.input for c in kids]}, expected "
                            f"{inp.get('children', 0)}")
        out = r.output
        if inp.get("signal") and out.get("signal") != expected.signals.get(r.id):
            problems.append(f"run {r.id} got signal {out.get('signal')}, sent "
                            f"{expected.signals.get(r.id)}")
        decision = {"approved": True, "data": {"for": r.id}, "by": "chaos-test"}
        if inp.get("approval") and out.get("decision") != decision:
            problems.append(f"run {r.id} got decision {out.get('decision')}, not {decision}")
        if inp.get("children") and out.get("children") != [c.output for c in kids]:
            problems.append(f"run {r.id}: children's outputs {out.get('children')} are not "
                            f"theirs")
    return problems


def check_steps(runs: list[Any], steps: dict[str, list[Any]], records: list[dict[str, Any]],
                stats: Counter[str]) -> list[str]:
    """Invariant 3: a step never starts again once checkpointed, is executed once by the
    execution (epoch) that checkpointed it, and that execution's output is the checkpoint; an
    acknowledged checkpoint is in the store at its epoch (none was lost)."""
    problems: list[str] = []
    rows = {(run_id, s.seq): s for run_id, got in steps.items() for s in got}
    lines: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    known = {r.id for r in runs}
    for rec in records:
        if rec["kind"] in ("start", "effect", "end", "abort"):
            if rec["run"] not in known:
                problems.append(f"a side effect of an unknown run: {rec}")
                continue
            lines[rec["run"], rec["seq"]].append(rec)
    for where, recs in sorted(lines.items()):
        cp = rows.get(where)
        if cp is None or cp.name != recs[0]["name"]:
            problems.append(f"step {where} ({recs[0]['name']}) ran, its checkpoint is {cp}")
            continue
        starts = Counter(rec["epoch"] for rec in recs if rec["kind"] == "start")
        later = sorted(e for e in starts if e > cp.epoch)
        if later:
            problems.append(f"step {where} checkpointed at epoch {cp.epoch} ran again at "
                            f"epochs {later}")
        if starts[cp.epoch] != 1:
            problems.append(f"step {where} started {starts[cp.epoch]} times at the epoch that "
                            f"checkpointed it ({cp.epoch})")
        writers = [rec for rec in recs if rec["kind"] == "end" and rec["epoch"] == cp.epoch]
        if len(writers) != 1 or cp.output.get("epoch") != cp.epoch or \
                writers[0]["pid"] != cp.output.get("pid"):
            problems.append(f"step {where}: checkpoint {cp.output} at epoch {cp.epoch} is not "
                            f"the output of the one execution at its epoch: {writers}")
        earlier = [e for e in starts if e < cp.epoch]
        if earlier:
            stats["re-run steps"] += 1
            stats["re-executions"] += len(earlier)
    for run_id, got in steps.items():
        for s in got:
            if not s.name.startswith("shoal.") and (run_id, s.seq) not in lines:
                problems.append(f"step {(run_id, s.seq)} ({s.name}) is checkpointed, never ran")
    for rec in records:
        if rec["kind"] == "ack":
            stats["acknowledged checkpoints"] += 1
            cp = rows.get((rec["run"], rec["seq"]))
            if cp is None or not cp.finished or cp.epoch != rec["epoch"]:
                problems.append(f"checkpoint {(rec['run'], rec['seq'])} acknowledged at epoch "
                                f"{rec['epoch']} was lost: the store has {cp}")
    return problems


def late_lines(records: list[dict[str, Any]]) -> dict[int, float]:
    """The side effects (by index in ``records``) made by an execution of a run after a later
    execution of that run had made its first: id -> the first one's time."""
    first: dict[tuple[str, int], float] = {}
    for rec in records:
        if rec["kind"] in EFFECTS:
            where = (rec["run"], rec["epoch"])
            first[where] = min(first.get(where, rec["t"]), rec["t"])
    newer: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for (run_id, epoch), t in first.items():
        newer[run_id].append((epoch, t))
    late: dict[int, float] = {}
    for i, rec in enumerate(records):
        if rec["kind"] in EFFECTS:
            after = [t for e, t in newer[rec["run"]] if e > rec["epoch"]]
            if after and min(after) < rec["t"]:
                late[i] = min(after)
    return late


def check_overlaps(runs: list[Any], records: list[dict[str, Any]], expected: Expected,
                   stats: Counter[str]) -> list[str]:
    """Invariants 1 and 11 (no two executions of a run at once, a cut-off worker stops before
    its lease ends) with the one exception of a worker frozen past its lease (see the module's
    docstring), then invariant 4 (no two runs of a concurrency key at once) over the side
    effects that are not late."""
    problems: list[str] = []
    late = late_lines(records)
    per_step: Counter[tuple[str, int, int]] = Counter()
    for i, newer_began in sorted(late.items()):
        rec = records[i]
        thawed = [c for pid, s, c in expected.freezes if pid == rec["pid"] and s < newer_began
                  and c <= rec["t"] <= c + LATE_WINDOW]
        where = (rec["run"], rec["seq"], rec["epoch"])
        per_step[where] += 1
        if not thawed:
            problems.append(f"run {rec['run']}: epoch {rec['epoch']} made a side effect at "
                            f"{rec['t']:.3f} ({rec['kind']} of step {rec['seq']}, pid "
                            f"{rec['pid']}), after a later execution began at {newer_began:.3f}")
        elif per_step[where] == LATE_PER_STEP + 1:
            problems.append(f"step {where} made more than {LATE_PER_STEP} side effects after "
                            f"its worker was thawed and a later execution had begun")
        stats["late effects"] += 1
    by_id = {r.id: r for r in runs}
    spans: dict[str, list[float]] = {}
    for i, rec in enumerate(records):
        if rec["kind"] in EFFECTS and i not in late and rec["run"] in by_id:
            span = spans.setdefault(rec["run"], [rec["t"], rec["t"]])
            span[0], span[1] = min(span[0], rec["t"]), max(span[1], rec["t"])
    by_key: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for run_id, (begin, end) in spans.items():
        if by_id[run_id].concurrency_key is not None:
            by_key[by_id[run_id].concurrency_key].append((begin, end, run_id))
    for key, intervals in by_key.items():
        intervals.sort()
        held_until, holder = intervals[0][1], intervals[0][2]
        for begin, end, run_id in intervals[1:]:
            if begin < held_until:
                problems.append(f"key {key}: run {run_id} began at {begin:.3f} while run "
                                f"{holder} held it until {held_until:.3f}")
            if end > held_until:
                held_until, holder = end, run_id
        stats["keyed runs"] += len(intervals)
    return problems


def check_chaos(runs: list[Any], steps: dict[str, list[Any]], records: list[dict[str, Any]],
                expected: Expected) -> tuple[list[str], Counter[str]]:
    """Every problem found (none: every invariant held) and a few counts."""
    stats: Counter[str] = Counter()
    problems = check_runs(runs, steps, expected)
    problems += check_steps(runs, steps, records, stats)
    problems += check_overlaps(runs, records, expected, stats)
    for r in runs:
        if r.attempts > 1 + expected.events:
            problems.append(f"run {r.id} used {r.attempts} attempts for {expected.events} "
                            f"chaos events")
    return problems, stats


# -- the checks' own test ---------------------------------------------------------------------


def _fake(run_id: str, workflow: str, inp: dict[str, Any], names: list[str], t0: float,
          epoch: int = 1, **changes: Any) -> tuple[Any, list[Any], list[dict[str, Any]]]:
    """A succeeded run whose steps ``names`` ran once at ``epoch``, a second apart from
    ``t0``: its row, its checkpoints and its log lines."""
    steps, lines = [], []
    for seq, name in enumerate(names, 1):
        out = {"name": name, "effects": 1, "pid": 7, "epoch": epoch}
        steps.append(SimpleNamespace(seq=seq, name=name, finished=True, epoch=epoch, output=out))
        if name.startswith("shoal."):
            continue
        base = {"run": run_id, "seq": seq, "name": name, "epoch": epoch, "pid": 7}
        t = t0 + seq
        lines += [{**base, "kind": "start", "t": t}, {**base, "kind": "effect", "n": 0,
                                                        "t": t + 0.1},
                  {**base, "kind": "end", "t": t + 0.2},
                  {"kind": "ack", "run": run_id, "seq": seq, "name": name, "epoch": epoch,
                   "pid": 7, "t": t + 0.3}]
    row = SimpleNamespace(**{
        "id": run_id, "workflow": workflow, "tenant": "default", "input": inp,
        "status": SimpleNamespace(value="succeeded"), "error": None, "attempts": epoch,
        "output": {"steps": [s.output for s in steps if not s.name.startswith("shoal.")]},
        "concurrency_key": inp.get("key"), "idempotency_key": f"order-{inp.get('i')}",
        "parent_id": None, "root_id": run_id, **changes})
    return row, steps, lines


def test_the_chaos_checks_catch_violations() -> None:
    """Each check fails on a history that breaks it (so none is vacuous)."""
    a_in = {"i": 0, "key": "k", "signal": True, "children": 1}
    b_in = {"i": 1, "key": "k", "approval": True}
    child, c_steps, c_lines = _fake("c", "part", {"k": 0}, ["load", "store"], 1.0,
                                    idempotency_key="a:child", parent_id="a", root_id="a")
    child.output = {"k": 0}
    a, a_steps, a_lines = _fake("a", "order", a_in, ["fetch", "write", "shoal.wait_for:go",
                                                     "shoal.start_child:part", "shoal.child:c",
                                                     "notify"], 0.0)
    a.output.update(signal={"for": "a"}, children=[{"k": 0}])
    b, b_steps, b_lines = _fake("b", "order", b_in, ["fetch", "write", "shoal.approval:ship",
                                                     "notify"], 10.0)
    b.output["decision"] = {"approved": True, "data": {"for": "b"}, "by": "chaos-test"}
    runs = [a, b, child]
    steps = {"a": a_steps, "b": b_steps, "c": c_steps}
    lines = [*a_lines, *b_lines, *c_lines]

    def expected(**changes: Any) -> Expected:
        return Expected(**{"returned": {"order-0": {"a"}, "order-1": {"b"}},
                           "inputs": {"order-0": a_in, "order-1": b_in},
                           "signals": {"a": {"for": "a"}}, "freezes": [], "events": 1,
                           **changes})

    def problems(runs: list[Any] = runs, steps: dict[str, list[Any]] = steps,
                 lines: list[dict[str, Any]] = lines, **changes: Any) -> list[str]:
        return check_chaos(runs, steps, lines, expected(**changes))[0]

    assert problems() == []

    def changed(run: Any, **changes: Any) -> list[Any]:
        return [SimpleNamespace(**{**vars(r), **changes}) if r is run else r for r in runs]

    # 2: a run failed; its output is not its signal, decision or children's
    assert any("ended failed" in p for p in problems(
        changed(b, status=SimpleNamespace(value="failed"))))
    assert any("got signal" in p for p in problems(signals={"a": {"for": "b"}}))
    assert any("got decision" in p for p in problems(
        changed(b, output={**b.output, "decision": {"approved": False}})))
    assert any("children's outputs" in p for p in problems(
        changed(a, output={**a.output, "children": [{"k": 1}]})))
    # 5: a second dispatch answered with another run; a second run for a key; a child missing
    assert any("answered with" in p for p in problems(returned={"order-0": {"a", "x"},
                                                                "order-1": {"b"}}))
    assert any("has 2 runs" in p for p in problems(
        changed(b, idempotency_key="order-0")))
    assert any("has children" in p for p in problems([a, b]))
    # 3: a checkpoint missing; a checkpointed step run again; an acknowledged one lost
    assert any("checkpoints" in p for p in problems(steps={**steps, "b": b_steps[:3]}))
    again = {**a_lines[0], "epoch": 2, "t": 20.0}
    assert any("ran again" in p for p in problems(lines=[*lines, again]))
    lost = {**a_lines[3], "epoch": 2}
    assert any("was lost" in p for p in problems(lines=[*lines, lost]))
    # ... but a step that never got its checkpoint runs again, as a re-run step
    rerun = [{**r, "epoch": 0, "t": r["t"] - 0.5} for r in a_lines[:2]]
    assert problems(lines=[*rerun, *lines]) == []
    assert check_chaos(runs, steps, [*rerun, *lines], expected())[1]["re-run steps"] == 1
    # 1, 11: epoch 0 went on after epoch 1 began (1.0)
    overlap = {**a_lines[1], "epoch": 0, "pid": 8, "t": 1.2}
    assert any("after a later execution" in p for p in problems(lines=[*rerun, *lines,
                                                                        overlap]))
    # ... unless its worker was frozen before and thawed just then, once or twice per step
    frozen = [(8, 0.8, 1.15)]
    assert problems(lines=[*rerun, *lines, overlap], freezes=frozen) == []
    assert any("more than" in p for p in problems(
        lines=[*rerun, *lines, overlap, {**overlap, "t": 1.3}, {**overlap, "t": 1.4}],
        freezes=frozen))
    assert any("after a later execution" in p for p in problems(
        lines=[*rerun, *lines, {**overlap, "t": 1.15 + LATE_WINDOW + 1}], freezes=frozen))
    # 4: b began while a held their key
    early = [{**r, "t": r["t"] - 9} for r in b_lines]
    assert any("while run a held it" in p for p in problems(lines=[*a_lines, *early,
                                                                   *c_lines]))
    # attempts beyond one per chaos event
    assert any("attempts" in p for p in problems(changed(b, attempts=3)))


# -- the test with a real server and processes ------------------------------------------------


@dataclass
class Event:
    what: str
    began: float                   # time.time()
    ended: float = 0.0
    slot: str | None = None
    pid: int | None = None
    in_flight: int = 0             # steps in flight where it struck, when it struck
    taken_over: int = 0            # runs of a cut-off worker claimed by another meanwhile
    note: str = ""


@dataclass
class Chaos:
    """The schedule's events, done one after another, on the test's event loop. Each worker
    reaches the server through a proxy of its own (``proxies``, by slot), so that none is
    slower than the others to claim and any can be cut off. Kills spare the worker cut off
    last, so that it is there to serve again at the end."""
    procs: Processes
    cluster: tp.Cluster
    proxies: dict[str, Blackhole]
    app: shoal.App
    log: Path
    rng: random.Random
    env: dict[str, dict[str, str]]     # slot -> its workers' environment
    events: list[Event] = field(default_factory=list)
    freezes: list[tuple[int, float, float]] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    cut: str | None = None             # the slot cut off last
    _open: dict[tuple[str, int, int, int], int] = field(default_factory=dict)   # -> count
    _read: int = 0

    def in_flight(self, long: bool = False) -> list[tuple[str, int, int]]:
        """(run, epoch, pid) of each step started and not yet ended or aborted (the log read
        from where the last call stopped); with ``long``, of the long steps only."""
        with self.log.open("rb") as f:
            f.seek(self._read)
            fresh = f.read()
        fresh = fresh[:fresh.rfind(b"\n") + 1]
        self._read += len(fresh)
        for line in fresh.splitlines():
            rec = json.loads(line)
            if rec["kind"] in ("start", "end", "abort"):
                self._open[rec["run"], rec["seq"], rec["epoch"], rec["pid"]] = \
                    rec.get("count", 0) if rec["kind"] == "start" else -1
        least = LONG if long else 0
        return [(run, epoch, pid) for (run, _, epoch, pid), count in self._open.items()
                if count >= least]

    async def busy(self, slots: list[str], timeout: float = 15.0,
                   long: bool = False) -> tuple[str, int]:
        """The slot among ``slots`` with the most steps in flight (long ones, with ``long``),
        waiting up to ``timeout`` for one to have any, and how many."""
        deadline = time.monotonic() + timeout
        while True:
            counts = Counter(pid for _, _, pid in self.in_flight(long))
            slot = max(slots, key=lambda s: counts[self.procs.live[s].pid])
            n = counts[self.procs.live[slot].pid]
            if n or time.monotonic() > deadline:
                return slot, n
            await asyncio.sleep(0.1)

    async def run(self, schedule: list[tuple[float, str]]) -> None:
        try:
            for pause, what in schedule:
                await asyncio.sleep(pause)
                await getattr(self, what)()
        finally:
            self.done.set()

    async def kill(self) -> None:
        slot, n = await self.busy(sorted(set(self.procs.live) - {self.cut}))
        event = Event("kill", time.time(), slot=slot, pid=self.procs.live[slot].pid,
                      in_flight=n)
        await asyncio.to_thread(self.procs.kill, slot)
        await asyncio.sleep(self.rng.uniform(0.2, 1.0))
        self.procs.start_worker(slot, **self.env[slot])
        event.ended = time.time()
        self.events.append(event)

    async def freeze(self) -> None:
        slot, n = await self.busy(sorted(self.procs.live))
        pid = self.procs.live[slot].pid
        event = Event("freeze", time.time(), slot=slot, pid=pid, in_flight=n)
        self.procs.send(slot, signal.SIGSTOP)
        try:
            await asyncio.sleep(LEASE + self.rng.uniform(1.5, 3.0))   # past the lease, a poll
        finally:
            thawed = time.time()
            self.procs.send(slot, signal.SIGCONT)
        self.freezes.append((pid, event.began, thawed))
        event.ended = thawed
        self.events.append(event)

    async def restart(self) -> None:
        await self.busy(sorted(self.procs.live))
        event = Event("restart", time.time(), in_flight=len(self.in_flight()))
        down = self.rng.uniform(0.5, LEASE + 1.0)
        await asyncio.to_thread(self.cluster.stop, "immediate")
        await asyncio.sleep(down)
        await asyncio.to_thread(self.cluster.start)
        event.ended, event.note = time.time(), f"down {down:.1f}s"
        self.events.append(event)

    async def partition(self) -> None:
        """Cut a worker off in a long step (one that outlasts the lease: it must stop before
        the lease ends), past its lease, until another worker has claimed one of the runs it
        was executing (20 s at most), then heal."""
        slot, long = await self.busy(sorted(self.procs.live), timeout=20, long=True)
        if not long:
            slot, _ = await self.busy(sorted(self.procs.live))
        self.cut = slot
        pid = self.procs.live[slot].pid
        claims = sorted({(run, epoch) for run, epoch, p in self.in_flight() if p == pid})
        event = Event("partition", time.time(), slot=slot, pid=pid, in_flight=len(claims),
                      note=f"{long} long")
        self.proxies[slot].hold()
        try:
            await asyncio.sleep(LEASE + self.rng.uniform(1.0, 2.0))

            async def taken_over() -> int:
                runs = [await self.app.get_run(run) for run, _ in claims]
                return sum(1 for r, (_, epoch) in zip(runs, claims, strict=True)
                           if r.lease_epoch > epoch)
            with contextlib.suppress(AssertionError):
                await wait_until(taken_over, 20, "a run of the cut-off worker taken over")
            event.taken_over = await taken_over()
        finally:
            self.proxies[slot].heal()
        event.ended = time.time()
        self.events.append(event)


async def retrying(call: Callable[[], Awaitable[Any]], what: str, retried: Counter[str],
                   timeout: float = 60.0) -> Any:
    """``call()`` until it answers: the server may be restarting. An answer of shoal's own
    (other than an unreachable store) is the answer."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except shoal.ShoalError as e:
            if not isinstance(e, shoal.StoreUnavailableError):
                raise
            error: Exception = e
        except Exception as e:   # psycopg's, while the server is down
            error = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: no answer for {timeout}s: {error!r}") from error
        retried[what] += 1
        await asyncio.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_chaos(tmp_path: Path, cluster: tp.Cluster) -> None:
    seed = int(os.environ.get("CHAOS_SEED", random.randrange(1 << 30)))
    plan_rng, chaos_rng = random.Random(seed), random.Random(seed + 1)
    plan = make_plan(plan_rng)
    schedule = make_schedule(chaos_rng)
    print(f"chaos schedule (seed {seed}; CHAOS_SEED replays it): "
          f"{' '.join(f'+{p}s {w}' for p, w in schedule)}")
    schema = "shoal_chaos"
    url = f"{cluster.url}?schema={schema}&connect_timeout=3"
    log = tmp_path / "effects.log"
    procs = Processes(tmp_path, HERE / "chaos_app.py", "CHAOS",
                      {"CHAOS_STORE": url, "CHAOS_LOG": str(log), "CHAOS_LEASE": str(LEASE),
                       "CHAOS_DRAIN": "5", "CHAOS_MAX_LIFE": "290"})
    app = chaos_app.make_app(url, lease=LEASE)
    returned: dict[str, set[str]] = defaultdict(set)
    signals: dict[str, Any] = {}
    retried: Counter[str] = Counter()
    helpers: list[asyncio.Task[Any]] = []
    with contextlib.ExitStack() as stack:
        proxies = {slot: stack.enter_context(Blackhole("127.0.0.1", cluster.port))
                   for slot in ("w0", "w1", "w2")}
        env = {slot: {"CHAOS_STORE": f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
                                     f"?schema={schema}&connect_timeout=3"}
               for slot, proxy in proxies.items()}
        chaos = Chaos(procs, cluster, proxies, app, log, chaos_rng, env)
        try:
            async with app.open():   # migrates the schema before the workers open it
                for slot in proxies:
                    procs.start_worker(slot, **env[slot])
                await procs.wait_started(log, timeout=60)

                async def send_signal(run_id: str, delay: float) -> None:
                    await asyncio.sleep(delay)
                    signals[run_id] = {"for": run_id}
                    await retrying(lambda: app.signal(run_id, "go", signals[run_id]),
                                   "signal", retried)

                async def dispatch(call: dict[str, Any]) -> None:
                    run = await retrying(lambda: app.dispatch(
                        "order", call["input"], idempotency_key=call["idempotency_key"]),
                        "dispatch", retried)
                    first = not returned[call["idempotency_key"]]
                    returned[call["idempotency_key"]].add(run.id)
                    if first and call["input"].get("signal"):
                        helpers.append(asyncio.create_task(
                            send_signal(run.id, plan_rng.uniform(0.3, 4.0))))

                async def approve() -> None:
                    while True:
                        await asyncio.sleep(0.7)
                        try:
                            pending = await app.pending_pauses(limit=1000)
                        except Exception:
                            retried["pending_pauses"] += 1
                            continue
                        for pause in pending:
                            with contextlib.suppress(shoal.NotPausedError):
                                await retrying(lambda p=pause: app.resume(
                                    p.id, approved=True, data={"for": p.run_id},
                                    by="chaos-test"), "resume", retried)

                helpers.append(asyncio.create_task(approve()))
                striking = asyncio.create_task(chaos.run(schedule))
                began = time.time()
                n_orders, tail = 0, 0
                while tail < TAIL:   # orders flow for as long as the chaos lasts, and after
                    await dispatch(plan[n_orders])
                    if n_orders >= 3 and n_orders % TWICE == 0:
                        await dispatch(plan[n_orders - 3])
                    n_orders += 1
                    tail += chaos.done.is_set()
                    await asyncio.sleep(PACE)
                await striking
                dispatched = time.time() - began
                n_children = sum(c["input"].get("children", 0) for c in plan[:n_orders])
                await wait_all_final(app.store, chaos_app.NAMESPACE, n_orders + n_children,
                                     timeout=120)
                finished = time.time() - began

                # the worker cut off last serves on: alone now, it runs a last order
                assert chaos.cut is not None
                cut_pid = procs.live[chaos.cut].pid
                stopped = [procs.terminate(slot) for slot in set(proxies) - {chaos.cut}]
                codes = [await asyncio.to_thread(p.wait, 20) for p in stopped]
                probe = {"input": {"i": n_orders, "effects": [2, 2, 2]},
                         "idempotency_key": "order-probe"}
                await dispatch(probe)
                await app.result(next(iter(returned["order-probe"])), timeout=60)
                codes += procs.stop_workers().values()
                assert codes == [0, 0, 0], (codes, procs.stderr_tail())
                runs = await wait_all_final(app.store, chaos_app.NAMESPACE,
                                            n_orders + n_children + 1, timeout=10)
                steps = {r.id: await app.store.load_steps(r.id) for r in runs}
            records = read_log(log)
            inputs = {c["idempotency_key"]: c["input"] for c in [*plan[:n_orders], probe]}
            expected = Expected(returned, inputs, signals, chaos.freezes, len(chaos.events))
            problems, stats = check_chaos(runs, steps, records, expected)

            events = Counter(r["event"] for r in records if r["kind"] == "event")
            kinds = Counter(e.what for e in chaos.events)
            probed = {r["pid"] for r in records if r["kind"] == "start" and
                      r["run"] in returned["order-probe"]}
            done = [(e.what, e.slot, round(e.began - began, 1), e.in_flight, e.taken_over,
                     e.note) for e in chaos.events]
            print(f"events (what, slot, at, steps in flight, taken over, note) {done}; "
                  f"dispatched in {dispatched:.1f}s, all final at {finished:.1f}s; "
                  f"{dict(stats)}; retried {dict(retried)}; shoal events {dict(events)}; "
                  f"attempts {sorted(Counter(r.attempts for r in runs).items())}")
            assert not problems, "\n".join(problems[:30])
            assert kinds == Counter(w for _, w in schedule), kinds
            assert all(e.in_flight for e in chaos.events), \
                f"an event found no step in flight: {chaos.events}"
            assert all(e.taken_over for e in chaos.events if e.what == "partition"), \
                f"no run of the cut-off worker was taken over: {chaos.events}"
            assert stats["re-run steps"] > 0, "the chaos made no step run again"
            assert probed == {cut_pid}, f"the last order ran in {probed}, not in {cut_pid}"
            assert [e for e in chaos.events if e.what == "partition"][-1].pid == cut_pid
            assert events["worker.exited"] == 3, "a worker exited before its SIGTERM"
            print(f"chaos: seed={seed} kills={kinds['kill']} freezes={kinds['freeze']} "
                  f"restarts={kinds['restart']} partitions={kinds['partition']} "
                  f"re-run steps={stats['re-run steps']} late effects={stats['late effects']} "
                  f"runs={len(runs)} ok")
        except BaseException:
            print(procs.stderr_tail(40))
            print(cluster.log_tail(20))
            raise
        finally:
            for task in helpers:
                task.cancel()
            for proxy in proxies.values():
                proxy.heal()
            procs.cleanup()
