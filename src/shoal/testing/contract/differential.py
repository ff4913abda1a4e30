"""Seeded differential tests: the same random calls on a backend and on a fresh
:class:`~shoal.backends.memory.MemoryStore` (the reference), answer for answer.

One generator per concern, each a coroutine function a backend's tests can call with a store of
their own (opened and empty) and a :class:`random.Random`:

- :func:`run_calls`: runs created (idempotency and concurrency keys, priorities, delays,
  children, admission control), claimed, renewed, checkpointed (with outbox entries), settled,
  released, recovered once their lease ends under an advancing ``now``, cancelled and retried;
  sleeps, signals, pauses, child waits, tree keys, outbox deliveries and retention; and the
  namespace's stats every few calls, before and after a fold;
- :func:`coord_calls`: locks, membership and meters in two namespaces;
- :func:`rate_calls`: slots, windows, pauses, admissions, counters and the ledger, with amounts
  whose sums are exact whatever the order a backend adds them in; :func:`rate_calls_apart`
  also with replicas' clocks apart and amounts whose sums round (for a store that adds in the
  reference's order, as the Redis scripts do).

The contract classes :class:`RunDifferential`, :class:`CoordDifferential` and
:class:`RateDifferential` run them under pytest: mix one into a test class that provides the
store fixture (``store``, ``coord`` or ``rates``); each seed of ``differential_seeds`` is one test
of ``differential_calls`` calls. A failure names the seed, the call's number and its arguments.

Ids are the caller's (runs, pauses, signals, outbox entries are given theirs by the app), so both
stores see the same ones; lists whose order the ports leave open are compared sorted by id.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import pytest

from shoal.backends.memory import MemoryStore
from shoal.ports import CoordStore, RateStore, Store
from shoal.testing.contract.rates import increasing, unwritten
from shoal.testing.contract.support import NS, T0
from shoal.types import (
    CircuitNeed,
    Fence,
    FlowLimits,
    MemberView,
    Need,
    NewRun,
    OutboxEntry,
    Pause,
    PauseNeed,
    Progress,
    Run,
    RunStatus,
    Settlement,
    SlotNeed,
    SpendEntry,
    Step,
    WindowNeed,
    WindowResult,
)

# -- calling both stores -----------------------------------------------------------------------


def _alike(got: object, expected: object) -> bool:
    """Equal, except that window totals agree to the last bits: a running total's rounding
    depends on the order of its additions and subtractions."""
    if isinstance(got, WindowResult) and isinstance(expected, WindowResult):
        return (got.added, got.retry_at) == (expected.added, expected.retry_at) and \
            got.total == pytest.approx(expected.total, rel=1e-9, abs=1e-9)
    return got == expected


class _Both:
    """Calls a method on the reference, then on the store under test, and asserts the same
    answer (or the same exception class). ``normalise(method, answer)`` prepares both answers
    for the comparison."""

    def __init__(self, reference: Any, store: Any,
                 normalise: Callable[[str, Any], Any] = lambda method, answer: answer) -> None:
        self.reference = reference
        self.store = store
        self.normalise = normalise
        self.calls = 0

    async def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        where = f"call {self.calls}: {method}{args!r} {kwargs!r}"
        try:
            expected = await getattr(self.reference, method)(*args, **kwargs)
        except Exception as e:
            try:
                got = await getattr(self.store, method)(*args, **kwargs)
            except type(e):
                raise _Refused(e) from None
            raise AssertionError(f"{where}: the reference raised {e!r}, the store answered "
                                 f"{got!r}") from None
        got = await getattr(self.store, method)(*args, **kwargs)
        assert _alike(self.normalise(method, got), self.normalise(method, expected)), (
            f"{where}:\n  store:     {got!r}\n  reference: {expected!r}")
        return expected


class _Refused(Exception):
    """Both stores raised the same exception class (e.g. admission rejected)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


# -- runs -----------------------------------------------------------------------------------------

# answers whose order the ports leave open (claim_outbox: which entries it takes is the earliest
# due first, but a PostgreSQL UPDATE returns them in any order)
_UNORDERED = {"recover_runs", "expire_pauses", "incompatible_runs", "claim_outbox"}


def _normalised(answer: Any) -> Any:
    """``answer`` with what the ports leave open set aside: when a cancelled run is due. (A
    root cancelled while it waits for a child: the child's end makes it due at ``now`` on
    SQLite, not in memory or on PostgreSQL, and a final run is never due again.)"""
    if isinstance(answer, Run) and answer.status == RunStatus.CANCELLED:
        return dataclasses.replace(answer, run_at=None)
    if isinstance(answer, list | tuple):
        return type(answer)(_normalised(a) for a in answer)
    return answer


def _by_id(method: str, answer: Any) -> Any:
    if method in _UNORDERED and isinstance(answer, list):
        answer = sorted(answer, key=lambda r: r.id)
    return _normalised(answer)


def _uuid(now: float, n: int) -> str:
    """A UUIDv7-shaped id whose time part is ``now``, ordered by ``n`` (as the app's ids are by
    creation) and the same on every run of a seed."""
    value = (int(now * 1000) & ((1 << 48) - 1)) << 80 | 0x7 << 76 | 0b10 << 62 | n
    return str(uuid.UUID(int=value))


@dataclasses.dataclass
class _RunWorld:
    """What the generator knows from the reference's answers: the runs, the claims, the
    pauses, the outbox entries taken."""

    rnd: random.Random
    both: _Both
    reference: Store
    now: float = T0
    ids: int = 0
    runs: list[str] = dataclasses.field(default_factory=list)
    roots: dict[str, str] = dataclasses.field(default_factory=dict)       # run -> root
    children: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    claims: dict[str, Fence] = dataclasses.field(default_factory=dict)    # run -> latest claim
    stale: list[Fence] = dataclasses.field(default_factory=list)
    pauses: dict[str, str] = dataclasses.field(default_factory=dict)      # pause -> run
    taken: list[str] = dataclasses.field(default_factory=list)            # outbox entries

    def new_id(self) -> str:
        self.ids += 1
        return _uuid(self.now, self.ids)

    def some_run(self) -> str:
        """A run created (often one claimed now), sometimes an unknown id."""
        if not self.runs or self.rnd.random() < 0.03:
            return "no-such-run"
        if self.claims and self.rnd.random() < 0.4:
            return self.rnd.choice(sorted(self.claims))
        return self.rnd.choice(self.runs)

    def some_fence(self) -> Fence | None:
        """A claim to write under: mostly one the reference still honours, sometimes an old
        one (the write must be refused by both)."""
        if self.stale and (not self.claims or self.rnd.random() < 0.15):
            return self.rnd.choice(self.stale)
        if not self.claims:
            return None
        return self.claims[self.rnd.choice(sorted(self.claims))]

    def claimed(self, runs: list[Run]) -> None:
        for run in runs:
            if run.id in self.claims:
                self.stale.append(self.claims[run.id])
            assert run.owner is not None
            self.claims[run.id] = Fence(run.id, run.owner, run.lease_epoch)

    def ended_claim(self, fence: Fence) -> None:
        """The claim was dropped (settled, suspended, released): keep it to try as stale."""
        if self.claims.get(fence.run_id) == fence:
            del self.claims[fence.run_id]
            self.stale.append(fence)

    async def next_seq(self, run_id: str) -> int:
        """The step an attempt would write next (an unfinished step at that seq is replaced);
        sometimes a finished one again (a replay: it must stay as it was)."""
        steps = await self.reference.load_steps(run_id)
        finished = [s.seq for s in steps if s.finished]
        if finished and self.rnd.random() < 0.15:
            return self.rnd.choice(finished)
        return len(finished) + 1


async def _create(w: _RunWorld) -> None:
    rnd = w.rnd
    run_id = w.new_id()
    parent = rnd.choice(w.runs) if w.runs and rnd.random() < 0.2 else None
    tenant = rnd.choice(["default", "default", "t2"])
    new = NewRun(
        id=run_id, namespace=NS, tenant=tenant, workflow=rnd.choice(["wf", "wf", "other"]),
        input={"n": w.ids, "tags": ["x", None, 2.5]}, priority=rnd.choice([0, 0, 0, 5, 9]),
        created_at=w.now, run_at=w.now + rnd.choice([0, 0, 0, 5, 40]),
        max_attempts=rnd.choice([1, 2, 3]), concurrency_key=rnd.choice([None, None, "k1", "k2"]),
        idempotency_key=rnd.choice([None, None, None, "i1", "i2", "i3"]), version=None,
        root_id=run_id, rate_key=rnd.choice([None, None, "r1", "r2"]))
    parent_run = await w.reference.get_run(parent) if parent is not None else None
    if parent_run is not None:          # a child (unless its parent was pruned)
        new = dataclasses.replace(new, parent_id=parent_run.id, root_id=parent_run.root_id,
                                  tenant=parent_run.tenant)
    max_queued = rnd.choice([2, 4]) if rnd.random() < 0.2 else None
    admission = rnd.choice(["reject", "park"])
    run, created = await w.both("create_run", new, max_queued=max_queued, admission=admission)
    if created:
        w.runs.append(run.id)
        w.roots[run.id] = run.root_id
        if parent_run is not None:
            w.children.setdefault(parent_run.id, []).append(run.id)


async def _claim(w: _RunWorld) -> None:
    rnd = w.rnd
    if rnd.random() < 0.3:
        # to the very time the next run is due (a delay, a sleep, a retry's backoff)
        due = [r.run_at for r in await w.reference.list_runs(NS, limit=10_000)
               if not r.status.final and r.run_at is not None and r.run_at > w.now]
        w.now = min(due, default=w.now)
    version = rnd.choice([None, None, "v1", "v2"])
    claimed = await w.both(
        "claim_runs", NS, list(rnd.choice([("wf",), ("wf", "other"), ("other",)])),
        rnd.choice(["a", "b", "c"]), rnd.randint(1, 3), rnd.choice([10.0, 30.0]), w.now,
        version=version, any_version=rnd.choice([(), ("wf",)]),
        # a limit of one (as without limits), of two, or one raised or lowered meanwhile
        concurrency_limits=rnd.choice([None, {"wf": 2}, {"wf": 2, "other": 3}, {"other": 2}]),
        # flow rules (see _FLOWS) changed from claim to claim (deploys), and tenants taking
        # turns (with the weights _tenant_weight stores), alone or with the other rules
        flow=_flow(rnd))
    w.claimed(claimed)


# the flow rules of a claim: none, running caps of a workflow and of its tenants, a rate, or
# both (changed from claim to claim, as by deploys)
_FLOWS: list[dict[str, FlowLimits] | None] = [
    None, None, None, {"wf": FlowLimits(max_running=2)},
    {"wf": FlowLimits(max_running_per_tenant=1)},
    {"wf": FlowLimits(max_running=3, max_running_per_tenant=2),
     "other": FlowLimits(max_running=1)},
    {"other": FlowLimits(max_running_per_tenant=1)},
    {"wf": FlowLimits(rate_limit=2, rate_per=10.0)},
    {"wf": FlowLimits(rate_limit=1, rate_per=30.0),
     "other": FlowLimits(rate_limit=3, rate_per=5.0)},
    {"wf": FlowLimits(max_running=2, rate_limit=2, rate_per=10.0),
     "other": FlowLimits(max_running_per_tenant=1)},
    {"wf": FlowLimits(rate_limit=3, rate_per=30.0),
     "other": FlowLimits(max_running=2, rate_limit=1, rate_per=5.0)},
]
_FAIR: list[tuple[str, ...]] = [(), (), ("wf",), ("other",), ("wf", "other")]


def _flow(rnd: random.Random) -> dict[str, FlowLimits] | None:
    """A claim's flow: one of _FLOWS, with fairness="tenant" on some of its workflows."""
    chosen = rnd.choice(_FLOWS)
    flow = dict(chosen) if chosen else {}
    for workflow in rnd.choice(_FAIR):
        flow[workflow] = dataclasses.replace(flow.get(workflow, FlowLimits()), fairness="tenant")
    return flow or None


async def _tenant_weight(w: _RunWorld) -> None:
    rnd = w.rnd
    await w.both("set_tenant_weight", NS, rnd.choice(["default", "t2"]),
                 rnd.choice([1, 2, 3, 0.5]))
    await w.both("tenant_weights", NS)


async def _pause_workflow(w: _RunWorld) -> None:
    rnd = w.rnd
    call = rnd.choice(["pause_workflow", "pause_workflow", "resume_workflow", "resume_workflow"])
    await w.both(call, NS, rnd.choice(["wf", "other"]), rnd.choice([None, "default", "t2"]),
                 w.now)
    await w.both("paused_workflows", NS)


async def _renew(w: _RunWorld) -> None:
    owner = w.rnd.choice(["a", "b", "c"])
    leases = {f.run_id: f.epoch for f in [*w.claims.values(), *w.stale[-3:]]
              if f.owner == owner}
    await w.both("renew_leases", owner, leases, w.rnd.choice([10.0, 30.0]), w.now)


def _entries(w: _RunWorld, run_id: str, seq: int) -> list[OutboxEntry]:
    topics = w.rnd.choice([[], [], ["email"], ["email", "sms"]])
    return [OutboxEntry(id=w.new_id(), namespace=NS, run_id=run_id, seq=seq, index=i,
                        topic=topic, payload={"to": topic, "i": i}, created_at=w.now)
            for i, topic in enumerate(topics)]


async def _checkpoint(w: _RunWorld) -> None:
    fence = w.some_fence()
    if fence is None:
        return
    seq = await w.next_seq(fence.run_id)
    step = Step(seq, f"step{seq}", {"seq": seq, "at": w.now}, True, 0)
    await w.both("checkpoint_step", fence, step, w.rnd.choice([10.0, 30.0]), w.now,
                 _entries(w, fence.run_id, seq))


async def _progress(w: _RunWorld) -> None:
    fence = w.some_fence()
    if fence is None:
        return
    rnd = w.rnd
    value = Progress(rnd.choice([None, 0.0, 0.25, 1.0]), rnd.choice([None, "rows", "ünï ✓"]),
                     rnd.choice([{}, {"rows": 3, "of": [1, 2.5, None]}]), w.now)
    await w.both("record_progress", fence, value)


async def _settle(w: _RunWorld) -> None:
    fence = w.some_fence()
    if fence is None:
        return
    rnd = w.rnd
    settlement = rnd.choice([
        Settlement("succeeded", output={"ok": True}),
        Settlement("failed", error="ValueError: no", traceback="Traceback ...\nValueError: no\n"),
        Settlement("cancelled"),
        Settlement("retry", error="TimeoutError", run_at=w.now + rnd.choice([0, 3, 20]),
                   traceback="Traceback ...\nTimeoutError\n")])
    if await w.both("settle_run", fence, settlement, w.now):
        w.ended_claim(fence)


async def _release(w: _RunWorld) -> None:
    fence = w.some_fence()
    if fence is not None and await w.both("release_run", fence, w.now):
        w.ended_claim(fence)


async def _sleep(w: _RunWorld) -> None:
    fence = w.some_fence()
    if fence is None:
        return
    until = w.now + w.rnd.choice([0, 2, 15, 60])
    step = Step(await w.next_seq(fence.run_id), "shoal.sleep", {"until": until}, False, 0)
    if await w.both("suspend_run", fence, step, "sleeping", until, None, w.now):
        w.ended_claim(fence)


async def _wait_signal(w: _RunWorld) -> None:
    fence = w.some_fence()
    if fence is None:
        return
    name = w.rnd.choice(["go", "paid"])
    deadline = w.rnd.choice([None, None, w.now, w.now + 10])
    step = Step(await w.next_seq(fence.run_id), f"shoal.wait_for:{name}", {"deadline": deadline},
                False, 0)
    got = await w.both("wait_signal", fence, step, name, deadline, w.now)
    if got is not None and got.parked:
        w.ended_claim(fence)


async def _send_signal(w: _RunWorld) -> None:
    await w.both("send_signal", w.some_run(), w.rnd.choice(["go", "paid", "other"]),
                 {"amount": w.rnd.randint(1, 9)}, w.new_id(), w.now)


async def _recover(w: _RunWorld) -> None:
    if w.claims and w.rnd.random() < 0.5:
        # to the very end of a lease: the claim has expired at lease_expires_at exactly
        runs = [await w.reference.get_run(run_id) for run_id in sorted(w.claims)]
        ends = [r.lease_expires_at for r in runs
                if r is not None and r.lease_expires_at is not None]
        w.now = max(w.now, w.rnd.choice(ends)) if ends else w.now
    for run in await w.both("recover_runs", NS, w.now):
        fence = w.claims.get(run.id)
        if fence is not None:
            w.ended_claim(fence)


async def _cancel(w: _RunWorld) -> None:
    await w.both("cancel_run", w.some_run(), w.now)


async def _retry(w: _RunWorld) -> None:
    await w.both("retry_run", w.rnd.choice([NS, NS, NS, "elsewhere"]), w.some_run(),
                 w.rnd.choice([None, None, "default", "t2"]), w.now)


async def _release_held(w: _RunWorld) -> None:
    await w.both("release_held", NS, w.rnd.choice([1, 3, 5]), w.now)


async def _create_pause(w: _RunWorld) -> None:
    fence = w.some_fence()
    if fence is None:
        return
    run = await w.reference.get_run(fence.run_id)
    tenant = run.tenant if run is not None else "default"    # pruned: the fence is refused
    pause = Pause(id=w.new_id(), namespace=NS, tenant=tenant, run_id=fence.run_id,
                  name="refund", request={"amount": 40}, status="pending", decision=None,
                  created_at=w.now, expires_at=w.rnd.choice([None, w.now + 20, w.now + 90]),
                  resolved_at=None, notified=False)
    step = Step(await w.next_seq(fence.run_id), "shoal.approval:refund",
                {"pause_id": pause.id}, False, 0)
    if await w.both("create_pause", fence, step, pause, w.now):
        w.pauses[pause.id] = fence.run_id
        w.ended_claim(fence)


def _some_pause(w: _RunWorld) -> str:
    if not w.pauses or w.rnd.random() < 0.05:
        return "no-such-pause"
    return w.rnd.choice(sorted(w.pauses))


async def _resolve_pause(w: _RunWorld) -> None:
    decision = {"approved": w.rnd.random() < 0.5, "data": {"note": "ok"}, "by": "ana",
                "reason": None}
    await w.both("resolve_pause", _some_pause(w), decision, w.now)


async def _wait_pause(w: _RunWorld) -> None:
    fence = w.some_fence()
    if fence is None:
        return
    mine = [p for p, run in w.pauses.items() if run == fence.run_id]
    pause_id = w.rnd.choice(sorted(mine)) if mine else _some_pause(w)
    step = Step(await w.next_seq(fence.run_id), "shoal.approval:refund", {"pause_id": pause_id},
                False, 0)
    got = await w.both("wait_pause", fence, step, pause_id, w.now)
    if got is not None and got.parked:
        w.ended_claim(fence)


async def _pause_reads(w: _RunWorld) -> None:
    what = w.rnd.random()
    if what < 0.3:
        await w.both("expire_pauses", NS, w.now)
    elif what < 0.5:
        await w.both("list_pauses", NS, tenant=w.rnd.choice([None, "t2"]),
                     limit=w.rnd.choice([2, 100]))
    elif what < 0.65:
        await w.both("get_pause", _some_pause(w))
    elif what < 0.85:
        for pause in await w.both("claim_notifications", NS, w.now, 10.0, w.rnd.randint(1, 3)):
            if w.rnd.random() < 0.5:
                await w.both("mark_notified", pause.id)
    else:
        await w.both("prune_pauses", NS, w.now - w.rnd.choice([0, 30]), w.rnd.randint(1, 3))


async def _wait_child(w: _RunWorld) -> None:
    parents = [f for f in w.claims.values() if w.children.get(f.run_id)]
    if not parents:
        return
    fence = w.rnd.choice(sorted(parents, key=lambda f: f.run_id))
    child = w.rnd.choice(w.children[fence.run_id])
    step = Step(await w.next_seq(fence.run_id), "shoal.child", {"child": child}, False, 0)
    got = await w.both("wait_child", fence, step, child, w.now)
    if got is not None and not got.status.final:
        w.ended_claim(fence)


async def _tree_keys(w: _RunWorld) -> None:
    root = w.roots.get(w.some_run(), "no-such-root")
    key = w.rnd.choice(["paper:1", "paper:2", "topic"])
    what = w.rnd.random()
    if what < 0.6:
        await w.both("save_tree_key", root, key, {"by": w.ids}, w.rnd.choice(["s1", "s2"]),
                     w.now)
    elif what < 0.8:
        await w.both("get_tree_key", root, key)
    else:
        await w.both("tree_keys", root)


async def _outbox(w: _RunWorld) -> None:
    what = w.rnd.random()
    if what < 0.45:
        got = await w.both("claim_outbox", NS, w.rnd.choice([["email"], ["email", "sms"]]),
                           w.now, w.rnd.choice([5.0, 30.0]), w.rnd.randint(1, 3))
        w.taken.extend(e.id for e in got)
    elif what < 0.85 and w.taken:
        entry = w.rnd.choice(w.taken)
        failed = w.rnd.random() < 0.5
        await w.both("finish_delivery", entry, w.now, "ConnectionError" if failed else None,
                     w.rnd.choice([None, w.now + 4]) if failed else None)
    else:
        await w.both("dead_letters", NS, limit=w.rnd.choice([2, 100]))


async def _reads(w: _RunWorld) -> None:
    rnd = w.rnd
    what = rnd.random()
    if what < 0.3:
        await w.both("get_run", w.some_run())
    elif what < 0.55:
        await w.both("load_steps", w.some_run())
    elif what < 0.85:
        after = rnd.choice(w.runs) if w.runs and rnd.random() < 0.3 else None
        await w.both("list_runs", rnd.choice([NS, NS, None, "elsewhere"]),
                     status=rnd.choice([None, None, "queued", "running", "waiting", "failed"]),
                     workflow=rnd.choice([None, "other"]), tenant=rnd.choice([None, "t2"]),
                     limit=rnd.choice([3, 100]), after=after)
    else:
        await w.both("incompatible_runs", NS, ["wf", "other"], rnd.choice([None, "v1", "v2"]),
                     rnd.choice([(), ("wf",)]), w.now)


async def _prune(w: _RunWorld) -> None:
    await w.both("prune_runs", NS, w.now - w.rnd.choice([0, 60, 300]), w.rnd.randint(1, 3))


_RUN_OPS: list[tuple[Callable[[_RunWorld], Awaitable[None]], int]] = [
    (_create, 14), (_claim, 14), (_renew, 3), (_checkpoint, 8), (_settle, 8), (_release, 2),
    (_sleep, 4), (_wait_signal, 4), (_send_signal, 5), (_recover, 5), (_cancel, 3), (_retry, 3),
    (_release_held, 2), (_create_pause, 3), (_resolve_pause, 3), (_wait_pause, 2),
    (_pause_reads, 4), (_wait_child, 3), (_tree_keys, 3), (_outbox, 5), (_reads, 6), (_prune, 1),
    (_progress, 3), (_pause_workflow, 2), (_tenant_weight, 2),
]


async def run_calls(rnd: random.Random, store: Store, reference: Store | None = None,
                    calls: int = 300) -> None:
    """``calls`` random operations of the run store (:class:`~shoal.ports.Store`) on ``store``
    and on ``reference`` (a fresh MemoryStore when None), answer for answer; ``now`` advances
    by random steps, past leases and delays. Both stores start empty."""
    reference = reference if reference is not None else MemoryStore()
    w = _RunWorld(rnd, _Both(reference, store, _by_id), reference)
    ops, weights = zip(*_RUN_OPS, strict=True)
    done = 0
    while w.both.calls < calls:
        w.now += rnd.choice([0, 0, 0.5, 1, 2, 5, 12, 31])
        with contextlib.suppress(_Refused):     # both refused it alike (a child unknown...)
            await rnd.choices(ops, weights)[0](w)
        done += 1
        if done % _STATS_EVERY == 0:
            await _same_stats(w, store, fold=done % (2 * _STATS_EVERY) == 0)
    await _same_stats(w, store, fold=True)


# the stats are compared every so many operations (not drawn from the seed's random numbers, so
# a seed makes the same calls with or without them), every other time after a fold
_STATS_EVERY = 10


async def _same_stats(w: _RunWorld, store: Store, *, fold: bool) -> None:
    expected = await w.reference.stats(NS, w.now)
    if fold:
        await store.fold_stats(NS, w.now)
    got = await store.stats(NS, w.now)
    assert got == expected, (f"stats after call {w.both.calls} (now {w.now}):\n  store:     "
                             f"{got!r}\n  reference: {expected!r}")


# -- coordination ---------------------------------------------------------------------------------


async def coord_calls(rnd: random.Random, store: CoordStore,
                      reference: CoordStore | None = None, calls: int = 250) -> None:
    """``calls`` random lock, membership and meter calls in two namespaces on ``store`` and on
    ``reference`` (a fresh MemoryStore when None), answer for answer: tickets, tokens, retry
    times, rosters, generations, debts (some charged at a time a little behind)."""
    both = _Both(reference if reference is not None else MemoryStore(), store)
    keysets = [["a"], ["b"], ["a", "b"], ["b", "c"], ["c", "a", "b"]]
    held: dict[tuple[str, str], int | None] = {}
    now = T0
    for _ in range(calls):
        now += rnd.choice([0, 0, 0.5, 1, 3, 7])
        ns, op = rnd.choice(["n1", "n2"]), rnd.random()
        holder, keys = rnd.choice([f"h{i}" for i in range(6)]), rnd.choice(keysets)
        member, lease = rnd.choice(["m1", "m2", "m3"]), rnd.choice([2.0, 5.0, 10.0])
        if op < 0.35:
            await both("lock_acquire", ns, keys, holder, lease, now)
        elif op < 0.5:
            await both("lock_renew", ns, keys, holder, lease, now)
        elif op < 0.65:
            await both("lock_release", ns, keys, holder)
        elif op < 0.85:
            mine = rnd.choice([None, held.get((ns, member)), 1, 2])
            view = await both("heartbeat", ns, member, mine, now, rnd.choice([6.0, 15.0]),
                              rnd.choice([0.0, 3.0, 10.0]))
            assert isinstance(view, MemberView)
            held[(ns, member)] = view.generation if view.granted else None
        elif op < 0.9:
            await both("leave", ns, member)
            held[(ns, member)] = None
        else:
            names = [rnd.choice("xyz") for _ in range(rnd.randint(1, 4))]
            deltas = [rnd.choice([0, 100, 2500.5, 7, 1 / 3]) for _ in names]
            await both("meter", ns, names, deltas, now - rnd.choice([0, 0, 2]))


# -- rate limits and the ledger -------------------------------------------------------------------


def _ledger_rows(method: str, answer: Any) -> Any:
    """Ledger rows without their ids (a SQL ledger numbers the rows of every namespace in one
    sequence), once they are checked to increase."""
    if method == "ledger":
        assert increasing(answer), answer
        return [unwritten(r) for r in answer]
    return answer


def _random_needs(rnd: random.Random) -> list[Need]:
    """What an admission among :func:`rate_calls` asks for, in a random order: maybe a
    circuit (its pause "a" or "b", counters "x" and "y", trial slot "c"), slots "a" and "b",
    pauses, and room in windows "a" and "b" (the lengths and limits rate_calls gives them)."""
    needs: list[Need] = []
    if rnd.random() < 0.2:
        needs.append(CircuitNeed(rnd.choice(["a", "b"]), "x", "y", "c", 10.0))
    for key in rnd.sample(["a", "b"], rnd.randint(0, 2)):
        needs.append(SlotNeed(key, rnd.choice([1, 2, 3]), rnd.choice([5.0, 30.0])))
    opens = {n.open for n in needs if isinstance(n, CircuitNeed)}
    needs.extend(PauseNeed(key) for key in rnd.sample(["a", "b"], rnd.randint(0, 1))
                 if key not in opens)
    for key in rnd.sample(["a", "b"], rnd.randint(0, 2)):
        limit = {"a": 6, "b": 10}[key] if rnd.random() < 0.85 else None
        needs.append(WindowNeed(key, rnd.choice([1, 2, 0.25, 12]), {"a": 10.0, "b": 60.0}[key],
                                limit))
    rnd.shuffle(needs)
    return needs


async def rate_calls(rnd: random.Random, store: RateStore, reference: RateStore | None = None,
                     calls: int = 250) -> None:
    """``calls`` random rate-limit and ledger calls in two namespaces on ``store`` and on
    ``reference`` (a fresh MemoryStore when None), answer for answer. The amounts of limited
    windows and of counters are small multiples of 1/4, so that every sum, and so every verdict
    and retry time, is exact whatever the order the backend adds in. A window's total is a
    running total, whose last bit depends on the order of its additions and subtractions: totals
    are compared to 1e-9, and a window never limited ("c") gets amounts whose sums round.
    Negative window amounts (corrections) may be dated before other entries."""
    both = _Both(reference if reference is not None else MemoryStore(), store, _ledger_rows)
    now = 1000.0
    for _ in range(calls):
        now += rnd.choice([0, 0, 0, 0.25, 0.5, 1]) if rnd.random() < 0.98 else 40
        ns, op = rnd.choice(["n1", "n2"]), rnd.random()
        key = rnd.choice(["a", "b"])
        if rnd.random() < 0.15:
            await both("admit", ns, rnd.choice([f"h{i}" for i in range(5)]),
                       _random_needs(rnd), now)
            continue
        if op < 0.2:
            holder = rnd.choice([f"h{i}" for i in range(5)])
            await both("slot_acquire", ns, key, holder, rnd.choice([1, 2, 3]),
                       rnd.choice([5.0, 30.0]), now)
        elif op < 0.27:
            await both("slot_renew", ns, key, rnd.choice(["h0", "h1", "h2"]), 10.0, now)
        elif op < 0.32:
            await both("slot_release", ns, key, rnd.choice(["h0", "h1", "h2"]))
        elif op < 0.6:
            amount = rnd.choice([0, 1, 1, 2, 2, 3, 0.25, -1, -0.5, 12])
            limit = {"a": 6, "b": 10}[key] if rnd.random() < 0.85 else None
            if rnd.random() < 0.3:
                key, amount, limit = "c", rnd.choice([0, 0.1, 0.7, 1 / 3, -0.2]), None
            at = now - rnd.choice([0, 0.25, 3]) if amount < 0 else now
            await both("window_add", ns, key, amount, {"a": 10.0, "b": 60.0, "c": 5.0}[key],
                       limit, at)
        elif op < 0.62:
            await both("window_clear", ns, key)
        elif op < 0.66:
            await both("pause_until", ns, key, now + rnd.choice([-5, 0, 5, 30]), now)
        elif op < 0.72:
            await both("paused_until", ns, key, now)
        elif op < 0.95:
            n = rnd.randint(0, 3)
            names = [rnd.choice("xyz") for _ in range(n)]
            amounts = [rnd.choice([0, 0.25, 1, 2.5, -0.5, 3]) for _ in range(n)]
            limits = [rnd.choice([None, 2, 5, 8]) for _ in range(n)]
            entry = (None if rnd.random() < 0.3 else
                     SpendEntry(rnd.choice(["t1", "t2"]), rnd.choice([None, "r1", "r2"]),
                                rnd.choice([None, "r1", "r9"]), sum(amounts), "usd", now))
            await both("counter_add", ns, names, amounts, limits, now, entry)
        else:
            await both("ledger", ns, tenant=rnd.choice([None, "t1", "t2"]),
                       root_id=rnd.choice([None, "r1", "r9"]), limit=rnd.choice([3, 1000]))


def _needs_apart(rnd: random.Random, keys: list[str]) -> list[Need]:
    """An admission's needs over :func:`rate_calls_apart`'s keys: maybe a circuit (its pause,
    two of the counters, its trial slot), slots, pauses and windows (amounts > 0), in a random
    order."""
    needs: list[Need] = []
    named = {"slot": rnd.sample(keys, rnd.randint(0, 2)),
             "pause": rnd.sample(keys, rnd.randint(0, 1)),
             "window": rnd.sample(keys, rnd.randint(0, 2))}
    if rnd.random() < 0.25:
        opened, closed = rnd.sample(keys, 2)
        free = [k for k in keys if k not in named["slot"] and k not in named["pause"]]
        if len(free) >= 2:
            needs.append(CircuitNeed(free[0], opened, closed, free[1], rnd.choice([5.0, 12.5])))
    needs += [SlotNeed(k, rnd.randint(1, 3), rnd.choice([5.0, 12.5])) for k in named["slot"]]
    needs += [PauseNeed(k) for k in named["pause"]]
    needs += [WindowNeed(k, rnd.choice([1, 2, 0.1, 1 / 3, 0.7, 2.5, 7, 12]),
                         rnd.choice([10.0, 30.0, 60.0]), rnd.choice([None, 5, 10.5, 100 / 3]))
              for k in named["window"]]
    rnd.shuffle(needs)
    return needs


async def rate_calls_apart(rnd: random.Random, store: RateStore,
                           reference: RateStore | None = None, calls: int = 1500) -> None:
    """``calls`` random slot, window, pause, counter, ledger and admit calls in one namespace
    on ``store`` and on ``reference`` (a fresh MemoryStore when None), answer for answer, with
    replicas' clocks a little apart, amounts that are ints and floats whose sums round, and
    keys named twice; the ledgers are equal at the end, ids included. Stricter than
    :func:`rate_calls`: a window near its limit gets the reference's verdict only if the store
    adds and subtracts in the reference's order."""
    both = _Both(reference if reference is not None else MemoryStore(), store)
    clock = T0
    keys, holders = ["a", "b", "c"], [f"h{i}" for i in range(6)]
    tenants, roots = ["t1", "t2"], ["r1", "r2", None]
    for step in range(calls):
        clock += rnd.choice([0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.5])
        now = clock + rnd.choice([0.0, 0.0, -0.3, 0.2, -2.0])          # skewed replicas
        key = rnd.choice(keys)
        op = rnd.choice(["slot", "slot", "renew", "release", "window", "window", "window",
                         "clear", "pause", "paused", "counter", "counter", "ledger",
                         "admit", "admit"])
        if op == "slot":
            await both("slot_acquire", NS, key, rnd.choice(holders), rnd.randint(1, 3),
                       rnd.choice([5.0, 12.5]), now)
        elif op == "renew":
            await both("slot_renew", NS, key, rnd.choice(holders), rnd.choice([5.0, 10 / 3]),
                       now)
        elif op == "release":
            await both("slot_release", NS, key, rnd.choice(holders))
        elif op == "window":
            amount = rnd.choice([0, 1, 2, 0.0, 0.1, 1 / 3, 0.7, 2.5, -0.4, 1e-9, 7, -1, 12])
            window = rnd.choice([10.0, 30.0, 60.0])
            limit = rnd.choice([None, 5, 10.5, 100 / 3, 6.2])
            await both("window_add", NS, key, amount, window, limit, now)
        elif op == "clear":
            await both("window_clear", NS, key)
        elif op == "pause":
            until = now + rnd.choice([-1.0, 0.0, 0.5, 10.0, 30.0, 10 / 3])
            await both("pause_until", NS, key, until, now)
        elif op == "paused":
            await both("paused_until", NS, key, now)
        elif op == "counter":
            named = rnd.choices(keys, k=rnd.randint(0, 3))
            amounts = [rnd.choice([0.0, 0.1, 1 / 3, -0.25, 0.7, 1e-7, 1]) for _ in named]
            limits = [rnd.choice([None, 3.0, 10.0, 7.35, 50]) for _ in named]
            entry = None if rnd.random() < 0.3 else SpendEntry(
                rnd.choice(tenants), rnd.choice(["run1", None]), rnd.choice(roots),
                rnd.choice([0.1, 1 / 3, 2]), rnd.choice(["usd", "eur"]), now)
            await both("counter_add", NS, named, amounts, limits, now, entry)
        elif op == "admit":
            needs = _needs_apart(rnd, keys)
            await both("admit", NS, rnd.choice(holders), needs, now)
        else:
            tenant, root, top = rnd.choice([None, *tenants]), rnd.choice(roots), \
                rnd.choice([1000, 3, 0])
            run, after = rnd.choice([None, "run1"]), rnd.choice([None, 0, 3, step // 20])
            await both("ledger", NS, tenant, root, top, after=after, run_id=run)
    await both("ledger", NS, limit=10_000)


# -- as contract classes --------------------------------------------------------------------------


class _Seeded:
    """Parametrizes ``differential_seed`` with the class's ``differential_seeds``."""

    differential_seeds: tuple[int, ...] = (0, 1, 2, 3)
    differential_calls = 300

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "differential_seed" in metafunc.fixturenames:
            metafunc.parametrize("differential_seed", self.differential_seeds)


class RunDifferential(_Seeded):
    """:func:`run_calls` once per seed of ``differential_seeds``, ``differential_calls`` calls
    each. Provide ``store``: an opened, empty Store."""

    async def test_the_run_store_answers_as_the_memory_reference(
        self, store: Store, differential_seed: int
    ) -> None:
        await run_calls(random.Random(differential_seed), store,
                        calls=self.differential_calls)


class CoordDifferential(_Seeded):
    """:func:`coord_calls` once per seed of ``differential_seeds``, ``differential_calls`` calls
    each. Provide ``coord``: an opened, empty CoordStore."""

    differential_calls = 250

    async def test_coordination_answers_as_the_memory_reference(
        self, coord: CoordStore, differential_seed: int
    ) -> None:
        await coord_calls(random.Random(differential_seed), coord,
                          calls=self.differential_calls)


class RateDifferential(_Seeded):
    """``differential`` (:func:`rate_calls`, or the stricter :func:`rate_calls_apart`) once per
    seed of ``differential_seeds``, ``differential_calls`` calls each. Provide ``rates``: an
    opened, empty RateStore."""

    differential_calls = 250
    differential: Literal["exact", "apart"] = "exact"

    async def test_rate_limits_answer_as_the_memory_reference(
        self, rates: RateStore, differential_seed: int
    ) -> None:
        calls = rate_calls if self.differential == "exact" else rate_calls_apart
        await calls(random.Random(differential_seed), rates, calls=self.differential_calls)
