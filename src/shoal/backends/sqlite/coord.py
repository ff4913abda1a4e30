"""Coordination (:mod:`shoal.ports`) in the SQLite store's own tables.

Each method is one ``BEGIN IMMEDIATE`` transaction of the store's connection
(:class:`~shoal.backends.sqlite.connection.SQLiteConnection`), so it is atomic across the
processes sharing the file; its semantics are those of the memory reference
(:mod:`shoal.backends.memory.coord`). A release wakes the waiter it names (the new first waiter of
a key it left free) at once when that waiter's watch is on the same store object, and within
milliseconds when it is on another connection: one poller task per store reads ``PRAGMA
data_version`` while anything is watched and, when it changed, looks at where each watched
waiter stands, waking it when it has just become the first waiter of a free key.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from shoal import _json
from shoal.backends._sql import lock_states, queries
from shoal.backends._watches import EventWatch, WatchRegistry
from shoal.backends.sqlite.connection import SQLiteConnection, unavailable_on_failure
from shoal.types import (
    CoordinationView,
    LockGrant,
    LockWait,
    MemberState,
    MemberView,
    MeterState,
)

_Q = queries("sqlite")
_POLL = 0.005   # seconds between two reads of data_version while a lock is watched

# Where a watched waiter stands on one key: its ticket there, and whether it is first on a free key.
_KeyState = tuple[Any, bool]


class _Watch(EventWatch):
    def __init__(self, namespace: str, keys: Sequence[str], holder: str,
                 seen: dict[str, _KeyState]) -> None:
        super().__init__(namespace, keys, holder)
        self.seen = seen          # where it stood on each key when the poller last looked


@unavailable_on_failure
class SQLiteCoordination:
    """Locks, membership and meters for :class:`~shoal.backends.sqlite.SQLiteStore`."""

    def __init__(self, connection: SQLiteConnection) -> None:
        self.connection = connection
        self._lock_watches: WatchRegistry[_Watch] = WatchRegistry()
        self._lock_poller: asyncio.Task[None] | None = None
        # the connection and data_version the poller last compared at (wait_for_work keeps its
        # own data_version)
        self._lock_seen: tuple[sqlite3.Connection, int] | None = None

    # -- locks ---------------------------------------------------------------------------------

    async def lock_acquire(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> LockGrant | LockWait:
        args: dict[str, Any] = {"namespace": namespace, "keys": _json.dumps(list(keys)),
                                "first": keys[0], "holder": holder, "now": now,
                                "expires_at": now + lease}
        async with self.connection.tx() as db:
            db.execute(_Q["lock_purge_waiters"], args)
            ticket, taken, behind, token = db.execute(_Q["lock_state"], args).fetchone()
            if not taken and not behind:
                db.execute(_Q["lock_grant"], {**args, "token": token + 1})
                db.execute(_Q["lock_unqueue"], args)
                return LockGrant(token + 1, now + lease)
            if ticket is None:
                ticket = db.execute(_Q["lock_next_ticket"], args).fetchone()[0]
            args["ticket"] = ticket
            db.execute(_Q["lock_enqueue"], args)
            retry_at = db.execute(_Q["lock_retry_at"], args).fetchone()[0]
        return LockWait(ticket, now + lease if retry_at is None else retry_at)

    async def lock_renew(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> bool:
        args = {"namespace": namespace, "keys": _json.dumps(list(keys)), "holder": holder,
                "now": now, "expires_at": now + lease}
        async with self.connection.tx() as db:
            if db.execute(_Q["lock_held"], args).fetchone()[0] != len(keys):
                return False
            db.execute(_Q["lock_renew"], args)
            return True

    async def lock_release(self, namespace: str, keys: Sequence[str], holder: str) -> None:
        args = {"namespace": namespace, "keys": _json.dumps(list(keys)), "holder": holder}
        try:
            async with self.connection.tx() as db:
                heads = [r[0] for r in db.execute(_Q["lock_release_heads"], args).fetchall()
                         if r[0] is not None]
                db.execute(_Q["lock_release"], args)
                db.execute(_Q["lock_unqueue"], args)
        except BaseException:
            # it may have committed: whoever is next here must not wait for its timer
            self._lock_watches.wake_keys(namespace, keys)
            raise
        # this connection's commits do not change its data_version: the poller would not see
        # this one, so the waiter named is woken here (one in another process by its poller)
        self._lock_watches.wake(namespace, heads)

    @asynccontextmanager
    async def lock_watch(
        self, namespace: str, keys: Sequence[str], holder: str
    ) -> AsyncIterator[_Watch]:
        # The poller's data_version is read before the watch's first look, so a commit after
        # that look is one the poller sees as a change.
        if self._lock_poller is None:
            self._lock_seen = (self.connection.db, self.connection.data_version())
        seen = self._lock_states([(namespace, k, holder) for k in keys])
        watch = _Watch(namespace, keys, holder, {k: seen[(namespace, k, holder)] for k in keys})
        self._lock_watches.add(watch)
        if self._lock_poller is None:
            self._lock_poller = asyncio.create_task(self._poll_lock_watches())
        try:
            yield watch
        finally:
            self._lock_watches.remove(watch)
            if not self._lock_watches and self._lock_poller is not None:
                self._lock_poller.cancel()
                self._lock_poller = None

    def _lock_states(
        self, watched: Sequence[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], _KeyState]:
        rows = self.connection.db.execute(_Q["lock_watch_state"], {
            "watched": _json.dumps([list(w) for w in watched])}).fetchall()
        return {(r["namespace"], r["key"], r["holder"]): (r["ticket"], bool(r["first"] and
                                                                         r["free"]))
                for r in rows}

    async def _poll_lock_watches(self) -> None:
        """While anything is watched: when another connection committed, wake each watched
        waiter that has just become the first waiter of a free key (as the release that made it
        so would have, had it run here). A failed read or a closed store wakes every watch (a
        spurious wake-up rather than a missed one)."""
        while self._lock_watches:
            await asyncio.sleep(_POLL)
            watches = self._lock_watches.every()
            conn = self.connection.conn
            if conn is None:
                if self._lock_seen is not None:
                    self._lock_seen = None
                    for watch in watches:
                        watch.event.set()
                continue
            try:
                version = self.connection.data_version()
                # data_version only compares within one connection: after a reopen, look anyway
                if self._lock_seen == (conn, version):
                    continue
                states = self._lock_states(
                    [(w.namespace, k, w.holder) for w in watches for k in w.keys])
            except sqlite3.Error:
                for watch in watches:
                    watch.event.set()
                continue
            self._lock_seen = (conn, version)
            for watch in watches:
                now = {k: states[(watch.namespace, k, watch.holder)] for k in watch.keys}
                # first on a free key, and it was not so when last seen (or with another ticket:
                # it was requeued meanwhile)
                if any(ready and watch.seen[k] != (ticket, ready)
                       for k, (ticket, ready) in now.items()):
                    watch.event.set()
                watch.seen = now
        if self._lock_poller is asyncio.current_task():
            self._lock_poller = None

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
        args = {"namespace": namespace, "member": member, "held": held, "now": now,
                "expires_at": now + ttl, "version": version}
        async with self.connection.tx() as db:
            db.execute(_Q["members_purge"], args)
            db.execute(_Q["member_beat"], args)
            members = db.execute(_Q["members"], args).fetchall()
            roster = tuple(sorted(m["member"] for m in members if m["joined_at"] + warmup <= now))
            row = db.execute(_Q["get_roster"], args).fetchone()
            generation: int = 0 if row is None else row["generation"]
            stored = () if row is None else tuple(_json.loads(row["members"]))
            if roster != stored:
                generation += 1
                db.execute(_Q["put_roster"], {"namespace": namespace, "generation": generation,
                                              "members": _json.dumps(list(roster))})
            granted = (
                member in roster
                and held in (None, generation)
                and all(m["held"] in (None, generation) for m in members
                        if m["member"] != member)
            )
            if granted:
                db.execute(_Q["member_holds"], {**args, "generation": generation})
        return MemberView(generation, roster, granted)

    async def leave(self, namespace: str, member: str) -> None:
        async with self.connection.tx() as db:
            db.execute(_Q["member_leave"], {"namespace": namespace, "member": member})

    # -- meters --------------------------------------------------------------------------------

    async def meter(
        self, namespace: str, keys: Sequence[str], deltas: Sequence[float], now: float
    ) -> list[float]:
        args = {"namespace": namespace, "keys": _json.dumps(sorted(set(keys)))}
        debts: list[float] = []
        async with self.connection.tx() as db:
            state: dict[str, tuple[float, float]] = {
                r["key"]: (r["debt"], r["updated_at"])
                for r in db.execute(_Q["get_meters"], args).fetchall()}
            for key, delta in zip(keys, deltas, strict=True):
                debt, at = state.get(key, (0.0, now))
                debt = max(0.0, max(0.0, debt - max(0.0, now - at) * 1000.0) + delta)
                state[key] = (debt, max(at, now))
                debts.append(debt)
            # floats travel as JSON (Python writes the shortest repr; SQLite reads it back exactly)
            db.execute(_Q["put_meters"], {"namespace": namespace, "meters": _json.dumps(
                [[k, *state[k]] for k in dict.fromkeys(keys)])})
        return debts

    # -- the console's read ------------------------------------------------------------------

    async def coordination_view(
        self, namespace: str, now: float, limit: int = 100
    ) -> CoordinationView:
        args = {"namespace": namespace, "now": now, "limit": limit + 1}
        db = self.connection.db
        db.execute("BEGIN")        # deferred: one snapshot for the reads, no write lock
        try:
            roster = db.execute(_Q["get_roster"], args).fetchone()
            members = db.execute(_Q["view_members"], args).fetchall()
            held = db.execute(_Q["view_locks_held"], args).fetchall()
            waiters = db.execute(_Q["view_lock_waiters"], args).fetchall()
            meters = db.execute(_Q["view_meters"], args).fetchall()
        finally:
            db.execute("COMMIT")
        locks, cut = lock_states(held, waiters, limit)
        return CoordinationView(
            namespace, now, 0 if roster is None else roster["generation"],
            () if roster is None else tuple(_json.loads(roster["members"])),
            tuple(MemberState(r["member"], r["joined_at"], r["expires_at"], r["held"],
                              r["beat_at"], r["version"]) for r in members),
            locks, tuple(MeterState(r["key"], r["debt"], r["updated_at"])
                         for r in meters[:limit]),
            complete=not cut and len(held) <= limit and len(meters) <= limit)

    # -- retention -----------------------------------------------------------------------------

    async def prune_coordination(self, namespace: str, before: float, limit: int) -> int:
        """Drained meters, then waiter rows whose lease ended, at most ``limit`` rows in all, in
        one transaction (lock rows stay: they keep the fencing counters)."""
        args: dict[str, Any] = {"namespace": namespace, "before": before, "limit": limit}
        deleted = 0
        async with self.connection.tx() as db:
            for name in ("prune_meters", "prune_lock_waiters"):
                if deleted >= limit:
                    break
                deleted += db.execute(_Q[name], {**args, "limit": limit - deleted}).rowcount
        return deleted
