"""Membership behind ``app.slots`` and ``app.on_assigned``.

Every instance heartbeats every ``interval``. The store keeps the roster (members that joined at
least two intervals ago) and its generation; a member acts on an assignment ``(i, n)`` of a
generation only after the store recorded that it holds it, and the store grants a generation only
when no other member still holds another one. A member that sees a new generation lets go of its
assignment (slots answer None, listeners hear None) *before* it tells the store, and a member
that cannot reach the store lets go two intervals after its last confirmed heartbeat, one
interval before its row ends. So a slot is never owned by two replicas at once (invariant 8),
even while they join, leave, crash or lose the store; it may be owned by none for a moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shoal.clock import Clock
from shoal.coord.base import CoordStore
from shoal.coord.lock import first_of

log = logging.getLogger("shoal")


@dataclass(frozen=True)
class Assignment:
    """This replica is number ``i`` of ``n``: of ``total`` slots it owns i, i+n, i+2n, …"""

    i: int
    n: int

    def slots(self, total: int) -> list[int]:
        return list(range(self.i, total, self.n))


Listener = Callable[[Assignment | None], Any]


class Membership:
    """One instance's membership: heartbeats, the assignment it holds, and its listeners."""

    def __init__(self, coord: CoordStore, clock: Clock, namespace: str, instance_id: str,
                 interval: float, observers: list[Any]) -> None:
        self.coord = coord
        self.clock = clock
        self.namespace = namespace
        # an incarnation of its own: a restarted instance with the same id is another member,
        # so the row of a frozen predecessor keeps its slots until that row ends
        self.member = f"{instance_id}/{secrets.token_hex(4)}"
        self.interval = interval
        self._observers = observers
        self._assignment: Assignment | None = None
        self._generation: int | None = None     # the generation the store says we hold
        self._valid_until = 0.0                 # act on the assignment only before this
        self._listeners: list[Listener] = []
        self._broken = False
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._unreachable = False

    @property
    def assignment(self) -> Assignment | None:
        if self._broken or self._assignment is None:
            return None
        if self.clock.now() >= self._valid_until:
            return None
        return self._assignment

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"shoal-members-{self.namespace}")

    async def stop(self) -> None:
        """Let go of the assignment, then leave the roster (others rebalance at once)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        self._set(None)
        self._generation = None
        try:
            await asyncio.wait_for(self.coord.leave(self.namespace, self.member), 2.0)
        except Exception as e:
            log.warning("membership.leave_failed: %s: %s; the row ends by itself",
                        type(e).__name__, e, extra={"event": "membership.leave_failed"})

    def on_assigned(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        self._call(listener, self.assignment)

        def off() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return off

    # -- the heartbeat loop ----------------------------------------------------------------

    async def _run(self) -> None:
        while not self._broken:
            delay = await self._beat()
            if delay > 0:
                await self._sleep(delay)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but let go of the assignment the moment it stops being valid."""
        if self._assignment is not None:
            until_invalid = self._valid_until - self.clock.now()
            if until_invalid < seconds:
                await self.clock.sleep(max(0.0, until_invalid))
                self._expire()
                seconds -= max(0.0, until_invalid)
        await self.clock.sleep(max(0.0, seconds))

    def _expire(self) -> None:
        if self._assignment is not None and self.clock.now() >= self._valid_until:
            log.warning("membership.expired: no heartbeat confirmed for %g s; owning nothing "
                        "until the store answers", 2 * self.interval,
                        extra={"event": "membership.expired"})
            self._set(None)
            self._generation = None

    async def _beat(self) -> float:
        """One heartbeat; returns how long to wait before the next."""
        sent = self.clock.now()
        held = self._generation
        call = asyncio.ensure_future(self.coord.heartbeat(
            self.namespace, self.member, held, sent, 3 * self.interval, 2 * self.interval))
        try:
            answered = await first_of(call, self.clock, self.interval)
            if not answered:
                raise TimeoutError(f"no answer within {self.interval:g} s")
            view = call.result()
        except Exception as e:
            if not self._unreachable:
                log.warning("membership.unavailable: %s: %s", type(e).__name__, e,
                            extra={"event": "membership.unavailable"})
            self._unreachable = True
            self._expire()
            return min(self.interval / 5, 1.0)
        if self._unreachable:
            log.info("membership.available", extra={"event": "membership.available"})
            self._unreachable = False
        if held is not None and (view.generation != held or self.member not in view.members):
            # let go first, then say so (at once: the others wait for it)
            self._set(None)
            self._generation = None
            return 0.0
        if view.granted:
            self._generation = view.generation
            self._valid_until = sent + 2 * self.interval
            self._set(Assignment(view.members.index(self.member), len(view.members)))
            return self.interval
        if held is not None:   # cannot happen by the protocol; never act on a doubt
            self._set(None)
            self._generation = None
            return 0.0
        # on the roster but others still hold an older generation: ask again soon
        return self.interval / 5 if self.member in view.members else self.interval

    def _set(self, assignment: Assignment | None) -> None:
        before = self._assignment
        self._assignment = assignment
        if assignment == before:
            return
        log.info("membership.assigned: %s", assignment, extra={"event": "membership.assigned"})
        for listener in list(self._listeners):
            self._call(listener, assignment)
        for observer in self._observers:
            fn = getattr(observer, "on_slots_assigned", None)
            if fn is not None:
                try:
                    result = fn(assignment)
                    if inspect.isawaitable(result):
                        task = asyncio.ensure_future(result)
                        self._pending.add(task)
                        task.add_done_callback(self._pending.discard)
                except Exception:
                    log.exception("observer.failed: %s.on_slots_assigned",
                                  type(observer).__name__, extra={"event": "observer.failed"})

    def _call(self, listener: Listener, assignment: Assignment | None) -> None:
        try:
            result = listener(assignment)
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                self._pending.add(task)
                task.add_done_callback(self._listener_done)
        except Exception as e:
            self._break(listener, e)

    def _listener_done(self, task: asyncio.Future[Any]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._break(None, task.exception())

    def _break(self, listener: Listener | None, error: BaseException | None) -> None:
        """A listener raised: own nothing from now on and leave, so the others take over."""
        if self._broken:
            return
        self._broken = True
        log.error("membership.listener_failed: %r raised %r; this replica owns no slots from now "
                  "on", listener, error, extra={"event": "membership.listener_failed"})
        self._assignment = None
        self._generation = None
        try:
            task = asyncio.ensure_future(self._leave_after_break())
        except RuntimeError:   # no event loop: not started, so nothing to leave
            return
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _leave_after_break(self) -> None:
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        with contextlib.suppress(Exception):
            await self.coord.leave(self.namespace, self.member)
