"""A support agent (OpenAI Agents SDK) served by shoal: each model call and tool call is a step,
model calls share the provider's limits across replicas and are charged to a per-run budget, and
a refund waits for a person's approval.

    export OPENAI_API_KEY=...              # or SUPPORT_FAKE_MODEL=1: a scripted model, offline
    export SHOAL_STORE=sqlite:///support.db SHOAL_NAMESPACE=support   # in every terminal
    shoal worker support_agent:app         # as many as you like, in other terminals
    shoal dispatch ticket '"Please refund order A1"'
    shoal pauses                           # the refund asks first
    shoal approve PAUSE_ID --by you
    shoal run show RUN_ID                  # the agent's steps; shoal ledger: its cost

The store is SHOAL_STORE (default sqlite:///support.db, in this directory): the commands read
it too, so export it for them as well.
"""

from __future__ import annotations

import os
from typing import Any

from agents import Agent, Model, ModelResponse, RunConfig, Usage, function_tool
from agents.testing import assistant_message, function_call

import shoal
from shoal.integrations.openai_agents import Price, run_agent

ORDERS = {"A1": {"amount": 40, "status": "paid"}, "B2": {"amount": 15, "status": "shipped"}}


@function_tool
def lookup_order(order: str) -> str:
    """The status and amount of an order."""
    found = ORDERS.get(order)
    return f"order {order}: {found}" if found else f"no order {order}"


@function_tool(needs_approval=True)          # a person approves each refund (shoal approve)
def refund(order: str, amount: int) -> str:
    """Refund an order."""
    # a real refund calls the payment API here, with an idempotency key of its own
    return f"refunded {amount} usd on order {order}"


class OfflineModel(Model):
    """Stands in for the model when SUPPORT_FAKE_MODEL=1: looks the order up, refunds it, says
    so; decided from the tool outputs it is given, as a model would be."""

    async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                           **kwargs: Any) -> ModelResponse:
        outputs = [i["output"] for i in input
                   if isinstance(i, dict) and i.get("type") == "function_call_output"]
        if not outputs:
            out = function_call("lookup_order", {"order": "A1"}, call_id="call-1")
        elif len(outputs) == 1:
            out = function_call("refund", {"order": "A1", "amount": 40}, call_id="call-2")
        else:
            out = assistant_message(f"Done: {outputs[-1]}.")
        return ModelResponse(output=[out], response_id=None, usage=Usage(
            requests=1, input_tokens=200, output_tokens=20, total_tokens=220))

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


agent = Agent(
    name="support",
    instructions="You help customers with their orders. Look an order up before refunding it.",
    tools=[lookup_order, refund],
    model=OfflineModel() if os.environ.get("SUPPORT_FAKE_MODEL") else "gpt-4.1-mini",
)

app = shoal.App("support", store=os.environ.get("SHOAL_STORE", "sqlite:///support.db"))
openai = app.provider("openai", max_concurrent=8, requests_per_minute=500,
                      tokens_per_minute=200_000, aimd=shoal.Aimd(),
                      breaker=shoal.Breaker(failures=5, window=60, cooldown=30))
app.budget(per_run=0.25, per_tenant_day=20.00)


@app.workflow
async def ticket(ctx: shoal.RunContext, text: str) -> str:
    result = await run_agent(
        ctx, agent, text, provider=openai, estimate=2000,
        price=Price(input_per_1m=0.40, output_per_1m=1.60),      # gpt-4.1-mini, per 1M tokens
        run_config=RunConfig(tracing_disabled=not os.environ.get("OPENAI_API_KEY")))
    return str(result.final_output)
