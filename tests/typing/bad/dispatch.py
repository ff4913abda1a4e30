"""Misuses of typed workflows that a type checker must refuse: each line marked ``# E: code``
must get that error from ``mypy --strict`` and no other line any (tests/unit/test_typing.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pydantic

import shoal

app = shoal.App("typing", store="memory://")


class Order(pydantic.BaseModel):
    customer: str
    amount: int


@dataclass
class Quote:
    total: float


@app.workflow
async def settle(ctx: shoal.RunContext, order: Order) -> Quote:
    await ctx.start_child(price, order)  # E: arg-type
    ok = await ctx.start_child(price, Quote(1.0))
    name: str = await ok.result()  # E: assignment
    return Quote(len(name))


@app.workflow
async def price(ctx: shoal.RunContext, quote: Quote) -> float:
    return quote.total


@app.workflow
async def returns_wrong(ctx: shoal.RunContext, input: None) -> int:
    return "three"  # E: return-value


async def main() -> None:
    await app.dispatch(settle, {"customer": "c1", "amount": 5})  # E: misc
    await app.dispatch(settle, Quote(1.0))  # E: misc
    await app.dispatch(settle)  # E: arg-type
    await app.dispatch(settle, Order(customer="c1", amount=5), priority="high")  # E: call-overload
    run = await app.dispatch(settle, Order(customer="c1", amount=5))
    total: int = await app.result(run)  # E: arg-type
    print(total, (await app.result(run)).customer)  # E: attr-defined
