"""The ports: what a backend provides, one protocol per concern, each method one atomic operation
with one invariant (its docstring). A backend implements the concerns it keeps: the memory, SQLite
and PostgreSQL backends all of them (:class:`Store`, :class:`CoordStore`, :class:`RateStore`);
Redis only coordination and rate limits. The layers above (coord, engine, app) depend on these
protocols and on :mod:`shoal.types`, never on a backend.

Every method that compares or stores a time takes ``now`` from the app's Clock; a store never
reads its own clock. Writes of a running run take a :class:`~shoal.types.Fence` and succeed only
while the run is ``running`` under that owner and lease epoch (invariant 1), so a writer that
lost its lease can never overwrite the new owner's work.

**Coordination.** The coordination protocol: locks, membership and meters kept in a shared store.

A :class:`CoordStore` is what ``app.lock``, ``app.slots`` and ``app.meter`` are built on. The run
stores (memory, SQLite, PostgreSQL) implement it beside the Store protocol, in their own tables;
Redis implements it alone. Each method is one atomic operation with one invariant, stated in its
docstring. Every key is scoped by ``namespace`` (the app's name): two namespaces never meet. Every
time is the app's clock, passed as ``now`` (seconds); a store never reads its own clock.

Locks (invariant 7: a key has at most one holder with a live lease; tokens strictly increase)

- ``holder`` is unique per acquisition (an instance locking one key twice queues behind itself).
- A holder's lease ends at ``expires_at``; a holder whose lease ended holds nothing, even if its
  row is still there.
- Waiters queue per key in ticket order (FIFO). A waiter row also has a lease: a waiter that stops
  asking (a dead process) leaves the queue when it ends, so it cannot block the queue for ever.
- A grant of several keys is atomic (all or nothing); tickets are ordered across keys, so the
  oldest waiter anywhere is never blocked by younger ones (no deadlock, no starvation).
- Wake-ups go to one waiter, not to the queue: a release wakes the first waiter of each key it
  leaves free (the next in line, the only one that can be granted); a waiter's ``retry_at`` is
  the lease end of the holder or, if it comes earlier, of the waiter right ahead of it, so a dead
  waiter is noticed by the one behind it, and a dead holder at its lease end even when the
  waiters ahead give up meanwhile (their release names nobody while the holder's row is there).
  A live holder renews long before its lease ends, so the waiters sleep until their own re-ask.
- The fencing token of a grant is ``max(last token of each key) + 1`` and becomes the last token of
  every key granted: strictly increasing per key, and one token guards all the keys of a grant.

Membership (invariant 8: a slot is owned by at most one member at a time)

- Members heartbeat with the generation they currently *hold* (act on), or None. The store keeps a
  roster: the sorted ids of live members that joined at least ``warmup`` ago, and a generation
  number that increases whenever the roster changes.
- A heartbeat grants the current generation only when no other live member holds another one: a
  member must report that it let go of the old assignment before anyone takes a new one.
- A member row ends ``ttl`` after the heartbeat's ``now``; the member itself stops acting well
  before (the coordination layer gives up its assignment after two intervals without a
  heartbeat), so a member whose row has ended holds nothing.

Meters (invariant 9: concurrent charges are never lost)

- Per key a debt in milliseconds that drains one millisecond per millisecond of ``now`` and never
  goes below zero; an update adds every delta of a call in one atomic operation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Literal, Protocol, runtime_checkable

from shoal.types import (
    HELD_BACK_CAP,
    JSON,
    Admitted,
    CoordinationView,
    CounterResult,
    Fence,
    FlowLimits,
    GraphCheckpoint,
    GraphWrite,
    LockGrant,
    LockWait,
    MemberView,
    Need,
    NewRun,
    OutboxEntry,
    Pause,
    PausedWorkflow,
    PauseNeed,
    PauseWait,
    Progress,
    RateView,
    Refused,
    Renewal,
    Run,
    RunFilter,
    RunOwner,
    RunRecord,
    Settlement,
    SignalWait,
    SlotBusy,
    SlotGrant,
    SlotNeed,
    SpendEntry,
    Stats,
    Step,
    WindowNeed,
    WindowResult,
    WorkflowInfo,
)


@runtime_checkable
class StoreLifecycle(Protocol):
    """Connecting, migrating and waking: what every run store does before anything else."""

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

    async def wait_for_work(self, timeout: float) -> None:
        """Return when another writer may have made work due (a hint), or after ``timeout``
        seconds of real time."""


@runtime_checkable
class WorkflowRegistry(Protocol):
    """Which workflows the instances of a namespace serve, with their dispatch options."""

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

    async def pause_workflow(
        self, namespace: str, workflow: str, tenant: str | None, now: float
    ) -> bool:
        """Pause ``workflow`` in ``namespace`` for ``tenant`` (every tenant when None): from
        this call's commit on, no claim of any handle starts a run of it (of that tenant), a
        due sleeping or waiting one included; running runs are untouched and runs are still
        created. True when it was not paused so already (a second call keeps the first
        ``paused_at``)."""

    async def resume_workflow(
        self, namespace: str, workflow: str, tenant: str | None, now: float
    ) -> bool:
        """Drop the pause ``pause_workflow(namespace, workflow, tenant)`` made (only that one:
        resuming every tenant leaves a pause of one tenant in place), so its due runs are
        claimed again, and wake waiting claimers. False when there was none."""

    async def paused_workflows(self, namespace: str) -> list[PausedWorkflow]:
        """The pauses of ``namespace``, by workflow, then tenant (every tenant first)."""

    async def set_tenant_weight(self, namespace: str, tenant: str, weight: float) -> None:
        """Store ``tenant``'s weight in ``namespace`` (a positive number, checked by the
        caller; 1, the default, is stored as no row): under ``fairness="tenant"`` every claim
        of every handle after this call's commit deals the tenant ``weight`` turns for one of
        a tenant of weight 1 (see :mod:`shoal.backends._fairness`)."""

    async def tenant_weights(self, namespace: str) -> dict[str, float]:
        """The weights of ``namespace`` other than the default 1, by tenant."""


@runtime_checkable
class RunQueue(Protocol):
    """Runs from dispatch to their end: insert, claim under a lease, renew, settle, recover,
    cancel, retry, admission and retention. Writes of a running run are fenced (invariant 1)."""

    async def create_run(
        self, new: NewRun, *, max_queued: int | None, admission: str
    ) -> tuple[Run, bool]:
        """Insert ``new`` as queued, or return the existing run of its idempotency key
        (tenant, workflow, key) with ``False`` (invariant 5). Over ``max_queued`` queued runs in
        the namespace (never started, not held): ``admission="reject"`` raises
        AdmissionRejectedError and stores nothing; ``"park"`` stores it held, behind every run
        held before it."""

    async def create_runs(
        self, news: Sequence[NewRun], *, max_queued: int | None, admission: str
    ) -> list[tuple[Run, bool]]:
        """``create_run`` for a batch of one namespace (new ids), all or nothing, answered in
        ``news``' order: an item whose key is stored already, or was taken by an earlier item of
        the batch, gets that run with ``False``. Admission counts the new runs only:
        ``"reject"`` refuses the whole batch when they do not all fit; ``"park"`` stores those
        beyond the room held, in batch order."""

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
        concurrency_limits: Mapping[str, int] | None = None,
        flow: Mapping[str, FlowLimits] | None = None,
    ) -> list[Run]:
        """Atomically claim up to ``limit`` due runs of these workflows, by priority descending,
        created_at, id: set them running under ``owner`` with a new epoch and a lease until
        ``now + lease``. A run with a concurrency key is claimed only when fewer than its
        workflow's ``concurrency_limits`` (1 for a workflow left out) other runs of its workflow
        and key have started and not ended (invariant 4), and a claim takes at most one run of a
        key that has not started before. Due: queued (not held) or
        sleeping/waiting with ``run_at <= now``. A run that has started is claimed only by the
        code ``version`` that started it, unless its workflow is in ``any_version``; a run's
        first claim stamps it with ``version``. A run of a paused workflow (``pause_workflow``,
        for every tenant or for the run's) is never claimed, and takes no room of ``limit``.
        ``flow`` gives, for the workflows that have them, the rules of :class:`FlowLimits`
        (a workflow left out has none): a run whose workflow has ``max_running`` runs in
        ``running`` (or its tenant ``max_running_per_tenant``) is not claimed, nor is one whose
        first start would make more than ``rate_limit`` first starts of its workflow and
        ``rate_key`` in the last ``rate_per`` seconds; under ``fairness="tenant"``, due runs of
        one priority are taken tenant by tenant (see the contract suite). Each rule holds
        across every claimer at once, and a run held back by one takes no room of ``limit``
        from the runs behind it."""

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

    async def settle_run(self, fence: Fence, settlement: Settlement, now: float) -> bool:
        """Under ``fence``: end the attempt as ``settlement`` says, its ``error`` and
        ``traceback`` replacing the run's; False when fenced out."""

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
        """``settle_run(fence, settlement, at)`` for each of ``settlements`` (at most one per
        run) and ``claim_runs`` with the other arguments (none when ``limit`` is 0), the claim
        committed no sooner than the settlements; it may not see what they make claimable (a
        concurrency key they free, a retry due at once, a parent waiting for a child they
        end): the next claim does. Returns each settlement's answer, in order, and the runs
        claimed."""

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

    async def release_held(self, namespace: str, max_queued: int, now: float) -> int:
        """Release held runs, oldest first, while fewer than ``max_queued`` are queued."""

    async def prune_runs(self, namespace: str, before: float, limit: int) -> int:
        """Delete up to ``limit`` final runs that finished before ``before``, with their steps,
        signals, outbox entries and graph checkpoints (a :class:`GraphCheckpoints` thread that
        is the run, in its namespace and tenant), oldest first; return how many. Live runs, and
        runs with outbox entries still to deliver, are never touched."""

    async def stats(self, namespace: str, now: float) -> Stats:
        """The namespace's runs, pending pauses and outbox as one consistent read sees them at
        ``now`` (see :class:`~shoal.types.Stats`). Its cost does not grow with the final runs
        kept: live runs are counted from their rows, final ones from counts the store keeps
        as runs end, are retried and are pruned."""

    async def fold_stats(self, namespace: str, now: float) -> None:
        """Compact what the store keeps for ``stats`` of ``namespace`` (retention calls it
        every pass), so that ``stats`` stays cheap. No answer of ``stats`` changes, for a reader
        whose clock is ahead of ``now`` or behind it by a minute at most."""


@runtime_checkable
class TransactionalDispatch(Protocol):
    """Runs created in the caller's own open transaction on the store's database, so that they
    exist if and only if it commits (``app.dispatch(..., connection=conn)`` and
    ``app.dispatch_many``): the SQLite and PostgreSQL stores; the memory store has no
    transaction to join."""

    async def create_run_in(
        self, connection: object, new: NewRun, *, max_queued: int | None, admission: str
    ) -> tuple[Run, bool]:
        """``create_run`` on ``connection`` inside its transaction, committing nothing: the run
        and the workers' wake-up come with the caller's commit. Admission counts what that
        transaction sees. A connection of another kind is a TypeError; one to another database,
        or in autocommit outside a transaction, a ConfigurationError (nothing done)."""

    async def create_runs_in(
        self, connection: object, news: Sequence[NewRun], *, max_queued: int | None,
        admission: str,
    ) -> list[tuple[Run, bool]]:
        """``create_runs`` on ``connection`` inside its transaction, as ``create_run_in`` does
        ``create_run``: the whole batch, and one wake-up, come with the caller's commit."""


@runtime_checkable
class Checkpoints(Protocol):
    """A run's steps, durable sleeps and signals: what replay reads and a running attempt writes."""

    async def load_steps(self, run_id: str) -> list[Step]:
        """The run's checkpoints in seq order."""

    async def checkpoint_step(
        self, fence: Fence, step: Step, lease: float, now: float,
        outbox: Sequence[OutboxEntry] = (),
    ) -> bool:
        """Write ``step`` finished (replacing an unfinished one at its seq) with its
        ``started_at``, ``attempt`` and ``retries``, the ``outbox`` entries it sent, and extend
        the lease, in one transaction, only under ``fence``; False when the fence no longer
        holds (nothing written). A step's entries exist once (invariant 3): a finished step is
        never written again."""

    async def record_progress(self, fence: Fence, progress: Progress) -> bool:
        """Under ``fence``: replace the run's progress by ``progress`` (the latest value only,
        kept with its ``at``; nothing else of the run changes, the lease is not extended);
        False when the fence no longer holds (nothing written). ``get_run`` and every read of
        the run return it as ``Run.progress``."""

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

    async def send_signal(
        self, run_id: str, name: str, payload: JSON, signal_id: str, now: float
    ) -> Run | None:
        """Keep the signal until consumed; a run waiting for ``name`` becomes due at once.
        None for an unknown id."""


@runtime_checkable
class Pauses(Protocol):
    """Human decisions a run waits for without holding a worker (invariant 6)."""

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


@runtime_checkable
class Trees(Protocol):
    """Run trees: keys shared by a root run's descendants, and a parent waiting for its child."""

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


@runtime_checkable
class Outbox(Protocol):
    """Side effects recorded with the step that sent them, delivered by any instance."""

    async def claim_outbox(
        self, namespace: str, topics: Sequence[str], now: float, lease: float, limit: int
    ) -> list[OutboxEntry]:
        """Due entries of these topics (not delivered, not dead, ``next_at <= now``), the
        earliest due first (then the oldest); each is taken for ``lease`` seconds
        (``next_at = now + lease``)."""

    async def finish_delivery(
        self, entry_id: str, now: float, error: str | None = None,
        retry_at: float | None = None,
    ) -> None:
        """Delivered (``error`` None); or failed: attempts + 1, due again at ``retry_at``, or
        dead-lettered when ``retry_at`` is None."""

    async def dead_letters(self, namespace: str, limit: int = 100) -> list[OutboxEntry]:
        """Dead-lettered entries of the namespace, oldest first."""

    async def redrive(self, namespace: str, entry_id: str,
                      now: float) -> tuple[OutboxEntry | None, bool]:
        """Make a dead-lettered entry of ``namespace`` deliverable again, only if it is still
        dead: not dead, attempts 0, due at ``now``, its error kept until the next attempt
        replaces it. Returns the entry as it now is and True; the entry unchanged and False when
        it is not dead (of two racing calls, one wins); ``(None, False)`` for an unknown id or
        another namespace's entry (which is left as it is)."""


@runtime_checkable
class RunInspection(Protocol):
    """Reads for a console: runs found by filters a page at a time, one run with everything
    kept about it, and the runs that ended per minute. Each is one consistent read."""

    async def search_runs(
        self, namespace: str, where: RunFilter, *, before: str | None = None, limit: int = 50,
    ) -> list[Run]:
        """At most ``limit`` runs of ``namespace`` matching ``where``, newest first (id
        descending), those with id less than ``before`` when given: the next page is
        ``before=runs[-1].id``, without a gap or a repeat. A store reads by an index for the
        status, for each key, and for the namespace alone; the other filters are checked on
        the rows read in id order."""

    async def inspect_run(self, run_id: str, tree_limit: int = 200) -> RunRecord | None:
        """The run with its steps (with when each was written finished), signals, pauses,
        outbox entries and at most ``tree_limit`` runs of its tree (see
        :class:`~shoal.types.RunRecord`); None for an unknown id."""

    async def run_owners(self, namespace: str, limit: int = 1000) -> list[RunOwner]:
        """The owners of ``namespace``'s running runs (at most ``limit``, by owner), each with
        how many it holds and the latest end of their leases (expired ones included: recovery
        has not taken them back yet). Read by the index of claimed runs: its cost grows with
        the running runs, not with the runs kept."""

    async def finished_per_minute(
        self, namespace: str, since: float, minutes: int
    ) -> list[int]:
        """Runs of ``namespace`` in a final status that ended in each of ``minutes``
        consecutive minutes from ``since``: item i counts ``finished_at`` in
        ``[since + 60 i, since + 60 (i + 1))``. Its cost grows with the runs that ended in
        that span (read by the index retention uses), not with the runs kept."""


@runtime_checkable
class FlowView(Protocol):
    """Which flow-control rule holds back due queued runs now (a console, ``shoal stats``,
    the metrics), from the rules the workflows table keeps (``register_workflows``' options:
    ``concurrency_key``/``key_from_input``, ``concurrency_limit``, ``max_running``,
    ``max_running_per_tenant``, ``rate_limit`` as ``{"limit", "per"}``) and the pauses. A
    run is counted under the first rule of :data:`~shoal.types.HOLD_REASONS` that holds it:
    paused (its workflow, or its tenant); ``max_running`` runs of its workflow in ``running``;
    ``max_running_per_tenant`` of its tenant's; its workflow's rate window full (at least
    ``limit`` runs first started in the last ``per`` seconds; a run never started only); its
    concurrency key with ``concurrency_limit`` holders (a run never started only). Reads
    only; each count reads at most ``cap`` runs, however long the backlog."""

    async def held_back(
        self, namespace: str, now: float, *, cap: int = HELD_BACK_CAP
    ) -> dict[str, dict[str, int]]:
        """Workflow -> rule -> the due queued runs of ``namespace`` that rule holds back at
        ``now`` (each at most ``cap``); only workflows and rules with some."""

    async def hold_reason(self, run_id: str, now: float) -> str | None:
        """The rule that holds back the run ``run_id`` at ``now``, as :meth:`held_back` would
        count it; None for an unknown run, one that is not due and queued, or one that no
        rule holds back (it waits for a worker)."""


@runtime_checkable
class Store(StoreLifecycle, WorkflowRegistry, RunQueue, Checkpoints, Pauses, Trees,
            Outbox, RunInspection, FlowView, Protocol):
    """A run store: every concern above, as the memory, SQLite and PostgreSQL backends provide
    it (each also provides :class:`Coordination` and :class:`RateStore`).
    ``shoal.testing.contract`` is the behaviour to match."""


@runtime_checkable
class GraphCheckpoints(Protocol):
    """LangGraph checkpoints (``shoal.integrations.langgraph.ShoalCheckpointer``) in a run store's
    own tables, scoped by namespace and tenant: two tenants' threads never meet. A checkpoint is
    named by ``(thread_id, checkpoint_ns, checkpoint_id)``; checkpoint ids sort in the order they
    were made (LangGraph's uuid6), so the latest of a thread's namespace is the greatest.

    A write given a ``fence`` (a durable graph inside a run) happens only while the run is
    ``running`` under that owner and epoch, checked in the write's own transaction (invariant
    1): it answers False and writes nothing otherwise. Without a fence it always writes."""

    async def put_graph_checkpoint(
        self, namespace: str, tenant: str, checkpoint: GraphCheckpoint, fence: Fence | None,
    ) -> bool:
        """Keep ``checkpoint`` (its ``writes`` ignored), replacing one of the same name."""

    async def put_graph_writes(
        self, namespace: str, tenant: str, thread_id: str, checkpoint_ns: str,
        checkpoint_id: str, writes: Sequence[GraphWrite], fence: Fence | None,
    ) -> bool:
        """Keep ``writes`` under that checkpoint, all or nothing: a write whose
        ``(task_id, idx)`` is kept already stays as it was when ``idx >= 0`` (a task's writes
        are written once) and is replaced when ``idx < 0`` (a special channel)."""

    async def get_graph_checkpoint(
        self, namespace: str, tenant: str, thread_id: str, checkpoint_ns: str,
        checkpoint_id: str | None,
    ) -> GraphCheckpoint | None:
        """That checkpoint (the latest of the thread's namespace when ``checkpoint_id`` is
        None) with its pending writes, or None."""

    async def list_graph_checkpoints(
        self, namespace: str, tenant: str, *, thread_id: str | None = None,
        checkpoint_ns: str | None = None, checkpoint_id: str | None = None,
        before: str | None = None, metadata: Mapping[str, JSON] | None = None,
        limit: int | None = None,
    ) -> list[GraphCheckpoint]:
        """At most ``limit`` checkpoints (all when None) with their pending writes, newest id
        first, that match every filter given: thread, namespace and id equal, id less than
        ``before``, and each key of ``metadata`` equal to the checkpoint's."""

    async def delete_graph_threads(
        self, namespace: str, tenant: str, thread_ids: Sequence[str]
    ) -> None:
        """Delete every checkpoint and write of these threads, in every namespace."""

    async def delete_graph_runs(self, namespace: str, tenant: str, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints whose LangGraph ``run_id`` is one of ``run_ids``, with their
        writes."""

    async def copy_graph_thread(
        self, namespace: str, tenant: str, source: str, target: str
    ) -> None:
        """Copy every checkpoint and write of thread ``source`` to thread ``target`` (same
        names otherwise), replacing those of the same name there."""

    async def prune_graph_threads(
        self, namespace: str, tenant: str, thread_ids: Sequence[str], *, keep_latest: bool,
    ) -> None:
        """Delete the checkpoints of these threads with their writes: all of them, or (with
        ``keep_latest``) all but the latest of each thread's namespace."""


# -- coordination ----------------------------------------------------------------------------------


class LockWatch(Protocol):
    """Wake-ups for one lock waiter (a ``holder``): created before it first asks, so that no
    wake-up meant for it can come before the watch exists."""

    async def wait(self) -> None:
        """Return once the holder may have become grantable since the watch was created or since
        ``wait`` last returned (at once if it already did). Never raises on timeout: the caller
        races it with its own clock."""
        ...


@runtime_checkable
class CoordStore(Protocol):
    """Locks, membership and meters (see the module doc for their invariants), kept by a run
    store in its own tables or by Redis alone."""

    async def lock_acquire(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> LockGrant | LockWait:
        """Take every key for ``holder`` if each is free (no holder with ``expires_at > now``)
        and ``holder`` has the smallest ticket among the live waiters (``expires_at > now``) of
        each key; then delete its waiter rows and return the grant (token as in the module doc,
        ``expires_at = now + lease``). Otherwise enqueue ``holder`` on every key with a new ticket
        (larger than every ticket given before in this namespace) if it is not queued yet, else
        extend its waiter rows to ``now + lease``, and return where it stands. Keys are distinct
        and non-empty; ``holder`` holds none of them when it asks."""
        ...

    async def lock_renew(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> bool:
        """Extend the lease of ``holder`` on every key to ``now + lease`` if it still holds all
        of them with ``expires_at > now``; else change nothing and return False."""
        ...

    async def lock_release(self, namespace: str, keys: Sequence[str], holder: str) -> None:
        """Delete whatever ``holder`` has on these keys: its hold (the fencing counter stays) and
        its waiter rows (a waiter that gives up). On each key where it held the lock (even with
        an ended lease) or was the first waiter, and which now has no holder, wake the watch of
        the new first waiter (smallest ticket; a waiter row whose lease ended counts, and its
        successor finds out by ``retry_at``): one wake-up per key, never the whole queue."""
        ...

    def lock_watch(
        self, namespace: str, keys: Sequence[str], holder: str
    ) -> AbstractAsyncContextManager[LockWatch]:
        """The wake-ups of ``holder`` waiting for these keys (see :class:`LockWatch`): from a
        release in this process and, where the store can, across processes (NOTIFY, pub/sub;
        SQLite polls ``data_version``)."""
        ...

    async def heartbeat(
        self,
        namespace: str,
        member: str,
        held: int | None,
        now: float,
        ttl: float,
        warmup: float,
        *,
        version: str | None = None,
    ) -> MemberView:
        """In one atomic step:

        1. delete member rows with ``expires_at <= now``;
        2. upsert ``member`` with ``expires_at = now + ttl``, ``held``, ``beat_at = now`` and
           ``version`` (the member's code version, kept for :meth:`coordination_view`);
           ``joined_at = now`` when the row is new (an ended row is gone by step 1, so a member
           back from an outage joins again);
        3. the roster is the sorted ids of members with ``joined_at + warmup <= now``; if it
           differs from the stored one, store it with the generation increased by one;
        4. if ``member`` is on the roster, ``held`` is None or the current generation, and every
           other member row holds None or the current generation: record ``held = generation``
           for ``member`` and answer ``granted=True``; else ``granted=False``.
        """
        ...

    async def leave(self, namespace: str, member: str) -> None:
        """Delete ``member``'s row (it holds nothing any more); the roster changes at the next
        heartbeat of any member."""
        ...

    async def meter(
        self, namespace: str, keys: Sequence[str], deltas: Sequence[float], now: float
    ) -> list[float]:
        """For each key in order: ``debt = max(0, debt - max(0, now - updated_at) * 1000) +
        delta``, floored at 0, stored with ``updated_at = max(updated_at, now)`` (a replica whose
        clock is behind never un-drains a debt); all keys in one atomic operation. Returns
        the new debts (ms). A key named twice is charged twice, in order. A key never charged
        has debt 0."""
        ...

    async def coordination_view(
        self, namespace: str, now: float, limit: int = 100
    ) -> CoordinationView:
        """What a console shows of ``namespace`` at ``now``, read without writing anything (no
        row that ended is deleted, no meter drained, no expiry changed: a read at a later
        ``now`` leaves the answers of a read at an earlier one as they were):

        - the stored roster and generation, as the latest heartbeat left them (0 and () before
          any);
        - the members whose row is live (``expires_at > now``), by id, with ``held``,
          ``beat_at`` and ``version`` as their latest heartbeat wrote them;
        - the keys with a live holder (``expires_at > now``) or a live waiter, at most
          ``limit``, by key: each with its last fencing token, its live holder if any, and its
          live waiters in ticket order (at most ``limit`` each);
        - the meters whose debt drained to ``now`` (as :meth:`meter` drains it) is above 0, at
          most ``limit``, by key.

        ``complete`` is False when a list was cut at ``limit``. Keys and ids sort by their
        characters' code points. Its cost grows with the namespace's members, live locks,
        waiters and meter rows, not with the keys ever locked."""
        ...

    async def prune_coordination(self, namespace: str, before: float, limit: int) -> int:
        """Delete at most ``limit`` rows that can no longer matter: meters fully drained by
        ``before`` (``updated_at + debt / 1000 <= before``) and lock waiter rows whose lease
        ended by ``before``. Lock rows stay (they keep the fencing counters). Returns how many
        were deleted. A store whose keys expire by themselves (Redis) may delete nothing."""
        ...

    async def open(self) -> None:
        """Connect (or prepare to); a Redis store never raises here for an unreachable server."""
        ...

    async def close(self) -> None:
        """Release connections. Idempotent."""
        ...

    async def ping(self) -> None:
        """Raise if the store cannot be reached."""
        ...


# -- rate limits and the ledger --------------------------------------------------------------------


def check_counter_args(keys: Sequence[str], amounts: Sequence[float],
                       limits: Sequence[float | None]) -> None:
    """Raise ValueError unless ``counter_add`` got one key, amount and limit per position."""
    if not len(keys) == len(amounts) == len(limits):
        raise ValueError(f"counter_add: {len(keys)} keys, {len(amounts)} amounts and "
                         f"{len(limits)} limits; one of each per position")


def check_needs(needs: Sequence[Need]) -> None:
    """Raise ValueError unless no key of a kind (slot, pause, window) is named twice in
    ``needs`` (a circuit's keys count as a pause and a slot) and every window amount is > 0."""
    seen: set[tuple[str, str]] = set()
    for need in needs:
        if isinstance(need, SlotNeed):
            named = [("slot", need.key)]
        elif isinstance(need, PauseNeed):
            named = [("pause", need.key)]
        elif isinstance(need, WindowNeed):
            if not need.amount > 0:
                raise ValueError(f"admit: window {need.key!r} needs an amount > 0, not "
                                 f"{need.amount!r}")
            named = [("window", need.key)]
        else:
            named = [("pause", need.open), ("slot", need.trial)]
        for kind_key in named:
            if kind_key in seen:
                raise ValueError(f"admit: the {kind_key[0]} {kind_key[1]!r} is named twice")
            seen.add(kind_key)


@runtime_checkable
class RateLimits(Protocol):
    """Rate-limit state, each operation atomic across instances (scoped by namespace, times from
    the app's clock):

    - slots: at most ``max_slots`` live holders per key (a provider's concurrent calls);
    - windows: sliding sums of amounts over the last ``window`` seconds (calls and tokens per
      minute, a breaker's failures);
    - pauses: a time before which a key is paused (a 429's cooldown, an open breaker); a later
      pause is kept;
    """

    async def slot_acquire(
        self, namespace: str, key: str, holder: str, max_slots: int, lease: float, now: float
    ) -> SlotGrant | SlotBusy:
        """Forget slots of ``key`` with ``expires_at <= now``. If ``holder`` holds a live slot,
        extend it to ``now + lease`` and grant it again; else if fewer than ``max_slots`` are
        held, give ``holder`` one until ``now + lease``; else answer when the first ends."""
        ...

    async def slot_renew(
        self, namespace: str, key: str, holder: str, lease: float, now: float
    ) -> bool:
        """Extend ``holder``'s slot to ``now + lease`` if it is still live; else False."""
        ...

    async def slot_release(self, namespace: str, key: str, holder: str) -> None:
        """Free ``holder``'s slot of ``key`` (nothing if it holds none)."""
        ...

    async def admit(
        self, namespace: str, holder: str, needs: Sequence[Need], now: float
    ) -> Admitted | Refused:
        """Meet every need of ``needs`` for ``holder``, in one atomic operation, all or nothing.
        The needs are looked at in order; the first that cannot be met is refused
        (:class:`Refused` names it) and nothing is taken or counted. Otherwise every slot is
        taken (or, if ``holder`` holds it already, extended) to ``now + lease``, every window
        amount counted at ``now``, and the circuit's trial slot taken if the circuit is tripped
        (:class:`Admitted`). Each need is met or refused exactly as its own operation
        (``slot_acquire``, ``paused_until``, ``window_add``) would meet or refuse it at that
        point; once the circuit's pause is found not in force, its counters are read as
        ``counter_add`` of 0 reads them (a counter never counted is 0; both are marked used at
        ``now``, which retention sees, whatever the answer). Ended slots and entries that left a
        window may be forgotten either way.
        Raises ValueError for the requests :func:`check_needs` refuses."""
        ...

    async def window_add(
        self, namespace: str, key: str, amount: float, window: float, limit: float | None,
        now: float,
    ) -> WindowResult:
        """Forget entries of ``key`` with ``at <= now - window``. If ``amount > 0``, ``limit`` is
        not None and ``total + amount > limit``: refuse (add nothing) and say when it would fit
        (the ``at + window`` of the oldest entry whose leaving makes room; None if it never can,
        i.e. ``amount > limit``). Otherwise add an entry ``(now, amount)`` (none for 0: a read;
        a negative amount corrects an estimate and is never refused) and return the new total.
        ``now`` may be earlier than other entries' times (a correction dated when its estimate
        was counted): the entry leaves the window at its own time.

        Cost: proportional to the entries leaving (and, when refused, to those walked to find
        ``retry_at``), never to the whole window — a window of a busy provider holds one entry
        per call of the last minute. Keep a running total beside the entries."""
        ...

    async def window_clear(self, namespace: str, key: str) -> None:
        """Forget every entry of ``key``."""
        ...

    async def pause_until(self, namespace: str, key: str, until: float, now: float) -> float:
        """Pause ``key`` until ``until`` unless it is already paused until later; return the
        pause in force. ``now`` is when the pause is set (a store whose keys expire by themselves
        gives the pause a cleanup expiry from it, so a pause never read again still goes)."""
        ...

    async def paused_until(self, namespace: str, key: str, now: float) -> float | None:
        """The end of ``key``'s pause if it is after ``now``, else None."""
        ...

    async def prune_rates(self, namespace: str, before: float, limit: int) -> int:
        """Delete at most ``limit`` rows that can no longer matter: slots whose lease ended by
        ``before``, window entries dated at or before ``before`` (with their windows' totals
        when nothing is left), pauses that ended by ``before``, counters last updated before
        ``before`` (oldest first, then in key order: a provider's circuit counters rely on
        it). The ledger stays (it is the record of what was spent). Returns how many
        were deleted. A store whose keys expire by themselves (Redis) may leave slots, windows
        and pauses to their expiries, and counts only what it deleted."""
        ...


@runtime_checkable
class Ledger(Protocol):
    """Counters that only the caller resets, added all or nothing under limits (the spend behind
    budgets), with the cost ledger's rows."""

    async def counter_add(
        self,
        namespace: str,
        keys: Sequence[str],
        amounts: Sequence[float],
        limits: Sequence[float | None],
        now: float,
        entry: SpendEntry | None = None,
    ) -> CounterResult:
        """Add ``amounts[i]`` to counter ``keys[i]`` (a new counter starts at 0) for every i,
        all or nothing: refused (nothing added, ``entry`` not written) if some positive amount
        would take its counter above ``limits[i]`` (None: no limit). When added, ``entry`` (if
        any) is appended to the cost ledger in the same operation, with the next id of the
        namespace (its own ``id`` is ignored). ``now`` is the counters' ``updated_at`` (for
        pruning). A read passes amounts of 0."""
        ...

    async def ledger(
        self, namespace: str, tenant: str | None = None, root_id: str | None = None,
        limit: int = 1000, *, after: int | None = None, run_id: str | None = None,
        since: float | None = None, until: float | None = None,
    ) -> list[SpendEntry]:
        """At most ``limit`` ledger rows with ``id > after`` (every row when None), in id order
        (oldest first), that match every filter given: ``tenant``, ``root_id``, ``run_id``
        (equal) and ``since <= at < until``. Each row has its ``id``; the next page is
        ``after=rows[-1].id``. A store reads by an index for tenant, root and run; ``at`` is
        each writer's clock, not in id order, so ``since``/``until`` filter the rows read in
        id order (a page reads until it has ``limit`` rows or reaches the end)."""
        ...


@runtime_checkable
class RateStore(RateLimits, Ledger, Protocol):
    """What ``app.provider`` and budgets are built on: rate limits and the ledger."""

    async def read_rates(
        self, namespace: str, now: float, *, slots: Sequence[str] = (),
        windows: Sequence[tuple[str, float]] = (), pauses: Sequence[str] = (),
        counters: Sequence[str] = (),
    ) -> RateView:
        """One consistent read of these keys at ``now``, without writing anything (nothing
        forgotten, pruned or marked used: a read at a later ``now`` leaves the answers of a
        read at an earlier one as they were): per slot key its live holders (``expires_at >
        now``); per ``(key, window)`` the total of its entries with ``at > now - window``, as
        ``window_add`` of 0 would answer; per pause key the end of its pause if after ``now``
        (else None); per counter key its total (0 if never counted). Cost: per window, the
        entries that left it and are not forgotten yet, as ``window_add``."""
        ...
