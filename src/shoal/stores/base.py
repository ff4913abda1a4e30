"""The Store protocol: a few semantic, atomic operations over runs, steps and signals.

Each method is one atomic operation with one invariant, stated in its docstring. Every method that
compares or stores a time takes ``now`` from the app's Clock; a store never reads its own clock.
Writes of a running run take a :class:`Fence` and succeed only while the run is ``running`` under
that owner and lease epoch (invariant 1), so a writer that lost its lease can never overwrite the
new owner's work.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

JSON = Any


class RunStatus(enum.StrEnum):
    """Where a run stands. ``succeeded``, ``failed`` and ``cancelled`` are final."""

    QUEUED = "queued"
    RUNNING = "running"
    SLEEPING = "sleeping"
    WAITING = "waiting"
    INTERRUPTED = "interrupted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in FINAL_STATUSES


FINAL_STATUSES = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})
# A run that has started and is in one of these holds its concurrency key (besides a queued run that
# has started before, i.e. one waiting for a retry or for recovery).
KEY_HOLDING_STATUSES = ("running", "sleeping", "waiting", "interrupted")


@dataclass(frozen=True)
class Run:
    """One run as the store keeps it. ``held`` is True while admission control parks it."""

    id: str
    namespace: str
    tenant: str
    workflow: str
    input: JSON
    output: JSON
    error: str | None
    status: RunStatus
    priority: int
    created_at: float
    run_at: float | None
    attempts: int
    max_attempts: int
    concurrency_key: str | None
    idempotency_key: str | None
    owner: str | None
    lease_expires_at: float | None
    lease_epoch: int
    cancel_requested: bool
    version: str | None
    parent_id: str | None
    root_id: str
    wait_for: str | None
    held: bool
    started_at: float | None
    finished_at: float | None
    # why the run was last delivered: dispatched (first start, or a retry), woke (a sleep or a
    # deadline), resumed (a signal, an approval, a child's end), recovered (after a crash or a
    # stop), retried (started again by retry_run); set by claim_runs
    resume_reason: str | None = None
    # the traceback of the attempt that last settled (a failure, or a retry); None otherwise
    traceback: str | None = None


# how long ``list_workflows`` remembers an instance that has not registered a workflow since
WORKFLOW_INSTANCE_RETENTION = 30 * 86400.0


@dataclass(frozen=True)
class WorkflowInfo:
    """A workflow some instance of ``namespace`` registered: its dispatch options (the latest
    registration's), when it was last registered, and the instances that registered it, each with
    its latest registration time, newest first."""

    namespace: str
    name: str
    options: JSON
    registered_at: float
    instances: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class NewRun:
    """What ``create_run`` inserts; the store fills in status, attempts, owner and epoch."""

    id: str
    namespace: str
    tenant: str
    workflow: str
    input: JSON
    priority: int
    created_at: float
    run_at: float
    max_attempts: int
    concurrency_key: str | None
    idempotency_key: str | None
    version: str | None
    parent_id: str | None = None
    root_id: str | None = None


@dataclass(frozen=True)
class Fence:
    """The claim a write is conditional on: the run is ``running`` under this owner and epoch."""

    run_id: str
    owner: str
    epoch: int


@dataclass(frozen=True)
class Step:
    """A checkpoint at position ``seq`` of a run. ``finished`` False: a sleep or wait in progress,
    whose ``output`` holds what it waits for (``{"until": t}`` or ``{"deadline": t}``)."""

    seq: int
    name: str
    output: JSON
    finished: bool
    epoch: int


@dataclass(frozen=True)
class Pause:
    """A human decision a run waits for. ``status`` is ``pending`` until resolved exactly once;
    ``decision`` is then ``{"approved": bool, "data": ..., "by": str|None, "reason": str|None}``."""

    id: str
    namespace: str
    tenant: str
    run_id: str
    name: str
    request: JSON
    status: str
    decision: JSON
    created_at: float
    expires_at: float | None
    resolved_at: float | None
    notified: bool


@dataclass(frozen=True)
class OutboxEntry:
    """A side effect recorded with the step that sent it, delivered by any instance. ``key`` is
    stable (``run:seq:index``): the handler's idempotency key. ``dead`` once it failed
    ``max_deliveries`` times."""

    id: str
    namespace: str
    run_id: str
    seq: int
    index: int
    topic: str
    payload: JSON
    created_at: float
    attempts: int = 0
    next_at: float = 0.0
    delivered_at: float | None = None
    dead: bool = False
    error: str | None = None

    @property
    def key(self) -> str:
        return f"{self.run_id}:{self.seq}:{self.index}"


@dataclass(frozen=True)
class Settlement:
    """How an attempt ends. ``retry`` requeues the run at ``run_at`` with ``attempts + 1``.
    ``error`` and ``traceback`` replace the run's (a success clears them)."""

    outcome: Literal["succeeded", "failed", "cancelled", "retry"]
    output: JSON = None
    error: str | None = None
    run_at: float | None = None
    traceback: str | None = None


@dataclass(frozen=True)
class Renewal:
    """Result of ``renew_leases``: runs still held, and those of them asked to cancel."""

    renewed: frozenset[str]
    cancel_requested: frozenset[str]


@dataclass(frozen=True)
class SignalWait:
    """Result of ``wait_signal``: ``received`` with the payload; else ``parked`` (the run now
    waits), or neither when the deadline has passed."""

    received: bool
    payload: JSON = None
    parked: bool = False


@dataclass(frozen=True)
class PauseWait:
    """Result of ``wait_pause``: the pause as found (None when unknown or pruned), and whether
    the run was parked waiting for it (only while it is pending)."""

    pause: Pause | None
    parked: bool


@runtime_checkable
class Store(Protocol):
    """What a backend implements. ``shoal.testing.contract`` is the behaviour to match."""

    url: str

    async def open(self, *, migrate: bool = True) -> None:
        """Connect. With ``migrate``, bring the schema to the newest version (safe from several
        processes); a schema already current is only read, so a role allowed to read and write
        rows (and nothing else) opens it. Without ``migrate``, a schema behind (or missing) is
        refused. A schema newer than this code is refused either way. Both refusals are a
        ``SchemaVersionError`` naming the two versions."""

    async def close(self) -> None:
        """Release connections. Idempotent."""

    async def migrate(self) -> int:
        """Apply missing schema versions; return the version now in force. Raises
        ``SchemaVersionError`` for a schema newer than this code."""

    async def ping(self) -> None:
        """One round trip; raises when the store does not answer."""

    async def register_workflows(
        self, namespace: str, workflows: Mapping[str, JSON], now: float,
        instance: str | None = None,
    ) -> None:
        """Record that an instance of ``namespace`` serves these workflows, each with its
        dispatch options (a JSON object); a later registration of a name replaces its options.
        With ``instance``, also record that this instance registered them at ``now``, and forget
        the namespace's instances that registered nothing for WORKFLOW_INSTANCE_RETENTION."""

    async def get_workflow(self, namespace: str, name: str) -> JSON:
        """The options some instance of ``namespace`` registered ``name`` with, or None."""

    async def list_workflows(self, namespace: str | None) -> list[WorkflowInfo]:
        """The workflows registered in ``namespace`` (every namespace when None), by namespace
        and name."""

    async def create_run(
        self, new: NewRun, *, max_queued: int | None, admission: str
    ) -> tuple[Run, bool]:
        """Insert ``new`` as queued, or return the existing run of its idempotency key
        (tenant, workflow, key) with ``False`` (invariant 5). Over ``max_queued`` queued runs in
        the namespace (never started, not held): ``admission="reject"`` raises
        AdmissionRejectedError and stores nothing; ``"park"`` stores it held, behind every run
        held before it."""

    async def get_run(self, run_id: str) -> Run | None:
        """The run, or None."""

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
        """Runs in id order (creation order), those with id greater than ``after``."""

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
    ) -> list[Run]:
        """Atomically claim up to ``limit`` due runs of these workflows, by priority descending,
        created_at, id: set them running under ``owner`` with a new epoch and a lease until
        ``now + lease``. A run with a concurrency key is claimed only when no other run of its
        workflow and key has started and not ended (invariant 4). Due: queued (not held) or
        sleeping/waiting with ``run_at <= now``. A run that has started is claimed only by the
        code ``version`` that started it, unless its workflow is in ``any_version``; a run's
        first claim stamps it with ``version``."""

    async def incompatible_runs(
        self, namespace: str, workflows: Sequence[str], version: str | None,
        any_version: Sequence[str], now: float, limit: int = 100,
    ) -> list[Run]:
        """Due, started runs of these workflows that ``claim_runs`` leaves to another
        ``version`` (for logging them)."""

    async def renew_leases(
        self, owner: str, leases: dict[str, int], lease: float, now: float
    ) -> Renewal:
        """Extend each lease still held by ``owner`` at that epoch to ``now + lease``."""

    async def load_steps(self, run_id: str) -> list[Step]:
        """The run's checkpoints in seq order."""

    async def checkpoint_step(
        self, fence: Fence, step: Step, lease: float, now: float,
        outbox: Sequence[OutboxEntry] = (),
    ) -> bool:
        """Write ``step`` finished (replacing an unfinished one at its seq), the ``outbox``
        entries it sent, and extend the lease, in one transaction, only under ``fence``; False
        when the fence no longer holds (nothing written). A step's entries exist once
        (invariant 3): a finished step is never written again."""

    async def suspend_run(
        self,
        fence: Fence,
        step: Step,
        status: Literal["sleeping", "waiting"],
        run_at: float | None,
        wait_for: str | None,
        now: float,
    ) -> bool:
        """Under ``fence``: record the unfinished ``step``, set the run sleeping or waiting until
        ``run_at`` and drop the claim. The run keeps its concurrency key and its attempt."""

    async def wait_signal(
        self, fence: Fence, step: Step, signal: str, deadline: float | None, now: float
    ) -> SignalWait | None:
        """Under ``fence``: consume the oldest unconsumed signal ``signal`` of the run and record
        ``step`` finished with output ``{"payload": payload}``; or, if none is there, park the
        run waiting for it (until ``deadline``) with ``step`` unfinished. None when the fence no
        longer holds. Invariant 6: a signal is consumed once and never lost."""

    async def settle_run(self, fence: Fence, settlement: Settlement, now: float) -> bool:
        """Under ``fence``: end the attempt as ``settlement`` says, its ``error`` and
        ``traceback`` replacing the run's; False when fenced out."""

    async def release_run(self, fence: Fence, now: float) -> bool:
        """Under ``fence``: drop the claim at once, status ``interrupted`` (graceful stop)."""

    async def recover_runs(self, namespace: str, now: float) -> list[Run]:
        """Requeue runs whose claim expired (a crash: the attempt counts; past ``max_attempts``
        the run fails, with no traceback: that attempt raised none) or was released
        (``interrupted``: it does not count). Returns them."""

    async def cancel_run(self, run_id: str, now: float) -> Run | None:
        """Cancel a queued/sleeping/waiting/interrupted run at once; mark a running one
        ``cancel_requested`` for its owner. None for an unknown id; a final run is unchanged.
        Cancelling a root run cancels every unfinished run of its tree the same way."""

    async def retry_run(
        self, namespace: str, run_id: str, tenant: str | None, now: float
    ) -> tuple[Run | None, bool]:
        """Start a ``failed`` or ``cancelled`` run again: queued, due at ``now``, attempts 0,
        not started (so its concurrency key and its version are taken as a new run's are), its
        finished steps kept to replay and its unfinished ones (a sleep, wait, approval or child
        wait in progress) dropped, ``resume_reason`` ``retried``. Returns the run and True; the
        run unchanged and False when it is in another status (of two racing calls, one wins);
        ``(None, False)`` when no run of ``namespace`` (and ``tenant``, if given) has the id."""

    async def send_signal(
        self, run_id: str, name: str, payload: JSON, signal_id: str, now: float
    ) -> Run | None:
        """Keep the signal until consumed; a run waiting for ``name`` becomes due at once.
        None for an unknown id."""

    async def release_held(self, namespace: str, max_queued: int, now: float) -> int:
        """Release held runs, oldest first, while fewer than ``max_queued`` are queued."""

    async def create_pause(self, fence: Fence, step: Step, pause: Pause, now: float) -> bool:
        """Under ``fence``: insert the pending ``pause``, record the unfinished ``step`` and park
        the run ``waiting`` for it (no deadline: expiry resolves the pause), dropping the claim."""

    async def get_pause(self, pause_id: str) -> Pause | None:
        """The pause, or None."""

    async def wait_pause(
        self, fence: Fence, step: Step, pause_id: str, now: float
    ) -> PauseWait | None:
        """Under ``fence``, in one transaction: if the pause is pending, park the run waiting
        for it (as ``create_pause`` does, ``step`` unfinished, the claim dropped); otherwise
        change nothing. Returns the pause as read with the run held, so a resolution either
        came before (and is returned) or finds the run parked and wakes it: never a run left
        waiting on a resolved pause. None when the fence no longer holds."""

    async def resolve_pause(
        self, pause_id: str, decision: JSON, now: float
    ) -> tuple[Pause | None, bool]:
        """Resolve a pending pause with ``decision`` and make its waiting run due at once.
        Returns the pause and whether this call resolved it (invariant 6: exactly one call
        does); ``(None, False)`` for an unknown id."""

    async def list_pauses(
        self, namespace: str, *, tenant: str | None = None, limit: int = 100
    ) -> list[Pause]:
        """Pending pauses of the namespace, oldest first."""

    async def expire_pauses(self, namespace: str, now: float) -> list[Pause]:
        """Resolve every pending pause with ``expires_at <= now`` as denied with reason
        ``expired`` and make its run due; returns them."""

    async def claim_notifications(
        self, namespace: str, now: float, lease: float, limit: int
    ) -> list[Pause]:
        """Pauses not yet notified and not being notified by another instance (each is taken for
        ``lease`` seconds), oldest first."""

    async def mark_notified(self, pause_id: str) -> None:
        """The pause's notification was sent."""

    async def prune_pauses(self, namespace: str, before: float, limit: int) -> int:
        """Delete up to ``limit`` pauses resolved before ``before``."""

    async def save_tree_key(
        self, root_id: str, key: str, value: JSON, claimant: str, now: float
    ) -> bool:
        """Keep ``value`` under ``key`` of the run tree ``root_id`` if the key is absent and the
        root has not ended; True when this call stored it, or when ``claimant`` stored it before
        (a re-executed step gets its own answer again). Keys go when the root run ends."""

    async def get_tree_key(self, root_id: str, key: str) -> JSON:
        """The value under ``key`` of the tree ``root_id``, or None."""

    async def tree_keys(self, root_id: str) -> list[tuple[str, str]]:
        """``(key, tenant)`` of every key of the tree ``root_id``, in key order: each key carries
        the tenant of the tree's root run, set when it was stored."""

    async def wait_child(self, fence: Fence, step: Step, child_id: str, now: float) -> Run | None:
        """Under ``fence``: if the child run has ended, record ``step`` finished with output
        ``{"status", "output", "error"}`` of the child; otherwise park the run waiting for it
        (``step`` unfinished). Returns the child (None when fenced out). A child that ends makes
        its waiting parent due at once, whichever way it ends."""

    async def claim_outbox(
        self, namespace: str, topics: Sequence[str], now: float, lease: float, limit: int
    ) -> list[OutboxEntry]:
        """Due entries of these topics (not delivered, not dead, ``next_at <= now``), oldest
        first; each is taken for ``lease`` seconds (``next_at = now + lease``)."""

    async def finish_delivery(
        self, entry_id: str, now: float, error: str | None = None,
        retry_at: float | None = None,
    ) -> None:
        """Delivered (``error`` None); or failed: attempts + 1, due again at ``retry_at``, or
        dead-lettered when ``retry_at`` is None."""

    async def dead_letters(self, namespace: str, limit: int = 100) -> list[OutboxEntry]:
        """Dead-lettered entries of the namespace, oldest first."""

    async def prune_runs(self, namespace: str, before: float, limit: int) -> int:
        """Delete up to ``limit`` final runs that finished before ``before``, with their steps,
        signals and outbox entries, oldest first; return how many. Live runs, and runs with
        outbox entries still to deliver, are never touched."""

    async def wait_for_work(self, timeout: float) -> None:
        """Return when another writer may have made work due (a hint), or after ``timeout``
        seconds of real time."""
