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
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from shoal._tasks import first_of
from shoal.clock import Clock
from shoal.ports import CoordStore
from shoal.types import MemberView

log = logging.getLogger("shoal")


@dataclass(frozen=True)
class Assignment:
    """This replica is number ``i`` of ``n``: of ``total`` slots it owns i, i+n, i+2n, …"""

    i: int
    n: int

    def slots(self, total: int) -> list[int]:
        return list(range(self.i, total, self.n))


Listener = Callable[[Assignment | None], Any]


class _Subscription:
    """A listener, what it last heard, and its calls still running (an async listener's calls
    run one after the other, in order)."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.heard: Assignment | None = None
        self.called = False
        self.chain: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        return self.chain is not None and not self.chain.done()


class Membership:
    """One instance's membership: heartbeats, the assignment it holds, and its listeners.

    What this member reports as held (the store grants nobody a new generation meanwhile) is the
    generation it acts on, and after it lets go, that generation again until every listener has
    finished hearing None (an async listener stopping its workers)."""

    def __init__(self, coord: CoordStore, clock: Clock, namespace: str, instance_id: str,
                 interval: float, observers: list[Any], version: str | None = None) -> None:
        self.coord = coord
        self.clock = clock
        self.namespace = namespace
        # an incarnation of its own: a restarted instance with the same id is another member,
        # so the row of a frozen predecessor keeps its slots until that row ends
        self.member = f"{instance_id}/{secrets.token_hex(4)}"
        self.instance_id = instance_id
        self.interval = interval
        self.version = version          # the code version, shown by consoles beside the member
        self._observers = observers
        self._assignment: Assignment | None = None
        self._generation: int | None = None     # the generation the store says we hold
        self._letting_go: int | None = None     # dropped, but listeners are still letting go
        self._valid_until = 0.0                 # act on the assignment only before this
        self._subscriptions: list[_Subscription] = []
        self._broken = False
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight: asyncio.Future[MemberView] | None = None
        self._changed = asyncio.Event()         # wakes the validity watchdog
        # a confirmed heartbeat, and the loop asleep until the next (never past the validity);
        # the watchdog has nothing to watch until a heartbeat waits on the store or fails
        self._renewed = False
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
        if not self._tasks and not self._broken:
            self._tasks = [
                asyncio.create_task(self._run(), name=f"shoal-members-{self.namespace}"),
                asyncio.create_task(self._watchdog(), name=f"shoal-members-watch-{self.namespace}"),
            ]

    def _fields(self, event: str) -> dict[str, Any]:
        """``extra=`` of a record of this instance's."""
        return {"event": event, "instance": self.instance_id}

    async def stop(self) -> None:
        """Let go of the assignment, let the listeners finish, then leave the roster (the others
        rebalance at once)."""
        await self._cancel_tasks()
        self._let_go()
        await self._listeners_done(self.interval)
        try:
            await asyncio.wait_for(self.coord.leave(self.namespace, self.member), 2.0)
        except Exception as e:
            log.warning("membership.leave_failed: %s: %s; the row ends by itself",
                        type(e).__name__, e, extra=self._fields("membership.leave_failed"))

    async def _cancel_tasks(self) -> None:
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        self._tasks = []
        for task in tasks:
            task.cancel()
        if tasks:
            # not suppress(BaseException): that would also swallow a cancel of the caller
            await asyncio.wait(tasks)

    async def _listeners_done(self, timeout: float) -> None:
        chains = [s.chain for s in self._subscriptions if s.chain is not None and s.busy]
        if chains:
            await asyncio.wait(chains, timeout=timeout)

    def on_assigned(self, listener: Listener) -> Callable[[], None]:
        subscription = _Subscription(listener)
        self._subscriptions.append(subscription)
        self._call(subscription, self.assignment)

        def off() -> None:
            with contextlib.suppress(ValueError):
                self._subscriptions.remove(subscription)

        return off

    # -- the heartbeat loop ----------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while not self._broken:
                delay = await self._beat()
                if delay > 0:
                    await self.clock.sleep(delay)
        finally:
            self._arm()   # however the loop ended, the watchdog lets go when the validity ends

    async def _watchdog(self) -> None:
        """Let go the moment the assignment stops being valid, whatever the loop is waiting on
        (a heartbeat that does not come back, a store that does not answer). While heartbeats
        are confirmed at once the loop renews before the validity ends (it sleeps one interval
        of two), so the watchdog sleeps until a heartbeat waits or fails (:meth:`_arm`):
        an idle member wakes once per heartbeat, not twice."""
        while True:
            self._changed.clear()
            if self._assignment is None or self._renewed:
                await self._changed.wait()
                continue
            delay = self._valid_until - self.clock.now()
            if delay <= 0:
                log.warning("membership.expired: no heartbeat confirmed for %g s; owning nothing "
                            "until the store answers", 2 * self.interval,
                            extra=self._fields("membership.expired"))
                self._let_go()
                continue
            await first_of(self._changed.wait(), self.clock, delay)

    def _arm(self) -> None:
        """A heartbeat waits on the store, or failed: the watchdog watches the validity."""
        if self._renewed:
            self._renewed = False
            self._changed.set()

    def _let_go(self) -> None:
        """Stop acting on the assignment (listeners hear None) before the store hears of it."""
        if self._generation is not None:
            self._letting_go = self._generation
            self._generation = None
        self._set(None)

    def _held(self) -> int | None:
        """What to report as held: what we act on, or still let go of."""
        if self._generation is not None:
            return self._generation
        if self._letting_go is not None and any(s.busy for s in self._subscriptions):
            return self._letting_go
        self._letting_go = None
        return None

    def _at_once(self) -> bool:
        """The store's heartbeat answers within the call (a store in this process's memory):
        no task, no timer. Its own class's heartbeat only: a wrapper, or one replaced on the
        object (a test's stall), may wait, and goes the long way."""
        kind = type(self.coord)
        method = getattr(self.coord.heartbeat, "__func__", None)
        return getattr(kind, "answers_at_once", False) and method is kind.heartbeat

    async def _beat(self) -> float:
        """One heartbeat; returns how long to wait before the next."""
        if self._inflight is not None and not self._inflight.done():
            # never a second heartbeat beside one still in flight: a late one must not land
            # after (and undo) a newer one
            self._arm()
            await first_of(asyncio.shield(self._inflight), self.clock, self.interval)
            if not self._inflight.done():
                return 0.0
        sent = self.clock.now()
        held = self._held()
        beat = self.coord.heartbeat(self.namespace, self.member, held, sent, 3 * self.interval,
                                    2 * self.interval, version=self.version)
        call: asyncio.Future[MemberView] | None = None
        try:
            if self._at_once():
                view = await beat
            else:
                self._inflight = call = asyncio.ensure_future(beat)
                # one turn lets a store that answers without waiting answer: no timer
                await asyncio.sleep(0)
                if not call.done():
                    self._arm()
                    left = self.interval - (self.clock.now() - sent)
                    if not await first_of(asyncio.shield(call), self.clock, left):
                        raise TimeoutError(f"no answer within {self.interval:g} s")
                view = call.result()
        except Exception as e:
            self._arm()
            if call is not None and not call.done():
                call.add_done_callback(_retrieve)
            if not self._unreachable:
                log.warning("membership.unavailable: %s: %s", type(e).__name__, e,
                            extra=self._fields("membership.unavailable"))
            self._unreachable = True
            return min(self.interval / 5, 1.0)
        if self._unreachable:
            log.info("membership.available", extra=self._fields("membership.available"))
            self._unreachable = False
        if self._broken:
            return 0.0
        if self._generation is not None and (view.generation != self._generation
                                             or self.member not in view.members):
            self._let_go()            # first let go, then say so (at once: others wait for it)
            return 0.0
        if view.granted:
            self._generation = view.generation
            self._letting_go = None
            self._valid_until = sent + 2 * self.interval
            if self.clock.now() < self._valid_until:   # not an answer that came too late
                self._set(Assignment(view.members.index(self.member), len(view.members)))
            if not self._renewed:
                # answered within the interval, the next heartbeat comes before the validity
                # ends: nothing to watch (else the watchdog watches the new validity)
                self._renewed = self.clock.now() < sent + self.interval
                self._changed.set()
            return self.interval
        if self._generation is not None:   # cannot happen by the protocol; never act on a doubt
            self._let_go()
            return 0.0
        if held is not None:
            # listeners still letting go of an older generation: keep the row alive (held) on
            # the app's clock while they finish, then say so
            chains = [s.chain for s in self._subscriptions if s.chain is not None and s.busy]
            if chains:
                await first_of(asyncio.wait(chains), self.clock, self.interval / 5)
            return 0.0
        # on the roster but others still hold an older generation: ask again soon
        return self.interval / 5 if self.member in view.members else self.interval

    # -- listeners -------------------------------------------------------------------------

    def _set(self, assignment: Assignment | None) -> None:
        if self._broken:
            assignment = None
        if assignment == self._assignment:
            return
        self._assignment = assignment
        self._changed.set()
        log.info("membership.assigned: %s", assignment, extra=self._fields("membership.assigned"))
        self._deliver(assignment)
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
                                  type(observer).__name__, extra=self._fields("observer.failed"))

    def _deliver(self, assignment: Assignment | None) -> None:
        for subscription in list(self._subscriptions):
            if self._broken and assignment is not None:
                return        # a listener raised: the others hear None instead (from _break)
            if subscription.called and subscription.heard == assignment:
                continue
            self._call(subscription, assignment)

    def _call(self, subscription: _Subscription, assignment: Assignment | None) -> None:
        subscription.heard, subscription.called = assignment, True
        listener = subscription.listener
        if subscription.busy:     # after its earlier calls, in order
            previous = subscription.chain

            async def later() -> None:
                if previous is not None:
                    await asyncio.wait([previous])
                result = listener(assignment)
                if inspect.isawaitable(result):
                    await result

            self._chain(subscription, later())
            return
        try:
            result = listener(assignment)
        except Exception as e:
            self._break(listener, e)
            return
        if inspect.isawaitable(result):
            self._chain(subscription, _awaited(result))

    def _chain(self, subscription: _Subscription, work: Coroutine[Any, Any, None]) -> None:
        try:
            task = asyncio.ensure_future(work)
        except RuntimeError:       # no event loop running: nothing can run it
            work.close()
            return
        subscription.chain = task
        task.add_done_callback(lambda t: self._listener_done(subscription.listener, t))

    def _listener_done(self, listener: Listener, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._break(listener, task.exception())

    def _break(self, listener: Listener | None, error: BaseException | None) -> None:
        """A listener raised: own nothing from now on (every listener hears None), then leave
        once they have let go, so the others take over."""
        if self._broken:
            return
        self._broken = True
        log.error("membership.listener_failed: %r raised %r; this replica owns no slots from now "
                  "on", listener, error, extra=self._fields("membership.listener_failed"))
        if self._generation is not None:
            self._letting_go = self._generation
            self._generation = None
        self._assignment = None
        self._changed.set()
        self._deliver(None)
        try:
            task = asyncio.ensure_future(self._leave_after_break())
        except RuntimeError:   # no event loop: not started, so nothing to leave
            return
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _leave_after_break(self) -> None:
        await self._cancel_tasks()
        await self._listeners_done(2 * self.interval)
        with contextlib.suppress(Exception):
            await self.coord.leave(self.namespace, self.member)


async def _awaited(awaitable: Awaitable[Any]) -> None:
    await awaitable


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a late heartbeat's outcome as seen (its answer is stale and ignored)."""
    if not future.cancelled():
        future.exception()
