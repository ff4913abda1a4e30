"""SQLite store: several processes on one machine over one file.

WAL mode (readers never block the writer), a busy timeout of 5 s (a writer waits for the other's
lock, then fails with StoreUnavailableError; it never hangs), every atomic operation in one
``BEGIN IMMEDIATE`` transaction, claims with ``UPDATE … RETURNING``. One connection per store
object. Calls run on the event loop's thread: each transaction is a handful of statements with no
await inside, so it never interleaves with another of the same process; the wait for the write
lock is an asyncio sleep, so it does not block the loop.
``sqlite:///:memory:`` is one connection, so it serves one process only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar
from urllib.parse import parse_qs, urlsplit

from shoal import _json
from shoal.backends._batches import (
    Key,
    answers,
    firsts,
    held_flags,
    key_of,
    namespace_of,
    queued_run,
)
from shoal.backends._sql import behind, current_schema, migrations, progress_of, queries
from shoal.backends._stats import keep, since, stats_from_rows
from shoal.backends.sqlite import joined
from shoal.backends.sqlite.batches import GroupCommit
from shoal.backends.sqlite.coord import SQLiteCoordination
from shoal.backends.sqlite.graphs import SQLiteGraphCheckpoints
from shoal.backends.sqlite.rates import SQLiteRateLimits
from shoal.errors import AdmissionRejectedError, ConfigurationError, StoreUnavailableError
from shoal.types import (
    JSON,
    WORKFLOW_INSTANCE_RETENTION,
    Fence,
    NewRun,
    OutboxEntry,
    Pause,
    PauseWait,
    Progress,
    Renewal,
    Run,
    RunFilter,
    RunOwner,
    RunRecord,
    RunStatus,
    Settlement,
    SignalRecord,
    SignalWait,
    Stats,
    Step,
    StepRecord,
    WorkflowInfo,
)

_Q = queries("sqlite")
_QG = queries("sqlite", "graphs.sql")
_SYNCHRONOUS = {"off", "normal", "full", "extra"}
_P = ParamSpec("_P")
_R = TypeVar("_R")
_C = TypeVar("_C", bound=type)
# What to do about the failures a deployment meets, by SQLite's primary result code.
_ADVICE = {
    "SQLITE_FULL": "the disk (or the file system's quota) is full: free space, then retry",
    "SQLITE_READONLY": "the file cannot be written: check the permissions of the file, of its "
                       "folder and of its -wal and -shm files, and that the disk is not "
                       "mounted read-only",
}


def _failed(path: str, e: sqlite3.DatabaseError) -> StoreUnavailableError:
    name = getattr(e, "sqlite_errorname", None) or type(e).__name__
    advice = _ADVICE.get("_".join(name.split("_")[:2]), "check the file, its folder and the disk")
    return StoreUnavailableError(
        f"The SQLite store {path!r} failed: {e} ({name}); {advice}. The call's transaction, if "
        f"it had one, was rolled back: nothing of this call was written.")


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
            raise _failed(str(getattr(args[0], "path", "?")), e) from e

    return call


# Methods that run on the caller's own connection: its errors are the caller's to see as they
# are (a StoreUnavailableError would say the store's transaction was rolled back; the caller's
# transaction is still the caller's).
_CALLERS_ERRORS = {"create_run_in", "create_runs_in"}


def _unavailable_on_failure(cls: _C) -> _C:
    """Every public coroutine method of ``cls`` (its mixins' too) raises StoreUnavailableError
    with the cause when the file cannot be used, never sqlite3's own error: callers (the engine,
    the App, the CLI) handle one kind of store failure on every backend."""
    for name in dir(cls):
        attr = getattr(cls, name)
        if not name.startswith("_") and name not in _CALLERS_ERRORS \
                and inspect.iscoroutinefunction(attr):
            setattr(cls, name, _guarded(attr))
    return cls


@_unavailable_on_failure
class SQLiteStore(SQLiteCoordination, SQLiteRateLimits, SQLiteGraphCheckpoints):
    """The ``sqlite:///path`` store. ``synchronous`` is SQLite's setting (default ``full``)."""

    def __init__(self, path: str, *, busy_timeout: float = 5.0, synchronous: str = "full") -> None:
        if synchronous.lower() not in _SYNCHRONOUS:
            raise ConfigurationError(
                f"synchronous={synchronous!r} is not one of {sorted(_SYNCHRONOUS)}."
            )
        super().__init__()
        self.path = path
        self.url = f"sqlite:///{path}"
        self.busy_timeout = busy_timeout
        self.synchronous = synchronous.lower()
        self._conn: sqlite3.Connection | None = None
        self._data_version = 0
        self._waited = 0.0
        self._commits = 0   # write transactions this connection ended (see _changes)
        # checkpoints and settlements of several runs share a transaction (batches.py)
        self._writes = GroupCommit(self._tx)

    @classmethod
    def from_url(cls, url: str) -> SQLiteStore:
        """``sqlite:///relative.db``, ``sqlite:////abs/path.db``, ``sqlite:///:memory:``;
        query options ``busy_timeout`` (seconds) and ``synchronous``."""
        parts = urlsplit(url)
        if parts.scheme != "sqlite" or parts.netloc:
            raise ConfigurationError(
                f"Bad SQLite URL {url!r}: write 'sqlite:///relative/path.db' or "
                f"'sqlite:////absolute/path.db'."
            )
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path:
            raise ConfigurationError(f"The SQLite URL {url!r} names no file.")
        options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(options) - {"busy_timeout", "synchronous"}
        if unknown:
            raise ConfigurationError(f"Unknown SQLite URL options {sorted(unknown)} in {url!r}.")
        try:
            busy_timeout = float(options.get("busy_timeout", 5.0))
        except ValueError:
            busy_timeout = -1.0
        if not busy_timeout >= 0:
            raise ConfigurationError(
                f"busy_timeout={options['busy_timeout']!r} in {url!r} must be a number of "
                f"seconds >= 0.")
        return cls(path, busy_timeout=busy_timeout,
                   synchronous=options.get("synchronous", "full"))

    # -- connection and schema -------------------------------------------------------------

    async def exists(self) -> bool:
        """Whether the file is there (an in-memory database always is), without creating it."""
        return self.path == ":memory:" or Path(self.path).exists()

    async def open(self, *, migrate: bool = True) -> None:
        if self._conn is not None:
            return
        if self.path != ":memory:":
            parent = Path(self.path).resolve().parent
            if not parent.is_dir():
                raise StoreUnavailableError(
                    f"Cannot open the SQLite store {self.path!r}: the folder {str(parent)!r} "
                    f"does not exist. Create it or give another path."
                )
            if not migrate and not Path(self.path).exists():
                # connecting would create an empty file
                behind(self.url, "sqlite", 0, migrate=False)
        try:
            # a short busy timeout inside SQLite; longer waits for the write lock happen in
            # _begin without blocking the event loop
            conn = sqlite3.connect(
                self.path, timeout=0.002, isolation_level=None, check_same_thread=False,
            )
            conn.row_factory = sqlite3.Row
        except sqlite3.Error as e:
            raise StoreUnavailableError(f"Cannot open the SQLite store {self.path!r}: {e}") from e
        self._conn = conn

        def setup() -> None:
            conn.execute("PRAGMA journal_mode = WAL").fetchall()
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")

        try:
            if not migrate:
                # read before setup: switching a file to WAL takes the write lock, which may be
                # held by a transaction of this very process (a client opened inside it), so a
                # schema behind is refused at once instead of after busy_timeout
                found: list[int] = []
                await self._retry_busy(lambda: found.append(self._version()))
                behind(self.url, "sqlite", found[-1], migrate=False)
            # several processes opening a new file at once: until it is in WAL mode, a reader
            # can find it locked, and switching it to WAL takes a lock itself
            await self._retry_busy(setup)
            if migrate:
                await self.migrate()
        except (sqlite3.DatabaseError, StoreUnavailableError) as e:
            await self.close()
            raise StoreUnavailableError(
                f"Cannot use {self.path!r} as a shoal SQLite store: {e}"
            ) from e
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await self._writes.drain()   # writes already asked for are still made
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def migrate(self) -> int:
        """Bring the file to the newest version in one ``BEGIN IMMEDIATE`` transaction: a file
        with no shoal schema gets ``schema.sql`` in one go, one behind gets its missing
        migrations in order. A current file is only read."""
        found = self._version()
        if not behind(self.url, "sqlite", found, migrate=True):
            return found   # up to date: no write lock needed to start
        async with self._tx() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS shoal_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            done = {row[0] for row in db.execute("SELECT version FROM shoal_migrations")}
            version = max(done, default=0)
            behind(self.url, "sqlite", version, migrate=True)   # a newer shoal came first
            if not done:
                for statement in _statements(current_schema("sqlite")):
                    db.execute(statement)
                # what the script recorded; a migration newer than the script still follows
                done = {row[0] for row in db.execute("SELECT version FROM shoal_migrations")}
                version = max(done, default=0)
            for number, name, sql in migrations("sqlite"):
                if number in done:
                    continue
                for statement in _statements(sql):
                    db.execute(statement)
                db.execute(
                    "INSERT INTO shoal_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (number, name, time.time()),
                )
                version = number
        return version

    def _version(self) -> int:
        """The file's schema version, 0 when it holds no shoal store; reads only."""
        if self._one("SELECT 1 FROM sqlite_master WHERE name = 'shoal_migrations'") is None:
            return 0
        row = self._one("SELECT max(version) FROM shoal_migrations")
        return int(row[0]) if row is not None and row[0] is not None else 0

    async def ping(self) -> None:
        self._one("SELECT 1")

    def _one(self, sql: str, args: Any = ()) -> sqlite3.Row | None:
        """One row of a read outside any transaction; the statement is finished at once so no
        read snapshot stays open (a stale snapshot would make the next write fail busy)."""
        cur = self._db.execute(sql, args)
        try:
            row: sqlite3.Row | None = cur.fetchone()
            return row
        finally:
            cur.close()

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreUnavailableError(f"The SQLite store {self.path!r} is not open.")
        return self._conn

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[sqlite3.Connection]:
        """One write transaction. The body must not await: it runs as one block on the loop."""
        db = self._db
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
            self._commits += 1   # committed or not: a read before it may be stale

    async def _begin(self, db: sqlite3.Connection) -> None:
        started = time.monotonic()
        waited = await self._retry_busy(lambda: db.execute("BEGIN IMMEDIATE"))
        # Time spent waiting for another writer, added to the lease times this transaction
        # writes: ``now`` was read before the wait, and a lease must not be written expired.
        self._waited = time.monotonic() - started if waited else 0.0

    async def _retry_busy(self, attempt: Callable[[], object]) -> bool:
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

    # -- workflows -------------------------------------------------------------------------

    async def register_workflows(
        self, namespace: str, workflows: Mapping[str, JSON], now: float,
        instance: str | None = None,
    ) -> None:
        async with self._tx() as db:
            for name, options in workflows.items():
                args = {"namespace": namespace, "name": name, "options": _json.dumps(options),
                        "now": now, "instance": instance}
                db.execute(_Q["register_workflow"], args)
                if instance is not None:
                    db.execute(_Q["register_workflow_instance"], args)
            if instance is not None:
                db.execute(_Q["forget_workflow_instances"], {
                    "namespace": namespace, "before": now - WORKFLOW_INSTANCE_RETENTION})

    async def get_workflow(self, namespace: str, name: str) -> JSON:
        row = self._one(_Q["get_workflow"], {"namespace": namespace, "name": name})
        return None if row is None else _json.loads(row["options"])

    async def list_workflows(self, namespace: str | None) -> list[WorkflowInfo]:
        args = {"namespace": namespace}
        served: dict[tuple[str, str], list[tuple[str, float]]] = {}
        for row in self._db.execute(_Q["list_workflow_instances"], args).fetchall():
            served.setdefault((row["namespace"], row["workflow"]), []).append(
                (row["instance"], row["registered_at"]))
        return [WorkflowInfo(row["namespace"], row["name"], _json.loads(row["options"]),
                             row["registered_at"],
                             tuple(served.get((row["namespace"], row["name"]), ())))
                for row in self._db.execute(_Q["list_workflows"], args).fetchall()]

    # -- runs ------------------------------------------------------------------------------

    async def create_run(
        self, new: NewRun, *, max_queued: int | None, admission: str
    ) -> tuple[Run, bool]:
        async with self._tx() as db:
            row, created = _create_run(db.cursor(), _Q, new, max_queued, admission)
            return _run(row), created

    async def create_run_in(
        self, connection: object, new: NewRun, *, max_queued: int | None, admission: str
    ) -> tuple[Run, bool]:
        """``create_run`` in the transaction of the caller's ``sqlite3`` connection (see
        :mod:`shoal.backends.sqlite.joined`); its errors are the caller's connection's."""
        name = joined.caller_schema(connection, self.path)
        assert isinstance(connection, sqlite3.Connection)
        cur = connection.cursor()
        cur.row_factory = sqlite3.Row
        try:
            q = {n: joined.query(n, name) for n in ("find_idempotent", "count_queued",
                                                   "insert_run")}
            row, created = _create_run(cur, q, new, max_queued, admission)
        finally:
            cur.close()
        return _run(row), created

    async def create_runs(
        self, news: Sequence[NewRun], *, max_queued: int | None, admission: str
    ) -> list[tuple[Run, bool]]:
        if not news:
            return []
        namespace = namespace_of(news)
        async with self._tx() as db:
            return _create_runs(db.cursor(), _Q, namespace, news, max_queued, admission)

    async def create_runs_in(
        self, connection: object, news: Sequence[NewRun], *, max_queued: int | None,
        admission: str,
    ) -> list[tuple[Run, bool]]:
        """``create_runs`` in the transaction of the caller's ``sqlite3`` connection, with its
        statements (see :mod:`shoal.backends.sqlite.joined`); its errors are the caller's
        connection's. A connection outside a transaction (Python's default mode, before its
        first write) gets one begun with the write lock, so that no other writer takes a key
        between the lookup and the insert; when nothing is inserted it is ended again, as the
        caller had it."""
        name = joined.caller_schema(connection, self.path)
        assert isinstance(connection, sqlite3.Connection)
        if not news:
            return []
        namespace = namespace_of(news)
        q = {n: joined.query(n, name) for n in ("find_idempotent", "count_queued",
                                               "insert_runs")}
        began = joined.begin(connection)
        cur = connection.cursor()
        cur.row_factory = sqlite3.Row
        answered: list[tuple[Run, bool]] = []
        try:
            # a savepoint: a batch that fails half-way leaves none of its rows to the caller
            cur.execute("SAVEPOINT shoal_create_runs")
            try:
                answered = _create_runs(cur, q, namespace, news, max_queued, admission)
            except BaseException:
                if connection.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        cur.execute("ROLLBACK TO shoal_create_runs")
                        cur.execute("RELEASE shoal_create_runs")
                raise
            cur.execute("RELEASE shoal_create_runs")
        finally:
            cur.close()
            if began and not any(created for _, created in answered) \
                    and connection.in_transaction:
                connection.rollback()
        return answered

    async def incompatible_runs(
        self, namespace: str, workflows: Sequence[str], version: str | None,
        any_version: Sequence[str], now: float, limit: int = 100,
    ) -> list[Run]:
        rows = self._db.execute(_Q["incompatible_runs"], {
            "namespace": namespace, "workflows": _json.dumps(list(workflows)),
            "any_version": _json.dumps(list(any_version)), "version": version, "now": now,
            "limit": limit}).fetchall()
        return [_run(row) for row in rows]

    async def get_run(self, run_id: str) -> Run | None:
        row = self._one(_Q["get_run"], {"id": run_id})
        return None if row is None else _run(row)

    async def list_runs(
        self,
        namespace: str | None,
        *,
        status: str | None = None,
        workflow: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[Run]:
        where, args = [], []
        for column, value in (("namespace", namespace), ("status", status),
                              ("workflow", workflow), ("tenant", tenant)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if after is not None:
            where.append("id > ?")
            args.append(after)
        sql = "SELECT * FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id LIMIT ?"
        rows = self._db.execute(sql, [*args, limit]).fetchall()
        return [_run(row) for row in rows]

    async def claim_runs(
        self,
        namespace: str,
        workflows: Sequence[str],
        owner: str,
        limit: int,
        lease: float,
        now: float,
        *,
        version: str | None = None,
        any_version: Sequence[str] = (),
    ) -> list[Run]:
        if limit <= 0 or not workflows:
            return []
        # A plain read first: an idle poll takes no write lock. The write transaction uses its
        # rows unless the file changed in between, rather than running the query again.
        args = _claim_args(namespace, workflows, limit, now, version, any_version)
        seen = self._changes()   # before the read: a commit after it is seen as a change
        candidates = self._db.execute(_Q["claim_candidates"], args).fetchall()
        if not candidates:
            return []
        async with self._tx() as db:
            if self._changes() != seen:
                candidates = db.execute(_Q["claim_candidates"], args).fetchall()
            return self._claim_candidates(db, candidates, owner, limit, lease, now, version)

    def _changes(self) -> tuple[int, int]:
        """What tells whether the file changed since: this connection's write transactions,
        and ``PRAGMA data_version``, which changes when another connection commits."""
        row = self._one("PRAGMA data_version")
        return self._commits, row[0] if row is not None else 0

    def _claim(
        self, db: sqlite3.Connection, namespace: str, workflows: Sequence[str], owner: str,
        limit: int, lease: float, now: float, version: str | None, any_version: Sequence[str],
    ) -> list[Run]:
        """``claim_runs``' statements, in the caller's write transaction."""
        if limit <= 0 or not workflows:
            return []
        candidates = db.execute(_Q["claim_candidates"], _claim_args(
            namespace, workflows, limit, now, version, any_version)).fetchall()
        return self._claim_candidates(db, candidates, owner, limit, lease, now, version)

    def _claim_candidates(
        self, db: sqlite3.Connection, candidates: list[sqlite3.Row], owner: str, limit: int,
        lease: float, now: float, version: str | None,
    ) -> list[Run]:
        """Claim the first ``limit`` of ``candidates`` (``claim_candidates``' rows as the
        write transaction ``db`` sees them), one run per concurrency key."""
        ids: list[str] = []
        keys: set[tuple[str, str]] = set()
        for row in candidates:
            key = row["concurrency_key"]
            if key is not None:
                if (row["workflow"], key) in keys:
                    continue
                keys.add((row["workflow"], key))
            ids.append(row["id"])
            if len(ids) == limit:
                break
        if not ids:
            return []
        rows = db.execute(_Q["claim"], {"owner": owner, "expires": now + self._waited + lease,
                                        "now": now, "version": version,
                                        "ids": _json.dumps(ids)}).fetchall()
        return sorted((_run(r) for r in rows), key=lambda r: (-r.priority, r.created_at, r.id))

    async def renew_leases(
        self, owner: str, leases: dict[str, int], lease: float, now: float
    ) -> Renewal:
        renewed, cancel = set(), set()
        if leases:
            async with self._tx() as db:
                for run_id, epoch in leases.items():
                    row = db.execute(_Q["renew"], {"expires": now + self._waited + lease,
                                                   "id": run_id,
                                                   "owner": owner, "epoch": epoch}).fetchone()
                    if row is not None:
                        renewed.add(run_id)
                        if row["cancel_requested"]:
                            cancel.add(run_id)
        return Renewal(frozenset(renewed), frozenset(cancel))

    async def load_steps(self, run_id: str) -> list[Step]:
        rows = self._db.execute(_Q["load_steps"], {"run_id": run_id}).fetchall()
        return [Step(r["seq"], r["name"], _json.loads(r["output"]), bool(r["finished"]),
                     r["epoch"], r["started_at"], r["attempt"], r["retries"]) for r in rows]

    def _fenced(self, db: sqlite3.Connection, fence: Fence, lease: float, now: float) -> bool:
        cur = db.execute(_Q["fence_extend"], {"expires": now + self._waited + lease,
                                              "run_id": fence.run_id,
                                              "owner": fence.owner, "epoch": fence.epoch})
        return cur.rowcount == 1

    def _put_step(self, db: sqlite3.Connection, fence: Fence, step: Step, now: float) -> None:
        db.execute(_Q["put_step"], {
            "run_id": fence.run_id, "seq": step.seq, "name": step.name,
            "output": _json.dumps(step.output), "finished": int(step.finished),
            "epoch": fence.epoch, "finished_at": now if step.finished else None,
            "started_at": step.started_at, "attempt": step.attempt, "retries": step.retries,
        })

    async def checkpoint_step(
        self, fence: Fence, step: Step, lease: float, now: float,
        outbox: Sequence[OutboxEntry] = (),
    ) -> bool:
        # with the checkpoints and settlements of other runs, each fenced on its own
        return await self._writes.write(
            lambda db: self._checkpoint(db, fence, step, lease, now, outbox))

    def _checkpoint(
        self, db: sqlite3.Connection, fence: Fence, step: Step, lease: float, now: float,
        outbox: Sequence[OutboxEntry],
    ) -> bool:
        """``checkpoint_step``'s statements, in the caller's write transaction."""
        if not self._fenced(db, fence, lease, now):
            return False
        if outbox:
            # the transaction holds the write lock: this reads the step as it is, and no other
            # writer can finish it before the entries and the step are written
            done = db.execute(_Q["step_finished"], {"run_id": fence.run_id,
                                                    "seq": step.seq}).fetchone()
            if done is None or not done["finished"]:
                for e in outbox:
                    db.execute(_Q["insert_outbox"], {
                        "id": e.id, "namespace": e.namespace, "run_id": e.run_id,
                        "seq": e.seq, "idx": e.index, "topic": e.topic,
                        "payload": _json.dumps(e.payload), "created_at": e.created_at,
                        "now": now, "trace_context": e.trace_context})
        self._put_step(db, fence, step, now)
        return True

    async def record_progress(self, fence: Fence, progress: Progress) -> bool:
        # with the checkpoints and settlements of other runs (group commit)
        args = {"progress": _json.dumps(progress.to_json()), "progress_at": progress.at,
                "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch}
        return await self._writes.write(
            lambda db: db.execute(_Q["record_progress"], args).rowcount == 1)

    async def suspend_run(
        self,
        fence: Fence,
        step: Step,
        status: Literal["sleeping", "waiting"],
        run_at: float | None,
        wait_for: str | None,
        now: float,
    ) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            cur = db.execute(_Q["suspend"], {
                "status": status, "run_at": run_at, "wait_for": wait_for,
                "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
            })
            if cur.rowcount != 1:
                return False
            self._put_step(db, fence, step, now)
            return True

        return await self._writes.write(write)

    async def wait_signal(
        self, fence: Fence, step: Step, signal: str, deadline: float | None, now: float
    ) -> SignalWait | None:
        async with self._tx() as db:
            held = db.execute(_Q["fence_check"], {"run_id": fence.run_id, "owner": fence.owner,
                                                  "epoch": fence.epoch}).fetchone()
            if held is None:
                return None
            row = db.execute(_Q["next_signal"], {"run_id": fence.run_id,
                                                 "name": signal}).fetchone()
            if row is not None:
                db.execute(_Q["consume_signal"], {"id": row["id"]})
                payload = _json.loads(row["payload"])
                self._put_step(db, fence, replace(step, output={"payload": payload},
                                                  finished=True), now)
                return SignalWait(received=True, payload=payload)
            if deadline is not None and deadline <= now:
                return SignalWait(received=False, parked=False)
            db.execute(_Q["suspend"], {
                "status": "waiting", "run_at": deadline, "wait_for": signal,
                "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
            })
            self._put_step(db, fence, step, now)
            return SignalWait(received=False, parked=True)

    async def settle_run(self, fence: Fence, settlement: Settlement, now: float) -> bool:
        return await self._writes.write(lambda db: _settle(db, fence, settlement, now))

    async def settle_and_claim(
        self,
        settlements: Sequence[tuple[Fence, Settlement, float]],
        namespace: str,
        workflows: Sequence[str],
        owner: str,
        limit: int,
        lease: float,
        now: float,
        *,
        version: str | None = None,
        any_version: Sequence[str] = (),
    ) -> tuple[list[bool], list[Run]]:
        if not settlements:
            return [], await self.claim_runs(namespace, workflows, owner, limit, lease, now,
                                             version=version, any_version=any_version)

        # One transaction (shared with the checkpoints queued meanwhile): each settlement
        # fenced on its own, then the claim, which sees the slots and keys they freed.
        def write(db: sqlite3.Connection) -> tuple[list[bool], list[Run]]:
            held = [_settle(db, fence, settlement, at) for fence, settlement, at in settlements]
            return held, self._claim(db, namespace, workflows, owner, limit, lease, now,
                                     version, any_version)

        return await self._writes.write(write)

    async def release_run(self, fence: Fence, now: float) -> bool:
        # a stopping instance releases its runs at once: together
        return await self._writes.write(lambda db: db.execute(_Q["release"], {
            "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch}).rowcount == 1)

    async def recover_runs(self, namespace: str, now: float) -> list[Run]:
        args = {"namespace": namespace, "now": now}
        if self._one(_Q["anything_to_recover"], args) is None:
            return []
        async with self._tx() as db:
            rows = [*db.execute(_Q["recover_crashed_final"], args).fetchall(),
                    *db.execute(_Q["recover_crashed"], args).fetchall(),
                    *db.execute(_Q["recover_cancelled_interrupted"], args).fetchall(),
                    *db.execute(_Q["recover_interrupted"], args).fetchall()]
        return [_run(r) for r in rows]

    async def cancel_run(self, run_id: str, now: float) -> Run | None:
        async with self._tx() as db:
            root = db.execute(_Q["get_run"], {"id": run_id}).fetchone()
            if (root is not None and root["id"] == root["root_id"]
                    and root["status"] not in ("succeeded", "failed", "cancelled")):
                for child in db.execute(_Q["cancel_tree_now"],
                                        {"id": run_id, "now": now}).fetchall():
                    db.execute(_Q["cancel_pauses_of_run"], {"run_id": child["id"], "now": now})
                db.execute(_Q["cancel_tree_request"], {"id": run_id})
            row = db.execute(_Q["cancel_now"], {"id": run_id, "now": now}).fetchone()
            if row is not None:
                db.execute(_Q["cancel_pauses_of_run"], {"run_id": run_id, "now": now})
            if row is None:
                row = db.execute(_Q["cancel_request"], {"id": run_id}).fetchone()
            if row is None:
                row = db.execute(_Q["get_run"], {"id": run_id}).fetchone()
            return None if row is None else _run(row)

    async def retry_run(
        self, namespace: str, run_id: str, tenant: str | None, now: float
    ) -> tuple[Run | None, bool]:
        async with self._tx() as db:
            row = db.execute(_Q["get_run"], {"id": run_id}).fetchone()
            if row is None or row["namespace"] != namespace or (
                    tenant is not None and row["tenant"] != tenant):
                return None, False
            retried = db.execute(_Q["retry"], {"id": run_id, "now": now}).fetchone()
            if retried is None:
                return _run(row), False
            db.execute(_Q["uncount_retried"], {
                "namespace": row["namespace"], "workflow": row["workflow"],
                "status": row["status"], "finished_at": row["finished_at"]})
            db.execute(_Q["retry_drop_unfinished"], {"id": run_id})
            return _run(retried), True

    async def send_signal(
        self, run_id: str, name: str, payload: JSON, signal_id: str, now: float
    ) -> Run | None:
        async with self._tx() as db:
            row = db.execute(_Q["get_run"], {"id": run_id}).fetchone()
            if row is None:
                return None
            db.execute(_Q["insert_signal"], {"id": signal_id, "run_id": run_id, "name": name,
                                             "payload": _json.dumps(payload), "now": now})
            woken = db.execute(_Q["wake_waiter"], {"run_id": run_id, "name": name,
                                                   "now": now}).fetchone()
            return _run(woken if woken is not None else row)

    async def release_held(self, namespace: str, max_queued: int, now: float) -> int:
        counts = self._one(_Q["count_queued"], {"namespace": namespace})
        assert counts is not None
        queued, parked = counts
        if parked == 0 or queued >= max_queued:
            return 0
        async with self._tx() as db:
            queued, parked = db.execute(_Q["count_queued"], {"namespace": namespace}).fetchone()
            n = min(parked, max_queued - queued)
            if n <= 0:
                return 0
            return db.execute(_Q["release_held"], {"namespace": namespace, "n": n}).rowcount

    # -- tree state and children ----------------------------------------------------------------

    async def save_tree_key(
        self, root_id: str, key: str, value: JSON, claimant: str, now: float
    ) -> bool:
        async with self._tx() as db:
            cur = db.execute(_Q["insert_tree_key"], {
                "root_id": root_id, "key": key, "value": _json.dumps(value),
                "claimant": claimant, "now": now})
            if cur.rowcount == 1:
                return True
            row = db.execute(_Q["get_tree_key"], {"root_id": root_id, "key": key}).fetchone()
            return row is not None and row["claimant"] == claimant

    async def get_tree_key(self, root_id: str, key: str) -> JSON:
        row = self._one(_Q["get_tree_key"], {"root_id": root_id, "key": key})
        return None if row is None else _json.loads(row["value"])

    async def tree_keys(self, root_id: str) -> list[tuple[str, str]]:
        rows = self._db.execute(_Q["list_tree_keys"], {"root_id": root_id}).fetchall()
        return [(row["key"], row["tenant"]) for row in rows]

    async def wait_child(self, fence: Fence, step: Step, child_id: str, now: float) -> Run | None:
        async with self._tx() as db:
            held = db.execute(_Q["fence_check"], {"run_id": fence.run_id, "owner": fence.owner,
                                                  "epoch": fence.epoch}).fetchone()
            if held is None:
                return None
            row = db.execute(_Q["get_run"], {"id": child_id}).fetchone()
            if row is None:
                raise KeyError(f"no child run {child_id!r}")
            child = _run(row)
            if child.status.final:
                done = replace(step, output={"status": child.status.value,
                                             "output": child.output, "error": child.error},
                               finished=True)
                self._put_step(db, fence, done, now)
            else:
                db.execute(_Q["suspend"], {
                    "status": "waiting", "run_at": None, "wait_for": f"shoal.child:{child_id}",
                    "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch})
                self._put_step(db, fence, step, now)
            return child

    # -- pauses ------------------------------------------------------------------------------

    async def create_pause(self, fence: Fence, step: Step, pause: Pause, now: float) -> bool:
        async with self._tx() as db:
            cur = db.execute(_Q["suspend"], {
                "status": "waiting", "run_at": None, "wait_for": f"shoal.pause:{pause.id}",
                "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
            })
            if cur.rowcount != 1:
                return False
            db.execute(_Q["insert_pause"], {
                "id": pause.id, "namespace": pause.namespace, "tenant": pause.tenant,
                "run_id": pause.run_id, "name": pause.name,
                "request": _json.dumps(pause.request), "created_at": pause.created_at,
                "expires_at": pause.expires_at,
            })
            self._put_step(db, fence, step, now)
            return True

    async def get_pause(self, pause_id: str) -> Pause | None:
        row = self._one(_Q["get_pause"], {"id": pause_id})
        return None if row is None else _pause(row)

    async def wait_pause(
        self, fence: Fence, step: Step, pause_id: str, now: float
    ) -> PauseWait | None:
        async with self._tx() as db:
            held = db.execute(_Q["fence_check"], {"run_id": fence.run_id, "owner": fence.owner,
                                                  "epoch": fence.epoch}).fetchone()
            if held is None:
                return None
            row = db.execute(_Q["get_pause"], {"id": pause_id}).fetchone()
            pause = None if row is None else _pause(row)
            if pause is None or pause.status != "pending":
                return PauseWait(pause, parked=False)
            db.execute(_Q["suspend"], {
                "status": "waiting", "run_at": None, "wait_for": f"shoal.pause:{pause_id}",
                "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch})
            self._put_step(db, fence, step, now)
            return PauseWait(pause, parked=True)

    def _resolve(self, db: sqlite3.Connection, pause_id: str, decision: JSON,
                 now: float) -> Pause | None:
        row = db.execute(_Q["resolve_pause"], {"id": pause_id, "decision": _json.dumps(decision),
                                               "now": now}).fetchone()
        if row is None:
            return None
        db.execute(_Q["wake_paused"], {"run_id": row["run_id"], "now": now,
                                       "wait_for": f"shoal.pause:{pause_id}"})
        return _pause(row)

    async def resolve_pause(
        self, pause_id: str, decision: JSON, now: float
    ) -> tuple[Pause | None, bool]:
        async with self._tx() as db:
            resolved = self._resolve(db, pause_id, decision, now)
            if resolved is not None:
                return resolved, True
            row = db.execute(_Q["get_pause"], {"id": pause_id}).fetchone()
            return (None if row is None else _pause(row)), False

    async def list_pauses(
        self, namespace: str, *, tenant: str | None = None, limit: int = 100
    ) -> list[Pause]:
        rows = self._db.execute(_Q["list_pauses"], {"namespace": namespace, "tenant": tenant,
                                                    "limit": limit}).fetchall()
        return [_pause(r) for r in rows]

    async def expire_pauses(self, namespace: str, now: float) -> list[Pause]:
        args = {"namespace": namespace, "now": now}
        if self._one(_Q["expiring_pauses"], args) is None:
            return []
        decision = {"approved": False, "data": None, "by": None, "reason": "expired"}
        out = []
        async with self._tx() as db:
            for row in db.execute(_Q["expiring_pauses"], args).fetchall():
                resolved = self._resolve(db, row["id"], decision, now)
                if resolved is not None:
                    out.append(resolved)
        return out

    async def claim_notifications(
        self, namespace: str, now: float, lease: float, limit: int
    ) -> list[Pause]:
        args = {"namespace": namespace, "now": now, "limit": limit}
        if self._one(_Q["notification_candidates"], args) is None:
            return []
        out = []
        async with self._tx() as db:
            for row in db.execute(_Q["notification_candidates"], args).fetchall():
                taken = db.execute(_Q["take_notification"], {"id": row["id"], "now": now,
                                                             "until": now + lease}).fetchone()
                if taken is not None:
                    out.append(_pause(taken))
        return out

    async def mark_notified(self, pause_id: str) -> None:
        async with self._tx() as db:
            db.execute(_Q["mark_notified"], {"id": pause_id})

    async def prune_pauses(self, namespace: str, before: float, limit: int) -> int:
        # an idle poll takes no write lock to find nothing to prune
        if self._one(_Q["any_pause_to_prune"], {"namespace": namespace, "before": before}) is None:
            return 0
        async with self._tx() as db:
            return db.execute(_Q["prune_pauses"], {"namespace": namespace, "before": before,
                                                   "limit": limit}).rowcount

    # -- outbox ------------------------------------------------------------------------------

    async def claim_outbox(
        self, namespace: str, topics: Sequence[str], now: float, lease: float, limit: int
    ) -> list[OutboxEntry]:
        args = {"namespace": namespace, "now": now, "limit": limit,
                "topics": _json.dumps(list(topics))}
        if not topics or self._one(_Q["outbox_candidates"], args) is None:
            return []
        out = []
        async with self._tx() as db:
            for row in db.execute(_Q["outbox_candidates"], args).fetchall():
                taken = db.execute(_Q["take_outbox"], {"id": row["id"], "now": now,
                                                       "until": now + lease}).fetchone()
                if taken is not None:
                    out.append(_entry(taken))
        return out

    async def finish_delivery(
        self, entry_id: str, now: float, error: str | None = None,
        retry_at: float | None = None,
    ) -> None:
        async with self._tx() as db:
            if error is None:
                db.execute(_Q["outbox_delivered"], {"id": entry_id, "now": now})
            else:
                db.execute(_Q["outbox_failed"], {
                    "id": entry_id, "error": error, "dead": int(retry_at is None),
                    "next_at": retry_at if retry_at is not None else now})

    # -- what a console reads ------------------------------------------------------------------

    async def redrive(self, namespace: str, entry_id: str,
                      now: float) -> tuple[OutboxEntry | None, bool]:
        async with self._tx() as db:
            one = {"id": entry_id, "namespace": namespace}
            row = db.execute(_Q["redrive"], {**one, "now": now}).fetchone()
            if row is not None:
                return _entry(row), True
            row = db.execute(_Q["get_outbox"], one).fetchone()
            return (None if row is None else _entry(row)), False

    async def search_runs(
        self, namespace: str, where: RunFilter, *, before: str | None = None, limit: int = 50,
    ) -> list[Run]:
        sql, args = search_sql(namespace, where, before, limit)
        return [_run(row) for row in self._db.execute(sql, args).fetchall()]

    async def inspect_run(self, run_id: str, tree_limit: int = 200) -> RunRecord | None:
        db = self._db
        db.execute("BEGIN")        # deferred: one snapshot for the reads, no write lock
        try:
            row = db.execute(_Q["get_run"], {"id": run_id}).fetchone()
            if row is None:
                return None
            run = _run(row)
            one = {"run_id": run_id}
            root = run if run.id == run.root_id else (
                None if (r := db.execute(_Q["get_run"], {"id": run.root_id}).fetchone()) is None
                else _run(r))
            children = db.execute(_Q["inspect_children"], {
                "root_id": run.root_id, "limit": max(0, tree_limit - 1)}).fetchall()
            return RunRecord(
                run=run,
                steps=tuple(StepRecord(r["seq"], r["name"], _json.loads(r["output"]),
                                       bool(r["finished"]), r["epoch"], r["finished_at"],
                                       r["started_at"], r["attempt"], r["retries"])
                            for r in db.execute(_Q["inspect_steps"], one)),
                signals=tuple(SignalRecord(r["id"], r["name"], _json.loads(r["payload"]),
                                           r["created_at"], bool(r["consumed"]))
                              for r in db.execute(_Q["inspect_signals"], one)),
                pauses=tuple(_pause(r) for r in db.execute(_Q["inspect_pauses"], one)),
                outbox=tuple(_entry(r) for r in db.execute(_Q["inspect_outbox"], one)),
                tree=tuple(([root] if root is not None and tree_limit > 0 else [])
                           + [_run(r) for r in children])[:tree_limit])
        finally:
            db.execute("COMMIT")

    async def run_owners(self, namespace: str, limit: int = 1000) -> list[RunOwner]:
        rows = self._db.execute(_Q["run_owners"], {"namespace": namespace,
                                                   "limit": limit}).fetchall()
        return [RunOwner(r["owner"], r["running"], r["lease_until"]) for r in rows]

    async def finished_per_minute(
        self, namespace: str, since: float, minutes: int
    ) -> list[int]:
        counts = [0] * minutes
        for row in self._db.execute(_Q["finished_per_minute"], {
                "namespace": namespace, "since": since, "until": since + 60 * minutes}):
            if 0 <= row["minute"] < minutes:
                counts[row["minute"]] += row["n"]
        return counts

    async def dead_letters(self, namespace: str, limit: int = 100) -> list[OutboxEntry]:
        rows = self._db.execute(_Q["dead_letters"], {"namespace": namespace,
                                                     "limit": limit}).fetchall()
        return [_entry(r) for r in rows]

    async def prune_runs(self, namespace: str, before: float, limit: int) -> int:
        args = {"namespace": namespace, "before": before, "limit": limit}
        if self._one(_Q["prunable"], args) is None:
            return 0
        async with self._tx() as db:
            ids = [row[0] for row in db.execute(_Q["prunable"], args)]
            batch = {"ids": _json.dumps(ids)}
            db.execute(_Q["prune_steps"], batch)
            db.execute(_Q["prune_outbox"], batch)
            db.execute(_Q["prune_signals"], batch)
            db.execute(_QG["graph_prune_run_writes"], batch)
            db.execute(_QG["graph_prune_run_checkpoints"], batch)
            return db.execute(_Q["prune_runs"], batch).rowcount

    async def stats(self, namespace: str, now: float) -> Stats:
        rows = self._db.execute(_Q["stats"], {"namespace": namespace, "now": now,
                                              "since": since(now)}).fetchall()
        return stats_from_rows(namespace, now, rows)

    async def fold_stats(self, namespace: str, now: float) -> None:
        args = {"namespace": namespace, "keep": keep(now)}
        if not any(row["todo"] for row in self._db.execute(_Q["fold_sums"], args).fetchall()):
            return   # nothing to fold: no write lock taken
        async with self._tx() as db:
            sums = db.execute(_Q["fold_sums"], args).fetchall()
            db.execute(_Q["fold_delete"], args)
            db.executemany(_Q["fold_insert"], [
                {"namespace": namespace, "workflow": row["workflow"], "status": row["status"],
                 "folded": row["folded"], "n": row["n"]} for row in sums if row["n"]])

    async def wait_for_work(self, timeout: float) -> None:
        # PRAGMA data_version changes when another connection commits: a cheap, local wake-up.
        deadline = time.monotonic() + timeout
        while self._conn is not None:
            row = self._one("PRAGMA data_version")
            version = row[0] if row is not None else 0
            if version != self._data_version:
                self._data_version = version
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            await asyncio.sleep(min(0.02, remaining))


def _claim_args(namespace: str, workflows: Sequence[str], limit: int, now: float,
                version: str | None, any_version: Sequence[str]) -> dict[str, Any]:
    """The arguments of ``claim_candidates``."""
    return {"namespace": namespace, "workflows": _json.dumps(list(workflows)), "now": now,
            "scan": limit * 4 + 16, "version": version,
            "any_version": _json.dumps(list(any_version))}


def _settle(db: sqlite3.Connection, fence: Fence, settlement: Settlement, now: float) -> bool:
    """``settle_run``'s statement, in the caller's write transaction."""
    outcome = settlement.outcome
    cur = db.execute(_Q["settle"], {
        "status": "queued" if outcome == "retry" else outcome,
        "output": _json.dumps(settlement.output) if outcome == "succeeded" else None,
        "error": settlement.error, "traceback": settlement.traceback,
        "finished_at": None if outcome == "retry" else now,
        "run_at": settlement.run_at if outcome == "retry" else now,
        "attempt_inc": 1 if outcome == "retry" else 0,
        "run_id": fence.run_id, "owner": fence.owner, "epoch": fence.epoch,
    })
    return cur.rowcount == 1


def _create_run(
    cur: sqlite3.Cursor, q: Mapping[str, str], new: NewRun, max_queued: int | None,
    admission: str,
) -> tuple[sqlite3.Row, bool]:
    """``create_run``'s statements (``q``: the named ones) on ``cur``, in its connection's
    transaction: the store's own write transaction, or a caller's."""
    args = {"namespace": new.namespace, "tenant": new.tenant, "workflow": new.workflow,
            "idempotency_key": new.idempotency_key}
    if new.idempotency_key is not None:
        row = cur.execute(q["find_idempotent"], args).fetchone()
        if row is not None:
            return row, False
    held = 0
    if max_queued is not None:
        queued, parked = cur.execute(q["count_queued"], {"namespace": new.namespace}).fetchone()
        if queued >= max_queued or parked > 0:
            if admission == "reject":
                raise AdmissionRejectedError(new.namespace, max_queued)
            held = 1
    try:
        row = cur.execute(q["insert_run"], {
            "id": new.id, "namespace": new.namespace, "tenant": new.tenant,
            "workflow": new.workflow, "input": _json.dumps(new.input),
            "priority": new.priority, "created_at": new.created_at, "run_at": new.run_at,
            "max_attempts": new.max_attempts, "concurrency_key": new.concurrency_key,
            "idempotency_key": new.idempotency_key, "version": new.version,
            "parent_id": new.parent_id, "root_id": new.root_id or new.id, "held": held,
            "trace_context": new.trace_context,
        }).fetchone()
    except sqlite3.IntegrityError:
        # a caller's transaction that read before another committed the same key (the store's
        # own write transaction holds the lock from its first read: never there)
        row = cur.execute(q["find_idempotent"], args).fetchone() \
            if new.idempotency_key is not None else None
        if row is None:
            raise
        return row, False
    return row, True


def _create_runs(
    cur: sqlite3.Cursor, q: Mapping[str, str], namespace: str, news: Sequence[NewRun],
    max_queued: int | None, admission: str,
) -> list[tuple[Run, bool]]:
    """``create_runs``' statements (``q``: the named ones) on ``cur``, in a transaction that
    holds the write lock: the store's own, or a caller's."""
    stored: dict[Key, Run] = {}
    for key in dict.fromkeys(k for k in map(key_of, news) if k is not None):
        row = cur.execute(q["find_idempotent"], {
            "namespace": namespace, "tenant": key[0], "workflow": key[1],
            "idempotency_key": key[2]}).fetchone()
        if row is not None:
            stored[key] = _run(row)
    fresh = [news[i] for i in firsts(news, stored)]
    queued = parked = 0
    if max_queued is not None and fresh:
        queued, parked = cur.execute(q["count_queued"], {"namespace": namespace}).fetchone()
    held = held_flags(namespace, len(fresh), queued, parked, max_queued, admission)
    rows = list(zip(fresh, held, (_json.dumps(n.input) for n in fresh), strict=True))
    cur.executemany(q["insert_runs"], [{
        "id": new.id, "namespace": namespace, "tenant": new.tenant,
        "workflow": new.workflow, "input": text, "priority": new.priority,
        "created_at": new.created_at, "run_at": new.run_at,
        "max_attempts": new.max_attempts, "concurrency_key": new.concurrency_key,
        "idempotency_key": new.idempotency_key, "version": new.version,
        "parent_id": new.parent_id, "root_id": new.root_id or new.id, "held": int(h),
        "trace_context": new.trace_context,
    } for new, h, text in rows])
    inserted = {new.id: queued_run(new, h, text) for new, h, text in rows}
    return answers(news, inserted, stored)


def _statements(sql: str) -> list[str]:
    """Split a migration or schema file into statements (sqlite3.complete_statement decides the
    ends)."""
    out, buf = [], ""
    for line in sql.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    if buf.strip() and not all(
        ln.strip().startswith("--") or not ln.strip() for ln in buf.splitlines()
    ):
        raise ConfigurationError(f"Incomplete SQL statement in a schema file: {buf[:80]!r}")
    return out


# runs_status's statuses (schema version 15)
RARE_STATUSES = frozenset({"failed", "cancelled", "sleeping", "waiting", "interrupted"})


def search_sql(namespace: str, where: RunFilter, before: str | None,
               limit: int) -> tuple[str, list[Any]]:
    """``search_runs`` as one statement, walking the narrowest index of its filters newest
    first: a key's, the status's (runs_status holds the statuses runs pass through rarely), or
    the namespace's."""
    terms, args = ["namespace = ?"], list[Any]([namespace])
    for column, value in (("status", where.status), ("workflow", where.workflow),
                          ("tenant", where.tenant), ("idempotency_key", where.idempotency_key),
                          ("concurrency_key", where.concurrency_key)):
        if value is not None:
            terms.append(f"{column} = ?")
            args.append(value)
    bounds: tuple[tuple[str, object], ...] = (
        ("created_at >= ?", where.created_from), ("created_at < ?", where.created_to),
        ("id < ?", before))
    for term, bound in bounds:
        if bound is not None:
            terms.append(term)
            args.append(bound)
    if where.idempotency_key is not None:
        index = "runs_idempotency_key"
        terms.append("idempotency_key IS NOT NULL")
    elif where.concurrency_key is not None:
        index = "runs_concurrency_key"
        terms.append("concurrency_key IS NOT NULL")
    elif where.status in RARE_STATUSES:
        index = "runs_status"
        # the partial index's own term
        terms.append("status IN ('failed', 'cancelled', 'sleeping', 'waiting', 'interrupted')")
    else:
        index = "runs_namespace"
    sql = (f"SELECT * FROM runs INDEXED BY {index} WHERE {' AND '.join(terms)} "
           f"ORDER BY id DESC LIMIT ?")
    return sql, [*args, limit]


def _real(value: float | None) -> float | None:
    """A REAL column's value (a time) as a float: ``RETURNING`` gives a whole number kept in
    one as an int, where a SELECT of the same row gives a float (SQLite stores such a value as
    an integer and converts it back on reads, but not in RETURNING)."""
    return None if value is None else float(value)


def _entry(row: sqlite3.Row) -> OutboxEntry:
    return OutboxEntry(
        id=row["id"], namespace=row["namespace"], run_id=row["run_id"], seq=row["seq"],
        index=row["idx"], topic=row["topic"], payload=_json.loads(row["payload"]),
        created_at=float(row["created_at"]), attempts=row["attempts"],
        next_at=float(row["next_at"]), delivered_at=_real(row["delivered_at"]),
        dead=bool(row["dead"]), error=row["error"],
        trace_context=row["trace_context"],
    )


def _pause(row: sqlite3.Row) -> Pause:
    return Pause(
        id=row["id"], namespace=row["namespace"], tenant=row["tenant"], run_id=row["run_id"],
        name=row["name"], request=_json.loads(row["request"]), status=row["status"],
        decision=_json.loads(row["decision"]), created_at=float(row["created_at"]),
        expires_at=_real(row["expires_at"]), resolved_at=_real(row["resolved_at"]),
        notified=bool(row["notified"]),
    )


def _run(row: sqlite3.Row) -> Run:
    return Run(
        id=row["id"], namespace=row["namespace"], tenant=row["tenant"],
        workflow=row["workflow"], input=_json.loads(row["input"]),
        output=_json.loads(row["output"]), error=row["error"], status=RunStatus(row["status"]),
        priority=row["priority"], created_at=float(row["created_at"]),
        run_at=_real(row["run_at"]),
        attempts=row["attempts"], max_attempts=row["max_attempts"],
        concurrency_key=row["concurrency_key"], idempotency_key=row["idempotency_key"],
        owner=row["owner"], lease_expires_at=_real(row["lease_expires_at"]),
        lease_epoch=row["lease_epoch"], cancel_requested=bool(row["cancel_requested"]),
        version=row["version"], parent_id=row["parent_id"], root_id=row["root_id"],
        wait_for=row["wait_for"], held=bool(row["held"]), started_at=_real(row["started_at"]),
        finished_at=_real(row["finished_at"]), resume_reason=row["resume_reason"],
        traceback=row["traceback"],
        progress=progress_of(row["progress"], _real(row["progress_at"])),
        trace_context=row["trace_context"],
    )
