"""What flow control holds back, where people look: ``app.stats()`` (``held_back``,
``paused``), ``app.hold_reason``, ``shoal stats`` and ``shoal run show``, on the memory, SQLite
and PostgreSQL stores, and the ``shoal_held_back_runs`` gauge scraped over HTTP. The state is
made directly (a run claimed into ``running`` as another worker would), so these do not depend
on how a claim enforces a rule."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import backends
import pytest
from click.testing import CliRunner, Result
from starlette.testclient import TestClient

import shoal
import shoal.web
from shoal.cli import cli
from shoal.engine.runner import WorkflowOptions
from shoal.telemetry.metrics import PrometheusMetrics
from shoal.testing import VirtualClock
from shoal.types import PausedWorkflow


def test_the_stored_options_carry_every_flow_rule() -> None:
    options = WorkflowOptions(concurrency_key=lambda i: i["c"], concurrency_limit=3,
                              max_running=5, max_running_per_tenant=2,
                              rate_limit=shoal.Rate(10, per=60), fairness="tenant")
    assert options.stored() == {
        "max_attempts": 3, "priority": 0, "concurrency_key": None, "key_from_input": True,
        "concurrency_limit": 3, "max_running": 5, "max_running_per_tenant": 2,
        "rate_limit": {"limit": 10, "per": 60.0}, "fairness": "tenant"}
    assert WorkflowOptions().stored() == {
        "max_attempts": 3, "priority": 0, "concurrency_key": None, "key_from_input": False,
        "concurrency_limit": 1, "max_running": None, "max_running_per_tenant": None,
        "rate_limit": None, "fairness": None}


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'flow.db'}"
    else:
        with backends.postgres_schema("shoal_flowstats_") as url:
            yield url


def shoal_cli(url: str, *args: str) -> Result:
    env: dict[str, str | None] = {"SHOAL_STORE": None, "SHOAL_NAMESPACE": None}
    return CliRunner().invoke(cli, ["--store", url, *args], env=env, prog_name="shoal")


def define(url: Any, **kwargs: Any) -> shoal.App:
    app = shoal.App("flow", store=url, **kwargs)

    @app.workflow
    async def report(ctx: shoal.RunContext, n: int) -> int:
        return n

    return app


async def fill(app: shoal.App) -> list[shoal.Run]:
    """Another instance serves ``export`` (max_running=1): four dispatched, one of them claimed
    by its worker; ``report`` paused with two queued."""
    store = app.store
    await store.register_workflows(
        app.namespace, {"export": WorkflowOptions(max_running=1).stored()}, app.clock.now())
    exports = [await app.dispatch("export", i) for i in range(4)]
    [claimed] = await store.claim_runs(app.namespace, ["export"], "elsewhere", 1, 3600.0,
                                       app.clock.now())
    assert claimed.id == exports[0].id
    assert await app.pause_workflow("report")
    for i in range(2):
        await app.dispatch("report", i)
    return exports


async def test_stats_and_a_runs_reason(store_url: Any) -> None:
    app = define(store_url)
    async with app.open():
        await app.store.register_workflows(
            app.namespace, {"report": WorkflowOptions().stored()}, app.clock.now())
        exports = await fill(app)
        stats = await app.stats()
        assert stats.held_back == {"export": {"max_running": 3}, "report": {"paused": 2}}
        assert [(p.workflow, p.tenant) for p in stats.paused] == [("report", None)]
        assert isinstance(stats.paused[0], PausedWorkflow)
        assert await app.hold_reason(exports[3]) == "max_running"
        assert await app.hold_reason(exports[0].id) is None       # running
        with pytest.raises(shoal.UnknownRunError):
            await app.hold_reason(exports[1].id, tenant="someone-else")
        assert await app.resume_workflow("report")
        assert (await app.stats()).held_back == {"export": {"max_running": 3}}


async def _fill_apart(url: str) -> list[str]:
    app = define(url)
    async with app.open():
        await app.store.register_workflows(
            app.namespace, {"report": WorkflowOptions().stored()}, app.clock.now())
        return [r.id for r in await fill(app)]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_shoal_stats_and_run_show_say_what_holds_runs_back(kind: str, tmp_path: Any) -> None:
    with (backends.postgres_schema("shoal_flowstats_") if kind == "postgres"
          else contextlib.nullcontext(f"sqlite:///{tmp_path / 'cli.db'}")) as url:
        exports = asyncio.run(_fill_apart(url))
        table = shoal_cli(url, "-n", "flow", "stats")
        assert table.exit_code == 0, table.output
        assert "due queued runs held back, by rule" in table.stdout
        lines = [" ".join(line.replace("│", " ").split()) for line in table.stdout.splitlines()]
        assert "export max_running 3 waiting for a max_running share" in lines, table.stdout
        assert "report paused 2 paused" in lines, table.stdout
        [one] = [json.loads(line) for line in
                 shoal_cli(url, "-n", "flow", "stats", "--json").stdout.splitlines()]
        assert one["held_back"] == {"export": {"max_running": 3}, "report": {"paused": 2}}
        shown = shoal_cli(url, "-n", "flow", "run", "show", exports[3])
        assert shown.exit_code == 0, shown.output
        assert ("held back: queued, waiting for a max_running share (max_running)."
                in " ".join(shown.stdout.split())), shown.stdout
        answer = json.loads(shoal_cli(url, "-n", "flow", "run", "show", exports[3],
                                      "--json").stdout)
        assert answer["hold_reason"] == "max_running"
        running = json.loads(shoal_cli(url, "-n", "flow", "run", "show", exports[0],
                                       "--json").stdout)
        assert running["hold_reason"] is None
        assert "held back" not in shoal_cli(url, "-n", "flow", "run", "show",
                                            exports[0]).stdout


async def test_the_gauge_of_held_back_runs_is_scraped_over_http() -> None:
    clock = VirtualClock()
    app = define("memory://", clock=clock, metrics=PrometheusMetrics(stats_interval=1.0),
                 membership_interval=1.0)
    async with app:
        await fill(app)
        web = shoal.web.asgi(app)

        def scrape() -> str:
            with TestClient(web) as client:
                answer = client.get("/metrics")
                assert answer.status_code == 200
                return answer.text

        paused = 'shoal_held_back_runs{reason="paused",workflow="report"} 2.0'
        text = ""
        for _ in range(30):
            text = await asyncio.to_thread(scrape)
            if paused in text:
                break
            await clock.advance(1.0)
        assert paused in text, text
        assert 'shoal_held_back_runs{reason="max_running",workflow="export"} 3.0' in text
