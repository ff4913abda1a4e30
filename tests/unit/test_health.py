"""Liveness (no I/O) and readiness (a ping of the store) of an instance."""

from __future__ import annotations

import asyncio
from typing import Any

import shoal
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock, settle


class StuckStore(MemoryStore):
    """A store whose recovery query hangs until ``unstick`` is set, and whose ping can fail."""

    def __init__(self) -> None:
        super().__init__()
        self.stuck = False
        self.unstick = asyncio.Event()
        self.ping_error: Exception | None = None

    async def recover_runs(self, namespace: str, now: float) -> list[shoal.Run]:
        if self.stuck:
            await self.unstick.wait()
            self.stuck = False
        return await super().recover_runs(namespace, now)

    async def ping(self) -> None:
        if self.ping_error is not None:
            raise self.ping_error


async def test_liveness_and_readiness() -> None:
    clock = VirtualClock()
    store = StuckStore()
    app = shoal.App("health", store=store, clock=clock, lease=30.0)

    @app.workflow
    async def busy(ctx: shoal.RunContext, input: Any) -> None:
        await ctx.step("hold", asyncio.Event().wait)

    assert app.check_liveness().reason == "not started"
    await app.start()
    try:
        await app.dispatch(busy)
        await settle()
        assert app.check_liveness().healthy
        ready = await app.check_readiness()
        assert ready.healthy and ready.checks == {"liveness": "ok", "store": "ok"}

        store.ping_error = ConnectionError("connection refused")
        ready = await app.check_readiness()
        assert ready.status == shoal.HealthStatus.UNHEALTHY
        assert "connection refused" in ready.reason
        store.ping_error = None

        store.stuck = True              # the poll loop now waits on the store
        await clock.advance(30)
        assert app.check_liveness().healthy          # not yet three intervals
        await clock.advance(11)
        live = app.check_liveness()
        assert live.status == "unhealthy" and live.reason.startswith("stuck")
        store.unstick.set()
        await settle()
        assert app.check_liveness().healthy          # the poll completed again
    finally:
        closing = asyncio.create_task(app.close(timeout=10))
        await settle()
        assert app.check_liveness().reason == "stopping"     # draining the held run
        await clock.advance(10)
        await closing
    assert app.check_liveness().reason == "not started"


async def test_readiness_of_an_app_that_only_dispatches(tmp_path: Any) -> None:
    app = shoal.App("health", store=f"sqlite:///{tmp_path}/h.db")
    async with app.open():
        ready = await app.check_readiness()
        assert ready.healthy and ready.checks["store"] == "ok"
    broken = shoal.App("health", store=f"sqlite:///{tmp_path}/missing/h.db")
    ready = await broken.check_readiness()
    assert ready.status == "unhealthy" and "does not exist" in ready.reason
