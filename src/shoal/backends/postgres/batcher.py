"""Fenced writes of different runs sharing one statement and one commit (group commit): the
engine's settlements, checkpoints and progress reports."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from shoal.backends.postgres.connections import Connections, Q

BATCH = 500   # rows per batched statement at most


class Batcher:
    """Fenced writes of different runs sharing one statement and one commit.

    ``write`` queues a row; one task writes the queue as one statement per batch (the named
    query takes one array per column and returns the ids of the rows whose fence held), and
    rows that arrive while a batch is on its way go together in the next one, as group commit
    does. A batch holds one row per run; a second write of a run waits for the next batch, so
    each answers as if alone. The writing task is its own, so a cancelled caller never leaves
    the others waiting.
    """

    def __init__(self, db: Connections, channel: str, query: str,
                 columns: tuple[str, ...]) -> None:
        self.db = db
        self.channel = channel
        self.query = query
        self.columns = columns
        self.queue: list[tuple[str, dict[str, Any], asyncio.Future[bool]]] = []
        self.task: asyncio.Task[None] | None = None

    async def write(self, run_id: str, row: dict[str, Any]) -> bool:
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.queue.append((run_id, row, done))
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run(), name=f"shoal-{self.query}")
        # A cancelled caller cancels only its own future: its row is written all the same (it
        # is queued), and the batch skips answering a future already done.
        return await done

    async def drain(self) -> None:
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)

    async def _run(self) -> None:
        while self.queue:
            batch: list[tuple[str, dict[str, Any], asyncio.Future[bool]]] = []
            rest: list[tuple[str, dict[str, Any], asyncio.Future[bool]]] = []
            runs: set[str] = set()
            for item in self.queue:
                if item[0] in runs or len(batch) >= BATCH:
                    rest.append(item)
                else:
                    runs.add(item[0])
                    batch.append(item)
            self.queue = rest
            args: dict[str, Any] = {c: [row[c] for _, row, _ in batch] for c in self.columns}
            args["channel"] = self.channel
            try:
                written = await self.db.retry(
                    functools.partial(self.db.all, Q[self.query], args, hot=True))
            except Exception as e:
                for _, _, done in batch:
                    if not done.done():
                        done.set_exception(e)
                continue
            held = {r["id"] for r in written}
            for run_id, _, done in batch:
                if not done.done():
                    done.set_result(run_id in held)
