"""A run's progress in the console: ``progress`` in the JSON API's runs (``/api/runs``,
``/api/runs/{id}``), a small bar in the runs list for the runs that have not ended, and the run
page's panel (bar, percentage, message, data; polled from the API while the run is live). The runs
are made directly through the Store protocol (a claim and ``record_progress``), so one is running
while the console reads it."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from starlette.testclient import TestClient

import shoal
import shoal.web
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock
from shoal.types import Fence, Settlement

SCRIPT = "<script>alert(1)</script>"


@dataclass
class Runs:
    running: str     # running, reported 42 % with a hostile message and data
    done: str        # succeeded; its last report 100 %
    fresh: str       # running, nothing reported


async def make(store: MemoryStore, clock: VirtualClock) -> Runs:
    app = shoal.App("shop", store=store, clock=clock)

    @app.workflow
    async def index(ctx: shoal.RunContext, input: int) -> int:
        return input

    async with app.open():
        runs = [await app.dispatch(index, i) for i in range(3)]
    now = clock.now()
    claimed = {r.id: r for r in await store.claim_runs("shop", ["index"], "w-1", 3, 60.0, now)}

    def fence(run_id: str) -> Fence:
        return Fence(run_id, "w-1", claimed[run_id].lease_epoch)

    running, done, fresh = (r.id for r in runs)
    assert await store.record_progress(fence(running), shoal.Progress(
        0.42, f"indexing {SCRIPT}", {"rows": 42, "note": SCRIPT}, now - 3))
    assert await store.record_progress(fence(done), shoal.Progress(1.0, "done", {}, now - 2))
    assert await store.settle_run(fence(done), Settlement("succeeded", output=1), now - 1)
    return Runs(running, done, fresh)


@pytest.fixture
def console() -> Iterator[tuple[TestClient, Runs, float]]:
    store, clock = MemoryStore(), VirtualClock(time.time())
    runs = asyncio.run(make(store, clock))
    with TestClient(shoal.web.asgi(shoal.App("shop", store=store, clock=clock))) as client:
        yield client, runs, clock.now()


def row(html: str, run_id: str) -> str:
    """The runs list's row of ``run_id``."""
    for found in re.findall(r"<tr>.*?</tr>", html, re.S):
        if f'title="{run_id}"' in found:
            return str(found)
    raise AssertionError(f"no row of {run_id} in the list")


def test_the_api_gives_each_run_its_progress(console: tuple[TestClient, Runs, float]) -> None:
    client, runs, now = console
    listed = {r["id"]: r["progress"] for r in client.get("/api/runs").json()["runs"]}
    assert listed[runs.running] == {"fraction": 0.42, "message": f"indexing {SCRIPT}",
                                    "data": {"rows": 42, "note": SCRIPT}, "at": now - 3}
    assert listed[runs.done] == {"fraction": 1.0, "message": "done", "data": {},
                                 "at": now - 2}
    assert listed[runs.fresh] is None
    one = client.get(f"/api/runs/{runs.running}").json()
    assert one["run"]["progress"] == listed[runs.running]
    assert one["at"] == now


def test_the_runs_list_shows_a_small_bar_for_runs_that_have_not_ended(
    console: tuple[TestClient, Runs, float]
) -> None:
    client, runs, _ = console
    html = client.get("/runs").text
    running = row(html, runs.running)
    assert 'class="progress compact"' in running and 'aria-valuenow="42"' in running
    assert "width: 42.0%" in running and "42%" in running
    assert f"indexing {SCRIPT}" not in running and "indexing &lt;script&gt;" in running
    assert "progress" not in row(html, runs.done).replace("progress</th>", "")
    assert 'class="progress' not in row(html, runs.fresh)


def test_the_run_page_shows_the_bar_the_message_and_the_data(
    console: tuple[TestClient, Runs, float]
) -> None:
    client, runs, _ = console
    html = client.get(f"/runs/{runs.running}").text
    panel = html[html.index('id="progress"'):html.index("</section>", html.index('id="progress"'))]
    assert f'data-live="/api/runs/{runs.running}"' in panel and 'data-render="run"' in panel
    assert 'data-status="running"' in panel
    assert 'aria-valuenow="42"' in panel and "42%" in panel
    assert "indexing &lt;script&gt;alert(1)&lt;/script&gt;" in panel and SCRIPT not in html
    assert "&#34;rows&#34;: 42" in panel or "&quot;rows&quot;: 42" in panel
    assert "3.0 s ago" in panel

    ended = client.get(f"/runs/{runs.done}").text
    panel = ended[ended.index('id="progress"'):]
    assert "data-live" not in panel.split(">", 1)[0]          # an ended run is not polled
    assert 'aria-valuenow="100"' in panel and "(its last report)" in panel

    fresh = client.get(f"/runs/{runs.fresh}").text
    panel = fresh[fresh.index('id="progress"'):]
    assert "data-live" in panel.split(">", 1)[0] and "None reported yet." in panel
