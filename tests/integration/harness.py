"""The harness the multi-process tests share (``test_sqlite_processes.py``,
``test_postgres_processes.py``, ``test_workflow_processes.py``), for a worker module run as a
script (``proc_app.py``, ``flow_app.py``) and configured by environment variables named after a
prefix: ``{PREFIX}_INSTANCE`` (instance id), ``{PREFIX}_MAX_LIFE`` (seconds; the process exits by
itself after that), ``{PREFIX}_DRAIN`` (close timeout), plus the module's own.

Test side: ``Processes`` (processes of a worker module, each in its own process group, killed
by group in ``cleanup``, and by a reaper process should the test process die), ``Monkey`` (a
chaos thread that kills and freezes workers), ``read_log`` and ``wait_until``.

Worker side, imported by the worker modules in their own processes: ``LineLog`` (the shared log
of JSON lines), ``serve`` (a worker: log events, guard, ``App.run_forever``) and ``start_guard``.

``python harness.py reaper F SCRIPT MAX_LIFE``  once the test process is gone (or after MAX_LIFE +
10 seconds), SIGKILL the process groups listed in file F that ``SCRIPT`` leads (a worker frozen by
SIGSTOP cannot exit by itself)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

HARNESS = Path(__file__).resolve()


# -- the test side: processes ---------------------------------------------------------------------


class Processes:
    """Processes of the worker module ``script``, each in its own session (so its own process
    group); every one ever started is killed by group in ``cleanup``, whatever happened. Should
    the test process itself die (SIGKILL), a reaper process kills the groups still running,
    frozen ones included. ``prefix`` names the module's variables (``{prefix}_INSTANCE``, …);
    ``env`` is added to every process's environment."""

    def __init__(self, tmp: Path, script: Path, prefix: str, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.script = script
        self.prefix = prefix
        self.env = env
        self.live: dict[str, subprocess.Popen[bytes]] = {}
        self.instances: dict[str, str] = {}
        self.every: list[subprocess.Popen[bytes]] = []
        self.interrupted_pids: set[int] = set()   # killed, or frozen past their lease
        self.started = 0
        self.generations = 0
        self.lock = threading.Lock()   # the Monkey thread starts workers too
        self.groups = tmp / "process-groups"
        self.groups.write_text("")
        max_life = {**os.environ, **env}.get(f"{prefix}_MAX_LIFE", "300")
        self.reaper = self._popen([str(HARNESS), "reaper", str(self.groups), str(script),
                                   max_life], "reaper")

    def _popen(self, argv: list[str], name: str, pipe: bool = False,
               **env: str) -> subprocess.Popen[bytes]:
        with self.lock:
            self.started += 1
            number = self.started
        err = open(self.tmp / f"{name}.{number}.stderr", "wb")  # noqa: SIM115
        try:
            return subprocess.Popen(
                [sys.executable, *argv], env={**os.environ, **self.env, **env},
                stdin=subprocess.PIPE if pipe else subprocess.DEVNULL,
                stdout=subprocess.PIPE if pipe else subprocess.DEVNULL, stderr=err,
                start_new_session=True,
            )
        finally:
            err.close()

    def spawn(self, args: list[str], name: str, pipe: bool = False,
              **env: str) -> subprocess.Popen[bytes]:
        """``python SCRIPT *args``, its stderr in ``{name}.{n}.stderr``."""
        proc = self._popen([str(self.script), *args], name, pipe, **env)
        with self.lock:
            self.every.append(proc)
            with self.groups.open("a") as f:
                f.write(f"{proc.pid}\n")
        return proc

    def start_worker(self, slot: str, **env: str) -> subprocess.Popen[bytes]:
        """A worker in ``slot`` (a new instance id each time), ``env`` added to its
        environment."""
        with self.lock:
            self.generations += 1
            self.instances[slot] = f"{slot}-{self.generations}"
        proc = self.spawn(["worker"], f"worker-{slot}",
                          **{**env, f"{self.prefix}_INSTANCE": self.instances[slot]})
        self.live[slot] = proc
        return proc

    async def wait_started(self, log: Path, timeout: float = 20.0, step: float = 0.1) -> None:
        """Until every live worker has started its app (a SIGTERM before that is no stop)."""
        async def all_started() -> bool:
            started = {r["instance"] for r in read_log(log)
                       if r["kind"] == "event" and r["event"] == "app.started"}
            return {self.instances[slot] for slot in self.live} <= started
        await wait_until(all_started, timeout, "every worker to start", step=step)

    def kill(self, slot: str) -> None:
        proc = self.live.pop(slot)
        self.interrupted_pids.add(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def send(self, slot: str, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.live[slot].pid, sig)

    def terminate(self, slot: str) -> subprocess.Popen[bytes]:
        proc = self.live.pop(slot)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        return proc

    def stop_workers(self, timeout: float = 15.0) -> dict[str, int | None]:
        """SIGTERM every live worker and wait for each: a graceful close exits 0."""
        stopped = {slot: self.terminate(slot) for slot in list(self.live)}
        codes: dict[str, int | None] = {}
        for slot, proc in stopped.items():
            try:
                codes[slot] = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                codes[slot] = None
        return codes

    def cleanup(self) -> None:
        for proc in [*self.every, self.reaper]:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in [*self.every, self.reaper]:
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    with contextlib.suppress(Exception):
                        stream.close()

    def stderr_tail(self, lines: int = 15) -> str:
        out = []
        for path in sorted(self.tmp.glob("*.stderr")):
            text = path.read_text(errors="replace").splitlines()
            if text:
                out.append(f"--- {path.name}\n" + "\n".join(text[-lines:]))
        return "\n".join(out)


class Chaos(NamedTuple):
    t: float     # seconds since the Monkey was made
    what: str    # "kill" or "freeze"
    slot: str
    pid: int


class Monkey(threading.Thread):
    """Every ``pause`` seconds or so (after a first second), kills a random worker (SIGKILL) and
    starts it again a moment later, or (one time in three) freezes one past its lease (SIGSTOP,
    SIGCONT ``freeze_for`` seconds later: a zombie the store must fence out), until stopped or
    after ``max_events`` events. With ``wait_out_freezes`` nothing else happens while a worker is
    frozen; otherwise the chaos goes on meanwhile. Also a supervisor: a worker that exited by
    itself is started again. A thread, so the chaos does not depend on the test's event loop
    (which may wait on the SQLite write lock a frozen worker holds)."""

    def __init__(self, procs: Processes, rng: random.Random, max_events: int,
                 pause: tuple[float, float] = (0.4, 1.6),
                 freeze_for: tuple[float, float] = (2.8, 3.5),
                 wait_out_freezes: bool = False) -> None:
        super().__init__(daemon=True)
        self.procs, self.rng, self.max_events = procs, rng, max_events
        self.pause, self.freeze_for, self.wait_out_freezes = pause, freeze_for, wait_out_freezes
        self.began = time.monotonic()
        self.halt = threading.Event()
        self.chaos: list[Chaos] = []
        self.exited: list[tuple[str, int | None]] = []
        self.frozen: dict[str, tuple[subprocess.Popen[bytes], float]] = {}

    def run(self) -> None:
        try:
            self.halt.wait(1.0)
            while not self.halt.is_set() and len(self.chaos) < self.max_events:
                self.nap(self.rng.uniform(*self.pause))
                self.supervise()
                if self.halt.is_set():
                    break
                slot = self.rng.choice(sorted(set(self.procs.live) - set(self.frozen)))
                proc = self.procs.live[slot]
                if len(self.chaos) % 3 == 2:
                    # past the lease (2 s) and a poll, below the SQLite workers' 5 s busy timeout
                    self.procs.interrupted_pids.add(proc.pid)
                    until = time.monotonic() + self.rng.uniform(*self.freeze_for)
                    self.frozen[slot] = (proc, until)
                    self.procs.send(slot, signal.SIGSTOP)
                    self.chaos.append(Chaos(time.monotonic() - self.began, "freeze", slot,
                                            proc.pid))
                    if self.wait_out_freezes:
                        time.sleep(max(0.0, until - time.monotonic()))
                        self.thaw(slot)
                else:
                    self.procs.kill(slot)
                    self.chaos.append(Chaos(time.monotonic() - self.began, "kill", slot,
                                            proc.pid))
                    self.nap(self.rng.uniform(0.0, 0.5))
                    self.procs.start_worker(slot)
        finally:
            for slot in list(self.frozen):
                self.thaw(slot)

    def nap(self, seconds: float) -> None:
        """Sleep, thawing frozen workers when their time comes."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and not self.halt.is_set():
            self.halt.wait(min(left, 0.05))
            for slot, (_, until) in list(self.frozen.items()):
                if time.monotonic() >= until:
                    self.thaw(slot)

    def thaw(self, slot: str) -> None:
        proc, _ = self.frozen.pop(slot)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)

    def supervise(self) -> None:
        for slot, proc in list(self.procs.live.items()):
            if slot not in self.frozen and proc.poll() is not None:
                self.exited.append((self.procs.instances[slot], proc.returncode))
                self.procs.live.pop(slot)
                self.procs.start_worker(slot)

    async def reached(self, kills: int, freezes: int, timeout: float) -> None:
        """Wait (``timeout`` seconds at most, without failing: the test checks the counts) until
        the chaos has made ``kills`` kills and ``freezes`` freezes, or can make no more. A test
        holds back its last dispatches on this, so that runs still flow after that much chaos
        however fast the machine runs them."""
        async def done() -> bool:
            what = [c.what for c in self.chaos]
            return (what.count("kill") >= kills and what.count("freeze") >= freezes) \
                or not self.is_alive()
        with contextlib.suppress(AssertionError):
            await wait_until(done, timeout, "enough chaos", step=0.1)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)
        assert not self.is_alive()
        self.supervise()


def read_log(path: Path) -> list[dict[str, Any]]:
    """The log's complete lines (a line being written while we read is left for next time)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n")[:-1]]


async def wait_until(predicate: Any, timeout: float, what: str, step: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(step)


# -- the worker side ------------------------------------------------------------------------------


class LineLog:
    """The log shared by every process, at the path in the environment variable ``var``: one
    JSON line per record, appended in a single write (atomic with O_APPEND)."""

    def __init__(self, var: str) -> None:
        self.var = var
        self.fd: int | None = None

    def __call__(self, record: dict[str, Any]) -> None:
        if self.fd is None:
            self.fd = os.open(os.environ[self.var], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        assert len(data) < 4096, "a log line must stay one short write"
        os.write(self.fd, data)


class EventsToLog(logging.Handler):
    """Copies shoal's log events (app.started, run.interrupted, lease.lost, …) into the log."""

    def __init__(self, emit: LineLog, instance_var: str) -> None:
        super().__init__()
        self.line_log, self.instance_var = emit, instance_var

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        if event is None:
            return
        run_id = getattr(record, "run_id", None)
        if run_id is None and event == "run.interrupted" and record.args:
            run_id = record.args[0]
        self.line_log({"kind": "event", "event": event, "run": run_id, "pid": os.getpid(),
                  "instance": os.environ.get(self.instance_var), "t": time.time()})


def _guard(max_life: float) -> None:
    """Exit when the parent (the test) is gone or after ``max_life`` seconds: never linger."""
    parent, deadline = os.getppid(), time.monotonic() + max_life
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.5)
    os._exit(3)


def start_guard(prefix: str) -> None:
    threading.Thread(target=_guard, args=(float(os.environ.get(f"{prefix}_MAX_LIFE", "300")),),
                     daemon=True).start()


def serve(make_app: Callable[[], Any], emit: LineLog, prefix: str, drain: float) -> None:
    """A worker: shoal's events into the log, the guard, then the app of ``make_app()`` serves
    until SIGTERM (``App.run_forever``) and closes within ``{prefix}_DRAIN`` (default ``drain``)
    seconds."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(levelname)s %(message)s")
    shoal_log = logging.getLogger("shoal")
    shoal_log.setLevel(logging.INFO)
    shoal_log.addHandler(EventsToLog(emit, f"{prefix}_INSTANCE"))
    start_guard(prefix)
    app = make_app()
    app.run_forever(timeout=float(os.environ.get(f"{prefix}_DRAIN", str(drain))))
    emit({"kind": "event", "event": "worker.exited", "pid": os.getpid(),
          "instance": os.environ[f"{prefix}_INSTANCE"], "t": time.time()})


def reaper(groups_file: str, script: str, max_life: float) -> None:
    parent = os.getppid()
    deadline = time.monotonic() + max_life + 10
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.3)
    with open(groups_file) as f:
        groups = [int(line) for line in f if line.strip()]
    for pgid in groups:
        try:   # only a process group led by one of ours (its pid may have been reused)
            with open(f"/proc/{pgid}/cmdline", "rb") as f:
                if os.path.abspath(script).encode() not in f.read():
                    continue
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    if sys.argv[1:2] == ["reaper"] and len(sys.argv) == 5:
        reaper(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit(f"usage: {sys.argv[0]} reaper FILE SCRIPT MAX_LIFE")


async def wait_all_final(store: Any, namespace: str, expected: int, timeout: float) -> list[Any]:
    """Every run of ``namespace`` (at least ``expected``) final, within ``timeout`` s; a store
    that is down meanwhile (a restart, a failover) is asked again. On a timeout the error names
    the runs not final yet (id, workflow, status, owner, lease end, attempts)."""
    last: list[Any] = []

    async def final() -> list[Any] | None:
        nonlocal last
        with contextlib.suppress(Exception):
            last = await store.list_runs(namespace, limit=100_000)
        if len(last) >= expected and all(r.status.final for r in last):
            return last
        return None

    try:
        runs: list[Any] = await wait_until(final, timeout, "every run to be final", step=0.25)
        return runs
    except AssertionError:
        stuck = [(r.id, r.workflow, r.status.value, r.owner, r.lease_expires_at, r.attempts)
                 for r in last if not r.status.final]
        raise AssertionError(f"not every run is final after {timeout}s: {len(last)} runs, "
                             f"expected {expected}; {Counter(r.status.value for r in last)}; "
                             f"not final: {stuck[:10]}") from None
