"""Group commit for the SQLite store: writes of several callers in one transaction.

SQLite admits one writer at a time, and with ``synchronous=full`` every commit waits for the disk:
a write transaction per call makes the commit rate the ceiling of every run's writes. A
:class:`GroupCommit` queues writes (each a function that makes its statements on the connection
and returns its answer) and writes what is queued in one ``BEGIN IMMEDIATE`` transaction, one
commit for all of them.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

_T = TypeVar("_T")
Write = Callable[[sqlite3.Connection], Any]
Transaction = Callable[[], AbstractAsyncContextManager[sqlite3.Connection]]


class GroupCommit:
    """Writes queued by several callers, written together.

    One task takes every write queued when it gets to run (at most ``limit``) and makes them in
    one transaction, in queue order, as if one after another; writes queued while it waits for
    the write lock or commits go together in the next transaction. Nothing waits on purpose: a
    lone write is written at once, in a transaction of its own. Each write is one function that
    must not await (a transaction is one block on the event loop) and is answered after its
    transaction has committed. A batch whose body raises is rolled back and written again, one
    write per transaction, so that each write gets the answer or the error it would get alone;
    when the write lock cannot be had, every write of the batch gets that error. The task is the
    store's own: a cancelled caller does not cancel the others' writes, nor its own (it is queued).
    """

    def __init__(self, transaction: Transaction, limit: int = 500) -> None:
        self._transaction = transaction
        self._limit = limit
        self._queue: list[tuple[Write, asyncio.Future[Any]]] = []
        self._task: asyncio.Task[None] | None = None

    async def write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Queue ``fn`` and return its answer once its transaction has committed."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[_T] = loop.create_future()
        self._queue.append((fn, done))
        task = self._task
        if task is None or task.done() or task.get_loop() is not loop:
            self._task = loop.create_task(self._run(), name="shoal-sqlite-group-commit")
        return await done

    async def drain(self) -> None:
        """Wait until every queued write has been written (or has failed)."""
        task = self._task
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:self._limit], self._queue[self._limit:]
            try:
                await self._write(batch)
            except BaseException:   # the event loop is going away: so are the callers
                for _, done in batch + self._queue:
                    done.cancel()
                self._queue = []
                raise

    async def _write(self, batch: list[tuple[Write, asyncio.Future[Any]]]) -> None:
        entered = False
        try:
            async with self._transaction() as db:
                entered = True
                answers = [fn(db) for fn, _ in batch]
        except Exception as e:
            if not entered or len(batch) == 1:
                for _, done in batch:
                    _answer(done, error=e)
                return
            await self._each_alone(batch)
            return
        for (_, done), answer in zip(batch, answers, strict=True):
            _answer(done, answer)

    async def _each_alone(self, batch: list[tuple[Write, asyncio.Future[Any]]]) -> None:
        """The batch failed as a whole (one write's statements failed, or the commit did, and
        it was all rolled back): each write again, in a transaction of its own."""
        for fn, done in batch:
            try:
                async with self._transaction() as db:
                    answer = fn(db)
            except Exception as e:
                _answer(done, error=e)
            else:
                _answer(done, answer)


def _answer(done: asyncio.Future[Any], answer: Any = None,
            error: BaseException | None = None) -> None:
    if done.done():   # its caller was cancelled
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(answer)
