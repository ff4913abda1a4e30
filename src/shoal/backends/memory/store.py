"""The in-memory store: one process, the reference semantics of the Store protocol.

Every method runs without an await between its reads and writes, so each is atomic on the event
loop. Several apps of one process may share one MemoryStore object (``shoal.testing.cluster``).
JSON values are kept as a JSON round trip of what was written, so that they come back as from the
SQL stores (a tuple as a list).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from shoal import _json
from shoal.backends import _held
from shoal.backends._batches import (
    Key,
    answers,
    firsts,
    held_flags,
    key_of,
    namespace_of,
    queued_run,
)
from shoal.backends._fairness import fair_order, fair_workflows
from shoal.backends._flow import Shares, capped
from shoal.backends._stats import since
from shoal.backends.memory.coord import MemoryCoordination
from shoal.backends.memory.graphs import MemoryGraphCheckpoints
from shoal.backends.memory.held import MemoryHoldCounts
from shoal.backends.memory.rates import MemoryRateLimits
from shoal.errors import AdmissionRejectedError
from shoal.types import (
    HELD_BACK_CAP,
    JSON,
    KEY_HOLDING_STATUSES,
    WORKFLOW_INSTANCE_RETENTION,
    Fence,
    FlowLimits,
    NewRun,
    OutboxEntry,
    Pause,
    PausedWorkflow,
    PauseWait,
    Progress,
    QueueDepth,
    Renewal,
    Run,
    RunFilter,
    RunOwner,
    RunRecord,
    RunStatus,
    Settlement,
    SignalRecord,
    SignalWait,
    Stats,
    Step,
    StepRecord,
    WorkflowInfo,
)

_Q = RunStatus.QUEUED


@dataclass
class _Signal:
    id: str
    run_id: str
    name: str
    payload: JSON
    created_at: float
    consumed: bool = False


class MemoryStore(MemoryGraphCheckpoints, MemoryCoordination, MemoryRateLimits):
    """``memory://``: nothing is shared with other processes and nothing survives a restart."""

    url = "memory://"

    def __init__(self) -> None:
        super().__init__()
        self._runs: dict[str, Run] = {}
        self._rate_keys: dict[str, str] = {}   # run id -> its rate key (NewRun.rate_key)
        self._steps: dict[str, dict[int, Step]] = {}
        self._step_times: dict[tuple[str, int], float | None] = {}   # finished_at
        self._signals: list[_Signal] = []
        self._workflows: dict[tuple[str, str], tuple[JSON, float]] = {}
        # (namespace, workflow) -> instance -> when it last registered the workflow
        self._served: dict[tuple[str, str], dict[str, float]] = {}
        # (namespace, workflow, tenant or None for every tenant) -> paused_at
        self._paused_workflows: dict[tuple[str, str, str | None], float] = {}
        # (namespace, tenant) -> weight under fairness="tenant" (1 when missing)
        self._tenant_weights: dict[tuple[str, str], float] = {}
        self._pauses: dict[str, Pause] = {}
        self._outbox: dict[str, OutboxEntry] = {}
        # (root, key) -> value, claimant, tenant (the root run's)
        self._tree: dict[tuple[str, str], tuple[JSON, str, str]] = {}
        self._notifying: dict[str, float] = {}   # pause id -> taken until
        self._waiters: list[asyncio.Future[None]] = []
        self._write_waiters: list[asyncio.Future[None]] = []   # next_write() calls

    async def open(self, *, migrate: bool = True) -> None:
        return None   # no schema: nothing to migrate, nothing to refuse

    async def close(self) -> None:
        return None

    async def migrate(self) -> int:
        return 1

    async def ping(self) -> None:
        return None

    def _touch(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def wait_for_work(self, timeout: float) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        # asyncio.wait, not wait_for: on 3.11 wait_for can swallow a cancellation.
        await asyncio.wait({waiter}, timeout=timeout)
        waiter.cancel()

    # -- workflows -------------------------------------------------------------------------

    async def register_workflows(
        self, namespace: str, workflows: Mapping[str, JSON], now: float,
        instance: str | None = None,
    ) -> None:
        for name, options in workflows.items():
            self._workflows[(namespace, name)] = (_json.copy(options), now)
            if instance is not None:
                self._served.setdefault((namespace, name), {})[instance] = now
        if instance is not None:
            forget = now - WORKFLOW_INSTANCE_RETENTION
            for (ns, _), served in self._served.items():
                if ns == namespace:
                    for old in [i for i, at in served.items() if at < forget]:
                        del served[old]

    async def get_workflow(self, namespace: str, name: str) -> JSON:
        found = self._workflows.get((namespace, name))
        return None if found is None else copy.deepcopy(found[0])

    async def list_workflows(self, namespace: str | None) -> list[WorkflowInfo]:
        out = []
        for (ns, name), (options, at) in sorted(self._workflows.items(), key=lambda kv: kv[0]):
            if namespace is not None and ns != namespace:
                continue
            served = self._served.get((ns, name), {})
            instances = sorted(served.items(), key=lambda i: (-i[1], i[0]))
            out.append(WorkflowInfo(ns, name, copy.deepcopy(options), at, tuple(instances)))
        return out

    async def pause_workflow(
        self, namespace: str, workflow: str, tenant: str | None, now: float
    ) -> bool:
        if (namespace, workflow, tenant) in self._paused_workflows:
            return False
        self._paused_workflows[(namespace, workflow, tenant)] = now
        return True

    async def resume_workflow(
        self, namespace: str, workflow: str, tenant: str | None, now: float
    ) -> bool:
        if self._paused_workflows.pop((namespace, workflow, tenant), None) is None:
            return False
        self._touch()
        return True

    async def paused_workflows(self, namespace: str) -> list[PausedWorkflow]:
        found = [PausedWorkflow(w, t, at) for (ns, w, t), at in self._paused_workflows.items()
                 if ns == namespace]
        return sorted(found, key=lambda p: (p.workflow, p.tenant is not None, p.tenant or ""))

    async def set_tenant_weight(self, namespace: str, tenant: str, weight: float) -> None:
        if weight == 1:
            self._tenant_weights.pop((namespace, tenant), None)
        else:
            self._tenant_weights[(namespace, tenant)] = float(weight)

    async def tenant_weights(self, namespace: str) -> dict[str, float]:
        return {t: w for (ns, t), w in sorted(self._tenant_weights.items()) if ns == namespace}

    def _fair(self, namespace: str, due: list[Run], fair: list[str],
              limits: Mapping[str, int], shares: Shares) -> list[Run]:
        """``due`` (in claim order) dealt by tenant for the ``fair`` workflows
        (:mod:`shoal.backends._fairness`), their queued runs that the claim may not take
        whatever the order left out, as the SQL stores leave them out of their candidates:
        an unstarted run whose key is full or is not the key's first due run (of those that
        ``shares``, as the claim starts, lets start: a rule holding a run back leaves it out)."""
        firsts: set[tuple[str, str]] = set()
        kept: list[Run] = []
        for r in due:
            if not shares.fits(r.workflow, r.tenant, self._rate_keys.get(r.id),
                               r.started_at is None):
                continue   # held back by a cap or a rate: it stands in front of nothing
            if (r.workflow in fair and r.status == _Q and r.started_at is None
                    and r.concurrency_key is not None):
                if ((r.workflow, r.concurrency_key) in firsts
                        or self._key_holders(r) >= limits.get(r.workflow, 1)):
                    firsts.add((r.workflow, r.concurrency_key))
                    continue
                firsts.add((r.workflow, r.concurrency_key))
            kept.append(r)
        running: dict[tuple[str, str], int] = {}
        for o in self._in(namespace):
            if o.status == RunStatus.RUNNING and o.workflow in fair:
                running[(o.workflow, o.tenant)] = running.get((o.workflow, o.tenant), 0) + 1
        weights = {t: w for (ns, t), w in self._tenant_weights.items() if ns == namespace}
        return fair_order(kept, lambda r: r.workflow in fair and r.status == _Q,
                          lambda r: (r.workflow, r.tenant, r.priority, r.created_at, r.id),
                          running, weights)

    def _paused_run(self, run: Run) -> bool:
        paused = self._paused_workflows
        return bool(paused) and ((run.namespace, run.workflow, None) in paused
                                 or (run.namespace, run.workflow, run.tenant) in paused)

    # -- runs ------------------------------------------------------------------------------

    def _in(self, namespace: str) -> Iterable[Run]:
        return (r for r in self._runs.values() if r.namespace == namespace)

    async def create_run(
        self, new: NewRun, *, max_queued: int | None, admission: str
    ) -> tuple[Run, bool]:
        if new.idempotency_key is not None:
            for r in self._in(new.namespace):
                if (r.tenant, r.workflow, r.idempotency_key) == (
                    new.tenant, new.workflow, new.idempotency_key
                ):
                    return r, False
        held = False
        if max_queued is not None:
            queued = self._waiting_to_start(new.namespace)
            parked = any(r.held for r in self._in(new.namespace))
            if queued >= max_queued or parked:
                if admission == "reject":
                    raise AdmissionRejectedError(new.namespace, max_queued)
                held = True
        run = queued_run(new, held)
        self._runs[run.id] = run
        if new.rate_key is not None:
            self._rate_keys[run.id] = new.rate_key
        self._touch()
        return run, True

    async def create_runs(
        self, news: Sequence[NewRun], *, max_queued: int | None, admission: str
    ) -> list[tuple[Run, bool]]:
        if not news:
            return []
        namespace = namespace_of(news)
        if any(new.id in self._runs for new in news):
            raise ValueError("create_runs was given the id of a stored run")
        keys = {k for k in map(key_of, news) if k is not None}
        stored: dict[Key, Run] = {}
        for r in self._in(namespace):
            if r.idempotency_key is not None and (
                    key := (r.tenant, r.workflow, r.idempotency_key)) in keys:
                stored[key] = r
        fresh = [news[i] for i in firsts(news, stored)]
        queued = parked = 0
        if max_queued is not None:
            queued = self._waiting_to_start(namespace)
            parked = sum(1 for r in self._in(namespace) if r.held)
        held = held_flags(namespace, len(fresh), queued, parked, max_queued, admission)
        inserted = {new.id: queued_run(new, h) for new, h in zip(fresh, held, strict=True)}
        self._runs.update(inserted)
        self._rate_keys.update((new.id, new.rate_key) for new in fresh if new.rate_key is not None)
        if inserted:
            self._touch()
        return answers(news, inserted, stored)

    def _waiting_to_start(self, namespace: str) -> int:
        """What admission control counts: queued runs never started and not held."""
        return sum(1 for r in self._in(namespace)
                   if r.status == _Q and not r.held and r.started_at is None)

    async def get_run(self, run_id: str) -> Run | None:
        return self._runs.get(run_id)

    async def list_runs(
        self,
        namespace: str | None,
        *,
        status: str | None = None,
        workflow: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[Run]:
        found = [
            r for r in self._runs.values()
            if (namespace is None or r.namespace == namespace)
            and (status is None or r.status == status)
            and (workflow is None or r.workflow == workflow)
            and (tenant is None or r.tenant == tenant)
            and (after is None or r.id > after)
        ]
        return sorted(found, key=lambda r: r.id)[:limit]

    def _key_holders(self, run: Run) -> int:
        """How many other runs of ``run``'s workflow and key hold the key (started, not ended)."""
        return sum(1 for o in self._in(run.namespace)
                   if o.id != run.id and o.workflow == run.workflow
                   and o.concurrency_key == run.concurrency_key
                   and (o.status in KEY_HOLDING_STATUSES
                        or (o.status == _Q and o.started_at is not None)))

    def _first_starts(self, namespace: str, workflow: str, rate_key: str | None,
                      since: float) -> int:
        """How many runs of ``workflow`` and ``rate_key`` first started after ``since``."""
        keys = self._rate_keys
        return sum(1 for o in self._in(namespace)
                   if o.workflow == workflow and o.started_at is not None
                   and o.started_at > since and keys.get(o.id) == (rate_key or ""))

    async def claim_runs(
        self,
        namespace: str,
        workflows: Sequence[str],
        owner: str,
        limit: int,
        lease: float,
        now: float,
        *,
        version: str | None = None,
        any_version: Sequence[str] = (),
        concurrency_limits: Mapping[str, int] | None = None,
        flow: Mapping[str, FlowLimits] | None = None,
    ) -> list[Run]:
        if limit <= 0:
            return []
        limits = concurrency_limits or {}
        wanted = set(workflows)
        due = sorted(
            (r for r in self._in(namespace)
             if r.workflow in wanted and r.run_at is not None and r.run_at <= now
             and ((r.status == _Q and not r.held)
                  or r.status in (RunStatus.SLEEPING, RunStatus.WAITING))
             and (r.started_at is None or r.version == version or r.workflow in any_version)
             and not self._paused_run(r)),
            key=lambda r: (-r.priority, r.created_at, r.id),
        )
        claimed: list[Run] = []
        keys: set[tuple[str, str]] = set()
        caps = capped(flow)
        # every run in `running` holds a share of its workflow's max_running (its lease may
        # have expired: it holds one until recovered); sleeping and waiting runs hold none
        shares = Shares(flow, ((r.workflow, r.tenant, 1) for r in self._in(namespace)
                               if r.status == RunStatus.RUNNING and r.workflow in caps)
                        if caps else (), now,
                        lambda w, key, since: self._first_starts(namespace, w, key, since))
        if fair := fair_workflows(flow, workflows):
            due = self._fair(namespace, due, fair, limits, shares)
        for r in due:
            # a run a rule holds back is skipped: it takes no room of the limit (only a first
            # start is held by a rate, and counts in it)
            first, rate_key = r.started_at is None, self._rate_keys.get(r.id)
            if not shares.fits(r.workflow, r.tenant, rate_key, first):
                continue
            # a run that started before holds its key already; of the others, one per key
            if r.concurrency_key is not None and r.started_at is None:
                if ((r.workflow, r.concurrency_key) in keys
                        or self._key_holders(r) >= limits.get(r.workflow, 1)):
                    continue
                keys.add((r.workflow, r.concurrency_key))
            shares.take(r.workflow, r.tenant, rate_key, first)
            if first and rate_key is None and r.workflow in shares.rates:
                # dispatched before its workflow had a rate: its first start counts under ''
                self._rate_keys[r.id] = ""
            if r.status == RunStatus.SLEEPING:
                reason: str | None = "woke"
            elif r.status == RunStatus.WAITING:
                reason = "resumed"
            elif r.started_at is None:
                reason = r.resume_reason or "dispatched"   # "retried" after retry_run
            else:
                reason = r.resume_reason or "recovered"
            run = replace(
                r, status=RunStatus.RUNNING, owner=owner, lease_expires_at=now + lease,
                lease_epoch=r.lease_epoch + 1, attempts=max(r.attempts, 1),
                started_at=r.started_at if r.started_at is not None else now, wait_for=None,
                run_at=now, version=version if r.started_at is None else r.version,
                resume_reason=reason,
            )
            self._runs[r.id] = run
            claimed.append(run)
            if len(claimed) == limit:
                break
        if fair:   # answered in priority, created_at, id order, as without the rule
            claimed.sort(key=lambda r: (-r.priority, r.created_at, r.id))
        return claimed

    async def incompatible_runs(
        self, namespace: str, workflows: Sequence[str], version: str | None,
        any_version: Sequence[str], now: float, limit: int = 100,
    ) -> list[Run]:
        return [r for r in self._in(namespace)
                if ((r.status == _Q and not r.held)
                    or r.status in (RunStatus.SLEEPING, RunStatus.WAITING))
                and r.run_at is not None and r.run_at <= now
                and r.started_at is not None and r.version != version
                and r.workflow in workflows and r.workflow not in any_version][:limit]

    def _holds(self, fence: Fence) -> Run | None:
        r = self._runs.get(fence.run_id)
        if (r is not None and r.status == RunStatus.RUNNING and r.owner == fence.owner
                and r.lease_epoch == fence.epoch):
            return r
        return None

    async def renew_leases(
        self, owner: str, leases: dict[str, int], lease: float, now: float
    ) -> Renewal:
        renewed, cancel = set(), set()
        for run_id, epoch in leases.items():
            r = self._holds(Fence(run_id, owner, epoch))
            if r is not None:
                self._runs[run_id] = replace(r, lease_expires_at=now + lease)
                renewed.add(run_id)
                if r.cancel_requested:
                    cancel.add(run_id)
        return Renewal(frozenset(renewed), frozenset(cancel))

    async def load_steps(self, run_id: str) -> list[Step]:
        steps = self._steps.get(run_id, {})
        return [copy.deepcopy(steps[seq]) for seq in sorted(steps)]

    def _put_step(self, fence: Fence, step: Step, now: float) -> None:
        steps = self._steps.setdefault(fence.run_id, {})
        old = steps.get(step.seq)
        if old is None or not old.finished:
            steps[step.seq] = replace(step, output=_json.copy(step.output), epoch=fence.epoch)
            self._step_times[(fence.run_id, step.seq)] = now if step.finished else None

    async def checkpoint_step(
        self, fence: Fence, step: Step, lease: float, now: float,
        outbox: Sequence[OutboxEntry] = (),
    ) -> bool:
        r = self._holds(fence)
        if r is None:
            return False
        self._runs[r.id] = replace(r, lease_expires_at=now + lease)
        recorded = self._steps.get(fence.run_id, {}).get(step.seq)
        if recorded is None or not recorded.finished:
            taken = {(e.run_id, e.seq, e.index) for e in self._outbox.values()}
            for entry in outbox:
                if (entry.run_id, entry.seq, entry.index) not in taken:
                    self._outbox[entry.id] = replace(entry, payload=_json.copy(entry.payload),
                                                     next_at=now)
        self._put_step(fence, step, now)
        return True

    async def record_progress(self, fence: Fence, progress: Progress) -> bool:
        r = self._holds(fence)
        if r is None:
            return False
        kept = Progress.from_json(_json.copy(progress.to_json()), progress.at)
        self._runs[r.id] = replace(r, progress=kept)
        return True

    def _suspend(self, r: Run, status: RunStatus, run_at: float | None,
                 wait_for: str | None) -> None:
        self._runs[r.id] = replace(r, status=status, run_at=run_at, wait_for=wait_for,
                                   owner=None, lease_expires_at=None)

    async def suspend_run(
        self,
        fence: Fence,
        step: Step,
        status: Literal["sleeping", "waiting"],
        run_at: float | None,
        wait_for: str | None,
        now: float,
    ) -> bool:
        r = self._holds(fence)
        if r is None:
            return False
        self._suspend(r, RunStatus(status), run_at, wait_for)
        self._put_step(fence, step, now)
        return True

    async def wait_signal(
        self, fence: Fence, step: Step, signal: str, deadline: float | None, now: float
    ) -> SignalWait | None:
        r = self._holds(fence)
        if r is None:
            return None
        pending = sorted((s for s in self._signals
                          if s.run_id == r.id and s.name == signal and not s.consumed),
                         key=lambda s: (s.created_at, s.id))
        if pending:
            s = pending[0]
            s.consumed = True
            self._put_step(fence, replace(step, output={"payload": s.payload}, finished=True),
                           now)
            return SignalWait(received=True, payload=copy.deepcopy(s.payload))
        if deadline is not None and deadline <= now:
            return SignalWait(received=False, parked=False)
        self._suspend(r, RunStatus.WAITING, deadline, signal)
        self._put_step(fence, step, now)
        return SignalWait(received=False, parked=True)

    async def settle_run(self, fence: Fence, settlement: Settlement, now: float) -> bool:
        r = self._holds(fence)
        if r is None:
            return False
        if settlement.outcome == "retry":
            run = replace(r, status=_Q, run_at=settlement.run_at, attempts=r.attempts + 1,
                          output=None, finished_at=None, owner=None, lease_expires_at=None,
                          error=settlement.error, traceback=settlement.traceback,
                          resume_reason="dispatched")
        else:
            output = _json.copy(settlement.output) if settlement.outcome == "succeeded" else None
            run = replace(r, status=RunStatus(settlement.outcome), output=output,
                          finished_at=now, run_at=now, owner=None, lease_expires_at=None,
                          error=settlement.error, traceback=settlement.traceback)
            self._ended(run, now)
        self._runs[r.id] = run
        self._touch()
        return True

    async def settle_and_claim(
        self,
        settlements: Sequence[tuple[Fence, Settlement, float]],
        namespace: str,
        workflows: Sequence[str],
        owner: str,
        limit: int,
        lease: float,
        now: float,
        *,
        version: str | None = None,
        any_version: Sequence[str] = (),
        concurrency_limits: Mapping[str, int] | None = None,
        flow: Mapping[str, FlowLimits] | None = None,
    ) -> tuple[list[bool], list[Run]]:
        held = [await self.settle_run(fence, settlement, at)
                for fence, settlement, at in settlements]
        return held, await self.claim_runs(namespace, workflows, owner, limit, lease, now,
                                           version=version, any_version=any_version,
                                           concurrency_limits=concurrency_limits, flow=flow)

    async def release_run(self, fence: Fence, now: float) -> bool:
        r = self._holds(fence)
        if r is None:
            return False
        self._runs[r.id] = replace(r, status=RunStatus.INTERRUPTED, owner=None,
                                   lease_expires_at=None)
        self._touch()
        return True

    async def recover_runs(self, namespace: str, now: float) -> list[Run]:
        out = []
        for r in list(self._in(namespace)):
            run: Run | None = None
            if (r.status == RunStatus.RUNNING and r.lease_expires_at is not None
                    and r.lease_expires_at <= now):
                if r.attempts >= r.max_attempts:
                    run = replace(
                        r, status=RunStatus.FAILED, finished_at=now, owner=None,
                        lease_expires_at=None, traceback=None,
                        error=f"the instance executing attempt {r.attempts} of {r.max_attempts} "
                              f"stopped (crashed or lost its lease); no attempts are left",
                    )
                else:
                    run = replace(r, status=_Q, attempts=r.attempts + 1, owner=None,
                                  lease_expires_at=None, run_at=now, resume_reason="recovered")
            elif r.status == RunStatus.INTERRUPTED:
                if r.cancel_requested:
                    run = replace(r, status=RunStatus.CANCELLED, finished_at=now)
                else:
                    run = replace(r, status=_Q, run_at=now, resume_reason="recovered")
            if run is not None:
                self._runs[r.id] = run
                if run.status.final:
                    self._ended(run, now)
                out.append(run)
        if out:
            self._touch()
            self._wrote()
        return out

    async def cancel_run(self, run_id: str, now: float) -> Run | None:
        r = self._runs.get(run_id)
        if r is None:
            return None
        if r.id == r.root_id and not r.status.final:
            for other in list(self._runs.values()):
                if other.root_id == r.id and other.id != r.id:
                    self._cancel_one(other, now)
        return self._cancel_one(r, now)

    def _cancel_one(self, r: Run, now: float) -> Run:
        run_id = r.id
        if r.status in (_Q, RunStatus.SLEEPING, RunStatus.WAITING, RunStatus.INTERRUPTED):
            for p in list(self._pauses.values()):
                if p.run_id == run_id and p.status == "pending":
                    self._pauses[p.id] = replace(p, status="resolved", resolved_at=now, decision={
                        "approved": False, "data": None, "by": None, "reason": "cancelled"})
            r = replace(r, status=RunStatus.CANCELLED, cancel_requested=True, finished_at=now,
                        held=False, owner=None, lease_expires_at=None)
            self._ended(r, now)
            self._touch()
        elif r.status == RunStatus.RUNNING:
            r = replace(r, cancel_requested=True)
        self._runs[run_id] = r
        return r

    async def retry_run(
        self, namespace: str, run_id: str, tenant: str | None, now: float
    ) -> tuple[Run | None, bool]:
        r = self._runs.get(run_id)
        if r is None or r.namespace != namespace or (tenant is not None and r.tenant != tenant):
            return None, False
        if r.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
            return r, False
        steps = self._steps.get(run_id, {})
        for seq in [seq for seq, step in steps.items() if not step.finished]:
            del steps[seq]
        # not started: the claim takes its concurrency key and stamps its version anew
        run = replace(r, status=_Q, attempts=0, run_at=now, started_at=None, finished_at=None,
                      output=None, owner=None, lease_expires_at=None, wait_for=None,
                      cancel_requested=False, held=False, resume_reason="retried")
        self._runs[run_id] = run
        self._touch()
        return run, True

    async def send_signal(
        self, run_id: str, name: str, payload: JSON, signal_id: str, now: float
    ) -> Run | None:
        r = self._runs.get(run_id)
        if r is None:
            return None
        self._signals.append(_Signal(signal_id, run_id, name, _json.copy(payload), now))
        if r.status == RunStatus.WAITING and r.wait_for == name:
            r = replace(r, run_at=now)
            self._runs[run_id] = r
            self._touch()
        return r

    def _ended(self, run: Run, now: float) -> None:
        """A run just became final: wake a parent waiting for it; a root drops its tree."""
        parent = self._runs.get(run.parent_id) if run.parent_id else None
        if (parent is not None and parent.status == RunStatus.WAITING
                and parent.wait_for == f"shoal.child:{run.id}"):
            self._runs[parent.id] = replace(parent, run_at=now)
            self._touch()
        if run.id == run.root_id:
            for k in [k for k in self._tree if k[0] == run.id]:
                del self._tree[k]

    # -- tree state and children ----------------------------------------------------------------

    async def save_tree_key(
        self, root_id: str, key: str, value: JSON, claimant: str, now: float
    ) -> bool:
        found = self._tree.get((root_id, key))
        if found is None:
            root = self._runs.get(root_id)
            if root is None or root.status.final:   # no key may outlive its tree
                return False
            self._tree[(root_id, key)] = (_json.copy(value), claimant, root.tenant)
            return True
        return found[1] == claimant

    async def get_tree_key(self, root_id: str, key: str) -> JSON:
        found = self._tree.get((root_id, key))
        return None if found is None else copy.deepcopy(found[0])

    async def tree_keys(self, root_id: str) -> list[tuple[str, str]]:
        return sorted((k, found[2]) for (root, k), found in self._tree.items() if root == root_id)

    async def wait_child(self, fence: Fence, step: Step, child_id: str, now: float) -> Run | None:
        r = self._holds(fence)
        if r is None:
            return None
        child = self._runs.get(child_id)
        if child is None:
            raise KeyError(f"no child run {child_id!r}")
        if child.status.final:
            self._put_step(fence, replace(step, output={
                "status": child.status.value, "output": copy.deepcopy(child.output),
                "error": child.error}, finished=True), now)
        else:
            self._suspend(r, RunStatus.WAITING, None, f"shoal.child:{child_id}")
            self._put_step(fence, step, now)
        return child

    # -- pauses ------------------------------------------------------------------------------

    async def create_pause(self, fence: Fence, step: Step, pause: Pause, now: float) -> bool:
        r = self._holds(fence)
        if r is None:
            return False
        self._pauses[pause.id] = replace(pause, request=_json.copy(pause.request),
                                         decision=_json.copy(pause.decision))
        self._suspend(r, RunStatus.WAITING, None, f"shoal.pause:{pause.id}")
        self._put_step(fence, step, now)
        return True

    async def get_pause(self, pause_id: str) -> Pause | None:
        return copy.deepcopy(self._pauses.get(pause_id))

    async def wait_pause(
        self, fence: Fence, step: Step, pause_id: str, now: float
    ) -> PauseWait | None:
        r = self._holds(fence)
        if r is None:
            return None
        p = self._pauses.get(pause_id)
        if p is None or p.status != "pending":
            return PauseWait(copy.deepcopy(p), parked=False)
        self._suspend(r, RunStatus.WAITING, None, f"shoal.pause:{pause_id}")
        self._put_step(fence, step, now)
        return PauseWait(copy.deepcopy(p), parked=True)

    def _resolve(self, p: Pause, decision: JSON, now: float) -> Pause:
        p = replace(p, status="resolved", decision=_json.copy(decision), resolved_at=now)
        self._pauses[p.id] = p
        r = self._runs.get(p.run_id)
        if r is not None and r.status == RunStatus.WAITING and r.wait_for == f"shoal.pause:{p.id}":
            self._runs[r.id] = replace(r, run_at=now)
            self._touch()
        return copy.deepcopy(p)

    async def resolve_pause(
        self, pause_id: str, decision: JSON, now: float
    ) -> tuple[Pause | None, bool]:
        p = self._pauses.get(pause_id)
        if p is None:
            return None, False
        if p.status != "pending":
            return copy.deepcopy(p), False
        return self._resolve(p, decision, now), True

    async def list_pauses(
        self, namespace: str, *, tenant: str | None = None, limit: int = 100
    ) -> list[Pause]:
        found = [p for p in self._pauses.values()
                 if p.namespace == namespace and p.status == "pending"
                 and (tenant is None or p.tenant == tenant)]
        return copy.deepcopy(sorted(found, key=lambda p: (p.created_at, p.id))[:limit])

    async def expire_pauses(self, namespace: str, now: float) -> list[Pause]:
        expired = [p for p in self._pauses.values()
                   if p.namespace == namespace and p.status == "pending"
                   and p.expires_at is not None and p.expires_at <= now]
        decision = {"approved": False, "data": None, "by": None, "reason": "expired"}
        resolved = [self._resolve(p, decision, now)
                    for p in sorted(expired, key=lambda p: (p.created_at, p.id))]
        if resolved:
            self._wrote()
        return resolved

    async def claim_notifications(
        self, namespace: str, now: float, lease: float, limit: int
    ) -> list[Pause]:
        due = sorted((p for p in self._pauses.values()
                      if p.namespace == namespace and not p.notified
                      and self._notifying.get(p.id, float("-inf")) <= now),
                     key=lambda p: (p.created_at, p.id))[:limit]
        for p in due:
            self._notifying[p.id] = now + lease
        return copy.deepcopy(due)

    async def mark_notified(self, pause_id: str) -> None:
        p = self._pauses.get(pause_id)
        if p is not None:
            self._pauses[pause_id] = replace(p, notified=True)
        self._notifying.pop(pause_id, None)

    async def prune_pauses(self, namespace: str, before: float, limit: int) -> int:
        old = sorted((p for p in self._pauses.values()
                      if p.namespace == namespace and p.status == "resolved"
                      and p.resolved_at is not None and p.resolved_at < before),
                     key=lambda p: (p.resolved_at or 0.0, p.id))[:limit]
        for p in old:
            del self._pauses[p.id]
            self._notifying.pop(p.id, None)
        return len(old)

    # -- outbox ------------------------------------------------------------------------------

    async def claim_outbox(
        self, namespace: str, topics: Sequence[str], now: float, lease: float, limit: int
    ) -> list[OutboxEntry]:
        wanted = set(topics)
        due = sorted((e for e in self._outbox.values()
                      if e.namespace == namespace and e.topic in wanted and not e.dead
                      and e.delivered_at is None and e.next_at <= now),
                     key=lambda e: (e.next_at, e.created_at, e.id))[:limit]
        taken = [replace(e, next_at=now + lease) for e in due]
        for e in taken:
            self._outbox[e.id] = e
        return copy.deepcopy(taken)

    async def finish_delivery(
        self, entry_id: str, now: float, error: str | None = None,
        retry_at: float | None = None,
    ) -> None:
        e = self._outbox.get(entry_id)
        if e is None or e.delivered_at is not None or e.dead:
            return
        if error is None:
            self._outbox[entry_id] = replace(e, delivered_at=now, error=None)
        else:
            self._outbox[entry_id] = replace(e, attempts=e.attempts + 1, error=error,
                                             dead=retry_at is None,
                                             next_at=retry_at if retry_at is not None else now)

    async def dead_letters(self, namespace: str, limit: int = 100) -> list[OutboxEntry]:
        dead = sorted((e for e in self._outbox.values() if e.namespace == namespace and e.dead),
                      key=lambda e: (e.created_at, e.id))
        return copy.deepcopy(dead[:limit])

    async def redrive(self, namespace: str, entry_id: str,
                      now: float) -> tuple[OutboxEntry | None, bool]:
        e = self._outbox.get(entry_id)
        if e is None or e.namespace != namespace:
            return None, False
        if not e.dead:
            return copy.deepcopy(e), False
        e = self._outbox[entry_id] = replace(e, dead=False, attempts=0, next_at=now)
        return copy.deepcopy(e), True

    # -- what a console reads --------------------------------------------------------------

    async def search_runs(
        self, namespace: str, where: RunFilter, *, before: str | None = None, limit: int = 50,
    ) -> list[Run]:
        found = sorted((r for r in self._in(namespace)
                        if (before is None or r.id < before) and where.matches(r)),
                       key=lambda r: r.id, reverse=True)
        return copy.deepcopy(found[:limit])

    async def inspect_run(self, run_id: str, tree_limit: int = 200) -> RunRecord | None:
        run = self._runs.get(run_id)
        if run is None:
            return None
        steps = self._steps.get(run_id, {})
        tree = sorted((r for r in self._runs.values() if r.root_id == run.root_id),
                      key=lambda r: (r.id != r.root_id, r.id))
        return copy.deepcopy(RunRecord(
            run=run,
            steps=tuple(StepRecord(s.seq, s.name, s.output, s.finished, s.epoch,
                                   self._step_times.get((run_id, s.seq)), s.started_at,
                                   s.attempt, s.retries)
                        for s in (steps[seq] for seq in sorted(steps))),
            signals=tuple(SignalRecord(s.id, s.name, s.payload, s.created_at, s.consumed)
                          for s in sorted((s for s in self._signals if s.run_id == run_id),
                                          key=lambda s: (s.created_at, s.id))),
            pauses=tuple(sorted((p for p in self._pauses.values() if p.run_id == run_id),
                                key=lambda p: (p.created_at, p.id))),
            outbox=tuple(sorted((e for e in self._outbox.values() if e.run_id == run_id),
                                key=lambda e: (e.seq, e.index))),
            tree=tuple(tree[:tree_limit])))

    async def run_owners(self, namespace: str, limit: int = 1000) -> list[RunOwner]:
        held: dict[str, list[float | None]] = {}
        for r in self._in(namespace):
            if r.status == RunStatus.RUNNING and r.owner is not None:
                held.setdefault(r.owner, []).append(r.lease_expires_at)
        return [RunOwner(owner, len(ends),
                         max((e for e in ends if e is not None), default=None))
                for owner, ends in sorted(held.items())[:limit]]

    async def finished_per_minute(
        self, namespace: str, since: float, minutes: int
    ) -> list[int]:
        counts = [0] * minutes
        for r in self._in(namespace):
            if r.status.final and r.finished_at is not None:
                i = math.floor((r.finished_at - since) / 60)
                if 0 <= i < minutes:
                    counts[i] += 1
        return counts

    async def prune_runs(self, namespace: str, before: float, limit: int) -> int:
        busy = {e.run_id for e in self._outbox.values() if e.delivered_at is None and not e.dead}
        old = sorted((r for r in self._in(namespace)
                      if r.status.final and r.finished_at is not None
                      and r.finished_at < before and r.id not in busy),
                     key=lambda r: (r.finished_at or 0.0, r.id))[:limit]
        gone = {r.id for r in old}
        self._prune_graphs(namespace, {(r.tenant, r.id) for r in old})
        for run_id in gone:
            del self._runs[run_id]
            self._rate_keys.pop(run_id, None)
            for seq in self._steps.pop(run_id, {}):
                self._step_times.pop((run_id, seq), None)
        self._outbox = {k: e for k, e in self._outbox.items() if e.run_id not in gone}
        if gone:
            self._signals = [s for s in self._signals if s.run_id not in gone]
        return len(gone)

    async def stats(self, namespace: str, now: float) -> Stats:
        by_status = {s.value: 0 for s in RunStatus}
        by_workflow: dict[str, dict[str, int]] = {}
        queued: dict[str, list[int]] = {}   # tenant -> [due, delayed, held]
        last_minute = {s.value: 0 for s in RunStatus if s.final}
        first = since(now)
        oldest: float | None = None
        for r in self._in(namespace):
            by_status[r.status] += 1
            counts = by_workflow.setdefault(r.workflow, {})
            counts[r.status.value] = counts.get(r.status.value, 0) + 1
            due = not r.held and r.run_at is not None and r.run_at <= now
            if r.status == _Q:
                queued.setdefault(r.tenant, [0, 0, 0])[2 if r.held else 0 if due else 1] += 1
            if due and r.status in (_Q, RunStatus.SLEEPING, RunStatus.WAITING):
                assert r.run_at is not None
                oldest = r.run_at if oldest is None else min(oldest, r.run_at)
            if r.status.final and r.finished_at is not None and r.finished_at >= first:
                last_minute[r.status] += 1
        outbox = [e for e in self._outbox.values() if e.namespace == namespace]
        return Stats(
            namespace=namespace, at=now, by_status=by_status, by_workflow=by_workflow,
            queued={t: QueueDepth(*q) for t, q in sorted(queued.items())},
            oldest_due_age=None if oldest is None else now - oldest,
            finished_last_minute=last_minute,
            pending_pauses=sum(1 for p in self._pauses.values()
                               if p.namespace == namespace and p.status == "pending"),
            outbox_backlog=sum(1 for e in outbox if e.delivered_at is None and not e.dead),
            dead_letters=sum(1 for e in outbox if e.dead))

    async def fold_stats(self, namespace: str, now: float) -> None:
        return None   # stats counts the rows themselves: nothing is kept to fold

    async def held_back(
        self, namespace: str, now: float, *, cap: int = HELD_BACK_CAP
    ) -> dict[str, dict[str, int]]:
        counts = MemoryHoldCounts(self._in, self._rate_keys)
        return await _held.held_back(self, counts, namespace, now, cap)

    async def hold_reason(self, run_id: str, now: float) -> str | None:
        counts = MemoryHoldCounts(self._in, self._rate_keys)
        return await _held.hold_reason(self, counts, self._runs.get(run_id), now)

    async def release_held(self, namespace: str, max_queued: int, now: float) -> int:
        queued = self._waiting_to_start(namespace)
        held = sorted((r for r in self._in(namespace) if r.held),
                      key=lambda r: (r.created_at, r.id))
        n = max(0, min(len(held), max_queued - queued))
        for r in held[:n]:
            self._runs[r.id] = replace(r, held=False)
        if n:
            self._touch()
            self._wrote()
        return n

    # -- when maintenance has work (every writer of this store is in this process) ---------

    def next_due(self, namespace: str, work: str, now: float, *, run_retention: float = 0.0,
                 pause_retention: float = 0.0) -> float | None:
        """The earliest moment a maintenance pass of ``work`` (a service's name) could find
        something to do in ``namespace`` as the store is now (``now`` or before: at once), or
        None while only a write can give it some; an unknown ``work`` is due at once. Between
        two passes a service asks this, and sleeps until then or the next write
        (:meth:`next_write`): a later write may make work due sooner."""
        times: Iterable[float | None]
        if work == "recovery":
            times = (_recovery_due(r, now) for r in self._in(namespace))
        elif work == "pause.expiry":
            times = (p.expires_at for p in self._pauses.values()
                     if p.namespace == namespace and p.status == "pending")
        elif work == "pause.notify":
            times = (self._notifying.get(p.id, now) for p in self._pauses.values()
                     if p.namespace == namespace and not p.notified)
        elif work == "outbox.delivery":
            times = (e.next_at for e in self._outbox.values()
                     if e.namespace == namespace and not e.dead and e.delivered_at is None)
        elif work == "admission":
            times = (now for r in self._in(namespace) if r.held)
        elif work == "retention":
            # runs and pauses go once they are older than their retention: just after it ends
            times = (*(_after(r.finished_at + run_retention) for r in self._in(namespace)
                       if r.status.final and r.finished_at is not None),
                     *(_after(p.resolved_at + pause_retention) for p in self._pauses.values()
                       if p.namespace == namespace and p.resolved_at is not None),
                     *(t + run_retention for t in self._coordination_ends(namespace)),
                     *(t + run_retention for t in self._rate_ends(namespace)))
        else:
            return now
        return min((t for t in times if t is not None), default=None)

    async def next_write(self) -> None:
        """Return at the next write that may bring work due sooner (see ``_QUIET_WRITES``)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._write_waiters.append(waiter)
        try:
            await waiter
        finally:
            if not waiter.done():
                waiter.cancel()
            with contextlib.suppress(ValueError):
                self._write_waiters.remove(waiter)

    def _wrote(self) -> None:
        waiters, self._write_waiters = self._write_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)


def _after(t: float) -> float:
    """The first moment after ``t``."""
    return math.nextafter(t, math.inf)


def _recovery_due(r: Run, now: float) -> float | None:
    """When recovery (and the claim pass it asks for) may act on ``r``: its lease's end while
    it runs, at once when released, its ``run_at`` while it waits to be claimed."""
    if r.status == RunStatus.RUNNING:
        return r.lease_expires_at
    if r.status == RunStatus.INTERRUPTED:
        return now
    if (r.status == _Q and not r.held) or r.status in (RunStatus.SLEEPING, RunStatus.WAITING):
        return r.run_at
    return None


# Writes that never bring maintenance work due sooner, so they wake no sleeping service: a
# membership beat or a renewal only pushes an end later; a claim takes a run that was due
# already; the passes' own claims and prunes push later or delete. (The passes that change
# something a service waits for announce it themselves: recover_runs, expire_pauses and
# release_held, when they changed a row.) Every other write of the store announces itself.
_QUIET_WRITES = frozenset({
    "heartbeat", "renew_leases", "lock_renew", "slot_renew", "claim_runs", "claim_notifications",
    "claim_outbox", "prune_runs", "prune_pauses", "prune_coordination", "prune_rates",
    "fold_stats", "recover_runs", "expire_pauses", "release_held",
})
_READS = frozenset({
    "open", "close", "migrate", "ping", "wait_for_work", "get_workflow", "list_workflows",
    "paused_workflows", "tenant_weights",
    "get_run", "list_runs", "incompatible_runs", "load_steps", "get_tree_key", "tree_keys",
    "get_pause", "list_pauses", "dead_letters", "search_runs", "inspect_run", "run_owners",
    "finished_per_minute", "stats", "coordination_view", "ledger", "read_rates", "paused_until",
    "get_graph_checkpoint", "list_graph_checkpoints", "held_back", "hold_reason",
})


def _announced(write: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(write)
    async def announce(self: MemoryStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return await write(self, *args, **kwargs)
        finally:
            if self._write_waiters:
                self._wrote()
    return announce


for _name in dir(MemoryStore):
    _method = getattr(MemoryStore, _name)
    if (not _name.startswith("_") and _name not in _READS and _name not in _QUIET_WRITES
            and inspect.iscoroutinefunction(_method)):
        setattr(MemoryStore, _name, _announced(_method))
