"""What a dispatch costs from code without an event loop (a Django or Flask view).

    .venv/bin/python bench/clients.py [--n 2000] [--postgres URL | --no-postgres]

For SQLite (a file in a new temporary folder, synchronous=FULL) and PostgreSQL (a schema of its
own, dropped at the end): the store's own insert (``store.create_run`` awaited in a loop: the
floor), ``shoal.Client.dispatch`` (sync, from the main thread, through the client's loop
thread), ``shoal.AsyncClient.dispatch`` (awaited in one loop), and what the issue found before
the clients (``asyncio.run`` + ``app.open()`` per request: a few hundred, not n). Each is
sequential: one dispatch at a time. Overhead is the Client's median minus the store's; the
target is at most 2 ms. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import machine, pct
from rich.console import Console
from rich.table import Table

import shoal
from shoal import _ids
from shoal.stores import mask_url, open_store
from shoal.types import NewRun

NAMESPACE = "bench"


def _new_run(now: float) -> NewRun:
    run_id = _ids.new_id(now)
    return NewRun(id=run_id, namespace=NAMESPACE, tenant="default", workflow="noop", input={},
                  priority=0, created_at=now, run_at=now, max_attempts=3, concurrency_key=None,
                  idempotency_key=None, version=None, root_id=run_id, input_json="{}")


async def _register(url: str) -> None:
    """A started (then closed) worker records the workflow ``noop`` in the store."""
    app = shoal.App(NAMESPACE, store=url)

    @app.workflow
    async def noop(ctx: shoal.RunContext, input: object) -> None:
        return None

    await app.start()
    await app.close(timeout=1)


async def _store_inserts(url: str, n: int) -> list[float]:
    store = open_store(url)
    await store.open()
    try:
        times = []
        for _ in range(n):
            start = time.perf_counter()
            await store.create_run(_new_run(time.time()), max_queued=None, admission="reject")
            times.append(time.perf_counter() - start)
        return times
    finally:
        await store.close()


def _client_dispatches(url: str, n: int) -> list[float]:
    with shoal.Client(url, namespace=NAMESPACE) as client:
        client.dispatch("noop", {})   # connects
        times = []
        for _ in range(n):
            start = time.perf_counter()
            client.dispatch("noop", {})
            times.append(time.perf_counter() - start)
        return times


async def _async_client_dispatches(url: str, n: int) -> list[float]:
    async with shoal.AsyncClient(url, namespace=NAMESPACE) as client:
        await client.dispatch("noop", {})
        times = []
        for _ in range(n):
            start = time.perf_counter()
            await client.dispatch("noop", {})
            times.append(time.perf_counter() - start)
        return times


def _open_per_request(url: str, n: int) -> list[float]:
    async def one() -> None:
        async with shoal.App(NAMESPACE, store=url).open() as app:
            await app.dispatch("noop", {})

    times = []
    for _ in range(n):
        start = time.perf_counter()
        asyncio.run(one())
        times.append(time.perf_counter() - start)
    return times


def _measure(url: str, n: int) -> list[tuple[str, list[float]]]:
    asyncio.run(_register(url))
    asyncio.run(_store_inserts(url, 50))   # warm the file / the server's caches
    found: list[tuple[str, list[float]]] = []
    cases: list[tuple[str, Callable[[], list[float]]]] = [
        ("store.create_run (the floor)", lambda: asyncio.run(_store_inserts(url, n))),
        ("shoal.Client.dispatch (sync)", lambda: _client_dispatches(url, n)),
        ("shoal.AsyncClient.dispatch", lambda: asyncio.run(_async_client_dispatches(url, n))),
        ("asyncio.run + app.open() per call", lambda: _open_per_request(url, max(20, n // 10))),
    ]
    for name, case in cases:
        found.append((name, case()))
    return found


def _table(title: str, rows: list[tuple[str, list[float]]]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("", "n", "p50 ms", "p90 ms", "p99 ms", "over the store's p50 ms"):
        table.add_column(column, justify="left" if not column else "right")
    floor = pct(rows[0][1], 0.5)
    for name, times in rows:
        p50 = pct(times, 0.5)
        table.add_row(name, str(len(times)), f"{p50 * 1e3:.3f}", f"{pct(times, 0.9) * 1e3:.3f}",
                      f"{pct(times, 0.99) * 1e3:.3f}", f"{(p50 - floor) * 1e3:+.3f}")
    return table


async def _postgres_schema(url: str, drop: str | None = None) -> str:
    import psycopg
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        if drop is not None:
            await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                sql.Identifier(drop)))
            return drop
        name = f"shoal_bench_clients_{secrets.token_hex(4)}"
        return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="dispatches per case")
    parser.add_argument("--postgres", default=os.environ.get(
        "SHOAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    console = Console(width=120)
    console.print(machine("bench/clients.py"))
    folder = Path(tempfile.mkdtemp(prefix="shoal-bench-clients-"))
    try:
        url = f"sqlite:///{folder / 'bench.db'}"
        console.print(_table(f"SQLite {mask_url(url)} (synchronous=FULL)", _measure(url, args.n)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.no_postgres:
        return
    schema = asyncio.run(_postgres_schema(args.postgres))
    sep = "&" if "?" in args.postgres else "?"
    url = f"{args.postgres}{sep}schema={schema}"
    try:
        console.print(_table(f"PostgreSQL {mask_url(args.postgres)}, schema {schema}",
                             _measure(url, args.n)))
    finally:
        asyncio.run(_postgres_schema(args.postgres, drop=schema))


if __name__ == "__main__":
    main()
