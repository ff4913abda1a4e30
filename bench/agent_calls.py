"""What ``shoal.integrations.openai_agents.run_agent`` adds to each model call and each tool call
of an OpenAI Agents SDK agent, beside the SDK alone (``Runner.run``), side by side.

Run it (not part of ``./dev bench``)::

    .venv/bin/python bench/agent_calls.py                 # about a minute
    .venv/bin/python bench/agent_calls.py --quick         # a few seconds, fewer runs
    .venv/bin/python bench/agent_calls.py --json bench/results/agent_calls.json

The model is a fake that answers at once (no network), so every millisecond measured is what the
SDK, or the SDK and shoal, add. Two agent shapes, each run with ``--turns`` turns and with none:

- ``tool turns``: each turn the model asks for one function tool (it returns at once), then it
  answers: ``turns + 1`` model calls and ``turns`` tool calls;
- ``handoff turns``: each turn the model hands off to another agent (a handoff is no step), then
  it answers: ``turns + 1`` model calls and no tool call.

``T`` is the time ``Runner.run`` (the SDK alone) or ``run_agent`` (timed inside the workflow, so
neither dispatch nor claim nor waiting for the result is in it) takes, the fastest of ``--runs``
runs (the machine is shared: the slower runs only add what other processes took). The cost of
one turn is the slope ``(T(turns) - T(0)) / turns``. A handoff turn is one model call; a tool
turn is one model call and one tool call.

Setups: the SDK alone; ``run_agent`` in a shoal run on the memory store, on a SQLite file
(``synchronous=FULL``: an fsync per commit), and on PostgreSQL (``$SHOAL_BENCH_POSTGRES``, default
``postgresql://postgres@127.0.0.1:5432/test``, a throwaway schema; skipped when unreachable); each
shoal store without a provider, and with one (``max_concurrent``, per-minute requests and tokens,
a breaker, AIMD, a price and a per-run budget: every call reserves, is admitted and records a
ledger row). Runs go one at a time, in one process. "store ops" counts the store's methods called
per model call and per tool call (the store wrapped in a counter; a model call's are those of a
handoff turn, a tool call's the rest of a tool turn's), each called at least every other call
(rarer ones are the app's own poll, under way meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import secrets
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import machine
from agents import (
    Agent,
    Model,
    ModelResponse,
    RunConfig,
    Runner,
    Usage,
    function_tool,
    handoff,
    set_tracing_disabled,
)
from agents.testing import assistant_message, function_call

import shoal
from shoal.integrations.openai_agents import Price, run_agent

set_tracing_disabled(True)
POSTGRES = os.environ.get("SHOAL_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
PRICE = Price(input_per_1m=0.4, output_per_1m=1.6)
perf = time.perf_counter


class InstantModel(Model):
    """Asks for the tool (or hands off) ``turns`` times, then answers; no wait at all."""

    def __init__(self, turns: int, shape: str) -> None:
        self.turns, self.shape, self.asked = turns, shape, 0

    async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                           **kwargs: Any) -> ModelResponse:
        self.asked += 1
        done = (sum(1 for i in input if isinstance(i, dict)
                    and i.get("type") == "function_call_output"))
        if done >= self.turns:
            out = assistant_message("done")
        elif self.shape == "tool":
            out = function_call("echo", {"text": str(done)}, call_id=f"c{done}")
        else:
            other = "b" if self.asked % 2 else "a"
            out = function_call(f"transfer_to_{other}", {}, call_id=f"h{done}")
        return ModelResponse(output=[out], response_id=None, usage=Usage(
            requests=1, input_tokens=100, output_tokens=10, total_tokens=110))

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@function_tool
def echo(text: str) -> str:
    """Echo."""
    return text


def build(turns: int, shape: str) -> Agent[Any]:
    model = InstantModel(turns, shape)
    if shape == "tool":
        return Agent(name="a", tools=[echo], model=model)
    a = Agent(name="a", model=model)
    b = Agent(name="b", model=model, handoffs=[handoff(a)])
    a.handoffs = [handoff(b)]
    return a


class Counted:
    """The store, with every coroutine method's calls counted by name."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return await attr(*args, **kwargs)

        return call


@dataclass
class Result:
    setup: str
    ms_model: float            # a handoff turn: one model call
    ms_tool: float             # a tool turn: one model call and one tool call
    ops_model: float = 0.0
    ops_tool: float = 0.0
    top_model: list[tuple[str, float]] = field(default_factory=list)
    top_tool: list[tuple[str, float]] = field(default_factory=list)


async def sdk_alone(turns: int, shape: str) -> float:
    t = perf()
    result = await Runner.run(build(turns, shape), "go", max_turns=turns + 5,
                              run_config=RunConfig(tracing_disabled=True))
    assert result.final_output == "done"
    return perf() - t


async def timed(runs: int, go: Callable[[int, str], Awaitable[float]], turns: int,
                shape: str) -> float:
    """The fastest of ``runs`` runs of ``go(turns, shape)`` (after one to warm up), in the
    seconds it says the agent took."""
    await go(turns, shape)
    return min([await go(turns, shape) for _ in range(runs)])


async def slopes(runs: int, turns: int, go: Callable[[int, str], Awaitable[float]]
                 ) -> tuple[float, float]:
    """(seconds per handoff turn, seconds per tool turn)."""
    per_turn = {}
    for shape in ("handoff", "tool"):
        long = await timed(runs, go, turns, shape)
        short = await timed(runs, go, 0, shape)
        per_turn[shape] = (long - short) / turns
    return per_turn["handoff"], per_turn["tool"]


@contextlib.asynccontextmanager
async def shoal_app(url: str, provider: bool) -> AsyncIterator[tuple[Any, Counted]]:
    from shoal.stores import open_store

    store = open_store(url)
    await store.open()
    counted = Counted(store)
    app = shoal.App("agentbench", store=counted, instance_id="bench")   # type: ignore[arg-type]
    openai = None
    if provider:
        openai = app.provider("openai", max_concurrent=64, requests_per_minute=10**9,
                              tokens_per_minute=10**12, breaker=shoal.Breaker(),
                              aimd=shoal.Aimd())
        app.budget(per_run=10**6)

    @app.workflow
    async def agent_run(ctx: shoal.RunContext, spec: dict[str, Any]) -> dict[str, Any]:
        t = perf()      # not a step: a replay would time itself (no run here is replayed)
        result = await run_agent(ctx, build(spec["turns"], spec["shape"]), "go",
                                 provider=openai, price=PRICE if provider else None,
                                 max_turns=spec["turns"] + 5,
                                 run_config=RunConfig(tracing_disabled=True))
        return {"out": result.final_output, "seconds": perf() - t}

    async with app:
        yield app, counted
    await store.close()


async def in_shoal(label: str, url: str, provider: bool, runs: int, turns: int) -> Result:
    async with shoal_app(url, provider) as (app, counted):
        async def go(n: int, shape: str) -> float:
            run = await app.dispatch("agent_run", {"turns": n, "shape": shape})
            got = await app.result(run.id, timeout=120)
            assert got["out"] == "done"
            return float(got["seconds"])

        model_s, tool_s = await slopes(runs, turns, go)
        ops: dict[str, Counter[str]] = {}
        for shape in ("handoff", "tool"):
            per = {}
            for n in (turns, 0):
                counted.calls.clear()
                await go(n, shape)
                per[n] = Counter(counted.calls)
            ops[shape] = Counter({k: (per[turns][k] - per[0][k]) / turns
                                  for k in per[turns] | per[0]})
        model_ops = ops["handoff"]
        tool_ops = Counter({k: ops["tool"][k] - model_ops[k] for k in ops["tool"] | model_ops})

        def top(c: Counter[str]) -> list[tuple[str, float]]:
            return [(k, round(v, 2)) for k, v in c.most_common() if v >= 0.5]

        tops = top(model_ops), top(tool_ops)
        return Result(label, model_s * 1000, tool_s * 1000, sum(v for _, v in tops[0]),
                      sum(v for _, v in tops[1]), *tops)


async def postgres_url() -> tuple[str, Callable[[], None]] | None:
    try:
        import psycopg
        from psycopg import sql

        with psycopg.connect(POSTGRES, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except Exception as e:
        print(f"PostgreSQL at {POSTGRES} is not reachable ({e}): skipped")
        return None
    schema = f"agentbench_{secrets.token_hex(4)}"

    def drop() -> None:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                sql.Identifier(schema)))

    sep = "&" if "?" in POSTGRES else "?"
    return f"{POSTGRES}{sep}schema={schema}", drop


async def bench(runs: int, turns: int, tmp: Path) -> list[Result]:
    t_model, t_tool = await slopes(runs, turns, sdk_alone)
    results = [Result("the SDK alone (Runner.run)", t_model * 1000, t_tool * 1000)]
    stores = [("memory", "memory://"), ("SQLite", f"sqlite:///{tmp / 'agents.db'}")]
    pg = await postgres_url()
    if pg is not None:
        stores.append(("PostgreSQL", pg[0]))
    try:
        for name, url in stores:
            for provider in (False, True):
                label = f"run_agent, {name}" + (", with a provider" if provider else "")
                results.append(await in_shoal(label, url, provider, runs, turns))
    finally:
        if pg is not None:
            pg[1]()
    return results


def show(results: list[Result], runs: int, turns: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    console.print(machine("bench/agent_calls.py"))
    table = Table(title=f"per turn: the slope over {turns} turns, fastest of {runs} runs (a "
                        f"handoff turn: 1 model call; a tool turn: 1 model call + 1 tool call)",
                  title_justify="left")
    for column in ("setup", "handoff turn ms", "+ vs SDK", "tool turn ms", "+ vs SDK",
                   "store ops / model call", "store ops / tool call"):
        table.add_column(column, justify="left" if column.startswith(("setup", "store")) else
                         "right")
    base = results[0]
    def ops(r: Result, total: float, top: list[tuple[str, float]]) -> str:
        if r is base:
            return "-"
        return f"{total:g}: " + ", ".join(f"{k} {v:g}" for k, v in top)

    for r in results:
        table.add_row(r.setup, f"{r.ms_model:.2f}",
                      "" if r is base else f"+{r.ms_model - base.ms_model:.2f}",
                      f"{r.ms_tool:.2f}", "" if r is base else f"+{r.ms_tool - base.ms_tool:.2f}",
                      ops(r, r.ops_model, r.top_model), ops(r, r.ops_tool, r.top_tool))
    console.print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9, help="runs per measure (the fastest)")
    parser.add_argument("--turns", type=int, default=30, help="turns of the long runs")
    parser.add_argument("--quick", action="store_true", help="--runs 3 --turns 8")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.turns = 3, 8
    tmp = Path(tempfile.mkdtemp(prefix="shoal-agents-bench-"))
    try:
        results = asyncio.run(bench(args.runs, args.turns, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    show(results, args.runs, args.turns)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
