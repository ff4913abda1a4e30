"""What a type checker knows of typed workflows: checked by ``mypy --strict tests/typing/ok``
(``./dev test``), never run. Each ``assert_type`` fails the check if a type is lost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, assert_type

import pydantic

import shoal

app = shoal.App("typing", store="memory://")


class Order(pydantic.BaseModel):
    customer: str
    amount: int


class Receipt(pydantic.BaseModel):
    order: Order
    charged: int


@dataclass
class Quote:
    customer: str
    total: float


def add(a: int, b: int) -> int:
    return a + b


async def fetch(url: str, *, timeout: float = 1.0) -> dict[str, int]:
    return {url: int(timeout)}


def quote(order: Order) -> Quote:
    return Quote(order.customer, order.amount * 1.2)


def nothing() -> None:
    return None


@app.workflow(name="price", max_attempts=2)
async def price(ctx: shoal.RunContext, quote: Quote) -> float:
    return quote.total


@app.workflow
async def settle(ctx: shoal.RunContext, order: Order) -> Receipt:
    assert_type(ctx, shoal.RunContext)
    assert_type(await ctx.step("add", add, 1, 2), int)
    assert_type(await ctx.step("add", add, 1, b=2), int)
    assert_type(await ctx.step("fetch", fetch, "https://example.org", timeout=2.0),
                dict[str, int])
    assert_type(await ctx.step("nothing", nothing), None)
    assert_type(await ctx.step.with_options(retries=2)("add", add, 1, 2), int)
    assert_type(await ctx.step.with_options()("fetch", fetch, "u"), dict[str, int])
    q = await ctx.step("quote", quote, order)
    assert_type(q, Quote)

    child = await ctx.start_child(price, q, priority=1)
    assert_type(child, shoal.ChildRun[float])
    assert_type(await child.result(), float)
    by_name = await ctx.start_child("price", {"customer": "c1", "total": 1.0})
    assert_type(by_name, shoal.ChildRun[Any])
    assert_type(await by_name.result(), Any)
    assert_type(await ctx.start_child(no_input), shoal.ChildRun[str])

    assert_type(await ctx.approval("refund", {"amount": 40}), shoal.Decision)
    assert_type(await ctx.wait_for("paid", timeout=60), Any)
    await ctx.sleep(1.5)
    return Receipt(order=order, charged=add(order.amount, 0))


@app.workflow
async def no_input(ctx: shoal.RunContext, input: None) -> str:
    return "done"


@app.workflow
async def untyped_input(ctx: shoal.RunContext, input: Any) -> dict[str, Any]:
    return {"input": input}


@app.cron("0 * * * *")
@app.workflow
async def hourly(ctx: shoal.RunContext, input: dict[str, Any]) -> None:
    return None


@app.cron("0 0 * * *", name="nightly")
async def nightly(ctx: shoal.RunContext, input: dict[str, Any]) -> int:
    return 0


assert_type(settle, shoal.Workflow[Order, Receipt])
assert_type(price, shoal.Workflow[Quote, float])
assert_type(no_input, shoal.Workflow[None, str])
assert_type(hourly, shoal.Workflow[dict[str, Any], None])
assert_type(nightly, shoal.Workflow[dict[str, Any], int])


async def main() -> None:
    run = await app.dispatch(settle, Order(customer="c1", amount=5), idempotency_key="o-1",
                             priority=2, tenant="t1", delay=1.0, max_attempts=3)
    assert_type(run, shoal.Run[Receipt])
    assert_type(await app.result(run), Receipt)
    assert_type(await app.result(run, timeout=5), Receipt)
    assert_type(await app.result(run.id), Any)      # an id alone carries no type
    assert_type(run.output, Any)                     # the JSON the store keeps

    assert_type(await app.dispatch(no_input), shoal.Run[str])
    assert_type(await app.dispatch(no_input, None), shoal.Run[str])
    assert_type(await app.dispatch(untyped_input, [1, "two"]), shoal.Run[dict[str, Any]])
    by_name = await app.dispatch("settle", {"customer": "c1", "amount": 5})
    assert_type(by_name, shoal.Run[Any])
    assert_type(await app.result(by_name), Any)

    bare: shoal.Run = run                           # a bare Run is a Run[Any]
    runs: list[shoal.Run] = [run, by_name]
    assert_type(bare, shoal.Run[Any])
    assert_type(await app.get_run(run.id), shoal.Run[Any])
    assert len(runs) == 2
