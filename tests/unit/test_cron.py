"""Cron triggers: exactly one run per tick across instances, time zones, catch-up, bad input."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import shoal
from shoal.backends.memory import MemoryStore
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
    # a long lease and membership interval: fewer wake-ups while two virtual days pass
    app = shoal.App("cron", store="memory://", clock=clock, lease=3600.0,
                    membership_interval=3600.0)

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
    assert "job" not in app._registry.workflows
    ok = app.cron("*/5 * * * *", name="ok")(job)
    with pytest.raises(shoal.ConfigurationError, match="already registered"):
        app.cron("*/5 * * * *", name="ok")(ok)


# nights the clocks change: back in Paris and New York by an hour, on Lord Howe Island by half an
# hour; forward in Paris and on Lord Howe Island
CHANGES = [("Europe/Paris", datetime(2026, 10, 24, 20, 0, tzinfo=ZoneInfo("UTC"))),
           ("America/New_York", datetime(2026, 11, 1, 0, 0, tzinfo=ZoneInfo("UTC"))),
           ("Australia/Lord_Howe", datetime(2026, 4, 4, 10, 0, tzinfo=ZoneInfo("UTC"))),
           ("Europe/Paris", datetime(2026, 3, 28, 20, 0, tzinfo=ZoneInfo("UTC"))),
           ("Australia/Lord_Howe", datetime(2026, 10, 3, 10, 0, tzinfo=ZoneInfo("UTC")))]
SCHEDULES = {"*/15 * * * *": True, "0 * * * *": True, "@hourly": True, "*/20 1-2 * * *": True,
             "30 1 * * *": False, "0,30 1-2 * * *": False, "@daily": False,
             "45 2 * * * 30": False, "10,40 2 * * *": False}


def _reference(expression: str, every_pass: bool, zone: str, begin: float,
               hours: int) -> list[float]:
    """The ticks, from each naive wall minute (and second) of the zone matched on its own: a
    wall time the clocks went back over is its first pass (and its second for ``every_pass``);
    one the clocks jumped over is the first wall time after the jump."""
    from datetime import timedelta

    from croniter import croniter

    tz = ZoneInfo(zone)
    expression = {"@hourly": "0 * * * *", "@daily": "0 0 * * *"}.get(expression, expression)
    fields = expression.split()
    # a sixth field (seconds, last) is read here as a list of numbers only
    seconds = [int(x) for x in fields.pop().split(",")] if len(fields) == 6 else [0]
    expression = " ".join(fields)
    wall = datetime.fromtimestamp(begin, tz).replace(tzinfo=None) - timedelta(hours=3)
    found: set[float] = set()
    for step in range((hours + 6) * 60):
        at = wall + timedelta(minutes=step)
        if not croniter.match(expression, at):
            continue
        for sec in seconds:
            w = at.replace(second=sec)
            first = w.replace(tzinfo=tz, fold=0).timestamp()
            second = w.replace(tzinfo=tz, fold=1).timestamp()
            if first < second:
                found.update([first, second] if every_pass else [first])
                continue
            if first > second:     # skipped: the first minute after the gap
                later = w
                while (later.replace(tzinfo=tz, fold=0).timestamp()
                       != later.replace(tzinfo=tz, fold=1).timestamp()):
                    later = later.replace(second=0) + timedelta(minutes=1)
                first = later.replace(second=0, minute=0 if later.minute < 30 else 30,
                                      tzinfo=tz).timestamp()
            found.add(first)
    return sorted(t for t in found if begin <= t < begin + hours * 3600)


@pytest.mark.parametrize(("zone", "start"), CHANGES)
@pytest.mark.parametrize("expression", sorted(SCHEDULES))
def test_ticks_on_the_nights_clocks_change(zone: str, start: datetime, expression: str) -> None:
    """Every tick across a night the clocks change, against each wall time matched on its own: a
    schedule with ``*`` first in its minute or hour field fires in both passes of a repeated
    hour (no gap), one at fixed times in the first pass only (not twice); a wall time skipped by
    clocks going forward fires once, at the end of the jump."""
    from shoal.engine.cron import CronTrigger

    trigger = CronTrigger.parse(expression, name="t", workflow="w", tz=zone, catch_up=60)
    assert trigger.every_pass is SCHEDULES[expression]
    begin, hours = start.timestamp(), 12
    expected = _reference(expression, trigger.every_pass, zone, begin, hours)
    offsets = {datetime.fromtimestamp(begin + 60 * m, ZoneInfo(zone)).utcoffset()
               for m in range(hours * 60)}
    assert len(offsets) == 2                      # the window holds the change
    fired, at = [], begin - 1
    while (at := trigger.next_tick(at)) < begin + hours * 3600:
        fired.append(at)
    assert fired == expected
    for tick in expected:
        assert trigger.latest_tick(tick) == tick
        assert trigger.latest_tick(tick + 0.5) == tick
        assert trigger.due(tick + 0.5) == tick          # never taken for a stale tick
        assert trigger.next_tick(tick - 0.5) == tick


async def test_an_interval_schedule_has_no_gap_when_clocks_go_back() -> None:
    paris = ZoneInfo("Europe/Paris")
    clock = VirtualClock(start=datetime(2026, 10, 25, 1, 55, tzinfo=paris).timestamp())
    app = shoal.App("cron", store="memory://", clock=clock)

    @app.cron("*/15 * * * *", name="quarterly", tz="Europe/Paris")
    async def quarterly(ctx: shoal.RunContext, input: Any) -> None:
        return None

    async with app:
        for _ in range(30):
            await clock.advance(5 * 60)       # 02:00 CEST .. 03:25 CET: 2.5 hours of ticks
        await settle()
        runs = await app.list_runs(workflow="quarterly", limit=100)
        ticks = sorted(r.input["scheduled_at"] for r in runs)
        assert [b - a for a, b in itertools.pairwise(ticks)] == [900.0] * (len(ticks) - 1)
        assert len(ticks) == 10
        assert len({r.idempotency_key for r in runs}) == 10
