"""What every store shares for :class:`~shoal.ports.FlowView`: which flow-control rule holds
back a namespace's due queued runs now, decided in one place from a few counts each store
makes (:class:`HoldCounts`) and from the rules the workflows table keeps
(``WorkflowOptions.stored()``: a process that does not register a workflow knows its rules).

A due queued run (queued, not held by admission control, ``run_at <= now``) is counted under
the first rule of :data:`~shoal.types.HOLD_REASONS` that holds it back: its workflow (or its
tenant) is paused; its workflow has ``max_running`` runs in ``running``; its tenant has
``max_running_per_tenant``; its workflow's rate window is full (a run never started only); its
concurrency key has ``concurrency_limit`` holders (a run never started only). Each count reads
at most ``cap`` runs, so a long backlog costs no more than ``cap`` rows per count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shoal.types import JSON, PausedWorkflow, Run, RunStatus, WorkflowInfo


class HoldCounts(Protocol):
    """The counts a store makes for :func:`held_back` and :func:`hold_reason`, each one
    bounded read of its runs."""

    async def running_counts(
        self, namespace: str, workflows: Sequence[str]
    ) -> dict[tuple[str, str], int]:
        """(workflow, tenant) -> runs in ``running``, for these workflows."""

    async def first_starts(self, namespace: str, workflow: str, since: float, limit: int) -> int:
        """The workflow's runs whose first start (``started_at``) is after ``since``, counted
        up to ``limit``."""

    async def count_due(
        self, namespace: str, workflow: str, now: float, cap: int, *,
        tenants: Sequence[str] | None = None, skip: Sequence[str] = (),
        first_only: bool = False, key_limit: int | None = None,
    ) -> int:
        """The workflow's due queued runs (not held, ``run_at <= now``), counted up to ``cap``:
        only those of ``tenants`` when given, none of ``skip``; with ``first_only`` only those
        never started; with ``key_limit`` only those never started whose concurrency key has
        at least ``key_limit`` holders (started, not ended: KEY_HOLDING_STATUSES, or queued
        again after a start)."""

    async def key_holders(self, namespace: str, workflow: str, key: str, cap: int) -> int:
        """The holders of the workflow's concurrency key ``key``, counted up to ``cap``."""


class Registry(Protocol):
    """The ports :func:`held_back` reads the rules and the pauses through."""

    async def list_workflows(self, namespace: str | None) -> list[WorkflowInfo]: ...

    async def get_workflow(self, namespace: str, name: str) -> JSON: ...

    async def paused_workflows(self, namespace: str) -> list[PausedWorkflow]: ...


@dataclass(frozen=True)
class Rules:
    """A workflow's flow-control rules, as its stored options say (defaults for options
    registered by an older shoal, which did not store them)."""

    keyed: bool = False
    concurrency_limit: int = 1
    max_running: int | None = None
    max_running_per_tenant: int | None = None
    rate: tuple[int, float] | None = None   # (limit, per)

    @classmethod
    def of(cls, options: JSON) -> Rules:
        if not isinstance(options, Mapping):
            return cls()
        rate = options.get("rate_limit")
        return cls(
            keyed=options.get("concurrency_key") is not None or bool(
                options.get("key_from_input")),
            concurrency_limit=_int(options.get("concurrency_limit")) or 1,
            max_running=_int(options.get("max_running")),
            max_running_per_tenant=_int(options.get("max_running_per_tenant")),
            rate=(None if not isinstance(rate, Mapping) or _int(rate.get("limit")) is None
                  else (int(rate["limit"]), float(rate.get("per") or 0.0))))

    @property
    def any(self) -> bool:
        return (self.keyed or self.max_running is not None
                or self.max_running_per_tenant is not None or self.rate is not None)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def held_back(registry: Registry, counts: HoldCounts, namespace: str, now: float,
                    cap: int) -> dict[str, dict[str, int]]:
    """Workflow -> rule -> due queued runs it holds back now (see the module doc); only
    workflows and rules with some."""
    rules = {w.name: Rules.of(w.options) for w in await registry.list_workflows(namespace)}
    pauses: dict[str, set[str | None]] = {}
    for p in await registry.paused_workflows(namespace):
        pauses.setdefault(p.workflow, set()).add(p.tenant)
    capped = [w for w, r in rules.items() if r.max_running is not None
              or r.max_running_per_tenant is not None]
    running = await counts.running_counts(namespace, sorted(capped)) if capped else {}
    out: dict[str, dict[str, int]] = {}
    for workflow in sorted(set(pauses) | {w for w, r in rules.items() if r.any}):
        found = await _held_of(counts, namespace, workflow, rules.get(workflow, Rules()),
                               pauses.get(workflow, set()), running, now, cap)
        if found:
            out[workflow] = found
    return out


async def _held_of(counts: HoldCounts, namespace: str, workflow: str, rules: Rules,
                   paused: set[str | None], running: Mapping[tuple[str, str], int],
                   now: float, cap: int) -> dict[str, int]:
    """One workflow's part of :func:`held_back`: each rule in turn, on the runs the rules
    before it left."""
    out: dict[str, int] = {}

    async def count(reason: str, **where: Any) -> None:
        n = await counts.count_due(namespace, workflow, now, cap, **where)
        if n:
            out[reason] = n

    if None in paused:
        await count("paused")
        return out
    skip = sorted(t for t in paused if t is not None)
    if skip:
        await count("paused", tenants=skip)
    mine = {t: n for (w, t), n in running.items() if w == workflow}
    if rules.max_running is not None and sum(mine.values()) >= rules.max_running:
        await count("max_running", skip=skip)
        return out
    if rules.max_running_per_tenant is not None:
        full = sorted(t for t, n in mine.items()
                      if n >= rules.max_running_per_tenant and t not in skip)
        if full:
            await count("max_running_per_tenant", tenants=full)
            skip = sorted([*skip, *full])
    if rules.rate is not None and await _window_full(counts, namespace, workflow, rules.rate,
                                                     now):
        await count("rate_limit", skip=skip, first_only=True)
        return out
    if rules.keyed:
        await count("concurrency_limit", skip=skip, first_only=True,
                    key_limit=rules.concurrency_limit)
    return out


async def _window_full(counts: HoldCounts, namespace: str, workflow: str,
                       rate: tuple[int, float], now: float) -> bool:
    limit, per = rate
    return await counts.first_starts(namespace, workflow, now - per, limit) >= limit


async def hold_reason(registry: Registry, counts: HoldCounts, run: Run | None,
                      now: float) -> str | None:
    """The rule (a key of :data:`~shoal.types.HOLD_REASONS`) that holds back ``run`` now, the
    first of them in that order; None when it is not a due queued run or no rule holds it
    (it waits for a worker)."""
    if (run is None or run.status != RunStatus.QUEUED or run.held or run.run_at is None
            or run.run_at > now):
        return None
    ns, workflow = run.namespace, run.workflow
    paused = {(p.workflow, p.tenant) for p in await registry.paused_workflows(ns)}
    if (workflow, None) in paused or (workflow, run.tenant) in paused:
        return "paused"
    rules = Rules.of(await registry.get_workflow(ns, workflow))
    if rules.max_running is not None or rules.max_running_per_tenant is not None:
        running = await counts.running_counts(ns, [workflow])
        if (rules.max_running is not None
                and sum(n for (w, _), n in running.items() if w == workflow)
                >= rules.max_running):
            return "max_running"
        if (rules.max_running_per_tenant is not None
                and running.get((workflow, run.tenant), 0) >= rules.max_running_per_tenant):
            return "max_running_per_tenant"
    if run.started_at is not None:
        return None   # a resumption holds its key and is never held by the rate
    if rules.rate is not None and await _window_full(counts, ns, workflow, rules.rate, now):
        return "rate_limit"
    key = run.concurrency_key
    if key is not None:
        limit = rules.concurrency_limit
        if await counts.key_holders(ns, workflow, key, limit) >= limit:
            return "concurrency_limit"
    return None
