"""The console's server time per page at 1,000,000 finished + 100,000 queued runs, on SQLite and
PostgreSQL: what each page's reads cost in the store (``shoal.web.Console``, the same calls the
API makes, without HTTP). Target: under 100 ms for each page.

Then the console's load on the store with several browsers open: ``--clients`` (5) clients each
GET ``/api/overview`` (and, in a second round, ``/api/runs`` too) through the console's ASGI app
(``shoal.web.asgi(app)``, in process, with httpx), waiting ``--every`` (2) seconds after each
answer before the next, as the overview page does (console.js: ``setTimeout(tick, 2000)`` after
each answer; pages.py ``REFRESH = 2.0``), for ``--load-seconds`` (30) seconds. Every SQL
statement the store sends is counted (SQLite: the connection's trace callback; PostgreSQL: each
``execute`` of a psycopg cursor, pipelined ones included); transaction control (BEGIN, COMMIT,
SET TRANSACTION; psycopg sends a transaction's BEGIN and COMMIT itself, unseen) is counted apart
and not printed.

    .venv/bin/python bench/console.py                        # 1,000,000 + 100,000 rows
    .venv/bin/python bench/console.py --finished 100000 --queued 10000 --calls 10
    .venv/bin/python bench/console.py --backends sqlite
    .venv/bin/python bench/console.py --calls 3 --load-seconds 60 --clients 5 --every 2

The finished runs end one every 0.5 s up to now (about 5.8 days: 7,200 of them in the last hour,
what the overview's chart reads); 1% of them failed, 10% have an idempotency key, 10% a
concurrency key, spread over 10 tenants and 4 workflows. The rows are bulk-loaded in SQL and
counted for stats() as migration 0014 counts runs already final, then folded as the retention
service folds them. PostgreSQL is
``SHOAL_TEST_POSTGRES`` (default postgresql://postgres@127.0.0.1:5432/test), in a schema of its
own, dropped at the end; the SQLite file lives in a temporary folder, deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2 as httpx

import shoal
import shoal.web
from shoal.web import Console

NAMESPACE = "bench"
PG = os.environ.get("SHOAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

# one row per n; {n} rows ending {t1} (the last at t1), or queued ones after them. SQLite's
# printf and PostgreSQL's lpad spell the same ids.
ROW = """{pad} AS id, 'bench', 't' || ({n} % 10), 'wf' || ({n} % 4), '{{"n": 1}}',
    {status}, 0, {t1} - ({total} - {n}) * 0.5 - 1, {t1} - ({total} - {n}) * 0.5 - 1,
    1, 3, {pad},
    CASE WHEN {n} % 10 = 3 THEN '{prefix}key-' || {n} END,
    CASE WHEN {n} % 10 = 7 THEN '{prefix}ck-' || ({n} % 1000) END,
    {started}, {finished}"""
COLUMNS = """(id, namespace, tenant, workflow, input, status, priority, created_at, run_at,
    attempts, max_attempts, root_id, idempotency_key, concurrency_key, started_at, finished_at)"""
FINISHED = dict(status="CASE WHEN {n} % 100 = 0 THEN 'failed' ELSE 'succeeded' END",
                started="{t1} - ({total} - {n}) * 0.5 - 0.5",
                finished="{t1} - ({total} - {n}) * 0.5")
QUEUED = dict(status="'queued'", started="NULL", finished="NULL")


def rows_sql(dialect: str, kind: dict[str, str], prefix: str, total: int, t1: float) -> str:
    n = "n" if dialect == "sqlite" else "g"
    pad = (f"'{prefix}' || printf('%09d', n)" if dialect == "sqlite"
           else f"'{prefix}' || lpad(g::text, 9, '0')")
    fill: dict[str, Any] = {"n": n, "total": total, "t1": t1}
    row = ROW.format(pad=pad, status=kind["status"].format(**fill),
                     started=kind["started"].format(**fill),
                     finished=kind["finished"].format(**fill), prefix=prefix, **fill)
    if dialect == "sqlite":
        return (f"WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g "
                f"WHERE n < {total}) INSERT INTO runs {COLUMNS} SELECT {row} FROM g")
    return (f"INSERT INTO runs {COLUMNS} SELECT {row} "
            f"FROM generate_series(1, {total}) AS g")


COUNTS = """INSERT INTO run_counts (namespace, workflow, status, bucket, n)
SELECT namespace, workflow, status, {floor}, count(*) FROM runs
WHERE status IN ('succeeded', 'failed', 'cancelled')
GROUP BY namespace, workflow, status, {floor}"""


def load(dialect: str, execute: Callable[[str], Any], finished: int, queued: int,
         now: float) -> None:
    if finished:
        execute(rows_sql(dialect, FINISHED, "f", finished, now))
    if queued:
        execute(rows_sql(dialect, QUEUED, "q", queued, now + queued))
    execute(COUNTS.format(floor="CAST(finished_at AS INTEGER)" if dialect == "sqlite"
                          else "floor(finished_at)"))
    execute("ANALYZE")


async def prepare(url: str) -> None:
    app = shoal.App(NAMESPACE, store=url)
    async with app.open():
        await app.store.register_workflows(NAMESPACE, {"wf0": {}}, time.time(),
                                           instance="bench-1")


async def fold(url: str) -> None:
    """Fold the loaded counts as the retention service does on a store that has run a while."""
    app = shoal.App(NAMESPACE, store=url)
    async with app.open():
        await app.store.fold_stats(NAMESPACE, time.time())


async def measure(url: str, calls: int, finished: int) -> dict[str, list[float]]:
    app = shoal.App(NAMESPACE, store=url)
    console = Console(app, in_process=False)
    now = time.time()
    pages: dict[str, Callable[[], Awaitable[Any]]] = {
        "overview": console.overview,
        "  of it: app.stats()": app.stats,
        "  of it: runs per minute": lambda: app.store.finished_per_minute(
            NAMESPACE, now - 3540, 60),
        "runs: first page": lambda: console.runs({}),
        "runs: page 200 (cursor)": lambda: console.runs({"cursor": f"f{finished - 10_000:09d}"}),
        "runs: failed": lambda: console.runs({"status": "failed"}),
        "runs: queued, tenant t3": lambda: console.runs({"status": "queued", "tenant": "t3"}),
        "runs: workflow wf2": lambda: console.runs({"workflow": "wf2"}),
        "runs: last hour": lambda: console.runs({"created_from": str(now - 3600)}),
        "runs: search key": lambda: console.runs({"q": f"fkey-{finished // 2 + 3}"}),
        "runs: search conc. key": lambda: console.runs({"q": "fck-7"}),
        "run detail": lambda: console.run(f"f{finished // 2:09d}"),
    }
    out: dict[str, list[float]] = {name: [] for name in pages}
    async with app.open():
        for page in pages.values():          # warm-up: connections, plans, caches
            await page()
        for _ in range(calls):
            for name, page in pages.items():
                t = time.perf_counter()
                await page()
                out[name].append(time.perf_counter() - t)
    return out


class Statements:
    """Counts the SQL statements a store sends while installed (see the module doc)."""

    CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SET TRANSACTION")

    def __init__(self) -> None:
        self.queries = 0
        self.control = 0
        self._undo: Callable[[], None] = lambda: None

    def seen(self, sql: Any) -> None:
        text = (sql.decode() if isinstance(sql, bytes) else str(sql)).lstrip().upper()
        if text.startswith(self.CONTROL):
            self.control += 1
        else:
            self.queries += 1

    def install(self, store: Any) -> None:
        if hasattr(store, "_db"):                      # SQLite: the store's one connection
            store._db.set_trace_callback(self.seen)
            self._undo = lambda: store._db.set_trace_callback(None)
            return
        import psycopg

        real = psycopg.AsyncCursor.execute

        async def counted(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            self.seen(query if isinstance(query, (str, bytes)) else query.as_string(None))
            return await real(cursor, query, *args, **kwargs)

        setattr(psycopg.AsyncCursor, "execute", counted)  # noqa: B010 (a method swapped)
        self._undo = lambda: setattr(psycopg.AsyncCursor, "execute", real)

    def remove(self) -> None:
        self._undo()


async def console_load(url: str, clients: int, every: float, seconds: float,
                       paths: tuple[str, ...]) -> dict[str, float]:
    """``clients`` pollers GET each of ``paths`` in turn, wait ``every`` s after the answers,
    again, for ``seconds``: statements (and transaction control statements) per second the
    store received, polls per second, the time of one poll (p50, ms), and ``busy``: the polls'
    times summed per second of the run (they overlap: an upper bound of the console's share of
    a core and of the store's time)."""
    app = shoal.App(NAMESPACE, store=url)
    counter = Statements()
    polls: list[float] = []
    async with app.open():
        transport = httpx.ASGITransport(app=shoal.web.asgi(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            for path in paths:                         # warm-up
                assert (await http.get(path)).status_code == 200
            counter.install(app.store)
            loop = asyncio.get_running_loop()
            start = loop.time()

            async def browser(i: int) -> None:
                await asyncio.sleep(i * every / clients)     # the browsers were not opened at once
                while loop.time() - start < seconds:
                    t = time.perf_counter()
                    for path in paths:
                        got = await http.get(path)
                        assert got.status_code == 200, got.text
                    polls.append(time.perf_counter() - t)
                    await asyncio.sleep(every)

            try:
                await asyncio.gather(*(browser(i) for i in range(clients)))
            finally:
                counter.remove()
            elapsed = loop.time() - start
    return {"statements_per_s": counter.queries / elapsed,
            "transactions_per_s": counter.control / elapsed,
            "statements_per_poll": counter.queries / len(polls),
            "polls_per_s": len(polls) / elapsed,
            "poll_ms_p50": 1000 * statistics.median(polls),
            "busy": sum(polls) / elapsed}


def sqlite_store(folder: Path, finished: int, queued: int) -> tuple[str, float]:
    path = folder / "console.db"
    url = f"sqlite:///{path}"
    start = time.perf_counter()
    asyncio.run(prepare(url))
    with sqlite3.connect(path) as conn:
        load("sqlite", conn.execute, finished, queued, time.time())
    conn.close()
    asyncio.run(fold(url))
    return url, time.perf_counter() - start


def postgres_store(schema: str, finished: int, queued: int) -> tuple[str, float]:
    import psycopg

    url = f"{PG}?schema={schema}"
    start = time.perf_counter()
    asyncio.run(prepare(url))
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
        load("postgres", conn.execute, finished, queued, time.time())
    asyncio.run(fold(url))
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {schema}.runs, {schema}.run_counts")  # type: ignore[arg-type]
    return url, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--load-seconds", type=float, default=30.0)
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {}
    loads: dict[str, dict[str, dict[str, float]]] = {}
    folder = Path(tempfile.mkdtemp(prefix="shoal-console-"))
    schema = f"console_bench_{os.getpid()}"
    try:
        for backend in args.backends.split(","):
            if backend == "sqlite":
                url, built = sqlite_store(folder, args.finished, args.queued)
            else:
                url, built = postgres_store(schema, args.finished, args.queued)
            print(f"{backend}: {args.finished:,} finished + {args.queued:,} queued, loaded in "
                  f"{built:.0f} s", flush=True)
            results[backend] = asyncio.run(measure(url, args.calls, args.finished))
            if args.load_seconds > 0:
                loads[backend] = {
                    name: asyncio.run(console_load(url, args.clients, args.every,
                                                   args.load_seconds, paths))
                    for name, paths in (("overview", ("/api/overview",)),
                                        ("overview + runs", ("/api/overview", "/api/runs")))}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if "postgres" in args.backends:
            import psycopg

            with psycopg.connect(PG, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]
    names = list(next(iter(results.values())))
    print(f"\nserver time per page, ms (p50 / p90 of {args.calls} calls)")
    print(f"{'page':26}" + "".join(f"{b:>20}" for b in results))
    for name in names:
        cells = []
        for times in results.values():
            q = statistics.quantiles(times[name], n=10, method="inclusive")
            cells.append(f"{1000 * statistics.median(times[name]):8.1f} / {1000 * q[8]:7.1f}")
        print(f"{name:26}" + "".join(f"{c:>20}" for c in cells))
    if loads:
        print(f"\nload on the store: {args.clients} clients, each polling {args.every:g} s "
              f"after the last answer, for {args.load_seconds:g} s")
        print(f"{'backend, polled':30}{'stmts/s':>10}{'stmts/poll':>12}"
              f"{'polls/s':>9}{'poll ms p50':>13}{'busy':>7}")
        for backend, by_page in loads.items():
            for name, m in by_page.items():
                print(f"{backend + ', ' + name:30}{m['statements_per_s']:10.1f}"
                      f"{m['statements_per_poll']:12.1f}"
                      f"{m['polls_per_s']:9.2f}{m['poll_ms_p50']:13.1f}{m['busy']:7.1%}")


if __name__ == "__main__":
    main()
