"""shoal's records: the plain values that cross every layer (runs, steps, pauses, outbox entries,
lock grants, rate-limit needs, ledger rows). A leaf module: it imports nothing of shoal, so a
backend, the engine, the console and a user's code can all share these without depending on
each other (River keeps ``rivertype`` for the same reason)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal

# What app.result(run) gives for a run of a Workflow[In, Out]: its Out. A default (PEP 696,
# typing_extensions for the type checker only) makes a bare ``Run`` a ``Run[Any]``.
if TYPE_CHECKING:
    from typing_extensions import TypeVar
    Output = TypeVar("Output", default=Any)
else:
    from typing import TypeVar
    Output = TypeVar("Output")

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
class Run(Generic[Output]):
    """One run as the store keeps it. ``held`` is True while admission control parks it.

    The type parameter is the output type of its workflow when it is known, as for the run
    ``app.dispatch`` returns for a ``Workflow[In, Out]``: ``await app.result(run)`` is then an
    ``Out``. ``output`` itself is the JSON the store keeps."""

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
    # the latest ``ctx.progress(...)`` an execution of the run reported, None before any
    progress: Progress | None = None
    # the trace context active where the run was dispatched (the W3C propagator's carrier as
    # JSON), which its attempts' spans continue; None when nothing was traced there
    trace_context: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Progress:
    """How far a run says it has got: the latest ``ctx.progress(fraction, message, **data)``
    of its execution, written at most about once a second. ``fraction`` is in [0, 1] or None,
    ``message`` a str or None, ``data`` a JSON object (the call's keywords), ``at`` when the
    run reported it (the app's clock). Not a checkpoint: a run executed again after a crash
    keeps the value its last execution wrote until it reports a new one."""

    fraction: float | None
    message: str | None
    data: dict[str, JSON]
    at: float

    def to_json(self) -> dict[str, JSON]:
        """The value as a store keeps it (``at`` apart): ``{"fraction", "message", "data"}``."""
        return {"fraction": self.fraction, "message": self.message, "data": self.data}

    @classmethod
    def from_json(cls, value: JSON, at: float) -> Progress:
        """The value :meth:`to_json` made, reported at ``at``."""
        return cls(value.get("fraction"), value.get("message"), value.get("data") or {}, at)


@dataclass(frozen=True)
class QueueDepth:
    """One tenant's queued runs: ``due`` (due now: a worker may take them), ``delayed`` (due
    later: a delay, a retry's backoff) and ``held`` (parked by admission control)."""

    due: int = 0
    delayed: int = 0
    held: int = 0

    @property
    def total(self) -> int:
        return self.due + self.delayed + self.held


# The rules that can hold back a due queued run, in the order a run is counted under the first
# that holds it (a run held by several is counted once), with what the console says of a run
# each one holds back. ``paused``: its workflow or tenant is paused; ``max_running``: its
# workflow has max_running runs in ``running``; ``max_running_per_tenant``: its tenant has;
# ``rate_limit``: the window of its workflow's rate is full (first starts only);
# ``concurrency_limit``: its concurrency key has concurrency_limit holders (first starts only).
HOLD_REASONS = {
    "paused": "paused",
    "max_running": "waiting for a max_running share",
    "max_running_per_tenant": "waiting for a max_running_per_tenant share",
    "rate_limit": "rate limited until the window allows",
    "concurrency_limit": "waiting for a slot of its concurrency key",
}
# each count of held-back runs stops here (a console refresh reads no more of a long backlog)
HELD_BACK_CAP = 10_000


@dataclass(frozen=True)
class Stats:
    """A namespace's runs as one read of the store saw them at ``at`` (the app's clock).

    ``by_status``: runs per status, every status present (0 when none); final runs count until
    retention prunes them. ``by_workflow``: workflow -> status -> runs, only statuses with some.
    ``queued``: per tenant with queued runs, its :class:`QueueDepth`. ``oldest_due_age``: seconds
    since the run that has waited longest for a worker became due (queued, or sleeping or
    waiting past its time; not held), None when no run is due. ``finished_last_minute``: per
    final status, the runs that ended in the last minute: those whose ``finished_at`` is at
    least ``floor(at) - 59`` (whole seconds of the clock). ``pending_pauses``: approvals waiting
    for a decision; ``outbox_backlog``: outbox entries still to deliver (not delivered, not
    dead); ``dead_letters``: outbox entries dead-lettered (until pruned with their run).
    ``held_back``: workflow -> rule (a key of :data:`HOLD_REASONS`) -> due queued runs that
    rule holds back now, each counted under the first rule that holds it and each count at
    most :data:`HELD_BACK_CAP`; only rules holding some. ``paused``: the namespace's paused
    workflows (``app.paused_workflows()``)."""

    namespace: str
    at: float
    by_status: dict[str, int]
    by_workflow: dict[str, dict[str, int]]
    queued: dict[str, QueueDepth]
    oldest_due_age: float | None
    finished_last_minute: dict[str, int]
    pending_pauses: int
    outbox_backlog: int
    dead_letters: int
    held_back: dict[str, dict[str, int]] = field(default_factory=dict)
    paused: tuple[PausedWorkflow, ...] = ()

    @property
    def live(self) -> int:
        """Runs that have not ended: queued, running, sleeping, waiting or interrupted."""
        return sum(n for s, n in self.by_status.items() if s not in FINAL_STATUSES)

    @property
    def executing(self) -> int:
        """Runs an instance is executing now (``running``)."""
        return self.by_status.get(RunStatus.RUNNING, 0)

    @property
    def finished(self) -> int:
        """Runs in a final status that retention has not pruned yet."""
        return sum(n for s, n in self.by_status.items() if s in FINAL_STATUSES)


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
class PausedWorkflow:
    """A workflow paused in a namespace: no run of it starts (for ``tenant`` only, or for every
    tenant when ``tenant`` is None) until it is resumed; paused since ``paused_at``."""

    workflow: str
    tenant: str | None
    paused_at: float


@dataclass(frozen=True)
class Rate:
    """``@app.workflow(rate_limit=shoal.Rate(limit, per=seconds, key=None))``: at most ``limit``
    first starts of the workflow in any window of ``per`` seconds, across every replica; per
    key when ``key`` is a function of the input giving a str (or None: the run counts with the
    runs that have no key). A run over the limit stays queued until the window allows it."""

    limit: int
    per: float
    key: Callable[[Any], str | None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # (checked here without shoal._checks: this module imports nothing of shoal)
        limit, per = self.limit, self.per
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"shoal.Rate(limit) must be an int between 1 and 2147483647 "
                            f"(first starts per window), not {limit!r:.80}.")
        if not 1 <= limit <= 2**31 - 1:
            raise ValueError(f"shoal.Rate(limit) must be an int between 1 and 2147483647 "
                             f"(first starts per window), not {limit!r}.")
        if isinstance(per, bool) or not isinstance(per, (int, float)):
            raise TypeError(f"shoal.Rate(per) must be a finite number of seconds > 0 (the "
                            f"window), not {per!r:.80}.")
        if not (per > 0 and per != float("inf")):
            raise ValueError(f"shoal.Rate(per) must be a finite number of seconds > 0 (the "
                             f"window), not {per!r}.")
        object.__setattr__(self, "per", float(per))
        if self.key is not None and not callable(self.key):
            raise TypeError(f"shoal.Rate(key) must be None or a function of the input giving "
                            f"a str, not {self.key!r:.80}.")


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """What a claim enforces for one workflow beyond its concurrency key (``claim_runs(flow=)``,
    from the workflow's options): at most ``max_running`` of its runs in ``running`` at once,
    and ``max_running_per_tenant`` of one tenant's; at most ``rate_limit`` first starts in any
    window of ``rate_per`` seconds, per rate key (``NewRun.rate_key``); and with
    ``fairness="tenant"``, tenants with due runs of one priority take turns, weighted by
    ``set_tenant_weight``."""

    max_running: int | None = None
    max_running_per_tenant: int | None = None
    rate_limit: int | None = None
    rate_per: float | None = None
    fairness: str | None = None


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
    # the trace context to store with the run (``Run.trace_context``)
    trace_context: str | None = None
    # the key its workflow's rate_limit counts its first start under (``Rate.key`` of the
    # input; '': with the runs that have none; None: its workflow has no rate, so a store need
    # not index it, and a claim with a rate counts it under ''). Kept by the store, not a field
    # of Run.
    rate_key: str | None = None
    # the JSON text of ``input`` (as ``shoal._json.dumps`` writes it) when the caller has it
    # already (the app does: it checks each input by encoding it); a store that keeps text uses
    # it rather than encoding ``input`` again
    input_json: str | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Fence:
    """The claim a write is conditional on: the run is ``running`` under this owner and epoch."""

    run_id: str
    owner: str
    epoch: int


@dataclass(frozen=True)
class Step:
    """A checkpoint at position ``seq`` of a run. ``finished`` False: a sleep or wait in progress,
    whose ``output`` holds what it waits for (``{"until": t}`` or ``{"deadline": t}``).
    ``started_at``: when its function began on the app's clock (the first try of a step retried
    in place; when the run first reached a sleep, wait, approval or child wait); ``attempt``: the
    run's attempt that executed it; ``retries``: the in-place retries it took. None where
    unknown (written by older code)."""

    seq: int
    name: str
    output: JSON
    finished: bool
    epoch: int
    started_at: float | None = None
    attempt: int | None = None
    retries: int | None = None


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
    # the trace context of the step that sent it (the W3C propagator's carrier as JSON), which
    # its deliveries' spans continue; None when that step was not traced
    trace_context: str | None = field(default=None, repr=False)

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


# -- coordination: locks and membership ----------------------------------------------------


@dataclass(frozen=True)
class LockGrant:
    """The caller now holds every key of its request until ``expires_at`` (unless renewed)."""

    token: int
    expires_at: float


@dataclass(frozen=True)
class LockWait:
    """The caller is queued (its waiter row lives until ``now + lease``). ``ticket`` is its place.
    ``retry_at`` is when to ask again even if no wake-up comes: the earliest end, among its keys,
    of the lease of the live holder and of the lease of the live waiter right ahead of it, if any
    (``now + lease`` if there is neither). The holder's end counts for every waiter, not only the
    first: a waiter ahead that gives up while a dead holder's row is still there wakes nobody
    (a release cannot tell that the lease ended), so the waiters behind must not depend on it."""

    ticket: int
    retry_at: float


@dataclass(frozen=True)
class MemberView:
    """What a heartbeat sees: the roster (sorted member ids), its generation, and whether the
    caller now holds that generation (the store has recorded it as held by the caller)."""

    generation: int
    members: tuple[str, ...]
    granted: bool


# -- rate limits, breakers and budgets (a model provider's limits shared by every replica) -------


@dataclass(frozen=True)
class SlotGrant:
    """The caller holds one of the key's slots until ``expires_at`` (unless renewed)."""

    expires_at: float


@dataclass(frozen=True)
class SlotBusy:
    """Every slot is held; ``retry_at`` is when the first of them ends by itself."""

    retry_at: float


@dataclass(frozen=True)
class WindowResult:
    """``added``: the amount was counted. ``total``: the window's total after the call.
    ``retry_at`` (when refused): the earliest time the amount would fit, as old entries leave."""

    added: bool
    total: float
    retry_at: float | None = None


@dataclass(frozen=True)
class SlotNeed:
    """Admission needs one of ``key``'s slots (at most ``max_slots`` live holders), held until
    ``now + lease``, as :meth:`RateStore.slot_acquire` gives it."""

    key: str
    max_slots: int
    lease: float


@dataclass(frozen=True)
class PauseNeed:
    """Admission needs ``key`` not paused at ``now`` (see :meth:`RateStore.paused_until`)."""

    key: str


@dataclass(frozen=True)
class WindowNeed:
    """Admission needs room for ``amount`` (> 0) in the window ``key`` of ``window`` seconds
    under ``limit``, counted at ``now``, as :meth:`RateStore.window_add` counts it."""

    key: str
    amount: float
    window: float
    limit: float | None


@dataclass(frozen=True)
class CircuitNeed:
    """Admission needs a breaker's circuit to let the call go: the pause ``open`` (the cooldown
    after an opening) not in force, and, while the circuit is tripped (counter ``opened`` above
    counter ``closed``), the one place of the trial slot ``trial``, held until ``now + lease``."""

    open: str
    opened: str
    closed: str
    trial: str
    lease: float


Need = SlotNeed | PauseNeed | WindowNeed | CircuitNeed


@dataclass(frozen=True)
class Admitted:
    """Every need was met: the slots are held until ``now + lease``, the window amounts were
    counted at ``now``. ``trial``: the circuit was tripped and the caller holds its trial slot,
    for the opening ``trial`` (the ``opened`` counter's value); None when the circuit was closed
    (or no circuit was asked about)."""

    trial: float | None = None


@dataclass(frozen=True)
class Refused:
    """Need ``part`` (its index in the request) was not met, and nothing was taken. ``retry_at``:
    when it may be met: the first slot's end, the pause's end, when the window has room (None
    if the amount can never fit), the circuit's cooldown end (None while a trial call holds
    the trial slot)."""

    part: int
    retry_at: float | None


@dataclass(frozen=True)
class CounterResult:
    """``added``: every amount was counted (all or nothing). ``totals``: per position, the
    counter after that position's amount (a key named twice shows both steps); when refused,
    each counter as it was. ``over``: the position that would have passed its limit."""

    added: bool
    totals: list[float]
    over: int | None = None


@dataclass(frozen=True)
class SpendEntry:
    """One row of the cost ledger: who spent what, where, when (``at``: the app's clock).

    ``id`` is given by the store when the row is written (None on an entry not written yet):
    strictly increasing within a namespace, in the order rows become visible to readers, never
    reused, so ``ledger(after=rows[-1].id)`` reads on without a gap or a repeat. ``provider``
    and ``tokens``: the provider a priced call went through and the tokens it reported using
    (``call.used(tokens=…)``); None for other spending."""

    tenant: str
    run_id: str | None
    root_id: str | None
    amount: float
    currency: str
    at: float
    id: int | None = None
    provider: str | None = None
    tokens: int | None = None


# -- what a console reads (shoal.ports.RunInspection) ------------------------------------------


@dataclass(frozen=True)
class RunFilter:
    """Which runs :meth:`~shoal.ports.RunInspection.search_runs` returns: a run matches when
    it matches every field given (None: any). ``created_from <= created_at < created_to``."""

    status: str | None = None
    workflow: str | None = None
    tenant: str | None = None
    created_from: float | None = None
    created_to: float | None = None
    idempotency_key: str | None = None
    concurrency_key: str | None = None

    def matches(self, run: Run) -> bool:
        """Whether ``run`` matches every field given (the namespace is the caller's)."""
        return ((self.status is None or run.status.value == self.status)
                and (self.workflow is None or run.workflow == self.workflow)
                and (self.tenant is None or run.tenant == self.tenant)
                and (self.created_from is None or run.created_at >= self.created_from)
                and (self.created_to is None or run.created_at < self.created_to)
                and (self.idempotency_key is None
                     or run.idempotency_key == self.idempotency_key)
                and (self.concurrency_key is None
                     or run.concurrency_key == self.concurrency_key))


@dataclass(frozen=True)
class RunOwner:
    """An instance that holds running runs: how many, and the latest end of their leases."""

    owner: str
    running: int
    lease_until: float | None


@dataclass(frozen=True)
class StepRecord:
    """A checkpoint as the store keeps it, with ``finished_at``: when it was written finished
    (None while a sleep or wait is in progress), and ``started_at``, ``attempt`` and ``retries``
    as its ``Step`` had them (None for rows older code wrote). A step still costs one write, at
    its end: its start travels with it."""

    seq: int
    name: str
    output: JSON
    finished: bool
    epoch: int
    finished_at: float | None
    started_at: float | None = None
    attempt: int | None = None
    retries: int | None = None


@dataclass(frozen=True)
class SignalRecord:
    """A signal sent to a run: kept until a ``wait_for`` consumes it (then ``consumed``)."""

    id: str
    name: str
    payload: JSON
    created_at: float
    consumed: bool


@dataclass(frozen=True)
class RunRecord:
    """Everything the store keeps about one run, as one read saw it: the run, its steps in seq
    order, its signals (oldest first), its pauses (pending and resolved ones not yet pruned,
    oldest first), its outbox entries (by step, then index) and its tree: the runs sharing its
    root (the root first, then by id), at most the limit asked for."""

    run: Run
    steps: tuple[StepRecord, ...]
    signals: tuple[SignalRecord, ...]
    pauses: tuple[Pause, ...]
    outbox: tuple[OutboxEntry, ...]
    tree: tuple[Run, ...]


# -- what a console reads of coordination and rate limits (read-only) ------------------------


@dataclass(frozen=True)
class MemberState:
    """A live member of a namespace's membership (``expires_at > now``): ``member`` is the id
    it heartbeats with (``shoal.coord.membership`` uses ``"<instance_id>/<random>"``),
    ``held`` the generation it acts on (None: none), ``beat_at`` the ``now`` of its latest
    heartbeat and ``version`` the code version it gave then (both None in a row written by a
    shoal older than schema version 17, or by a store that does not keep them)."""

    member: str
    joined_at: float
    expires_at: float
    held: int | None
    beat_at: float | None = None
    version: str | None = None


@dataclass(frozen=True)
class LockWaiter:
    """A live waiter of a lock key (its row's ``expires_at > now``), with its ticket (its place:
    the smallest ticket is next)."""

    holder: str
    ticket: int
    expires_at: float


@dataclass(frozen=True)
class LockState:
    """A lock key with a live holder or a live waiter. ``token`` is the key's last fencing
    token (the holder's, while one holds it); ``holder`` and ``expires_at`` are None while the
    key is free (its waiters are between a release and the next grant); ``waiters`` are in
    ticket order."""

    key: str
    token: int
    holder: str | None
    expires_at: float | None
    waiters: tuple[LockWaiter, ...] = ()


@dataclass(frozen=True)
class MeterState:
    """A meter whose debt is above 0 at the view's ``now``: ``debt`` (milliseconds) as the
    next ``meter`` call at that time would start from, and when it was last charged."""

    key: str
    debt: float
    updated_at: float


@dataclass(frozen=True)
class CoordinationView:
    """What :meth:`~shoal.ports.CoordStore.coordination_view` reads of a namespace at ``at``:
    the stored roster and its generation (as the latest heartbeat left them), the live members
    (by id), the locks held or waited for and the meters in debt (by key). ``complete`` is
    False when a list was cut at the read's limit, or when the store could not look at every
    key (see the store's docstring)."""

    namespace: str
    at: float
    generation: int
    roster: tuple[str, ...]
    members: tuple[MemberState, ...]
    locks: tuple[LockState, ...]
    meters: tuple[MeterState, ...]
    complete: bool = True


@dataclass(frozen=True)
class RateView:
    """What :meth:`~shoal.ports.RateStore.read_rates` reads at one time, per key asked:
    ``slots`` the live holders of each slot key, ``windows`` each window's total over its
    last ``window`` seconds, ``pauses`` the end of each pause in force (None: not paused),
    ``counters`` each counter's total (0 for one never counted)."""

    slots: dict[str, int]
    windows: dict[str, float]
    pauses: dict[str, float | None]
    counters: dict[str, float]


# -- LangGraph checkpoints (shoal.ports.GraphCheckpoints) ----------------------------------------


@dataclass(frozen=True)
class GraphWrite:
    """A pending write of a LangGraph task: ``(task_id, idx)`` names it within its checkpoint
    (``idx`` < 0 for LangGraph's special channels: error, interrupt, resume, scheduled);
    ``type`` and ``value`` are the serializer's output, ``task_path`` orders it (LangGraph's
    ``writes_sort_key``)."""

    task_id: str
    idx: int
    channel: str
    type: str
    value: bytes
    task_path: str = ""


@dataclass(frozen=True)
class GraphCheckpoint:
    """One LangGraph checkpoint of a thread, kept by a store for ``ShoalCheckpointer``: the
    serialized checkpoint (``type``, ``checkpoint``: the serializer's output, channel values
    included), its ``metadata`` (a JSON object, filtered by ``list``), its parent's id, the
    LangGraph ``run_id`` of the metadata (``delete_for_runs``) and when it was written (the
    app's clock). ``writes`` are its pending writes when read, in ``(task_path, task_id, idx)``
    order."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    type: str
    checkpoint: bytes
    metadata: dict[str, JSON]
    run_id: str | None = None
    created_at: float = 0.0
    writes: tuple[GraphWrite, ...] = ()
