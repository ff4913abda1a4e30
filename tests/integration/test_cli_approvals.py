"""``shoal pauses`` / ``approve`` / ``deny`` over a real SQLite file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

import shoal
from shoal.cli import cli


def desk_app(url: str) -> shoal.App:
    app = shoal.App("desk", store=url, instance_id="desk", lease=3.0)

    @app.workflow(name="refund")
    async def refund(ctx: shoal.RunContext, input: Any) -> Any:
        decision = await ctx.approval("refund", {"amount": input["amount"]})
        return {"approved": decision.approved, "by": decision.by, "data": decision.data}

    return app


async def park(url: str, amounts: list[int]) -> list[str]:
    app = desk_app(url)
    async with app:
        runs = [await app.dispatch("refund", {"amount": a}) for a in amounts]
        for _ in range(200):
            if len(await app.pending_pauses()) == len(amounts):
                break
            await asyncio.sleep(0.02)
        return [r.id for r in runs]


async def finish(url: str, run_ids: list[str]) -> list[Any]:
    app = desk_app(url)
    async with app:
        return [await app.result(r, timeout=10) for r in run_ids]


def shoal_cli(url: str, *args: str) -> Result:
    env: dict[str, str | None] = {"SHOAL_STORE": None, "SHOAL_NAMESPACE": None}
    return CliRunner().invoke(cli, ["--store", url, *args], env=env, prog_name="shoal")


def test_list_approve_and_deny_pauses(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'desk.db'}"
    first, second = asyncio.run(park(url, [40, 7]))

    listed = shoal_cli(url, "-n", "desk", "pauses", "--json")
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(r["run_id"], r["request"]) for r in rows] == [(first, {"amount": 40}),
                                                          (second, {"amount": 7})]
    table = shoal_cli(url, "-n", "desk", "pauses")
    assert rows[0]["id"] in table.stdout and "refund" in table.stdout

    ok = shoal_cli(url, "approve", rows[0]["id"], "--by", "ana", "--data", '{"note": "fine"}')
    assert ok.exit_code == 0, ok.output
    assert "Approved pause" in ok.stdout
    no = shoal_cli(url, "deny", rows[1]["id"], "--by", "bo")
    assert no.exit_code == 0, no.output

    twice = shoal_cli(url, "deny", rows[0]["id"])
    assert twice.exit_code == 1 and "already resolved: approved by ana" in twice.stderr
    unknown = shoal_cli(url, "approve", "no-such-pause")
    assert unknown.exit_code == 1 and "no-such-pause" in unknown.stderr
    bad = shoal_cli(url, "approve", rows[1]["id"], "--data", "{not json")
    assert bad.exit_code == 1 and "--data is not JSON" in bad.stderr
    every = shoal_cli(url, "pauses")   # without a namespace: every one, here none pending
    assert every.exit_code == 0 and "No pending pauses in any namespace" in every.stdout
    assert "No pending pauses" in shoal_cli(url, "-n", "desk", "pauses").stdout

    assert asyncio.run(finish(url, [first, second])) == [
        {"approved": True, "by": "ana", "data": {"note": "fine"}},
        {"approved": False, "by": "bo", "data": None},
    ]
