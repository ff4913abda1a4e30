"""PostgreSQL store: several replicas on several machines over one database.

psycopg 3 (async) with a connection pool. Every table lives in the store's own schema (default
``shoal``), set as each pooled connection's ``search_path``; the schema is created from
``schema.sql`` and upgraded by versioned ``.sql`` migrations, under an advisory lock, so instances
that start together migrate once. Pooled connections run in autocommit: an operation that is one
statement (a claim, a checkpoint, a settlement) costs one round trip and one commit; the others run
in one explicit transaction. Claims lock their rows with ``FOR UPDATE SKIP LOCKED``, and a unique
partial index makes the database itself refuse a second live run of a concurrency key. Writes
that make work due for another instance ``NOTIFY`` a channel named after the schema;
:meth:`PostgresStore.wait_for_work` listens on a dedicated connection (outside the pool) that
reconnects when it drops.

Behind a pooler in transaction mode (``?pooler=transaction``: PgBouncer's ``pool_mode =
transaction``, RDS Proxy, Supavisor, Neon's pooler) consecutive transactions of one client
connection may run on different server connections, so the store keeps no session state: no
``SET``, no LISTEN, no prepared statement (``prepare_threshold=None``). Each transaction sets the
search_path and ``shoal.counted`` itself, for itself only (``SET LOCAL`` after ``BEGIN``, in the
same message; ``set_config(..., true)`` ahead of a lone statement, in one pipeline): no extra
round trip, and nothing parses or rewrites the statements. LISTEN goes to ``?direct_url=`` when
given (a URL of the server itself); without it, wake-ups come from polling (see
:data:`POLL_INTERVAL`).

The store is a thin front (:mod:`shoal.backends._parts`): one object owns the connections
(:class:`~shoal.backends.postgres.connections.Connections`) and each port method is the method of
the part that holds its concern, handed that object: runs (``runs.py``, ``dispatch.py``,
``steps.py``, ``pauses.py``, ``trees.py``, ``outbox.py``, ``inspection.py``, ``workflows.py``),
coordination (``coord.py``), rates (``rates.py``), graph checkpoints (``graphs.py``) and the
wake-ups (``notifications.py``).
"""

from __future__ import annotations

import functools
import math
import re
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlencode

import psycopg
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict

from shoal.backends import _held
from shoal.backends._parts import part
from shoal.backends._sql import behind, current_schema, migrations
from shoal.backends._urls import mask_url
from shoal.backends.postgres.connections import Connections, Q
from shoal.backends.postgres.coord import PostgresCoordination
from shoal.backends.postgres.dispatch import PostgresDispatch
from shoal.backends.postgres.graphs import PostgresGraphCheckpoints
from shoal.backends.postgres.held import PostgresHoldCounts
from shoal.backends.postgres.inspection import PostgresInspection
from shoal.backends.postgres.notifications import POLL_INTERVAL, LockWatches, Notifications
from shoal.backends.postgres.outbox import PostgresOutbox
from shoal.backends.postgres.pauses import PostgresPauses
from shoal.backends.postgres.rates import PostgresRateLimits
from shoal.backends.postgres.runs import PostgresRuns
from shoal.backends.postgres.steps import PostgresCheckpoints
from shoal.backends.postgres.trees import PostgresTrees
from shoal.backends.postgres.workflows import PostgresWorkflows
from shoal.errors import ConfigurationError
from shoal.types import HELD_BACK_CAP

if TYPE_CHECKING:
    from shoal.ports import CoordStore, GraphCheckpoints, RateStore, Store, TransactionalDispatch

__all__ = ["POLL_INTERVAL", "PostgresStore"]

_SCHEMA = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,48}$")
# shoal's own URL options; every other query option goes to libpq as written
_OPTIONS = {"schema", "pool_min_size", "pool_max_size", "open_timeout", "pool_timeout",
            "reconnect_timeout", "command_timeout", "pooler", "direct_url"}
_POOLERS = ("session", "transaction")


class PostgresStore:
    """The ``postgresql://user:password@host:port/db?schema=shoal`` store.

    ``schema`` is created if missing and holds every table; ``pool_min_size``/``pool_max_size``
    size the connection pool (default 1 and 10). Operations take turns at the connections, first
    come, first served (renewals first); those waiting fail only when the queue has not moved
    (no operation got a connection) for ``pool_timeout`` seconds (default 2), so a burst of any
    size completes and an outage fails fast. ``reconnect_timeout`` (default 3 s) bounds the
    pool's reconnect backoff, so work resumes as soon as the server is back (psycopg_pool's own
    defaults, 30 s and 300 s with exponential backoff, left instances idle for tens of seconds
    after a long outage). ``command_timeout`` (default 30 s) bounds how long an operation's
    statements may go unanswered: past it the connection is closed, never used again, and the
    operation fails with StoreUnavailableError. A partition that holds the bytes (no reset, so
    no error, and TCP keepalives answered by a proxy on the way) would otherwise leave the
    operation, and its pooled connection, waiting for ever. Migrations are not bounded. Other
    query options go to libpq as written (``sslmode``, ``connect_timeout``,
    ``host=/socket/dir``, …).
    """

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = "shoal",
        pool_min_size: int = 1,
        pool_max_size: int = 10,
        open_timeout: float = 10.0,
        pool_timeout: float = 2.0,
        reconnect_timeout: float = 3.0,
        command_timeout: float = 30.0,
        pooler: str | None = None,
        direct_url: str | None = None,
    ) -> None:
        if pooler is not None and pooler not in _POOLERS:
            raise ConfigurationError(
                f"pooler={pooler!r} is not a pooling mode shoal knows: write pooler=transaction "
                f"behind a pooler that lends a server connection per transaction (PgBouncer's "
                f"pool_mode = transaction, RDS Proxy, Supabase's or Neon's pooler), "
                f"pooler=session behind one that keeps it for the whole connection, or leave "
                f"it out.")
        if not _SCHEMA.match(schema):
            raise ConfigurationError(
                f"Bad PostgreSQL schema name {schema!r}: use letters, digits and underscores, "
                f"starting with a letter or an underscore, at most 49 characters."
            )
        _check_options(pool_min_size=pool_min_size, pool_max_size=pool_max_size,
                       open_timeout=open_timeout, pool_timeout=pool_timeout,
                       reconnect_timeout=reconnect_timeout, command_timeout=command_timeout)
        self.conninfo = conninfo
        self.schema = schema
        self.pooler = pooler
        self.direct_url = direct_url
        # no session state: every transaction scopes its settings to itself (see the module)
        self.stateless = pooler == "transaction"
        shown = {"schema": schema, **({"pooler": pooler} if pooler else {}),
                 **({"direct_url": direct_url} if direct_url else {})}
        self.url = f"{conninfo}{'&' if '?' in conninfo else '?'}{urlencode(shown)}"
        # The runs_ended trigger (schema.sql, 0003_trees.sql) builds the same name from its
        # table's schema.
        self.channel = f"shoal_{schema}"
        self.pool_min_size = pool_min_size
        self.pool_max_size = pool_max_size
        self.open_timeout = open_timeout
        self.pool_timeout = pool_timeout
        self.reconnect_timeout = reconnect_timeout
        self.command_timeout = command_timeout
        self.db = Connections(
            conninfo, schema=schema, url=self.url, stateless=self.stateless,
            direct_url=direct_url, pool_min_size=pool_min_size, pool_max_size=pool_max_size,
            open_timeout=open_timeout, pool_timeout=pool_timeout,
            reconnect_timeout=reconnect_timeout, command_timeout=command_timeout)
        locks = LockWatches(self.db)
        self.notifications = Notifications(self.db, self.channel, locks)
        self.workflows = PostgresWorkflows(self.db, self.channel)
        self.dispatch = PostgresDispatch(self.db, self.channel)
        self.runs = PostgresRuns(self.db, self.channel)
        self.steps = PostgresCheckpoints(self.db, self.channel)
        self.pauses = PostgresPauses(self.db, self.channel)
        self.trees = PostgresTrees(self.db)
        self.outbox = PostgresOutbox(self.db)
        self.inspection = PostgresInspection(self.db)
        self.coord = PostgresCoordination(self.db, self.channel, locks, self.notifications)
        self.rates = PostgresRateLimits(self.db)
        self.graphs = PostgresGraphCheckpoints(self.db)
        self.held = PostgresHoldCounts(self.db)

    @property
    def in_flight(self) -> int:
        """Operations not answered yet (waiting on the server or queued for a batch): a test
        that settles an event loop waits for 0."""
        return (self.db.busy + len(self.runs.settles.queue)
                + len(self.steps.checkpoints.queue))

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        """Any libpq URL (``postgresql://`` or ``postgres://``: Unix sockets, host lists,
        ``?host=/dir``, ``sslmode`` and the other libpq parameters) as psycopg takes it, with
        shoal's own options (``schema``, ``pool_min_size``, …) taken out of the query. An option
        that is neither shoal's nor libpq's, or a bad value of shoal's, is a ConfigurationError
        naming it."""
        if not url.startswith(("postgresql://", "postgres://")):
            raise ConfigurationError(
                f"Bad PostgreSQL URL {mask_url(url)!r}: write "
                f"'postgresql://user:password@host:5432/database?schema=shoal'."
            )
        conninfo, ours = _split_options(url)
        try:
            conninfo_to_dict(conninfo)   # libpq's own parser: what it refuses, it never connects
        except psycopg.Error as e:
            raise ConfigurationError(f"Bad PostgreSQL URL {mask_url(url)!r}: {e}") from None
        direct = ours.get("direct_url")
        if direct is not None:
            try:
                conninfo_to_dict(direct)
            except psycopg.Error:
                # libpq's reason may quote the value, password and all: not shown
                raise ConfigurationError(
                    f"direct_url in the PostgreSQL URL {mask_url(url)!r} is not a URL libpq "
                    f"can read: write the server's own URL, percent-encoded, as in "
                    f"?direct_url=postgresql%3A%2F%2Fuser%40host%3A5432%2Fdb.") from None

        def number(name: str, kind: type[int] | type[float], default: float) -> Any:
            if name not in ours:
                return default
            try:
                return kind(ours[name])
            except ValueError:
                raise ConfigurationError(
                    f"{name}={ours[name]!r} in the PostgreSQL URL {mask_url(url)!r} is not "
                    f"{'a whole number' if kind is int else 'a number of seconds'}."
                ) from None

        return cls(
            conninfo,
            schema=ours.get("schema", "shoal"),
            pool_min_size=number("pool_min_size", int, 1),
            pool_max_size=number("pool_max_size", int, 10),
            open_timeout=number("open_timeout", float, 10.0),
            pool_timeout=number("pool_timeout", float, 2.0),
            reconnect_timeout=number("reconnect_timeout", float, 3.0),
            command_timeout=number("command_timeout", float, 30.0),
            pooler=ours.get("pooler"),
            direct_url=direct,
        )

    # -- connection and schema -------------------------------------------------------------

    async def open(self, *, migrate: bool = True) -> None:
        if self.db.pool is not None:
            return
        await self.db.open()
        try:
            if migrate:
                await self.migrate()
            else:
                behind(mask_url(self.url), "postgres", await self._version(), migrate=False)
        except BaseException:
            await self.db.abandon()
            raise

    async def exists(self) -> bool:
        """Whether the schema holds a shoal store (its migrations table), read on one connection
        without creating anything: a command that only reads must not make a store out of a
        mistyped schema name."""
        return await self.db.exists()

    async def close(self) -> None:
        # writes already asked for are still made
        await self.runs.settles.drain()
        await self.steps.checkpoints.drain()
        await self.steps.progress.drain()
        await self.notifications.stop()
        opened = self.db.pool is not None
        await self.db.close()
        if opened:
            self.notifications.work.set()

    async def migrate(self) -> int:
        """Bring the schema to the newest version in one transaction under an advisory lock: a
        schema with no shoal store gets ``schema.sql`` in one go, one behind gets its missing
        migrations in order. A schema already current is only read (no lock, no DDL): a role
        allowed rows and nothing else opens it."""
        masked = mask_url(self.url)
        found = await self._version()
        if not behind(masked, "postgres", found, migrate=True):
            return found
        schema = sql.Identifier(self.schema)
        table = sql.Identifier(self.schema, "shoal_migrations")
        # Safe through a pooler in transaction mode: one transaction, whose lock, search_path
        # (which the functions keep: SET search_path FROM CURRENT) and DDL all end with it.
        async with self.db.privileged(), self.db.connection(bounded=False) as conn, \
                self.db.transaction(conn):
            await conn.execute(Q["advisory_xact_lock"], {"key": f"shoal:migrate:{self.schema}"})
            cur = await conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s",
                                     {"schema": self.schema})
            if await cur.fetchone() is None:
                await conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
            await conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (version integer PRIMARY KEY, name text NOT NULL, "
                "applied_at double precision NOT NULL)").format(table))
            cur = await conn.execute(sql.SQL("SELECT version FROM {}").format(table))
            done = {row["version"] for row in await cur.fetchall()}
            version = max(done, default=0)
            behind(masked, "postgres", version, migrate=True)   # a newer shoal came first
            if not done:
                await conn.execute(current_schema("postgres"))
                # what the script recorded; a migration newer than the script still follows
                cur = await conn.execute(sql.SQL("SELECT version FROM {}").format(table))
                done = {row["version"] for row in await cur.fetchall()}
                version = max(done, default=0)
            for number, name, text in migrations("postgres"):
                if number in done:
                    continue
                # A file holds several statements and no parameters: sent as one simple query.
                await conn.execute(text)
                await conn.execute(
                    sql.SQL("INSERT INTO {} (version, name, applied_at) "
                            "VALUES (%(v)s, %(n)s, %(t)s)").format(table),
                    {"v": number, "n": name, "t": time.time()},
                )
                version = number
        return version

    async def _version(self) -> int:
        """The schema's version, 0 when it holds no shoal store; reads only."""
        async with self.db.privileged(), self.db.connection() as conn:
            cur = await conn.execute("SELECT to_regclass(%(table)s) AS t",
                                     {"table": f'"{self.schema}".shoal_migrations'})
            row = await cur.fetchone()
            if row is None or row["t"] is None:
                return 0
            table = sql.Identifier(self.schema, "shoal_migrations")
            cur = await conn.execute(
                sql.SQL("SELECT coalesce(max(version), 0) AS v FROM {}").format(table))
            row = await cur.fetchone()
            return int(row["v"]) if row is not None else 0

    async def ping(self) -> None:
        async with self.db.connection() as conn:
            await conn.execute("SELECT 1")

    # -- the ports, each method its part's own (see shoal.backends._parts) ---------------

    wait_for_work = part("notifications", Notifications.wait_for_work)

    register_workflows = part("workflows", PostgresWorkflows.register_workflows)
    get_workflow = part("workflows", PostgresWorkflows.get_workflow)
    list_workflows = part("workflows", PostgresWorkflows.list_workflows)
    pause_workflow = part("workflows", PostgresWorkflows.pause_workflow)
    resume_workflow = part("workflows", PostgresWorkflows.resume_workflow)
    paused_workflows = part("workflows", PostgresWorkflows.paused_workflows)
    set_tenant_weight = part("workflows", PostgresWorkflows.set_tenant_weight)
    tenant_weights = part("workflows", PostgresWorkflows.tenant_weights)

    create_run = part("dispatch", PostgresDispatch.create_run)
    create_runs = part("dispatch", PostgresDispatch.create_runs)
    create_run_in = part("dispatch", PostgresDispatch.create_run_in)
    create_runs_in = part("dispatch", PostgresDispatch.create_runs_in)
    release_held = part("dispatch", PostgresDispatch.release_held)

    async def held_back(
        self, namespace: str, now: float, *, cap: int = HELD_BACK_CAP
    ) -> dict[str, dict[str, int]]:
        return await _held.held_back(self.workflows, self.held, namespace, now, cap)

    async def hold_reason(self, run_id: str, now: float) -> str | None:
        return await _held.hold_reason(self.workflows, self.held,
                                       await self.runs.get_run(run_id), now)

    get_run = part("runs", PostgresRuns.get_run)
    list_runs = part("runs", PostgresRuns.list_runs)
    claim_runs = part("runs", PostgresRuns.claim_runs)
    incompatible_runs = part("runs", PostgresRuns.incompatible_runs)
    renew_leases = part("runs", PostgresRuns.renew_leases)
    settle_run = part("runs", PostgresRuns.settle_run)
    settle_and_claim = part("runs", PostgresRuns.settle_and_claim)
    release_run = part("runs", PostgresRuns.release_run)
    recover_runs = part("runs", PostgresRuns.recover_runs)
    cancel_run = part("runs", PostgresRuns.cancel_run)
    retry_run = part("runs", PostgresRuns.retry_run)
    prune_runs = part("runs", PostgresRuns.prune_runs)
    stats = part("runs", PostgresRuns.stats)
    fold_stats = part("runs", PostgresRuns.fold_stats)

    load_steps = part("steps", PostgresCheckpoints.load_steps)
    checkpoint_step = part("steps", PostgresCheckpoints.checkpoint_step)
    record_progress = part("steps", PostgresCheckpoints.record_progress)
    suspend_run = part("steps", PostgresCheckpoints.suspend_run)
    wait_signal = part("steps", PostgresCheckpoints.wait_signal)
    send_signal = part("steps", PostgresCheckpoints.send_signal)

    create_pause = part("pauses", PostgresPauses.create_pause)
    get_pause = part("pauses", PostgresPauses.get_pause)
    wait_pause = part("pauses", PostgresPauses.wait_pause)
    resolve_pause = part("pauses", PostgresPauses.resolve_pause)
    list_pauses = part("pauses", PostgresPauses.list_pauses)
    expire_pauses = part("pauses", PostgresPauses.expire_pauses)
    claim_notifications = part("pauses", PostgresPauses.claim_notifications)
    mark_notified = part("pauses", PostgresPauses.mark_notified)
    prune_pauses = part("pauses", PostgresPauses.prune_pauses)

    save_tree_key = part("trees", PostgresTrees.save_tree_key)
    get_tree_key = part("trees", PostgresTrees.get_tree_key)
    tree_keys = part("trees", PostgresTrees.tree_keys)
    wait_child = part("trees", PostgresTrees.wait_child)

    claim_outbox = part("outbox", PostgresOutbox.claim_outbox)
    finish_delivery = part("outbox", PostgresOutbox.finish_delivery)
    dead_letters = part("outbox", PostgresOutbox.dead_letters)
    redrive = part("outbox", PostgresOutbox.redrive)

    search_runs = part("inspection", PostgresInspection.search_runs)
    inspect_run = part("inspection", PostgresInspection.inspect_run)
    run_owners = part("inspection", PostgresInspection.run_owners)
    finished_per_minute = part("inspection", PostgresInspection.finished_per_minute)

    lock_acquire = part("coord", PostgresCoordination.lock_acquire)
    lock_renew = part("coord", PostgresCoordination.lock_renew)
    lock_release = part("coord", PostgresCoordination.lock_release)
    lock_watch = part("coord", PostgresCoordination.lock_watch)
    heartbeat = part("coord", PostgresCoordination.heartbeat)
    leave = part("coord", PostgresCoordination.leave)
    meter = part("coord", PostgresCoordination.meter)
    coordination_view = part("coord", PostgresCoordination.coordination_view)
    prune_coordination = part("coord", PostgresCoordination.prune_coordination)

    slot_acquire = part("rates", PostgresRateLimits.slot_acquire)
    slot_renew = part("rates", PostgresRateLimits.slot_renew)
    slot_release = part("rates", PostgresRateLimits.slot_release)
    admit = part("rates", PostgresRateLimits.admit)
    window_add = part("rates", PostgresRateLimits.window_add)
    window_clear = part("rates", PostgresRateLimits.window_clear)
    pause_until = part("rates", PostgresRateLimits.pause_until)
    paused_until = part("rates", PostgresRateLimits.paused_until)
    read_rates = part("rates", PostgresRateLimits.read_rates)
    counter_add = part("rates", PostgresRateLimits.counter_add)
    ledger = part("rates", PostgresRateLimits.ledger)
    prune_rates = part("rates", PostgresRateLimits.prune_rates)

    put_graph_checkpoint = part("graphs", PostgresGraphCheckpoints.put_graph_checkpoint)
    put_graph_writes = part("graphs", PostgresGraphCheckpoints.put_graph_writes)
    get_graph_checkpoint = part("graphs", PostgresGraphCheckpoints.get_graph_checkpoint)
    list_graph_checkpoints = part("graphs", PostgresGraphCheckpoints.list_graph_checkpoints)
    delete_graph_threads = part("graphs", PostgresGraphCheckpoints.delete_graph_threads)
    delete_graph_runs = part("graphs", PostgresGraphCheckpoints.delete_graph_runs)
    copy_graph_thread = part("graphs", PostgresGraphCheckpoints.copy_graph_thread)
    prune_graph_threads = part("graphs", PostgresGraphCheckpoints.prune_graph_threads)

def _split_options(url: str) -> tuple[str, dict[str, str]]:
    """The URL without shoal's own query options, every other character as written (libpq
    parses it, not shoal), and shoal's options, decoded. An option that libpq does not know
    either is a ConfigurationError."""
    base, _, query = url.partition("?")
    ours: dict[str, str] = {}
    rest: list[str] = []
    for pair in query.split("&") if query else []:
        key, _, value = pair.partition("=")
        name = unquote(key)
        if name in _OPTIONS:
            ours[name] = unquote(value)
        elif name in _libpq_keywords():
            rest.append(pair)
        elif pair:
            raise ConfigurationError(
                f"Unknown option {name!r} in the PostgreSQL URL {mask_url(url)!r}: shoal's "
                f"options are {', '.join(sorted(_OPTIONS))}; any other must be a libpq "
                f"connection parameter (sslmode, connect_timeout, application_name, …; see "
                f"https://www.postgresql.org/docs/current/libpq-connect.html)."
            )
    return base + ("?" + "&".join(rest) if rest else ""), ours

@functools.cache
def _libpq_keywords() -> frozenset[str]:
    """The connection parameters of the libpq psycopg uses, and ``ssl``, libpq's URL alias
    of ``sslmode=require``."""
    return frozenset({d.keyword.decode() for d in pq.Conninfo.get_defaults()} | {"ssl"})

def _check_options(*, pool_min_size: int, pool_max_size: int, **timeouts: float) -> None:
    """Pool sizes are whole numbers with 1 <= pool_min_size <= pool_max_size; timeouts are
    seconds > 0: a ConfigurationError names the first option that is not."""
    for name, size in (("pool_min_size", pool_min_size), ("pool_max_size", pool_max_size)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigurationError(f"{name}={size!r} must be a whole number >= 1.")
    if pool_max_size < pool_min_size:
        raise ConfigurationError(
            f"pool_max_size={pool_max_size} is below pool_min_size={pool_min_size}: "
            f"need pool_min_size <= pool_max_size.")
    for name, seconds in timeouts.items():
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
                or not 0 < seconds < math.inf:
            raise ConfigurationError(f"{name}={seconds!r} must be a number of seconds > 0.")


if TYPE_CHECKING:
    def _implements(store: PostgresStore) -> tuple[
            Store, TransactionalDispatch, CoordStore, RateStore, GraphCheckpoints]:
        """mypy checks the front's methods (its parts') against every port it implements."""
        return store, store, store, store, store
