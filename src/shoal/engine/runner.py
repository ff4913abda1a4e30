"""The engine: local slots, the scheduling pass, the poll (renew, recover, schedule), executions
with replay, and the graceful stop. It speaks to the store only through the Store protocol."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from shoal import _json
from shoal._tasks import cancel_and_wait, first_of, report
from shoal.clock import DRIFT_MARGIN, Clock
from shoal.engine import values
from shoal.engine.completer import Completer
from shoal.engine.context import (
    Execution,
    RunContext,
    StoreWriteFailed,
    Suspended,
    format_traceback,
)
from shoal.engine.cron import CronTrigger
from shoal.engine.execstate import AbortWhy, ExecState
from shoal.engine.values import WorkflowTypes
from shoal.errors import BudgetExceededError, LeaseLostError, NonDeterminismError
from shoal.ports import Store
from shoal.scope import RunScope, current_run, outside_run
from shoal.telemetry import NOTHING, Telemetry
from shoal.types import Fence, FlowLimits, Pause, Rate, Run, RunStatus, Settlement

log = logging.getLogger("shoal")



def _fields(run: Run, event: str, **more: Any) -> dict[str, Any]:
    """The ``extra`` of a log record about ``run``: its event name and the run's fields."""
    return {"event": event, "run_id": run.id, "workflow": run.workflow, "tenant": run.tenant,
            **more}


async def _ended(x: Execution) -> None:
    """Wait until the execution ``x`` and any step thread it left behind have ended."""
    alive = {work for work in (x.task, *x.threads) if work is not None and not work.done()}
    if alive:
        await asyncio.wait(alive)


def _raised_by_code() -> bool:
    """The CancelledError being handled was raised by the workflow itself, not a cancel of
    its task from outside."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


WorkflowFn = Callable[[RunContext, Any], Awaitable[Any]]
ErrorHandler = Callable[[BaseException], Any]
PauseHandler = Callable[[Pause], Any]
@dataclass(frozen=True)
class OutboxHandlerSpec:
    """An ``@app.outbox_handler``: ``fn(payload, key)``, tried ``max_deliveries`` times."""

    fn: Callable[[Any, str], Any]
    max_deliveries: int


ChildDispatcher = Callable[[Run, Any, Any, str, dict[str, Any]], Awaitable[Run]]


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkflowOptions:
    """The options of one ``@app.workflow(...)``, as the decorator's keywords give them
    (validated by the app: :func:`shoal.app.options.check_workflow_options`). A new workflow
    option is a field here, its check there, and a keyword of the decorator; :meth:`stored`
    says what of it another process needs to dispatch the workflow by name."""

    max_attempts: int = 3
    priority: int = 0
    concurrency_key: str | Callable[[Any], str | None] | None = None
    backoff: float = 1.0
    max_backoff: float = 300.0
    on_incompatible: str = "wait"
    concurrency_limit: int = 1
    max_running: int | None = None
    max_running_per_tenant: int | None = None
    rate_limit: Rate | None = None
    fairness: str | None = None

    def flow(self) -> FlowLimits | None:
        """What the claim enforces for this workflow beyond its concurrency key; None when
        nothing (the claim of such a workflow is the plain one)."""
        rate = self.rate_limit
        if (self.max_running is None and self.max_running_per_tenant is None and rate is None
                and self.fairness is None):
            return None
        return FlowLimits(max_running=self.max_running,
                          max_running_per_tenant=self.max_running_per_tenant,
                          rate_limit=None if rate is None else rate.limit,
                          rate_per=None if rate is None else rate.per,
                          fairness=self.fairness)

    def stored(self) -> dict[str, Any]:
        """What another process needs to dispatch this workflow by name, and to say which of
        its flow-control rules holds a run back (the console, ``shoal stats``): kept in the
        store."""
        key, rate = self.concurrency_key, self.rate_limit
        return {
            "max_attempts": self.max_attempts,
            "priority": self.priority,
            "concurrency_key": key if isinstance(key, str) else None,
            "key_from_input": callable(key),
            "concurrency_limit": self.concurrency_limit,
            "max_running": self.max_running,
            "max_running_per_tenant": self.max_running_per_tenant,
            "rate_limit": None if rate is None else {"limit": rate.limit, "per": rate.per},
            "fairness": self.fairness,
        }


@dataclass(frozen=True)
class WorkflowSpec:
    """What the engine needs to know of a registered workflow: its name, its function and
    its options, whole."""

    name: str
    fn: WorkflowFn
    options: WorkflowOptions = field(default_factory=WorkflowOptions)
    # the codecs of its input and output (pydantic models, dataclasses), from fn's annotations
    types: WorkflowTypes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "types", WorkflowTypes(self.fn))


def typed_input(spec: WorkflowSpec, run: Run) -> Any:
    """The run's input as its workflow function takes it: a copy of the JSON to change as it
    likes, or the model or dataclass its ``input`` annotation names (``ValueError`` naming the
    field when the JSON is not one)."""
    codec = spec.types.input
    if codec is None:
        value = run.input
        # the workflow's own copy to change
        return _json.clone(value) if isinstance(value, (dict, list)) else value
    return codec.load(run.input, f"the input of run {run.id} of workflow {spec.name!r}")


def typed_output(spec: WorkflowSpec, output: Any, max_bytes: int | None) -> Any:
    """What the workflow returned as the JSON its run keeps (see :mod:`.values`)."""
    what = f"the output of workflow {spec.name!r}"
    output = values.dump(spec.types.output, output, what,
                         f"the return type of workflow function {spec.name!r}")
    return _json.checked(output, what, max_bytes)


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """The app's options an engine runs by, built once by the app from its own validated
    configuration (:meth:`shoal.app.options.AppConfig.engine`) and passed whole."""

    namespace: str
    instance_id: str
    slots: int                      # runs executed here at once (max_concurrent_runs)
    lease: float
    heartbeat: float | None = None  # between renewal passes; None: lease / 3
    version: str | None = None      # stamped on the runs; claims take runs of this version
    max_payload_bytes: int = _json.MAX_PAYLOAD_BYTES


@dataclass
class Registry:
    """What the app registered: its workflows, handlers and cron triggers. The engine reads
    the app's own collections, so a handler registered later is seen too."""

    workflows: dict[str, WorkflowSpec] = field(default_factory=dict)
    outbox_handlers: dict[str, OutboxHandlerSpec] = field(default_factory=dict)
    on_pause_notify: list[PauseHandler] = field(default_factory=list)
    on_error: list[ErrorHandler] = field(default_factory=list)
    observers: list[Any] = field(default_factory=list)
    crons: dict[str, CronTrigger] = field(default_factory=dict)

    def any_version(self) -> list[str]:
        """The workflows whose started runs any code version may continue."""
        return [name for name, spec in self.workflows.items()
                if spec.options.on_incompatible == "resume"]

    def concurrency_limits(self) -> dict[str, int]:
        """The workflows whose runs of one concurrency key may run more than one at once, with
        how many (a workflow left out allows one)."""
        return {name: spec.options.concurrency_limit for name, spec in self.workflows.items()
                if spec.options.concurrency_limit > 1}

    def flow_limits(self) -> dict[str, FlowLimits]:
        """The workflows whose claims enforce more than their concurrency key (``max_running``,
        ``max_running_per_tenant``, ``rate_limit``, ``fairness``), with what."""
        return {name: flow for name, spec in self.workflows.items()
                if (flow := spec.options.flow()) is not None}


class EngineHost(Protocol):
    """What the engine asks of the app that owns it: dispatching a child run (the app's
    dispatch path), charging a budget (its ledger), and waking the maintenance services that
    deliver what a run just wrote."""

    async def dispatch_child(self, parent: Run, workflow: Any, input: Any, key: str,
                             options: dict[str, Any]) -> Run:
        """Dispatch a run in ``parent``'s tree, idempotently under ``key``."""

    async def spend(self, scope: RunScope, amount: float, currency: str) -> None:
        """Charge a run's budgets and write the ledger row."""

    def outbox_written(self) -> None:
        """A step here just wrote outbox entries: deliver them now, not at the next poll."""

    def pause_created(self) -> None:
        """A pause was just made here: announce it now rather than at the next poll."""


class Engine:
    """Executes the runs this instance claims, at most ``config.slots`` at once. It is the
    :class:`~shoal.engine.context.RunHost` of every run it executes."""

    def __init__(self, store: Store, clock: Clock, config: EngineConfig, registry: Registry,
                 host: EngineHost, telemetry: Telemetry = NOTHING) -> None:
        self.store = store
        self.telemetry = telemetry
        self.clock = clock
        self.config = config
        self.registry = registry
        self._host = host
        self.namespace = config.namespace
        self.instance_id = config.instance_id
        self.lease = config.lease
        self.max_payload_bytes = config.max_payload_bytes
        self.poll_interval = config.lease / 3
        # renewals keep a schedule of their own: nothing else the engine does waits in front
        self.heartbeat = config.heartbeat if config.heartbeat is not None else config.lease / 3
        self.workflows = registry.workflows
        self._local: dict[str, Execution] = {}   # the newest execution of each run here
        # every execution still alive here (its task, or a step's thread it left behind), by run
        # id: each holds a slot, and a new claim of a run finds an earlier execution of it at
        # once, so a run is never executed twice at once in this process
        self._alive: dict[str, list[Execution]] = {}
        self._accepting = False
        self._kicked = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []
        self._timers: set[asyncio.Task[None]] = set()
        self._settle_waiters: list[asyncio.Future[None]] = []   # wait_settled() calls
        self._closing = False
        self.claim_lock = asyncio.Lock()   # one claim at a time: passes and settlement batches
        # writes the settlements of the executions ending here, in batches with claims
        self._completer = Completer(self, clock)
        self.last_beat_at: float | None = None   # the last renewal pass that came back
        self.started_at = clock.now()
        # the lease watchdog: asleep until the earliest end of a lease held here (less the
        # drift margin), woken when an execution starts that ends sooner
        self.drift_margin = config.lease * DRIFT_MARGIN
        self._lease_due: float | None = None
        self._lease_wake = asyncio.Event()
        self._watchdog: asyncio.Task[None] | None = None
        self._launched = asyncio.Event()   # wakes a heartbeat that had nothing to renew
        self._nothing_to_renew = False     # the heartbeat waits for a run to start here

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.started_at = self.clock.now()
        self._accepting = True
        for coro in (self._schedule_loop(), self._watch_loop()):
            self._background.append(asyncio.create_task(coro))
        self._watchdog = asyncio.create_task(self._lease_watchdog(), name="shoal-lease-watchdog")

    async def close(self, timeout: float) -> None:
        """Stop claiming, wait up to ``timeout`` for local runs, then interrupt the rest: each
        releases its claim at once (``interrupted``) for another instance's next poll. The
        heartbeat (a maintenance service) goes on renewing the runs still draining; the caller
        stops it after this returns."""
        self._accepting = False
        self._closing = True
        background, self._background = self._background, []
        for task in background:
            await cancel_and_wait(task)
        async with self.claim_lock:
            pass   # a pass already inside claim_runs launches what it got: count those too
        tasks = [x.task for x in self._executions if x.task is not None]
        if tasks:
            waiter = asyncio.ensure_future(asyncio.wait(tasks))
            deadline = asyncio.ensure_future(self.clock.sleep(timeout))
            await asyncio.wait({waiter, deadline}, return_when=asyncio.FIRST_COMPLETED)
            deadline.cancel()
            waiter.cancel()
        for x in list(self._executions):
            # one already writing its end is let finish (_abort does not cancel it); should
            # that write not end the claim, the run stops there (Execution.going_on)
            self._abort(x, "interrupt", asyncio.CancelledError("the instance is stopping"))
        remaining = [x.task for x in self._executions if x.task is not None]
        if remaining:
            await asyncio.wait(remaining)
        for task in list(self._timers):
            await cancel_and_wait(task)
        self._timers.clear()
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            await cancel_and_wait(watchdog)

    def kick(self) -> None:
        """Ask for a scheduling pass soon."""
        self._kicked.set()

    @property
    def _executions(self) -> list[Execution]:
        """Every execution alive here."""
        return [x for xs in self._alive.values() for x in xs]

    def executing(self) -> list[Execution]:
        """The newest execution of each run here (for a metrics scrape)."""
        return list(self._local.values())

    @property
    def running(self) -> int:
        """Executions alive here, each holding a slot (a step's thread left running counts)."""
        return sum(map(len, self._alive.values()))

    async def wait_settled(self, timeout: float) -> None:
        """Return when a local run settles, or after ``timeout`` real seconds."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._settle_waiters.append(waiter)
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()
            with contextlib.suppress(ValueError):
                self._settle_waiters.remove(waiter)

    def _wake_settle_waiters(self) -> None:
        waiters, self._settle_waiters = self._settle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- loops -----------------------------------------------------------------------------

    async def start_child(self, parent: Run, workflow: Any, input: Any, key: str,
                          options: dict[str, Any]) -> Run:
        """Dispatch a run in ``parent``'s tree, idempotently under ``key``."""
        return await self._host.dispatch_child(parent, workflow, input, key, options)

    async def spend(self, ctx: RunContext, amount: float, currency: str) -> None:
        """Charge ``amount`` to the run's budgets and the ledger."""
        await self._host.spend(ctx, amount, currency)

    def outbox_written(self) -> None:
        """A step just wrote outbox entries here: deliver them now, not at the next poll."""
        self._host.outbox_written()

    def pause_created(self) -> None:
        """A pause was just made here: announce it now rather than at the next poll."""
        self._host.pause_created()

    async def _observe(self, event: str, *args: Any) -> None:
        for observer in list(self.registry.observers):
            method = getattr(observer, event, None)
            if method is None:
                continue
            try:
                result = method(*args)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("observer %r raised in %s", observer, event)

    async def _schedule_loop(self) -> None:
        while not self._closing:
            await self._kicked.wait()
            self._kicked.clear()
            try:
                await self.schedule_pass()
            except Exception as e:
                log.warning("schedule.failed: %s", e, extra={"event": "schedule.failed"})
                await self._report(e)

    async def _watch_loop(self) -> None:
        while not self._closing:
            try:
                await self.store.wait_for_work(1.0)
            except Exception as e:
                log.debug("watch.failed: %s", e)
                await asyncio.sleep(1.0)
            if self._accepting and self._free_slots() > 0:
                self.kick()

    async def schedule_pass(self) -> None:
        """Claim due runs for the free slots now (a maintenance service asks for one with
        :meth:`kick`; ``app.poll`` runs one inline)."""
        async with self.claim_lock:   # two passes at once would claim past the free slots
            await self._claim_free_slots()

    def _renewals_stalled(self) -> bool:
        """A renewal pass is overdue (the store does not answer it, or this process was
        frozen): runs claimed now could not be kept either."""
        if self._nothing_to_renew:
            return False
        last = self.last_beat_at if self.last_beat_at is not None else self.started_at
        return self.clock.now() - last > 2 * self.heartbeat

    @property
    def free_slots(self) -> int:
        """Slots free for a claim now (never below 0): what a metrics scrape reads."""
        return max(0, self._free_slots())

    def _free_slots(self) -> int:
        """Slots no execution holds: an execution holds its slot until its settlement is
        written (or is being written with the claim that takes the slot), and as long as a step
        thread of it runs."""
        busy = 0
        for x in self._executions:
            if not x.slot_free or (x.threads and any(not t.done() for t in x.threads)):
                busy += 1
        return self.config.slots - busy

    async def _claim_free_slots(self) -> None:
        while self._accepting and not self._renewals_stalled():
            free = self._free_slots()
            if free <= 0:
                return
            sent = self.clock.now()
            runs = await self.store.claim_runs(
                self.namespace, list(self.workflows), self.instance_id, free, self.lease, sent,
                version=self.config.version, any_version=self.registry.any_version(),
                concurrency_limits=self.registry.concurrency_limits(),
                flow=self.registry.flow_limits() or None)
            for run in runs:
                self._launch(run, sent)
            if len(runs) < free:
                return

    async def renew(self) -> None:
        """A renewal pass (the heartbeat's): extend the lease of each run executing here; a run
        whose lease was lost is aborted here, one asked to cancel is cancelled."""
        try:
            await self._renew()
        finally:
            self.last_beat_at = self.clock.now()

    async def until_renewing(self) -> None:
        """Wait until a run executes here (at once if one does). Meanwhile no renewal pass is
        due, so none is overdue: claims are not refused for one (:meth:`_renewals_stalled`)."""
        while not self._local:
            self._launched.clear()
            self._nothing_to_renew = True
            try:
                await self._launched.wait()
            finally:
                self._nothing_to_renew = False
                self.last_beat_at = self.clock.now()

    async def _renew(self) -> None:
        # an execution stopping (interrupted, cancelled) keeps its lease while it winds down
        asked = [x for x in self._local.values() if x.aborted != "lost" and not x.ending]
        if not asked:
            return
        leases = {x.run.id: x.fence.epoch for x in asked}
        sent = self.clock.now()
        renewal = await self.store.renew_leases(self.instance_id, leases, self.lease, sent)
        for x in asked:
            run_id = x.run.id
            # the answer is about the execution asked for, not a newer claim of the same run
            if self._local.get(run_id) is not x or x.aborted is not None or x.ending:
                continue
            if run_id in renewal.renewed:
                x.extend_lease(sent + self.lease)
            if run_id not in renewal.renewed:
                self._abort(x, "lost", LeaseLostError(run_id, self.instance_id))
            elif run_id in renewal.cancel_requested:
                self._abort(x, "cancel", asyncio.CancelledError("the run was cancelled"))

    def cancel_local(self, run_id: str) -> None:
        """After a cancel was requested: abort at once the run's local execution, and those of
        its tree when it is a root."""
        for x in list(self._local.values()):
            if x.run.id == run_id or x.run.root_id == run_id:
                self._abort(x, "cancel", asyncio.CancelledError("the run was cancelled"))

    def _abort(self, x: Execution, why: AbortWhy, reason: BaseException) -> None:
        # A run already writing its end (settle, suspend, release) is let finish: the write is
        # fenced, and a cancel requested meanwhile is seen by the next renewal or claim.
        if x.abort(why, reason) and x.task is not None:
            x.task.cancel()

    # -- executions ------------------------------------------------------------------------

    def _leave(self, x: Execution) -> None:
        """Forget the execution ``x``, but never a newer one of the same run."""
        if self._local.get(x.run.id) is x:
            del self._local[x.run.id]

    def _launch(self, run: Run, claimed_at: float) -> None:
        """Start executing ``run``, claimed here at ``claimed_at`` for a lease."""
        self.telemetry.run_claimed(run, claimed_at)
        x = Execution(run=run, fence=Fence(run.id, self.instance_id, run.lease_epoch),
                      held_until=claimed_at + self.lease)
        # An earlier execution of this run may still be alive here (its lease ran out while it
        # wound down, or a step's thread outlived it): it is aborted, and awaited before the
        # new one starts, so this process never runs the run twice at once.
        alive = self._alive.get(run.id)
        earlier = list(alive) if alive else []
        for e in earlier:
            self._abort(e, "lost", LeaseLostError(run.id, self.instance_id))
        self._local[run.id] = x
        if alive is None:
            self._alive[run.id] = [x]
        else:
            alive.append(x)
        x.task = asyncio.create_task(self._execute(x, earlier), name=f"shoal-run-{run.id}")
        x.task.add_done_callback(lambda _: self._retire(x))
        if self._lease_due is None or x.held_until - self.drift_margin < self._lease_due:
            self._lease_wake.set()
        self._launched.set()

    async def _lease_watchdog(self) -> None:
        """Abort, locally, every execution whose lease ends (less :data:`DRIFT_MARGIN` of it)
        without a renewal or checkpoint confirmed meanwhile, whatever the store is doing: one
        that does not answer (a partition) must not let a run go on here once another instance
        may have taken it over (DESIGN invariant 11). Its ``ctx.signal`` is aborted with a
        LeaseLostError and its task cancelled; a step's thread sees the signal."""
        while True:
            now = self.clock.now()
            due = self._abort_expired(now)
            self._lease_due = due
            self._lease_wake.clear()
            if due is None:
                await self._lease_wake.wait()
            else:
                await first_of(self._lease_wake.wait(), self.clock, due - now)

    def _abort_expired(self, now: float) -> float | None:
        """Abort the executions whose lease ends by ``now`` (less the margin); the earliest end
        of the others. (A method: the watchdog's frame keeps no execution while it sleeps.)"""
        due: float | None = None
        for x in list(self._local.values()):
            if x.aborted is not None or x.replay_only:
                continue
            end = x.held_until - self.drift_margin
            if x.ending:
                # its end (a settle, a sleep, a wait) is being written, fenced: not aborted, but
                # looked at again soon, for the write may not end the claim (going_on)
                end = max(end, now + self.drift_margin / 4)
            elif end <= now:
                log.warning("lease.expired: run %s: no renewal confirmed before its lease ends "
                            "(less the drift margin of %g s): aborted here, before another "
                            "instance may take it over", x.run.id, self.drift_margin,
                            extra=_fields(x.run, "lease.expired"))
                self._abort(x, "lost", LeaseLostError(x.run.id, self.instance_id))
                continue
            if due is None or end < due:
                due = end
        return due

    def _retire(self, x: Execution) -> None:
        """``x`` is gone once its task ended and no step thread of it still runs."""
        for thread in x.threads:
            if not thread.done():
                thread.add_done_callback(lambda _: self._retire(x))
                return
        # a task cancelled before its coroutine began never ran _execute's finally: leave here
        # too (a newer execution of the run is never left), or it would be renewed forever
        self._leave(x)
        alive = self._alive.get(x.run.id)
        if alive is not None and x in alive:
            # Nothing refers to x and its context in a cycle any more (x -> context -> x, and
            # the task's contextvars -> context -> x -> task): they go by reference count as
            # soon as the engine lets go of x, not by the garbage collector, whose passes over
            # every run's objects cost a no-op run a quarter of its CPU.
            x.detach()
            alive.remove(x)
            if not alive:
                del self._alive[x.run.id]
            self.kick()   # its slot is free

    async def _execute(self, x: Execution, earlier: list[Execution]) -> None:
        run = x.run
        spec = self.workflows[run.workflow]
        x.start()
        ctx = RunContext(self, x)   # the engine is the run's host
        x.context = ctx
        # this task's context only: provider calls find their run
        scope = current_run.set(ctx)
        telemetry = self.telemetry
        began = time.monotonic()
        if log.isEnabledFor(logging.INFO):
            log.info("run.started: %s %s attempt %d epoch %d", run.workflow, run.id,
                     run.attempts, run.lease_epoch, extra=_fields(run, "run.started"))
        token = telemetry.attempt_started(run, self.instance_id)
        try:
            try:
                for e in earlier:
                    await _ended(e)
                if not self.registry.observers:
                    pass   # none to call: no coroutine made for each run
                elif run.lease_epoch == 1:
                    await self._observe("on_run_start", run)
                else:
                    await self._observe("on_run_resume", run, run.resume_reason or "recovered")
                if run.lease_epoch > 1:   # a first execution has no checkpoints to replay
                    try:
                        x.steps = {s.seq: s for s in await self.store.load_steps(run.id)}
                    except Exception as e:
                        raise StoreWriteFailed(e) from e
                value = typed_input(spec, run)
                output = await spec.fn(ctx, value)
                if output is not None:   # None is JSON as it is
                    output = typed_output(spec, output, self.max_payload_bytes)
            except BaseException as e:
                end = self._end_for(x, spec, e)
                if end is None:   # no end of the run: the event loop or the process is exiting
                    raise
                await end   # inside the except clause: a failure's traceback is e's
                return
            await self._settle(x, Settlement("succeeded", output=output))
        except Exception as e:   # the store failed while the run was ending
            await self._store_failed(x, e)
        finally:
            outcome = x.outcome or "interrupted"
            telemetry.attempt_ended(token, run, outcome, x.error)
            if log.isEnabledFor(logging.INFO):
                took = time.monotonic() - began
                log.info("run.ended: %s %s %s in %.3f s", run.workflow, run.id, outcome, took,
                         extra=_fields(run, "run.ended", status=outcome,
                                       duration=round(took, 6)))
            current_run.reset(scope)   # the task's context no longer holds the run (see _retire)
            if x.progress is not None:
                x.progress.stop()
            self._leave(x)
            if self._settle_waiters:
                self._wake_settle_waiters()
            self.kick()

    def _end_for(self, x: Execution, spec: WorkflowSpec,
                 e: BaseException) -> Awaitable[Any] | None:
        """How the execution ``x`` ends once ``e`` escaped its workflow (or the reads before
        it): one case an exception, first match wins. None for an exception that is no end of
        the run."""
        aborted = x.aborted is not None
        match e:
            case Suspended():
                return self._parked(x, e)
            case asyncio.CancelledError() if not aborted and _raised_by_code():
                return self._failed(x, spec, RuntimeError(
                    "the workflow raised asyncio.CancelledError"))
            case asyncio.CancelledError():
                return self._aborted(x)
            case LeaseLostError():
                return self._lost(x, e)
            case StoreWriteFailed():
                return self._store_failed(x, e.error)
            case NonDeterminismError():
                return self._settle(x, Settlement("failed", error=f"NonDeterminismError: {e}"))
            case Exception() if aborted:   # the abort surfaced as the step's own error
                return self._aborted(x)
            case Exception():
                return self._failed(x, spec, e)
        return None

    async def _parked(self, x: Execution, s: Suspended) -> None:
        """The run durably yielded (the store says so already)."""
        if s.until is not None:
            self.wake_at(s.until)
        # the run may be claimed again (here too) while observers run: leave first
        self._leave(x)
        if self.registry.observers:
            run = x.run
            await self._observe("on_run_pause", dataclasses.replace(
                run, status=RunStatus(s.status), owner=None, lease_expires_at=None))

    async def _aborted(self, x: Execution) -> None:
        if x.aborted == "cancel":
            await self._settle(x, Settlement("cancelled", error="cancelled"))
        elif x.aborted == "interrupt":
            if x.state is ExecState.THREAD_LEFT:   # not released: see Execution.leave_thread
                await x.abandon(self.clock)
                return
            await x.begin_finishing(self.clock)
            await self.store.release_run(x.fence, self.clock.now())
            x.release()
            log.info("run.interrupted: %s", x.run.id, extra=_fields(x.run, "run.interrupted"))
        elif x.aborted == "lost":
            await self._lost(x, LeaseLostError(x.run.id, self.instance_id))
        else:   # cancelled from outside (the event loop is going away): let it go quickly
            with contextlib.suppress(Exception):
                await self.store.release_run(x.fence, self.clock.now())
            raise asyncio.CancelledError

    async def _store_failed(self, x: Execution, error: BaseException) -> None:
        """The store refused one of the engine's own writes (unreachable, locked too long). That
        is no failure of the run: release it (fenced) so it is continued without charging an
        attempt; if even that fails, its lease lapses and recovery takes it."""
        log.warning("run.store_failed: %s %s: %s", x.run.workflow, x.run.id, error,
                    extra=_fields(x.run, "run.store_failed"))
        x.store_failed(error)
        await self._report(error)
        # Released at once if the store answers; else tried again every poll interval while
        # the lease may still be held, so a short outage costs the run no attempt.
        while True:
            try:
                await self.store.release_run(x.fence, self.clock.now())
                return
            except Exception as e:
                log.warning("run.release_failed: %s: %s", x.run.id, e,
                            extra=_fields(x.run, "run.release_failed"))
            if self._closing or self.clock.now() + self.poll_interval >= x.held_until:
                return
            await self.clock.sleep(self.poll_interval)

    async def _failed(self, x: Execution, spec: WorkflowSpec, e: Exception) -> None:
        run = x.run
        # a misuse of ctx fails the run at once, even when the code raised something else
        # because of it (a step never awaited returns no result); a step not started yet is
        # no misuse here: the code may have raised before the await it was kept for
        misuse = x.check_code()
        x.error = misuse or e
        error = f"{type(misuse or e).__name__}: {misuse or e}"
        trace = format_traceback(e)
        # over a budget, a retry could only be refused again (before spending anything): the
        # run ends now, with what it spent recorded
        again = not isinstance(e, BudgetExceededError)
        if misuse is None and again and run.attempts < run.max_attempts:
            options = spec.options
            delay = min(options.max_backoff, options.backoff * 2 ** (run.attempts - 1))
            delay *= random.uniform(0.5, 1.0)
            log.warning("run.retry: %s %s attempt %d/%d failed (%s); again in %.1fs",
                        run.workflow, run.id, run.attempts, run.max_attempts, error, delay,
                        extra=_fields(run, "run.retry"))
            settled = Settlement("retry", error=error, run_at=self.clock.now() + delay,
                                 traceback=trace)
            if await self._settle(x, settled):
                self.wake_at(self.clock.now() + delay)
        else:
            # the traceback as exc_info: the JSON log's "error", the text log's usual lines
            log.error("run.failed: %s %s after %d attempts: %s", run.workflow, run.id,
                      run.attempts, error, exc_info=misuse or e,
                      extra=_fields(run, "run.failed"))
            await self._settle(x, Settlement("failed", error=error, traceback=trace))

    async def _settle(self, x: Execution, settlement: Settlement) -> bool:
        """End the attempt as ``settlement`` says (fenced); False when the lease was lost. A run
        that returned although one of its ``ctx.step(...)`` was never awaited fails instead. A
        failure settled from an ``except`` clause without a traceback gets that exception's."""
        if settlement.outcome == "succeeded" and (misuse := x.check_code(ended=True)):
            log.error("run.failed: %s %s: %s", x.run.workflow, x.run.id, misuse,
                      extra=_fields(x.run, "run.failed"))
            settlement = Settlement("failed", error=f"{type(misuse).__name__}: {misuse}")
        elif settlement.outcome == "failed" and settlement.traceback is None:
            settlement = dataclasses.replace(settlement, traceback=format_traceback())
        await x.begin_finishing(self.clock)   # the progress not written yet goes first
        now = self.clock.now()
        if x.error is None and settlement.outcome != "cancelled":   # a cancel is no error
            x.error = settlement.error
        if await self._completer.settle(x, settlement, now):
            x.settled(settlement.outcome)
            if settlement.outcome != "retry" and self.registry.observers:
                await self._observe("on_run_end", dataclasses.replace(
                    x.run, status=RunStatus(settlement.outcome), owner=None,
                    lease_expires_at=None, output=settlement.output, error=settlement.error,
                    finished_at=now))
            return True
        await self._lost(x, LeaseLostError(x.run.id, self.instance_id))
        return False

    # -- what the completer asks of the engine (CompleterHost) -------------------------------

    def claimable(self) -> int:
        """Runs a settlement batch may claim now: as many as slots are free, none while the
        instance stops or its renewals are overdue."""
        if not self._accepting or self._renewals_stalled():
            return 0
        return max(0, self._free_slots())

    async def settle_and_claim(self, settlements: list[tuple[Fence, Settlement, float]],
                               limit: int, now: float) -> tuple[list[bool], list[Run]]:
        """Write the settlements and claim up to ``limit`` runs for this instance, at once."""
        held, claimed = await self.store.settle_and_claim(
            settlements, self.namespace, list(self.workflows), self.instance_id, limit,
            self.lease, now, version=self.config.version,
            any_version=self.registry.any_version(),
            concurrency_limits=self.registry.concurrency_limits(),
            flow=self.registry.flow_limits() or None)
        return list(held), claimed

    def launch_claimed(self, runs: list[Run], claimed_at: float) -> None:
        """Execute the runs a settlement batch claimed."""
        for run in runs:
            self._launch(run, claimed_at)

    async def _lost(self, x: Execution, e: LeaseLostError) -> None:
        log.warning("lease.lost: %s %s", x.run.workflow, x.run.id,
                    extra=_fields(x.run, "lease.lost"))
        x.lose(e)
        await self._report(e)

    async def _report(self, error: BaseException) -> None:
        await report(self.registry.on_error, error)

    def wake_at(self, when: float) -> None:
        """Run a scheduling pass at ``when`` (app clock): a delayed run or a sleeper is due."""
        async def wake() -> None:
            await self.clock.sleep(max(0.0, when - self.clock.now()))
            self.kick()

        task = asyncio.create_task(wake(), context=outside_run())
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)
