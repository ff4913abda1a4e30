"""The shape of a maintenance service: one small loop with its own interval and its own failure
handling, started and stopped with the others (see :class:`~shoal.maintenance.Maintenance`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, cast

from shoal._tasks import cancel_and_wait, first_of, really_cancelled, report
from shoal.clock import Clock
from shoal.scope import outside_run

log = logging.getLogger("shoal")


class Reporter:
    """Where a failed pass goes: a warning (event ``poll.failed``, its ``service`` named), and
    the ``app.on_error`` handlers. A store outage fails every service at once; the handlers hear
    of each distinct error (type and message) once per ``every`` seconds, not once per service."""

    def __init__(self, clock: Clock, handlers: Sequence[Callable[[BaseException], Any]],
                 every: float) -> None:
        self._clock = clock
        self._handlers = handlers
        self._every = every
        self._reported: dict[tuple[type[BaseException], str], float] = {}

    async def failed(self, service: str, error: BaseException, event: str = "poll.failed",
                     workflow: str | None = None) -> None:
        fields = {"event": event, "service": service}
        if workflow is not None:
            fields["workflow"] = workflow
        log.warning("%s: %s: %s: %s", event, service, type(error).__name__, error,
                    extra=fields)
        now = self._clock.now()
        key = (type(error), str(error))
        last = self._reported.get(key)
        if last is not None and now - last < self._every:
            return
        if len(self._reported) > 1000:
            self._reported.clear()
        self._reported[key] = now
        await report(self._handlers, error)


class DueWork(Protocol):
    """A store whose every writer is in this process (the memory store) can say when a pass
    could next find work, and when it was written to: a service need not poll it meanwhile."""

    def next_due(self, namespace: str, work: str, now: float, *, run_retention: float = 0.0,
                 pause_retention: float = 0.0) -> float | None: ...

    async def next_write(self) -> None: ...


def due_work(store: object) -> DueWork | None:
    """``store`` itself when its class says when work is due (a wrapper that passes calls on to
    such a store is not: it may fail or stall calls, which only polls would report)."""
    kind = type(store)
    if callable(getattr(kind, "next_due", None)) and callable(getattr(kind, "next_write", None)):
        return cast(DueWork, store)
    return None


class Service:
    """A pass every ``interval`` seconds of the app's clock, the first one at start. A pass that
    raises is reported and the loop goes on; one that never returns leaves ``last_loop_at``
    behind, which liveness notices. Subclasses implement :meth:`run_once`.

    On a store that says when work is due (:class:`DueWork`: the memory store) a service whose
    pass succeeded and found nothing due before its next interval sleeps until something is, or
    until the store is written to, then goes on at its interval: an idle app's day of virtual
    time wakes it a few times, not 8,640."""

    name = "service"
    failure_event = "poll.failed"

    def __init__(self, clock: Clock, interval: float, reporter: Reporter) -> None:
        self.clock = clock
        self.interval = interval
        self.reporter = reporter
        self.started_at = clock.now()
        self.last_loop_at: float | None = None   # the last pass that came back at all
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._due: Callable[[float], float | None] | None = None   # see quiet_on
        self._due_store: DueWork | None = None
        self._pass_failed = False      # the last pass raised
        self._quiet = False       # asleep until work is due

    def quiet_on(self, store: DueWork, due: Callable[[float], float | None]) -> None:
        """Sleep between passes until ``due(now)`` (None: no work until a write) or a write of
        ``store``, rather than every interval."""
        self._due_store, self._due = store, due

    async def run_once(self) -> None:
        """One pass; raises when it failed."""
        raise NotImplementedError

    async def pass_once(self) -> None:
        """One pass now, its failure reported rather than raised."""
        self._pass_failed = True
        try:
            await self.run_once()
            self._pass_failed = False
        except asyncio.CancelledError:
            if really_cancelled():
                raise
            await self.reporter.failed(self.name, RuntimeError("a handler raised CancelledError"),
                                       self.failure_event)
        except Exception as e:
            await self.reporter.failed(self.name, e, self.failure_event)
        # liveness watches the loop, not the store: a pass that failed fast still came back
        # (readiness reports the store); one that never returns does not
        self.last_loop_at = self.clock.now()

    async def _loop(self, first: bool) -> None:
        if not first:
            await self.clock.sleep(self.interval)
        while not self._stopped:
            await self.pass_once()
            await self._rest()

    async def _rest(self) -> None:
        """Until the next pass: an interval; or, when the store says no work is due before
        that (see the class), until some is or the store is written to (then the rest of the
        interval: a write during busy times wakes a service once, not once a write)."""
        last = self.clock.now()
        writes, due = self._due_store, self._due
        if writes is not None and due is not None and await self._succeeded():
            when = due(last)
            if when is None or when > last + self.interval:
                self._quiet = True
                try:
                    if when is None:
                        await writes.next_write()
                        wrote = True
                    else:
                        wrote = await first_of(writes.next_write(), self.clock, when - last)
                finally:
                    self._quiet = False
                    self.last_loop_at = self.clock.now()
                if not wrote:   # work is due
                    return
        await self.clock.sleep(max(0.0, last + self.interval - self.clock.now()))

    async def _succeeded(self) -> bool:
        """The last pass came back without failing."""
        return not self._pass_failed

    def start(self, *, first: bool = True) -> None:
        """Start the loop; with ``first`` False, its first pass is one interval away (the
        caller made one)."""
        self._task = asyncio.create_task(self._loop(first), name=f"shoal-{self.name}")

    async def stop(self) -> None:
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    def stuck_for(self) -> float:
        """Seconds since the last pass came back (or since start); 0 while it sleeps until work
        is due (its last pass came back)."""
        if self._quiet:
            return 0.0
        last = self.last_loop_at if self.last_loop_at is not None else self.started_at
        return self.clock.now() - last


class Triggered(Service):
    """A service whose pass runs in a task of its own, at most one at a time, started every
    ``interval`` and on :meth:`trigger` (work just arrived here), so nothing else waits for it
    (outbox delivery, pause notification). A trigger that comes while a pass runs makes it go
    once more when done: the work may have arrived after it looked. Once stopped, it starts no
    more: a late trigger (a retry's timer, a step writing entries during a drain) is ignored.
    Its failures are logged (``<name>.failed``), not reported: each item it handles has its
    own retry."""

    def __init__(self, clock: Clock, interval: float, reporter: Reporter) -> None:
        super().__init__(clock, interval, reporter)
        self._pass: asyncio.Task[None] | None = None
        self._again = False
        self._timers: set[asyncio.Task[None]] = set()

    def trigger(self) -> None:
        if self._stopped:
            return
        if self._pass is not None and not self._pass.done():
            self._again = True
            return
        # a pass a run's step triggers works for no run
        self._pass = asyncio.create_task(self._run(), name=f"shoal-{self.name}-pass",
                                         context=outside_run())

    def trigger_at(self, when: float) -> None:
        """Trigger a pass at ``when`` (the app's clock): an item is due again then."""
        async def wake() -> None:
            await self.clock.sleep(max(0.0, when - self.clock.now()))
            self.trigger()

        task = asyncio.create_task(wake(), context=outside_run())
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)

    async def _run(self) -> None:
        while True:
            self._again = False
            self._pass_failed = True
            try:
                await self.run_once()
                self._pass_failed = False
            except Exception as e:
                log.warning("%s.failed: %s: %s", self.name, type(e).__name__, e,
                            extra={"event": f"{self.name}.failed"})
            if not self._again:
                return

    async def _succeeded(self) -> bool:
        """The pass just triggered came back, within an interval, without failing (one still
        running after that: not known, so not quiet)."""
        task = self._pass
        if task is None:
            return not self._pass_failed
        if not task.done() and not await first_of(asyncio.shield(task), self.clock,
                                                  self.interval):
            return False
        return not task.cancelled() and not self._pass_failed

    async def pass_once(self) -> None:
        self._pass_failed = False
        self.trigger()
        self.last_loop_at = self.clock.now()

    async def stop(self) -> None:
        await super().stop()
        task, self._pass = self._pass, None
        for timer in [*self._timers, *([task] if task is not None else [])]:
            await cancel_and_wait(timer)
        self._timers.clear()


Pass = Callable[[], Awaitable[None]]
