"""Cron triggers: exactly one run per tick across instances, time zones, catch-up, bad input."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import shoal
from shoal.stores.memory import MemoryStore
from shoal.testing import VirtualClock, cluster, settle

# 2026-01-01T00:00:00Z, on a minute boundary
T0 = 1_767_225_600.0


def make(store: shoal.Store, clock: shoal.Clock, instance_id: str,
         catch_up: float = 60.0) -> shoal.App:
    app = shoal.App("cron", store=store, clock=clock, instance_id=instance_id, lease=30.0)

    @app.cron("* * * * *", name="minutely", catch_up=catch_up)
    @app.workflow(name="tick")
    async def tick(ctx: shoal.RunContext, input: Any) -> Any:
        return input["scheduled_at"]

    return app


async def test_three_instances_fire_exactly_one_run_per_tick() -> None:
    clock = VirtualClock(start=T0 + 1)        # just after a tick: it fires once at start
    async with cluster(make, instances=3, clock=clock) as apps:
        for _ in range(99):
            await clock.advance(60)
        await settle()
        runs = await apps[0].list_runs(workflow="tick", limit=1000)
        ticks = sorted(r.input["scheduled_at"] for r in runs)
        assert len(runs) == 100
        assert ticks == [T0 + 60 * i for i in range(100)]
        assert {r.status for r in runs} == {shoal.RunStatus.SUCCEEDED}
        assert len({r.idempotency_key for r in runs}) == 100


async def test_catch_up_fires_only_the_latest_missed_tick_within_the_window() -> None:
    store = MemoryStore()
    late = VirtualClock(start=T0 + 10 * 60 + 30)  # every instance was down for ten ticks
    app = make(store, late, "late")
    async with app:
        await settle()
        runs = await app.list_runs(workflow="tick")
        assert [r.input["scheduled_at"] for r in runs] == [T0 + 600]
    too_late = VirtualClock(start=T0 + 20 * 60 + 30)  # the latest tick is 30 s old
    app = make(store, too_late, "too-late", catch_up=10.0)
    async with app:
        await settle()
        assert len(await app.list_runs(workflow="tick")) == 1     # skipped: past catch_up
        await too_late.advance(30)                     # the next tick fires on time
        runs = await app.list_runs(workflow="tick")
        assert [r.input["scheduled_at"] for r in runs] == [T0 + 600, T0 + 21 * 60]


async def test_time_zone() -> None:
    clock = VirtualClock(start=datetime(2026, 3, 28, 8, 30, tzinfo=ZoneInfo("UTC")).timestamp())
    app = shoal.App("cron", store="memory://", clock=clock)

    @app.cron("0 9 * * *", name="paris-morning", tz="Europe/Paris")
    async def morning(ctx: shoal.RunContext, input: Any) -> None:
        return None

    async with app:
        await clock.advance(2 * 86400)
        runs = await app.list_runs(workflow="morning")
        local = [datetime.fromtimestamp(r.input["scheduled_at"], ZoneInfo("Europe/Paris"))
                 for r in runs]
        # 09:00 in Paris on both sides of the switch to summer time (2026-03-29)
        assert [(d.day, d.hour, d.utcoffset().total_seconds()) for d in local] == [  # type: ignore[union-attr]
            (29, 9, 7200.0), (30, 9, 7200.0)]


def test_bad_cron_input_is_refused_at_registration() -> None:
    app = shoal.App("cron", store="memory://")

    async def job(ctx: shoal.RunContext, input: Any) -> None:
        return None

    with pytest.raises(shoal.ConfigurationError, match=r"'every 5 minutes' is not a cron"):
        app.cron("every 5 minutes", name="bad")(job)
    with pytest.raises(shoal.ConfigurationError, match="unknown time zone 'Mars/Olympus'"):
        app.cron("* * * * *", name="tz", tz="Mars/Olympus")(job)
    assert "job" not in app._workflows
    ok = app.cron("*/5 * * * *", name="ok")(job)
    with pytest.raises(shoal.ConfigurationError, match="already registered"):
        app.cron("*/5 * * * *", name="ok")(ok)
