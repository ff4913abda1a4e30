"""The states of one local execution of a claimed run, and the transitions between them.

An execution is claimed (launched, its task not started), runs the workflow's code, and ends
by writing its end: a settlement (settling → settled), a durable yield (suspended), a release
after an interrupt, or nothing (its lease lost, the store failing, a step's thread left to the
lease). An abort (cancel, interrupt, lost lease: the renewals, ``app.cancel``, the stop, the
local lease deadline) is taken at once while the code runs; while an end is being written it is
kept, and takes effect if that write does not end the claim (``go_on``).

:data:`TRANSITIONS` is the whole machine: each transition, the states it is allowed from and
the state it leads to. A new state or transition is a line there (and a method of
:class:`~shoal.engine.context.Execution` that takes it), and the state machine's tests cover it.
"""

from __future__ import annotations

import enum
from typing import Literal

AbortWhy = Literal["cancel", "interrupt", "lost"]


class ExecState(enum.Enum):
    CLAIMED = "claimed"            # launched for its claim; its task has not started
    RUNNING = "running"            # the workflow's code runs
    ABORTED = "aborted"            # aborted while running: its task is cancelled, winding down
    THREAD_LEFT = "thread_left"    # interrupted, a step's thread still running after its grace
    FINISHING = "finishing"        # a write that may end the claim is in flight (settle, park)
    SETTLING = "settling"          # its settlement is in the batch being written: slot free
    SETTLED = "settled"            # its settlement is committed
    SUSPENDED = "suspended"        # durably yielded (sleeping, waiting): the store says so
    RELEASED = "released"          # interrupted, its claim released for another instance
    LEFT = "left"                  # interrupted with a step's thread running: left to its lease
    LOST = "lost"                  # its lease was lost: another instance may hold the run
    STORE_FAILED = "store_failed"  # the store refused the engine's own write


S = ExecState
# Where the workflow's code may still run, and so raise or return, which ends the execution:
# after an abort too, and after a durable yield whose Suspended it caught (a BaseException)
_CODE = frozenset({S.RUNNING, S.ABORTED, S.THREAD_LEFT, S.SUSPENDED})

# transition: (the states it is allowed from, the state it leads to)
TRANSITIONS: dict[str, tuple[frozenset[ExecState], ExecState]] = {
    "start": (frozenset({S.CLAIMED}), S.RUNNING),
    # the abort of a claimed or running execution; in any other state it is only recorded
    "abort": (frozenset({S.CLAIMED, S.RUNNING}), S.ABORTED),
    "leave_thread": (frozenset({S.ABORTED}), S.THREAD_LEFT),
    # begin writing an end (again while one is written: an end asked for twice)
    "finish": (_CODE | {S.FINISHING}, S.FINISHING),
    "go_on": (frozenset({S.FINISHING}), S.RUNNING),         # the write did not end the claim
    "go_on_aborted": (frozenset({S.FINISHING}), S.ABORTED),  # ... and an abort came meanwhile
    "settling": (frozenset({S.FINISHING}), S.SETTLING),
    "settle_failed": (frozenset({S.SETTLING}), S.FINISHING),  # the batch's write raised
    "settled": (frozenset({S.SETTLING}), S.SETTLED),
    "suspend": (frozenset({S.FINISHING}), S.SUSPENDED),
    "release": (frozenset({S.FINISHING}), S.RELEASED),
    "abandon": (frozenset({S.THREAD_LEFT}), S.LEFT),
    "lose": (_CODE | {S.FINISHING, S.SETTLING}, S.LOST),
    "store_failed": (_CODE | {S.FINISHING}, S.STORE_FAILED),
}

# "finishing" as renewals, the lease watchdog and an abort see it: an end is being written, or
# was (the execution is on its way out): not renewed, and an abort does not cancel its task
ENDING = frozenset({S.FINISHING, S.SETTLING, S.SETTLED, S.SUSPENDED, S.RELEASED, S.LEFT,
                    S.STORE_FAILED})
# the slot is free for a claim (unless a step's thread still runs): the settlement is committed,
# or is in the write that claims runs for the slots it frees (they commit together)
SLOT_FREE = frozenset({S.SETTLING, S.SETTLED})


class TransitionError(RuntimeError):
    """A transition asked of an execution in a state it is not allowed from: a bug in shoal."""

    def __init__(self, transition: str, state: ExecState, run_id: str) -> None:
        allowed, to = TRANSITIONS[transition]
        super().__init__(
            f"shoal bug: execution of run {run_id}: transition {transition!r} "
            f"({state.value} -> {to.value}) is not allowed from {state.value} (only from "
            f"{', '.join(sorted(s.value for s in allowed))}); please report it")
        self.transition = transition
        self.state = state
