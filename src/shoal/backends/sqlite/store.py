"""SQLite store: several processes on one machine over one file.

WAL mode (readers never block the writer), a busy timeout of 5 s (a writer waits for the other's
lock, then fails with StoreUnavailableError; it never hangs), every atomic operation in one
``BEGIN IMMEDIATE`` transaction, claims with ``UPDATE … RETURNING``. One connection per store
object (:mod:`shoal.backends.sqlite.connection`), handed to the parts that each hold one concern
(runs, steps, pauses, outbox, inspection, coordination, rates, graph checkpoints); the store is
the front that implements the ports with their methods (:func:`shoal.backends._parts.part`).
``sqlite:///:memory:`` is one connection, so it serves one process only.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from shoal.backends import _held
from shoal.backends._parts import part
from shoal.backends._sql import behind, current_schema, migrations
from shoal.backends.sqlite.batches import GroupCommit
from shoal.backends.sqlite.connection import SQLiteConnection, unavailable_on_failure
from shoal.backends.sqlite.coord import SQLiteCoordination
from shoal.backends.sqlite.graphs import SQLiteGraphCheckpoints
from shoal.backends.sqlite.held import SQLiteHoldCounts
from shoal.backends.sqlite.inspection import SQLiteInspection
from shoal.backends.sqlite.outbox import SQLiteOutbox
from shoal.backends.sqlite.pauses import SQLitePauses
from shoal.backends.sqlite.rates import SQLiteRateLimits
from shoal.backends.sqlite.rows import _run as _run
from shoal.backends.sqlite.runs import SQLiteRuns
from shoal.backends.sqlite.runs import _create_run as _create_run
from shoal.backends.sqlite.steps import SQLiteSteps
from shoal.errors import ConfigurationError, StoreUnavailableError
from shoal.types import HELD_BACK_CAP


@unavailable_on_failure
class SQLiteStore:
    """The ``sqlite:///path`` store. ``synchronous`` is SQLite's setting (default ``full``)."""

    def __init__(self, path: str, *, busy_timeout: float = 5.0, synchronous: str = "full") -> None:
        connection = SQLiteConnection(path, busy_timeout=busy_timeout, synchronous=synchronous)
        self.path = path
        self.url = f"sqlite:///{path}"
        self.busy_timeout = busy_timeout
        self.synchronous = connection.synchronous
        self._connection = connection
        # checkpoints and settlements of several runs share a transaction (batches.py)
        self._writes = GroupCommit(connection.tx)
        self._runs = SQLiteRuns(connection, self._writes)
        self._steps = SQLiteSteps(connection, self._writes)
        self._pauses = SQLitePauses(connection)
        self._outbox = SQLiteOutbox(connection)
        self._inspection = SQLiteInspection(connection)
        self._coord = SQLiteCoordination(connection)
        self._rates = SQLiteRateLimits(connection)
        self._graphs = SQLiteGraphCheckpoints(connection)
        self._held = SQLiteHoldCounts(connection)

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
        connection = self._connection
        if connection.conn is not None:
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
        connection.connect()
        try:
            if not migrate:
                # read before setup: switching a file to WAL takes the write lock, which may be
                # held by a transaction of this very process (a client opened inside it), so a
                # schema behind is refused at once instead of after busy_timeout
                found: list[int] = []
                await connection.retry_busy(lambda: found.append(self._version()))
                behind(self.url, "sqlite", found[-1], migrate=False)
            await connection.setup()
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
        self._connection.close()

    async def migrate(self) -> int:
        """Bring the file to the newest version in one ``BEGIN IMMEDIATE`` transaction: a file
        with no shoal schema gets ``schema.sql`` in one go, one behind gets its missing
        migrations in order. A current file is only read."""
        found = self._version()
        if not behind(self.url, "sqlite", found, migrate=True):
            return found   # up to date: no write lock needed to start
        async with self._connection.tx() as db:
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
        one = self._connection.one
        if one("SELECT 1 FROM sqlite_master WHERE name = 'shoal_migrations'") is None:
            return 0
        row = one("SELECT max(version) FROM shoal_migrations")
        return int(row[0]) if row is not None and row[0] is not None else 0

    @property
    def _db(self) -> sqlite3.Connection:
        """The open connection (StoreUnavailableError if it is not)."""
        return self._connection.db

    ping = part("_connection", SQLiteConnection.ping)
    wait_for_work = part("_connection", SQLiteConnection.wait_for_work)

    # -- what holds runs back (shoal.ports.FlowView) ------------------------------------------

    async def held_back(
        self, namespace: str, now: float, *, cap: int = HELD_BACK_CAP
    ) -> dict[str, dict[str, int]]:
        return await _held.held_back(self._runs, self._held, namespace, now, cap)

    async def hold_reason(self, run_id: str, now: float) -> str | None:
        return await _held.hold_reason(self._runs, self._held, await self._runs.get_run(run_id),
                                       now)

    # -- runs ------------------------------------------------------------------------------------

    register_workflows = part("_runs", SQLiteRuns.register_workflows)
    get_workflow = part("_runs", SQLiteRuns.get_workflow)
    list_workflows = part("_runs", SQLiteRuns.list_workflows)
    pause_workflow = part("_runs", SQLiteRuns.pause_workflow)
    resume_workflow = part("_runs", SQLiteRuns.resume_workflow)
    paused_workflows = part("_runs", SQLiteRuns.paused_workflows)
    set_tenant_weight = part("_runs", SQLiteRuns.set_tenant_weight)
    tenant_weights = part("_runs", SQLiteRuns.tenant_weights)
    create_run = part("_runs", SQLiteRuns.create_run)
    create_run_in = part("_runs", SQLiteRuns.create_run_in)
    create_runs = part("_runs", SQLiteRuns.create_runs)
    create_runs_in = part("_runs", SQLiteRuns.create_runs_in)
    incompatible_runs = part("_runs", SQLiteRuns.incompatible_runs)
    get_run = part("_runs", SQLiteRuns.get_run)
    list_runs = part("_runs", SQLiteRuns.list_runs)
    claim_runs = part("_runs", SQLiteRuns.claim_runs)
    renew_leases = part("_runs", SQLiteRuns.renew_leases)
    settle_run = part("_runs", SQLiteRuns.settle_run)
    settle_and_claim = part("_runs", SQLiteRuns.settle_and_claim)
    release_run = part("_runs", SQLiteRuns.release_run)
    recover_runs = part("_runs", SQLiteRuns.recover_runs)
    cancel_run = part("_runs", SQLiteRuns.cancel_run)
    retry_run = part("_runs", SQLiteRuns.retry_run)
    release_held = part("_runs", SQLiteRuns.release_held)
    prune_runs = part("_runs", SQLiteRuns.prune_runs)
    stats = part("_runs", SQLiteRuns.stats)
    fold_stats = part("_runs", SQLiteRuns.fold_stats)

    # -- checkpoints, signals, tree state --------------------------------------------------------

    load_steps = part("_steps", SQLiteSteps.load_steps)
    checkpoint_step = part("_steps", SQLiteSteps.checkpoint_step)
    record_progress = part("_steps", SQLiteSteps.record_progress)
    suspend_run = part("_steps", SQLiteSteps.suspend_run)
    wait_signal = part("_steps", SQLiteSteps.wait_signal)
    send_signal = part("_steps", SQLiteSteps.send_signal)
    save_tree_key = part("_steps", SQLiteSteps.save_tree_key)
    get_tree_key = part("_steps", SQLiteSteps.get_tree_key)
    tree_keys = part("_steps", SQLiteSteps.tree_keys)
    wait_child = part("_steps", SQLiteSteps.wait_child)

    # -- pauses ----------------------------------------------------------------------------------

    create_pause = part("_pauses", SQLitePauses.create_pause)
    get_pause = part("_pauses", SQLitePauses.get_pause)
    wait_pause = part("_pauses", SQLitePauses.wait_pause)
    resolve_pause = part("_pauses", SQLitePauses.resolve_pause)
    list_pauses = part("_pauses", SQLitePauses.list_pauses)
    expire_pauses = part("_pauses", SQLitePauses.expire_pauses)
    claim_notifications = part("_pauses", SQLitePauses.claim_notifications)
    mark_notified = part("_pauses", SQLitePauses.mark_notified)
    prune_pauses = part("_pauses", SQLitePauses.prune_pauses)

    # -- outbox ----------------------------------------------------------------------------------

    claim_outbox = part("_outbox", SQLiteOutbox.claim_outbox)
    finish_delivery = part("_outbox", SQLiteOutbox.finish_delivery)
    dead_letters = part("_outbox", SQLiteOutbox.dead_letters)
    redrive = part("_outbox", SQLiteOutbox.redrive)

    # -- what a console reads --------------------------------------------------------------------

    search_runs = part("_inspection", SQLiteInspection.search_runs)
    inspect_run = part("_inspection", SQLiteInspection.inspect_run)
    run_owners = part("_inspection", SQLiteInspection.run_owners)
    finished_per_minute = part("_inspection", SQLiteInspection.finished_per_minute)

    # -- coordination ----------------------------------------------------------------------------

    lock_acquire = part("_coord", SQLiteCoordination.lock_acquire)
    lock_renew = part("_coord", SQLiteCoordination.lock_renew)
    lock_release = part("_coord", SQLiteCoordination.lock_release)
    lock_watch = part("_coord", SQLiteCoordination.lock_watch)
    heartbeat = part("_coord", SQLiteCoordination.heartbeat)
    leave = part("_coord", SQLiteCoordination.leave)
    meter = part("_coord", SQLiteCoordination.meter)
    coordination_view = part("_coord", SQLiteCoordination.coordination_view)
    prune_coordination = part("_coord", SQLiteCoordination.prune_coordination)

    # -- rate limits and the ledger --------------------------------------------------------------

    slot_acquire = part("_rates", SQLiteRateLimits.slot_acquire)
    slot_renew = part("_rates", SQLiteRateLimits.slot_renew)
    slot_release = part("_rates", SQLiteRateLimits.slot_release)
    window_add = part("_rates", SQLiteRateLimits.window_add)
    window_clear = part("_rates", SQLiteRateLimits.window_clear)
    read_rates = part("_rates", SQLiteRateLimits.read_rates)
    pause_until = part("_rates", SQLiteRateLimits.pause_until)
    paused_until = part("_rates", SQLiteRateLimits.paused_until)
    admit = part("_rates", SQLiteRateLimits.admit)
    counter_add = part("_rates", SQLiteRateLimits.counter_add)
    ledger = part("_rates", SQLiteRateLimits.ledger)
    prune_rates = part("_rates", SQLiteRateLimits.prune_rates)

    # -- LangGraph checkpoints -------------------------------------------------------------------

    put_graph_checkpoint = part("_graphs", SQLiteGraphCheckpoints.put_graph_checkpoint)
    put_graph_writes = part("_graphs", SQLiteGraphCheckpoints.put_graph_writes)
    get_graph_checkpoint = part("_graphs", SQLiteGraphCheckpoints.get_graph_checkpoint)
    list_graph_checkpoints = part("_graphs", SQLiteGraphCheckpoints.list_graph_checkpoints)
    delete_graph_threads = part("_graphs", SQLiteGraphCheckpoints.delete_graph_threads)
    delete_graph_runs = part("_graphs", SQLiteGraphCheckpoints.delete_graph_runs)
    copy_graph_thread = part("_graphs", SQLiteGraphCheckpoints.copy_graph_thread)
    prune_graph_threads = part("_graphs", SQLiteGraphCheckpoints.prune_graph_threads)


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
