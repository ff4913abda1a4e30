"""What the contract suites share: the time they start at, their namespace and lease, and small
builders of the records a test hands a store (a new run, a pause, outbox entries, a fence).

Every time is an explicit ``now``: the suites need no clock. Nothing here imports the engine or
an app, only :mod:`shoal.types`, :mod:`shoal.ports` and the id helper.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shoal import _ids
from shoal.ports import RunQueue
from shoal.types import Fence, NewRun, OutboxEntry, Pause, Run

T0 = 1_767_225_600.0
NS = "contract"
LEASE = 30.0


def new_run(
    now: float = T0,
    *,
    workflow: str = "wf",
    priority: int = 0,
    key: str | None = None,
    idem: str | None = None,
    tenant: str = "default",
    delay: float = 0.0,
    max_attempts: int = 3,
    namespace: str = NS,
    input: Any = None,
    rate_key: str | None = None,
) -> NewRun:
    """A root run created at ``now``, due ``delay`` seconds later (``key``: its concurrency key,
    ``idem``: its idempotency key)."""
    run_id = _ids.new_id(now)
    return NewRun(
        id=run_id, namespace=namespace, tenant=tenant, workflow=workflow,
        input=input if input is not None else {"n": 1}, priority=priority, created_at=now,
        run_at=now + delay, max_attempts=max_attempts, concurrency_key=key,
        idempotency_key=idem, version=None, root_id=run_id, rate_key=rate_key,
    )


async def add(store: RunQueue, *args: Any, **kwargs: Any) -> Run:
    """Create ``new_run(*args, **kwargs)`` without admission control; it must be new."""
    run, created = await store.create_run(new_run(*args, **kwargs), max_queued=None,
                                          admission="reject")
    assert created
    return run


async def claim(store: RunQueue, owner: str = "a", now: float = T0, limit: int = 10,
                workflows: tuple[str, ...] = ("wf", "other")) -> list[Run]:
    """Claim up to ``limit`` due runs of ``workflows`` in :data:`NS` for ``owner``, for
    :data:`LEASE` seconds."""
    return await store.claim_runs(NS, list(workflows), owner, limit, LEASE, now)


def new_pause(run: Run, now: float = T0, *, expires_in: float | None = 100.0,
              name: str = "refund") -> Pause:
    """A pending pause of ``run``, expiring ``expires_in`` seconds after ``now`` (None: never)."""
    return Pause(
        id=_ids.new_id(now), namespace=run.namespace, tenant=run.tenant, run_id=run.id,
        name=name, request={"amount": 40}, status="pending", decision=None, created_at=now,
        expires_at=None if expires_in is None else now + expires_in, resolved_at=None,
        notified=False,
    )


APPROVED = {"approved": True, "data": {"note": "ok"}, "by": "ana", "reason": None}


def replace_parent(new: NewRun, parent: Run) -> NewRun:
    """``new`` as a child of ``parent``: same tree and tenant."""
    return dataclasses.replace(new, parent_id=parent.id, root_id=parent.root_id,
                               tenant=parent.tenant)


def entries(run: Run, seq: int, *topics: str, now: float = T0) -> list[OutboxEntry]:
    """One outbox entry per topic, as step ``seq`` of ``run`` sends them."""
    return [OutboxEntry(id=_ids.new_id(now), namespace=run.namespace, run_id=run.id, seq=seq,
                        index=i, topic=t, payload={"n": i}, created_at=now)
            for i, t in enumerate(topics)]


def fence(run: Run) -> Fence:
    """The claim ``run`` (as claimed) holds."""
    assert run.owner is not None
    return Fence(run.id, run.owner, run.lease_epoch)
