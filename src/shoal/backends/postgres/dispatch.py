"""Creating runs in the PostgreSQL store (``create_run``, ``create_runs``), in the store's own
transactions or in a caller's (``create_run_in``, ``create_runs_in``: see
:mod:`~shoal.backends.postgres.joined`), and admission control (``release_held``)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from shoal.backends._batches import (
    Key,
    answers,
    firsts,
    held_flags,
    key_of,
    namespace_of,
    queued_run,
)
from shoal.backends._urls import mask_url
from shoal.backends.postgres import joined
from shoal.backends.postgres.connections import Conn, Connections, Q
from shoal.backends.postgres.records import input_text, run_of
from shoal.errors import AdmissionRejectedError, StoreUnavailableError
from shoal.types import NewRun, Run

# create_runs copies a batch of at least this many new runs without idempotency keys in (COPY,
# then NOTIFY, in a transaction: 5 round trips, as cheap as insert_runs' one at 100 runs; half
# its time per run at 1,000)
_COPY_MIN = 100

_COPY_CHUNK = 250   # rows per write of a COPY (about 40 KB of no-op runs)

# COPY's text format: these characters of a value are written escaped
_COPY_SPECIAL = re.compile(r"[\\\t\n\r]")

_COPY_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


class PostgresDispatch:
    """New runs, on ``db``, announced on ``channel``; a caller's connection is checked once
    (:class:`~shoal.backends.postgres.joined.CallerConnections`)."""

    def __init__(self, db: Connections, channel: str) -> None:
        self.db = db
        self.channel = channel
        self._callers = joined.CallerConnections(
            db.schema, mask_url(db.url),
            lambda: db.one(Q["database_identity"], {"schema": db.schema}))

    async def create_run(
        self, new: NewRun, *, max_queued: int | None, admission: str
    ) -> tuple[Run, bool]:
        args = self._run_args(new)
        if max_queued is None:
            # One statement; a concurrent insert of the same idempotency key makes it insert
            # nothing, and the run that won is read back.
            async with self.db.connection() as conn:
                execute = self.db.on(conn)
                rows = await execute("insert_run", args)
                row = rows[0] if rows else None
                if row is None:
                    rows = await execute("find_idempotent", args)
                    row = rows[0] if rows else None
                    if row is None:
                        raise StoreUnavailableError(
                            f"The run of idempotency key {new.idempotency_key!r} was inserted "
                            f"by another transaction but cannot be read back; try again."
                        )
                    return run_of(row), False
                return run_of(row), True
        return await self.db.retry(lambda: self._create_admitted(new, args, max_queued, admission))

    def _run_args(self, new: NewRun) -> dict[str, Any]:
        """The arguments of ``insert_run`` (and ``find_idempotent``) for ``new``."""
        return {
            "id": new.id, "namespace": new.namespace, "tenant": new.tenant,
            "workflow": new.workflow, "input": input_text(new),
            "priority": new.priority, "created_at": new.created_at, "run_at": new.run_at,
            "max_attempts": new.max_attempts, "concurrency_key": new.concurrency_key,
            "idempotency_key": new.idempotency_key, "version": new.version,
            "parent_id": new.parent_id, "root_id": new.root_id or new.id, "held": False,
            "trace_context": new.trace_context, "rate_key": new.rate_key,
            "channel": self.channel,
        }

    async def create_run_in(
        self, connection: object, new: NewRun, *, max_queued: int | None, admission: str
    ) -> tuple[Run, bool]:
        """``create_run`` in the transaction of the caller's psycopg 3 connection (see
        :mod:`shoal.backends.postgres.joined`); its errors are the caller's connection's."""
        execute = await self._callers.join(connection)
        row, created = await joined.create_run(execute, self._run_args(new),
                                               max_queued=max_queued, admission=admission)
        return run_of(row), created

    async def _create_admitted(
        self, new: NewRun, args: dict[str, Any], max_queued: int, admission: str
    ) -> tuple[Run, bool]:
        async with self.db.connection() as conn, self.db.transaction(conn):
            admission_key = self._admission_key(new.namespace)
            await conn.execute(Q["advisory_xact_lock"], {"key": admission_key})
            if new.idempotency_key is not None:
                row = await (await conn.execute(Q["find_idempotent"], args)).fetchone()
                if row is not None:
                    return run_of(row), False
            counts = await (await conn.execute(Q["count_queued"], {
                "namespace": new.namespace, "max_queued": max_queued})).fetchone()
            assert counts is not None
            if counts["queued"] >= max_queued or counts["parked"] > 0:
                if admission == "reject":
                    raise AdmissionRejectedError(new.namespace, max_queued)
                args = {**args, "held": True}
            row = await (await conn.execute(Q["insert_run"], args)).fetchone()
            if row is None:
                row = await (await conn.execute(Q["find_idempotent"], args)).fetchone()
                assert row is not None
                return run_of(row), False
            return run_of(row), True

    async def create_runs(
        self, news: Sequence[NewRun], *, max_queued: int | None, admission: str
    ) -> list[tuple[Run, bool]]:
        # Without admission control one statement (insert_runs) answers the whole batch; with
        # it, that statement follows the admission count in one transaction.
        if not news:
            return []
        namespace = namespace_of(news)
        return await self.db.retry(lambda: self._create_batch(namespace, news, max_queued,
                                                            admission))

    async def _create_batch(
        self, namespace: str, news: Sequence[NewRun], max_queued: int | None, admission: str
    ) -> list[tuple[Run, bool]]:
        async with self.db.connection() as conn:
            execute = self.db.on(conn)
            copy = len(news) >= _COPY_MIN and all(n.idempotency_key is None for n in news)
            insert = (functools.partial(self._copy_runs, conn) if copy
                      else functools.partial(self._insert_runs, execute))
            if max_queued is None and not copy:
                batch = await self._insert_batch(execute, namespace, news, None, admission,
                                                 insert)
            else:
                async with self.db.transaction(conn):
                    if max_queued is not None:
                        await execute("advisory_xact_lock",
                                      {"key": self._admission_key(namespace)})
                    batch = await self._insert_batch(execute, namespace, news, max_queued,
                                                     admission, insert)
            return await _answer_batch(execute, namespace, news, *batch, caller=False)

    async def create_runs_in(
        self, connection: object, news: Sequence[NewRun], *, max_queued: int | None,
        admission: str,
    ) -> list[tuple[Run, bool]]:
        """``create_runs`` in the transaction of the caller's psycopg 3 connection, with the
        statements of ``create_runs`` (see :mod:`shoal.backends.postgres.joined`); its errors
        are the caller's connection's. No admission lock, as in ``create_run_in``: held until
        the caller commits, it would stall every dispatch of the namespace behind the caller's
        transaction, so admission counts the runs that transaction sees."""
        execute = await self._callers.join(connection)
        if not news:
            return []
        namespace = namespace_of(news)
        batch = await self._insert_batch(execute, namespace, news, max_queued, admission,
                                         functools.partial(self._insert_runs, execute))
        return await _answer_batch(execute, namespace, news, *batch, caller=True)

    async def _insert_batch(
        self, execute: joined.Execute, namespace: str, news: Sequence[NewRun],
        max_queued: int | None, admission: str,
        insert: Callable[[str, Sequence[NewRun], Sequence[bool]], Awaitable[dict[str, Run]]],
    ) -> tuple[dict[str, Run], dict[Key, Run], list[NewRun]]:
        """The admission count and the insert (``insert``: insert_runs or copy_runs) of
        ``create_runs``: the runs inserted (by id), the stored runs of the batch's keys read
        before (under admission control only: without it insert_runs alone tells a taken key),
        and the items that made a new run."""
        stored = {} if max_queued is None else await _find_keys(execute, namespace, news)
        fresh = [news[i] for i in firsts(news, stored)]
        queued = parked = 0
        if max_queued is not None and fresh:
            [counts] = await execute("count_queued", {"namespace": namespace,
                                                      "max_queued": max_queued})
            queued, parked = counts["queued"], counts["parked"]
        held = held_flags(namespace, len(fresh), queued, parked, max_queued, admission)
        return await insert(namespace, fresh, held), stored, fresh

    async def _insert_runs(
        self, execute: joined.Execute, namespace: str, fresh: Sequence[NewRun],
        held: Sequence[bool],
    ) -> dict[str, Run]:
        """insert_runs: the runs it inserted, by id."""
        if not fresh:
            return {}
        # In key order: two batches inserting the same keys wait for each other in one order,
        # never in a cycle (a deadlock, which the server takes deadlock_timeout to break).
        rows = sorted(zip(fresh, held, map(input_text, fresh), strict=True),
                      key=lambda r: (r[0].idempotency_key is None, r[0].tenant, r[0].workflow,
                                     r[0].idempotency_key or ""))
        # One JSON text for the whole batch: json.dumps is C, where psycopg dumps arrays of
        # text in Python; unescaped, so that text reaches the server as any text parameter does.
        batch = json.dumps([{
            "id": n.id, "tenant": n.tenant, "workflow": n.workflow, "input": text,
            "priority": n.priority, "created_at": n.created_at, "run_at": n.run_at,
            "max_attempts": n.max_attempts, "concurrency_key": n.concurrency_key,
            "idempotency_key": n.idempotency_key, "version": n.version,
            "parent_id": n.parent_id, "root_id": n.root_id or n.id, "held": h,
            "trace_context": n.trace_context, "rate_key": n.rate_key,
        } for n, h, text in rows], ensure_ascii=False, separators=(",", ":"))
        found = await execute("insert_runs", {"namespace": namespace, "rows": batch,
                                              "channel": self.channel})
        ids = {row["id"] for row in found}
        return {n.id: queued_run(n, h, text) for n, h, text in rows if n.id in ids}

    async def _copy_runs(
        self, conn: Conn, namespace: str, fresh: Sequence[NewRun], held: Sequence[bool],
    ) -> dict[str, Run]:
        """copy_runs, in the transaction open on ``conn``, and one NOTIFY when a run is not
        held: every run of ``fresh`` (they have no idempotency keys), by id."""
        texts = list(map(input_text, fresh))
        rows = list(zip(fresh, held, texts, strict=True))
        async with conn.cursor().copy(Q["copy_runs"]) as copy:
            # In chunks: the server inserts one while the next is written, and the last while
            # the runs are built.
            lines = _CopyLines(namespace)
            for i in range(0, len(rows), _COPY_CHUNK):
                await copy.write("".join(map(lines.line, rows[i:i + _COPY_CHUNK])))
            runs = {n.id: queued_run(n, h, text) for n, h, text in rows}
        if not all(held):
            await conn.execute(Q["notify"], {"channel": self.channel})
        return runs

    def _admission_key(self, namespace: str) -> str:
        return f"shoal:admission:{self.db.schema}:{namespace}"

    async def release_held(self, namespace: str, max_queued: int, now: float) -> int:
        counts = await self.db.one(Q["count_queued"], {"namespace": namespace,
                                                       "max_queued": max_queued})
        assert counts is not None
        if counts["parked"] == 0 or counts["queued"] >= max_queued:
            return 0
        return await self.db.retry(lambda: self._release_held(namespace, max_queued))

    async def _release_held(self, namespace: str, max_queued: int) -> int:
        async with self.db.connection() as conn, self.db.transaction(conn):
            await conn.execute(Q["advisory_xact_lock"], {"key": self._admission_key(namespace)})
            counts = await (await conn.execute(Q["count_queued"], {
                "namespace": namespace, "max_queued": max_queued})).fetchone()
            assert counts is not None
            n = min(counts["parked"], max_queued - counts["queued"])
            if n <= 0:
                return 0
            cur = await conn.execute(Q["release_held"], {"namespace": namespace, "n": n,
                                                          "channel": self.channel})
            return len(await cur.fetchall())


class _CopyLines:
    """The rows of new runs as lines of COPY's text format, in the columns of copy_runs."""

    def __init__(self, namespace: str) -> None:
        self.namespace = _copy_text(namespace)
        # the values most runs of a batch share (tenant, workflow, version, times): each
        # escaped or written once
        self.known: dict[str | float | None, str] = {}

    def same(self, value: str | float | None) -> str:
        out = self.known.get(value)
        if out is None:
            out = self.known[value] = _copy_value(value)
        return out

    def line(self, row: tuple[NewRun, bool, str]) -> str:
        n, held, text = row
        run_id = _copy_text(n.id)
        root = run_id if n.root_id is None or n.root_id == n.id else _copy_text(n.root_id)
        # An input's JSON text (dumps) is ASCII with its control characters escaped: only its
        # backslashes need escaping again.
        text = text.replace("\\", "\\\\")
        same = self.same
        return (f"{run_id}\t{self.namespace}\t{same(n.tenant)}\t{same(n.workflow)}\t{text}\t"
                f"queued\t{n.priority}\t{same(n.created_at)}\t{same(n.run_at)}\t"
                f"{n.max_attempts}\t{_copy_value(n.concurrency_key)}\t\\N\t{same(n.version)}\t"
                f"{_copy_value(n.parent_id)}\t{root}\t{'t' if held else 'f'}\t"
                f"{_copy_value(n.trace_context)}\t{_copy_value(n.rate_key)}\n")

def _copy_value(value: str | float | None) -> str:
    """A value as a field of COPY's text format: NULL is \\N, a float its repr (which
    PostgreSQL reads back exactly), text as :func:`_copy_text` writes it."""
    if value is None:
        return "\\N"
    if isinstance(value, str):
        return _copy_text(value)
    return repr(value)

def _copy_text(value: str) -> str:
    """Text as a field of COPY's text format: its backslashes, tabs and line breaks escaped."""
    if "\\" not in value and value.isprintable():   # the common case, in two scans in C
        return value
    return _COPY_SPECIAL.sub(lambda m: _COPY_ESCAPES[m.group()], value)

async def _find_keys(execute: joined.Execute, namespace: str,
                     news: Sequence[NewRun]) -> dict[Key, Run]:
    """The stored runs of the idempotency keys of ``news``."""
    keys = list(dict.fromkeys(k for k in map(key_of, news) if k is not None))
    if not keys:
        return {}
    rows = await execute("find_idempotent_many", {
        "namespace": namespace, "tenant": [k[0] for k in keys],
        "workflow": [k[1] for k in keys], "idempotency_key": [k[2] for k in keys]})
    runs = [run_of(row) for row in rows]
    return {(r.tenant, r.workflow, r.idempotency_key): r for r in runs
            if r.idempotency_key is not None}

async def _answer_batch(
    execute: joined.Execute, namespace: str, news: Sequence[NewRun], inserted: dict[str, Run],
    stored: dict[Key, Run], fresh: Sequence[NewRun], *, caller: bool,
) -> list[tuple[Run, bool]]:
    """``create_runs``' answers once the batch is inserted (``caller``: in a caller's
    transaction, which is not the store's to run again)."""
    # Keys taken before the batch, or by a transaction that committed while the insert waited
    # for it: read in a statement of their own, which sees them (create_run too).
    taken = [n for n in fresh if n.id not in inserted]
    if taken:
        stored.update(await _find_keys(execute, namespace, taken))
        if any(key_of(n) not in stored for n in taken):
            raise StoreUnavailableError(
                "A run of this batch's idempotency keys was inserted by another transaction "
                "but cannot be read back in this one (REPEATABLE READ or SERIALIZABLE began "
                "before it committed): roll back and try again." if caller else
                "A run of this batch's idempotency keys was inserted by another "
                "transaction but cannot be read back; try again.")
    return answers(news, inserted, stored)
