"""``store.stats`` latency on the SQLite store: a file of N finished + M queued runs against a file
of the M queued runs alone (bench/postgres.py measures PostgreSQL the same way, in its part 5).

    .venv/bin/python bench/stats_sqlite.py                       # 1,000,000 + 100,000 rows
    .venv/bin/python bench/stats_sqlite.py --finished 200000 --queued 20000 --calls 100

The rows are bulk-loaded in SQL, the finished ones counted as migration 0014 counts the runs
already final, the counts folded as the retention service folds them, then the two files take
turns, ``--calls`` calls each in 10 rounds. The files live in a temporary folder, deleted at the
end.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from shoal.backends.sqlite import SQLiteStore

NAMESPACE = "bench"
LOAD_SQL = """
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {n})
INSERT INTO runs (id, namespace, tenant, workflow, input, output, status, priority,
                  created_at, run_at, attempts, max_attempts, root_id, started_at, finished_at)
SELECT '{prefix}' || printf('%09d', n), 'bench', 'default', 'noop', '{{}}', {output},
       '{status}', 0, {t0} + n * 0.001, {t0} + n * 0.001, {attempts}, 3,
       '{prefix}' || printf('%09d', n), {started}, {finished}
FROM g
"""
# The counts of the loaded final runs, as migration 0014 counts the runs already final in a file it
# upgrades (rows inserted by hand are not counted by the store's triggers).
COUNT_LOADED_SQL = """
INSERT INTO run_counts (namespace, workflow, status, bucket, n)
SELECT namespace, workflow, status, CAST(finished_at AS INTEGER), count(*) FROM runs
WHERE status IN ('succeeded', 'failed', 'cancelled')
GROUP BY namespace, workflow, status, CAST(finished_at AS INTEGER)
"""


async def build(path: Path, finished: int, queued: int, t0: float) -> float:
    """A store at ``path`` holding the runs; the seconds it took."""
    start = time.perf_counter()
    store = SQLiteStore(str(path), synchronous="normal")
    await store.open()
    await store.close()
    with sqlite3.connect(path) as conn:
        if finished:
            conn.execute(LOAD_SQL.format(
                n=finished, prefix="f", output="'null'", status="succeeded", t0=t0, attempts=1,
                started=f"{t0} + n * 0.001", finished=f"{t0} + n * 0.001 + 0.01"))
        if queued:
            conn.execute(LOAD_SQL.format(
                n=queued, prefix="q", output="NULL", status="queued", t0=t0 + 2000, attempts=0,
                started="NULL", finished="NULL"))
        conn.execute(COUNT_LOADED_SQL)
        conn.execute("ANALYZE")
    conn.close()
    store = SQLiteStore(str(path))
    await store.open()
    try:
        await store.fold_stats(NAMESPACE, time.time())
        counted = (await store.stats(NAMESPACE, time.time())).by_status
        assert (counted["succeeded"], counted["queued"]) == (finished, queued), counted
    finally:
        await store.close()
    return time.perf_counter() - start


async def timed(paths: dict[str, Path], calls: int, rounds: int = 10) -> dict[str, list[float]]:
    stores = {name: SQLiteStore(str(path)) for name, path in paths.items()}
    out: dict[str, list[float]] = {name: [] for name in paths}
    try:
        for store in stores.values():
            await store.open()
            for _ in range(3):
                await store.stats(NAMESPACE, time.time())
        for r in range(rounds):
            for name, store in stores.items():
                for _ in range(calls // rounds + (r < calls % rounds)):
                    t = time.perf_counter()
                    await store.stats(NAMESPACE, time.time())
                    out[name].append(time.perf_counter() - t)
        return out
    finally:
        for store in stores.values():
            await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="shoal-stats-"))
    try:
        t0 = time.time() - 86400
        tables = {"queued": (0, args.queued), "large": (args.finished, args.queued)}
        paths = {name: folder / f"{name}.db" for name in tables}
        for name, (finished, queued) in tables.items():
            seconds = asyncio.run(build(paths[name], finished, queued, t0))
            print(f"{name}: {finished:,} finished + {queued:,} queued, built in {seconds:.1f} s")
        times = asyncio.run(timed(paths, args.calls))
        base = statistics.median(times["queued"])
        for name, values in times.items():
            q = statistics.quantiles(values, n=100, method="inclusive")
            print(f"{name:7} stats p50 {1000 * q[49]:6.1f} ms  p90 {1000 * q[89]:6.1f} ms  "
                  f"p99 {1000 * q[98]:6.1f} ms  p50 vs queued {q[49] / base:.2f}x")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
