"""Misuses of ctx.step that a type checker must refuse: each line marked ``# E: code`` must get
that error from ``mypy --strict`` and no other line any (tests/unit/test_typing.py)."""

from __future__ import annotations

import shoal

app = shoal.App("typing", store="memory://")


def add(a: int, b: int) -> int:
    return a + b


async def fetch(url: str, *, timeout: float = 1.0) -> dict[str, int]:
    return {url: int(timeout)}


@app.workflow
async def wrong(ctx: shoal.RunContext, input: None) -> str:
    await ctx.step("add", add, 1, "2")  # E: call-overload
    await ctx.step("add", add, 1)  # E: call-overload
    await ctx.step("add", add, 1, 2, 3)  # E: call-overload
    await ctx.step("fetch", fetch, "u", timeout="soon")  # E: arg-type
    await ctx.step("fetch", fetch, "u", retries=2)  # E: call-arg
    await ctx.step.with_options(retries=1)("add", add, "1", 2)  # E: call-overload
    ctx.step.with_options(retries="twice")  # E: arg-type
    total = await ctx.step("add", add, 1, 2)
    total.upper()  # E: attr-defined
    page = await ctx.step("fetch", fetch, "u")
    return page  # E: return-value
