"""The guided tour behind ``shoal demo``, and the app its replicas serve.

``shoal worker shoal.demo:app`` serves :data:`app`, built with ``App.from_env`` (``SHOAL_STORE``,
``SHOAL_INSTANCE_ID``) and a short lease so that a crashed replica's runs come back quickly.
:func:`run_tour` starts several such replicas on one fresh SQLite file, dispatches runs of the
``order`` workflow, kills one replica with SIGKILL about halfway, watches the others continue its
runs, and proves from the store and from a side-effect log that every run succeeded, that no
finished step ran twice and that no two runs of one concurrency key overlapped.

The side-effect log (path in ``SHOAL_DEMO_LOG``) gets one JSON line per step start and end, each
written with one ``os.write`` on an ``O_APPEND`` descriptor so lines of several processes never mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from shoal.app import App
from shoal.engine.context import RunContext
from shoal.errors import ConfigurationError
from shoal.ports import Store
from shoal.types import Run, Step

NAMESPACE = "demo"
WORKFLOW = "order"
LEASE = 3.0
SLEEP = 1.0
KEYS = ("ledger-A", "ledger-B")
# The workflow's checkpoints in order; seq 3 is the durable sleep, which logs no side effect.
CHECKPOINTS = ("reserve", "charge", "shoal.sleep", "ship", "notify")
TOTAL = len(CHECKPOINTS)

_effects_fd: int | None = None


def _effect(record: dict[str, Any]) -> None:
    """Append one JSON line to the side-effect log, if there is one, in a single write."""
    global _effects_fd
    path = os.environ.get("SHOAL_DEMO_LOG")
    if not path:
        return
    if _effects_fd is None:
        _effects_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_effects_fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())


def _account(input: Any) -> str | None:
    return input.get("account") if isinstance(input, dict) else None


def register(app: App) -> None:
    """Register the tour's ``order`` workflow on ``app``: four steps of short real work around a
    durable one-second sleep; runs given an ``account`` share that concurrency key."""

    async def work(ctx: RunContext, name: str) -> dict[str, Any]:
        line = {"run": ctx.run_id, "key": ctx.step_key, "step": name,
                "epoch": ctx.lease_epoch, "by": app.instance_id}
        started = time.time()
        _effect({"e": "start", **line, "t": started})
        await asyncio.sleep(random.uniform(0.1, 0.3))
        finished = time.time()
        _effect({"e": "end", **line, "t": finished})
        return {"by": app.instance_id, "seconds": round(finished - started, 3)}

    @app.workflow(name=WORKFLOW, concurrency_key=_account)
    async def order(ctx: RunContext, input: dict[str, Any]) -> dict[str, Any]:
        done = {}
        for name in ("reserve", "charge"):
            done[name] = await ctx.step(name, work, ctx, name)
        await ctx.sleep(SLEEP)   # durable: the slot is freed; any replica picks the run up again
        for name in ("ship", "notify"):
            done[name] = await ctx.step(name, work, ctx, name)
        return {"order": input["order"], "by": {k: v["by"] for k, v in done.items()}}


def _watch_parent() -> None:
    """In a tour's replica: stop gracefully once the tour process is gone, so a replica never
    outlives it (even when the tour itself is killed with SIGKILL)."""
    parent = os.environ.get("SHOAL_DEMO_PARENT")
    if not parent or not parent.isdigit():
        return

    def watch() -> None:
        while os.getppid() == int(parent):
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="shoal-demo-parent", daemon=True).start()


app = App.from_env(NAMESPACE, lease=LEASE, max_concurrent_runs=4)
register(app)
_watch_parent()


# -- the replicas ------------------------------------------------------------------------------


@dataclass
class Replica:
    """One worker process of the tour."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    killed_at: float | None = None
    reported: bool = False          # its unexpected exit was reported

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 12) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Fleet:
    """The replica processes; :meth:`stop` leaves none behind."""

    def __init__(self, workdir: Path, store_url: str, effects: Path) -> None:
        self.workdir = workdir
        self.store_url = store_url
        self.effects = effects
        self.replicas: list[Replica] = []

    def start(self, count: int) -> None:
        for i in range(1, count + 1):
            name = f"replica-{i}"
            env = {**os.environ, "SHOAL_STORE": self.store_url, "SHOAL_INSTANCE_ID": name,
                   "SHOAL_DEMO_LOG": str(self.effects), "SHOAL_DEMO_PARENT": str(os.getpid()),
                   "PYTHONUNBUFFERED": "1"}
            log = self.workdir / f"{name}.log"
            with log.open("wb") as out:
                # Its own session: a Ctrl-C reaches the tour, which then stops every replica.
                process = subprocess.Popen(
                    [sys.executable, "-m", "shoal.cli", "worker", "shoal.demo:app"],
                    env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.replicas.append(Replica(name, process, log))

    def ready(self) -> bool:
        """Whether every replica has started serving."""
        return all("app.started" in r.log.read_text(errors="replace") for r in self.replicas)

    def kill(self, replica: Replica) -> None:
        replica.killed_at = time.time()
        replica.process.send_signal(signal.SIGKILL)
        replica.process.wait()

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every replica still running, wait up to ``grace`` seconds, then SIGKILL."""
        for r in self.replicas:
            if r.alive:
                r.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for r in self.replicas:
            try:
                r.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                r.process.kill()
                r.process.wait()


# -- what the tour watches -----------------------------------------------------------------------


@dataclass
class Track:
    """One dispatched run as the tour last saw it."""

    number: int
    run_id: str
    key: str | None
    status: str = "queued"
    owner: str | None = None
    attempts: int = 0
    steps: int = 0
    owners: list[str] = field(default_factory=list)
    orphaned: bool = False          # held by the killed replica when it died
    requeued_at: float | None = None
    continued_at: float | None = None
    continued_by: str | None = None

    @property
    def final(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled")


@dataclass
class Check:
    ok: bool
    title: str
    detail: str = ""


class Tour:
    """State and output of one tour."""

    def __init__(self, console: Console, runs: int, workers: int) -> None:
        self.console = console
        self.live_mode = console.is_terminal and not console.is_dumb_terminal
        self.runs = runs
        self.workers = workers
        self.tracks: list[Track] = []
        self.started = time.time()
        self.victim: Replica | None = None
        self.last_progress = 0.0
        self.steps_by: dict[str, int] = defaultdict(int)
        self._effects_offset = 0

    def say(self, message: str) -> None:
        elapsed = time.time() - self.started
        self.console.print(f"[dim]{elapsed:5.1f}s[/]  {message}", highlight=False)

    # -- reading the store ---------------------------------------------------------------------

    async def refresh(self, store: Store) -> None:
        runs = {r.id: r for r in await store.list_runs(NAMESPACE, limit=len(self.tracks) + 100)}
        for t in self.tracks:
            run = runs.get(t.run_id)
            if run is None:
                continue
            previous = (t.status, t.owner)
            t.status, t.owner, t.attempts = str(run.status), run.owner, run.attempts
            if run.owner and (not t.owners or t.owners[-1] != run.owner):
                t.owners.append(run.owner)
            if t.steps < TOTAL:
                t.steps = sum(s.finished for s in await store.load_steps(t.run_id))
            if t.orphaned and (t.status, t.owner) != previous:
                self._orphan_moved(t)

    def _orphan_moved(self, t: Track) -> None:
        victim = self.victim
        assert victim is not None and victim.killed_at is not None
        if t.status == "queued" and t.requeued_at is None:
            t.requeued_at = time.time()
            self.say(f"#{t.number}: the claim of {victim.name} expired → [cyan]queued[/] "
                     f"again (attempt {t.attempts}), {t.requeued_at - victim.killed_at:.1f}s "
                     f"after the kill")
        if t.owner and t.owner != victim.name:
            self._continued(t, t.owner, time.time(), f"from checkpoint {t.steps}/{TOTAL}")
        if t.final:
            if t.continued_by is None and t.owners and t.owners[-1] != victim.name:
                self._continued(t, t.owners[-1], time.time(), "")
            style = "green" if t.status == "succeeded" else "bold red"
            self.say(f"#{t.number}: [{style}]{t.status}[/]")

    def _continued(self, t: Track, by: str, at: float, where: str) -> None:
        victim = self.victim
        if t.continued_by is not None or victim is None or victim.killed_at is None:
            return
        t.continued_at, t.continued_by = at, by
        self.say(f"#{t.number}: [bold]continued by {by}[/] {where}, "
                 f"{at - victim.killed_at:.1f}s after the kill")

    def read_effects(self, path: Path) -> None:
        """Take in the step executions logged since the last call: count them per replica, and
        see which replica continues each run of the killed one."""
        try:
            with path.open("rb") as f:
                f.seek(self._effects_offset)
                data = f.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self._effects_offset += len(complete)
        tracks = {t.run_id: t for t in self.tracks if t.orphaned}
        victim = self.victim
        for line in complete.splitlines():
            record = json.loads(line)
            if record["e"] == "end":
                self.steps_by[record["by"]] += 1
            t = tracks.get(record["run"])
            if t is not None and victim is not None and record["by"] != victim.name:
                self._continued(t, record["by"], record["t"],
                                f"at step '{record['step']}'")

    # -- showing it ----------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for t in self.tracks:
            out[t.status] += 1
        return out

    def progress_line(self) -> str:
        counts = self.counts()
        order = ("succeeded", "running", "sleeping", "queued", "failed", "cancelled")
        parts = [f"{counts[s]} {s}" for s in order if counts.get(s)]
        return f"{counts.get('succeeded', 0)}/{len(self.tracks)} done · " + " · ".join(parts)

    def render(self, fleet: Fleet) -> RenderableType:
        replicas = Table(box=None, padding=(0, 2), show_edge=False)
        for column in ("replica", "pid", "state", "holds (running)", "steps executed"):
            replicas.add_column(column)
        for r in fleet.replicas:
            held = [f"#{t.number}" for t in self.tracks
                    if t.owner == r.name and t.status == "running"]
            if r.killed_at is not None:
                state = "[bold red]killed (SIGKILL)[/]"
            elif r.alive:
                state = "[green]serving[/]"
            else:
                state = f"[red]exited ({r.process.returncode})[/]"
            replicas.add_row(r.name, str(r.process.pid), state, " ".join(held) or "-",
                             str(self.steps_by.get(r.name, 0)))
        groups = max(1, min(4, (self.console.width + 3) // 40))
        rows = -(-len(self.tracks) // groups)
        grid = Table(box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False, pad_edge=False)
        for _ in range(groups):
            for column in ("run", "status", "replica", "steps"):
                grid.add_column(column, no_wrap=True, header_style="bold")
        for i in range(rows):
            cells: list[RenderableType] = []
            for g in range(groups):
                index = g * rows + i
                if index < len(self.tracks):
                    cells += self._cells(self.tracks[index])
                else:
                    cells += ["", "", "", ""]
            grid.add_row(*cells)
        header = Text.from_markup(f"[bold]{self.progress_line()}[/]")
        return Group(header, replicas, Text(""), grid)

    def _cells(self, t: Track) -> list[RenderableType]:
        style = {"queued": "cyan", "running": "bold yellow", "sleeping": "blue",
                 "succeeded": "green", "failed": "bold red"}.get(t.status, "")
        mark = "[bold red]![/]" if t.orphaned else " "
        label = f"#{t.number:<2}{mark}" + (f"[dim]{t.key[-1]}[/]" if t.key else " ")
        if t.status == "running" and t.owner:
            who = t.owner
        elif t.owners:
            who = f"[dim]{t.owners[-1]}[/]"
        else:
            who = ""
        bar = "[green]" + "●" * t.steps + "[/][dim]" + "○" * (TOTAL - t.steps) + "[/]"
        return [label, f"[{style}]{t.status}[/]" if style else t.status, who, bar]


# -- the tour ----------------------------------------------------------------------------------


def run_tour(*, runs: int = 36, workers: int = 3, db: Path | None = None, timeout: float = 45.0,
             keep: bool = False, console: Console | None = None) -> int:
    """Run the guided tour; return 0 when every check passed, 1 when one failed, 130 when
    interrupted. Every replica is stopped before it returns."""
    if console is None:
        console = Console(highlight=False)
        if not console.is_terminal:
            console = Console(highlight=False, width=max(console.width, 120))
    if db is not None and db.exists() and db.stat().st_size > 0:
        raise ConfigurationError(
            f"The tour needs a fresh SQLite file and {str(db)!r} exists; remove it or leave "
            f"out --db (a temporary file is used then).")
    if db is not None and not db.resolve().parent.is_dir():
        raise ConfigurationError(f"The folder of --db {str(db)!r} does not exist.")
    workdir = Path(tempfile.mkdtemp(prefix="shoal-demo-"))
    db_path = (db or workdir / "demo.db").resolve()
    fleet = Fleet(workdir, f"sqlite:///{db_path}", workdir / "effects.log")
    tour = Tour(console, runs, workers)
    code = 1
    try:
        code = 0 if asyncio.run(_tour(tour, fleet, db_path, timeout)) else 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        console.print("\n[yellow]Interrupted: stopping the replicas.[/]")
        code = 130
    finally:
        fleet.stop(grace=5.0)
        if code == 0 and not keep:
            shutil.rmtree(workdir, ignore_errors=True)
            if db is not None:
                console.print(f"The database stays at [bold]{db_path}[/].")
        else:
            console.print(f"The replicas' logs and the side-effect log are in [bold]{workdir}[/]"
                          + ("" if db is None else f"; the database is {db_path}") + ".")
    return code


async def _tour(tour: Tour, fleet: Fleet, db_path: Path, timeout: float) -> bool:
    console = tour.console
    deadline = time.monotonic() + timeout
    main = asyncio.current_task()
    assert main is not None
    # SIGTERM takes the same clean path as a Ctrl-C: the tour is cancelled, the replicas stopped.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    console.rule("[bold]shoal demo[/]: durable runs on replicas that share one SQLite file")
    console.print(
        f"{tour.workers} replica processes serve workflow '{WORKFLOW}' "
        f"(steps reserve, charge, a durable {SLEEP:g}s sleep, ship, notify) from "
        f"{escape(str(db_path))}. Leases last {LEASE:g}s and are renewed every {LEASE / 3:g}s; "
        f"one replica is killed with SIGKILL halfway and the others must continue its runs.\n")
    fleet.start(tour.workers)
    while not fleet.ready():
        dead = [r for r in fleet.replicas if not r.alive]
        if dead or time.monotonic() > deadline:
            for r in dead or fleet.replicas:
                console.print(f"[red]{r.name} did not start; the end of its log:[/]\n"
                              f"{escape(r.log_tail())}")
            _verdict(console, [Check(False, "the replicas started")])
            return False
        await asyncio.sleep(0.05)
    tour.say("started " + ", ".join(f"{r.name} (pid {r.process.pid})" for r in fleet.replicas))

    client = App(NAMESPACE, store=fleet.store_url, lease=LEASE)
    register(client)
    async with client.open():
        for n in range(1, tour.runs + 1):
            key = KEYS[(n // 4) % len(KEYS)] if n % 4 == 1 else None
            run = await client.dispatch(WORKFLOW, {"order": n, "account": key})
            tour.tracks.append(Track(n, run.id, key))
        keyed = sum(1 for t in tour.tracks if t.key)
        tour.say(f"dispatched {tour.runs} runs; {keyed} of them (marked A/B) share a "
                 f"concurrency key ({', '.join(KEYS)}) and must run one at a time per key")
        finished = await _watch(tour, fleet, client.store, deadline)
        if finished:
            tour.say("every run has ended; stopping the other replicas with SIGTERM")
        else:
            tour.say(f"[red]not every run ended within {timeout:g}s[/]")
        await asyncio.to_thread(fleet.stop)
        await tour.refresh(client.store)
        steps = {t.run_id: await client.store.load_steps(t.run_id) for t in tour.tracks}
        runs = {t.run_id: await client.get_run(t.run_id) for t in tour.tracks}
    checks = _checks(tour, fleet, runs, steps, _read_effects(fleet.effects))
    if not finished:
        checks.insert(0, Check(False, f"every run ended within {timeout:g}s"))
    _summary(tour, fleet, checks)
    return all(c.ok for c in checks)


async def _watch(tour: Tour, fleet: Fleet, store: Store, deadline: float) -> bool:
    """Show the runs until all are final (True) or the deadline passes (False); kill a replica
    halfway."""
    live = Live(console=tour.console, auto_refresh=False) if tour.live_mode else None
    with live if live is not None else contextlib.nullcontext():
        while time.monotonic() < deadline:
            # The log first: a step's lines are written before the store records its outcome.
            tour.read_effects(fleet.effects)
            await tour.refresh(store)
            if _maybe_kill(tour, fleet):
                await tour.refresh(store)
                _mark_orphans(tour)
            for r in fleet.replicas:
                if r.killed_at is None and not r.reported and not r.alive:
                    r.reported = True
                    tour.say(f"[red]{r.name} exited by itself (code {r.process.returncode})[/]")
            if live is not None:
                live.update(tour.render(fleet), refresh=True)
            elif time.time() - tour.last_progress >= 2.0:
                tour.last_progress = time.time()
                tour.say(tour.progress_line())
            if all(t.final for t in tour.tracks):
                if live is None:
                    tour.say(tour.progress_line())
                return True
            await asyncio.sleep(0.15)
    return False


def _maybe_kill(tour: Tour, fleet: Fleet) -> bool:
    """Once half of all checkpoints are written, SIGKILL the live replica holding the most
    running runs; True if now. (Checkpoints, not finished runs: they grow steadily, so there is
    work in flight at the halfway mark.)"""
    if tour.victim is not None:
        return False
    written = sum(t.steps for t in tour.tracks)
    if written < len(tour.tracks) * TOTAL // 2:
        return False
    holding: dict[str, int] = defaultdict(int)
    for t in tour.tracks:
        if t.status == "running" and t.owner:
            holding[t.owner] += 1
    candidates = [r for r in fleet.replicas if r.alive and holding.get(r.name)]
    if not candidates:
        return False
    victim = max(candidates, key=lambda r: holding[r.name])
    fleet.kill(victim)
    tour.victim = victim
    tour.say(f"[bold red]halfway ({written} of {len(tour.tracks) * TOTAL} checkpoints "
             f"written): killing {victim.name} (pid {victim.process.pid}) with SIGKILL[/]")
    return True


def _mark_orphans(tour: Tour) -> None:
    """The runs the killed replica held: a dead process changes nothing, so the store still
    names it their owner right after the kill."""
    victim = tour.victim
    assert victim is not None
    orphans = [t for t in tour.tracks if t.status == "running" and t.owner == victim.name]
    for t in orphans:
        t.orphaned = True
    if orphans:
        tour.say(f"it held {_numbers([t.number for t in orphans])} (marked [bold red]![/]); "
                 f"their claims expire within {LEASE:g}s, then another replica continues each "
                 f"from its last checkpoint")
    else:
        tour.say("it held no running run at that instant")


def _read_effects(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


# -- the proof -------------------------------------------------------------------------------


def _checks(tour: Tour, fleet: Fleet, runs: dict[str, Run], steps: dict[str, list[Step]],
            effects: list[dict[str, Any]]) -> list[Check]:
    """The tour's claims, each proven from the store's final state and the side-effect log."""
    checks: list[Check] = []
    statuses: dict[str, int] = defaultdict(int)
    for run in runs.values():
        statuses[str(run.status)] += 1
    checks.append(Check(statuses.get("succeeded", 0) == len(runs),
                        f"all {len(runs)} runs succeeded (read from the store)",
                        ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))))

    incomplete = [t.number for t in tour.tracks
                  if [s.name for s in steps[t.run_id] if s.finished] != list(CHECKPOINTS)]
    checks.append(Check(not incomplete, f"every run has its {TOTAL} checkpoints, in order",
                        f"incomplete: {_numbers(incomplete)}" if incomplete else ""))

    # A step's side effect at a lease epoch later than its checkpoint's would be a finished step
    # running again. Earlier epochs are executions cut short before their checkpoint (the kill).
    checkpoint = {(run_id, s.seq): s for run_id, ss in steps.items() for s in ss}
    number = {t.run_id: t.number for t in tour.tracks}
    starts: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for line in effects:
        if line["e"] == "start" and line["run"] in number:
            starts[(line["run"], int(line["key"].rsplit(":", 1)[1]))].append(line)
    violations, reruns = [], []
    for key, lines in sorted(starts.items()):
        cp = checkpoint.get(key)
        label = f"#{number[key[0]]} step {key[1]}"
        epochs = [line["epoch"] for line in lines]
        if cp is None or not cp.finished:
            violations.append(f"{label} ran but has no finished checkpoint")
        elif max(epochs) > cp.epoch:
            violations.append(f"{label} ran at epoch {max(epochs)} after its checkpoint at "
                              f"epoch {cp.epoch}")
        elif len(set(epochs)) != len(epochs):
            violations.append(f"{label} ran twice under one claim (epoch {epochs})")
        elif cp.epoch not in epochs:
            violations.append(f"{label}: no execution logged at its checkpoint's epoch")
        elif len(lines) > 1:
            first = lines[0]
            reruns.append(f"#{number[key[0]]} '{first['step']}' (cut short on {first['by']})")
    missing = [f"#{number[r]} step {seq}" for (r, seq), s in checkpoint.items()
               if s.name != "shoal.sleep" and (r, seq) not in starts]
    violations += [f"{m} is checkpointed but never logged its execution" for m in missing]
    executions = sum(len(v) for v in starts.values())
    detail = (f"{executions} step executions checked against {len(starts)} checkpoints; "
              f"{len(reruns)} interrupted step(s) ran again, as allowed (not yet checkpointed "
              f"when the replica died)" + (f": {', '.join(reruns)}" if reruns else ""))
    checks.append(Check(not violations, "no finished step ran again (every execution's lease "
                                        "epoch ≤ its checkpoint's)",
                        "; ".join(violations[:5]) if violations else detail))

    # A run holds its key from its first step's start to its last step's end.
    spans: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    times: dict[str, list[float]] = defaultdict(list)
    for line in effects:
        times[line["run"]].append(line["t"])
    for t in tour.tracks:
        if t.key and times.get(t.run_id):
            spans[t.key].append((min(times[t.run_id]), max(times[t.run_id]), t.number))
    overlaps, serial = [], []
    for account, key_spans in sorted(spans.items()):
        key_spans.sort()
        for (_, end, a), (start, _, b) in itertools.pairwise(key_spans):
            if start < end:
                overlaps.append(f"{account}: #{a} and #{b} overlapped by {end - start:.3f}s")
        serial.append(f"{account}: {len(key_spans)} run(s), one at a time")
    checks.append(Check(not overlaps, "no two runs of one concurrency key overlapped in time",
                        "; ".join(overlaps) if overlaps else "; ".join(serial)))

    victim = tour.victim
    if victim is None:
        checks.append(Check(False, "a replica was killed halfway",
                            "no replica held a running run after half of the runs had ended"))
    else:
        orphans = [t for t in tour.tracks if t.orphaned]
        lost = [t.number for t in orphans if runs[t.run_id].status != "succeeded"
                or runs[t.run_id].attempts < 2]
        took = [t.continued_at - victim.killed_at for t in orphans
                if t.continued_at is not None and victim.killed_at is not None]
        by = sorted({t.continued_by for t in orphans if t.continued_by})
        detail = (f"{victim.name} died (exit {victim.process.returncode}) holding "
                  f"{_numbers([t.number for t in orphans])}")
        if took:
            span = (f"{min(took):.1f}s" if max(took) - min(took) < 0.05
                    else f"{min(took):.1f} to {max(took):.1f}s")
            detail += (f"; continued by {', '.join(by)} {span} later (lease {LEASE:g}s + poll "
                       f"{LEASE / 3:g}s)")
        if lost:
            detail += f"; not recovered: {_numbers(lost)}"
        if not orphans:
            detail += " (it happened to hold none at that instant)"
        checks.append(Check(not lost and victim.process.returncode == -signal.SIGKILL,
                            f"the runs of the killed {victim.name} were continued by the "
                            f"others and succeeded", detail))

    others = [r for r in fleet.replicas if r is not victim]
    bad = [f"{r.name} exit {r.process.returncode}" for r in others if r.process.returncode != 0]
    checks.append(Check(not bad, f"the {len(others)} other replicas stopped gracefully on "
                                 f"SIGTERM (exit 0)", ", ".join(bad)))
    return checks


def _numbers(numbers: list[int]) -> str:
    return " ".join(f"#{n}" for n in numbers) or "none"


def _summary(tour: Tour, fleet: Fleet, checks: list[Check]) -> None:
    console = tour.console
    elapsed = time.time() - tour.started
    console.print()
    table = Table(title="who did the work (from the side-effect log)", title_justify="left")
    for column in ("replica", "fate", "steps executed"):
        table.add_column(column)
    tour.read_effects(fleet.effects)
    for r in fleet.replicas:
        fate = ("killed with SIGKILL" if r.killed_at is not None
                else f"stopped, exit {r.process.returncode}")
        table.add_row(r.name, fate, str(tour.steps_by.get(r.name, 0)))
    console.print(table)
    console.print()
    for c in checks:
        mark = "[green]PASS[/]" if c.ok else "[bold red]FAIL[/]"
        console.print(f"{mark}  {c.title}")
        if c.detail:
            console.print(Padding(Text(c.detail, style="dim"), (0, 0, 0, 6)))
    console.print()
    _verdict(console, checks, elapsed)
    if not all(c.ok for c in checks):
        for r in fleet.replicas:
            if r.killed_at is None and r.process.returncode not in (0, None):
                console.print(f"[red]The end of {r.name}'s log:[/]\n{escape(r.log_tail())}")


def _verdict(console: Console, checks: list[Check], elapsed: float | None = None) -> None:
    failed = [c for c in checks if not c.ok]
    took = f" in {elapsed:.1f}s" if elapsed is not None else ""
    if failed:
        console.print(f"[bold red]VERDICT: FAIL[/] — {len(failed)} of {len(checks)} checks "
                      f"failed{took}.")
    else:
        console.print(f"[bold green]VERDICT: PASS[/] — all {len(checks)} checks hold{took}: "
                      f"a replica died mid-run and no run was lost or repeated.")
