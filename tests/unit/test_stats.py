"""``app.stats()`` through the public API, under a VirtualClock: the age of the oldest due run
follows the app's clock, runs that end are counted in the last minute and then no more, and
retention folds the store's counts every pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import until

import shoal
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock

LEASE = 30.0


def make_app(clock: VirtualClock, store: shoal.Store | str, **kw: Any) -> shoal.App:
    return shoal.App("shop", store=store, clock=clock, lease=LEASE, **kw)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> shoal.Store | str:
    return MemoryStore() if request.param == "memory" else f"sqlite:///{tmp_path / 'shoal.db'}"


async def test_stats_follow_the_app_clock(store: shoal.Store | str) -> None:
    clock = VirtualClock()
    start = clock.now()
    app = make_app(clock, store)

    @app.workflow
    async def ship(ctx: shoal.RunContext, order: str) -> str:
        await ctx.sleep(30)
        return order

    async with app.open():
        await app.dispatch(ship, "o-1")
        await app.dispatch(ship, "o-2", tenant="acme", delay=20)
        got = await app.stats()
        assert got.at == start and got.oldest_due_age == 0.0
        assert got.queued == {"acme": shoal.QueueDepth(delayed=1),
                              "default": shoal.QueueDepth(due=1)}
        await clock.advance(25)
        got = await app.stats()
        assert got.oldest_due_age == 25.0      # o-1 waits since start; o-2 since start + 20
        assert got.queued["acme"] == shoal.QueueDepth(due=1)

    async with app:       # a worker: both start, sleep 30 s, then end
        await until(lambda: _is(app, sleeping=2))
        got = await app.stats()
        assert (got.executing, got.live, got.oldest_due_age, got.queued) == (0, 2, None, {})
        await clock.advance(31)
        await until(lambda: _is(app, succeeded=2))
        got = await app.stats()
        assert got.finished_last_minute == {"succeeded": 2, "failed": 0, "cancelled": 0}
        assert got.by_workflow == {"ship": {"succeeded": 2}} and got.live == 0
        await clock.advance(60)
        got = await app.stats()
        assert got.finished_last_minute["succeeded"] == 0 and got.finished == 2


async def _is(app: shoal.App, **expected: int) -> bool:
    got = await app.stats()
    return all(got.by_status[status] == n for status, n in expected.items())


class Folds(MemoryStore):
    """A memory store that records the folds asked of it."""

    def __init__(self) -> None:
        super().__init__()
        self.folds: list[tuple[str, float]] = []

    async def fold_stats(self, namespace: str, now: float) -> None:
        self.folds.append((namespace, now))


async def test_retention_folds_the_counts_every_pass() -> None:
    clock = VirtualClock()
    store = Folds()
    app = make_app(clock, store)
    async with app:
        await until(lambda: _folded(store, 1))
        await clock.advance(LEASE / 3)      # the next retention pass
        await until(lambda: _folded(store, 2))
    assert store.folds[:2] == [("shop", clock.now() - LEASE / 3), ("shop", clock.now())]


async def _folded(store: Folds, n: int) -> bool:
    return len(store.folds) >= n
