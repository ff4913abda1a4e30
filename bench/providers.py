"""The overhead of ``provider.call()`` around a no-op, on Redis, PostgreSQL and SQLite, beside the
bare round trip of each store.

Run it (not part of ``./dev bench``)::

    .venv/bin/python bench/providers.py                  # about 2 minutes; one table per store
    .venv/bin/python bench/providers.py --quick          # about 20 s, fewer samples
    .venv/bin/python bench/providers.py --only redis     # redis, postgres, sqlite (comma separated)
    .venv/bin/python bench/providers.py --json bench/results/providers.json

Servers: Redis at ``$SHOAL_BENCH_REDIS`` (default ``redis://127.0.0.1:6379/0``; shoal's coordination
there is ``App(store="memory://", coordination=RedisCoordStore(url, prefix=...))``), PostgreSQL at
``$SHOAL_BENCH_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/test``; the store in a
throwaway schema coordinates itself); SQLite in a new temporary folder, for reference. A store that
cannot be reached is reported and skipped.

What is measured, per store, with real clocks (``time.perf_counter``; no ``shoal.testing``): calls
per second and the p50/p99 latency of ``async with provider.call(tokens=100): pass`` (the body does
nothing, so the whole latency is what the call adds), with one task, and with 16 tasks on one
``App`` calling the same provider, for five providers:

- (a) no limits: the machinery alone (the budget reserve before, the admission, which is one
  store operation however many limits it checks, and the record after);
- (b) ``max_concurrent`` only (64, so it never binds at 16 tasks): a slot taken, renewed by a task
  and released;
- (c) (b) + ``requests_per_minute`` + ``tokens_per_minute`` (so high they never bind);
- (d) (c) + ``breaker=Breaker()``;
- (e) (d) + ``app.budget(per_tenant_day=...)`` (high enough never to bind).

Every provider has a ``price_per_token``, so a call reserves and records a real cost and writes a
ledger row, as a priced provider does. The calls are made outside any run (tenant ``default``), so
the only budget that applies is the tenant's daily one. Each measure uses a new provider (new keys),
so its windows start empty; a sliding window keeps one entry per call for a minute and the stores
sum them all on every call, so the table says how many entries the requests window held at the
end, and a last row runs (c) over windows filled beforehand with ``--full-window`` entries each (a
provider that really makes that many calls a minute).

Beside them, the bare round trip of the store, with one task and with 16: Redis ``PING`` (redis-py
asyncio, one client); PostgreSQL ``SELECT 1`` (one connection; 16 tasks share a psycopg pool of 10
connections, the size of shoal's) and a one-row upsert in autocommit (a round trip that commits, as
every shoal rate operation does); SQLite ``BEGIN IMMEDIATE; UPDATE; COMMIT`` (each shoal rate
operation that writes is one). "p50/RTT" divides a call's p50 by the bare round trip's p50: about
how many round trips the call costs. "store calls" are counted in a separate pass (the rate store's
methods wrapped in a counter; on Redis also the commands redis-py sends), listed under each table.

Clean-up on every exit path: the Redis keys under the bench prefix, the PostgreSQL schema, the
temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import filesystem_of, machine, pct, pg_one

import shoal
from shoal.errors import StoreUnavailableError

NAMESPACE = "bench"
TASKS = 16
TOKENS = 100
PRICE = 1e-6                      # per token: a call reserves and records 0.0001 usd
HIGH = 10**12                     # limits that never bind
RATE_METHODS = ("admit", "slot_acquire", "slot_renew", "slot_release", "window_add",
                "window_clear", "pause_until", "paused_until", "counter_add")
perf = time.perf_counter


@dataclass(frozen=True)
class Case:
    key: str
    label: str
    options: dict[str, Any]
    budget: bool = False


def cases() -> list[Case]:
    windows = {"max_concurrent": 64, "requests_per_minute": HIGH, "tokens_per_minute": HIGH}
    return [
        Case("a", "(a) no limits", {}),
        Case("b", "(b) max_concurrent", {"max_concurrent": 64}),
        Case("c", "(c) (b) + requests/tokens per minute", windows),
        Case("d", "(d) (c) + breaker", {**windows, "breaker": shoal.Breaker()}),
        Case("e", "(e) (d) + budget", {**windows, "breaker": shoal.Breaker()}, budget=True),
    ]


# -- measuring -------------------------------------------------------------------------------------


@dataclass
class Plan:
    seconds: float        # per measure
    warmup: float
    count_calls: int      # calls of the counting pass, per provider
    full_windows: list[int]   # entries per window for the last rows (none: skip them)


@dataclass
class Measure:
    rate: float
    p50: float            # seconds
    p99: float
    n: int
    cpu: float            # this process's CPU seconds per operation


async def measure(op: Callable[[], Awaitable[Any]], tasks: int, plan: Plan) -> Measure:
    """``tasks`` tasks awaiting ``op()`` back to back, after ``plan.warmup`` seconds: operations
    per second from the first one to finish after the warm-up to the first one to finish
    ``plan.seconds`` later, the latency of those that also started in that window, and this
    process's CPU time per operation over it. Each task reads the clocks itself (SQLite's calls
    never yield, and would starve a timer task)."""
    start = perf() + plan.warmup
    latencies: list[float] = []
    done = 0
    began: tuple[float, float] | None = None        # (perf, process_time) when counting began
    ended: tuple[float, float] | None = None

    async def work() -> None:
        nonlocal done, began, ended
        while ended is None:
            t0 = perf()
            await op()
            t1 = perf()
            if ended is not None or t1 < start:
                continue
            if began is None:
                began = (t1, time.process_time())
                continue
            done += 1
            if t0 >= began[0]:
                latencies.append(t1 - t0)
            if t1 >= began[0] + plan.seconds:
                ended = (t1, time.process_time())

    workers = [asyncio.create_task(work()) for _ in range(tasks)]
    try:
        await asyncio.wait_for(asyncio.gather(*workers), timeout=plan.warmup + plan.seconds + 60)
    finally:
        for w in workers:
            w.cancel()
    assert began is not None and ended is not None
    return Measure(done / (ended[0] - began[0]), pct(latencies, 0.5), pct(latencies, 0.99),
                   len(latencies), (ended[1] - began[1]) / max(done, 1))


@contextlib.contextmanager
def counting(store: Any) -> Iterator[Counter[str]]:
    """Count the calls of this store object's rate store methods while inside (its instance
    attributes wrap them; removed on the way out)."""
    counts: Counter[str] = Counter()
    for name in RATE_METHODS:
        inner = getattr(store, name)

        def wrapper(*a: Any, _inner: Any = inner, _name: str = name, **kw: Any) -> Any:
            counts[_name] += 1
            return _inner(*a, **kw)

        setattr(store, name, wrapper)
    try:
        yield counts
    finally:
        for name in RATE_METHODS:
            delattr(store, name)


@contextlib.contextmanager
def redis_commands() -> Iterator[Counter[str]]:
    """Count the commands redis-py sends (its round trips) while inside."""
    from redis.asyncio.client import Redis

    sent: Counter[str] = Counter()
    saved = Redis.execute_command

    async def execute_command(self: Any, *args: Any, **kw: Any) -> Any:
        sent[str(args[0]).lower()] += 1
        return await saved(self, *args, **kw)

    Redis.execute_command = execute_command  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        Redis.execute_command = saved  # type: ignore[method-assign]


# -- results ---------------------------------------------------------------------------------------


@dataclass
class Row:
    label: str
    calls: float | None                   # store calls per operation (counted)
    one: Measure | None
    many: Measure | None
    entries: int | None = None            # requests-window entries at the end
    baseline: bool = False


@dataclass
class Section:
    store: str
    facts: str = ""
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    rtt: float | None = None              # the bare round trip's p50, one task (seconds)


async def provider_rows(section: Section, app: shoal.App, plan: Plan, label: str,
                        prefill: Callable[[str, str, int], Awaitable[None]] | None,
                        count_redis: bool = False) -> None:
    """The shoal rows: every case with one task and with TASKS, the counting pass, and (c) over
    full windows."""
    store = app._rates()

    async def call_through(p: shoal.Provider) -> None:
        async with p.call(tokens=TOKENS):
            pass

    async def entries(p: shoal.Provider) -> int:
        got = await store.window_add(NAMESPACE, p.keys["requests"], 0, 60.0, None,
                                     app.clock.now())
        return int(got.total)

    breakdown: list[str] = []
    c_calls: float | None = None
    for case in cases():
        if case.budget:
            app.budget(per_run=float(HIGH), per_root=float(HIGH), per_tenant_day=float(HIGH))
        windows = "requests_per_minute" in case.options

        # the counting pass, on its own provider
        counted = app.provider(f"count-{case.key}", price_per_token=PRICE, **case.options)
        await call_through(counted)     # connections made, scripts loaded
        with contextlib.ExitStack() as stack:
            counts = stack.enter_context(counting(store))
            sent = stack.enter_context(redis_commands()) if count_redis else None
            for _ in range(plan.count_calls):
                await call_through(counted)
        per_call = sum(counts.values()) / plan.count_calls
        text = ", ".join(f"{k} {v / plan.count_calls:g}" for k, v in sorted(counts.items()))
        line = f"  {case.label}: {per_call:g} store calls ({text})"
        if sent is not None:
            line += (f"; redis-py commands {sum(sent.values()) / plan.count_calls:g} ("
                     + ", ".join(f"{k} {v / plan.count_calls:g}" for k, v in sorted(sent.items()))
                     + ")")
        breakdown.append(line)

        results: list[Measure] = []
        last_entries: int | None = None
        for tasks in (1, TASKS):
            p = app.provider(f"{case.key}-{tasks}", price_per_token=PRICE, **case.options)
            results.append(await measure(lambda p=p: call_through(p), tasks, plan))
            if windows:
                last_entries = max(last_entries or 0, await entries(p))
        one, many = results
        section.rows.append(Row(case.label, per_call, one, many, last_entries))
        if case.key == "c":
            c_calls = per_call
        print(f"  {label} {case.label}: {one.rate:,.0f}/s p50 {1000 * one.p50:.2f} ms; "
              f"{TASKS} tasks {many.rate:,.0f}/s p50 {1000 * many.p50:.2f} ms", file=sys.stderr)

    # the same without a price: nothing to reserve or record, and yet
    unpriced = app.provider("count-unpriced", max_concurrent=64)
    await call_through(unpriced)
    with counting(store) as counts:
        for _ in range(plan.count_calls):
            await call_through(unpriced)
    text = ", ".join(f"{k} {v / plan.count_calls:g}" for k, v in sorted(counts.items()))
    breakdown.append(f"  (b) without price_per_token (cost 0): "
                     f"{sum(counts.values()) / plan.count_calls:g} store calls ({text})")

    if prefill is not None and plan.full_windows:
        app.budget(per_tenant_day=None)           # as in (c): no budget
        c = next(x for x in cases() if x.key == "c")
        for n in plan.full_windows:
            p = app.provider(f"full-{n}", price_per_token=PRICE, **c.options)
            await prefill(p.keys["requests"], "1", n)
            await prefill(p.keys["tokens"], str(TOKENS), n)
            full = await measure(lambda p=p: call_through(p), 1, plan)
            left = await entries(p)
            section.rows.append(Row(f"(c) over windows of {n:,} entries", c_calls, full, None,
                                    left))
            if left < n:
                section.notes.append(f"[red]The {n:,}-entry window held only {left:,} entries "
                                     f"after its measure: something else deleted or trimmed it "
                                     f"(a shared server?); that row is not valid.[/]")
            print(f"  {label} (c) over {n:,}-entry windows: {full.rate:,.0f}/s p50 "
                  f"{1000 * full.p50:.2f} ms", file=sys.stderr)

    section.notes.append("Store calls per provider.call (counting pass, "
                         f"{plan.count_calls} calls with one task):\n" + "\n".join(breakdown))


def prefill_times(n: int) -> list[float]:
    """Entry times spread over the 50 s before now: they stay in a one-minute window for the
    whole measure."""
    now = time.time()
    return [now - 50.0 + 50.0 * i / n for i in range(n)]


Bare = tuple[str, Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]


async def bare_rows(section: Section, bares: list[Bare], plan: Plan, when: str,
                    label: str) -> None:
    """The store's bare round trips, ``(name, op for one task, op for TASKS tasks)``, measured
    before and after the shoal rows (the machine is shared: the two show how much it moved);
    the first one's best 1-task p50 is the RTT the calls are divided by."""
    for i, (name, one_op, many_op) in enumerate(bares):
        one = await measure(one_op, 1, plan)
        many = await measure(many_op, TASKS, plan)
        section.rows.append(Row(f"{name} ({when})", 1, one, many, baseline=True))
        if i == 0:
            section.rtt = one.p50 if section.rtt is None else min(section.rtt, one.p50)
        print(f"  {label} {name} ({when}): {one.rate:,.0f}/s p50 {1000 * one.p50:.3f} ms; "
              f"{TASKS} tasks {many.rate:,.0f}/s", file=sys.stderr)


# -- Redis -----------------------------------------------------------------------------------------


async def bench_redis(url: str, plan: Plan) -> Section:
    from redis.asyncio import Redis

    from shoal.backends.redis import RedisCoordStore

    section = Section("Redis")
    prefix = f"providerbench{os.getpid()}"
    admin = Redis.from_url(url, decode_responses=True)
    try:
        info = await admin.info("server")
        section.facts = (f"Redis {info['redis_version']} at {url}, redis-py "
                         f"{__import__('redis').__version__}; keys under {prefix}:")

        async def ping() -> None:
            await admin.ping()

        bares: list[Bare] = [("bare round trip: PING", ping, ping)]
        await bare_rows(section, bares, plan, "before", "redis")

        coord = RedisCoordStore(url, prefix=prefix)
        app = shoal.App(NAMESPACE, store="memory://", coordination=coord,
                        instance_id="bench")

        async def prefill(key: str, amount: str, n: int) -> None:
            # what rate_window_add.lua keeps: a sorted set of '<seq> <amount>' scored by time,
            # and the running total beside it
            base = coord._base(NAMESPACE)
            entries = {f"{i:016d} {amount}": at for i, at in enumerate(prefill_times(n), 1)}
            items = list(entries.items())
            for i in range(0, n, 1000):
                await admin.zadd(f"{base}:rwz:{key}", dict(items[i:i + 1000]))
            await admin.hset(f"{base}:rwt:{key}",
                             mapping={"total": str(n * float(amount)), "seq": str(n)})
            for name in (f"{base}:rwz:{key}", f"{base}:rwt:{key}"):
                await admin.expire(name, 3600)

        async with app.open():
            await provider_rows(section, app, plan, "redis", prefill, count_redis=True)
        await bare_rows(section, bares, plan, "after", "redis")
    finally:
        with contextlib.suppress(Exception):
            keys = [k async for k in admin.scan_iter(match=f"{prefix}:*", count=1000)]
            for i in range(0, len(keys), 1000):
                await admin.delete(*keys[i:i + 1000])
        await admin.aclose()
    return section


# -- PostgreSQL ------------------------------------------------------------------------------------


async def bench_postgres(url: str, plan: Plan) -> Section:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    section = Section("PostgreSQL")
    schema = f"providerbench_{os.getpid()}"
    store_url = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    admin = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        version = await pg_one(admin, "SHOW server_version")
        sync = await pg_one(admin, "SHOW synchronous_commit")
        section.facts = (f"PostgreSQL {version} (synchronous_commit={sync}), psycopg "
                         f"{psycopg.__version__}; schema {schema}")
        app = shoal.App(NAMESPACE, store=store_url, instance_id="bench")
        pool_size = getattr(app.store, "pool_max_size", 10)
        async with app.open():              # migrates: the schema and shoal's tables
            await admin.execute(f"CREATE TABLE {schema}.bare (k text PRIMARY KEY, "
                                "v bigint NOT NULL)")
            pool = AsyncConnectionPool(url, min_size=pool_size, max_size=pool_size,
                                       kwargs={"autocommit": True}, open=False)
            await pool.open(wait=True)
            try:
                async def select1_on(conn: Any) -> None:
                    await (await conn.execute("SELECT 1")).fetchone()

                async def select1_pooled() -> None:
                    async with pool.connection() as conn:
                        await select1_on(conn)

                upsert = (f"INSERT INTO {schema}.bare VALUES ('k', 1) ON CONFLICT (k) DO "
                          f"UPDATE SET v = bare.v + 1")

                async def upsert_pooled() -> None:
                    async with pool.connection() as conn:
                        await conn.execute(upsert)

                bares: list[Bare] = [
                    ("bare round trip: SELECT 1", lambda: select1_on(admin), select1_pooled),
                    ("bare committed write: 1-row upsert", upsert_pooled, upsert_pooled)]
                await bare_rows(section, bares, plan, "before", "postgres")

                async def prefill(key: str, amount: str, n: int) -> None:
                    await admin.execute(
                        f"INSERT INTO {schema}.rate_window_entries (namespace, key, at, amount) "
                        f"SELECT %s, %s, t, %s FROM unnest(%s::double precision[]) AS t",
                        (NAMESPACE, key, float(amount), prefill_times(n)))
                    await admin.execute(
                        f"INSERT INTO {schema}.rate_windows (namespace, key, total) "
                        f"VALUES (%s, %s, %s) ON CONFLICT (namespace, key) DO UPDATE "
                        f"SET total = {schema}.rate_windows.total + EXCLUDED.total",
                        (NAMESPACE, key, n * float(amount)))
                    await admin.execute(f"ANALYZE {schema}.rate_window_entries")

                section.notes.append(f"shoal's pool: {pool_size} connections; the bare {TASKS}-"
                                     f"task rows use a psycopg pool of the same size (1 task: "
                                     f"SELECT 1 on one connection, the upsert through the pool).")
                await provider_rows(section, app, plan, "postgres", prefill)
                await bare_rows(section, bares, plan, "after", "postgres")
            finally:
                await pool.close()
    finally:
        with contextlib.suppress(Exception):
            await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()
    return section


# -- SQLite ----------------------------------------------------------------------------------------


async def bench_sqlite(tmp: Path, plan: Plan) -> Section:
    section = Section("SQLite")
    path = tmp / "providers.db"
    app = shoal.App(NAMESPACE, store=f"sqlite:///{path}", instance_id="bench")
    synchronous = getattr(app.store, "synchronous", "full")
    section.facts = (f"SQLite {sqlite3.sqlite_version}, WAL, synchronous={synchronous.upper()}, "
                     f"files in {tmp} ({filesystem_of(tmp)}); every store call runs on the event "
                     f"loop")
    conn = sqlite3.connect(tmp / "bare.db", isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode = WAL").fetchall()
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("CREATE TABLE bare (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
        conn.execute("INSERT INTO bare VALUES ('k', 0)")

        async def tx() -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE bare SET v = v + 1 WHERE k = 'k'")
            conn.execute("COMMIT")

        bares: list[Bare] = [("bare: BEGIN IMMEDIATE; UPDATE; COMMIT", tx, tx)]
        await bare_rows(section, bares, plan, "before", "sqlite")

        async def prefill(key: str, amount: str, n: int) -> None:
            db = sqlite3.connect(path, isolation_level=None, timeout=10.0)
            try:
                db.execute("BEGIN IMMEDIATE")
                db.executemany("INSERT INTO rate_window_entries (namespace, key, at, amount) "
                               "VALUES (?, ?, ?, ?)",
                               [(NAMESPACE, key, at, float(amount)) for at in prefill_times(n)])
                db.execute("INSERT INTO rate_windows (namespace, key, total) VALUES (?, ?, ?) "
                           "ON CONFLICT (namespace, key) DO UPDATE "
                           "SET total = total + excluded.total",
                           (NAMESPACE, key, n * float(amount)))
                db.execute("COMMIT")
            finally:
                db.close()

        async with app.open():
            await provider_rows(section, app, plan, "sqlite", prefill)
        await bare_rows(section, bares, plan, "after", "sqlite")
    finally:
        conn.close()
    return section


# -- output ----------------------------------------------------------------------------------------


def ms(seconds: float | None) -> str:
    if seconds is None or seconds != seconds:
        return "-"
    return f"{1000 * seconds:.3f}" if seconds < 0.001 else f"{1000 * seconds:.2f}"


def render(sections: list[Section], header: str) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(header)
    for s in sections:
        console.print(f"\n[bold]{s.store}[/]" + (f": {s.facts}" if s.facts else "")
                      + (f" ({s.seconds:.0f} s)" if s.seconds else ""))
        if s.error:
            console.print(f"  [yellow]skipped[/]: {s.error}")
            continue
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
        t.add_column("provider.call(tokens=100)", no_wrap=True)
        t.add_column("store calls", justify="right")
        t.add_column("1 task /s", justify="right")
        t.add_column("p50 ms", justify="right")
        t.add_column("p99 ms", justify="right")
        t.add_column("p50/RTT", justify="right")
        t.add_column("CPU ms", justify="right")
        t.add_column(f"{TASKS} tasks /s", justify="right")
        t.add_column("p50 ms", justify="right")
        t.add_column("p99 ms", justify="right")
        t.add_column("window", justify="right")
        for i, r in enumerate(s.rows):
            rel = "-"
            if r.one is not None and s.rtt:
                rel = f"{r.one.p50 / s.rtt:.1f}"
            last = i + 1 == len(s.rows) or s.rows[i + 1].baseline != r.baseline
            t.add_row(
                f"[dim]{r.label}[/]" if r.baseline else r.label,
                "-" if r.calls is None else f"{r.calls:g}",
                "-" if r.one is None else f"{r.one.rate:,.0f}",
                ms(r.one.p50 if r.one else None), ms(r.one.p99 if r.one else None), rel,
                ms(r.one.cpu if r.one else None),
                "-" if r.many is None else f"{r.many.rate:,.0f}",
                ms(r.many.p50 if r.many else None), ms(r.many.p99 if r.many else None),
                "-" if r.entries is None else f"{r.entries:,}",
                end_section=last)
        console.print(t)
        for note in s.notes:
            console.print(note, highlight=False)
    console.print(
        f"\np50/RTT: a 1-task p50 / the first bare row's best 1-task p50 (about how many round "
        f"trips it costs). CPU ms: this process's CPU time per call, 1 task. {TASKS} tasks: "
        f"{TASKS} asyncio tasks on one App and one provider (so one store client or pool). "
        "window: the requests window's entries at the end of the measure (one per call of the "
        "last minute; a window_add touches only those leaving it). Limits never bind: every call "
        "goes at once.", highlight=False)


# -- main ------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, plan: Plan, tmp: Path) -> list[Section]:
    # Ctrl-C and SIGTERM cancel this task: every clean-up below runs on the way out
    loop, me = asyncio.get_running_loop(), asyncio.current_task()
    assert me is not None

    def interrupted() -> None:
        # the calls cut short leave shielded ledger writes and pooled connections behind: their
        # complaints while the stores close say nothing about the bench
        loop.set_exception_handler(lambda loop, context: None)
        for name in ("psycopg", "shoal"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        me.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, interrupted)
    sections = []
    for name in args.only.split(","):
        name = name.strip()
        began = perf()
        print(f"{name}...", file=sys.stderr)
        try:
            if name == "redis":
                s = await bench_redis(args.redis, plan)
            elif name == "postgres":
                s = await bench_postgres(args.postgres, plan)
            elif name == "sqlite":
                s = await bench_sqlite(tmp, plan)
            else:
                raise SystemExit(f"unknown store {name!r}: redis, postgres, sqlite")
        except (OSError, ImportError, StoreUnavailableError) as e:
            s = Section(name, error=f"{type(e).__name__}: {e}")
        except Exception as e:
            if type(e).__module__.startswith(("redis", "psycopg")):
                s = Section(name, error=f"{type(e).__name__}: {e}")
            else:
                raise
        s.seconds = perf() - began
        sections.append(s)
    return sections


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="about 20 s: shorter, fewer samples")
    parser.add_argument("--only", default="redis,postgres,sqlite",
                        help="stores, comma separated (default redis,postgres,sqlite)")
    parser.add_argument("--redis", default=os.environ.get("SHOAL_BENCH_REDIS",
                                                          "redis://127.0.0.1:6379/0"))
    parser.add_argument("--postgres", default=os.environ.get(
        "SHOAL_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--seconds", type=float, default=None,
                        help="length of each measure (default 1.5, --quick 0.3)")
    parser.add_argument("--full-windows", default="1000,10000",
                        help="entries per window for the last rows, comma separated (default "
                             "1000,10000; 0 skips them)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    full_windows = [int(n) for n in args.full_windows.split(",") if int(n) > 0]
    if args.quick:
        plan = Plan(seconds=0.3, warmup=0.1, count_calls=20, full_windows=full_windows)
    else:
        plan = Plan(seconds=1.5, warmup=0.3, count_calls=100, full_windows=full_windows)
    if args.seconds is not None:
        plan.seconds = args.seconds

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    tmp = Path(tempfile.mkdtemp(prefix="shoal-providerbench-")).resolve()
    header = machine("shoal providers bench")
    began = perf()
    try:
        sections = asyncio.run(run(args, plan, tmp))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    header += (f", {os.getloadavg()[0]:.2f} at the end; {perf() - began:.0f} s in all"
               + (" (--quick)" if args.quick else ""))
    render(sections, header)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "plan": vars(plan), "header": header,
            "sections": [{"store": s.store, "facts": s.facts, "error": s.error, "notes": s.notes,
                          "rtt": s.rtt, "rows": [{
                              "label": r.label, "store_calls": r.calls, "entries": r.entries,
                              "baseline": r.baseline,
                              "one": None if r.one is None else vars(r.one),
                              "many": None if r.many is None else vars(r.many)}
                              for r in s.rows]}
                         for s in sections]}, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
