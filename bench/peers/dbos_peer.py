"""DBOS runner for bench/postgres.py (see _common.py for the modes). Written from DBOS's
documentation: async workflows (``noop``: no steps; ``steps5``: 5 calls of a trivial async
``@DBOS.step``, each checkpointed), a queue registered with DBOS.register_queue
(``worker_concurrency`` = slots per process, polled every ``--poll`` seconds), jobs enqueued from a
DBOSClient (one enqueue call per workflow: DBOS has no batch enqueue), each worker process a
launched DBOS with its own executor_id."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

from _common import Tally, emit, paced, serve
from dbos import DBOS, DBOSClient

QUEUE = "bench"
STEPS = 5
tally = Tally()


@DBOS.workflow(name="noop")
async def noop(t: float | None = None) -> None:
    tally.hit(t)


@DBOS.step(name="bump")
async def bump(i: int) -> int:
    return i + 1


@DBOS.workflow(name="steps5")
async def steps5(t: float | None = None) -> int:
    tally.hit(t)
    value = 0
    for _ in range(STEPS):
        value = await bump(value)
    return value


def config(args: argparse.Namespace) -> dict:
    return {"name": "shoalbench", "system_database_url": args.dsn, "executor_id": args.name,
            "log_level": "WARNING", "application_version": "bench"}


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("dbos").setLevel(logging.WARNING)
    if args.mode == "setup":
        DBOS(config=config(args))
        DBOS.launch()
        await DBOS.register_queue_async(QUEUE, worker_concurrency=args.slots,
                                        polling_interval_sec=args.poll,
                                        on_conflict="always_update")
        DBOS.destroy()
    elif args.mode == "enqueue":
        client = DBOSClient(system_database_url=args.dsn)
        options = {"queue_name": QUEUE, "workflow_name": args.workflow, "app_version": "bench"}
        count = args.n
        if args.interval:
            async def one(i: int) -> None:
                await client.enqueue_async(options, time.time())
            seconds, count = await paced(args.n, args.interval, one)
        else:
            # no batch enqueue: calls from a few threads at once (one transaction each)
            start = time.perf_counter()
            sem = asyncio.Semaphore(8)

            async def guarded(i: int) -> None:
                async with sem:
                    await client.enqueue_async(options)
            await asyncio.gather(*(guarded(i) for i in range(args.n)))
            seconds = time.perf_counter() - start
        client.destroy()
        emit(event="enqueued", seconds=seconds, count=count)
    else:
        DBOS(config=config(args))

        async def start() -> None:
            DBOS.launch()
            # the queue's settings live in the database (setup wrote them); registering again
            # is how a process says it serves the queue
            await DBOS.register_queue_async(QUEUE, worker_concurrency=args.slots,
                                            polling_interval_sec=args.poll,
                                            on_conflict="always_update")

        async def stop() -> None:
            await asyncio.to_thread(DBOS.destroy, workflow_completion_timeout_sec=10)

        await serve(tally, start, stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("mode", choices=("setup", "enqueue", "work"))
    parser.add_argument("n", type=int, nargs="?", default=0)
    parser.add_argument("--interval", type=float, default=0.0)
    parser.add_argument("--workflow", choices=("noop", "steps5"), default="noop")
    parser.add_argument("--name", default="w")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--poll", type=float, default=0.05)
    asyncio.run(main(parser.parse_args()))
