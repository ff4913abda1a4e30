"""Coordination (:mod:`shoal.ports`) in the PostgreSQL store's own tables.

The semantics are those of the memory reference (:mod:`shoal.backends.memory.coord`). Each method is
one transaction, atomic against every other connection: its statements go in one pipeline, which
the server runs as one implicit transaction (one round trip, committed at the pipeline's sync,
rolled back whole if a statement fails). The first statements take the locks — the rows of the
lock or meter keys in "C" order, created first if missing, or the namespace's membership
advisory lock — and the last one, whose READ COMMITTED snapshot is taken once they are held,
reads and writes. ``queries.sql`` (under ``-- coordination``) explains each statement.

A release ``NOTIFY``s the store's channel in its transaction with a payload ``lock <json>``
naming the waiters it wakes (the new first waiter of each key it left free); the store's LISTEN
connection hands those to :meth:`_lock_notified`, which wakes the watches of those waiters only.
A release through this store object wakes its own watches at once itself. Without LISTEN (a
pooler in transaction mode, no ``direct_url``) the store polls instead: :meth:`_lock_poll` wakes
the watches of the waiters a release would have named.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, LiteralString, TypeVar

import psycopg
from psycopg.rows import DictRow

from shoal.backends._sql import lock_states, queries
from shoal.backends._watches import EventWatch, WatchRegistry
from shoal.types import (
    CoordinationView,
    LockGrant,
    LockWait,
    MemberState,
    MemberView,
    MeterState,
)

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

_Q = queries("postgres")
_Conn = psycopg.AsyncConnection[DictRow]
_T = TypeVar("_T")
_LOCK = "lock "          # the payload prefix of lock notifications on the store's channel
# a payload of "lock *" (the waiters do not fit in 8000 bytes: queries.sql) wakes every watch


class PostgresCoordination:
    """Locks, membership and meters for :class:`~shoal.backends.postgres.PostgresStore`."""

    if TYPE_CHECKING:   # provided by PostgresStore
        channel: str
        schema: str
        pool_timeout: float
        _pool: AsyncConnectionPool[_Conn] | None
        _listening: asyncio.Event
        _scope: list[tuple[LiteralString, dict[str, Any]]]

        def _connection(self, *, urgent: bool = False) -> AbstractAsyncContextManager[_Conn]: ...

        def _transaction(self, conn: _Conn, *, snapshot: bool = False
                         ) -> AbstractAsyncContextManager[None]: ...

        async def _retry(self, attempt: Callable[[], Awaitable[_T]]) -> _T: ...

        def _start_listener(self) -> None: ...

    def __init__(self) -> None:
        self._lock_watches: WatchRegistry[EventWatch] = WatchRegistry()
        # in this store's notifications: their watches were woken at once, not again
        self._lock_origin = secrets.token_hex(8)
        self._lock_listened = False   # the LISTEN connection has been up at least once

    async def _pipelined(
        self, steps: Sequence[tuple[str, dict[str, Any]]], *, urgent: bool = False
    ) -> list[DictRow]:
        """The rows of the last statement of ``steps``, all run as one transaction in one
        round trip: on a pooled connection (autocommit, so psycopg sends no BEGIN) the server
        runs the statements of a pipeline as one implicit transaction, committed at its sync
        (in a stateless store, the first sets the session's settings for it: ``_scope``).
        ``urgent`` (renewals of leases) goes before the other operations waiting for a
        connection."""
        async with self._connection(urgent=urgent) as conn:
            async with conn.pipeline():
                for query, args in [*self._scope, *steps]:
                    cur = await conn.execute(query, args)
            return await cur.fetchall() if cur.description is not None else []

    # -- locks ---------------------------------------------------------------------------------

    async def lock_acquire(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> LockGrant | LockWait:
        args: dict[str, Any] = {
            "namespace": namespace, "keys": list(keys), "first": keys[0], "holder": holder,
            "now": float(now), "until": float(now + lease)}
        steps = [(_Q["lock_keys_create"], args), (_Q["lock_keys"], args),
                 (_Q["lock_acquire"], args)]
        [row] = await self._retry(lambda: self._pipelined(steps))
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
        [row] = await self._retry(
            lambda: self._pipelined([(_Q["lock_renew"], args)], urgent=True))
        return bool(row["renewed"] == len(keys))

    async def lock_release(self, namespace: str, keys: Sequence[str], holder: str) -> None:
        if not keys:
            return
        args: dict[str, Any] = {
            "namespace": namespace, "keys": list(keys), "holder": holder,
            "channel": self.channel, "origin": self._lock_origin}
        steps = [(_Q["lock_keys"], args), (_Q["lock_release"], args)]
        try:
            rows = await self._retry(lambda: self._pipelined(steps))
        except BaseException:
            # it may have committed: whoever is next here must not wait for its timer
            self._lock_watches.wake_keys(namespace, keys)
            raise
        for row in rows:
            self._lock_watches.wake(namespace, row["heads"])

    @asynccontextmanager
    async def lock_watch(
        self, namespace: str, keys: Sequence[str], holder: str
    ) -> AsyncIterator[EventWatch]:
        self._start_listener()
        if self._pool is not None and not self._lock_listened and not self._listening.is_set():
            # The listener wakes every watch whenever it connects (a release may have been
            # missed before); the first time, wait for it, so that a new watch is not woken
            # for nothing. While it reconnects, the watch is made at once.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.pool_timeout):
                    await self._listening.wait()
        watch = EventWatch(namespace, keys, holder)
        self._lock_watches.add(watch)
        try:
            yield watch
        finally:
            self._lock_watches.remove(watch)

    def _lock_listening(self) -> None:
        """The LISTEN connection is up (again): wake every watch, as a release may have been
        announced while it was down."""
        self._lock_listened = True
        self._lock_watches.wake_every()

    async def _lock_poll(self) -> None:
        """In place of the notifications a release sends (no LISTEN): wake the watches of the
        waiters that are first on a key no one holds, as lock_release names them, and no
        other."""
        keys: dict[str, set[str]] = {}
        for watch in self._lock_watches.every():
            keys.setdefault(watch.namespace, set()).update(watch.keys)
        for namespace, wanted in keys.items():
            rows = await self._pipelined([(_Q["lock_heads"], {
                "namespace": namespace, "keys": sorted(wanted)})])
            self._lock_watches.wake(namespace, [row["holder"] for row in rows])

    def _lock_notified(self, payload: str) -> bool:
        """Wake the watches of the waiters a lock notification names; False if ``payload`` is
        not one."""
        if not payload.startswith(_LOCK):
            return False
        try:
            origin, namespace, heads = json.loads(payload[len(_LOCK):])
            if origin != self._lock_origin:
                self._lock_watches.wake(namespace, heads)
        except (ValueError, TypeError):    # "lock *", or a payload not ours to read
            self._lock_watches.wake_every()
        return True

    # -- membership ----------------------------------------------------------------------------

    def _members_key(self, namespace: str) -> str:
        return f"shoal:members:{self.schema}:{namespace}"

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
        steps = [(_Q["advisory_xact_lock"], {"key": self._members_key(namespace)}),
                 (_Q["heartbeat"], args)]
        [row] = await self._retry(lambda: self._pipelined(steps, urgent=True))
        return MemberView(row["generation"], tuple(row["members"]), row["granted"])

    async def leave(self, namespace: str, member: str) -> None:
        steps: list[tuple[str, dict[str, Any]]] = [
            (_Q["advisory_xact_lock"], {"key": self._members_key(namespace)}),
            (_Q["leave"], {"namespace": namespace, "member": member})]
        await self._retry(lambda: self._pipelined(steps))

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
        steps = [(_Q["meter_keys_create"], args), (_Q["meter_keys"], args),
                 (_Q["meter"], args)]
        rows = await self._retry(lambda: self._pipelined(steps))
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
            async with self._connection() as conn, self._transaction(conn, snapshot=True):
                async with conn.pipeline():
                    cursors = [await conn.execute(_Q[name], args) for name in names]
                return [await cur.fetchall() for cur in cursors]

        roster, members, held, waiters, meters = await self._retry(read)
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
        [row] = await self._retry(lambda: self._pipelined([(_Q["prune_coordination"], args)]))
        deleted: int = row["deleted"]
        return deleted
