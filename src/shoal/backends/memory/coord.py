"""The in-memory coordination store: the reference semantics of :mod:`shoal.ports`.

Every method runs without an await between its reads and writes, so each is atomic on the event
loop. :class:`MemoryStore` inherits it, so ``memory://`` apps of one process coordinate together.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from shoal.backends._watches import EventWatch, WatchRegistry
from shoal.types import (
    CoordinationView,
    LockGrant,
    LockState,
    LockWait,
    LockWaiter,
    MemberState,
    MemberView,
    MeterState,
)


@dataclass
class _Key:
    token: int = 0                    # the fencing counter: the last token granted
    holder: str | None = None
    expires_at: float = 0.0
    waiters: dict[str, tuple[int, float]] = field(default_factory=dict)  # holder -> ticket, until


@dataclass
class _Member:
    joined_at: float
    expires_at: float
    held: int | None
    beat_at: float
    version: str | None


class MemoryCoordination:
    """Locks, membership and meters in this process's memory."""

    answers_at_once = True   # every call returns without waiting (membership need not time it)

    def __init__(self) -> None:
        super().__init__()
        self._locks: dict[tuple[str, str], _Key] = {}
        self._tickets: dict[str, int] = {}
        self._members: dict[str, dict[str, _Member]] = {}
        self._rosters: dict[str, tuple[int, tuple[str, ...]]] = {}
        self._meters: dict[tuple[str, str], tuple[float, float]] = {}
        self._watches: WatchRegistry[EventWatch] = WatchRegistry()

    # -- locks ---------------------------------------------------------------------------------

    def _key(self, namespace: str, key: str) -> _Key:
        return self._locks.setdefault((namespace, key), _Key())

    async def lock_acquire(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> LockGrant | LockWait:
        rows = [self._key(namespace, k) for k in keys]
        for row in rows:
            for waiter, (_, until) in list(row.waiters.items()):
                if until <= now:
                    del row.waiters[waiter]
        mine = rows[0].waiters.get(holder)
        ticket = mine[0] if mine is not None else None
        free = all(row.holder is None or row.expires_at <= now for row in rows)
        # first in every queue: no live waiter at all, or none with a smaller ticket than ours
        first = all(
            min((t for t, _ in row.waiters.values()), default=ticket) == ticket for row in rows
        )
        if free and first:
            token = max(row.token for row in rows) + 1
            for row in rows:
                row.token, row.holder, row.expires_at = token, holder, now + lease
                row.waiters.pop(holder, None)
            return LockGrant(token, now + lease)
        if ticket is None:
            ticket = self._tickets.get(namespace, 0) + 1
            self._tickets[namespace] = ticket
        for row in rows:
            row.waiters[holder] = (ticket, now + lease)
        # when to ask again by itself, per key: the live holder's lease end and the lease end
        # of the waiter right ahead, whichever comes first
        ends = []
        for row in rows:
            before = [(t, u) for t, u in row.waiters.values() if t < ticket]
            if before:
                ends.append(max(before)[1])
            if row.holder is not None and row.expires_at > now:
                ends.append(row.expires_at)
        return LockWait(ticket, min(ends, default=now + lease))

    async def lock_renew(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> bool:
        rows = [self._locks.get((namespace, k)) for k in keys]
        if not all(r is not None and r.holder == holder and r.expires_at > now for r in rows):
            return False
        for row in rows:
            assert row is not None
            row.expires_at = now + lease
        return True

    async def lock_release(self, namespace: str, keys: Sequence[str], holder: str) -> None:
        woken = []
        for k in keys:
            row = self._locks.get((namespace, k))
            if row is None:
                continue
            first = min(row.waiters, key=lambda w: row.waiters[w][0], default=None)
            freed = row.holder == holder
            if freed:
                row.holder, row.expires_at = None, 0.0
            row.waiters.pop(holder, None)
            if (freed or first == holder) and row.holder is None and row.waiters:
                woken.append(min(row.waiters, key=lambda w: row.waiters[w][0]))
        self._watches.wake(namespace, woken)

    @asynccontextmanager
    async def lock_watch(
        self, namespace: str, keys: Sequence[str], holder: str
    ) -> AsyncIterator[EventWatch]:
        watch = EventWatch(namespace, keys, holder)
        self._watches.add(watch)
        try:
            yield watch
        finally:
            self._watches.remove(watch)

    # -- membership ----------------------------------------------------------------------------

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
        members = self._members.setdefault(namespace, {})
        for name in [n for n, m in members.items() if m.expires_at <= now]:
            del members[name]
        row = members.get(member)
        if row is None:
            members[member] = row = _Member(joined_at=now, expires_at=now + ttl, held=held,
                                            beat_at=now, version=version)
        else:
            row.expires_at, row.held, row.beat_at, row.version = now + ttl, held, now, version
        roster = tuple(sorted(n for n, m in members.items() if m.joined_at + warmup <= now))
        generation, stored = self._rosters.get(namespace, (0, ()))
        if roster != stored:
            generation += 1
            self._rosters[namespace] = (generation, roster)
        granted = (
            member in roster
            and held in (None, generation)
            and all(m.held in (None, generation) for n, m in members.items() if n != member)
        )
        if granted:
            row.held = generation
        return MemberView(generation, roster, granted)

    async def leave(self, namespace: str, member: str) -> None:
        self._members.get(namespace, {}).pop(member, None)

    # -- meters --------------------------------------------------------------------------------

    async def meter(
        self, namespace: str, keys: Sequence[str], deltas: Sequence[float], now: float
    ) -> list[float]:
        debts = []
        for key, delta in zip(keys, deltas, strict=True):
            debt, at = self._meters.get((namespace, key), (0.0, now))
            debt = max(0.0, max(0.0, debt - max(0.0, now - at) * 1000.0) + delta)
            self._meters[(namespace, key)] = (debt, max(at, now))
            debts.append(debt)
        return debts

    # -- the console's read ------------------------------------------------------------------

    async def coordination_view(
        self, namespace: str, now: float, limit: int = 100
    ) -> CoordinationView:
        generation, roster = self._rosters.get(namespace, (0, ()))
        members = tuple(
            MemberState(name, m.joined_at, m.expires_at, m.held, m.beat_at, m.version)
            for name, m in sorted(self._members.get(namespace, {}).items())
            if m.expires_at > now)
        locks: list[LockState] = []
        complete = True
        for (ns, key), row in sorted(self._locks.items()):
            if ns != namespace:
                continue
            live = row.holder is not None and row.expires_at > now
            waiters = sorted((t, w, u) for w, (t, u) in row.waiters.items() if u > now)
            if not live and not waiters:
                continue
            if len(locks) == limit or len(waiters) > limit:
                complete = False
                if len(locks) == limit:
                    break
            locks.append(LockState(
                key, row.token, row.holder if live else None, row.expires_at if live else None,
                tuple(LockWaiter(w, t, u) for t, w, u in waiters[:limit])))
        meters: list[MeterState] = []
        for (ns, key), (debt, at) in sorted(self._meters.items()):
            left = max(0.0, debt - max(0.0, now - at) * 1000.0)
            if ns != namespace or left <= 0:
                continue
            if len(meters) == limit:
                complete = False
                break
            meters.append(MeterState(key, left, at))
        return CoordinationView(namespace, now, generation, roster, members, tuple(locks),
                                tuple(meters), complete)

    # -- retention -----------------------------------------------------------------------------

    def _coordination_ends(self, namespace: str) -> Iterable[float]:
        """When each row ``prune_coordination`` deletes stops mattering (it deletes those that
        stopped before its ``before``)."""
        for (ns, _), (debt, at) in self._meters.items():
            if ns == namespace:
                yield at + debt / 1000.0
        for (ns, _), row in self._locks.items():
            if ns == namespace:
                yield from (until for _, until in row.waiters.values())

    async def prune_coordination(self, namespace: str, before: float, limit: int) -> int:
        deleted = 0
        for key, (debt, at) in list(self._meters.items()):
            if deleted >= limit:
                return deleted
            if key[0] == namespace and at + debt / 1000.0 <= before:
                del self._meters[key]
                deleted += 1
        for (ns, _), row in self._locks.items():
            if ns != namespace:
                continue
            for waiter in [w for w, (_, until) in row.waiters.items() if until <= before]:
                if deleted >= limit:
                    return deleted
                del row.waiters[waiter]
                deleted += 1
        return deleted
