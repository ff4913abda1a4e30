"""An execution's state machine (``shoal.engine.execstate``): every transition the table allows
leads where it says, every other one raises ``TransitionError`` naming both states, and every
state is reachable; and the completer on its own: settlements batched one per run, a batch
that fails answered to each caller with its error."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import shoal
from shoal.engine.completer import Completer
from shoal.engine.context import Execution, RunContext
from shoal.engine.execstate import SLOT_FREE, TRANSITIONS, ExecState, TransitionError
from shoal.errors import LeaseLostError
from shoal.testing import VirtualClock
from shoal.types import Fence, Run, Settlement

CLOCK = VirtualClock()
# the states only an abort leads to: an execution in one was aborted (Execution.aborted)
ABORTED = {ExecState.ABORTED, ExecState.THREAD_LEFT, ExecState.LOST}


def _run(run_id: str = "r") -> Run:
    return shoal.Run(
        id=run_id, namespace="n", tenant="t", workflow="w", input=None, output=None,
        error=None, status=shoal.RunStatus.RUNNING, priority=0, created_at=0, run_at=None,
        attempts=1, max_attempts=3, concurrency_key=None, idempotency_key=None, owner="i",
        lease_expires_at=30, lease_epoch=1, cancel_requested=False, version=None,
        parent_id=None, root_id=run_id, wait_for=None, held=False, started_at=0,
        finished_at=None)


def _execution(state: ExecState, run_id: str = "r", epoch: int = 1) -> Execution:
    x = Execution(run=_run(run_id), fence=Fence(run_id, "i", epoch), held_until=30.0)
    x.state = state
    if state in ABORTED:
        x.aborted = "cancel"
    return x


def _signal_of(x: Execution) -> shoal.AbortSignal:
    """Give ``x`` a context (a host with a clock and a lease is all it reads): its signal."""
    host: Any = type("Host", (), {"clock": CLOCK, "lease": 30.0})()
    x.context = RunContext(host, x)
    return x.context.signal


def _go_on(x: Execution) -> None:
    x.aborted = None   # no abort asked meanwhile
    x.going_on()


async def _go_on_aborted(x: Execution) -> None:
    x.aborted = "cancel"   # asked while the end was written
    with pytest.raises(asyncio.CancelledError):
        x.going_on()


# each transition as the engine takes it: the Execution method, with its data
CALLS: dict[str, Callable[[Execution], Any]] = {
    "start": lambda x: x.start(),
    "abort": lambda x: x.abort("cancel", asyncio.CancelledError("cancelled")),
    "leave_thread": lambda x: x.leave_thread(),
    "finish": lambda x: x.begin_finishing(CLOCK),
    "go_on": _go_on,
    "go_on_aborted": _go_on_aborted,
    "settling": lambda x: x.settling(),
    "settle_failed": lambda x: x.settle_failed(),
    "settled": lambda x: x.settled("succeeded"),
    "suspend": lambda x: x.suspend("sleeping", 5.0),
    "release": lambda x: x.release(),
    "abandon": lambda x: x.abandon(CLOCK),
    "lose": lambda x: x.lose(LeaseLostError("r", "i")),
    "store_failed": lambda x: x.store_failed(OSError("unreachable")),
}
# an abort in another state is recorded, not refused; a thread left matters only while aborted
LENIENT = {"abort", "leave_thread"}
# the outcome each ending transition records
OUTCOMES = {"settled": "succeeded", "suspend": "sleeping", "release": "interrupted",
            "abandon": "interrupted", "lose": "lost", "store_failed": "store_failed"}

ALLOWED = [(name, state) for name, (sources, _) in TRANSITIONS.items()
           for state in sorted(sources, key=lambda s: s.value)]
REFUSED = [(name, state) for name, (sources, _) in TRANSITIONS.items() if name not in LENIENT
           for state in ExecState if state not in sources]


async def _take(x: Execution, transition: str) -> None:
    result = CALLS[transition](x)
    if asyncio.iscoroutine(result):
        await result


def test_every_transition_has_its_call() -> None:
    assert set(CALLS) == set(TRANSITIONS)


@pytest.mark.parametrize(("transition", "state"), ALLOWED,
                         ids=[f"{t}-from-{s.value}" for t, s in ALLOWED])
async def test_an_allowed_transition_leads_where_the_table_says(transition: str,
                                                                state: ExecState) -> None:
    x = _execution(state)
    await _take(x, transition)
    assert x.state is TRANSITIONS[transition][1]
    if transition in OUTCOMES:
        assert x.outcome == OUTCOMES[transition]


@pytest.mark.parametrize(("transition", "state"), REFUSED,
                         ids=[f"{t}-from-{s.value}" for t, s in REFUSED])
async def test_a_transition_from_another_state_is_refused_naming_both(transition: str,
                                                                      state: ExecState) -> None:
    x = _execution(state)
    with pytest.raises(TransitionError) as raised:
        await _take(x, transition)
    to = TRANSITIONS[transition][1]
    assert f"{transition!r} ({state.value} -> {to.value})" in str(raised.value)
    assert x.state is state and x.outcome is None


def test_every_state_is_reachable_from_claimed() -> None:
    seen, frontier = {ExecState.CLAIMED}, [ExecState.CLAIMED]
    while frontier:
        state = frontier.pop()
        for sources, to in TRANSITIONS.values():
            if state in sources and to not in seen:
                seen.add(to)
                frontier.append(to)
    assert seen == set(ExecState)


@pytest.mark.parametrize("state", list(ExecState), ids=[s.value for s in ExecState])
def test_an_abort_is_taken_once_and_cancels_only_a_running_execution(state: ExecState) -> None:
    x = _execution(state)
    signal = _signal_of(x)
    reason = asyncio.CancelledError("cancelled")
    if state in ABORTED:   # aborted already: the first abort stays
        assert not x.abort("interrupt", reason)
        assert (x.state, x.aborted, signal.reason) == (state, "cancel", None)
        return
    cancels = x.abort("interrupt", reason)
    assert cancels == (state in (ExecState.CLAIMED, ExecState.RUNNING))
    assert x.state is (ExecState.ABORTED if cancels else state)
    assert x.aborted == "interrupt" and signal.reason is reason
    assert not x.abort("lost", LeaseLostError("r", "i"))   # the first abort stays
    assert x.aborted == "interrupt" and signal.reason is reason


def test_a_lost_lease_sets_the_signal_and_stops_the_code() -> None:
    x = _execution(ExecState.RUNNING)
    signal = _signal_of(x)
    error = LeaseLostError("r", "i")
    x.lose(error)
    assert (x.state, x.aborted, x.outcome, x.error) == (ExecState.LOST, "lost", "lost", error)
    assert signal.reason is error


@pytest.mark.parametrize("state", list(ExecState), ids=[s.value for s in ExecState])
def test_a_thread_left_is_recorded_only_while_aborted(state: ExecState) -> None:
    x = _execution(state)
    x.leave_thread()
    assert x.state is (ExecState.THREAD_LEFT if state is ExecState.ABORTED else state)


def test_the_slot_is_free_once_the_settlement_is_being_written() -> None:
    assert {s for s in ExecState if _execution(s).slot_free} == SLOT_FREE == {
        ExecState.SETTLING, ExecState.SETTLED}


def test_the_lease_deadline_only_moves_on() -> None:
    x = _execution(ExecState.RUNNING)
    x.extend_lease(40.0)
    x.extend_lease(35.0)
    assert x.held_until == 40.0


# -- the completer --------------------------------------------------------------------------

class Host:
    """A CompleterHost that records each batch, and fails those it is told to."""

    def __init__(self, claimable: int = 0, claims: Sequence[Run] = ()) -> None:
        self.claim_lock = asyncio.Lock()
        self.free = claimable
        self.claims = list(claims)
        self.batches: list[list[tuple[Fence, Settlement, float]]] = []
        self.fail: BaseException | None = None
        self.launched: list[tuple[list[Run], float]] = []
        self.kicks = 0

    def claimable(self) -> int:
        return self.free

    async def settle_and_claim(self, settlements: list[tuple[Fence, Settlement, float]],
                               limit: int, now: float) -> tuple[Sequence[bool], list[Run]]:
        self.batches.append(settlements)
        await asyncio.sleep(0)   # the others queue meanwhile
        if self.fail is not None:
            raise self.fail
        claimed, self.claims = self.claims[:limit], self.claims[limit:]
        return [s.epoch != 9 for s, _, _ in settlements], claimed   # epoch 9: fenced out

    def launch_claimed(self, runs: list[Run], claimed_at: float) -> None:
        self.launched.append((runs, claimed_at))

    def kick(self) -> None:
        self.kicks += 1


async def test_the_completer_writes_settlements_in_batches_of_one_per_run() -> None:
    host = Host(claimable=2, claims=[_run("c1"), _run("c2"), _run("c3")])
    completer = Completer(host, CLOCK)
    xs = [_execution(ExecState.FINISHING, run_id) for run_id in ("a", "b", "c")]
    again = _execution(ExecState.FINISHING, "a", epoch=9)   # a newer claim's, of run a
    answers = await asyncio.gather(
        *(completer.settle(x, Settlement("succeeded", output=i), 1.0)
          for i, x in enumerate([*xs, again])))
    assert answers == [True, True, True, False]
    assert [[f.run_id for f, _, _ in batch] for batch in host.batches] == [["a", "b", "c"],
                                                                           ["a"]]
    assert [s.output for _, s, _ in host.batches[0]] == [0, 1, 2]
    assert all(x.state is ExecState.SETTLING for x in [*xs, again])   # the engine ends them
    assert [[r.id for r in runs] for runs, _ in host.launched] == [["c1", "c2"], ["c3"]]
    assert host.kicks == 1   # the first batch claimed all it might: there may be more due


async def test_a_failed_batch_answers_each_caller_with_its_error() -> None:
    host = Host(claimable=1, claims=[_run("c1")])
    host.fail = OSError("the store is unreachable")
    completer = Completer(host, CLOCK)
    xs = [_execution(ExecState.FINISHING, run_id) for run_id in ("a", "b")]
    answers = await asyncio.gather(*(completer.settle(x, Settlement("succeeded"), 1.0)
                                     for x in xs), return_exceptions=True)
    assert [type(a) for a in answers] == [OSError, OSError]
    assert all(x.state is ExecState.FINISHING for x in xs)   # the slots are held again
    assert host.launched == [] and host.kicks == 0
    host.fail = None   # the next settlement is written by a new batch
    assert await completer.settle(xs[0], Settlement("succeeded"), 2.0) is True
    assert [[r.id for r in runs] for runs, _ in host.launched] == [["c1"]]
