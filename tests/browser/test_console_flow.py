"""The console shows what flow control holds back: the overview's "Held back" and "Paused
workflows" tables (drawn by the server, then kept live by the page's script), and a held run's
page saying which rule holds it. The store's state is made directly (a run claimed into
``running`` as a worker would), so the test does not depend on how a claim enforces each rule.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from browser_support import ConsoleServer, Shots, wait_for

import shoal
from shoal.types import HOLD_REASONS

pytestmark = pytest.mark.slow

NS = "flowshop"


def css(browser: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By
    return browser.find_element(By.CSS_SELECTOR, selector)


def make_app(url: str) -> shoal.App:
    app = shoal.App(NS, store=url)

    @app.workflow(max_running=1)
    async def export(ctx: shoal.RunContext, n: int) -> int:
        return n

    @app.workflow
    async def report(ctx: shoal.RunContext, n: int) -> int:
        return n

    return app


async def set_up(url: str) -> dict[str, list[str]]:
    """Four exports (one claimed into running by a "worker", three held by max_running) and
    two reports of a paused workflow."""
    app = make_app(url)
    async with app.open():
        store, now = app.store, app.clock.now()
        await store.register_workflows(
            NS, {name: spec.options.stored() for name, spec in app._registry.workflows.items()},
            now)
        exports = [(await app.dispatch("export", i)).id for i in range(4)]
        claimed = await store.claim_runs(NS, ["export"], "worker-1", 1, 3600.0,
                                         app.clock.now())
        assert [r.id for r in claimed] == exports[:1]
        assert await app.pause_workflow("report")
        reports = [(await app.dispatch("report", i)).id for i in range(2)]
    return {"export": exports, "report": reports}


async def resume(url: str) -> None:
    app = make_app(url)
    async with app.open():
        assert await app.resume_workflow("report")


def rows(browser: Any, table: str) -> list[str]:
    from selenium.webdriver.common.by import By
    return [r.text for r in browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")]


def test_the_overview_and_a_runs_page_say_what_holds_runs_back(
        browser: Any, shots: Shots, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flow.db'}"
    runs = asyncio.run(set_up(url))
    with ConsoleServer(url, namespace=NS) as console:
        browser.get(console.url + "/")
        held = rows(browser, "held-back")
        assert held == [f"export max_running 3 {HOLD_REASONS['max_running']}",
                        f"report paused 2 {HOLD_REASONS['paused']}"], held
        [paused] = rows(browser, "paused")
        assert paused.startswith("report every tenant"), paused
        css(browser, "#held-back").location_once_scrolled_into_view   # noqa: B018
        shots.take(browser, "overview-held-back", full=True)

        # the page's script redraws the tables from /api/overview: the resume shows up
        asyncio.run(resume(url))
        wait_for(lambda: rows(browser, "held-back") == [
            f"export max_running 3 {HOLD_REASONS['max_running']}"], 30,
            "the overview to drop the resumed workflow")
        wait_for(lambda: rows(browser, "paused") == ["No workflow is paused."], 10,
                 "the paused workflows to be redrawn")

        browser.get(f"{console.url}/runs/{runs['export'][3]}")
        note = wait_for(lambda: css(browser, "#hold-reason"), 10, "the run's hold")
        assert note.text == "queued: waiting for a max_running share"
        shots.take(browser, "run-held-back")
        # the running one is held by nothing
        browser.get(f"{console.url}/runs/{runs['export'][0]}")
        wait_for(lambda: css(browser, "main"), 10, "the running run's page")
        assert browser.execute_script("return document.getElementById('hold-reason')") is None
    print("screenshots:", shots.path)
