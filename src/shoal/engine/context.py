"""What a workflow sees while it executes: ``RunContext`` and its ``AbortSignal``."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import random
import sys
import threading
import traceback
import types
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    NoReturn,
    ParamSpec,
    Protocol,
    TypeVar,
    cast,
    overload,
)

from shoal import _checks, _json, _threads, _usercode
from shoal._checks import CALL
from shoal._ids import new_id
from shoal.abort import AbortSignal, set_aborted, set_expiry
from shoal.clock import DRIFT_MARGIN
from shoal.engine import values
from shoal.engine.execstate import (
    ENDING,
    SLOT_FREE,
    TRANSITIONS,
    AbortWhy,
    ExecState,
    TransitionError,
)
from shoal.engine.progress import ProgressWriter
from shoal.engine.values import WorkflowTypes
from shoal.errors import (
    LeaseLostError,
    NonDeterminismError,
    RunCancelledError,
    RunFailedError,
    WorkflowCodeError,
)
from shoal.ports import Checkpoints, Pauses, Trees
from shoal.types import Fence, GraphCheckpoint, OutboxEntry, Pause, Progress, Run, Step

if TYPE_CHECKING:
    from shoal.clock import Clock
    from shoal.telemetry import Telemetry

log = logging.getLogger("shoal")

T = TypeVar("T")
P = ParamSpec("P")
In = TypeVar("In")
Out = TypeVar("Out")
Result = TypeVar("Result", covariant=True)

# the longest a run's end waits for its progress to be written (real seconds): renewals skip a
# run that is finishing, so a store slow to write progress must not hold its settlement
FLUSH_LIMIT = 1.0
# Seconds a plain-function step's thread still gets to return once its instance's stop
# interrupted the run (its ctx.signal aborted): the result it returns by then is checkpointed.
# close(timeout) takes at most that much longer than its timeout for it.
STOP_GRACE = 1.0
TRACEBACK_LIMIT = 64 * 1024   # characters of a failed attempt's traceback kept: its last ones
# taken only to make an execution's ProgressWriter, which step threads may race to do
_NEW_WRITER = threading.Lock()


def _consumed(task: asyncio.Future[Any]) -> None:
    """A done callback that retrieves a task's outcome (no "never retrieved" warning)."""
    if not task.cancelled():
        task.exception()


def format_traceback(error: BaseException | None = None) -> str | None:
    """The traceback of ``error`` (by default the exception being handled, None without one),
    cut to its last ``TRACEBACK_LIMIT`` characters: the end says where it was raised."""
    if error is None:
        error = sys.exception()
        if error is None:
            return None
    text = "".join(traceback.format_exception(error))
    if len(text) > TRACEBACK_LIMIT:
        text = "[... the start of the traceback is cut]\n" + text[-TRACEBACK_LIMIT:]
    return text


class Suspended(BaseException):
    """Raised inside a run that has durably yielded (sleep, wait): the store already says so.
    A BaseException, so a workflow's ``except Exception`` does not swallow it."""

    def __init__(self, status: str, until: float | None) -> None:
        super().__init__(status)
        self.status = status
        self.until = until


@dataclass(frozen=True)
class Decision:
    """The answer to an approval: ``approved``, optional ``data`` and ``by``; ``reason`` is
    ``"expired"`` when nobody answered in time, ``"cancelled"`` when the run was cancelled."""

    approved: bool
    data: Any = None
    by: str | None = None
    reason: str | None = None


class Tree:
    """State shared by every run of one request (a root run and its children, any depth, on any
    instance), removed when the root ends. Each call is a checkpointed step, so a replay gets
    the answer the first execution got."""

    def __init__(self, ctx: RunContext) -> None:
        self._ctx = ctx

    async def save_if_absent(self, key: str, value: Any) -> bool:
        """Store ``value`` under ``key`` unless the key is taken: of several runs racing for one
        key exactly one gets True. Build keys from identifiers, never from free text."""
        ctx = self._ctx
        ctx._outside_step(f"ctx.tree.save_if_absent({key!r}, ...)")
        _json.check_json(value, f"the value of tree key {key!r}")
        host = ctx._host
        value = _json.checked(value, f"the value of tree key {key!r}", host.max_payload_bytes)

        async def save() -> bool:
            claimant = ctx.step_key or ctx.run_id
            return await host.store.save_tree_key(ctx.root_id, key, value, claimant,
                                                    host.clock.now())

        return bool(await ctx.step(f"shoal.tree.save_if_absent:{key}", save))

    async def get(self, key: str) -> Any:
        """The value under ``key``, or None."""
        ctx = self._ctx
        ctx._outside_step(f"ctx.tree.get({key!r})")
        host = ctx._host

        async def read() -> Any:
            return await host.store.get_tree_key(ctx.root_id, key)

        return await ctx.step(f"shoal.tree.get:{key}", read)


_current_outbox: contextvars.ContextVar[list[tuple[str, Any]] | None] = contextvars.ContextVar(
    "shoal_outbox", default=None)

# the name of the step whose function is executing, in that function's context (asyncio.to_thread
# copies it into a plain function's thread): durable ctx calls are refused there
_current_step: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "shoal_step", default=None)


class Outbox:
    """Side effects recorded with the step that sends them, then delivered by any instance to
    the ``@app.outbox_handler(topic)``, retried with backoff, dead-lettered after
    ``max_deliveries``. Entries are written in the step's own checkpoint, so a step that runs
    again does not send them twice."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self._max_bytes = max_bytes   # App(max_payload_bytes): the largest payload

    def send(self, topic: str, payload: Any = None) -> None:
        """Record an entry for ``topic``; call it inside a ``ctx.step`` function."""
        buffer = _current_outbox.get()
        if buffer is None:
            raise RuntimeError(
                f"ctx.outbox.send({topic!r}, ...) was called outside a step: call it inside the "
                f"function given to ctx.step, so the entry is recorded with that step.")
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"an outbox topic is a non-empty str, not {topic!r}")
        buffer.append((topic, _json.checked(payload, f"the payload of outbox entry {topic!r}",
                                            self._max_bytes)))


class ChildRun(Generic[Result]):
    """A child run started by ``ctx.start_child``. ``await child.result()`` parks the parent,
    holding no slot, until the child ends. Of a ``Workflow[In, Out]`` it is a
    ``ChildRun[Out]``."""

    def __init__(self, ctx: RunContext, run_id: str, types: WorkflowTypes | None = None) -> None:
        self._ctx = ctx
        self._types = types
        self.id = run_id

    def __repr__(self) -> str:
        return f"<shoal.ChildRun {self.id}>"

    async def result(self) -> Result:
        """The child's output (the model or dataclass its workflow's return annotation names,
        when it names one); raises ``RunFailedError`` or ``RunCancelledError`` as
        ``app.result`` does."""
        output = await self._ctx._child_result(self.id)
        codec = None if self._types is None else self._types.output
        return cast(Result, values.load(codec, output, f"the output of child run {self.id}"))


class ReplayStop(BaseException):
    """Raised in a replay of a recorded history (:mod:`shoal.engine.replay`) where it stops:
    the code reached a position the history has not finished (``ended``), or one recorded
    under another name (``recorded`` and ``new`` differ), or one whose recorded content the
    code would not produce (``detail`` says how: a LangGraph graph that changed). A
    BaseException, so a workflow's ``except Exception`` does not swallow it."""

    def __init__(self, seq: int, recorded: str | None, new: str,
                 detail: str | None = None) -> None:
        super().__init__(f"#{seq}: recorded {recorded!r}, reached {new!r}"
                         + (f": {detail}" if detail else ""))
        self.seq = seq
        self.recorded = recorded
        self.new = new
        self.detail = detail

    @property
    def ended(self) -> bool:
        return self.detail is None and (self.recorded is None or self.recorded == self.new)


class StoreWriteFailed(BaseException):
    """A checkpoint or suspend write failed in the store (not fenced out: unreachable, locked).
    A BaseException, so the workflow cannot mistake it for its own error and retry around it."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _EndedWhileStopping(BaseException):
    """A plain-function step's thread returned ``result`` within :data:`STOP_GRACE` of the
    stop that interrupted its run: the step checkpoints it, then the run stops there. A
    BaseException, so neither ``retries=`` nor the workflow's ``except Exception`` take it."""

    def __init__(self, result: Any) -> None:
        super().__init__("a step's thread ended while its instance stopped")
        self.result = result
        self.retried = 0


def _thread_left(run_id: str, step: str | None, stopping: bool) -> None:
    """Log that a step's thread outlived its run's abort, and what becomes of the run."""
    if stopping:
        what = (f"the instance stopped while step {step!r} of run {run_id} still runs in a "
                f"thread, {STOP_GRACE:g} s after its ctx.signal was aborted: the run is not "
                f"released but left to its lease, so that no other instance runs the step beside "
                f"the thread; another instance takes it over once the lease ends, as after a "
                f"crash (an attempt), and the thread ends with the process. Have the step return "
                f"when ctx.signal is aborted, or stop with a longer timeout")
    else:
        what = (f"run {run_id} was cancelled while step {step!r} still runs in a thread: the "
                f"run ends cancelled, and the thread runs on until it returns")
    log.warning("step.thread_running: %s", what,
                extra={"event": "step.thread_running", "run_id": run_id, "step": step})


class _StepCall:
    """One ``ctx.step(...)`` call: its name, and whether its coroutine has started."""

    __slots__ = ("name", "started")

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = False


@dataclass(eq=False, slots=True)   # each execution is itself: kept in sets by identity
class Execution:
    """One local execution of a claimed run. Its :attr:`state` changes only by the
    transitions below, each allowed from the states :data:`~shoal.engine.execstate.TRANSITIONS`
    says (another raises ``TransitionError``, a bug). Written on the event loop only; a step's
    thread reads it (``ctx.signal``), one attribute at a time."""

    run: Run
    fence: Fence
    steps: dict[int, Step] = field(default_factory=dict)
    seq: int = 0
    state: ExecState = ExecState.CLAIMED
    # why it was aborted ("cancel", "interrupt", "lost"), once it was: set by abort() alone
    aborted: AbortWhy | None = None
    # The lease is surely held until then: the time a write that extended it was sent, plus
    # the lease. Past it (this process was frozen, or its store calls failed), another instance
    # may have taken the run over, so no new step may start here.
    held_until: float = 0.0
    suspended: Suspended | None = None   # set once the run durably yielded
    task: asyncio.Task[None] | None = None
    context: RunContext | None = None
    # step threads still running: a thread cannot be stopped, so the engine counts the
    # execution as alive (holding its slot, barring a new execution of the run) until they end
    threads: set[asyncio.Future[Any]] = field(default_factory=set)
    # ctx.step(...) calls whose coroutine has not started yet, and the names of those dropped
    # without ever starting (an await left out)
    unstarted: set[_StepCall] = field(default_factory=set)
    never_awaited: list[str] = field(default_factory=list)
    # A misuse of ctx in the workflow's code (a step inside a step, a step never awaited). Kept
    # once found, so a workflow that catches it cannot go on; the run fails at once (retrying
    # the same code would fail the same way)
    misuse: WorkflowCodeError | None = None
    # how the execution ended, for telemetry and the log, set by the transition that ends it:
    # the settlement's outcome, the parked status, or why it stopped without settling
    # ("interrupted", "lost", "store_failed")
    outcome: str | None = None
    error: BaseException | str | None = None
    # ctx.progress: the newest value reported, written in the background (made on first use)
    progress: ProgressWriter | None = None

    # a replay of a recorded history: no store call, stop where the history does
    replay_only: bool = False
    # a replay's recorded LangGraph checkpoints of the run (None: the history has none, as
    # one exported by an older shoal), and what the replay could not check, said in its result
    recorded_graph: tuple[GraphCheckpoint, ...] | None = None
    unchecked: list[str] = field(default_factory=list)

    # -- the state machine -------------------------------------------------------------------

    def _move(self, transition: str) -> None:
        allowed, to = TRANSITIONS[transition]
        if self.state not in allowed:
            raise TransitionError(transition, self.state, self.run.id)
        self.state = to

    @property
    def ending(self) -> bool:
        """Its end is being written (settle, suspend, release), or was: a renewal refused
        meanwhile is that write's doing, not a lost lease; the write itself is fenced."""
        return self.state in ENDING

    @property
    def slot_free(self) -> bool:
        """Its settlement is committed, or is in the write under way that claims runs for the
        slots it frees (they commit together)."""
        return self.state in SLOT_FREE

    def start(self) -> None:
        """Its task began: the workflow's code runs."""
        self._move("start")

    def abort(self, why: AbortWhy, reason: BaseException) -> bool:
        """Abort it (once: False if it was already): ``ctx.signal`` is set with ``reason``, and
        True says its task is to be cancelled (it was claimed or running). One writing its end
        keeps ``why`` for :meth:`going_on`; the write, fenced, is let finish."""
        if self.aborted is not None:
            return False
        self.aborted = why
        if self.context is not None:
            set_aborted(self.context.signal, reason)
        if self.state in ENDING:
            return False
        self._move("abort")
        return True

    def leave_thread(self) -> None:
        """Interrupted, a step's thread still runs past its grace: the claim is not released,
        so no other instance runs the step beside it before the lease lapses. It matters only
        while the execution winds down from the abort: one whose end another coroutine of the
        run is writing (or wrote) ends as that write says, and is left as it is."""
        if self.state is ExecState.ABORTED:
            self._move("leave_thread")

    def extend_lease(self, until: float) -> None:
        """A write that extended the lease to ``until`` (its send time plus the lease) came
        back: the local lease deadline moves on, never back."""
        if until > self.held_until:
            self.held_until = until

    async def begin_finishing(self, clock: Clock) -> None:
        """The next write may end the claim (settle, suspend, release): enter ``finishing``,
        then write the progress reported and not written yet, so that it is seen with the run's
        end, sleep or wait. Renewals skip a finishing run, so the wait for that write is bounded
        (:data:`FLUSH_LIMIT` seconds, of the app's clock or real time, whichever passes first):
        past it, the end is written without waiting more."""
        self._move("finish")
        await self._flush(clock)

    async def _flush(self, clock: Clock) -> None:
        if self.progress is not None:
            flush = asyncio.ensure_future(self.progress.flush())
            limit = asyncio.ensure_future(clock.sleep(FLUSH_LIMIT))
            await asyncio.wait({flush, limit}, timeout=FLUSH_LIMIT,
                               return_when=asyncio.FIRST_COMPLETED)
            limit.cancel()
            if not flush.done():   # the write goes on by itself; the run's end does not wait for it
                log.warning("progress.flush_slow: run %s: its progress was not written within "
                            "%.0f s; its end is written first", self.run.id, FLUSH_LIMIT,
                            extra={"event": "progress.flush_slow", "run_id": self.run.id})
                flush.add_done_callback(_consumed)

    def going_on(self) -> None:
        """A write that might have ended the claim did not (a signal was there, the pause or the
        child was resolved): the run goes on. An abort asked for meanwhile, which let the write
        finish rather than cancel it, takes effect now."""
        if self.aborted is not None:
            self._move("go_on_aborted")
            raise asyncio.CancelledError(f"the run was aborted ({self.aborted})")
        self._move("go_on")

    def settling(self) -> None:
        """Its settlement goes in the batch being written: its slot is free for that batch's
        claim."""
        self._move("settling")

    def settle_failed(self) -> None:
        """The batch's write raised: the settlement is not written, the slot held again."""
        self._move("settle_failed")

    def settled(self, outcome: str) -> None:
        """Its settlement (``outcome``) is committed."""
        self._move("settled")
        self.outcome = outcome

    def suspend(self, status: str, until: float | None) -> Suspended:
        """The store says it durably yielded (``status``: sleeping, waiting): the Suspended
        that every later ctx call raises again."""
        self._move("suspend")
        self.suspended = Suspended(status, until)
        self.outcome = status
        return self.suspended

    def release(self) -> None:
        """Interrupted, its claim released (fenced) for another instance."""
        self._move("release")
        self.outcome = "interrupted"

    async def abandon(self, clock: Clock) -> None:
        """Interrupted with a step's thread still running: left to its lease (no renewal, no
        release); its progress is written first."""
        self._move("abandon")
        self.outcome = "interrupted"
        await self._flush(clock)

    def lose(self, error: BaseException) -> None:
        """Its lease is lost (a write or a renewal refused, the lease ended here): it writes
        nothing more, and ``ctx.signal`` says so."""
        self._move("lose")
        self.outcome, self.error = "lost", error
        if self.aborted is None:
            self.aborted = "lost"
            if self.context is not None:
                set_aborted(self.context.signal, error)

    def store_failed(self, error: BaseException) -> None:
        """The store refused one of the engine's own writes: the run is to be released."""
        self._move("store_failed")
        self.outcome, self.error = "store_failed", error

    def detach(self) -> None:
        """The execution is gone: its context drops the helpers that refer back to it, so that
        they are freed by reference count rather than by the cyclic garbage collector."""
        if self.context is not None:
            self.context._ended()
            self.context = None

    # -- the workflow's code -----------------------------------------------------------------

    def dropped(self, call: _StepCall) -> None:
        """``call``'s coroutine was garbage-collected: without having started, it was never
        awaited."""
        if not call.started:
            self.unstarted.discard(call)
            self.never_awaited.append(call.name)

    def check_code(self, ended: bool = False) -> WorkflowCodeError | None:
        """The misuse of ctx found so far: a durable ctx call inside a step's function, or a
        ``ctx.step(...)`` never awaited (dropped unstarted; once the workflow has returned,
        also one still unstarted). Kept once found."""
        if self.misuse is None:
            names = [*self.never_awaited, *(c.name for c in self.unstarted if ended)]
            if names:
                self.misuse = WorkflowCodeError(
                    f"ctx.step({names[0]!r}, ...) in run {self.run.id} was never awaited: write "
                    f"`await ctx.step({names[0]!r}, ...)`. A step that is not awaited never "
                    f"runs, and is not checkpointed.")
        return self.misuse


class StepCaller:
    """``ctx.step``: ``await ctx.step(name, fn, *args, **kwargs)`` runs ``fn(*args, **kwargs)``
    as a checkpointed step. ``name`` and ``fn`` are positional-only and every other argument,
    keywords included, goes to ``fn``: step options are given apart, by
    ``ctx.step.with_options(...)``, which returns a caller of the same form."""

    __slots__ = ("_ctx", "_retries")

    def __init__(self, ctx: RunContext, retries: int = 0) -> None:
        self._ctx = ctx
        self._retries = retries

    def __repr__(self) -> str:
        return f"<shoal ctx.step retries={self._retries}>"

    @overload
    def __call__(self, name: str, fn: Callable[P, Awaitable[T]], /, *args: P.args,
                 **kwargs: P.kwargs) -> Coroutine[Any, Any, T]: ...

    @overload
    def __call__(self, name: str, fn: Callable[P, T], /, *args: P.args,
                 **kwargs: P.kwargs) -> Coroutine[Any, Any, T]: ...

    def __call__(self, name: str, fn: Callable[..., Any], /, *args: Any,
                 **kwargs: Any) -> Coroutine[Any, Any, Any]:
        """Run ``fn(*args, **kwargs)`` once for this run and checkpoint its JSON result before
        anything else happens; on a replay, return the recorded result without running it.
        Refused (``WorkflowCodeError``) inside another step's function."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"ctx.step(name, fn, ...): name is a non-empty str, not {name!r}.")
        if not callable(fn):
            raise TypeError(f"ctx.step({name!r}, fn, ...): fn is a function, not {fn!r}.")
        return self._ctx._start_step(name, fn, args, kwargs, self._retries)

    def with_options(self, *, retries: int | None = None) -> StepCaller:
        """``ctx.step`` with these options (the others as they are here): ``retries`` retries a
        step that raises up to that many more times in place, with backoff, before the exception
        fails the attempt (default 0)."""
        if retries is None:
            retries = self._retries
        elif isinstance(retries, bool) or not isinstance(retries, int):
            raise TypeError(f"ctx.step.with_options(retries=...): an int >= 0, not {retries!r}.")
        elif retries < 0:
            raise ValueError(f"ctx.step.with_options(retries=...): an int >= 0, not {retries}.")
        return StepCaller(self._ctx, retries)


class RunStore(Checkpoints, Pauses, Trees, Protocol):
    """The store as a running attempt writes it: checkpoints, pauses, tree keys, child waits."""


class Registered(Protocol):
    """A workflow as the host keeps it: its function and the codecs of its input and output."""

    @property
    def fn(self) -> Callable[..., Any]: ...

    @property
    def types(self) -> WorkflowTypes: ...


class RunHost(Protocol):
    """What a :class:`RunContext` needs from the instance executing its run (the engine): the
    store it writes through, the clock, the lease its writes extend, and four callbacks."""

    @property
    def store(self) -> RunStore: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def lease(self) -> float: ...

    @property
    def max_payload_bytes(self) -> int: ...

    @property
    def telemetry(self) -> Telemetry: ...

    @property
    def workflows(self) -> Mapping[str, Registered]:
        """The workflows registered here, by name (what a child's output is loaded as)."""

    async def spend(self, ctx: RunContext, amount: float, currency: str) -> None:
        """Charge ``amount`` to the run's budgets and the ledger."""

    async def start_child(self, parent: Run, workflow: Any, input: Any, key: str,
                          options: dict[str, Any]) -> Run:
        """Dispatch a run in ``parent``'s tree, idempotently under ``key``."""

    def outbox_written(self) -> None:
        """A step just wrote outbox entries: deliver them soon."""

    def pause_created(self) -> None:
        """A pause was just made: announce it soon."""


class RunExtension:
    """The extension API for integration authors: what an integration of another framework
    (LangGraph, the OpenAI Agents SDK, Pydantic AI, one of your own) needs of a run beyond the
    calls of :class:`RunContext`, as ``ctx.extension``. It is stable: shoal's own integrations
    use nothing else of a run (docs/integrations-api.md).

    A framework's work is recorded with ``ctx.step`` (one step a segment of it, a model call,
    a tool call), ``ctx.approval`` (a pause) and the rest of ``ctx``. What it keeps in the store
    itself (a LangGraph checkpoint) is written conditional on the run's claim, :attr:`fence`;
    a write the store refuses because the claim is lost ends the attempt with
    :meth:`lease_lost`, as the engine's own writes do. In a replay of a recorded history
    (``shoal replay``), :attr:`replaying` is True and nothing may be written."""

    __slots__ = ("_host", "_lost", "_x")

    def __init__(self, host: RunHost, execution: Execution,
                 lost: Callable[[], NoReturn]) -> None:
        self._host = host
        self._x = execution
        self._lost = lost

    def __repr__(self) -> str:
        return f"<shoal RunExtension of run {self._x.run.id}>"

    @property
    def namespace(self) -> str:
        """The namespace of the run (its app's name): what the store's keys are scoped by."""
        return self._x.run.namespace

    @property
    def fence(self) -> Fence:
        """The run's claim (its id, this instance as owner, the lease epoch): a store write
        given it succeeds only while the run is still claimed so, never once another instance
        has taken it over."""
        return self._x.fence

    @property
    def clock(self) -> Clock:
        """The app's clock: every time the integration writes or waits on is read from it."""
        return self._host.clock

    @property
    def store(self) -> object:
        """The app's run store. Narrow it to the port the integration writes through with
        ``isinstance`` (``shoal.ports.GraphCheckpoints``, …): a store may not implement every
        optional port. In a replay, a store that refuses every call."""
        return self._host.store

    def lease_lost(self) -> NoReturn:
        """Raise ``LeaseLostError``: call it when the store refused a write fenced by
        :attr:`fence`. The run is aborted here (``ctx.signal``) and writes nothing more; the
        instance that holds the claim now continues it from its checkpoints."""
        self._lost()

    @property
    def replaying(self) -> bool:
        """Whether this is a replay of a recorded history (``shoal replay``,
        ``shoal.testing.replay``): steps return their recorded results, and nothing is read
        from or written to a store."""
        return self._x.replay_only

    @property
    def recorded_graph_checkpoints(self) -> tuple[GraphCheckpoint, ...] | None:
        """In a replay, the LangGraph checkpoints the history recorded for this run (None
        outside a replay, or for a history exported without them)."""
        return self._x.recorded_graph

    def replay_unchecked(self, what: str) -> None:
        """In a replay, say what it could not check (``what``: a sentence); the replay's result
        lists it, rather than count it as passed."""
        self._x.unchecked.append(what)

    def end_replay(self, reached: str) -> NoReturn:
        """End a replay here, successfully: everything recorded up to now matched, and what
        follows cannot be checked without a store (``reached``: what the code reached)."""
        raise ReplayStop(self._x.seq + 1, None, reached)

    def replay_differs(self, reached: str, detail: str) -> NoReturn:
        """Stop a replay at the next position: the code reached ``reached``, whose recorded
        content it would not produce (``detail`` says how, in a sentence)."""
        seq = self._x.seq + 1
        recorded = self._x.steps.get(seq)
        raise ReplayStop(seq, reached if recorded is None else recorded.name, reached, detail)


class _LeaseEnd:
    """A run's signal's look at its lease (see :class:`~shoal.abort.AbortSignal`): ended, less
    the drift margin, by this clock, while the execution goes on, as the engine's lease
    watchdog sees it (an execution writing its end, or aborted already, is the engine's)."""

    __slots__ = ("_clock", "_margin", "_x")

    def __init__(self, x: Execution, clock: Clock, margin: float) -> None:
        self._x, self._clock, self._margin = x, clock, margin

    def __call__(self) -> BaseException | None:
        x = self._x
        if (x.aborted is not None or x.state in ENDING
                or x.held_until - self._margin > self._clock.now()):
            return None
        return LeaseLostError(x.run.id, x.fence.owner)


class RunContext:
    """The handle a workflow function gets as its first argument."""

    def __init__(self, host: RunHost, execution: Execution) -> None:
        self._host = host
        self._x = execution
        run = execution.run
        self.run_id: str = run.id
        self.tenant: str = run.tenant
        self.attempt: int = run.attempts
        self.workflow: str = run.workflow
        self.root_id: str = run.root_id
        self.lease_epoch: int = run.lease_epoch
        self.signal = AbortSignal()
        if not execution.replay_only:
            set_expiry(self.signal, _LeaseEnd(execution, host.clock, host.lease * DRIFT_MARGIN))
        self.step_key: str | None = None

    # Made on first use: most runs use few of them, and a context is made for every execution.

    def _ended(self) -> None:
        """The execution is gone: drop the helpers that refer back to this context, so that
        the context, its execution and the run's task are freed by reference count rather than
        by the cyclic garbage collector (a context kept by the workflow's code makes them again
        on use)."""
        for name in ("step", "tree", "extension"):
            self.__dict__.pop(name, None)
        set_expiry(self.signal, None)   # it refers to the execution: no cycle left behind

    @functools.cached_property
    def step(self) -> StepCaller:
        """``await ctx.step(name, fn, *args, **kwargs)``; options:
        ``ctx.step.with_options(retries=N)``."""
        return StepCaller(self)

    @functools.cached_property
    def tree(self) -> Tree:
        return Tree(self)

    @functools.cached_property
    def extension(self) -> RunExtension:
        """The run as an integration of another framework sees it (:class:`RunExtension`):
        its claim, its store, its lost lease, its replay."""
        return RunExtension(self._host, self._x, self._lost)

    @functools.cached_property
    def outbox(self) -> Outbox:
        return Outbox(self._host.max_payload_bytes)

    def _record(self, seq: int, name: str, output: Any, finished: bool, began: float,
                retries: int = 0) -> Step:
        """The checkpoint of ``seq`` as this attempt writes it: with when it began, the run's
        attempt and the in-place retries it took (the console's step timeline)."""
        x = self._x
        return Step(seq, name, output, finished, x.fence.epoch, began, x.run.attempts, retries)

    @staticmethod
    def _began(recorded: Step | None, now: float) -> float:
        """When a durable step began: when the run first reached it (its unfinished record
        keeps it), else ``now``."""
        if recorded is not None and recorded.started_at is not None:
            return recorded.started_at
        return now

    def _next(self, name: str) -> tuple[int, Step | None]:
        # Sticky: once the run has durably yielded or lost its claim, every later ctx call
        # raises again, even if the workflow caught the first exception.
        if self._x.suspended is not None:
            raise self._x.suspended
        if self._x.aborted == "lost":
            self._lost()
        misuse = self._x.check_code()
        if misuse is not None:
            raise misuse
        self._outside_step(f"the ctx call recorded as {name!r}")   # one created outside
        self._x.seq += 1
        seq = self._x.seq
        recorded = self._x.steps.get(seq)
        if self._x.replay_only and (recorded is None or not recorded.finished
                                    or recorded.name != name):
            raise ReplayStop(seq, None if recorded is None else recorded.name, name)
        if recorded is not None and recorded.name != name:
            raise NonDeterminismError(self.run_id, seq, recorded.name, name)
        return seq, recorded

    async def spend(self, amount: float, currency: str = "usd") -> None:
        """Record money this run spent (a model call, an API charge) in the cost ledger and
        against every budget that applies: the run's, its root's, its tenant's for today (UTC,
        the app's clock). Shared by every instance at once. Call it inside the step that spent
        the money: a step that runs again after a crash really spent it again."""
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0 or (
                amount != amount or amount == float("inf")):
            raise ValueError(f"ctx.spend(amount): a finite number >= 0, not {amount!r}.")
        if not isinstance(currency, str) or not currency:
            raise ValueError(f"ctx.spend(currency=…): a non-empty str, not {currency!r}.")
        await self._host.spend(self, float(amount), currency)

    def progress(self, fraction: float | None = None, message: str | None = None,
                 **data: Any) -> None:
        """Report how far the run has got: ``fraction`` done (a number in [0, 1], or None),
        a ``message`` and any JSON ``data``. A plain call, also from a step's function or its
        thread: it keeps the value and returns; the engine writes the newest value at most
        once a second, and before the run ends, sleeps or waits. The latest value only, not a
        checkpoint (a run executed again keeps it until it reports anew): ``Run.progress``."""
        if fraction is not None:
            if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
                raise TypeError(f"ctx.progress(fraction=...): a number between 0 and 1, or "
                                f"None, not {fraction!r:.80}.")
            if not 0 <= fraction <= 1:   # NaN too
                raise ValueError(f"ctx.progress(fraction=...): a number between 0 and 1, "
                                 f"not {fraction!r}.")
            fraction = float(fraction)
        if message is not None and not isinstance(message, str):
            raise TypeError(f"ctx.progress(message=...): a str or None, not {message!r:.80}.")
        host = self._host
        value = _json.checked({"fraction": fraction, "message": message, "data": data},
                              "ctx.progress(...)", host.max_payload_bytes)
        x = self._x
        if x.replay_only:   # a replay writes nothing: the value is checked, and dropped
            return
        writer = x.progress
        if writer is None:
            if x.task is not None and x.task.done():   # a step's thread outlived the execution
                return
            with _NEW_WRITER:
                if x.progress is None:
                    loop = x.task.get_loop() if x.task is not None else asyncio.get_running_loop()
                    x.progress = ProgressWriter(
                        loop, functools.partial(host.store.record_progress, x.fence),
                        host.clock, self.run_id)
                writer = x.progress
        writer.report(Progress(fraction, message, value["data"], host.clock.now()))

    def _check_lease(self) -> None:
        if self._host.clock.now() >= self._x.held_until:
            self._lost()

    async def _write(self, write: Awaitable[T]) -> T:
        try:
            return await write
        except Exception as e:
            raise StoreWriteFailed(e) from e

    def _suspend(self, status: str, until: float | None) -> Suspended:
        return self._x.suspend(status, until)

    def _lost(self) -> NoReturn:
        error = LeaseLostError(self.run_id, self._x.fence.owner)
        self._x.abort("lost", error)
        raise error

    def _outside_step(self, what: str) -> None:
        """Refuse a durable ctx call made inside a step's function: its record would land
        inside the step's, and a replay, which returns the finished step's result without
        running its function, would never reach it again."""
        outer = _current_step.get()
        if outer is None:
            return
        error = WorkflowCodeError(
            f"{what} was called inside the function of step {outer!r} of run {self.run_id}: "
            f"steps cannot nest, and ctx.step, ctx.sleep, ctx.wait_for, ctx.approval, "
            f"ctx.start_child, a child's result() and ctx.tree are called from the workflow "
            f"function only. Call it there, before or after ctx.step({outer!r}, ...), or do "
            f"its work inside the step's function without ctx.")
        if self._x.misuse is None:
            self._x.misuse = error
        raise error

    def _start_step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any], retries: int) -> Coroutine[Any, Any, Any]:
        """The coroutine of one ``ctx.step`` call, tracked until it starts: one dropped
        unstarted was never awaited (``Execution.check_code``)."""
        self._outside_step(f"ctx.step({name!r}, ...)")
        call = _StepCall(name)
        coro = self._step(call, fn, args, kwargs, retries)
        # named so in Python's own "never awaited" warning
        cast("types.CoroutineType[Any, Any, Any]", coro).__qualname__ = f"ctx.step({name!r})"
        self._x.unstarted.add(call)
        weakref.finalize(coro, self._x.dropped, call).atexit = False
        return coro

    async def _step(self, call: _StepCall, fn: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any], retries: int) -> Any:
        call.started = True
        self._x.unstarted.discard(call)
        name = call.name
        seq, recorded = self._next(name)
        codec = values.returned(fn)
        if recorded is not None and recorded.finished:
            return values.load(codec, recorded.output, f"the result of step {name!r}")
        self.signal.raise_if_aborted()
        self._check_lease()
        self.step_key = f"{self.run_id}:{seq}"
        sent_here: list[tuple[str, Any]] = []
        token = _current_outbox.set(sent_here)
        inside = _current_step.set(name)
        began = self._host.clock.now()
        telemetry = self._host.telemetry
        told = telemetry.step_started(self._x.run, name, seq)
        stopping = False
        try:
            try:
                result, retried = await self._call(fn, args, kwargs, retries, sent_here)
            except _EndedWhileStopping as e:
                result, retried, stopping = e.result, e.retried, True
        except BaseException as e:
            telemetry.step_ended(told, self._x.run, name, e, retries)
            raise
        else:
            # the entries it sent continue the step's trace: read while its span is current
            carrier = telemetry.trace_carrier() if sent_here else None
            telemetry.step_ended(told, self._x.run, name, None, retried)
        finally:
            self.step_key = None
            _current_step.reset(inside)
            _current_outbox.reset(token)
        if self._x.misuse is not None:   # refused inside the function, which caught it
            raise self._x.misuse
        what = f"the result of step {name!r}"
        result = _json.checked(values.dump(codec, result, what,
                                           f"the return type of the function of step {name!r}"),
                               what, self._host.max_payload_bytes)
        step = self._record(seq, name, result, True, began, retried)
        host = self._host
        sent = host.clock.now()
        run = self._x.run
        entries = [OutboxEntry(id=new_id(sent), namespace=run.namespace, run_id=run.id, seq=seq,
                               index=i, topic=topic, payload=payload, created_at=sent,
                               trace_context=carrier)
                   for i, (topic, payload) in enumerate(sent_here)]
        if not await self._write(host.store.checkpoint_step(
                self._x.fence, step, host.lease, sent, entries)):
            self._lost()
        if entries:
            host.outbox_written()
        self._x.extend_lease(sent + host.lease)
        self._x.steps[seq] = step
        if stopping:   # checkpointed; the workflow goes no further here: the run is released
            raise asyncio.CancelledError("the instance is stopping")
        return values.load(codec, result, what)   # as a replay will give it

    async def _in_thread(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """Run a plain function in a daemon thread (:mod:`shoal._threads`). A thread cannot be
        stopped, so an abort meanwhile only sets ``ctx.signal``, and then:

        - the run is cancelled: wait for the thread (up to half a lease, the lease still
          renewed), then the run ends cancelled (nobody runs it again);
        - its instance stops (the drain is over): wait :data:`STOP_GRACE` seconds more. A result
          the function returns by then is the step's, checkpointed before the run is released
          (:class:`_EndedWhileStopping`). A thread still running after that is left behind:
          its run is not released but left to its lease, so no other instance runs the step
          beside it, and the stop goes on (the thread, a daemon, ends with the process)."""
        work = _threads.run(_usercode.wrap(fn), *args, **kwargs)
        x = self._x
        x.threads.add(work)
        work.add_done_callback(x.threads.discard)
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            if x.aborted not in ("interrupt", "cancel"):
                raise
            stopping = x.aborted == "interrupt"
            lease = self._host.lease
            if not work.done():
                await asyncio.wait({work}, timeout=min(STOP_GRACE, lease / 2) if stopping
                                   else lease / 2)
            if not work.done():
                if stopping:
                    x.leave_thread()
                _thread_left(self.run_id, _current_step.get(), stopping)
            elif stopping and not work.cancelled() and work.exception() is None:
                raise _EndedWhileStopping(work.result()) from None
            raise

    async def _call(self, fn: Callable[..., Any], args: Any, kwargs: Any, retries: int,
                    sent: list[tuple[str, Any]]) -> tuple[Any, int]:
        """Call ``fn``, again up to ``retries`` times while it raises: its result and the
        retries it took."""
        tries = 0
        while True:
            sent.clear()   # a try that raised sent nothing: only the last try's entries count
            try:
                if inspect.iscoroutinefunction(fn):
                    return await _usercode.awaited(fn(*args, **kwargs)), tries
                try:
                    result = await self._in_thread(fn, args, kwargs)
                except _EndedWhileStopping as e:
                    if inspect.isawaitable(e.result):   # a coroutine it made: never run
                        raise asyncio.CancelledError("the instance is stopping") from None
                    e.retried = tries
                    raise
                if inspect.isawaitable(result):
                    result = await result
                return result, tries
            except Exception:
                if tries >= retries or self._x.misuse is not None:
                    raise
                tries += 1
                await self._host.clock.sleep(min(30.0, 0.5 * 2 ** (tries - 1))
                                               * random.uniform(0.5, 1.0))
                self.signal.raise_if_aborted()

    async def sleep(self, seconds: float) -> None:
        """Sleep durably: the run gives up its slot and its claim, and is delivered again (to any
        instance) once ``seconds`` have passed. Does not count as an attempt."""
        self._outside_step(f"ctx.sleep({seconds!r})")
        _checks.finite(seconds, "ctx.sleep(seconds)", CALL)
        seq, recorded = self._next("shoal.sleep")
        if recorded is not None and recorded.finished:
            return
        host = self._host
        now = host.clock.now()
        until = float(recorded.output["until"]) if recorded is not None else now + seconds
        began = self._began(recorded, now)
        if now >= until:
            step = self._record(seq, "shoal.sleep", {"until": until}, True, began)
            if not await self._write(host.store.checkpoint_step(
                    self._x.fence, step, host.lease, now)):
                self._lost()
            self._x.steps[seq] = step
            return
        pending = self._record(seq, "shoal.sleep", {"until": until}, False, began)
        await self._x.begin_finishing(self._host.clock)
        if not await self._write(host.store.suspend_run(
                self._x.fence, pending, "sleeping", until, None, now)):
            self._lost()
        host.telemetry.run_parked(self._x.run, "sleep", None, until)
        raise self._suspend("sleeping", until)

    async def wait_for(self, name: str, timeout: float | None = None) -> Any:
        """Wait durably for ``app.signal(run_id, name, payload)`` and return its payload. A signal
        sent before the wait is kept and returned at once. Raises ``TimeoutError`` once
        ``timeout`` seconds have passed without one. The run holds no slot while it waits."""
        self._outside_step(f"ctx.wait_for({name!r})")
        _checks.text(name, "ctx.wait_for(name)", CALL)
        if timeout is not None:
            _checks.finite(timeout, "ctx.wait_for(timeout)", CALL)
        step_name = f"shoal.wait_for:{name}"
        seq, recorded = self._next(step_name)
        if recorded is not None and recorded.finished:
            return self._waited(recorded.output, name)
        host = self._host
        now = host.clock.now()
        if recorded is not None:
            deadline = recorded.output.get("deadline")
        else:
            deadline = None if timeout is None else now + timeout
        pending = self._record(seq, step_name, {"deadline": deadline}, False,
                               self._began(recorded, now))
        await self._x.begin_finishing(self._host.clock)
        got = await self._write(host.store.wait_signal(
            self._x.fence, pending, name, deadline, now))
        if got is None:
            self._lost()
        if not got.parked:
            self._x.going_on()
        if got.received:
            self._x.steps[seq] = replace(pending, output={"payload": got.payload},
                                         finished=True)
            return got.payload
        if got.parked:
            host.telemetry.run_parked(self._x.run, "signal", name, deadline)
            raise self._suspend("waiting", deadline)
        done = replace(pending, output={"timeout": deadline}, finished=True)
        if not await self._write(host.store.checkpoint_step(
                self._x.fence, done, host.lease, now)):
            self._lost()
        self._x.steps[seq] = done
        return self._waited(done.output, name)

    async def approval(
        self, name: str, request: Any = None, expires_in: float | None = 86400.0
    ) -> Decision:
        """Ask a human: record a pending pause (listed by ``app.pending_pauses()``, announced to
        ``app.on_pause_notify`` handlers) and park the run, holding no slot but keeping its
        concurrency key, until ``app.resume(pause_id, ...)`` on any instance, or until
        ``expires_in`` seconds pass (then it is denied with ``reason="expired"``)."""
        self._outside_step(f"ctx.approval({name!r}, ...)")
        _checks.text(name, "ctx.approval(name)", CALL)
        if expires_in is not None:
            _checks.finite(expires_in, "ctx.approval(expires_in)", CALL)
        step_name = f"shoal.approval:{name}"
        seq, recorded = self._next(step_name)
        if recorded is not None and recorded.finished:
            return Decision(**recorded.output)
        host = self._host
        now = host.clock.now()
        if recorded is None:
            request = _json.checked(request, f"the request of approval {name!r}",
                                    host.max_payload_bytes)
            run = self._x.run
            pause = Pause(
                id=new_id(now), namespace=run.namespace, tenant=run.tenant, run_id=run.id,
                name=name, request=request, status="pending", decision=None, created_at=now,
                expires_at=None if expires_in is None else now + expires_in, resolved_at=None,
                notified=False,
            )
            pending = self._record(seq, step_name, {"pause_id": pause.id}, False, now)
            await self._x.begin_finishing(self._host.clock)
            if not await self._write(host.store.create_pause(self._x.fence, pending, pause,
                                                               now)):
                self._lost()
            host.pause_created()
            host.telemetry.run_parked(run, "approval", name, pause.expires_at)
            raise self._suspend("waiting", None)
        pause_id = recorded.output["pause_id"]
        found = await host.store.get_pause(pause_id)
        if found is not None and found.status == "pending":
            # delivered while its pause is pending (a stray signal named after the pause): park
            # again, in one operation that parks only if it is still pending
            await self._x.begin_finishing(self._host.clock)
            got = await self._write(host.store.wait_pause(self._x.fence, recorded, pause_id,
                                                            now))
            if got is None:
                self._lost()
            if got.parked:
                host.telemetry.run_parked(self._x.run, "approval", name, None)
                raise self._suspend("waiting", None)
            self._x.going_on()
            found = got.pause
        if found is None or found.decision is None:
            # resolved pauses are pruned after pause_retention: a run delivered that late
            # finds none, and takes it as expired
            decision: dict[str, Any] = {"approved": False, "data": None, "by": None,
                                        "reason": "expired"}
        else:
            decision = found.decision
        done = self._record(seq, step_name, decision, True, self._began(recorded, now))
        if not await self._write(host.store.checkpoint_step(self._x.fence, done, host.lease,
                                                              now)):
            self._lost()
        self._x.steps[seq] = done
        return Decision(**decision)

    @overload
    async def start_child(self, workflow: Callable[[RunContext, In], Awaitable[Out]],
                          input: In, **options: Any) -> ChildRun[Out]: ...

    @overload
    async def start_child(self, workflow: Callable[[RunContext, None], Awaitable[Out]],
                          input: None = None, **options: Any) -> ChildRun[Out]: ...

    @overload
    async def start_child(self, workflow: str, input: Any = None,
                          **options: Any) -> ChildRun[Any]: ...

    async def start_child(self, workflow: Any, input: Any = None,
                          **options: Any) -> ChildRun[Any]:
        """Start a run of ``workflow`` (a registered workflow or its name) in this run's tree:
        same root and tenant, this run as parent. Checkpointed: a replay gets the same child,
        never a second one. ``options`` are those of ``app.dispatch`` (priority, delay, ...)."""
        name = workflow if isinstance(workflow, str) else getattr(workflow, "name", "?")
        self._outside_step(f"ctx.start_child({name!r}, ...)")
        host = self._host
        seq_hint = self._x.seq + 1

        async def start() -> str:
            child = await host.start_child(self._x.run, workflow, input,
                                             f"child:{self.run_id}:{seq_hint}", options)
            return child.id

        child_id = await self.step(f"shoal.start_child:{name}", start)
        return ChildRun(self, str(child_id), self._types_of(workflow))

    def _types_of(self, workflow: Any) -> WorkflowTypes | None:
        """The codecs of ``workflow`` (a Workflow, a registered function or a name)."""
        types = getattr(workflow, "types", None)
        if isinstance(types, WorkflowTypes):
            return types
        registered = self._host.workflows
        if isinstance(workflow, str):
            spec = registered.get(workflow)
            return None if spec is None else spec.types
        return next((s.types for s in registered.values() if s.fn is workflow), None)

    async def _child_result(self, child_id: str) -> Any:
        self._outside_step(f"the result() of child run {child_id}")
        step_name = f"shoal.child:{child_id}"
        seq, recorded = self._next(step_name)
        if recorded is None or not recorded.finished:
            host = self._host
            pending = self._record(seq, step_name, {"child": child_id}, False,
                                   self._began(recorded, host.clock.now()))
            await self._x.begin_finishing(self._host.clock)
            try:
                child = await self._write(host.store.wait_child(
                    self._x.fence, pending, child_id, host.clock.now()))
            except StoreWriteFailed as e:
                if not isinstance(e.error, KeyError):
                    raise
                child = None
                gone = {"status": "failed", "output": None,
                        "error": f"child run {child_id} no longer exists (pruned after "
                                 f"run_retention while its parent waited)"}
            else:
                if child is None:
                    self._lost()
                if not child.status.final:
                    host.telemetry.run_parked(self._x.run, "child", child_id, None)
                    raise self._suspend("waiting", None)
            self._x.going_on()
            if child is None:   # record the missing child as a failure, once
                recorded = replace(pending, output=gone, finished=True)
                if not await self._write(host.store.checkpoint_step(
                        self._x.fence, recorded, host.lease, host.clock.now())):
                    self._lost()
            else:
                recorded = replace(pending, output={"status": child.status.value,
                                                    "output": child.output,
                                                    "error": child.error}, finished=True)
            self._x.steps[seq] = recorded
        out = recorded.output
        if out["status"] == "failed":
            raise RunFailedError(child_id, out["error"])
        if out["status"] == "cancelled":
            raise RunCancelledError(child_id)
        return _json.clone(out["output"])

    def _waited(self, output: Any, name: str) -> Any:
        if "timeout" in output:
            raise TimeoutError(f"No signal {name!r} arrived for run {self.run_id} in time.")
        return _json.clone(output["payload"])
