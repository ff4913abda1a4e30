"""The shape of a maintenance service: one small loop with its own interval and its own failure
handling, started and stopped with the others (see :class:`~shoal.maintenance.Maintenance`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from shoal._tasks import cancel_and_wait, really_cancelled, report
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


class Service:
    """A pass every ``interval`` seconds of the app's clock, the first one at start. A pass that
    raises is reported and the loop goes on; one that never returns leaves ``last_loop_at``
    behind, which liveness notices. Subclasses implement :meth:`run_once`."""

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

    async def run_once(self) -> None:
        """One pass; raises when it failed."""
        raise NotImplementedError

    async def pass_once(self) -> None:
        """One pass now, its failure reported rather than raised."""
        try:
            await self.run_once()
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
            await self.clock.sleep(self.interval)

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
        """Seconds since the last pass came back (or since start)."""
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
            try:
                await self.run_once()
            except Exception as e:
                log.warning("%s.failed: %s: %s", self.name, type(e).__name__, e,
                            extra={"event": f"{self.name}.failed"})
            if not self._again:
                return

    async def pass_once(self) -> None:
        self.trigger()
        self.last_loop_at = self.clock.now()

    async def stop(self) -> None:
        await super().stop()
        task, self._pass = self._pass, None
        for timer in [*self._timers, *([task] if task is not None else [])]:
            await cancel_and_wait(timer)
        self._timers.clear()


Pass = Callable[[], Awaitable[None]]
