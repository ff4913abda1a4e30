"""The rate key dispatch stores with each run (``NewRun.rate_key``): its ``Rate.key`` of the
input; '' (no key) for a run of a workflow with a rate and no key (no key function, or one that
gave None), from a process with the workflow or by name from one without it (the stored
options say it has a rate); NULL for a run of a workflow without a rate, so that the index of
first starts (runs_rate_starts, partial on ``rate_key IS NOT NULL``) holds none of its runs."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import shoal
from shoal.testing import VirtualClock


def _keys(db: Path) -> dict[str, str | None]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT id, rate_key FROM runs").fetchall())


async def test_dispatch_writes_no_key_only_for_a_workflow_with_a_rate(tmp_path: Path) -> None:
    db = tmp_path / "shoal.db"
    url, clock = f"sqlite:///{db}", VirtualClock()
    app = shoal.App("keys", store=url, clock=clock)

    @app.workflow()
    async def plain(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    @app.workflow(rate_limit=shoal.Rate(5, per=60))
    async def rated(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    @app.workflow(rate_limit=shoal.Rate(5, per=60, key=lambda input: input.get("p")))
    async def keyed(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    async with app:   # started: registers its workflows for the submitter
        runs = {"plain": await app.dispatch("plain", {}),
                "rated": await app.dispatch("rated", {}),
                "keyed": await app.dispatch("keyed", {"p": "acme"}),
                "keyed-none": await app.dispatch("keyed", {})}
        [many] = await app.dispatch_many("rated", [{}])
        submitter = shoal.App("keys", store=url, clock=clock)   # has none of them
        async with submitter.open():
            by_name = {"plain": await submitter.dispatch("plain", {}),
                       "rated": await submitter.dispatch("rated", {})}
    keys = _keys(db)
    assert {name: keys[run.id] for name, run in runs.items()} == {
        "plain": None, "rated": "", "keyed": "acme", "keyed-none": ""}
    assert keys[many.id] == ""
    assert {name: keys[run.id] for name, run in by_name.items()} == {"plain": None, "rated": ""}
