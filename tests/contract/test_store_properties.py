"""Property-based tests of the store contract: Hypothesis drives random sequences of store
operations against a real store and the memory reference side by side, and compares every
answer and, after every step, the namespace's runs and stats.

``shoal.testing.contract.differential`` does the same with seeded random calls; this machine
adds what a seed cannot: Hypothesis varies the mix per example (swarm testing turns some rules
off, so others run many times in a row), and a failure shrinks to the shortest sequence that
shows it, printed as steps to turn into a plain regression test (``test_store_regressions.py``
holds those found so far).

What is normalised, and why (nothing else is):

- ids: none to map. The caller gives every id (runs, pauses, signals, outbox entries), so both
  stores see the same ones.
- times: none. Every time a store writes is a ``now`` the machine passes; it owns the clock
  (a float it moves forward by rule, sometimes to the exact end of a lease or delay).
- order: the answers the ports leave unordered (``recover_runs``, ``expire_pauses``,
  ``claim_outbox``, ``incompatible_runs``) are compared sorted by id.
- JSON is compared with its types: ``1`` and ``1.0`` differ, and so does the order of keys.

Settings: ``max_examples`` (``SHOAL_PROPERTY_EXAMPLES``, default 60; raise it to hunt, with
``--timeout=0``) sequences of at most 50 steps per store, no deadline (a loaded machine is slow,
not wrong). Under ``CI`` the examples are derandomized (the same ones every build, so a failure
there is reproduced by ``CI=true pytest ...`` anywhere) and no example database is written;
elsewhere each run explores new ones, and Hypothesis keeps the failures it found in
``.hypothesis/`` (not committed) to try first next time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import os
import sqlite3
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from shoal.backends.memory import MemoryStore
from shoal.backends.sqlite import SQLiteStore
from shoal.ports import Store
from shoal.types import (
    Fence,
    NewRun,
    OutboxEntry,
    Pause,
    Progress,
    Run,
    RunFilter,
    RunStatus,
    Settlement,
    Step,
)

NS = "props"
T0 = 1_767_225_600.0

# the tables a run store writes (coordination and rate limits are not exercised here)
RUN_TABLES = ("steps", "signals", "pauses", "outbox", "tree_keys", "runs", "run_counts",
              "workflows", "workflow_instances")

SETTINGS = settings(
    max_examples=int(os.environ.get("SHOAL_PROPERTY_EXAMPLES", "60")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
if os.environ.get("CI"):
    SETTINGS = settings(SETTINGS, derandomize=True, database=None)

# -- comparing answers ---------------------------------------------------------------------------


def typed(value: Any, json: bool = False) -> Any:
    """``value`` as a comparable tree that keeps what ``==`` forgets: the type of every number
    and string (``1`` is not ``1.0``, a RunStatus not a str) and, in a JSON value (a field
    typed ``JSON``, or with ``json``), the order of an object's keys, kept as written."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__,
                tuple((f.name, typed(getattr(value, f.name), "JSON" in str(f.type)))
                      for f in dataclasses.fields(value) if f.compare))
    if isinstance(value, dict):
        items = tuple((typed(k), typed(v, json)) for k, v in value.items())
        return ("dict", items if json else tuple(sorted(items, key=repr)))
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(typed(v, json) for v in value))
    if isinstance(value, frozenset | set):
        return ("set", tuple(sorted((typed(v) for v in value), key=repr)))
    if value is None or isinstance(value, bool | int | float | str | enum.Enum):
        return (type(value).__name__, value)
    raise TypeError(f"no comparison for {value!r}")


# answers whose order the ports leave open
UNORDERED = {"recover_runs", "expire_pauses", "claim_outbox", "incompatible_runs"}


def normalised(method: str, answer: Any) -> Any:
    if method in UNORDERED:
        return sorted(answer, key=lambda item: item.id)
    return answer


# answers that are a JSON value
JSON_ANSWERS = {"get_tree_key"}


class Refused(Exception):
    """Both stores raised the same exception class."""


# -- what the machine draws ----------------------------------------------------------------------

SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6))
JSONS = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=5)
OWNERS = st.sampled_from(["a", "b", "c"])
LEASES = st.sampled_from([10.0, 30.0])
VERSIONS = st.sampled_from([None, None, "v1", "v2"])
# which fence a write is made under (see StoreMachine.fence)
FENCES = st.tuples(st.sampled_from(["live", "live", "live", "live", "stale", "older", "newer",
                                    "stranger"]), st.integers(0, 3))


@st.composite
def run_specs(draw: st.DrawFn) -> dict[str, Any]:
    """What a new run is made of (its id, times and tree come from the machine)."""
    return {
        "workflow": draw(st.sampled_from(["wf", "wf", "other"])),
        "tenant": draw(st.sampled_from(["default", "t2"])),
        "input": draw(JSONS),
        "priority": draw(st.sampled_from([0, 0, 5, 9])),
        "delay": draw(st.sampled_from([0.0, 0.0, 0.0, 5.0, 40.0])),
        "max_attempts": draw(st.integers(1, 3)),
        "concurrency_key": draw(st.sampled_from([None, None, None, None, "k1", "k2"])),
        "idempotency_key": draw(st.sampled_from([None, None, "i1", "i2"])),
    }


# admission control: max_queued (None: none) and what is done over it
ADMISSIONS = st.tuples(st.sampled_from([None, None, None, None, None, 1, 3]),
                       st.sampled_from(["reject", "park"]))

# how an attempt ends; a float is a retry due that many seconds from now
SETTLEMENTS = st.one_of(
    st.builds(lambda out: Settlement("succeeded", output=out), JSONS),
    st.just(Settlement("failed", error="ValueError: no",
                       traceback="Traceback ...\nValueError: no\n")),
    st.just(Settlement("cancelled")),
    st.sampled_from([0.0, 3.0, 20.0]),
)


def uuid7(now: float, n: int) -> str:
    """A UUIDv7-shaped id whose time part is ``now``, ordered by ``n`` (as the app's ids are by
    creation)."""
    value = (int(now * 1000) & ((1 << 48) - 1)) << 80 | 0x7 << 76 | 0b10 << 62 | n
    return str(uuid.UUID(int=value))


# -- the machine ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Backend:
    """A store to check, opened on ``runner``'s loop, and how to empty it."""

    store: Store
    runner: asyncio.Runner
    clear: Callable[[], Coroutine[Any, Any, None]]


class StoreMachine(RuleBasedStateMachine):
    """The same operation on the memory reference and on a store, answer for answer. A test
    subclasses it with the ``backend`` to check.

    Few rules, each with a choice of variants, so that the steps of an example go to the
    operations that change state (Hypothesis draws a rule uniformly among those it can run)."""

    backend: ClassVar[Backend]

    runs = Bundle("runs")
    pauses = Bundle("pauses")

    def __init__(self) -> None:
        super().__init__()
        self.reference = MemoryStore()
        self.now = T0
        self.ids = 0
        self.children: dict[str, list[str]] = {}      # run -> its children
        self.pauses_of: dict[str, list[str]] = {}     # run -> its pauses
        self.claims: list[Fence] = []                 # every claim made, in order
        self.store = self.backend.store
        self.runner = self.backend.runner
        self.runner.run(self.backend.clear())

    # -- calling both ------------------------------------------------------------------------

    def both(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The reference's answer, once the store gave the same (or raised the same class)."""
        return self.runner.run(self._both(method, *args, **kwargs))

    async def _both(self, method: str, *args: Any, **kwargs: Any) -> Any:
        where = f"{method}{args!r} {kwargs!r} at now={self.now!r}"
        try:
            expected = await getattr(self.reference, method)(*args, **kwargs)
        except Exception as e:
            try:
                got = await getattr(self.store, method)(*args, **kwargs)
            except type(e):
                raise Refused(method) from None
            raise AssertionError(f"{where}: the reference raised {e!r}, the store answered "
                                 f"{got!r}") from None
        got = await getattr(self.store, method)(*args, **kwargs)
        json = method in JSON_ANSWERS
        assert typed(normalised(method, got), json) == typed(normalised(method, expected),
                                                             json), (
            f"{where}:\n  store:     {got!r}\n  reference: {expected!r}")
        return expected

    def read(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The reference's answer alone (what the machine needs to choose its next call)."""
        return self.runner.run(getattr(self.reference, method)(*args, **kwargs))

    def fence(self, which: str, index: int) -> Fence:
        """A fence to write under: the claim of a running run (``live``: what the reference
        holds now), a claim made before that the reference no longer honours (``stale``), or
        one the store never gave (a live one's epoch ``older`` or ``newer``, or a
        ``stranger`` owner). The ``index``-th of those there are (cycling)."""
        live = [Fence(r.id, r.owner, r.lease_epoch)
                for r in self.read("list_runs", NS, status="running", limit=10_000)]
        stale = [f for f in self.claims if f not in live]
        if which == "stale" and stale:
            return stale[index % len(stale)]
        if not live:
            return self.claims[index % len(self.claims)]
        fence = live[index % len(live)]
        if which == "stranger":
            return dataclasses.replace(fence, owner=fence.owner + "'")
        if which in ("older", "newer"):
            return dataclasses.replace(fence, epoch=fence.epoch + (1 if which == "newer" else -1))
        return fence

    def new_id(self) -> str:
        self.ids += 1
        return uuid7(self.now, self.ids)

    def new_run(self, spec: dict[str, Any], parent: Run | None) -> NewRun:
        run_id = self.new_id()
        new = NewRun(id=run_id, namespace=NS, tenant=spec["tenant"], workflow=spec["workflow"],
                     input=spec["input"], priority=spec["priority"], created_at=self.now,
                     run_at=self.now + spec["delay"], max_attempts=spec["max_attempts"],
                     concurrency_key=spec["concurrency_key"],
                     idempotency_key=spec["idempotency_key"], version=None, root_id=run_id)
        if parent is not None:
            new = dataclasses.replace(new, parent_id=parent.id, root_id=parent.root_id,
                                      tenant=parent.tenant)
        return new

    def next_step(self, fence: Fence, name: str, output: Any, finished: bool,
                  replay: bool = False) -> Step:
        """The step an attempt writes next (replacing an unfinished one at its seq), or with
        ``replay`` the last finished one again (it must stay as it was)."""
        finished_seqs = [s.seq for s in self.read("load_steps", fence.run_id) if s.finished]
        seq = finished_seqs[-1] if replay and finished_seqs else len(finished_seqs) + 1
        return Step(seq, name, output, finished, fence.epoch, started_at=self.now, attempt=1,
                    retries=0)

    # -- creating runs -------------------------------------------------------------------------

    @initialize(target=runs, specs=st.lists(run_specs(), min_size=1, max_size=4),
                admission=ADMISSIONS)
    def create_first_runs(self, specs: list[dict[str, Any]],
                          admission: tuple[int | None, str]) -> Any:
        return self.create(specs, admission, None, batch=True)

    @rule(target=runs, specs=st.lists(run_specs(), min_size=1, max_size=3),
          admission=ADMISSIONS, parent=st.none() | runs, batch=st.booleans())
    def create_runs(self, specs: list[dict[str, Any]], admission: tuple[int | None, str],
                    parent: str | None, batch: bool) -> Any:
        """One ``create_runs`` call, or one ``create_run`` call per run; children of ``parent``
        (unless pruned) when given."""
        return self.create(specs, admission, parent, batch)

    def create(self, specs: list[dict[str, Any]], admission: tuple[int | None, str],
               parent: str | None, batch: bool) -> Any:
        parent_run = None if parent is None else self.read("get_run", parent)
        news = [self.new_run(spec, parent_run) for spec in specs]
        max_queued, how = admission
        answers: list[tuple[Run, bool]] = []
        try:
            if batch:
                answers = self.both("create_runs", news, max_queued=max_queued, admission=how)
            else:
                for new in news:
                    answers.append(self.both("create_run", new, max_queued=max_queued,
                                             admission=how))
        except Refused:                 # rejected by admission control, on both
            pass
        created = [run.id for run, new in answers if new]
        if parent_run is not None:
            self.children.setdefault(parent_run.id, []).extend(created)
        return multiple(*created)

    # -- time and maintenance ----------------------------------------------------------------

    @rule(seconds=st.sampled_from([0.5, 1.0, 5.0, 12.0, 31.0, 61.0, "due", "lease end"]))
    def wait(self, seconds: float | str) -> None:
        """Time goes on: some seconds, or to the very time the next run is due (a delay, a
        sleep, a retry's backoff), or to the very end of the next lease (a claim expired at
        ``lease_expires_at`` exactly)."""
        if isinstance(seconds, float):
            self.now += seconds
            return
        runs = self.read("list_runs", NS, limit=10_000)
        if seconds == "due":
            times = [r.run_at for r in runs if not r.status.final and r.run_at is not None]
        else:
            times = [r.lease_expires_at for r in runs if r.status == RunStatus.RUNNING
                     and r.lease_expires_at is not None]
        self.now = min((t for t in times if t > self.now), default=self.now)

    @rule(what=st.sampled_from(["recover_runs", "expire_pauses", "release_held", "prune_runs",
                                "prune_pauses", "fold_stats", "claim_notifications"]),
          size=st.integers(1, 3), age=st.sampled_from([0.0, 60.0]))
    def maintenance(self, what: str, size: int, age: float) -> None:
        """What an app's maintenance loops call (``size``: a limit or ``max_queued``)."""
        if what in ("recover_runs", "expire_pauses"):
            self.both(what, NS, self.now)
        elif what == "release_held":
            self.both(what, NS, size, self.now)
        elif what in ("prune_runs", "prune_pauses"):
            self.both(what, NS, self.now - age, size)
        elif what == "fold_stats":             # no answer: the next stats must not change
            self.runner.run(self.store.fold_stats(NS, self.now))
        else:
            for pause in self.both("claim_notifications", NS, self.now, 10.0, size):
                if age:
                    self.both("mark_notified", pause.id)

    # -- claims and leases -------------------------------------------------------------------

    @rule(due=st.booleans(), owner=OWNERS, limit=st.integers(1, 3),
          lease=LEASES, version=VERSIONS, any_version=st.sampled_from([(), ("wf",)]),
          workflows=st.sampled_from([("wf", "other"), ("wf", "other"), ("wf",)]))
    def claim_runs(self, due: bool, owner: str, limit: int, lease: float, version: str | None,
                   any_version: tuple[str, ...], workflows: tuple[str, ...]) -> None:
        """A claim, with ``due`` at the time the next run is due (if later)."""
        if due:
            self.wait("due")
        claimed = self.both("claim_runs", NS, list(workflows), owner, limit, lease, self.now,
                            version=version, any_version=any_version)
        self.claims += [Fence(r.id, r.owner, r.lease_epoch) for r in claimed]

    @precondition(lambda self: self.claims)
    @rule(which=st.lists(FENCES, min_size=1, max_size=3), stranger=st.booleans(), lease=LEASES)
    def renew_leases(self, which: list[tuple[str, int]], stranger: bool, lease: float) -> None:
        """The owner of the first fence renews these (or, as ``stranger``, another owner)."""
        held = [self.fence(*w) for w in which]
        owner = held[0].owner + ("'" if stranger else "")
        self.both("renew_leases", owner, {f.run_id: f.epoch for f in held}, lease, self.now)

    # -- writes of a running run -------------------------------------------------------------

    @precondition(lambda self: self.claims)
    @rule(fence=FENCES, output=JSONS, replay=st.booleans(), lease=LEASES,
          topics=st.sampled_from([(), ("email",), ("email", "sms")]),
          progress=st.none() | st.sampled_from([0.0, 0.5, 1.0]))
    def checkpoint_step(self, fence: tuple[str, int], output: Any, replay: bool, lease: float,
                        topics: tuple[str, ...], progress: float | None) -> None:
        """A step finished, with the outbox entries it sent; maybe the run's progress first."""
        fenced = self.fence(*fence)
        if progress is not None:
            self.both("record_progress", fenced, Progress(progress, "rows", {"d": output},
                                                         self.now))
        step = self.next_step(fenced, "step", output, True, replay)
        outbox = [OutboxEntry(id=self.new_id(), namespace=NS, run_id=fenced.run_id,
                              seq=step.seq, index=i, topic=topic, payload={"to": topic},
                              created_at=self.now)
                  for i, topic in enumerate(topics)]
        self.both("checkpoint_step", fenced, step, lease, self.now, outbox)

    @precondition(lambda self: self.claims)
    @rule(fence=FENCES, settlement=SETTLEMENTS, owner=OWNERS,
          claim=st.none() | st.integers(0, 2))
    def settle_run(self, fence: tuple[str, int], settlement: Settlement | float, owner: str,
                   claim: int | None) -> None:
        """``settle_run``, or with ``claim`` ``settle_and_claim`` (that many runs for
        ``owner``; none when the settlement may make a run claimable: the port lets that claim
        miss what the settlement changes, and PostgreSQL's does, in one statement's snapshot)."""
        if isinstance(settlement, float):
            settlement = Settlement("retry", error="TimeoutError", run_at=self.now + settlement,
                                    traceback="Traceback ...\nTimeoutError\n")
        settled = self.fence(*fence)
        if claim is None:
            self.both("settle_run", settled, settlement, self.now)
            return
        run = self.read("get_run", settled.run_id)
        if settlement.outcome == "retry":
            frees = settlement.run_at is not None and settlement.run_at <= self.now
        else:       # a key freed, a parent waiting for this child made due
            frees = run is not None and (run.concurrency_key is not None
                                         or run.parent_id is not None)
        if frees:
            claim = 0
        _, claimed = self.both("settle_and_claim", [(settled, settlement, self.now)],
                               NS, ["wf", "other"], owner, claim, 30.0, self.now)
        self.claims += [Fence(r.id, r.owner, r.lease_epoch) for r in claimed]

    @precondition(lambda self: self.claims)
    @rule(target=pauses, fence=FENCES,
          how=st.sampled_from(["sleep", "signal", "approval", "approval again", "child",
                               "release"]),
          seconds=st.sampled_from([None, 0.0, 2.0, 20.0, 90.0]),
          name=st.sampled_from(["go", "paid"]))
    def suspend(self, fence: tuple[str, int], how: str, seconds: float | None,
                name: str) -> Any:
        """The attempt stops without ending the run: a sleep (``seconds``, 0 when None), a wait
        for a signal (``seconds``: its deadline), a new approval (``seconds``: its expiry) or
        the latest one of the run again (a replay), a wait for its latest child, or a release
        (a graceful stop)."""
        return self.suspend_as(self.fence(*fence), how, seconds, name)

    def suspend_as(self, fence: Fence, how: str, seconds: float | None, name: str) -> Any:
        at = None if seconds is None else self.now + seconds
        if how == "sleep":
            until = at if at is not None else self.now
            step = self.next_step(fence, "shoal.sleep", {"until": until}, False)
            self.both("suspend_run", fence, step, "sleeping", until, None, self.now)
        elif how == "signal":
            step = self.next_step(fence, f"shoal.wait_for:{name}", {"deadline": at}, False)
            self.both("wait_signal", fence, step, name, at, self.now)
        elif how == "approval":
            return self.create_pause(fence, at)
        elif how == "approval again" and self.pauses_of.get(fence.run_id):
            pause = self.pauses_of[fence.run_id][-1]
            step = self.next_step(fence, "shoal.approval:refund", {"pause_id": pause}, False)
            self.both("wait_pause", fence, step, pause, self.now)
        elif how == "child" and self.children.get(fence.run_id):
            child = self.children[fence.run_id][-1]
            step = self.next_step(fence, "shoal.child", {"child": child}, False)
            self.both("wait_child", fence, step, child, self.now)
        elif how == "release":
            self.both("release_run", fence, self.now)
        return multiple()

    def create_pause(self, fence: Fence, expires_at: float | None) -> Any:
        run = self.read("get_run", fence.run_id)
        pause = Pause(id=self.new_id(), namespace=NS,
                      tenant=run.tenant if run is not None else "default", run_id=fence.run_id,
                      name="refund", request={"amount": 40}, status="pending", decision=None,
                      created_at=self.now, expires_at=expires_at, resolved_at=None,
                      notified=False)
        step = self.next_step(fence, "shoal.approval:refund", {"pause_id": pause.id}, False)
        if not self.both("create_pause", fence, step, pause, self.now):
            return multiple()
        self.pauses_of.setdefault(fence.run_id, []).append(pause.id)
        return multiple(pause.id)

    # -- from outside the run ----------------------------------------------------------------

    @rule(run=runs, what=st.sampled_from(["signal", "signal", "cancel", "retry", "tree key"]),
          name=st.sampled_from(["go", "paid"]), value=JSONS,
          namespace=st.sampled_from([NS, NS, "elsewhere"]),
          tenant=st.sampled_from([None, None, "default", "t2"]))
    def outside(self, run: str, what: str, name: str, value: Any, namespace: str,
                tenant: str | None) -> None:
        """What callers do to a run: send it a signal, cancel it, retry it (in ``namespace``,
        of ``tenant``), or keep a key of its tree (``name`` the claimant)."""
        if what == "signal":
            self.both("send_signal", run, name, value, self.new_id(), self.now)
        elif what == "cancel":
            self.both("cancel_run", run, self.now)
        elif what == "retry":
            self.both("retry_run", namespace, run, tenant, self.now)
        else:
            found = self.read("get_run", run)
            root = found.root_id if found is not None else run
            self.both("save_tree_key", root, "paper", value, name, self.now)
            self.both("get_tree_key", root, "paper")
            self.both("tree_keys", root)

    @rule(pause=pauses, approved=st.booleans())
    def resolve_pause(self, pause: str, approved: bool) -> None:
        decision = {"approved": approved, "data": {"note": "ok"}, "by": "ana", "reason": None}
        self.both("resolve_pause", pause, decision, self.now)

    @rule(topics=st.sampled_from([("email",), ("email", "sms")]),
          lease=st.sampled_from([5.0, 30.0]), limit=st.integers(1, 3),
          outcomes=st.lists(st.sampled_from(["delivered", "retry", "dead", "redrive", None]),
                            max_size=3))
    def deliver(self, topics: tuple[str, ...], lease: float, limit: int,
                outcomes: list[str | None]) -> None:
        """An outbox claim, then what became of each entry taken (None: its deliverer died;
        ``redrive``: dead-lettered, then redriven)."""
        taken = self.both("claim_outbox", NS, list(topics), self.now, lease, limit)
        for entry, outcome in zip(taken, outcomes, strict=False):
            if outcome is None:
                continue
            error = None if outcome == "delivered" else "ConnectionError"
            retry_at = self.now + 4 if outcome == "retry" else None
            self.both("finish_delivery", entry.id, self.now, error, retry_at)
            if outcome == "redrive":
                self.both("redrive", NS, entry.id, self.now)
                self.both("redrive", "elsewhere", entry.id, self.now)   # another namespace's

    # -- reads ---------------------------------------------------------------------------------

    @rule(run=runs, known=st.booleans(), version=VERSIONS,
          status=st.sampled_from([None, "queued", "running", "waiting", "failed"]),
          workflow=st.sampled_from([None, "other"]), tenant=st.sampled_from([None, "t2"]),
          limit=st.integers(1, 3))
    def reads(self, run: str, known: bool, version: str | None, status: str | None,
              workflow: str | None, tenant: str | None, limit: int) -> None:
        """What a console and an app read: one run (or, unless ``known``, one never created)
        with everything kept about it, every page of ``list_runs`` and ``search_runs`` with
        these filters, and the namespace's other reads."""
        if not known:
            run = "no-such-run"
            self.both("get_pause", "no-such-pause")
            self.both("resolve_pause", "no-such-pause", {"approved": True}, self.now)
            self.both("redrive", NS, "no-such-entry", self.now)
            self.both("send_signal", run, "go", {}, self.new_id(), self.now)
            self.both("cancel_run", run, self.now)
        self.both("get_run", run)
        self.both("load_steps", run)
        self.both("inspect_run", run)
        after: str | None = None
        while page := self.both("list_runs", NS, status=status, workflow=workflow,
                                tenant=tenant, limit=limit, after=after):
            after = page[-1].id
        where = RunFilter(status=status, workflow=workflow, tenant=tenant)
        before: str | None = None
        while page := self.both("search_runs", NS, where, before=before, limit=limit):
            before = page[-1].id
        self.both("incompatible_runs", NS, ["wf", "other"], version, (), self.now)
        self.both("run_owners", NS)
        self.both("list_pauses", NS, tenant=tenant)
        self.both("dead_letters", NS)
        self.both("finished_per_minute", NS, self.now - 180, 4)


    @invariant()
    def same_runs_and_stats(self) -> None:
        self.both("list_runs", NS, limit=10_000)
        self.both("stats", NS, self.now)


# -- the stores ----------------------------------------------------------------------------------


def check(store: Store, runner: asyncio.Runner, clear: Callable[[], Coroutine[Any, Any, None]],
          with_settings: settings = SETTINGS) -> None:
    """Run :class:`StoreMachine` against ``store`` (opened on ``runner``'s loop)."""
    machine = type(f"{type(store).__name__}Machine", (StoreMachine,),
                   {"backend": Backend(store, runner, clear)})
    run_state_machine_as_test(machine, settings=with_settings)


@contextmanager
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as r:
        yield r


def test_sqlite_answers_as_the_memory_reference(tmp_path: Path) -> None:
    path = tmp_path / "shoal.db"

    async def clear() -> None:
        with sqlite3.connect(path) as conn:
            for table in RUN_TABLES:
                conn.execute(f"DELETE FROM {table}")
        conn.close()

    with runner() as r:
        store = SQLiteStore(str(path))
        r.run(store.open())
        try:
            check(store, r, clear)
        finally:
            r.run(store.close())


def test_postgres_answers_as_the_memory_reference(schema: str) -> None:
    import psycopg
    from psycopg import sql
    from test_postgres import URL, _open

    with runner() as r, psycopg.connect(URL, autocommit=True) as conn:
        store = r.run(_open(schema))
        statement = sql.SQL("; ").join(
            sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, table))
            for table in RUN_TABLES)

        async def clear() -> None:
            conn.execute(statement)

        try:
            check(store, r, clear)
        finally:
            r.run(store.close())


def test_the_machine_finds_a_store_that_answers_otherwise(tmp_path: Path) -> None:
    """A store that forgets a lease's epoch on renewal (it renews any epoch of the owner) is
    caught: the comparison is not vacuous."""

    class Lenient(MemoryStore):
        async def renew_leases(self, owner: str, leases: dict[str, int], lease: float,
                               now: float) -> Any:
            current = {run_id: run.lease_epoch for run_id, run in self._runs.items()}
            return await super().renew_leases(
                owner, {run_id: current.get(run_id, epoch) for run_id, epoch in leases.items()},
                lease, now)

    with runner() as r:
        store = Lenient()

        async def clear() -> None:
            Lenient.__init__(store)     # empty again

        # the same examples every time (this test must not depend on luck), not shrunk
        unshrunk = settings(SETTINGS, derandomize=True, database=None,
                            phases=[Phase.generate])
        with pytest.raises(AssertionError, match="renew_leases"):
            check(store, r, clear, unshrunk)
