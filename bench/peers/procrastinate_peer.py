"""procrastinate runner for bench/postgres.py (see _common.py for the modes). Written from
procrastinate's documentation: an App over a PsycopgConnector, one async task, ``batch_defer_async``
for a batch, ``run_worker_async`` with ``concurrency`` (LISTEN/NOTIFY on, its default).
procrastinate has no durable steps: only the no-op workflow."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

import procrastinate
from _common import Tally, emit, paced, serve

BATCH = 500
tally = Tally()


def make_app(dsn: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop", queue="bench")
    async def noop(t: float | None = None) -> None:
        tally.hit(t)

    return app


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    app = make_app(args.dsn)
    async with app.open_async():
        task = app.tasks["noop"]
        if args.mode == "setup":
            await app.schema_manager.apply_schema_async()
        elif args.mode == "enqueue":
            count = args.n
            if args.interval:
                paced_task = task.configure(priority=args.priority)

                async def one(i: int) -> None:
                    await paced_task.defer_async(t=time.time())
                seconds, count = await paced(args.n, args.interval, one)
            else:
                start = time.perf_counter()
                for i in range(0, args.n, BATCH):
                    k = min(BATCH, args.n - i)
                    await task.batch_defer_async(*({} for _ in range(k)))
                seconds = time.perf_counter() - start
            emit(event="enqueued", seconds=seconds, count=count)
        else:
            running: list[asyncio.Task[None]] = []

            async def start() -> None:
                running.append(asyncio.create_task(app.run_worker_async(
                    queues=["bench"], concurrency=args.slots, name=args.name, wait=True,
                    install_signal_handlers=False)))

            async def stop() -> None:
                running[0].cancel()   # the documented way to stop a worker run as a task
                await asyncio.wait({running[0]}, timeout=30)

            await serve(tally, start, stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("mode", choices=("setup", "enqueue", "work"))
    parser.add_argument("n", type=int, nargs="?", default=0)
    parser.add_argument("--interval", type=float, default=0.0)
    parser.add_argument("--priority", type=int, default=0, help="of paced jobs; higher first")
    parser.add_argument("--workflow", choices=("noop",), default="noop")
    parser.add_argument("--name", default="w")
    parser.add_argument("--slots", type=int, default=16)
    asyncio.run(main(parser.parse_args()))
