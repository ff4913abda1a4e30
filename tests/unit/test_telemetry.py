"""The telemetry hooks: what the engine tells a sink about runs, attempts, steps and waits, in
order; a sink that raises never fails a run; several sinks each get their own token."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from helpers import status_is, until

import shoal
from shoal.telemetry import NOTHING, Telemetry, combine
from shoal.testing import VirtualClock


class Recorder(Telemetry):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.tokens = 0

    def run_claimed(self, run: shoal.Run, now: float) -> None:
        self.events.append(("claimed", run.workflow, run.lease_epoch))

    def attempt_started(self, run: shoal.Run, instance: str) -> Any:
        self.tokens += 1
        self.events.append(("attempt", run.attempts, run.lease_epoch, instance))
        return ("attempt", self.tokens)

    def attempt_ended(self, token: Any, run: shoal.Run, outcome: str,
                      error: BaseException | str | None) -> None:
        assert token[0] == "attempt"
        self.events.append(("ended", outcome, type(error).__name__ if error else None))

    def step_started(self, run: shoal.Run, name: str, seq: int) -> Any:
        self.events.append(("step", name, seq))
        return ("step", name)

    def step_ended(self, token: Any, run: shoal.Run, name: str, error: BaseException | None,
                   retries: int) -> None:
        assert token == ("step", name)
        self.events.append(("step_ended", name, type(error).__name__ if error else None,
                            retries))

    def run_parked(self, run: shoal.Run, kind: str, name: str | None,
                   until: float | None) -> None:
        self.events.append(("parked", kind, name, until is not None))


class Broken(Telemetry):
    def attempt_started(self, run: shoal.Run, instance: str) -> Any:
        raise RuntimeError("sink bug")

    def step_ended(self, token: Any, run: shoal.Run, name: str, error: BaseException | None,
                   retries: int) -> None:
        raise RuntimeError("sink bug")


@pytest.mark.timeout(60)
async def test_the_engine_reports_attempts_steps_and_waits_in_order(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = VirtualClock()
    app = shoal.App("told", store="memory://", clock=clock, lease=30.0, instance_id="i1")
    recorder = app.instrument(Recorder())
    app.instrument(Broken())   # logged once per hook, and the runs go on
    flaky = {"left": 1}

    def sometimes() -> int:
        if flaky["left"]:
            flaky["left"] -= 1
            raise OSError("flaky")
        return 2

    @app.workflow(max_attempts=2, backoff=1.0)
    async def flow(ctx: shoal.RunContext, input: Any) -> str:
        await ctx.step("one", lambda: 1)
        await ctx.step.with_options(retries=1)("two", sometimes)
        await ctx.sleep(10)
        await ctx.wait_for("go")
        if ctx.attempt == 1:
            raise ValueError("once")
        return "done"

    with caplog.at_level(logging.INFO, logger="shoal"):
        async with app:
            run = await app.dispatch(flow)
            for _ in range(50):   # past the in-place retry's backoff (under 0.5 s)
                if (await app.get_run(run.id)).status == "sleeping":
                    break
                await clock.advance(0.1)
            await until(status_is(app, run.id, "sleeping"))
            await clock.advance(10)
            await until(status_is(app, run.id, "waiting"))
            await app.signal(run.id, "go")
            await until(lambda: _attempts(app, run.id, 2))
            for _ in range(50):   # past the retry's backoff (under 1 s), however slow the loop
                if (await app.get_run(run.id)).status.final:
                    break
                await clock.advance(0.1)
            assert await app.result(run.id) == "done"
    assert recorder.events == [
        ("claimed", "flow", 1),
        ("attempt", 1, 1, "i1"),
        ("step", "one", 1), ("step_ended", "one", None, 0),
        ("step", "two", 2), ("step_ended", "two", None, 1),   # one in-place retry
        ("parked", "sleep", None, True),
        ("ended", "sleeping", None),
        ("claimed", "flow", 2),
        ("attempt", 1, 2, "i1"),   # replayed steps are not reported again
        ("parked", "signal", "go", False),
        ("ended", "waiting", None),
        ("claimed", "flow", 3),
        ("attempt", 1, 3, "i1"),
        ("ended", "retry", "ValueError"),
        ("claimed", "flow", 4),
        ("attempt", 2, 4, "i1"),
        ("ended", "succeeded", None),
    ]
    failures = [r for r in caplog.records if getattr(r, "event", None) == "telemetry.failed"]
    assert [r.getMessage() for r in failures] == [
        "telemetry.failed: Broken.attempt_started", "telemetry.failed: Broken.step_ended"]
    # one INFO line as each attempt starts and ends, with the run's fields
    ended = [r for r in caplog.records if getattr(r, "event", None) == "run.ended"]
    assert [r.status for r in ended] == ["sleeping", "waiting", "retry",  # type: ignore[attr-defined]
                                         "succeeded"]
    assert all(r.run_id == run.id and r.workflow == "flow"  # type: ignore[attr-defined]
               and r.tenant == "default" and r.duration >= 0 for r in ended)  # type: ignore[attr-defined]
    started = [r for r in caplog.records if getattr(r, "event", None) == "run.started"]
    assert len(started) == 4


async def test_a_failed_run_and_a_cancelled_one_end_with_their_status() -> None:
    clock = VirtualClock()
    app = shoal.App("told", store="memory://", clock=clock, lease=30.0)
    recorder = app.instrument(Recorder())
    gate = asyncio.Event()

    @app.workflow(max_attempts=1)
    async def fails(ctx: shoal.RunContext, input: Any) -> None:
        raise KeyError("missing")

    @app.workflow
    async def blocks(ctx: shoal.RunContext, input: Any) -> None:
        await gate.wait()

    async with app:
        failed = await app.dispatch(fails)
        with pytest.raises(shoal.RunFailedError):
            await app.result(failed.id)
        blocked = await app.dispatch(blocks)
        await until(status_is(app, blocked.id, "running"))
        await app.cancel(blocked.id)
        await until(status_is(app, blocked.id, "cancelled"))
        await until(lambda: _ended(recorder, 2))
    ends = [e for e in recorder.events if e[0] == "ended"]
    assert ends == [("ended", "failed", "KeyError"), ("ended", "cancelled", None)]


async def test_an_instrumented_app_refuses_sinks_once_started_and_non_sinks() -> None:
    app = shoal.App("told", store="memory://")
    with pytest.raises(TypeError, match=r"shoal\.telemetry\.Telemetry, not object"):
        app.instrument(object())  # type: ignore[arg-type]
    async with app:
        with pytest.raises(shoal.ConfigurationError, match=r"before app\.start"):
            app.instrument(Recorder())


def test_combine_gives_each_sink_its_token_and_ends_inside_out() -> None:
    order: list[str] = []

    class Sink(Telemetry):
        def __init__(self, name: str) -> None:
            self.name = name

        def lock_wait_started(self, keys: tuple[str, ...]) -> Any:
            order.append(f"{self.name} begins")
            return self.name

        def lock_wait_ended(self, token: Any, keys: tuple[str, ...], acquired: bool,
                            queued: bool) -> None:
            order.append(f"{self.name} ends {token}")

        def trace_carrier(self) -> str | None:
            return None if self.name == "a" else f"carrier-{self.name}"

    assert combine([]) is NOTHING and combine([NOTHING]) is NOTHING
    both = combine([Sink("a"), Sink("b")])
    token = both.lock_wait_started(("orders",))
    both.lock_wait_ended(token, ("orders",), True, False)
    assert order == ["a begins", "b begins", "b ends b", "a ends a"]
    assert both.trace_carrier() == "carrier-b"
    both.metered(["api"], [1.0], [1.0])   # a hook no sink overrides does nothing
    assert NOTHING.attempt_started  # the base's hooks exist and do nothing
    assert NOTHING.trace_carrier() is None


async def _attempts(app: shoal.App, run_id: str, n: int) -> bool:
    return (await app.get_run(run_id)).attempts == n


async def _ended(recorder: Recorder, n: int) -> bool:
    return sum(1 for e in recorder.events if e[0] == "ended") >= n


