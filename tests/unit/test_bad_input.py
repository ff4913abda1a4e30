"""Bad input: a clear error at the call, nothing stored, nobody else harmed (issue 10, section 3).

Every option of ``App``, ``@app.workflow``, ``app.dispatch``, ``@app.cron``,
``@app.outbox_handler`` and ``app.provider`` is checked before anything is stored; JSON values
come back alike from every store, nest at most ``MAX_DEPTH`` deep and are at most
``App(max_payload_bytes)`` long. The tests that store something run on memory, SQLite and
PostgreSQL (a schema of the test's own, as in ``tests/integration/backends.py``).
"""

from __future__ import annotations

import asyncio
import math
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import shoal
from shoal._json import MAX_DEPTH
from shoal.testing import VirtualClock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from backends import postgres_schema


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store of the test's own on each backend."""
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shoal.db'}"
    else:
        with postgres_schema("shoal_bad_") as url:
            yield url


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float = 10.0) -> None:
    """Wait until ``check()`` holds (the SQL stores answer in real time); fail after
    ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await check():
        if loop.time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


def make_app(store: str = "memory://", **options: Any) -> shoal.App:
    app = shoal.App("bad", store=store, clock=VirtualClock(), lease=30.0, **options)

    @app.workflow
    async def echo(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    return app


@pytest.fixture
async def app() -> AsyncIterator[shoal.App]:
    app = make_app()
    async with app:
        yield app


async def runs_fine(app: shoal.App) -> None:
    """Nobody else is harmed: a good run dispatched now runs to its end, and a poll works."""
    run = await app.dispatch("echo", {"ok": [1, 2]})
    assert await asyncio.wait_for(app.result(run.id), 10) == {"ok": [1, 2]}
    await app.poll()


# -- priority: an int, refused otherwise, at dispatch and at @app.workflow ---------------------

@pytest.mark.parametrize("priority, error", [
    ("high", TypeError), (1.5, TypeError), (True, TypeError), ([1], TypeError),
    (2**31, ValueError), (-(2**31) - 1, ValueError),
])
async def test_a_bad_priority_at_dispatch_is_refused_and_harms_no_one(
    store_url: str, priority: Any, error: type[Exception]
) -> None:
    app = make_app(store_url)
    async with app:
        with pytest.raises(error, match=rf"app\.dispatch\(priority\).*{re.escape(repr(priority))}"):
            await app.dispatch("echo", 1, priority=priority)
        assert await app.list_runs() == []          # nothing stored
        await runs_fine(app)
        [run] = await app.list_runs()
        assert run.priority == 0


@pytest.mark.parametrize("priority", ["high", 1.5, True, None, 2**31])
async def test_a_bad_priority_at_workflow_is_refused_and_harms_no_one(
    store_url: str, priority: Any
) -> None:
    app = make_app(store_url)
    with pytest.raises(shoal.ConfigurationError, match=r"priority\) must be an int"):
        @app.workflow(priority=priority)
        async def urgent(ctx: shoal.RunContext, input: Any) -> None:
            return None
    async with app:
        with pytest.raises(shoal.UnknownWorkflowError):   # it was not registered
            await app.dispatch("urgent")
        await runs_fine(app)


async def test_priorities_at_the_edges_of_32_bits_are_kept(store_url: str) -> None:
    app = make_app(store_url)
    async with app:
        for p in (2**31 - 1, -(2**31)):
            run = await app.dispatch("echo", p, priority=p)
            assert (await app.get_run(run.id)).priority == p


# -- App(...) ------------------------------------------------------------------------------

@pytest.mark.parametrize("options, match", [
    ({"namespace": ""}, r"App\(namespace\) must be a non-empty str"),
    ({"namespace": None}, r"App\(namespace\).*None"),
    ({"namespace": "a\x00b"}, r"App\(namespace\).*without NUL"),
    ({"store": 42}, r"App\(store\).*42"),
    ({"instance_id": ""}, r"App\(instance_id\)"),
    ({"instance_id": 7}, r"App\(instance_id\).*7"),
    ({"version": 2}, r"App\(version\).*2"),
    ({"max_concurrent_runs": 0}, r"App\(max_concurrent_runs\).*0"),
    ({"max_concurrent_runs": True}, r"App\(max_concurrent_runs\).*True"),
    ({"max_concurrent_runs": 2.0}, r"App\(max_concurrent_runs\).*2\.0"),
    ({"lease": 0.1}, r"App\(lease\) must be a finite number of seconds >= 0\.5, not 0\.1"),
    ({"lease": -30}, r"App\(lease\).*-30"),
    ({"lease": math.inf}, r"App\(lease\).*inf"),
    ({"lease": math.nan}, r"App\(lease\).*nan"),
    ({"lease": True}, r"App\(lease\).*True"),
    ({"lease": "30"}, r"App\(lease\).*'30'"),
    ({"clock": "system"}, r"App\(clock\).*'system'"),
    ({"max_queued": 0}, r"App\(max_queued\).*0"),
    ({"max_queued": False}, r"App\(max_queued\).*False"),
    ({"admission": "drop"}, r"App\(admission\).*'drop'"),
    ({"membership_interval": 0}, r"App\(membership_interval\).*0"),
    ({"membership_interval": math.nan}, r"App\(membership_interval\).*nan"),
    ({"pause_retention": -1.0}, r"App\(pause_retention\).*-1\.0"),
    ({"run_retention": -1}, r"App\(run_retention\).*-1"),
    ({"run_retention": math.inf}, r"App\(run_retention\).*inf"),
    ({"run_retention": None}, r"App\(run_retention\).*None"),
    ({"max_payload_bytes": 0}, r"App\(max_payload_bytes\).*0"),
    ({"max_payload_bytes": 1.5}, r"App\(max_payload_bytes\).*1\.5"),
    ({"max_payload_bytes": True}, r"App\(max_payload_bytes\).*True"),
])
def test_app_refuses_options_that_cannot_work(options: dict[str, Any], match: str) -> None:
    namespace = options.pop("namespace", "bad")
    with pytest.raises(shoal.ConfigurationError, match=match):
        shoal.App(namespace, **{"store": "memory://", **options})


def test_the_shortest_lease_is_accepted() -> None:
    assert shoal.App("bad", store="memory://", lease=0.5).lease == 0.5


# -- @app.workflow(...) --------------------------------------------------------------------

@pytest.mark.parametrize("options, match", [
    ({"name": ""}, r"@app\.workflow\(name\) must be a non-empty str"),
    ({"name": 3}, r"@app\.workflow\(name\).*3"),
    ({"max_attempts": 0}, r"max_attempts\).*0"),
    ({"max_attempts": True}, r"max_attempts\).*True"),
    ({"max_attempts": 2.0}, r"max_attempts\).*2\.0"),
    ({"max_attempts": None}, r"max_attempts\).*None"),
    ({"max_attempts": 2**31}, r"max_attempts\).*2147483648"),
    ({"backoff": -1}, r"backoff\).*-1"),
    ({"backoff": math.nan}, r"backoff\).*nan"),
    ({"backoff": "1s"}, r"backoff\).*'1s'"),
    ({"max_backoff": -5.0}, r"max_backoff\).*-5\.0"),
    ({"max_backoff": math.inf}, r"max_backoff\).*inf"),
    ({"concurrency_key": 5}, r"concurrency_key\).*5"),
    ({"concurrency_key": "a\x00"}, r"concurrency_key\).*NUL"),
    ({"on_incompatible": "skip"}, r"on_incompatible\).*'skip'"),
    ({"concurrency_key": "k", "concurrency_limit": 0}, r"concurrency_limit\).*0"),
    ({"concurrency_key": "k", "concurrency_limit": True}, r"concurrency_limit\).*True"),
    ({"concurrency_key": "k", "concurrency_limit": 2.0}, r"concurrency_limit\).*2\.0"),
    ({"concurrency_limit": 2}, r"concurrency_limit\).*give the workflow a concurrency_key"),
])
def test_workflow_refuses_options_that_cannot_work(options: dict[str, Any], match: str) -> None:
    app = shoal.App("bad", store="memory://")
    with pytest.raises(shoal.ConfigurationError, match=match):
        @app.workflow(**options)
        async def wf(ctx: shoal.RunContext, input: Any) -> None:
            return None
    assert app._registry.workflows == {}


async def tick(ctx: shoal.RunContext) -> None:
    return None


async def three(ctx: shoal.RunContext, input: Any, more: int) -> None:
    return None


async def keyword_only(ctx: shoal.RunContext, *, input: Any) -> None:
    return None


@pytest.mark.parametrize("fn, shown", [
    (tick, r"'async def tick\(ctx\)'"),
    (three, r"'async def three\(ctx, input, more\)'"),
    (keyword_only, r"'async def keyword_only\(ctx, \*, input\)'"),
])
def test_a_workflow_function_that_cannot_take_ctx_and_input_is_refused(
    fn: Callable[..., Any], shown: str
) -> None:
    """Every attempt calls ``fn(ctx, input)``: a function that cannot take that is refused when
    it is registered (as a cron's too), not failed at every attempt."""
    app = shoal.App("bad", store="memory://")
    match = (rf"Workflow '{fn.__name__}' is {shown}, but a workflow function is called with "
             rf"two arguments, the run's context and its input: define it as "
             rf"'async def {fn.__name__}\(ctx, input\)'")
    with pytest.raises(shoal.ConfigurationError, match=match):
        app.workflow(fn)
    with pytest.raises(shoal.ConfigurationError, match=match):
        app.cron("* * * * *")(fn)
    assert app._registry.workflows == {} and app._registry.crons == {}


async def test_a_workflow_function_taking_ctx_and_input_in_any_form_is_accepted() -> None:
    app = shoal.App("ok", store="memory://")

    @app.workflow
    async def defaulted(ctx: shoal.RunContext, input: Any = None, *, flag: bool = False) -> None:
        return None

    @app.workflow
    async def star(*args: Any) -> None:
        return None

    assert set(app._registry.workflows) == {"defaulted", "star"}


# -- app.dispatch(...) ---------------------------------------------------------------------

@pytest.mark.parametrize("options, error, match", [
    ({"tenant": None}, TypeError, r"app\.dispatch\(tenant\) must be a non-empty str, not None"),
    ({"tenant": ""}, ValueError, r"app\.dispatch\(tenant\)"),
    ({"tenant": 3}, TypeError, r"app\.dispatch\(tenant\).*3"),
    ({"tenant": "t\x00"}, ValueError, r"app\.dispatch\(tenant\).*NUL"),
    ({"idempotency_key": 42}, TypeError, r"app\.dispatch\(idempotency_key\).*42"),
    ({"idempotency_key": "\ud800"}, ValueError, r"idempotency_key\).*UTF-8"),
    ({"concurrency_key": b"c1"}, TypeError, r"app\.dispatch\(concurrency_key\).*b'c1'"),
    ({"delay": -1}, ValueError, r"app\.dispatch\(delay\).*-1"),
    ({"delay": math.nan}, ValueError, r"app\.dispatch\(delay\).*nan"),
    ({"delay": math.inf}, ValueError, r"app\.dispatch\(delay\).*inf"),
    ({"delay": "5"}, ValueError, r"app\.dispatch\(delay\).*'5'"),
    ({"delay": True}, ValueError, r"app\.dispatch\(delay\).*True"),
    ({"max_attempts": 0}, ValueError, r"app\.dispatch\(max_attempts\).*0"),
    ({"max_attempts": 2.5}, ValueError, r"app\.dispatch\(max_attempts\).*2\.5"),
    ({"max_attempts": True}, ValueError, r"app\.dispatch\(max_attempts\).*True"),
])
async def test_dispatch_refuses_options_and_stores_nothing(
    app: shoal.App, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        await app.dispatch("echo", 1, **options)
    assert await app.list_runs() == []
    await runs_fine(app)


async def test_a_concurrency_key_function_giving_a_bad_key_stores_nothing(app: shoal.App) -> None:
    @app.workflow(concurrency_key=lambda input: input)
    async def keyed(ctx: shoal.RunContext, input: Any) -> None:
        return None

    with pytest.raises(TypeError, match=r"concurrency_key function of workflow 'keyed'.*7"):
        await app.dispatch(keyed, 7)
    with pytest.raises(ValueError, match="NUL"):
        await app.dispatch(keyed, "a\x00")
    assert await app.list_runs() == []


# -- @app.cron, @app.outbox_handler, app.provider -------------------------------------------

@pytest.mark.parametrize("options, match", [
    ({"name": ""}, r"@app\.cron\(name\)"),
    ({"tz": None}, r"tz must be a non-empty str, not None"),
    ({"catch_up": -1}, r"catch_up.*-1"),
    ({"catch_up": math.nan}, r"catch_up.*nan"),
    ({"catch_up": True}, r"catch_up.*True"),
])
def test_cron_refuses_options_that_cannot_work(options: dict[str, Any], match: str) -> None:
    app = shoal.App("bad", store="memory://")
    with pytest.raises(shoal.ConfigurationError, match=match):
        @app.cron("*/5 * * * *", **options)
        async def tick(ctx: shoal.RunContext, input: Any) -> None:
            return None
    assert app._registry.crons == {} and app._registry.workflows == {}


@pytest.mark.parametrize("topic, options, match", [
    ("", {}, r"@app\.outbox_handler\(topic\)"),
    (None, {}, r"@app\.outbox_handler\(topic\).*None"),
    ("email", {"max_deliveries": 0}, r"max_deliveries\).*0"),
    ("email", {"max_deliveries": True}, r"max_deliveries\).*True"),
    ("email", {"max_deliveries": 2.0}, r"max_deliveries\).*2\.0"),
])
def test_outbox_handler_refuses_options_that_cannot_work(
    topic: Any, options: dict[str, Any], match: str
) -> None:
    app = shoal.App("bad", store="memory://")
    with pytest.raises(shoal.ConfigurationError, match=match):
        app.outbox_handler(topic, **options)
    with pytest.raises(shoal.ConfigurationError, match="decorates a function"):
        app.outbox_handler("email")("not a function")  # type: ignore[arg-type]
    assert app._registry.outbox_handlers == {}


@pytest.mark.parametrize("options, match", [
    ({"name": ""}, r"app\.provider\(name\)"),
    ({"max_concurrent": True}, r"max_concurrent=….*True"),
    ({"requests_per_minute": 1.5}, r"requests_per_minute=….*1\.5"),
    ({"price_per_token": math.nan}, r"price_per_token=….*nan"),
    ({"price_per_token": True}, r"price_per_token=….*True"),
    ({"currency": ""}, r"currency\)"),
    ({"currency": None}, r"currency\).*None"),
])
def test_provider_refuses_options_that_cannot_work(options: dict[str, Any], match: str) -> None:
    app = shoal.App("bad", store="memory://")
    with pytest.raises(ValueError, match=match):
        app.provider(**{"name": "llm", **options})
    assert app.providers == {}


@pytest.mark.parametrize("options, match", [
    ({"failures": True}, r"Breaker\(failures\).*True"),
    ({"window": math.inf}, r"Breaker\(window\).*inf"),
    ({"cooldown": 0}, r"Breaker\(cooldown\).*0"),
])
def test_breaker_refuses_options_that_cannot_work(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        shoal.Breaker(**options)


@pytest.mark.parametrize("call", [
    lambda app: app.budget(per_run=math.nan),
    lambda app: app.budget(tenants={"t": math.inf}),
])
def test_budget_refuses_what_is_not_a_finite_amount(call: Callable[[shoal.App], Any]) -> None:
    with pytest.raises(ValueError, match="finite"):
        call(shoal.App("bad", store="memory://"))


# -- JSON values: alike on every store, not too deep, not too large ---------------------------

async def test_every_store_gives_back_json_as_the_sql_stores_do(store_url: str) -> None:
    """A tuple comes back as a list, everywhere: the input, a step's result (also on its first
    execution), a tree value, an outbox payload, a signal's payload, a decision's data and the
    output."""
    app = shoal.App("shapes", store=store_url, clock=VirtualClock(), lease=30.0)
    first: list[Any] = []
    delivered: list[Any] = []

    @app.workflow
    async def shapes(ctx: shoal.RunContext, input: Any) -> Any:
        async def pair() -> Any:
            ctx.outbox.send("box", (3, 4))
            return (1, 2)

        seen = {"input": input, "step": await ctx.step("pair", pair)}
        first.append(seen["step"])
        await ctx.tree.save_if_absent("k", (5, 6))
        seen["tree"] = await ctx.tree.get("k")
        seen["signal"] = await ctx.wait_for("go")
        seen["data"] = (await ctx.approval("ok")).data
        return {**seen, "out": (7, 8)}

    @app.outbox_handler("box")
    async def box(payload: Any, key: str) -> None:
        delivered.append(payload)

    async with app:
        run = await app.dispatch(shapes, (0, (1,)))
        assert run.input == [0, [1]]
        await eventually(lambda: _status(app, run.id, "waiting"))
        await app.signal(run.id, "go", (9, 10))
        await eventually(lambda: _pending(app))
        [pause] = await app.pending_pauses()
        await app.resume(pause.id, data=(11, 12))
        output = await asyncio.wait_for(app.result(run.id), 10)
        await eventually(lambda: _true(bool(delivered)))
    assert output == {"input": [0, [1]], "step": [1, 2], "tree": [5, 6], "signal": [9, 10],
                      "data": [11, 12], "out": [7, 8]}
    assert first[0] == [1, 2] and delivered == [[3, 4]]


async def _status(app: shoal.App, run_id: str, status: str) -> bool:
    return (await app.get_run(run_id)).status == status


async def _pending(app: shoal.App) -> bool:
    return bool(await app.pending_pauses())


async def _true(value: bool) -> bool:
    return value


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


async def test_deeply_nested_json_is_a_type_error_not_a_recursion_error(app: shoal.App) -> None:
    deep = nested(10_000)
    with pytest.raises(TypeError, match=rf"input nests lists and objects more than {MAX_DEPTH}"):
        await app.dispatch("echo", deep)
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(TypeError, match="holds itself"):
        await app.dispatch("echo", {"a": looped})
    assert await app.list_runs() == []
    run = await app.dispatch("echo", nested(MAX_DEPTH - 1))    # deep, but within the limit
    assert await asyncio.wait_for(app.result(run.id), 10) == nested(MAX_DEPTH - 1)
    with pytest.raises(TypeError, match="payload nests"):
        await app.signal(run.id, "go", deep)


async def test_deep_json_in_a_step_result_fails_the_step_as_a_raise_would(app: shoal.App) -> None:
    @app.workflow(max_attempts=1)
    async def deep(ctx: shoal.RunContext, input: Any) -> None:
        async def build() -> Any:
            return nested(10_000)
        await ctx.step("build", build)

    run = await app.dispatch(deep)
    with pytest.raises(shoal.RunFailedError, match="the result of step 'build' nests"):
        await asyncio.wait_for(app.result(run.id), 10)


LIMIT = 1000


async def test_a_payload_over_the_limit_is_refused_at_every_call(store_url: str) -> None:
    app = make_app(store_url, max_payload_bytes=LIMIT)
    big = "x" * LIMIT            # its JSON text has quotes: LIMIT + 2 bytes

    @app.workflow
    async def waits(ctx: shoal.RunContext, input: Any) -> Any:
        return (await ctx.approval("ok")).data

    async with app:
        with pytest.raises(ValueError, match=rf"input is {LIMIT + 2} bytes of JSON, over the "
                                             rf"limit of {LIMIT} bytes \(App\(max_payload"):
            await app.dispatch("echo", big)
        assert await app.list_runs() == []
        ok = await app.dispatch("echo", "x" * (LIMIT - 2))           # exactly at the limit
        assert await asyncio.wait_for(app.result(ok.id), 10) == "x" * (LIMIT - 2)
        run = await app.dispatch(waits)
        await eventually(lambda: _pending(app))
        with pytest.raises(ValueError, match=rf"payload is {LIMIT + 2} bytes"):
            await app.signal(run.id, "go", big)
        [pause] = await app.pending_pauses()
        with pytest.raises(ValueError, match=rf"data is {LIMIT + 2} bytes"):
            await app.resume(pause.id, data=big)
        assert [p.id for p in await app.pending_pauses()] == [pause.id]   # still pending
        await app.resume(pause.id, data="small")
        assert await asyncio.wait_for(app.result(run.id), 10) == "small"


async def test_a_step_result_over_the_limit_is_a_failed_attempt(store_url: str) -> None:
    app = make_app(store_url, max_payload_bytes=LIMIT)
    clock = app.clock
    assert isinstance(clock, VirtualClock)
    tries: list[int] = []

    @app.workflow(max_attempts=2, backoff=1.0)
    async def large(ctx: shoal.RunContext, input: Any) -> Any:
        async def build() -> str:
            tries.append(ctx.attempt)
            return "x" * (LIMIT if ctx.attempt == 1 else 10)
        return await ctx.step("build", build)

    async with app:
        run = await app.dispatch(large)
        await eventually(lambda: _attempted(app, run.id))
        failed = await app.get_run(run.id)
        assert f"the result of step 'build' is {LIMIT + 2} bytes" in (failed.error or "")
        await clock.advance(2)
        assert await asyncio.wait_for(app.result(run.id), 10) == "x" * 10
        assert tries == [1, 2]


async def _attempted(app: shoal.App, run_id: str) -> bool:
    run = await app.get_run(run_id)
    return run.status == "queued" and run.attempts == 2


@pytest.mark.parametrize("call, error, match", [
    (lambda ctx: ctx.sleep(math.nan), ValueError, r"ctx\.sleep\(seconds\).*nan"),
    (lambda ctx: ctx.sleep("1"), TypeError, r"ctx\.sleep\(seconds\).*'1'"),
    (lambda ctx: ctx.wait_for(None), TypeError, r"ctx\.wait_for\(name\).*None"),
    (lambda ctx: ctx.wait_for("go", timeout=math.inf), ValueError, r"wait_for\(timeout\).*inf"),
    (lambda ctx: ctx.approval(""), ValueError, r"ctx\.approval\(name\)"),
    (lambda ctx: ctx.approval("ok", expires_in=True), TypeError, r"expires_in\).*True"),
])
async def test_durable_waits_refuse_bad_arguments_in_the_workflow(
    app: shoal.App, call: Callable[[shoal.RunContext], Awaitable[Any]],
    error: type[Exception], match: str
) -> None:
    @app.workflow(max_attempts=1)
    async def waits(ctx: shoal.RunContext, input: Any) -> str:
        with pytest.raises(error, match=match):
            await call(ctx)
        return "refused"

    run = await app.dispatch(waits)
    assert await asyncio.wait_for(app.result(run.id), 10) == "refused"
