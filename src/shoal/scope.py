"""Which run the current task works for, for code below the engine that must know it without
depending on the engine: a provider call charges the run's budget and tenant. The engine sets
:data:`current_run` in each run's task (and a step's thread inherits it); anything may read it.
A leaf module: it imports nothing of shoal."""

from __future__ import annotations

import contextvars
from typing import Protocol


class RunScope(Protocol):
    """What is known of the run a piece of code works for."""

    @property
    def run_id(self) -> str: ...

    @property
    def root_id(self) -> str: ...

    @property
    def tenant(self) -> str: ...


current_run: contextvars.ContextVar[RunScope | None] = contextvars.ContextVar(
    "shoal_current_run", default=None)


def outside_run() -> contextvars.Context:
    """A copy of the current context in which no run is current: for a task that a run's code
    starts but that works for no run (the engine's settlement writer, a maintenance pass, a
    timer). It neither charges that run's budget nor keeps the run's objects alive after the
    run ended."""
    context = contextvars.copy_context()
    context.run(current_run.set, None)
    return context
