"""Wake-ups of the PostgreSQL store: LISTEN on its channel, or polling where it cannot listen.

Writes that make work due for another instance ``NOTIFY`` a channel named after the schema;
:class:`Notifications` listens on a dedicated connection (outside the pool) that reconnects when
it drops, and wakes the waiter of ``wait_for_work`` and the lock watches
(:class:`LockWatches`) a notification names. A release ``NOTIFY``s the channel in its
transaction with a payload ``lock <json>`` naming the waiters it wakes (the new first waiter of
each key it left free). Without LISTEN (a pooler in transaction mode, no ``direct_url``) the
store polls instead: :meth:`LockWatches.poll` wakes the watches of the waiters a release would
have named.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from shoal.backends._watches import EventWatch, WatchRegistry
from shoal.backends.postgres.connections import Connections, Q
from shoal.errors import StoreUnavailableError

log = logging.getLogger("shoal.store.postgres")

# Without LISTEN (pooler=transaction and no direct_url), how often the store asks which lock
# waiters a release made first in line (Notifications._poll). Idle workers look for due runs
# every second anyway (the engine's watch loop, runner.py): a dispatch starts within about a
# second rather than at once.
POLL_INTERVAL = 1.0
LOCK = "lock "          # the payload prefix of lock notifications on the store's channel
# a payload of "lock *" (the waiters do not fit in 8000 bytes: queries.sql) wakes every watch


class LockWatches:
    """The lock watches of one store (``lock_watch``), and what wakes them: a release through
    this store (at once), a lock notification of another's, a poll, a reconnection."""

    def __init__(self, db: Connections) -> None:
        self.db = db
        self.registry: WatchRegistry[EventWatch] = WatchRegistry()
        # in this store's notifications: their watches were woken at once, not again
        self.origin = secrets.token_hex(8)
        self.listened = False   # the LISTEN connection has been up at least once

    def listening(self) -> None:
        """The LISTEN connection is up (again): wake every watch, as a release may have been
        announced while it was down."""
        self.listened = True
        self.registry.wake_every()

    async def poll(self) -> None:
        """In place of the notifications a release sends (no LISTEN): wake the watches of the
        waiters that are first on a key no one holds, as lock_release names them, and no
        other."""
        keys: dict[str, set[str]] = {}
        for watch in self.registry.every():
            keys.setdefault(watch.namespace, set()).update(watch.keys)
        for namespace, wanted in keys.items():
            rows = await self.db.pipelined([(Q["lock_heads"], {
                "namespace": namespace, "keys": sorted(wanted)})])
            self.registry.wake(namespace, [row["holder"] for row in rows])

    def notified(self, payload: str) -> bool:
        """Wake the watches of the waiters a lock notification names; False if ``payload`` is
        not one."""
        if not payload.startswith(LOCK):
            return False
        try:
            origin, namespace, heads = json.loads(payload[len(LOCK):])
            if origin != self.origin:
                self.registry.wake(namespace, heads)
        except (ValueError, TypeError):    # "lock *", or a payload not ours to read
            self.registry.wake_every()
        return True


class Notifications:
    """The task that listens on the store's ``channel`` (or polls), for ``wait_for_work`` and
    the lock watches ``locks``."""

    def __init__(self, db: Connections, channel: str, locks: LockWatches) -> None:
        self.db = db
        self.channel = channel
        self.locks = locks
        self.work = asyncio.Event()
        self.listening = asyncio.Event()   # set while the LISTEN connection is up
        self._listener: asyncio.Task[None] | None = None

    async def wait_for_work(self, timeout: float) -> None:
        if self.db.pool is None:
            return
        self.start()
        # asyncio.wait, not wait_for: on 3.11 wait_for can swallow a cancellation.
        waiter = asyncio.ensure_future(self.work.wait())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()
        self.work.clear()

    def start(self) -> None:
        """Run the LISTEN task, for wait_for_work and lock watches, unless it runs; in a
        stateless store without ``direct_url``, the task that polls in its place."""
        if self.db.pool is not None and (self._listener is None or self._listener.done()):
            db = self.db
            wake = self._poll() if db.stateless and db.direct_url is None else self._listen()
            self._listener = asyncio.create_task(wake, name=f"shoal-listen-{db.schema}")

    async def stop(self) -> None:
        """Stop the task (the store closes)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    async def _poll(self) -> None:
        """No LISTEN (a pooler in transaction mode lends the listening connection's server
        connection to others between transactions: notifications would reach nobody). Every
        POLL_INTERVAL seconds, wake the waiter of wait_for_work (a hint: the engine looks for
        due runs then) and ask the store which lock watches a release has made first in line
        (only while there are watches)."""
        self.listening.set()
        self.locks.listening()
        while self.db.pool is not None:
            await asyncio.sleep(POLL_INTERVAL)
            self.work.set()
            if not self.locks.registry:
                continue
            try:
                await self.locks.poll()
            except (StoreUnavailableError, psycopg.Error) as e:
                # the waiters' own timers go on; the next poll asks again
                log.debug("lock poll failed: %s", self.db.reason(e))

    async def _listen(self) -> None:
        """LISTEN on a connection of its own, and reconnect when it drops. After each
        (re)connection, wake the waiter and every lock watch once: notifications may have been
        missed meanwhile. Lock notifications wake lock watches only."""
        delay = 0.1
        while self.db.pool is not None:
            try:
                conn = await self._connect()
                async with conn:
                    await self._subscribe(conn)
                    delay = 0.1
                    await self._deliver(conn)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.listening.clear()
                log.warning("listen.failed: %s; reconnecting in %.1f s", self.db.reason(e),
                            delay, extra={"event": "listen.failed"})
                self.work.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _connect(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        """The LISTEN connection, outside the pool. The direct URL goes to the server itself:
        PgBouncer in transaction mode would not keep the LISTEN's server connection for it."""
        db = self.db
        async with asyncio.timeout(db.open_timeout):
            return await psycopg.AsyncConnection.connect(
                make_conninfo(db.direct_url or db.conninfo,
                              **db.application_name("shoal-listen")),
                autocommit=True, **db.unprepared())

    async def _subscribe(self, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
        """LISTEN on ``conn``, then wake the waiter and every lock watch."""
        async with asyncio.timeout(self.db.command_timeout):
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        self.listening.set()
        self.work.set()
        self.locks.listening()

    async def _deliver(self, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
        """Wake whom the notifications on ``conn`` name, until it fails."""
        while True:
            async for n in conn.notifies(timeout=30.0):
                if not self.locks.notified(n.payload):
                    self.work.set()
            # quiet for a while: make sure the connection still answers (one that a partition
            # holds would not, and would never fail either)
            async with asyncio.timeout(self.db.command_timeout):
                await conn.execute("SELECT 1")
