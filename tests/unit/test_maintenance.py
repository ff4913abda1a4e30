"""Maintenance as services: each its own loop, its own interval and its own failure handling,
started and stopped together with the instance."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import shoal
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock, settle
from shoal.types import Fence, Pause, Step

T0 = 1_767_225_600.0
LEASE = 30.0


class BrokenStore(MemoryStore):
    """A memory store whose calls named in ``failing`` raise."""

    def __init__(self, *failing: str) -> None:
        super().__init__()
        self.failing = set(failing)
        self.calls: dict[str, int] = {}

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if name.startswith("_") or name in ("failing", "calls") or not callable(attr):
            return attr
        if name not in self.failing:
            return attr

        async def broken(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            raise ConnectionError(f"{name} refused")

        return broken


class JumpClock(VirtualClock):
    """A VirtualClock that can also jump without waking anything: no loop runs meanwhile."""

    def jump(self, seconds: float) -> None:
        self._now += seconds


class Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def services(self, event: str) -> set[str]:
        return {getattr(r, "service", "") for r in self.records
                if getattr(r, "event", None) == event}


@pytest.fixture
def events() -> Any:
    handler = Events()
    logger = logging.getLogger("shoal")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


async def _crashed_run(store: MemoryStore, app: shoal.App, clock: VirtualClock) -> shoal.Run:
    """A run claimed by an instance that then died (its lease runs out)."""
    run = await app.dispatch("job", {"n": 1})
    [claimed] = await store.claim_runs(app.namespace, ["job"], "dead", 1, LEASE, clock.now())
    assert claimed.id == run.id and claimed.owner == "dead"
    return run


async def test_one_failing_service_does_not_stop_the_others(events: Events) -> None:
    """Pause expiry cannot reach the store; recovery still takes over a crashed instance's run
    and retention still runs. (In one poll, the first failure stopped every later step.)"""
    clock = VirtualClock(T0)
    store = BrokenStore("expire_pauses")
    app = shoal.App("maint", store=store, clock=clock, lease=LEASE, instance_id="live")

    @app.workflow(name="job")
    async def job(ctx: shoal.RunContext, input: Any) -> str:
        return "done"

    async with app:
        run = await _crashed_run(store, app, clock)
        await clock.advance(LEASE + 1)
        for _ in range(100):
            await settle()
            if (await app.get_run(run.id)).status.final:
                break
        done = await app.get_run(run.id)
        assert done.status == shoal.RunStatus.SUCCEEDED and done.output == "done"
        assert done.attempts == 2                  # the crashed attempt counted
        assert store.calls["expire_pauses"] >= 2   # it kept failing, at its own interval
        assert "pause.expiry" in events.services("poll.failed")
        assert "recovery" not in events.services("poll.failed")


async def test_an_outage_is_reported_once_per_interval_not_once_per_service(
        events: Events) -> None:
    clock = VirtualClock(T0)
    store = BrokenStore()
    app = shoal.App("maint", store=store, clock=clock, lease=LEASE)
    errors: list[BaseException] = []
    app.on_error(errors.append)

    @app.workflow(name="job")
    async def job(ctx: shoal.RunContext, input: Any) -> None:
        return None

    async with app:
        await settle()
        store.failing = {"expire_pauses", "recover_runs", "prune_runs"}
        await clock.advance(LEASE / 3)
        await settle()
        assert events.services("poll.failed") == {"pause.expiry", "recovery", "retention"}
        # three services failed at once, each with its own error: one report each
        assert sorted(str(e) for e in errors) == [
            "expire_pauses refused", "prune_runs refused", "recover_runs refused"]
        store.failing = {"expire_pauses"}
        await clock.advance(1)                  # no pass is due: nothing new
        assert len(errors) == 3
        await clock.advance(LEASE / 3)          # the next interval: reported again, once
        await settle()
        assert [str(e) for e in errors[3:]] == ["expire_pauses refused"]


async def test_the_same_error_from_several_services_is_reported_once(events: Events) -> None:
    """A store that is down fails every service with the same error: app.on_error hears of it
    once per poll interval."""
    clock = VirtualClock(T0)

    class Down(MemoryStore):
        down = False

        def __getattribute__(self, name: str) -> Any:
            attr = super().__getattribute__(name)
            if (name in ("expire_pauses", "recover_runs", "prune_runs", "incompatible_runs")
                    and super().__getattribute__("down")):
                async def refused(*args: Any, **kwargs: Any) -> Any:
                    raise ConnectionError("connection refused")
                return refused
            return attr

    store = Down()
    app = shoal.App("maint", store=store, clock=clock, lease=LEASE)
    errors: list[BaseException] = []
    app.on_error(errors.append)
    async with app:
        await settle()
        store.down = True
        await clock.advance(LEASE / 3)
        await settle()
        assert len(events.services("poll.failed")) == 3
        assert [str(e) for e in errors] == ["connection refused"]
        await clock.advance(LEASE / 3)
        await settle()
        assert [str(e) for e in errors] == ["connection refused"] * 2


async def test_app_poll_runs_every_service_once_and_raises_a_failure() -> None:
    clock = JumpClock(T0)
    store = BrokenStore()
    app = shoal.App("maint", store=store, clock=clock, lease=LEASE, max_queued=1,
                    admission="park")
    notified: list[str] = []
    app.on_pause_notify(lambda pause: notified.append(pause.id))

    @app.workflow(name="job")
    async def job(ctx: shoal.RunContext, input: Any) -> None:
        return None

    async with app:
        run = await _crashed_run(store, app, clock)
        # a pause past its expiry, of another run, made straight in the store
        other = await app.dispatch("job", {"n": 2})
        [claimed] = await store.claim_runs(app.namespace, ["job"], "dead", 1, LEASE, clock.now())
        assert claimed.id == other.id
        pause = Pause(id="p1", namespace=app.namespace, tenant="default", run_id=other.id,
                      name="ok?", request=None, status="pending", decision=None,
                      created_at=clock.now(), expires_at=clock.now() + 1, resolved_at=None,
                      notified=False)
        step = Step(1, "shoal.approval:ok?", {"pause": "p1"}, False, 1)
        assert await store.create_pause(Fence(other.id, "dead", 1), step, pause, clock.now())
        clock.jump(LEASE + 1)      # no loop runs: poll() does the work
        await app.poll()
        assert (await store.get_pause("p1")).status == "resolved"   # expired
        for _ in range(100):
            await settle()
            if (await app.get_run(run.id)).status.final and notified:
                break
        assert (await app.get_run(run.id)).status == shoal.RunStatus.SUCCEEDED
        assert notified == ["p1"]
        store.failing = {"recover_runs"}
        with pytest.raises(ConnectionError, match="recover_runs refused"):
            await app.poll()


async def test_services_start_and_stop_together() -> None:
    clock = VirtualClock(T0)
    app = shoal.App("maint", store="memory://", clock=clock, lease=LEASE, max_queued=10)

    @app.workflow(name="job")
    async def job(ctx: shoal.RunContext, input: Any) -> None:
        return None

    app.cron("* * * * *", name="tick")(job)
    app.outbox_handler("mail")(lambda payload, key: None)

    def ours() -> set[str]:
        return {t.get_name() for t in asyncio.all_tasks()
                if t.get_name().startswith("shoal-") and not t.done()}

    assert ours() == set()
    async with app:
        await settle()
        running = ours()
        for name in ("shoal-heartbeat", "shoal-pause.expiry", "shoal-pause.notify",
                     "shoal-outbox.delivery", "shoal-recovery", "shoal-admission",
                     "shoal-retention", "shoal-cron-tick"):
            assert name in running, (name, running)
    await settle()
    assert ours() == set()

