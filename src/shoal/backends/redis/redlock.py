"""Redlock: locks held by a majority of independent Redis servers.

With one Redis server, a restart or a failover of that server can forget a lock and let two
holders in. :class:`Redlock` asks an odd number of independent servers (not the nodes of one
cluster) and counts a lock as held only when a majority granted it, so losing a minority of the
servers (stopped, unreachable, restarted empty) loses no lock. Membership (slots), meters and
rate limits use the first server only.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from typing import TypeVar

from shoal.backends.redis.store import RedisCoordStore
from shoal.errors import ConfigurationError, StoreUnavailableError
from shoal.ports import LockWatch
from shoal.types import (
    Admitted,
    CoordinationView,
    CounterResult,
    LockGrant,
    LockState,
    LockWait,
    MemberView,
    Need,
    RateView,
    Refused,
    SlotBusy,
    SlotGrant,
    SpendEntry,
    WindowResult,
)

T = TypeVar("T")


_QUORUM_GRACE = 0.05   # seconds a woken waiter waits for a majority of servers to name it


class _QuorumWatch:
    """Woken when a majority of the servers' watches are, or a moment after the first one is.

    One release reaches every server at about the same time, and each server names its own next
    waiter: asking as soon as the first server did could find the others not released yet, and
    a grant from a minority is a split vote (given back, asked again after a random delay, the
    place in that server's queue lost). A waiter that only some servers name (their queues are
    in different orders) asks after the grace all the same."""

    def __init__(self, watches: Sequence[LockWatch], quorum: int) -> None:
        self._watches = watches
        self._quorum = quorum

    async def wait(self) -> None:
        tasks = [asyncio.ensure_future(w.wait()) for w in self._watches]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            loop = asyncio.get_running_loop()
            until = loop.time() + _QUORUM_GRACE
            while len(done) < min(self._quorum, len(tasks)) and loop.time() < until:
                # the pending ones only: a done task would end every round at once (a spin)
                await asyncio.wait([t for t in tasks if not t.done()],
                                   timeout=until - loop.time(),
                                   return_when=asyncio.FIRST_COMPLETED)
                done = {t for t in tasks if t.done()}
        finally:
            # a wait cancelled after its event was set leaves the event set: the change is
            # then seen by the next wait, never lost
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


class Redlock:
    """A :class:`~shoal.ports.CoordStore` over an odd number of independent Redis servers.

    - ``lock_acquire`` asks every server at once and grants only with a grant from a majority.
      The token is then the largest of the granted tokens, and each granting server's fencing
      counters are raised to it (a majority of those must succeed), so any later majority grant,
      which meets one of them, takes a larger token: tokens strictly increase across grants.
      Without a majority, the partial grants are released and the answer is a :class:`LockWait`
      whose ``ticket`` is the smallest of the servers' tickets.
    - FIFO between waiters is best effort: each server queues in its own ticket order, and two
      waiters can come first on different servers. A split like that is resolved by releasing
      the partial grants, and pausing a random 20-200 ms (real time) before answering: the
      contenders of a split ask again out of step.
    - A server that cannot be reached counts as a refusal, not an error. If no majority can be
      reached at all, ``lock_acquire`` raises StoreUnavailableError (having given back what a
      minority granted: the caller retries, and gives up once that has lasted a lease) and
      ``lock_renew`` raises StoreUnavailableError (the caller retries while its lease lasts,
      then reports the lock lost).
    - ``lock_renew`` is True only when a majority renewed, False when a majority refused;
      ``lock_release`` releases on every
      server it can reach; ``lock_watch`` wakes when a majority of the servers named the waiter
      as next in line, or a moment (50 ms) after the first one did.
    - ``heartbeat``, ``leave``, ``meter``, ``ping`` and the rate limits (a
      :class:`~shoal.ports.RateStore`) use the first server only (slots, meters and rate
      limits are not replicated).
    """

    def __init__(self, stores: Sequence[RedisCoordStore]) -> None:
        if not stores or len(stores) % 2 == 0:
            raise ConfigurationError(
                f"Atomicity takes an odd number of addresses, {len(stores)} given.")
        self.stores = list(stores)
        self.quorum = len(self.stores) // 2 + 1

    def __repr__(self) -> str:
        return f"Redlock({[s.address for s in self.stores]!r})"

    async def open(self) -> None:
        """Open every server's store (connections are lazy: this succeeds while they are down)."""
        await asyncio.gather(*(s.open() for s in self.stores))

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.stores))

    async def _each(
        self, stores: Sequence[RedisCoordStore], call: Callable[[RedisCoordStore], Awaitable[T]]
    ) -> list[T | StoreUnavailableError]:
        """Call every store at once; an unreachable one answers its StoreUnavailableError."""
        answers = await asyncio.gather(*(call(s) for s in stores), return_exceptions=True)
        out: list[T | StoreUnavailableError] = []
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(
                answer, StoreUnavailableError
            ):
                raise answer
            out.append(answer)
        return out

    # -- locks ---------------------------------------------------------------------------------

    async def lock_acquire(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> LockGrant | LockWait:
        answers = await self._each(
            self.stores, lambda s: s.lock_acquire(namespace, keys, holder, lease, now))
        granted = [(s, a) for s, a in zip(self.stores, answers, strict=True)
                   if isinstance(a, LockGrant)]
        waits = [a for a in answers if isinstance(a, LockWait)]
        if len(granted) >= self.quorum:
            token = max(g.token for _, g in granted)
            raised = await self._each(
                [s for s, _ in granted], lambda s: s.raise_fence(namespace, keys, token))
            if sum(not isinstance(r, StoreUnavailableError) for r in raised) >= self.quorum:
                return LockGrant(token, min(g.expires_at for _, g in granted))
        answered = len(granted) + len(waits)
        if granted:
            # a split vote (or a failed raise, or too few answers): give the partial grants back
            # (and whatever an unanswered server may have granted), keep the places in the
            # other servers' queues, and ask again shortly
            back = [s for s, a in zip(self.stores, answers, strict=True)
                    if not isinstance(a, LockWait)]
            await self._each(back, lambda s: s.lock_release(namespace, keys, holder))
        if answered < self.quorum:
            # like a single store that cannot be reached: the caller retries, and gives up
            # after a lease of this
            raise StoreUnavailableError(
                f"Redlock: only {answered} of {len(self.stores)} servers answered the lock "
                f"request for {list(keys)}; a majority ({self.quorum}) is needed.")
        if granted:
            # A split vote: contenders that split were woken by the same release and would ask
            # again in lockstep (each woken at once by the next release), splitting again. A
            # random pause here, before the answer, puts them out of step; then ask at once.
            await asyncio.sleep(random.uniform(0.02, 0.2))
        retry_at = now if granted else min(w.retry_at for w in waits)
        ticket = min((w.ticket for w in waits), default=0)
        return LockWait(ticket, retry_at)

    async def lock_renew(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> bool:
        answers = await self._each(
            self.stores, lambda s: s.lock_renew(namespace, keys, holder, lease, now))
        if sum(a is True for a in answers) >= self.quorum:
            return True
        if sum(a is False for a in answers) > len(self.stores) - self.quorum:
            return False      # a majority is not ours any more: no way back
        # too few answered to tell: like a single store that cannot be reached, the caller
        # retries while its lease lasts (a short blip does not lose the lock)
        raise StoreUnavailableError(
            f"Redlock: only {sum(not isinstance(a, StoreUnavailableError) for a in answers)} of "
            f"{len(self.stores)} servers answered the renewal of {list(keys)}; a majority "
            f"({self.quorum}) is needed.")

    async def lock_release(self, namespace: str, keys: Sequence[str], holder: str) -> None:
        await self._each(self.stores, lambda s: s.lock_release(namespace, keys, holder))

    @asynccontextmanager
    async def lock_watch(
        self, namespace: str, keys: Sequence[str], holder: str
    ) -> AsyncIterator[LockWatch]:
        async with AsyncExitStack() as stack:
            watches = await asyncio.gather(*(
                stack.enter_async_context(s.lock_watch(namespace, keys, holder))
                for s in self.stores))
            yield _QuorumWatch(watches, self.quorum)

    # -- membership and meters: the first server -----------------------------------------------

    async def heartbeat(
        self,
        namespace: str,
        member: str,
        held: int | None,
        now: float,
        ttl: float,
        warmup: float,
        *,
        version: str | None = None,
    ) -> MemberView:
        return await self.stores[0].heartbeat(namespace, member, held, now, ttl, warmup,
                                              version=version)

    async def leave(self, namespace: str, member: str) -> None:
        await self.stores[0].leave(namespace, member)

    async def meter(
        self, namespace: str, keys: Sequence[str], deltas: Sequence[float], now: float
    ) -> list[float]:
        return await self.stores[0].meter(namespace, keys, deltas, now)

    async def ping(self) -> None:
        await self.stores[0].ping()

    async def coordination_view(
        self, namespace: str, now: float, limit: int = 100
    ) -> CoordinationView:
        """Members, the roster and meters as the first server has them; locks as a majority
        of the servers has them: a key's holder is the one a majority names (with the earliest
        lease end among them), its token the largest any server gave, its waiters as the first
        server to answer queues them. Raises StoreUnavailableError when the first server or a
        majority cannot be reached. Each server is read as
        :meth:`RedisCoordStore.coordination_view` reads it (``complete`` is False if any
        server's walk was cut)."""
        answers = await self._each(self.stores,
                                   lambda s: s.coordination_view(namespace, now, limit))
        views = [a for a in answers if isinstance(a, CoordinationView)]
        first = answers[0]
        if not isinstance(first, CoordinationView) or len(views) < self.quorum:
            raise StoreUnavailableError(
                f"Redlock: {len(views)} of {len(self.stores)} servers answered the "
                f"coordination view (the first server and a majority, {self.quorum}, are "
                f"needed).")
        keys = sorted({lock.key for v in views for lock in v.locks})
        locks = []
        for key in keys:
            seen = [lock for v in views for lock in v.locks if lock.key == key]
            votes: dict[str, list[float]] = {}
            for lock in seen:
                if lock.holder is not None and lock.expires_at is not None:
                    votes.setdefault(lock.holder, []).append(lock.expires_at)
            holder = next((h for h, ends in votes.items() if len(ends) >= self.quorum), None)
            locks.append(LockState(key, max(lock.token for lock in seen), holder,
                                   min(votes[holder]) if holder is not None else None,
                                   seen[0].waiters))
        live = [lock for lock in locks if lock.holder is not None or lock.waiters]
        return replace(first, locks=tuple(live[:limit]),
                       complete=all(v.complete for v in views) and len(live) <= limit)

    async def prune_coordination(self, namespace: str, before: float, limit: int) -> int:
        """The first server's (which holds meters and membership); the lock keys on every
        server expire by themselves, as the first server's do."""
        return await self.stores[0].prune_coordination(namespace, before, limit)

    # -- rate limits: the first server ---------------------------------------------------------
    #
    # Slots, windows, pauses, counters and the cost ledger live on the first server only, like
    # membership and meters: they are not replicated, and a majority vote would not make them
    # safer (a counter or window on a minority that forgot would be wrong either way).

    async def slot_acquire(
        self, namespace: str, key: str, holder: str, max_slots: int, lease: float, now: float
    ) -> SlotGrant | SlotBusy:
        return await self.stores[0].slot_acquire(namespace, key, holder, max_slots, lease, now)

    async def slot_renew(
        self, namespace: str, key: str, holder: str, lease: float, now: float
    ) -> bool:
        return await self.stores[0].slot_renew(namespace, key, holder, lease, now)

    async def slot_release(self, namespace: str, key: str, holder: str) -> None:
        await self.stores[0].slot_release(namespace, key, holder)

    async def admit(
        self, namespace: str, holder: str, needs: Sequence[Need], now: float
    ) -> Admitted | Refused:
        return await self.stores[0].admit(namespace, holder, needs, now)

    async def window_add(
        self, namespace: str, key: str, amount: float, window: float, limit: float | None,
        now: float,
    ) -> WindowResult:
        return await self.stores[0].window_add(namespace, key, amount, window, limit, now)

    async def window_clear(self, namespace: str, key: str) -> None:
        await self.stores[0].window_clear(namespace, key)

    async def pause_until(self, namespace: str, key: str, until: float, now: float) -> float:
        return await self.stores[0].pause_until(namespace, key, until, now)

    async def paused_until(self, namespace: str, key: str, now: float) -> float | None:
        return await self.stores[0].paused_until(namespace, key, now)

    async def read_rates(
        self, namespace: str, now: float, *, slots: Sequence[str] = (),
        windows: Sequence[tuple[str, float]] = (), pauses: Sequence[str] = (),
        counters: Sequence[str] = (),
    ) -> RateView:
        return await self.stores[0].read_rates(namespace, now, slots=slots, windows=windows,
                                               pauses=pauses, counters=counters)

    async def counter_add(
        self,
        namespace: str,
        keys: Sequence[str],
        amounts: Sequence[float],
        limits: Sequence[float | None],
        now: float,
        entry: SpendEntry | None = None,
    ) -> CounterResult:
        return await self.stores[0].counter_add(namespace, keys, amounts, limits, now, entry)

    async def ledger(
        self, namespace: str, tenant: str | None = None, root_id: str | None = None,
        limit: int = 1000, *, after: int | None = None, run_id: str | None = None,
        since: float | None = None, until: float | None = None,
    ) -> list[SpendEntry]:
        return await self.stores[0].ledger(namespace, tenant, root_id, limit, after=after,
                                           run_id=run_id, since=since, until=until)

    async def prune_rates(self, namespace: str, before: float, limit: int) -> int:
        return await self.stores[0].prune_rates(namespace, before, limit)
