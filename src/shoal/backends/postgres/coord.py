"""Coordination (:mod:`shoal.ports`) in the PostgreSQL store's own tables.

The semantics are those of the memory reference (:mod:`shoal.backends.memory.coord`). Each method is
one transaction, atomic against every other connection: its statements go in one pipeline, which
the server runs as one implicit transaction (one round trip, committed at the pipeline's sync,
rolled back whole if a statement fails). The first statements take the locks — the rows of the
lock or meter keys in "C" order, created first if missing, or the namespace's membership
advisory lock — and the last one, whose READ COMMITTED snapshot is taken once they are held,
reads and writes. ``queries.sql`` (under ``-- coordination``) explains each statement.

A release ``NOTIFY``s the store's channel in its transaction naming the waiters it wakes (see
:mod:`~shoal.backends.postgres.notifications`, whose :class:`LockWatches` this part wakes); a
release through this store object wakes its own watches at once itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from psycopg.rows import DictRow

from shoal.backends._sql import lock_states
from shoal.backends._watches import EventWatch
from shoal.backends.postgres.connections import Connections, Q
from shoal.backends.postgres.notifications import LockWatches, Notifications
from shoal.types import (
    CoordinationView,
    LockGrant,
    LockWait,
    MemberState,
    MemberView,
    MeterState,
)


class PostgresCoordination:
    """Locks, membership and meters for :class:`~shoal.backends.postgres.PostgresStore`, on
    ``db``, announcing releases on ``channel``; its watches are ``locks``, woken by
    ``notifications``."""

    def __init__(self, db: Connections, channel: str, locks: LockWatches,
                 notifications: Notifications) -> None:
        self.db = db
        self.channel = channel
        self.locks = locks
        self.notifications = notifications

    # -- locks ---------------------------------------------------------------------------------

    async def lock_acquire(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> LockGrant | LockWait:
        args: dict[str, Any] = {
            "namespace": namespace, "keys": list(keys), "first": keys[0], "holder": holder,
            "now": float(now), "until": float(now + lease)}
        steps = [(Q["lock_keys_create"], args), (Q["lock_keys"], args),
                 (Q["lock_acquire"], args)]
        [row] = await self.db.retried(steps)
        if row["granted"]:
            return LockGrant(row["token"], now + lease)
        return LockWait(row["ticket"], row["retry_at"])

    async def lock_renew(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> bool:
        if not keys:
            return True
        args: dict[str, Any] = {
            "namespace": namespace, "keys": list(keys), "holder": holder, "now": float(now),
            "until": float(now + lease)}
        [row] = await self.db.retried([(Q["lock_renew"], args)], urgent=True)
        return bool(row["renewed"] == len(keys))

    async def lock_release(self, namespace: str, keys: Sequence[str], holder: str) -> None:
        if not keys:
            return
        args: dict[str, Any] = {
            "namespace": namespace, "keys": list(keys), "holder": holder,
            "channel": self.channel, "origin": self.locks.origin}
        steps = [(Q["lock_keys"], args), (Q["lock_release"], args)]
        try:
            rows = await self.db.retried(steps)
        except BaseException:
            # it may have committed: whoever is next here must not wait for its timer
            self.locks.registry.wake_keys(namespace, keys)
            raise
        for row in rows:
            self.locks.registry.wake(namespace, row["heads"])

    @asynccontextmanager
    async def lock_watch(
        self, namespace: str, keys: Sequence[str], holder: str
    ) -> AsyncIterator[EventWatch]:
        self.notifications.start()
        listening = self.notifications.listening
        if self.db.pool is not None and not self.locks.listened and not listening.is_set():
            # The listener wakes every watch whenever it connects (a release may have been
            # missed before); the first time, wait for it, so that a new watch is not woken
            # for nothing. While it reconnects, the watch is made at once.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.db.pool_timeout):
                    await listening.wait()
        watch = EventWatch(namespace, keys, holder)
        self.locks.registry.add(watch)
        try:
            yield watch
        finally:
            self.locks.registry.remove(watch)

    # -- membership ----------------------------------------------------------------------------

    def _members_key(self, namespace: str) -> str:
        return f"shoal:members:{self.db.schema}:{namespace}"

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
        args: dict[str, Any] = {
            "namespace": namespace, "member": member, "held": held, "now": float(now),
            "until": float(now + ttl), "warmup": float(warmup), "version": version}
        steps = [(Q["advisory_xact_lock"], {"key": self._members_key(namespace)}),
                 (Q["heartbeat"], args)]
        [row] = await self.db.retried(steps, urgent=True)
        return MemberView(row["generation"], tuple(row["members"]), row["granted"])

    async def leave(self, namespace: str, member: str) -> None:
        steps: list[tuple[str, dict[str, Any]]] = [
            (Q["advisory_xact_lock"], {"key": self._members_key(namespace)}),
            (Q["leave"], {"namespace": namespace, "member": member})]
        await self.db.retried(steps)

    # -- meters --------------------------------------------------------------------------------

    async def meter(
        self, namespace: str, keys: Sequence[str], deltas: Sequence[float], now: float
    ) -> list[float]:
        if len(keys) != len(deltas):
            raise ValueError(f"meter: {len(keys)} keys but {len(deltas)} deltas")
        if not keys:
            return []
        args: dict[str, Any] = {
            "namespace": namespace, "keys": list(keys), "deltas": [float(d) for d in deltas],
            "now": float(now)}
        steps = [(Q["meter_keys_create"], args), (Q["meter_keys"], args),
                 (Q["meter"], args)]
        rows = await self.db.retried(steps)
        return [row["debt"] for row in rows]

    # -- the console's read ------------------------------------------------------------------

    async def coordination_view(
        self, namespace: str, now: float, limit: int = 100
    ) -> CoordinationView:
        """Five reads in one REPEATABLE READ READ ONLY transaction (one snapshot): one round
        trip to begin it, one for the statements (a pipeline), one for the commit."""
        args: dict[str, Any] = {"namespace": namespace, "now": float(now),
                                "limit": int(limit) + 1}
        names = ("view_roster", "view_members", "view_locks_held", "view_lock_waiters",
                 "view_meters")

        async def read() -> list[list[DictRow]]:
            async with self.db.connection() as conn, self.db.transaction(conn, snapshot=True):
                async with conn.pipeline():
                    cursors = [await conn.execute(Q[name], args) for name in names]
                return [await cur.fetchall() for cur in cursors]

        roster, members, held, waiters, meters = await self.db.retry(read)
        locks, cut = lock_states(held, waiters, limit)
        return CoordinationView(
            namespace, now, roster[0]["generation"] if roster else 0,
            tuple(roster[0]["members"]) if roster else (),
            tuple(MemberState(r["member"], r["joined_at"], r["expires_at"], r["held"],
                              r["beat_at"], r["version"]) for r in members),
            locks, tuple(MeterState(r["key"], r["debt"], r["updated_at"])
                         for r in meters[:limit]),
            complete=not cut and len(meters) <= limit)

    # -- retention -----------------------------------------------------------------------------

    async def prune_coordination(self, namespace: str, before: float, limit: int) -> int:
        """Drained meters, then waiter rows whose lease ended, at most ``limit`` rows in all, in
        one statement (lock rows stay: they keep the fencing counters)."""
        args: dict[str, Any] = {"namespace": namespace, "before": float(before),
                                "limit": int(limit)}
        [row] = await self.db.retried([(Q["prune_coordination"], args)])
        deleted: int = row["deleted"]
        return deleted
