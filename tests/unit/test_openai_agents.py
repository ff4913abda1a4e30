"""shoal.integrations.openai_agents: an OpenAI Agents SDK agent inside a shoal run, with a
scripted model (agents.testing.ScriptedModel: no network), on a memory store and a VirtualClock.
Model and tool calls are steps replayed from their records; model calls go through a provider
and are charged from their usage; a tool that needs approval pauses the run."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, HostedMCPTool, LocalShellTool, RunConfig, function_tool, handoff
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.usage import Usage

import shoal
from shoal.backends.memory import MemoryStore
from shoal.integrations.openai_agents import DurableModel, Price, run_agent
from shoal.testing import VirtualClock, settle

PRICE = Price(input_per_1m=2.0, output_per_1m=8.0)
NO_TRACES = RunConfig(tracing_disabled=True)


def usage(input_tokens: int, output_tokens: int) -> Usage:
    return Usage(requests=1, input_tokens=input_tokens, output_tokens=output_tokens,
                 total_tokens=input_tokens + output_tokens)


class RateLimited(Exception):
    """What a model client raises on an HTTP 429, with its Retry-After header."""

    class Response:
        status_code = 429

        def __init__(self, retry_after: float) -> None:
            self.headers = {"retry-after": str(retry_after)}

    def __init__(self, retry_after: float) -> None:
        super().__init__("429 Too Many Requests")
        self.status_code = 429
        self.response = self.Response(retry_after)


class Shop:
    """The tools' side effects, counted."""

    def __init__(self) -> None:
        self.lookups: list[str] = []
        self.refunds: list[tuple[str, int]] = []

    def tools(self) -> list[Any]:
        @function_tool
        def lookup(order: str) -> str:
            """Look an order up."""
            self.lookups.append(order)
            return f"order {order}: 40 usd, paid"

        @function_tool(needs_approval=True)
        def refund(order: str, amount: int) -> str:
            """Refund an order."""
            self.refunds.append((order, amount))
            return f"refunded {amount} usd on {order}"

        return [lookup, refund]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
async def app(clock: VirtualClock) -> AsyncIterator[shoal.App]:
    app = shoal.App("agents", store=MemoryStore(), clock=clock, instance_id="a", lease=30.0)
    async with app:
        yield app


async def finished(app: shoal.App, clock: VirtualClock, run_id: str) -> shoal.Run:
    """Move the clock until the run is final (retries back off on the app's clock)."""
    for _ in range(600):
        await settle()
        run = await app.get_run(run_id)
        if run.status.final:
            return run
        await clock.advance(1)
    raise AssertionError("the run never finished")


async def step_names(app: shoal.App, run_id: str) -> list[str]:
    return [s.name for s in await app.store.load_steps(run_id)]


def agent_workflow(app: shoal.App, agent: Agent[Any], *, fail_once: bool = False,
                   **options: Any) -> Callable[..., Any]:
    @app.workflow(name="support", max_attempts=3)
    async def support(ctx: shoal.RunContext, question: str) -> Any:
        try:
            result = await run_agent(ctx, agent, question, run_config=NO_TRACES, **options)
        except shoal.BudgetExceededError as e:
            return {"stopped": e.budget}
        if fail_once and ctx.attempt == 1:
            raise RuntimeError("the worker died after the agent's last step")
        return result.final_output

    return support


async def test_model_and_tool_calls_are_steps_replayed_without_calling_again(
    app: shoal.App, clock: VirtualClock
) -> None:
    shop = Shop()
    model = ScriptedModel([
        ModelStep(output=[function_call("lookup", {"order": "A1"}, call_id="c1")],
                  usage=usage(100, 20)),
        ModelStep(output=[assistant_message("A1 is paid.")], usage=usage(150, 10)),
    ])
    agent = Agent(name="support", instructions="Help.", tools=shop.tools(), model=model)
    openai = app.provider("openai", max_concurrent=4)
    agent_workflow(app, agent, fail_once=True, provider=openai, price=PRICE)
    run = await app.dispatch("support", "Is A1 paid?")
    done = await finished(app, clock, run.id)
    assert done.status == "succeeded" and done.output == "A1 is paid." and done.attempts == 2
    # the second attempt replayed every step: the model was asked twice, the tool ran once
    assert len(model.calls) == 2 and shop.lookups == ["A1"]
    assert await step_names(app, run.id) == [
        "agent.model:support:1", "agent.tool:lookup", "agent.model:support:2"]
    # the tool's output reached the model as the tool returned it
    assert {"call_id": "c1", "output": "order A1: 40 usd, paid",
            "type": "function_call_output"} in model.calls[1].input

    # the ledger shows each model call with its provider, tokens and cost
    rows = await app.ledger(run_id=run.id)
    assert [(r.provider, r.tokens) for r in rows] == [("openai", 120), ("openai", 160)]
    assert math.isclose(rows[0].amount, (100 * 2 + 20 * 8) / 1e6)
    assert math.isclose(rows[1].amount, (150 * 2 + 10 * 8) / 1e6)


async def test_handoffs_run_on_durable_copies_of_every_agent(
    app: shoal.App, clock: VirtualClock
) -> None:
    shop = Shop()
    refunds_model = ScriptedModel([
        [function_call("lookup", {"order": "B2"}, call_id="c2")],
        [assistant_message("B2 was looked at.")],
    ])
    refunds = Agent(name="refunds", tools=shop.tools(), model=refunds_model)
    triage_model = ScriptedModel([[function_call("transfer_to_refunds", {}, call_id="h1")]])
    triage = Agent(name="triage", handoffs=[handoff(refunds)], model=triage_model)
    agent_workflow(app, triage)
    run = await app.dispatch("support", "Refund B2")
    assert (await finished(app, clock, run.id)).output == "B2 was looked at."
    assert await step_names(app, run.id) == [
        "agent.model:triage:1", "agent.model:refunds:2", "agent.tool:lookup",
        "agent.model:refunds:3"]
    assert shop.lookups == ["B2"]
    assert triage.model is triage_model and refunds.tools[0].name == "lookup"  # untouched


@pytest.mark.parametrize("approved", [True, False])
async def test_a_tool_that_needs_approval_pauses_the_run_until_answered(
    app: shoal.App, clock: VirtualClock, approved: bool
) -> None:
    shop = Shop()
    model = ScriptedModel([
        [function_call("lookup", {"order": "A1"}, call_id="c1"),
         function_call("refund", {"order": "A1", "amount": 40}, call_id="c2")],
        [assistant_message("Done.")],
    ])
    agent = Agent(name="support", tools=shop.tools(), model=model)
    agent_workflow(app, agent)
    run = await app.dispatch("support", "Refund A1")
    for _ in range(100):
        await settle()
        if (await app.get_run(run.id)).status == "waiting":
            break
    [pause] = await app.pending_pauses()
    assert pause.name == "agent.tool:refund"
    assert pause.request == {"agent": "support", "tool": "refund",
                             "arguments": {"order": "A1", "amount": 40}, "call_id": "c2"}
    assert shop.lookups == ["A1"] and shop.refunds == []      # the other tool went on
    await app.resume(pause.id, approved=approved, by="ana",
                     reason=None if approved else "over the limit")
    assert (await finished(app, clock, run.id)).output == "Done."
    assert len(model.calls) == 2 and shop.lookups == ["A1"]   # nothing asked or done twice
    assert shop.refunds == ([("A1", 40)] if approved else [])
    told = next(i for i in model.calls[1].input
                if isinstance(i, dict) and i.get("call_id") == "c2"
                and i.get("type") == "function_call_output")
    assert told["output"] == ("refunded 40 usd on A1" if approved
                              else "Tool execution was not approved: over the limit.")
    assert "shoal.approval:agent.tool:refund" in await step_names(app, run.id)


async def test_a_budget_without_room_ends_the_agent_run_with_what_was_spent(
    app: shoal.App, clock: VirtualClock
) -> None:
    model = ScriptedModel([
        ModelStep(output=[function_call("lookup", {"order": str(i)}, call_id=f"c{i}")],
                  usage=usage(1000, 250))
        for i in range(10)])
    agent = Agent(name="support", tools=Shop().tools(), model=model)
    openai = app.provider("openai")
    app.budget(per_run=0.013)
    # each call reserves 1000 tokens at the higher price (0.008), then costs 0.004: the second
    # call fits (0.004 + 0.008), the third does not (0.008 + 0.008 > 0.013)
    agent_workflow(app, agent, provider=openai, price=PRICE, estimate=1000)
    run = await app.dispatch("support", "Look everything up")
    done = await finished(app, clock, run.id)
    assert done.output == {"stopped": f"the per-run budget of run {run.id}"}
    assert len(model.calls) == 2
    rows = await app.ledger(run_id=run.id)
    assert [(r.provider, r.tokens) for r in rows] == [("openai", 1250)] * 2
    spent = await app.spent(run_id=run.id)
    assert math.isclose(spent[f"the per-run budget of run {run.id}"], 0.008)


async def test_a_budget_error_not_caught_fails_the_run_without_calling_the_model_again(
    app: shoal.App, clock: VirtualClock
) -> None:
    model = ScriptedModel([
        ModelStep(output=[function_call("lookup", {"order": "1"}, call_id="c1")],
                  usage=usage(1000, 250))] * 3)
    agent = Agent(name="support", tools=Shop().tools(), model=model)
    openai = app.provider("openai")
    app.budget(per_run=0.013)

    @app.workflow(name="bare", max_attempts=3)
    async def bare(ctx: shoal.RunContext, question: str) -> Any:
        result = await run_agent(ctx, agent, question, provider=openai, price=PRICE,
                                 run_config=NO_TRACES)
        return result.final_output

    run = await app.dispatch("bare", "go")
    done = await finished(app, clock, run.id)
    # over a budget the run ends at once (a retry could only be refused again), its spend kept
    assert done.status == "failed" and done.attempts == 1
    assert "BudgetExceededError" in (done.error or "") and "per-run budget" in (done.error or "")
    assert len(model.calls) == 2                    # the third call was refused before it
    assert len(await app.ledger(run_id=run.id)) == 2


async def test_a_429_pauses_the_provider_and_the_call_waits_it_out_in_its_step(
    app: shoal.App, clock: VirtualClock
) -> None:
    model = ScriptedModel([
        ModelStep.raise_error(RateLimited(retry_after=20)),
        ModelStep(output=[assistant_message("Fine.")], usage=usage(10, 5)),
    ])
    agent = Agent(name="support", model=model)
    openai = app.provider("openai", max_concurrent=4, aimd=shoal.Aimd())
    agent_workflow(app, agent, provider=openai, price=PRICE)
    start = clock.now()
    run = await app.dispatch("support", "Hello")
    done = await finished(app, clock, run.id)
    assert done.output == "Fine." and done.attempts == 1
    assert len(model.calls) == 2 and clock.now() >= start + 20
    assert await step_names(app, run.id) == ["agent.model:support:1"]
    assert (await openai.state()).concurrency_limit == 2     # AIMD: 4 * 0.5 (+ half a slot)
    assert [(r.provider, r.tokens) for r in await app.ledger(run_id=run.id)] == [
        ("openai", 15)]                                     # the 429 cost nothing


async def test_without_a_provider_the_cost_is_charged_with_ctx_spend(
    app: shoal.App, clock: VirtualClock
) -> None:
    model = ScriptedModel([ModelStep(output=[assistant_message("Hi.")], usage=usage(500, 100))])
    agent_workflow(app, Agent(name="support", model=model), price=PRICE)
    run = await app.dispatch("support", "Hello")
    assert (await finished(app, clock, run.id)).output == "Hi."
    [row] = await app.ledger(run_id=run.id)
    assert row.provider is None and math.isclose(row.amount, (500 * 2 + 100 * 8) / 1e6)


async def test_what_cannot_be_made_durable_is_refused_with_a_clear_error(
    app: shoal.App, clock: VirtualClock
) -> None:
    model = ScriptedModel([])
    shell = Agent(name="ops", model=model,
                  tools=[LocalShellTool(executor=lambda request: "ok")])
    hosted = Agent(name="docs", model=ScriptedModel([[assistant_message("ok")]]),
                   tools=[HostedMCPTool(tool_config={"type": "mcp", "server_label": "d",
                                                     "server_url": "https://example.invalid"})])
    errors: list[str] = []

    @app.workflow(name="check")
    async def check(ctx: shoal.RunContext, _: Any) -> Any:
        for bad, options in ((shell, {}), ("support", {}), (hosted, {"estimate": -1}),
                             (hosted, {"price": 0.5})):
            try:
                await run_agent(ctx, bad, "go", run_config=NO_TRACES, **options)  # type: ignore[arg-type]
            except (TypeError, ValueError) as e:
                errors.append(str(e))
        result = await run_agent(ctx, hosted, "go", run_config=NO_TRACES)   # hosted tools go
        return result.final_output

    run = await app.dispatch("check")
    assert (await finished(app, clock, run.id)).output == "ok"
    assert "LocalShellTool" in errors[0] and "Use a function_tool" in errors[0]
    assert "agent is an agents.Agent" in errors[1]
    assert "estimate" in errors[2] and "price" in errors[3]
    with pytest.raises(NotImplementedError, match="Streaming is not supported"):
        DurableModel.stream_response(model, None, "x", None, [], None, [], None,  # type: ignore
                                     previous_response_id=None, conversation_id=None,
                                     prompt=None)


def test_prices_are_checked_and_count_cached_input_apart() -> None:
    price = Price(input_per_1m=2.0, output_per_1m=8.0, cached_input_per_1m=0.5)
    used = usage(1000, 100)
    used.input_tokens_details.cached_tokens = 400
    assert math.isclose(price.cost(used), (600 * 2 + 400 * 0.5 + 100 * 8) / 1e6)
    assert math.isclose(price.estimate(1000), 0.008)
    with pytest.raises(ValueError, match="output_per_1m"):
        Price(input_per_1m=1.0, output_per_1m=-1)
