"""Leases through the app, under a VirtualClock, on the memory, SQLite and PostgreSQL stores: a
holder frozen past its lease loses the run to another instance (what was the last test of the store
contract; it needs apps, so it lives here: ``shoal.testing.contract`` imports no app).

Two handles on one store's data, as the contract's ``store`` and ``other``: one MemoryStore
object; two SQLite stores on one file; two PostgreSQL stores with pools of their own on a schema
of the test's own (``backends.postgres_schema``: skipped without a server, failed under ``CI``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from backends import postgres_schema

import shoal.testing.clock
from shoal.app import App
from shoal.backends.memory import MemoryStore
from shoal.backends.sqlite import SQLiteStore
from shoal.engine.context import RunContext
from shoal.errors import LeaseLostError
from shoal.ports import Store
from shoal.testing import VirtualClock, settle
from shoal.testing.contract import LEASE, NS, T0
from shoal.types import RunStatus

Settle = Callable[[], Awaitable[None]]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def stores(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Store, Store, Settle]]:
    """Two opened handles on one empty store's data, and how to let every task that can make
    progress do so."""
    if request.param == "memory":
        s = MemoryStore()
        await s.open()
        yield s, s, settle
        await s.close()
    elif request.param == "sqlite":
        one, two = SQLiteStore(str(tmp_path / "shoal.db")), SQLiteStore(str(tmp_path / "shoal.db"))
        await one.open()
        await two.open()
        yield one, two, settle
        await two.close()
        await one.close()
    else:
        from shoal.backends.postgres import PostgresStore

        with postgres_schema("shoal_t_lease_") as url:
            pg = [PostgresStore.from_url(f"{url}&pool_min_size=4&pool_max_size=4")
                  for _ in range(2)]
            for s in pg:
                await s.open()
            yield pg[0], pg[1], settle_waiting_for_the_server(pg, monkeypatch)
            for s in pg:
                await s.close()


def settle_waiting_for_the_server(stores: list[Any], monkeypatch: pytest.MonkeyPatch) -> Settle:
    """``shoal.testing.settle`` lets ready tasks run, which suffices for an in-process store;
    over a network, a task waiting for the server's answer can make progress too. So settling
    (the test's, and ``VirtualClock.advance``'s) also waits until no store operation is in
    flight."""

    async def settle(rounds: int = 50) -> None:
        quiet = 0
        while quiet < 2:
            for _ in range(rounds):
                await asyncio.sleep(0)
            if any(s.in_flight for s in stores):
                quiet = 0
                await asyncio.sleep(0.0005)
            else:
                quiet += 1

    monkeypatch.setattr(shoal.testing.clock, "settle", settle)
    return settle


async def test_lease_expiry_under_the_virtual_clock(stores: tuple[Store, Store, Settle]) -> None:
    """A holder frozen past its lease loses the run; its late writes are refused and the
    new owner continues from the last checkpoint."""
    store, other, settle = stores
    clock = VirtualClock(T0)
    frozen_clock = VirtualClock(T0)   # instance a's time stands still: it is frozen
    release = asyncio.Event()
    executed: list[tuple[str, str]] = []
    lost: list[BaseException] = []

    def make(s: Store, c: Any, name: str) -> App:
        app = App(NS, store=s, clock=c, instance_id=name, lease=LEASE)

        @app.workflow(name="wf")
        async def wf(ctx: RunContext, input: Any) -> Any:
            async def one() -> str:
                executed.append((name, "one"))
                return name

            async def two() -> str:
                executed.append((name, "two"))
                if name == "a":
                    await release.wait()
                return name

            first = await ctx.step("one", one)
            second = await ctx.step("two", two)
            return [first, second]

        app.on_error(lost.append)
        return app

    a = make(store, frozen_clock, "a")
    b = make(other, clock, "b")
    async with a:
        run = await a.dispatch("wf", {})
        for _ in range(100):
            await settle()
            if ("a", "two") in executed:
                break
        assert executed == [("a", "one"), ("a", "two")]
        async with b:
            await clock.advance(LEASE + 1)
            for _ in range(200):
                await settle()
                if (await b.get_run(run.id)).status == RunStatus.SUCCEEDED:
                    break
            done = await b.get_run(run.id)
            assert done.status == RunStatus.SUCCEEDED and done.output == ["a", "b"]
            assert executed == [("a", "one"), ("a", "two"), ("b", "two")]
            release.set()
            for _ in range(100):
                await settle()
                if lost:
                    break
            assert len(lost) == 1 and isinstance(lost[0], LeaseLostError)
            final = await b.get_run(run.id)
            assert final.output == ["a", "b"] and final.attempts == 2
            steps = await b.store.load_steps(run.id)
            assert [(s.name, s.output, s.epoch) for s in steps] == [("one", "a", 1),
                                                                   ("two", "b", 2)]
