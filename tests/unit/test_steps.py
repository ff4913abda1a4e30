"""``ctx.step`` as workflow code meets it: every keyword reaches the step's function, options come
from ``ctx.step.with_options``, a durable call inside a step's function and a step never awaited
are refused with an error naming them, and a failed run keeps its last attempt's traceback. On the
memory store under a VirtualClock."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import status_is, until

import shoal
from shoal.backends.memory import MemoryStore
from shoal.engine.context import TRACEBACK_LIMIT
from shoal.testing import VirtualClock


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


def make_app(clock: VirtualClock, store: shoal.Store | None = None) -> shoal.App:
    return shoal.App("steps", store=store or MemoryStore(), clock=clock, lease=30.0)


async def failure(app: shoal.App, run_id: str) -> shoal.Run:
    """The run once it has failed."""
    await until(status_is(app, run_id, "failed"))
    return await app.get_run(run_id)


# -- the step's parameters never clash with the function's -----------------------------------

async def test_every_keyword_reaches_the_function(clock: VirtualClock) -> None:
    app = make_app(clock)

    async def label(name: str, fn: str, retries: int) -> str:
        return f"{name}/{fn}/{retries}"

    def blocking(*, name: str, fn: str, retries: int) -> list[Any]:
        assert threading.current_thread() is not threading.main_thread()
        return [name, fn, retries]

    @app.workflow
    async def wf(ctx: shoal.RunContext, input: Any) -> list[Any]:
        a = await ctx.step("label", label, name="n", fn="f", retries=3)
        b = await ctx.step("blocking", blocking, name="n", fn="f", retries=4)
        c = await ctx.step.with_options(retries=1)("again", label, "n", "f", retries=5)
        return [a, b, c]

    async with app:
        run = await app.dispatch(wf)
        assert await app.result(run.id) == ["n/f/3", ["n", "f", 4], "n/f/5"]


async def test_with_options_retries_in_place(clock: VirtualClock) -> None:
    app = make_app(clock)
    tries: list[int] = []

    async def flaky(retries: str) -> str:
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionError("reset")
        return retries

    @app.workflow(max_attempts=1)
    async def wf(ctx: shoal.RunContext, input: Any) -> str:
        twice = ctx.step.with_options(retries=2)
        assert ctx.step.with_options(retries=0).with_options() is not ctx.step
        return await twice("upload", flaky, retries="kept for flaky")

    async with app:
        run = await app.dispatch(wf)
        await until(lambda: _count(tries, 1))
        await clock.advance(1)        # the first in-place retry's backoff (0.5 s at most)
        await until(lambda: _count(tries, 2))
        await clock.advance(1)        # the second one's (1 s at most)
        assert await app.result(run.id) == "kept for flaky"
        assert (await app.get_run(run.id)).attempts == 1


async def _count(items: list[Any], n: int) -> bool:
    return len(items) >= n


async def test_bad_step_options_and_arguments_are_refused_at_the_call(
    clock: VirtualClock,
) -> None:
    app = make_app(clock)
    errors: list[str] = []

    @app.workflow
    async def wf(ctx: shoal.RunContext, input: Any) -> None:
        for bad in (True, "3", 1.5):
            try:
                ctx.step.with_options(retries=bad)  # type: ignore[arg-type]
            except TypeError as e:
                errors.append(str(e))
        try:
            ctx.step.with_options(retries=-1)
        except ValueError as e:
            errors.append(str(e))
        for name, fn in (("", len), (len, "step"), ("step", "not a function")):
            try:
                ctx.step(name, fn)  # type: ignore[call-overload]
            except TypeError as e:
                errors.append(str(e))

    async with app:
        await app.result((await app.dispatch(wf)).id)
    assert len(errors) == 7
    assert all("ctx.step" in e for e in errors)
    assert "retries=...): an int >= 0, not True" in errors[0]
    assert "not -1" in errors[3]


# -- no durable ctx call inside a step's function ----------------------------------------------

async def test_a_step_inside_a_step_is_refused_at_the_call(clock: VirtualClock) -> None:
    """Before: the inner step was recorded, and the first replay failed with a misleading
    NonDeterminismError. Now the call raises, nothing is recorded, and the run fails at once
    (the code would do the same again)."""
    store = MemoryStore()
    app = make_app(clock, store)
    ran: list[str] = []

    @app.workflow(max_attempts=3)
    async def wf(ctx: shoal.RunContext, input: Any) -> None:
        async def inner() -> str:
            ran.append("inner")
            return "in"

        async def outer() -> str:
            ran.append("outer")
            return await ctx.step("inner", inner)

        await ctx.step("outer", outer)

    async with app:
        run = await app.dispatch(wf)
        failed = await failure(app, run.id)
    assert ran == ["outer"]
    assert failed.attempts == 1
    assert failed.error is not None and failed.error.startswith(
        "WorkflowCodeError: ctx.step('inner', ...) was called inside the function of step "
        "'outer'")
    assert "steps cannot nest" in failed.error and "Call it there" in failed.error
    assert failed.traceback is not None and "in outer" in failed.traceback
    assert await store.load_steps(run.id) == []


async def test_a_refused_call_fails_its_step_even_when_caught(clock: VirtualClock) -> None:
    store = MemoryStore()
    app = make_app(clock, store)
    tries: list[int] = []

    def blocking(ctx: shoal.RunContext) -> str:     # a plain function: runs in a thread
        tries.append(1)
        with contextlib.suppress(shoal.WorkflowCodeError):
            ctx.step("inner", len, "abc")
        return "swallowed"

    @app.workflow(max_attempts=3)
    async def wf(ctx: shoal.RunContext, input: Any) -> str:
        with contextlib.suppress(shoal.WorkflowCodeError):
            await ctx.step.with_options(retries=3)("outer", blocking, ctx)
        return await ctx.step("after", lambda: "never")

    async with app:
        run = await app.dispatch(wf)
        failed = await failure(app, run.id)
    assert tries == [1]                       # not retried in place, nor as a new attempt
    assert failed.attempts == 1
    assert failed.error is not None and "ctx.step('inner', ...) was called inside" in failed.error
    assert await store.load_steps(run.id) == []


@pytest.mark.parametrize("call", ["sleep", "wait_for", "approval", "start_child", "tree",
                                  "child_result"])
async def test_durable_calls_inside_a_step_are_refused(clock: VirtualClock, call: str) -> None:
    store = MemoryStore()
    app = make_app(clock, store)

    @app.workflow(name="child")
    async def child(ctx: shoal.RunContext, input: Any) -> str:
        return "done"

    @app.workflow(max_attempts=3)
    async def wf(ctx: shoal.RunContext, input: Any) -> None:
        started = await ctx.start_child(child) if call == "child_result" else None

        async def body() -> Any:
            if call == "sleep":
                return await ctx.sleep(5)
            if call == "wait_for":
                return await ctx.wait_for("go")
            if call == "approval":
                return await ctx.approval("refund", {"amount": 1})
            if call == "start_child":
                return await ctx.start_child(child)
            if call == "tree":
                return await ctx.tree.save_if_absent("k", 1)
            assert started is not None
            return await started.result()

        await ctx.step("outer", body)

    async with app:
        run = await app.dispatch(wf)
        failed = await failure(app, run.id)
    assert failed.attempts == 1
    assert failed.error is not None and "inside the function of step 'outer'" in failed.error
    assert [s.name for s in await store.load_steps(run.id)] == (
        ["shoal.start_child:child"] if call == "child_result" else [])
    assert await app.pending_pauses() == []
    assert [r.workflow for r in await app.list_runs()].count("child") == (
        call == "child_result")


async def test_outbox_and_spend_stay_allowed_inside_a_step(clock: VirtualClock) -> None:
    app = make_app(clock)
    sent: list[Any] = []

    @app.outbox_handler("email")
    async def email(payload: Any, key: str) -> None:
        sent.append(payload)

    @app.workflow
    async def wf(ctx: shoal.RunContext, input: Any) -> str:
        async def body() -> str:
            ctx.outbox.send("email", {"to": "ann"})
            await ctx.spend(0.25)
            return "ok"

        return await ctx.step("send", body)

    async with app:
        assert await app.result((await app.dispatch(wf)).id) == "ok"
        await until(lambda: _count(sent, 1))


# -- a step never awaited ----------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
async def test_a_step_never_awaited_fails_the_run_at_the_next_ctx_call(
    clock: VirtualClock,
) -> None:
    store = MemoryStore()
    app = make_app(clock, store)
    charged: list[int] = []

    async def charge(amount: int) -> int:
        charged.append(amount)
        return amount

    @app.workflow(max_attempts=3)
    async def wf(ctx: shoal.RunContext, input: Any) -> None:
        ctx.step("charge", charge, 40)  # type: ignore[unused-coroutine]  # the bug under test
        await ctx.step("receipt", lambda: "sent")

    async with app:
        run = await app.dispatch(wf)
        failed = await failure(app, run.id)
    assert charged == [] and failed.attempts == 1
    assert failed.error == (
        f"WorkflowCodeError: ctx.step('charge', ...) in run {run.id} was never awaited: write "
        f"`await ctx.step('charge', ...)`. A step that is not awaited never runs, and is not "
        f"checkpointed.")
    assert await store.load_steps(run.id) == []


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
async def test_a_step_never_awaited_fails_the_run_at_its_end(clock: VirtualClock) -> None:
    app = make_app(clock)
    kept: list[Any] = []

    @app.workflow(max_attempts=3)
    async def dropped(ctx: shoal.RunContext, input: Any) -> str:
        await ctx.step("first", lambda: 1)
        ctx.step("last", lambda: 2)  # type: ignore[unused-coroutine]  # the bug under test
        return "done"

    @app.workflow(max_attempts=3)
    async def held(ctx: shoal.RunContext, input: Any) -> str:
        kept.append(ctx.step("kept", lambda: 3))    # alive, but never awaited
        return "done"

    async with app:
        for wf, name in ((dropped, "last"), (held, "kept")):
            run = await app.dispatch(wf)
            failed = await failure(app, run.id)
            assert failed.attempts == 1 and failed.output is None
            assert failed.error is not None and failed.error.startswith(
                f"WorkflowCodeError: ctx.step({name!r}, ...) in run {run.id} was never awaited")
    for coro in kept:
        coro.close()


async def test_steps_started_later_are_not_mistaken_for_missing_awaits(
    clock: VirtualClock,
) -> None:
    """A step's coroutine may be created before another step starts: gathered, made into a
    task, or kept in a variable and awaited later."""
    app = make_app(clock)

    async def echo(value: int) -> int:
        return value

    @app.workflow
    async def wf(ctx: shoal.RunContext, input: Any) -> list[int]:
        later = ctx.step("later", echo, 1)
        a, b = await asyncio.gather(ctx.step("a", echo, 2), ctx.step("b", echo, 3))
        task = asyncio.create_task(ctx.step("task", echo, 4))
        return [a, b, await task, await later]

    async with app:
        assert await app.result((await app.dispatch(wf)).id) == [2, 3, 4, 1]


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
async def test_a_step_kept_for_later_does_not_hide_the_error_raised_before(
    clock: VirtualClock,
) -> None:
    app = make_app(clock)

    async def flaky(attempt: int) -> None:
        if attempt == 1:
            raise ConnectionError("reset")

    @app.workflow(max_attempts=2, backoff=1.0)
    async def wf(ctx: shoal.RunContext, input: Any) -> int:
        later = ctx.step("later", lambda: ctx.attempt)
        await ctx.step("flaky", flaky, ctx.attempt)      # raises before `later` is awaited
        return await later

    async with app:
        run = await app.dispatch(wf)
        await until(lambda: _attempts(app, run.id, 2))
        assert (await app.get_run(run.id)).error == "ConnectionError: reset"
        await clock.advance(1)
        assert await app.result(run.id) == 2


# -- a failed run keeps its last attempt's traceback -------------------------------------------

async def test_a_failed_run_keeps_its_last_attempts_traceback(clock: VirtualClock) -> None:
    app = make_app(clock)

    def check(attempt: int) -> None:
        raise ValueError(f"attempt {attempt}")

    @app.workflow(max_attempts=2, backoff=1.0)
    async def wf(ctx: shoal.RunContext, input: Any) -> None:
        check(ctx.attempt)

    async with app:
        run = await app.dispatch(wf)
        await until(lambda: _attempts(app, run.id, 2))
        queued = await app.get_run(run.id)     # waiting for its retry: the first attempt's
        assert queued.traceback is not None
        assert queued.traceback.endswith("ValueError: attempt 1\n")
        await clock.advance(2)
        failed = await failure(app, run.id)
    assert failed.error == "ValueError: attempt 2"
    assert failed.traceback is not None
    assert failed.traceback.startswith("Traceback (most recent call last):\n")
    assert ", in check\n" in failed.traceback
    assert failed.traceback.endswith("ValueError: attempt 2\n")


async def _attempts(app: shoal.App, run_id: str, n: int) -> bool:
    return (await app.get_run(run_id)).attempts == n


async def test_a_traceback_is_kept_to_its_end(clock: VirtualClock) -> None:
    app = make_app(clock)

    @app.workflow(max_attempts=1)
    async def wf(ctx: shoal.RunContext, input: Any) -> None:
        raise ValueError("x" * (2 * TRACEBACK_LIMIT) + " the end")

    async with app:
        failed = await failure(app, (await app.dispatch(wf)).id)
    assert failed.traceback is not None
    assert failed.traceback.startswith("[... the start of the traceback is cut]\n")
    assert len(failed.traceback) < TRACEBACK_LIMIT + 100
    assert failed.traceback.endswith("x the end\n")


async def test_a_non_determinism_failure_keeps_its_traceback(clock: VirtualClock) -> None:
    app = make_app(clock)
    flags = {"new": False}

    @app.workflow
    async def wf(ctx: shoal.RunContext, input: Any) -> None:
        await ctx.step("new" if flags["new"] else "old", lambda: 1)
        await ctx.wait_for("go")

    async with app:
        run = await app.dispatch(wf)
        await until(status_is(app, run.id, "waiting"))
        flags["new"] = True
        await app.signal(run.id, "go")
        failed = await failure(app, run.id)
    assert failed.error is not None and failed.error.startswith("NonDeterminismError")
    assert failed.traceback is not None and ", in wf\n" in failed.traceback
    assert "NonDeterminismError: Run " in failed.traceback


# -- typing -----------------------------------------------------------------------------------

TYPED_WORKFLOW = '''
from typing import assert_type

import shoal


async def charge(amount: int, *, name: str = "") -> dict[str, int]:
    return {name: amount}


def blocking(path: str) -> int:
    return len(path)


async def wf(ctx: shoal.RunContext, input: int) -> None:
    assert_type(await ctx.step("charge", charge, 3, name="n"), dict[str, int])
    assert_type(await ctx.step.with_options(retries=2)("read", blocking, "p"), int)
    await ctx.step("bad", blocking, 3)
    await ctx.step("bad", charge, 3, fn=1)
    await ctx.step.with_options(retries="3")("read", blocking, "p")
'''


def test_mypy_checks_a_steps_arguments_and_result(tmp_path: Path) -> None:
    """The awaited value has fn's return type; fn's arguments and the options are checked."""
    mypy = pytest.importorskip("mypy.api")
    source = tmp_path / "typed_workflow.py"
    source.write_text(TYPED_WORKFLOW)
    out, _, status = mypy.run(["--strict", "--no-incremental", "--cache-dir", str(tmp_path),
                               str(source)])
    errors = [line.split(": error: ")[1] for line in out.splitlines() if ": error: " in line]
    assert status == 1 and len(errors) == 3, out
    assert errors[0].startswith('No overload variant of "__call__" of "StepCaller" matches '
                                'argument types "str", "Callable[[str], int]", "int"')
    assert errors[1].startswith('Unexpected keyword argument "fn"')
    assert errors[2].startswith('Argument "retries" to "with_options"')
