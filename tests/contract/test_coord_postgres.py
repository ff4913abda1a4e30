"""The coordination contract on PostgreSQL (and random calls that must get the memory reference's
answers), plus how lock watches use the LISTEN connection.

Two stores, each with its own pool and LISTEN connection, share a schema of their own, dropped
after each test (test_postgres.py's fixture, server, skip and CI failure)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

# pytest puts this directory on sys.path (rootdir-relative "prepend" imports, no __init__.py)
from handoffs import LockManagerHandOffs
from test_postgres import _listening, _open, _terminate

from shoal.backends.postgres import PostgresStore
from shoal.testing.contract import NS, CoordContract, CoordDifferential
from shoal.testing.contract.coordination import grant, queued


class TestPostgresCoordination(CoordContract, CoordDifferential, LockManagerHandOffs):
    differential_seeds = (0, 1, 2, 3)

    @pytest.fixture
    async def coord(self, schema: str) -> AsyncIterator[PostgresStore]:
        s = await _open(schema)
        yield s
        await s.close()

    @pytest.fixture
    async def other(self, coord: PostgresStore) -> AsyncIterator[PostgresStore]:
        """A second store with a pool (and a LISTEN connection) of its own, same schema."""
        s = await _open(coord.schema)
        yield s
        await s.close()


async def test_watches_wake_when_the_listener_reconnects(schema: str) -> None:
    """A release may have been announced while the LISTEN connection was down."""
    a, b = await _open(schema), await _open(schema)
    try:
        async with b.lock_watch(NS, ["k"], "h2") as watch:
            waiting = asyncio.ensure_future(watch.wait())
            await asyncio.sleep(0.05)
            assert not waiting.done()
            assert await _terminate(a, f"shoal-listen {schema}") == 1
            await asyncio.wait_for(waiting, 5.0)
            await grant(a, ["k"], "h1")
            await queued(b, ["k"], "h2")
            waiting = asyncio.ensure_future(watch.wait())
            await asyncio.sleep(0.05)
            assert not waiting.done()
            await a.lock_release(NS, ["k"], "h1")
            await asyncio.wait_for(waiting, 5.0)
    finally:
        await a.close()
        await b.close()


async def test_a_release_wakes_lock_watches_not_the_dispatcher(schema: str) -> None:
    a, b = await _open(schema), await _open(schema)
    try:
        await _listening(b)
        async with b.lock_watch(NS, ["k"], "h2") as watch:
            await grant(a, ["k"], "h1")
            await queued(b, ["k"], "h2")
            started = time.monotonic()
            work = asyncio.create_task(b.wait_for_work(0.5))
            await a.lock_release(NS, ["k"], "h1")
            await asyncio.wait_for(watch.wait(), 5.0)
            await work
            assert time.monotonic() - started >= 0.45, "a lock notification is not work"
    finally:
        await a.close()
        await b.close()


async def test_waiters_too_many_for_a_notification_wake_every_watch(
    schema: str,
) -> None:
    keys = [f"k{i:02d}" for i in range(50)]
    waiters = [f"{i:03d}" + "x" * 200 for i in range(50)]   # 10 kB: a payload is under 8000 bytes
    a, b = await _open(schema), await _open(schema)
    try:
        async with b.lock_watch(NS, keys[-1:], waiters[-1]) as watch:
            await grant(a, keys, "h1")
            for key, waiter in zip(keys, waiters, strict=True):
                await queued(a, [key], waiter)
            await a.lock_release(NS, keys, "h1")
            await asyncio.wait_for(watch.wait(), 5.0)
        await grant(b, keys[-1:], waiters[-1])
    finally:
        await a.close()
        await b.close()
