"""The console's server time per page at 1,000,000 finished + 100,000 queued runs, on SQLite and
PostgreSQL: what each page's reads cost in the store (``shoal.web.Console``, the same calls the
API makes, without HTTP). Target: under 100 ms for each page.

    .venv/bin/python bench/console.py                        # 1,000,000 + 100,000 rows
    .venv/bin/python bench/console.py --finished 100000 --queued 10000 --calls 10
    .venv/bin/python bench/console.py --backends sqlite

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

import shoal
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
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {}
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


if __name__ == "__main__":
    main()
