"""Benchmarks of shoal's coordination primitives (``app.lock``, ``app.meter``) beside bare
baselines, on Redis, PostgreSQL and SQLite, in one run.

Run it (not part of ``./dev bench``)::

    .venv/bin/python bench/coord.py                  # about 2 minutes; one table per store
    .venv/bin/python bench/coord.py --quick          # about 20 s, fewer samples
    .venv/bin/python bench/coord.py --only redis     # redis, postgres, sqlite (comma separated)
    .venv/bin/python bench/coord.py --json bench/results/coord.json

Servers: Redis at ``$SHOAL_BENCH_REDIS`` (default ``redis://127.0.0.1:6379/0``), PostgreSQL at
``$SHOAL_BENCH_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/test``); SQLite files in a
new temporary folder. A store that cannot be reached, or whose shoal store does not implement
coordination yet, is reported and skipped.

What is measured, per store, with real clocks (``time.perf_counter``; no ``shoal.testing``):

- lock acquire+release per second: one client (``async with app.lock(k): pass`` back to back),
  and 8 clients contending for ONE key (8 ``App`` objects, each with its own store object and
  connections, one asyncio task each, in this process), beside bare baselines:
  Redis ``SET k v NX PX 30000`` + ``DEL`` with redis-py asyncio (8 clients: spin on failure) and
  redis-py's own ``redis.asyncio.lock.Lock``; PostgreSQL ``SELECT 1`` (one round trip) and an
  ``INSERT … ON CONFLICT DO NOTHING`` + ``DELETE`` pair; SQLite ``BEGIN IMMEDIATE; UPDATE;
  COMMIT`` (threads, each its own connection, for 8 clients).
- hand-off latency: a waiter is queued (its store call answered "wait"); the holder leaves its
  ``async with`` at t0, the waiter's ``__aenter__`` returns at t1 (same process, two ``App``
  objects, so the wake-up goes through the store: pub/sub, NOTIFY, ``data_version``); p50/p99 of
  t1 - t0. Baselines: redis-py Lock with its default polling (``sleep=0.1``), PostgreSQL
  ``pg_advisory_lock`` (the server queues the waiter), SQLite ``BEGIN IMMEDIATE`` waiting in the
  busy handler. The holder releases a random time after the waiter queued: 0-2 ms, and 0-100 ms
  for redis-py Lock (so its release falls anywhere in the waiter's poll interval, as in real use).
- ``app.meter([k], [1])`` calls per second, one client and 8 concurrent tasks on one app, beside
  one bare atomic round trip (Redis ``HINCRBYFLOAT``, PostgreSQL ``INSERT … ON CONFLICT DO
  UPDATE``, SQLite ``BEGIN IMMEDIATE; UPDATE; COMMIT``).

ratio is shoal's cost / the baseline's (time per operation, or latency): above 1, shoal is slower.
On Redis the script also counts the server commands per shoal operation (``INFO commandstats``
before and after), the round trips it costs. Clean-up on every exit path: the Redis keys under the
bench prefix, the PostgreSQL schema, the temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import filesystem_of, machine, pct, pg_one

import shoal
from shoal.ports import CoordStore
from shoal.types import LockWait

NAMESPACE = "bench"
KEY = "bench:k"
CLIENTS = 8
perf = time.perf_counter


# -- measuring -------------------------------------------------------------------------------------


@dataclass
class Plan:
    rounds: int          # each throughput measure runs once per round; the table shows the median
    seconds: float       # one measure's window
    warmup: float        # before each window
    handoffs: int        # shoal and the event-driven baselines
    poll_handoffs: int   # redis-py Lock (each ~100 ms)
    counted: int         # acquisitions counted for the round trips per operation (1 client)


Op = Callable[[], Awaitable[Any]]


@dataclass
class Window:
    counts: list[int]    # operations per client finished inside the window
    total: int           # operations in all, warm-up included (for CPU per operation)


Measure = Callable[[], Awaitable[Window]]


async def all_of(coros: list[Awaitable[None]], timeout: float) -> None:
    """Run ``coros`` as tasks until all are done; the first failure raises, and the others are
    cancelled (also when the caller is)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, pending = await asyncio.wait(tasks, timeout=timeout,
                                           return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            t.result()
        if pending:
            raise TimeoutError(f"{len(pending)} of {len(tasks)} clients still running after "
                               f"{timeout:g} s")
    finally:
        for t in tasks:
            t.cancel()


def sequential(op: Op, plan: Plan) -> Measure:
    """One client: ``op`` awaited back to back."""
    return concurrent([op], plan)


def concurrent(ops: list[Op], plan: Plan) -> Measure:
    """All ``ops`` at once, one task each, back to back. Each task reads the clock itself (a
    store call that never yields, as SQLite's, would starve a timer task): an operation counts if
    it finished inside the window."""

    async def measure() -> Window:
        start = perf() + plan.warmup
        end = start + plan.seconds
        counts = [0] * len(ops)
        total = [0]

        async def work(i: int, op: Op) -> None:
            while True:
                await op()
                total[0] += 1
                t = perf()
                if t >= end:
                    return
                if t >= start:
                    counts[i] += 1

        await all_of([work(i, op) for i, op in enumerate(ops)],
                     timeout=plan.warmup + plan.seconds + 60)
        return Window(counts, total[0])

    return measure


def threaded(ops: list[Callable[[], Any]], plan: Plan) -> Measure:
    """Like :func:`concurrent` for blocking ops, each in its own thread."""

    def run() -> Window:
        start = perf() + plan.warmup
        end = start + plan.seconds
        counts = [0] * len(ops)
        totals = [0] * len(ops)
        errors: list[BaseException] = []

        def work(i: int, op: Callable[[], Any]) -> None:
            try:
                while True:
                    op()
                    totals[i] += 1
                    t = perf()
                    if t >= end:
                        return
                    if t >= start:
                        counts[i] += 1
            except BaseException as e:   # raised below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i, op), daemon=True)
                   for i, op in enumerate(ops)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=plan.warmup + plan.seconds + 60)
        if errors:
            raise errors[0]
        return Window(counts, sum(totals))

    async def measure() -> Window:
        return await asyncio.to_thread(run)

    return measure


@dataclass
class Rate:
    rounds: list[float]  # operations per second, each round
    cpu_us: float        # this process's CPU time per operation (median round), microseconds
    counts: list[int]    # per client, all rounds

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)

    def shares(self) -> str:
        """The least and the largest share of the operations one client got."""
        total = sum(self.counts) or 1
        return f"{100 * min(self.counts) / total:.0f}-{100 * max(self.counts) / total:.0f}%"


async def interleave(measures: dict[str, Measure], plan: Plan, label: str) -> dict[str, Rate]:
    """Every measure once per round, in turn (the order reversed every other round), so load
    from elsewhere on the machine falls on shoal and its baselines alike."""
    rates: dict[str, list[float]] = {name: [] for name in measures}
    cpu: dict[str, list[float]] = {name: [] for name in measures}
    counts: dict[str, list[int]] = {}
    names = list(measures)
    for r in range(plan.rounds):
        for name in names if r % 2 == 0 else reversed(names):
            c0 = time.process_time()
            got = await measures[name]()
            cpu[name].append((time.process_time() - c0) / max(got.total, 1))
            rates[name].append(sum(got.counts) / plan.seconds)
            counts[name] = [a + b for a, b in zip(counts.get(name, [0] * len(got.counts)),
                                                   got.counts, strict=True)]
        print(f"  {label} round {r + 1}/{plan.rounds}: " + ", ".join(
            f"{name} {v[-1]:,.0f}/s" for name, v in rates.items()), file=sys.stderr)
    return {name: Rate(v, 1e6 * statistics.median(cpu[name]), counts[name])
            for name, v in rates.items()}


Enter = Callable[[int], AbstractAsyncContextManager[Any]]


async def handoff(enter: Enter, queued: Callable[[int], Awaitable[None]], n: int,
                  hold: float) -> list[float]:
    """Two clients (0 and 1) pass one lock back and forth ``n`` times. ``enter(i)`` is client
    i's lock; ``queued(i)`` returns once client i is known to wait for it. The holder waits for
    that, then a random 0..``hold`` seconds, then leaves at t0; t1 is when the waiter's enter
    returns. A client asks again only after the other has taken the lock, so the waiter is always
    alone in the queue."""
    latencies: list[float] = []
    t0: float | None = None
    done = False
    entered = [asyncio.Event(), asyncio.Event()]

    async def side(me: int) -> None:
        nonlocal t0, done
        other = 1 - me
        while not done:
            async with enter(me):
                t1 = perf()
                if t0 is not None:
                    latencies.append(t1 - t0)
                    t0 = None
                entered[me].set()
                if len(latencies) >= n:
                    done = True
                else:
                    await queued(other)
                    if hold:
                        await asyncio.sleep(random.uniform(0, hold))
                    entered[other].clear()
                    t0 = perf()
            if done:
                return
            await entered[other].wait()

    await all_of([side(0), side(1)], timeout=max(60.0, n * 0.5))
    return latencies


def watch_queue(store: Any) -> asyncio.Event:
    """An event set each time this store object answers a lock request with "wait" (wraps the
    instance's ``lock_acquire``; used only by the hand-off test's own apps)."""
    event = asyncio.Event()
    inner = store.lock_acquire

    async def lock_acquire(*a: Any, **kw: Any) -> Any:
        got = await inner(*a, **kw)
        if isinstance(got, LockWait):
            event.set()
        return got

    store.lock_acquire = lock_acquire
    return event


async def event_queued(events: list[asyncio.Event], i: int) -> None:
    await events[i].wait()
    events[i].clear()


# -- results ---------------------------------------------------------------------------------------


@dataclass
class Row:
    operation: str
    shoal: float | None
    baseline: str
    base: float | None
    kind: str                    # "rate" (ops/s) or "ms" (latency)
    note: str = ""
    paired: float | None = None  # the median of the per-round ratios, when there are rounds
    cpu: str = ""

    def ratio(self) -> float | None:
        if self.paired is not None:
            return self.paired
        if not self.shoal or not self.base:
            return None
        return self.base / self.shoal if self.kind == "rate" else self.shoal / self.base


@dataclass
class Section:
    store: str
    facts: str = ""
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rates: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    def rate_row(self, operation: str, ours: Rate, baseline: str, base: Rate,
                 contended: bool = False) -> None:
        pairs = [b / o for o, b in zip(ours.rounds, base.rounds, strict=True) if o and b]
        self.rows.append(Row(operation, ours.median, baseline, base.median, "rate",
                             f"shares {ours.shares()} / {base.shares()}" if contended else "",
                             statistics.median(pairs) if pairs else None,
                             f"{ours.cpu_us:,.0f} / {base.cpu_us:,.0f}"))

    def handoff_rows(self, ours: list[float], baseline: str, base: list[float]) -> None:
        self.rates["handoff_ms"] = {"shoal": [1000 * x for x in ours],
                                    "baseline": [1000 * x for x in base]}
        for q, label in ((0.5, "p50"), (0.99, "p99")):
            self.rows.append(Row(f"hand-off {label} ({len(ours)} hand-offs)",
                                 1000 * pct(ours, q), f"{baseline} ({len(base)})",
                                 1000 * pct(base, q), "ms"))


async def open_apps(stack: AsyncExitStack, build: Callable[[int], shoal.App], n: int,
                    first: int = 0) -> list[shoal.App]:
    apps = [build(first + i) for i in range(n)]
    for app in apps:
        await stack.enter_async_context(app.open())
        async with app.lock(KEY + ":warm"):   # connect (and subscribe) before any window
            pass
    return apps


async def shoal_measures(stack: AsyncExitStack, build: Callable[[int], shoal.App],
                         plan: Plan) -> dict[str, Measure]:
    """shoal's throughput measures: lock with 1 client and with 8 (8 App objects, one key),
    meter with 1 client and 8 tasks on one app. The 7 other apps of the 8-client lock are open
    only during their own measure: an open app listens (pub/sub, LISTEN) and would take its
    share of every release's announcement in this process during the 1-client measures."""
    [app] = await open_apps(stack, build, 1)

    def locker(a: shoal.App) -> Op:
        async def op() -> None:
            async with a.lock(KEY):
                pass
        return op

    async def meter() -> None:
        await app.meter([KEY], [1.0])

    async def lock8() -> Window:
        async with AsyncExitStack() as others:
            apps = [app, *await open_apps(others, build, CLIENTS - 1, first=1)]
            return await concurrent([locker(a) for a in apps], plan)()

    return {"shoal lock1": sequential(locker(app), plan),
            "shoal lock8": lock8,
            "shoal meter1": sequential(meter, plan),
            "shoal meter8": concurrent([meter] * CLIENTS, plan)}


async def store_calls(build: Callable[[int], shoal.App], plan: Plan) -> str:
    """The coordination store calls per lock acquisition, with 1 client and with 8 contending
    for one key: each is one transaction (one pipelined round trip on PostgreSQL, one
    ``BEGIN IMMEDIATE`` on SQLite, one script on Redis)."""
    calls: dict[str, int] = {}

    def count(store: Any) -> None:
        for name in ("lock_acquire", "lock_release", "lock_renew"):
            inner = getattr(store, name)

            def wrap(inner: Any = inner, name: str = name) -> Any:
                async def call(*a: Any, **kw: Any) -> Any:
                    got = await inner(*a, **kw)
                    label = name + (" (wait)" if isinstance(got, LockWait) else "")
                    calls[label] = calls.get(label, 0) + 1
                    return got
                return call

            setattr(store, name, wrap())

    parts = []
    async with AsyncExitStack() as stack:
        apps = await open_apps(stack, build, CLIENTS, first=300)
        for a in apps:
            count(a._coord())
        key = KEY + ":count"

        async def loop(a: shoal.App, n: int) -> None:
            for _ in range(n):
                async with a.lock(key):
                    pass

        for label, clients, per_client in (("1 client", 1, plan.counted),
                                           (f"{CLIENTS} clients", CLIENTS, plan.counted // 5)):
            calls.clear()
            await asyncio.gather(*(loop(a, per_client) for a in apps[:clients]))
            n = clients * per_client
            parts.append(f"  lock, {label}: " + ", ".join(
                f"{k} {v / n:.2f}" for k, v in sorted(calls.items())))
    return ("Store calls (each one transaction and one round trip) per lock acquisition; "
            "(wait): answered 'queued':\n" + "\n".join(parts))


async def shoal_handoff(build: Callable[[int], shoal.App], plan: Plan, label: str
                        ) -> list[float]:
    async with AsyncExitStack() as stack:
        pair = await open_apps(stack, build, 2, first=100)
        for app in pair:
            async with app.lock(KEY + ":handoff"):
                pass
        events = [watch_queue(app._coord()) for app in pair]
        lat = await handoff(lambda i: pair[i].lock(KEY + ":handoff"),
                            lambda i: event_queued(events, i), plan.handoffs, 0.002)
    print(f"  {label} shoal hand-off p50 {1000 * pct(lat, 0.5):.2f} ms, p99 "
          f"{1000 * pct(lat, 0.99):.2f} ms", file=sys.stderr)
    return lat


# -- Redis -----------------------------------------------------------------------------------------


async def bench_redis(url: str, plan: Plan) -> Section:
    from redis.asyncio import Redis
    from redis.asyncio.lock import Lock as RedisLock

    from shoal.backends.redis import RedisCoordStore

    section = Section("Redis")
    prefix = f"shoalbench{os.getpid()}"
    bare_key = f"{prefix}:bare:lock"
    admin = Redis.from_url(url, decode_responses=True)
    try:
        info = await admin.info("server")
        section.facts = (f"Redis {info['redis_version']} at {url}, redis-py "
                         f"{__import__('redis').__version__}")

        def build(i: int) -> shoal.App:
            return shoal.App(NAMESPACE, store="memory://", instance_id=f"bench{i}",
                             coordination=RedisCoordStore(url, prefix=prefix))

        section.notes.append(
            "Per shoal operation (client commands counted in redis-py; server commands from "
            "INFO commandstats, the scripts' included, other clients of the server too):\n"
            + await redis_commands(admin, build, plan))
        async with AsyncExitStack() as stack:
            measures = await shoal_measures(stack, build, plan)
            clients = [Redis.from_url(url) for _ in range(CLIENTS)]
            for r in clients:
                stack.push_async_callback(r.aclose)
                await r.ping()
            c = clients[0]

            def spinner(r: Redis) -> Op:
                async def op() -> None:
                    while not await r.set(bare_key, "x", nx=True, px=30000):
                        pass
                    await r.delete(bare_key)
                return op

            def pylocker(r: Redis) -> Op:
                async def op() -> None:
                    async with r.lock(bare_key + ":pylock", timeout=30):
                        pass
                return op

            async def hincr() -> None:
                await c.hincrbyfloat(bare_key + ":meter", "debt", 1.0)

            measures |= {"bare lock1": sequential(spinner(c), plan),
                         "bare lock8": concurrent([spinner(r) for r in clients], plan),
                         "redis-py lock1": sequential(pylocker(c), plan),
                         "redis-py lock8": concurrent([pylocker(r) for r in clients], plan),
                         "bare meter1": sequential(hincr, plan),
                         "bare meter8": concurrent([hincr] * CLIENTS, plan)}
            got = await interleave(measures, plan, "redis")

            ours = await shoal_handoff(build, plan, "redis")
            # redis-py Lock hand-off, default polling (sleep=0.1)
            queued = [asyncio.Event(), asyncio.Event()]

            class Signalled(RedisLock):
                side = 0

                async def do_acquire(self, token: str | bytes) -> bool:
                    done = await super().do_acquire(token)
                    if not done:
                        queued[self.side].set()
                    return done

            def pyenter(i: int) -> AbstractAsyncContextManager[Any]:
                lock = Signalled(clients[i], bare_key + ":handoff", timeout=30)
                lock.side = i
                return lock

            pylat = await handoff(pyenter, lambda i: event_queued(queued, i),
                                  plan.poll_handoffs, 0.1)

        section.rates = {k: vars(v) for k, v in got.items()}
        section.rate_row("lock acquire+release, 1 client", got["shoal lock1"],
                         "SET NX PX 30000 + DEL", got["bare lock1"])
        section.rate_row("", got["shoal lock1"], "redis-py Lock", got["redis-py lock1"])
        section.rate_row(f"lock, {CLIENTS} clients on one key", got["shoal lock8"],
                         "SET NX PX + DEL, spin on failure", got["bare lock8"], True)
        section.rate_row("", got["shoal lock8"], "redis-py Lock (sleep=0.1)",
                         got["redis-py lock8"], True)
        section.handoff_rows(ours, "redis-py Lock, polls every 0.1 s", pylat)
        section.rate_row("meter, 1 client", got["shoal meter1"], "HINCRBYFLOAT",
                         got["bare meter1"])
        section.rate_row(f"meter, {CLIENTS} tasks on one app", got["shoal meter8"],
                         f"HINCRBYFLOAT, {CLIENTS} tasks", got["bare meter8"])
    finally:
        with contextlib.suppress(Exception):
            keys = [k async for k in admin.scan_iter(match=f"{prefix}:*", count=1000)]
            if keys:
                await admin.delete(*keys)
        await admin.aclose()
    return section


async def redis_commands(admin: Any, build: Callable[[int], shoal.App], plan: Plan) -> str:
    """Round trips (commands the clients send, pub/sub included) and server commands (those the
    scripts run included) per shoal operation: lock and meter with one client, and a lock with
    8 clients contending for one key."""
    from redis.asyncio.client import PubSub, Redis

    sent: dict[str, int] = {}

    def counting(fn: Any) -> Any:
        async def execute_command(self: Any, *args: Any, **kw: Any) -> Any:
            name = str(args[0]).lower()
            sent[name] = sent.get(name, 0) + 1
            return await fn(self, *args, **kw)
        return execute_command

    saved = Redis.execute_command, PubSub.execute_command
    parts = []
    async with AsyncExitStack() as stack:
        apps = await open_apps(stack, build, CLIENTS, first=200)
        key = KEY + ":warm"

        async def lock(app: shoal.App) -> None:
            async with app.lock(key):
                pass

        per_client = plan.counted // 5

        async def contended() -> None:
            async def loop(app: shoal.App) -> None:
                for _ in range(per_client):
                    await lock(app)
            await asyncio.gather(*(loop(a) for a in apps))

        tests: list[tuple[str, int, Op]] = [
            ("lock, 1 client", plan.counted, lambda: lock(apps[0])),
            ("meter, 1 client", plan.counted, lambda: apps[0].meter([key], [1.0])),
            (f"lock, {CLIENTS} clients", CLIENTS * per_client, contended)]
        for label, n, body in tests:
            before = await admin.info("commandstats")
            sent.clear()
            Redis.execute_command, PubSub.execute_command = (  # type: ignore[method-assign]
                counting(saved[0]), counting(saved[1]))
            try:
                for _ in range(n if label.endswith("1 client") else 1):
                    await body()
            finally:
                Redis.execute_command, PubSub.execute_command = saved  # type: ignore[method-assign]
            after = await admin.info("commandstats")
            server = sum(stats["calls"] - before.get(name, {}).get("calls", 0)
                         for name, stats in after.items() if name != "cmdstat_info")
            trips = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(sent.items()))
            parts.append(f"  {label}: round trips {sum(sent.values()) / n:.2f} ({trips}); "
                         f"server commands {server / n:.1f}")
    return "\n".join(parts)


# -- PostgreSQL ------------------------------------------------------------------------------------


async def bench_postgres(url: str, plan: Plan) -> Section:
    import psycopg

    section = Section("PostgreSQL")
    schema = f"coordbench_{os.getpid()}"
    store_url = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    admin = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        version = await pg_one(admin, "SHOW server_version")
        sync = await pg_one(admin, "SHOW synchronous_commit")
        section.facts = (f"PostgreSQL {version} (synchronous_commit={sync}), psycopg "
                         f"{psycopg.__version__}")

        def build(i: int) -> shoal.App:
            return shoal.App(NAMESPACE, store=store_url, instance_id=f"bench{i}")

        probe = build(0)
        if not isinstance(probe.store, CoordStore):
            section.error = ("shoal's PostgreSQL store does not implement coordination "
                             "(CoordStore) in this checkout")
            return section
        async with probe.open():          # migrate: the schema and shoal's tables
            pass
        await admin.execute(f"CREATE TABLE {schema}.bare_lock (k text PRIMARY KEY, v text)")
        await admin.execute(f"CREATE TABLE {schema}.bare_meter (k text PRIMARY KEY, "
                            "debt double precision NOT NULL)")
        section.notes.append(await store_calls(build, plan))
        async with AsyncExitStack() as stack:
            measures = await shoal_measures(stack, build, plan)
            conns = []
            for _ in range(CLIENTS + 2):
                conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
                stack.push_async_callback(conn.close)
                conns.append(conn)
            c = conns[0]
            ins = f"INSERT INTO {schema}.bare_lock VALUES ('k', 'x') ON CONFLICT DO NOTHING"
            dele = f"DELETE FROM {schema}.bare_lock WHERE k = 'k'"
            upsert = (f"INSERT INTO {schema}.bare_meter VALUES ('k', 1) ON CONFLICT (k) DO "
                      f"UPDATE SET debt = bare_meter.debt + 1")

            async def select1() -> None:
                await pg_one(c, "SELECT 1")

            def pair(conn: Any) -> Op:
                async def op() -> None:
                    while not (await conn.execute(ins)).rowcount:
                        pass
                    await conn.execute(dele)
                return op

            def meter(conn: Any) -> Op:
                async def op() -> None:
                    await conn.execute(upsert)
                return op

            measures |= {"SELECT 1": sequential(select1, plan),
                         "bare lock1": sequential(pair(c), plan),
                         "bare lock8": concurrent([pair(x) for x in conns[:CLIENTS]], plan),
                         "bare meter1": sequential(meter(c), plan),
                         "bare meter8": concurrent([meter(x) for x in conns[:CLIENTS]], plan)}
            got = await interleave(measures, plan, "postgres")
            ours = await shoal_handoff(build, plan, "postgres")

            # pg_advisory_lock hand-off: the server queues the waiter and wakes it on unlock
            sides = conns[CLIENTS:]
            pids = [x.info.backend_pid for x in sides]

            @contextlib.asynccontextmanager
            async def advisory(i: int) -> AsyncIterator[None]:
                await sides[i].execute("SELECT pg_advisory_lock(4242)")
                try:
                    yield
                finally:
                    await sides[i].execute("SELECT pg_advisory_unlock(4242)")

            async def waiting(i: int) -> None:
                while not await pg_one(c, "SELECT count(*) FROM pg_locks WHERE locktype = "
                                          "'advisory' AND NOT granted AND pid = %s", (pids[i],)):
                    pass

            advlat = await handoff(advisory, waiting, plan.handoffs, 0.002)

        section.rates = {k: vars(v) for k, v in got.items()}
        section.rate_row("lock acquire+release, 1 client", got["shoal lock1"],
                         "INSERT ON CONFLICT DO NOTHING + DELETE", got["bare lock1"])
        section.rate_row("", got["shoal lock1"], "SELECT 1 (one round trip)", got["SELECT 1"])
        section.rate_row(f"lock, {CLIENTS} clients on one key", got["shoal lock8"],
                         "INSERT + DELETE, spin on conflict", got["bare lock8"], True)
        section.handoff_rows(ours, "pg_advisory_lock, server-side wait", advlat)
        section.rate_row("meter, 1 client", got["shoal meter1"],
                         "INSERT ON CONFLICT DO UPDATE", got["bare meter1"])
        section.rate_row(f"meter, {CLIENTS} tasks on one app", got["shoal meter8"],
                         f"the same, {CLIENTS} connections", got["bare meter8"])
    finally:
        with contextlib.suppress(Exception):
            await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()
    return section


# -- SQLite ----------------------------------------------------------------------------------------


async def bench_sqlite(tmp: Path, plan: Plan) -> Section:
    section = Section("SQLite")
    path = tmp / "coord.db"
    bare_path = tmp / "bare.db"
    store_url = f"sqlite:///{path}"

    def build(i: int) -> shoal.App:
        return shoal.App(NAMESPACE, store=store_url, instance_id=f"bench{i}")

    probe = build(0)
    synchronous = getattr(probe.store, "synchronous", "full")
    section.facts = (f"SQLite {sqlite3.sqlite_version}, WAL, synchronous={synchronous.upper()}, "
                     f"files in {tmp} ({filesystem_of(tmp)})")
    if not isinstance(probe.store, CoordStore):
        section.error = ("shoal's SQLite store does not implement coordination (CoordStore) in "
                         "this checkout")
        return section

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(bare_path, isolation_level=None, check_same_thread=False,
                               timeout=10.0)
        conn.execute("PRAGMA journal_mode = WAL").fetchall()
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        return conn

    conns = [connect() for _ in range(CLIENTS + 2)]
    try:
        conns[0].execute("CREATE TABLE bare (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
        conns[0].execute("INSERT INTO bare VALUES ('k', 0)")

        def tx(conn: sqlite3.Connection) -> Callable[[], None]:
            def op() -> None:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("UPDATE bare SET v = v + 1 WHERE k = 'k'")
                conn.execute("COMMIT")
            return op

        section.notes.append(await store_calls(build, plan))
        async with AsyncExitStack() as stack:
            measures = await shoal_measures(stack, build, plan)
            measures |= {"bare tx1": threaded([tx(conns[0])], plan),
                         "bare tx8": threaded([tx(x) for x in conns[:CLIENTS]], plan)}
            got = await interleave(measures, plan, "sqlite")
        ours = await shoal_handoff(build, plan, "sqlite")

        # BEGIN IMMEDIATE hand-off: the waiter sleeps in SQLite's busy handler (1, 2, 5, 10,
        # ... 100 ms steps) until the holder commits
        sides = conns[CLIENTS:]
        waiting = [threading.Event(), threading.Event()]

        @contextlib.asynccontextmanager
        async def immediate(i: int) -> AsyncIterator[None]:
            conn = sides[i]

            def begin() -> None:
                conn.execute("PRAGMA busy_timeout = 0")
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError:
                    pass
                conn.execute("PRAGMA busy_timeout = 10000")
                waiting[i].set()
                conn.execute("BEGIN IMMEDIATE")

            await asyncio.to_thread(begin)
            try:
                yield
            finally:
                conn.execute("UPDATE bare SET v = v + 1 WHERE k = 'k'")
                conn.execute("COMMIT")

        async def queued(i: int) -> None:
            await asyncio.to_thread(waiting[i].wait)
            waiting[i].clear()
            await asyncio.sleep(0.0005)   # the set above comes just before the blocking BEGIN

        sqlat = await handoff(immediate, queued, plan.handoffs, 0.002)
    finally:
        for x in conns:
            x.close()

    section.rates = {k: vars(v) for k, v in got.items()}
    section.rate_row("lock acquire+release, 1 client", got["shoal lock1"],
                     "BEGIN IMMEDIATE; UPDATE; COMMIT", got["bare tx1"])
    section.rate_row(f"lock, {CLIENTS} clients on one key", got["shoal lock8"],
                     f"the same, {CLIENTS} threads", got["bare tx8"], True)
    section.handoff_rows(ours, "BEGIN IMMEDIATE in the busy handler", sqlat)
    section.rate_row("meter, 1 client", got["shoal meter1"], "BEGIN IMMEDIATE; UPDATE; COMMIT",
                     got["bare tx1"])
    section.rate_row(f"meter, {CLIENTS} tasks on one app", got["shoal meter8"],
                     f"the same, {CLIENTS} threads", got["bare tx8"])
    return section


# -- output ----------------------------------------------------------------------------------------


def fmt(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "ms":
        return f"{value:.2f} ms"
    return f"{value:,.0f}/s"


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
        t.add_column("operation", no_wrap=True)
        t.add_column("shoal", justify="right")
        t.add_column("baseline")
        t.add_column("", justify="right")
        t.add_column("ratio", justify="right")
        t.add_column("CPU µs/op", justify="right", no_wrap=True)
        t.add_column("note", no_wrap=True)
        for r in s.rows:
            ratio = r.ratio()
            t.add_row(r.operation, fmt(r.shoal, r.kind) if r.operation else "", r.baseline,
                      fmt(r.base, r.kind), "-" if ratio is None else f"{ratio:.2f}x", r.cpu,
                      r.note)
        console.print(t)
        for note in s.notes:
            console.print(note)
    console.print(
        "\nops/s: median of the rounds. ratio: shoal's time per operation / the baseline's, the "
        "median of the rounds' ratios (each round runs both back to back); for hand-offs shoal's "
        "latency / the baseline's. Above 1, shoal is slower. CPU µs/op: this process's CPU time "
        "per operation, shoal / baseline (less sensitive to load from elsewhere than ops/s). "
        "shares: the least and largest share of the acquisitions one client got. "
        f"{CLIENTS} clients: {CLIENTS} App objects, each with its own store object and "
        "connections, one asyncio task each, one key. hand-off: the holder leaves its "
        "`async with` at t0 once the waiter is queued, the waiter's __aenter__ returns at t1.")


# -- main ------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, plan: Plan, tmp: Path) -> list[Section]:
    # Ctrl-C or SIGTERM cancels the section in flight, whose clean-up (Redis keys, schema) runs
    # in its finally blocks; a cancellation that a library swallowed is caught between sections.
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    stopping: list[int] = []

    def stop(signum: int) -> None:
        stopping.append(signum)
        task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop, signum)
    sections = []
    for name in args.only.split(","):
        name = name.strip()
        began = perf()
        if stopping:
            raise KeyboardInterrupt
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
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None
        except (OSError, ImportError) as e:
            if stopping:
                raise KeyboardInterrupt from None
            s = Section(name, error=f"{type(e).__name__}: {e}")
        except Exception as e:
            if stopping:
                raise KeyboardInterrupt from None
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
                        help="window of each throughput measure, per round (default 0.3, "
                             "--quick 0.25)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of the throughput measures, median shown (default 8, "
                             "--quick 2)")
    parser.add_argument("--handoffs", type=int, default=None,
                        help="hand-offs per event-driven lock (default 500, --quick 150)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        plan = Plan(rounds=2, seconds=0.2, warmup=0.05, handoffs=150, poll_handoffs=16,
                    counted=50)
    else:
        plan = Plan(rounds=8, seconds=0.3, warmup=0.1, handoffs=500, poll_handoffs=60,
                    counted=200)
    if args.seconds is not None:
        plan.seconds = args.seconds
    if args.rounds is not None:
        plan.rounds = args.rounds
    if args.handoffs is not None:
        plan.handoffs = args.handoffs

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    tmp = Path(tempfile.mkdtemp(prefix="shoal-coordbench-")).resolve()
    header = machine("shoal coord bench")
    began = perf()
    try:
        sections = asyncio.run(run(args, plan, tmp))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    header += f"; {perf() - began:.0f} s in all" + (" (--quick)" if args.quick else "")
    render(sections, header)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "plan": vars(plan), "header": header,
            "sections": [{"store": s.store, "facts": s.facts, "error": s.error, "notes": s.notes,
                          "rows": [{**vars(r), "ratio": r.ratio()} for r in s.rows],
                          "measures": s.rates}
                         for s in sections]}, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
