"""``shoal workflow pause|resume NAME [--tenant T]`` and the pauses in ``shoal workflows`` and
``shoal stats``, on a real SQLite file: the pause stored (an App of the store sees it), the
namespace found by name, an unknown workflow one line and exit code 1, ``--json``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import shoal
from shoal.cli import cli


def shoal_cli(url: str, *args: str) -> Result:
    """The CLI in-process with a clean SHOAL_* environment."""
    env: dict[str, str | None] = {"SHOAL_STORE": None, "SHOAL_NAMESPACE": None}
    return CliRunner().invoke(cli, ["--store", url, *args], env=env, prog_name="shoal")


async def _register(url: str, namespace: str, *names: str) -> None:
    """Start an instance serving workflows ``names`` (which do nothing), then stop it."""
    app = shoal.App(namespace, store=url, lease=3.0)
    for name in names:
        async def noop(ctx: shoal.RunContext, input: Any) -> Any:
            return input
        app.workflow(name=name)(noop)
    async with app:
        pass


async def _paused(url: str, namespace: str) -> list[tuple[str, str | None]]:
    app = shoal.App(namespace, store=url)
    async with app.open():
        return [(p.workflow, p.tenant) for p in await app.paused_workflows()]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'pause.db'}"


def test_pause_and_resume_a_workflow(url: str) -> None:
    asyncio.run(_register(url, "shop", "report", "ship"))
    paused = shoal_cli(url, "workflow", "pause", "report")
    assert paused.exit_code == 0, paused.output
    assert "Paused workflow 'report' in namespace 'shop' for every tenant" in paused.stdout
    assert asyncio.run(_paused(url, "shop")) == [("report", None)]
    again = shoal_cli(url, "workflow", "pause", "report")
    assert again.exit_code == 0 and "already paused" in again.stdout, again.output

    one = shoal_cli(url, "-n", "shop", "workflow", "pause", "ship", "--tenant", "acme", "--json")
    assert one.exit_code == 0, one.output
    answer = json.loads(one.stdout)
    assert (answer["namespace"], answer["workflow"], answer["tenant"], answer["changed"]) == (
        "shop", "ship", "acme", True)
    assert [p["tenant"] for p in answer["paused"]] == ["acme"]

    rows = {r["name"]: r for r in map(json.loads,
                                      shoal_cli(url, "workflows", "--json").stdout.splitlines())}
    assert [p["tenant"] for p in rows["report"]["paused"]] == [None]
    assert [p["tenant"] for p in rows["ship"]["paused"]] == ["acme"]
    table = shoal_cli(url, "workflows")
    assert table.exit_code == 0 and "paused" in table.stdout and "every tenant" in table.stdout

    stats = shoal_cli(url, "-n", "shop", "stats")
    assert "Paused workflows: report (every tenant), ship (acme)." in stats.stdout, stats.output
    [one] = [json.loads(line) for line in shoal_cli(url, "stats", "--json").stdout.splitlines()]
    assert [(p["workflow"], p["tenant"]) for p in one["paused"]] == [
        ("report", None), ("ship", "acme")]

    resumed = shoal_cli(url, "workflow", "resume", "report")
    assert resumed.exit_code == 0 and "Resumed workflow 'report'" in resumed.stdout
    # every tenant's resume leaves the pause of one tenant
    other = shoal_cli(url, "workflow", "resume", "ship")
    assert other.exit_code == 0 and "was not paused" in other.stdout, other.output
    assert "other pauses of it remain" in other.stdout
    assert asyncio.run(_paused(url, "shop")) == [("ship", "acme")]
    shoal_cli(url, "workflow", "resume", "ship", "--tenant", "acme")
    assert asyncio.run(_paused(url, "shop")) == []


def test_an_unknown_workflow_is_one_line_and_exit_code_1(url: str) -> None:
    asyncio.run(_register(url, "shop", "report"))
    for args in (("workflow", "pause", "nope"), ("-n", "shop", "workflow", "resume", "nope")):
        result = shoal_cli(url, *args)
        assert result.exit_code == 1, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "'nope'" in lines[0] and "'shoal workflows'" in lines[0]
    empty = shoal_cli(url, "workflow", "pause", "report", "--tenant", "")
    assert empty.exit_code == 2 and "must not be empty" in empty.stderr
    assert asyncio.run(_paused(url, "shop")) == []
