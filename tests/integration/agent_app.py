"""The worker side of ``test_agent_processes.py``: one shoal App over a shared store (a SQLite
file or a PostgreSQL schema) whose workflow ``support`` runs an OpenAI Agents SDK agent with
``shoal.integrations.openai_agents.run_agent``. The agent's model is a fake (no network): it
answers from the tool outputs it was given, and logs each call it gets to the shared log (one
``os.write`` per JSON line, O_APPEND), as its tools log each side effect.

The model's turns: 1 asks for ``lookup``, 2 asks for ``note`` (mode ``crash``) or ``refund``
(mode ``approval``: a tool that needs approval), 3 answers. It logs ``model`` when a call
reaches it and ``answered`` when it answers; a process whose ``AGENT_HANG_AT`` is N logs
``hang`` in turn N and never answers (the test kills it there). Each tool logs ``tool``.

``python agent_app.py worker``  serve until SIGTERM (``App.run_forever``), then close

Configured by environment variables: ``AGENT_STORE`` (a store URL), ``AGENT_LOG`` (the log),
``AGENT_INSTANCE`` (instance id), ``AGENT_HANG_AT`` (a turn, or unset), ``AGENT_MAX_LIFE``
(seconds; the process exits by itself after that).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import harness
from agents import Agent, Model, ModelResponse, RunConfig, Usage, function_tool
from agents.testing import assistant_message, function_call

import shoal
from shoal.integrations.openai_agents import Price, run_agent

NAMESPACE = "agentproc"
LEASE = 2.0
TOKENS = (120, 30)      # what every answer reports using: input, output
PRICE = Price(input_per_1m=2.0, output_per_1m=8.0)
emit = harness.LineLog("AGENT_LOG")


def _log(event: str, **data: Any) -> None:
    emit({"ev": event, "pid": os.getpid(), "instance": os.environ.get("AGENT_INSTANCE"),
          "t": time.time(), **data})


class FakeModel(Model):
    """Decides from the tool outputs it was given, as a real model would from the conversation."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any,
                           tools: Any, output_schema: Any, handoffs: Any, tracing: Any, *,
                           previous_response_id: Any, conversation_id: Any,
                           prompt: Any) -> ModelResponse:
        outputs = [i["output"] for i in input
                   if isinstance(i, dict) and i.get("type") == "function_call_output"]
        turn = len(outputs) + 1
        _log("model", turn=turn)
        if str(turn) == os.environ.get("AGENT_HANG_AT"):
            _log("hang", turn=turn)
            await asyncio.sleep(3600)
        if turn == 1:
            out = function_call("lookup", {"order": "A1"}, call_id="c1")
        elif turn == 2 and self.mode == "crash":
            out = function_call("note", {"text": outputs[0]}, call_id="c2")
        elif turn == 2:
            out = function_call("refund", {"order": "A1", "amount": 40}, call_id="c2")
        else:
            out = assistant_message(f"done: {outputs[-1]}")
        _log("answered", turn=turn)
        return ModelResponse(output=[out], usage=Usage(
            requests=1, input_tokens=TOKENS[0], output_tokens=TOKENS[1],
            total_tokens=sum(TOKENS)), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@function_tool
def lookup(order: str) -> str:
    """Look an order up."""
    _log("tool", name="lookup")
    return f"{order} is paid"


@function_tool
def note(text: str) -> str:
    """Write a note on the order."""
    _log("tool", name="note")
    return "noted"


@function_tool(needs_approval=True)
def refund(order: str, amount: int) -> str:
    """Refund an order."""
    _log("tool", name="refund")
    return f"refunded {amount}"


def make_app(store: str | None = None, instance_id: str | None = None) -> shoal.App:
    app = shoal.App(NAMESPACE, store=store or os.environ["AGENT_STORE"], lease=LEASE,
                    instance_id=instance_id or os.environ.get("AGENT_INSTANCE"))
    openai = app.provider("openai", max_concurrent=4, aimd=shoal.Aimd())

    @app.workflow(name="support")
    async def support(ctx: shoal.RunContext, input: dict[str, str]) -> Any:
        agent = Agent(name="support", instructions="Help with orders.",
                      tools=[lookup, note, refund], model=FakeModel(input["mode"]))
        result = await run_agent(ctx, agent, input["question"], provider=openai, price=PRICE,
                                 run_config=RunConfig(tracing_disabled=True))
        return result.final_output

    return app


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        harness.serve(make_app, emit, "AGENT", drain=5.0)
    else:
        sys.exit(f"usage: {sys.argv[0]} worker")
