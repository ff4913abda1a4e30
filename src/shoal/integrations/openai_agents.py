"""Run an OpenAI Agents SDK agent inside a shoal run: ``await run_agent(ctx, agent, input, …)``.

Each model call and each tool call is a checkpointed step of the run, so a run that is delivered
again (after a crash, a lost lease, an approval) replays them from their records: the model is
not asked again and a tool's side effect is not repeated. A model call goes through a
``shoal.Provider`` (its limits, 429 pauses, breaker and budgets, shared by every replica) and is
charged from the token usage it reports. A tool marked ``needs_approval`` pauses the run
(``ctx.approval``) until someone answers on any instance (``shoal approve``).

How it is done: ``run_agent`` runs ``Runner.run`` on copies of the agent and of every agent it
hands off to, whose model is wrapped (:class:`DurableModel`: ``get_response`` is a step whose
result is the serialized ``ModelResponse``) and whose function tools are wrapped (each
invocation is a step whose result is the tool's output). Tools run one at a time, in the order
the model asked for them, so a replay meets the steps in the order they were recorded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

try:
    from agents import (
        Agent,
        FunctionTool,
        Handoff,
        Model,
        ModelResponse,
        ModelRetrySettings,
        ModelSettings,
        ModelTracing,
        RunConfig,
        Runner,
        RunResult,
        ToolExecutionConfig,
        Usage,
    )
    from agents.agent_output import AgentOutputSchemaBase
    from agents.items import ToolApprovalItem, TResponseInputItem, TResponseStreamEvent
    from agents.models import get_default_model_settings
    from agents.retry import ModelRetryAdviceRequest
    from agents.run_config import DEFAULT_MAX_TURNS
    from agents.tool import (
        ApplyPatchTool,
        ComputerTool,
        CustomTool,
        LocalShellTool,
        ShellTool,
        Tool,
    )
    from agents.tool_context import ToolContext
    from agents.usage import deserialize_usage, serialize_usage
    from openai.types.responses import ResponseOutputItem
    from openai.types.responses.response_prompt_param import ResponsePromptParam
    from pydantic import BaseModel, TypeAdapter, ValidationError
except ImportError as e:   # pragma: no cover - what a user without the extra sees
    raise ImportError(
        f"shoal.integrations.openai_agents needs the OpenAI Agents SDK: pip install "
        f"'shoal[openai-agents]' ({e})") from e

from shoal.coord.provider import Provider
from shoal.engine.context import RunContext
from shoal.integrations.base import json_value

__all__ = ["DurableModel", "Price", "run_agent"]

RATE_LIMITED_TRIES = 8      # 429s in a row one model call waits out before it raises the last


@dataclasses.dataclass(frozen=True)
class Price:
    """What a model's tokens cost, per million tokens (as providers publish their prices), in
    the provider's currency. ``cached_input_per_1m``: input tokens read from the provider's
    cache (default: the input price)."""

    input_per_1m: float
    output_per_1m: float
    cached_input_per_1m: float | None = None

    def __post_init__(self) -> None:
        for name in ("input_per_1m", "output_per_1m", "cached_input_per_1m"):
            value = getattr(self, name)
            if value is None and name == "cached_input_per_1m":
                continue
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0):
                raise ValueError(f"Price({name}=…) takes a finite number >= 0, not {value!r}.")

    def cost(self, usage: Usage) -> float:
        """What a call that reported ``usage`` cost."""
        cached = min(usage.input_tokens, usage.input_tokens_details.cached_tokens or 0)
        cached_price = (self.input_per_1m if self.cached_input_per_1m is None
                        else self.cached_input_per_1m)
        return ((usage.input_tokens - cached) * self.input_per_1m + cached * cached_price
                + usage.output_tokens * self.output_per_1m) / 1_000_000

    def estimate(self, tokens: int) -> float:
        """The most ``tokens`` tokens can cost: what a call reserves under the budgets."""
        return tokens * max(self.input_per_1m, self.output_per_1m) / 1_000_000


async def run_agent(
    ctx: RunContext,
    agent: Agent[Any],
    input: str | list[TResponseInputItem],
    *,
    provider: Provider | None = None,
    price: Price | None = None,
    estimate: int = 1000,
    context: Any = None,
    max_turns: int = DEFAULT_MAX_TURNS,
    run_config: RunConfig | None = None,
    approval_expires_in: float | None = 86400.0,
) -> RunResult:
    """Run ``agent`` on ``input`` with ``Runner.run``, each model call and tool call a step of
    the run ``ctx``; returns the SDK's ``RunResult`` (return ``result.final_output`` from the
    workflow). Call it from the workflow function, not from inside a step.

    - ``provider``: the ``app.provider(...)`` every model call goes through (its limits, 429
      pauses, breaker and budgets); None calls the model directly.
    - ``price``: turns each call's reported usage into its cost, charged to the run's budgets
      and written in the ledger (through the provider, else with ``ctx.spend``); None: the
      provider's ``price_per_token`` times the tokens used, or nothing.
    - ``estimate``: the tokens a call is counted for before it goes (``tokens_per_minute``, and
      the cost reserved under the budgets), corrected once it reports its usage.
    - ``context``, ``max_turns``, ``run_config``: as ``Runner.run`` takes them.
    - ``approval_expires_in``: how long a tool call waits for its approval before it is denied.

    Raises what ``Runner.run`` raises, and ``shoal.BudgetExceededError`` when a budget has no
    room for the next model call (nothing spent for it; what earlier calls spent is recorded).
    """
    if not isinstance(agent, Agent):
        raise TypeError(f"run_agent(ctx, agent, …): agent is an agents.Agent, not {agent!r}.")
    if provider is not None and not isinstance(provider, Provider):
        raise TypeError(f"run_agent(provider=…) takes what app.provider(…) returns, not "
                        f"{provider!r}.")
    if price is not None and not isinstance(price, Price):
        raise TypeError(f"run_agent(price=…) takes a Price, not {price!r}.")
    if run_config is not None and not isinstance(run_config, RunConfig):
        raise TypeError(f"run_agent(run_config=…) takes an agents.RunConfig, not "
                        f"{run_config!r}.")
    if isinstance(estimate, bool) or not isinstance(estimate, int) or estimate < 0:
        raise ValueError(f"run_agent(estimate=…) takes an int >= 0 (tokens), not {estimate!r}.")
    durable = _DurableRun(ctx, provider, price, estimate, run_config or RunConfig())
    start = durable.agent(agent)
    config = durable.run_config()
    result = await Runner.run(start, input, context=context, max_turns=max_turns,
                              run_config=config)
    while result.interruptions:
        state = result.to_state()
        for item in result.interruptions:
            decision = await ctx.approval(f"agent.tool:{item.tool_name}", _asked(item),
                                          expires_in=approval_expires_in)
            if decision.approved:
                state.approve(item)
            else:
                state.reject(item, rejection_message=(
                    None if not decision.reason
                    else f"Tool execution was not approved: {decision.reason}."))
        result = await Runner.run(start, state, max_turns=max_turns, run_config=config)
    return result


def _asked(item: ToolApprovalItem) -> dict[str, Any]:
    """What a pause for a tool call shows whoever answers it: the agent, the tool, its
    arguments (parsed when they are JSON) and the call's id."""
    raw = item.raw_item
    get: Callable[[str], Any] = (raw.get if isinstance(raw, dict)
                                 else lambda name: getattr(raw, name, None))
    arguments = get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return {"agent": getattr(item.agent, "name", None), "tool": item.tool_name,
            "arguments": arguments, "call_id": get("call_id")}


class _DurableRun:
    """One ``run_agent`` call: the copies of its agents, its count of model calls."""

    def __init__(self, ctx: RunContext, provider: Provider | None, price: Price | None,
                 estimate: int, run_config: RunConfig) -> None:
        self.ctx = ctx
        self.provider = provider
        self.price = price
        self.estimate = estimate
        self.config = run_config
        self.model_calls = 0
        self._copies: dict[int, Agent[Any]] = {}

    def run_config(self) -> RunConfig:
        """The caller's run config, with what a durable run needs: each agent's own (wrapped)
        model; no retries by the runner or the model's client (a failed call fails the step, and
        shoal's retry replays the run; a 429 is waited out inside the step); tools one at a
        time."""
        settings = self.config.model_settings or ModelSettings()
        execution = self.config.tool_execution or ToolExecutionConfig()
        return dataclasses.replace(
            self.config, model=None,
            model_settings=dataclasses.replace(settings,
                                               retry=ModelRetrySettings(max_retries=0)),
            tool_execution=dataclasses.replace(execution, max_function_tool_concurrency=1))

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        """The copy of ``agent`` whose model calls and tool calls are steps (one per agent)."""
        copy = self._copies.get(id(agent))
        if copy is not None:
            return copy
        if agent.mcp_servers:
            raise TypeError(
                f"Agent {agent.name!r} lists MCP servers: the tools they serve would run outside "
                f"any step (repeated on every replay). Give it function tools, or a "
                f"HostedMCPTool (run by the model provider, inside the model call's step).")
        copy = agent.clone(model=DurableModel(self, agent.name, self._resolver(agent)),
                           model_settings=self._settings(agent),
                           tools=[self._tool(agent, t) for t in agent.tools], handoffs=[])
        self._copies[id(agent)] = copy
        copy.handoffs = [self._handoff(h) for h in agent.handoffs]
        return copy

    def _resolver(self, agent: Agent[Any]) -> Callable[[], Model]:
        """How the SDK would pick the agent's model (``RunConfig.model`` first), made only when
        a call is not replayed."""
        chosen = self.config.model if self.config.model is not None else agent.model
        if isinstance(chosen, Model):
            return lambda: chosen
        provider = self.config.model_provider
        return lambda: provider.get_model(chosen)

    def _settings(self, agent: Agent[Any]) -> ModelSettings:
        """The model settings the SDK would use for the agent's own model: its implicit defaults
        depend on the model's name, which the wrapped model no longer carries."""
        implicit = (ModelSettings() if isinstance(agent.model, Model)
                    else get_default_model_settings(agent.model))
        if agent.model_settings != implicit:
            return agent.model_settings
        if isinstance(self.config.model, str):
            return get_default_model_settings(self.config.model)
        if isinstance(self.config.model, Model):
            return ModelSettings()
        return implicit

    def _handoff(self, handoff: Agent[Any] | Handoff[Any, Any]) -> Any:
        if isinstance(handoff, Agent):
            return self.agent(handoff)
        invoke = handoff.on_invoke_handoff

        async def durable_handoff(run_context: Any, arguments: str) -> Agent[Any]:
            return self.agent(await invoke(run_context, arguments))

        return dataclasses.replace(handoff, on_invoke_handoff=durable_handoff)

    def _tool(self, agent: Agent[Any], tool: Tool) -> Tool:
        if isinstance(tool, (ComputerTool, LocalShellTool, ShellTool, ApplyPatchTool,
                             CustomTool)):
            raise TypeError(
                f"Agent {agent.name!r} has the tool {getattr(tool, 'name', tool)!r} "
                f"({type(tool).__name__}), which runs on this machine outside any step: its "
                f"side effects would be repeated on every replay. Use a function_tool.")
        if not isinstance(tool, FunctionTool):
            return tool      # hosted tools run in the model call, inside its step
        invoke, step = tool.on_invoke_tool, f"agent.tool:{tool.name}"

        async def durable_invoke(tool_context: ToolContext[Any], arguments: str) -> Any:
            async def call() -> Any:
                return _tool_output(await invoke(tool_context, arguments))

            return await self.ctx.step(step, call)

        return dataclasses.replace(tool, on_invoke_tool=durable_invoke)

    async def call_model(self, request: Callable[[], Awaitable[ModelResponse]],
                         model: Model) -> ModelResponse:
        """Make one model call through the provider (waiting out its 429s), charged at the
        price; or directly, charged with ``ctx.spend``."""
        if self.provider is None:
            response = await request()
            if self.price is not None:
                await self.ctx.spend(self.price.cost(response.usage))
            return response
        cost = None if self.price is None else self.price.estimate(self.estimate)
        rate_limited: Exception | None = None
        for _ in range(RATE_LIMITED_TRIES):
            async with self.provider.call(tokens=self.estimate, cost=cost) as call:
                try:
                    response = await request()
                except Exception as e:
                    retry_after = _rate_limited(e, model)
                    if retry_after is None:
                        raise                       # a failure: the breaker counts it
                    call.rate_limited(retry_after)  # the next try waits for the pause
                    call.used(tokens=0, cost=0.0)
                    rate_limited = e
                    continue
                usage = response.usage
                call.used(tokens=usage.total_tokens,
                          cost=None if self.price is None else self.price.cost(usage))
                return response
        assert rate_limited is not None
        raise rate_limited


class DurableModel(Model):
    """An agent's model whose ``get_response`` is a step named ``agent.model:<agent>:<n>``
    (``n``: the model call's number in its ``run_agent``): its result, the serialized
    ``ModelResponse``, is checkpointed, and a replay rebuilds the response from it without
    calling the model. Streaming is refused: a stream cannot be replayed."""

    def __init__(self, run: _DurableRun, agent: str, resolve: Callable[[], Model]) -> None:
        self._run = run
        self._agent = agent
        self._resolve = resolve
        self._model: Model | None = None

    def _inner(self) -> Model:
        if self._model is None:
            self._model = self._resolve()
        return self._model

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        self._run.model_calls += 1

        async def call() -> dict[str, Any]:
            model = self._inner()
            response = await self._run.call_model(lambda: model.get_response(
                system_instructions, input, model_settings, tools, output_schema, handoffs,
                tracing, previous_response_id=previous_response_id,
                conversation_id=conversation_id, prompt=prompt), model)
            return _dump_response(response)

        recorded = await self._run.ctx.step(
            f"agent.model:{self._agent}:{self._run.model_calls}", call)
        return _load_response(recorded)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError(
            "Streaming is not supported inside a durable run: a stream cannot be replayed from "
            "a checkpoint. run_agent calls Runner.run, which does not stream.")

    async def close(self) -> None:
        if self._model is not None:
            await self._model.close()


def _rate_limited(error: Exception, model: Model) -> float | None:
    """None when ``error`` is not a 429; else the seconds to wait: the model's retry advice,
    else the ``Retry-After`` header, else 1."""
    response = getattr(error, "response", None)
    status = getattr(error, "status_code", None) or getattr(response, "status_code", None)
    if status != 429:
        return None
    advice = model.get_retry_advice(ModelRetryAdviceRequest(error=error, attempt=1,
                                                            stream=False))
    if advice is not None and advice.retry_after is not None:
        return max(0.0, float(advice.retry_after))
    headers = getattr(response, "headers", None) or {}
    for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            return max(0.0, float(str(headers.get(header))) * scale)
        except ValueError:
            continue
    return 1.0


_OUTPUT_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseOutputItem)


def _dump_item(item: Any) -> Any:
    if isinstance(item, BaseModel):
        return item.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return item          # a dict the SDK keeps (ctx.step refuses it if it is not JSON)


def _load_item(data: Any) -> Any:
    try:
        return _OUTPUT_ITEM.validate_python(data)
    except ValidationError:
        return data      # an item the SDK keeps as a dict (it was one when recorded)


def _dump_response(response: ModelResponse) -> dict[str, Any]:
    return {"output": [_dump_item(i) for i in response.output],
            "usage": serialize_usage(response.usage), "response_id": response.response_id,
            "request_id": response.request_id, "raw_usage": response.raw_usage}


def _load_response(data: dict[str, Any]) -> ModelResponse:
    return ModelResponse(output=[_load_item(i) for i in data["output"]],
                         usage=deserialize_usage(data["usage"]),
                         response_id=data["response_id"], request_id=data["request_id"],
                         raw_usage=data["raw_usage"])


def _tool_output(output: Any) -> Any:
    """A tool's output as JSON, returned alike the first time and on a replay: a structured
    output (``ToolOutputText``, …) as its dict, which the SDK reads the same; anything else that
    is not JSON as the text the SDK would send the model."""
    if isinstance(output, BaseModel):
        return output.model_dump(mode="json", exclude_none=True)
    try:
        json_value(output, "the output")   # a check: the output itself is returned
    except TypeError:
        return str(output)
    return output
