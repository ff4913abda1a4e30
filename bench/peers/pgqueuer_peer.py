"""pgqueuer runner for bench/postgres.py (see _common.py for the modes). Written from pgqueuer's
documentation: a QueueManager over a psycopg connection (``--driver asyncpg``: an asyncpg one),
one entrypoint, ``Queries.enqueue`` with lists for a batch. Tables are pgqueuer's defaults
(logged, durable). pgqueuer has no durable steps: only the no-op workflow."""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import psycopg
from _common import Tally, emit, paced, serve
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries

BATCH = 500


async def connect(dsn: str) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True)


async def main(args: argparse.Namespace) -> None:
    conn = await connect(args.dsn)
    queries = Queries.from_psycopg_connection(conn)
    if args.mode == "setup":
        await queries.install()
    elif args.mode == "enqueue":
        count = args.n
        if args.interval:
            async def one(i: int) -> None:
                await queries.enqueue("noop", json.dumps({"t": time.time()}).encode(),
                                      args.priority)
            seconds, count = await paced(args.n, args.interval, one)
        else:
            start = time.perf_counter()
            for i in range(0, args.n, BATCH):
                k = min(BATCH, args.n - i)
                await queries.enqueue(["noop"] * k, [b"{}"] * k, [0] * k)
            seconds = time.perf_counter() - start
        emit(event="enqueued", seconds=seconds, count=count)
    else:
        tally = Tally()
        if args.driver == "asyncpg":
            import asyncpg

            worker_conn = await asyncpg.connect(args.dsn)
            queries = Queries.from_asyncpg_connection(worker_conn)
        qm = QueueManager(queries)

        @qm.entrypoint("noop")
        async def noop(job: Job) -> None:
            tally.hit(json.loads(job.payload or b"{}").get("t"))

        task: list[asyncio.Task[None]] = []

        async def start() -> None:
            if args.slots:
                # at most --slots jobs at once; max_concurrent_tasks must be at least twice
                # batch_size
                run = qm.run(batch_size=max(1, args.slots // 2),
                             max_concurrent_tasks=max(2, args.slots))
            else:
                run = qm.run()   # pgqueuer's defaults: batches of 10, no cap on tasks
            task.append(asyncio.create_task(run))

        async def stop() -> None:
            qm.shutdown.set()
            await asyncio.wait_for(task[0], 30)

        await serve(tally, start, stop)
        if args.driver == "asyncpg":
            await worker_conn.close()
    await conn.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("mode", choices=("setup", "enqueue", "work"))
    parser.add_argument("n", type=int, nargs="?", default=0)
    parser.add_argument("--interval", type=float, default=0.0)
    parser.add_argument("--priority", type=int, default=0, help="of paced jobs; higher first")
    parser.add_argument("--workflow", choices=("noop",), default="noop")
    parser.add_argument("--name", default="w")
    parser.add_argument("--slots", type=int, default=16, help="0: pgqueuer's defaults")
    parser.add_argument("--driver", choices=("psycopg", "asyncpg"), default="psycopg")
    asyncio.run(main(parser.parse_args()))
