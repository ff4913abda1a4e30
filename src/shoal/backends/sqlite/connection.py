"""The SQLite store's one connection, and everything about talking to the file through it.

:class:`SQLiteConnection` opens the file (WAL, the pragmas), keeps the connection, runs write
transactions (``BEGIN IMMEDIATE``, the wait for another writer's lock, the rollback of a body
that fails), reads ``PRAGMA data_version`` (what tells that another connection committed) and
closes. :func:`unavailable_on_failure` turns sqlite3's errors of a file that cannot be used into
StoreUnavailableError on every public coroutine of the store's parts. Calls run on the event
loop's thread: each transaction is a handful of statements with no await inside, so it never
interleaves with another of the same process; the wait for the write lock is an asyncio sleep,
so it does not block the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar

from shoal.errors import ConfigurationError, StoreUnavailableError

_P = ParamSpec("_P")
_R = TypeVar("_R")
_C = TypeVar("_C", bound=type)
SYNCHRONOUS = {"off", "normal", "full", "extra"}
# What to do about the failures a deployment meets, by SQLite's primary result code.
_ADVICE = {
    "SQLITE_FULL": "the disk (or the file system's quota) is full: free space, then retry",
    "SQLITE_READONLY": "the file cannot be written: check the permissions of the file, of its "
                       "folder and of its -wal and -shm files, and that the disk is not "
                       "mounted read-only",
}
# Methods that run on the caller's own connection: its errors are the caller's to see as they
# are (a StoreUnavailableError would say the store's transaction was rolled back; the caller's
# transaction is still the caller's).
_CALLERS_ERRORS = {"create_run_in", "create_runs_in"}


# -- error translation ---------------------------------------------------------------------------

def _failed(path: str, e: sqlite3.DatabaseError) -> StoreUnavailableError:
    name = getattr(e, "sqlite_errorname", None) or type(e).__name__
    advice = _ADVICE.get("_".join(name.split("_")[:2]), "check the file, its folder and the disk")
    return StoreUnavailableError(
        f"The SQLite store {path!r} failed: {e} ({name}); {advice}. The call's transaction, if "
        f"it had one, was rolled back: nothing of this call was written.")


def _path(owner: object) -> str:
    """The file of a guarded object: a part's connection's, or the store's own."""
    held = getattr(owner, "connection", owner)
    return str(getattr(held, "path", "?"))


def _guarded(fn: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R]]:
    @functools.wraps(fn)
    async def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await fn(*args, **kwargs)
        except sqlite3.DatabaseError as e:
            # the file cannot be used (full, read-only, I/O error, corrupt); a constraint or a
            # programming error is a bug and stays what it is
            if not isinstance(e, (sqlite3.OperationalError, sqlite3.InternalError)) \
                    and type(e) is not sqlite3.DatabaseError:
                raise
            raise _failed(_path(args[0]), e) from e

    return call


def unavailable_on_failure(cls: _C) -> _C:
    """Every public coroutine method of ``cls`` (the store, the connection or a part, which
    holds it as ``connection``) raises StoreUnavailableError with the cause when the file
    cannot be used, never sqlite3's own error: callers (the engine, the App, the CLI) handle
    one kind of store failure on every backend."""
    for name, attr in vars(cls).items():
        if not name.startswith("_") and name not in _CALLERS_ERRORS \
                and inspect.iscoroutinefunction(attr):
            setattr(cls, name, _guarded(attr))
    return cls


@unavailable_on_failure
class SQLiteConnection:
    """The connection of one store object to the file ``path``; ``synchronous`` is SQLite's
    setting, ``busy_timeout`` how long a write waits for another writer's lock (seconds)."""

    def __init__(self, path: str, *, busy_timeout: float, synchronous: str) -> None:
        if synchronous.lower() not in SYNCHRONOUS:
            raise ConfigurationError(
                f"synchronous={synchronous!r} is not one of {sorted(SYNCHRONOUS)}."
            )
        self.path = path
        self.busy_timeout = busy_timeout
        self.synchronous = synchronous.lower()
        self.conn: sqlite3.Connection | None = None
        # Time the last write transaction waited for another writer, added to the lease times
        # it writes: ``now`` was read before the wait, and a lease must not be written expired.
        self.waited = 0.0
        self.commits = 0   # write transactions this connection ended (see changes)
        self._data_version = 0   # wait_for_work's

    # -- opening and closing -------------------------------------------------------------------

    def connect(self) -> None:
        """Open the connection (nothing read yet, no pragma set): StoreUnavailableError if the
        file cannot be opened."""
        try:
            # a short busy timeout inside SQLite; longer waits for the write lock happen in
            # begin without blocking the event loop
            conn = sqlite3.connect(
                self.path, timeout=0.002, isolation_level=None, check_same_thread=False,
            )
            conn.row_factory = sqlite3.Row
        except sqlite3.Error as e:
            raise StoreUnavailableError(f"Cannot open the SQLite store {self.path!r}: {e}") from e
        self.conn = conn

    async def setup(self) -> None:
        """WAL mode, ``synchronous``, foreign keys."""
        db = self.db

        def setup() -> None:
            db.execute("PRAGMA journal_mode = WAL").fetchall()
            db.execute(f"PRAGMA synchronous = {self.synchronous}")
            db.execute("PRAGMA foreign_keys = ON")

        # several processes opening a new file at once: until it is in WAL mode, a reader can
        # find it locked, and switching it to WAL takes a lock itself
        await self.retry_busy(setup)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    @property
    def db(self) -> sqlite3.Connection:
        """The open connection: StoreUnavailableError if it is not open."""
        if self.conn is None:
            raise StoreUnavailableError(f"The SQLite store {self.path!r} is not open.")
        return self.conn

    # -- reads ---------------------------------------------------------------------------------

    def one(self, sql: str, args: Any = ()) -> sqlite3.Row | None:
        """One row of a read outside any transaction; the statement is finished at once so no
        read snapshot stays open (a stale snapshot would make the next write fail busy)."""
        cur = self.db.execute(sql, args)
        try:
            row: sqlite3.Row | None = cur.fetchone()
            return row
        finally:
            cur.close()

    def data_version(self) -> int:
        """``PRAGMA data_version``: it changes when another connection commits (never on this
        connection's own commits)."""
        row = self.one("PRAGMA data_version")
        return row[0] if row is not None else 0

    def changes(self) -> tuple[int, int]:
        """What tells whether the file changed since: this connection's write transactions,
        and ``PRAGMA data_version``, which changes when another connection commits."""
        return self.commits, self.data_version()

    async def ping(self) -> None:
        self.one("SELECT 1")

    async def wait_for_work(self, timeout: float) -> None:
        # PRAGMA data_version changes when another connection commits: a cheap, local wake-up.
        deadline = time.monotonic() + timeout
        while self.conn is not None:
            version = self.data_version()
            if version != self._data_version:
                self._data_version = version
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            await asyncio.sleep(min(0.02, remaining))

    # -- write transactions --------------------------------------------------------------------

    @asynccontextmanager
    async def tx(self) -> AsyncIterator[sqlite3.Connection]:
        """One write transaction. The body must not await: it runs as one block on the loop."""
        db = self.db
        await self._begin(db)
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                # a ROLLBACK failing too (the disk gone) must not hide why the body failed
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise
        finally:
            self.commits += 1   # committed or not: a read before it may be stale

    async def _begin(self, db: sqlite3.Connection) -> None:
        started = time.monotonic()
        waited = await self.retry_busy(lambda: db.execute("BEGIN IMMEDIATE"))
        self.waited = time.monotonic() - started if waited else 0.0

    async def retry_busy(self, attempt: Callable[[], object]) -> bool:
        """Call ``attempt`` until the database is not busy; True if it had to wait."""
        # SQLite's own busy handler would sleep on the event loop's thread and freeze every run
        # of this instance (renewals included) while another process writes; wait here instead.
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.0005
        while True:
            try:
                attempt()
                return delay > 0.0005
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e):
                    raise
                if time.monotonic() >= deadline:
                    raise StoreUnavailableError(
                        f"The SQLite store {self.path!r} stayed locked by another writer for "
                        f"more than busy_timeout ({self.busy_timeout:g} s); nothing was written. "
                        f"Retry, or raise ?busy_timeout= in the store URL."
                    ) from e
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.01)
