"""Code versions during a rollout, and observers of a run's life."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from helpers import until

import shoal
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock


def versioned(store: MemoryStore, clock: VirtualClock, name: str, version: str,
              on_incompatible: str = "wait") -> shoal.App:
    app = shoal.App("rollout", store=store, clock=clock, instance_id=name, version=version,
                    lease=30.0)

    @app.workflow(name="job", on_incompatible=on_incompatible)  # type: ignore[arg-type]
    async def job(ctx: shoal.RunContext, input: Any) -> Any:
        first = await ctx.step("first", lambda: version)
        await ctx.sleep(60)
        return {"started_by": first, "finished_by": version}

    return app


async def _status(app: shoal.App, run_id: str, status: str) -> bool:
    return (await app.get_run(run_id)).status == status


async def test_a_started_run_waits_for_its_own_version(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = MemoryStore(), VirtualClock()
    old = versioned(store, clock, "old", "v1")
    async with old:
        run = await old.dispatch("job")
        await until(lambda: _status(old, run.id, "sleeping"))
        assert (await old.get_run(run.id)).version == "v1"
    new = versioned(store, clock, "new", "v2")
    caplog.set_level(logging.WARNING, logger="shoal")
    async with new:
        fresh = await new.dispatch("job")
        await until(lambda: _status(new, fresh.id, "sleeping"))   # its step runs in a thread
        await clock.advance(61)
        await clock.advance(30)
        assert (await new.get_run(run.id)).status == "sleeping"    # left for a v1 instance
        assert await new.result(fresh.id) == {"started_by": "v2", "finished_by": "v2"}
        assert (await new.get_run(fresh.id)).version == "v2"       # a new run is v2's
    incompatible = [r for r in caplog.records if "recovery.incompatible" in r.getMessage()]
    assert len(incompatible) == 1 and run.id in incompatible[0].getMessage()  # once
    again = versioned(store, clock, "old-again", "v1")
    async with again:
        await clock.advance(1)
        assert await again.result(run.id) == {"started_by": "v1", "finished_by": "v1"}


async def test_on_incompatible_resume_lets_any_version_continue() -> None:
    store, clock = MemoryStore(), VirtualClock()
    old = versioned(store, clock, "old", "v1", on_incompatible="resume")
    async with old:
        run = await old.dispatch("job")
        await until(lambda: _status(old, run.id, "sleeping"))
    new = versioned(store, clock, "new", "v2", on_incompatible="resume")
    async with new:
        await clock.advance(61)
        assert await new.result(run.id) == {"started_by": "v1", "finished_by": "v2"}


async def test_an_incompatible_due_run_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = MemoryStore(), VirtualClock()
    frozen = VirtualClock()
    old = versioned(store, frozen, "old", "v1")
    await old.start()
    run = await old.dispatch("job")
    await until(lambda: _status(old, run.id, "sleeping"))
    new = versioned(store, clock, "new", "v2")
    caplog.set_level(logging.WARNING, logger="shoal")
    async with new:
        await clock.advance(61)                 # due, claimed by nobody: v2 leaves it
        assert (await new.get_run(run.id)).status == "sleeping"
        await clock.advance(30)
    await old.close(timeout=0)
    logged = [r for r in caplog.records if "recovery.incompatible" in r.getMessage()]
    assert len(logged) == 1 and "'v1'" in logged[0].getMessage()


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def on_run_start(self, run: shoal.Run) -> None:
        self.events.append(("start", run.workflow, run.status))

    async def on_run_resume(self, run: shoal.Run, reason: str) -> None:
        self.events.append(("resume", reason, run.status))

    def on_run_pause(self, run: shoal.Run) -> None:
        self.events.append(("pause", run.workflow, run.status))

    def on_run_end(self, run: shoal.Run) -> None:
        self.events.append(("end", run.workflow, run.status))


async def test_observers_see_start_pause_resume_and_end() -> None:
    clock = VirtualClock()
    app = shoal.App("observed", store="memory://", clock=clock, lease=30.0)
    recorder = app.observe(Recorder())

    class Broken:
        def on_run_start(self, run: shoal.Run) -> None:
            raise RuntimeError("observer bug")

    app.observe(Broken())

    @app.workflow(max_attempts=2, backoff=1.0)
    async def flow(ctx: shoal.RunContext, input: Any) -> str:
        await ctx.sleep(10)
        await ctx.wait_for("go")
        if ctx.attempt == 1:
            raise ValueError("once")
        return "done"

    async with app:
        run = await app.dispatch(flow)
        await until(lambda: _status(app, run.id, "sleeping"))
        await clock.advance(10)
        await until(lambda: _status(app, run.id, "waiting"))
        await app.signal(run.id, "go")
        await until(lambda: _attempts(app, run.id, 2))
        await clock.advance(1)
        assert await app.result(run.id) == "done"
    assert recorder.events == [
        ("start", "flow", "running"),
        ("pause", "flow", "sleeping"),
        ("resume", "woke", "running"),
        ("pause", "flow", "waiting"),
        ("resume", "resumed", "running"),
        ("resume", "dispatched", "running"),      # the retry after the failed attempt
        ("end", "flow", "succeeded"),
    ]
    await asyncio.sleep(0)


async def _attempts(app: shoal.App, run_id: str, n: int) -> bool:
    return (await app.get_run(run_id)).attempts >= n
