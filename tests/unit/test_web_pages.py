"""The console's pages (shoal.web.pages) without a browser: each page as HTML through
Starlette's TestClient over a memory store, escaping of hostile values, read-only pages without
actions, refusals as pages, a console mounted under a path, and the helpers that shape the read
model for the templates. tests/browser drives the same pages in Chromium."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

import shoal
import shoal.web
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock, settle
from shoal.web import pages
from shoal.web.data import Refused

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'


@dataclass
class Shop:
    store: MemoryStore
    clock: VirtualClock
    failed: str
    waiting: str
    sleeping: str
    parent: str
    child: str
    entry: str


def worker(store: MemoryStore, clock: VirtualClock) -> shoal.App:
    app = shoal.App("shop", store=store, clock=clock, instance_id="w-1")

    @app.workflow(max_attempts=1)
    async def charge(ctx: shoal.RunContext, input: dict[str, Any]) -> Any:
        await ctx.step("reserve", lambda: {"ok": True})
        raise RuntimeError(f"card declined: {input['card']}")

    @app.workflow
    async def refund(ctx: shoal.RunContext, input: dict[str, Any]) -> Any:
        return (await ctx.approval("refund", {"customer": input["customer"]})).approved

    @app.workflow
    async def nap(ctx: shoal.RunContext, input: Any) -> None:
        await ctx.step("prepare", lambda: 1)
        await ctx.sleep(3600)

    @app.workflow
    async def parent(ctx: shoal.RunContext, input: Any) -> Any:
        def send() -> int:
            ctx.outbox.send("hook", {"note": SCRIPT})
            return 1

        await ctx.step("send", send)
        return await (await ctx.start_child("leaf", {"note": IMG})).result()

    @app.workflow
    async def leaf(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    @app.outbox_handler("hook", max_deliveries=1)
    async def hook(payload: Any, key: str) -> None:
        raise ConnectionError(f"hook down: {IMG}")

    return app


async def populate() -> Shop:
    store, clock = MemoryStore(), VirtualClock(time.time())
    app = worker(store, clock)
    async with app:
        failed = await app.dispatch("charge", {"card": IMG}, idempotency_key=SCRIPT)
        waiting = await app.dispatch("refund", {"customer": SCRIPT})
        sleeping = await app.dispatch("nap", None)
        parent = await app.dispatch("parent", None)
        for _ in range(40):
            await settle()
            await clock.advance(1)
            await app.poll()
            if (await app.get_run(parent.id)).status.final and await app.dead_letters():
                break
        await app.signal(sleeping.id, IMG, {"x": SCRIPT})
        [child] = await app.list_runs(workflow="leaf")
        [entry] = await app.dead_letters()
    return Shop(store, clock, failed.id, waiting.id, sleeping.id, parent.id, child.id, entry.id)


@pytest.fixture(scope="module")
def shop() -> Shop:
    return asyncio.run(populate())


@pytest.fixture
def client(shop: Shop) -> Iterator[TestClient]:
    app = shoal.App("shop", store=shop.store, clock=shop.clock)
    with TestClient(shoal.web.asgi(app)) as c:
        yield c


def page(client: TestClient, path: str, status: int = 200) -> str:
    got = client.get(path)
    assert got.status_code == status, got.text
    assert got.headers["content-type"].startswith("text/html")
    return got.text


def section(html: str, table_id: str) -> str:
    """The rows of the table ``table_id``, tags removed and spaces squeezed (what a person
    reads in it)."""
    found = re.search(rf'<table id="{table_id}">.*?<tbody>(.*?)</tbody>', html, re.S)
    assert found is not None, f"no table {table_id!r} in the page"
    return " ".join(re.sub(r"<[^>]+>", " ", found.group(1)).split())


def assert_escaped(html: str) -> None:
    """The hostile strings appear only escaped: never as markup."""
    assert SCRIPT not in html and "<img" not in html and "onerror=alert(1)>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html or "&lt;img" in html


# -- pages -------------------------------------------------------------------------------------


def test_every_page_renders(client: TestClient, shop: Shop) -> None:
    for path in ("/", "/runs", f"/runs/{shop.failed}", f"/runs/{shop.parent}",
                 f"/runs/{shop.child}", f"/runs/{shop.sleeping}", f"/runs/{shop.waiting}",
                 "/approvals", "/dead-letters", "/replicas"):
        html = page(client, path)
        assert '<meta name="csrf-token" content="' in html
        assert "/static/console.css" in html and "/static/console.js" in html
        assert re.search(r"https?://(?!127\.0\.0\.1|www\.w3\.org)", html) is None, path
    assert client.get("/static/console.css").status_code == 200
    assert client.get("/static/console.js").status_code == 200


def test_hostile_values_are_escaped_on_every_page(client: TestClient, shop: Shop) -> None:
    for path in ("/runs", f"/runs/{shop.failed}", f"/runs/{shop.sleeping}",
                 f"/runs/{shop.child}", f"/runs/{shop.parent}", "/approvals",
                 "/dead-letters", "/runs?" + "q=%3Cscript%3Ealert(1)%3C%2Fscript%3E"):
        assert_escaped(page(client, path))
    # the search box gives back what was typed, as an attribute value
    html = page(client, "/runs?q=" + "%22%3E%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
    assert 'value="&#34;&gt;&lt;img src=x onerror=alert(1)&gt;"' in html


def test_overview_shows_the_read_model(client: TestClient, shop: Shop) -> None:
    html = page(client, "/")
    assert re.search(r'data-bind="status.failed">1<', html)
    assert re.search(r'data-bind="pending_approvals">1<', html)
    assert re.search(r'data-bind="dead_letters">1<', html)
    assert 'class="card warn" id="card-approvals"' in html
    assert html.count('<rect class="bar-ok"') == 60
    # w-1 stopped: no live instance, and the replicas page lists it as registered only
    assert re.search(r'data-bind="instances">0<', html)
    assert "No live instance" in section(html, "instances")
    assert 'id="membership-note" hidden' in html
    replicas = page(client, "/replicas")
    assert "w-1" in section(replicas, "registered")
    assert "w-1" not in section(replicas, "instances")


def test_run_detail_shows_steps_tree_pauses_signals_and_outbox(client: TestClient,
                                                                shop: Shop) -> None:
    failed = page(client, f"/runs/{shop.failed}")
    assert 'id="traceback"' in failed and "RuntimeError: card declined" in failed
    assert "/retry" in failed and "/cancel" not in failed
    sleeping = page(client, f"/runs/{shop.sleeping}")
    assert "sleeping until" in sleeping and "/cancel" in sleeping and "/signal" in sleeping
    assert "not yet" in sleeping                            # the signal, not consumed
    child = page(client, f"/runs/{shop.child}")
    assert f'href="/runs/{shop.parent}"' in child and "(this run)" in child
    parent = page(client, f"/runs/{shop.parent}")
    assert 'class="status s-dead"' in parent and "/api/dead-letters/" in parent
    waiting = page(client, f"/runs/{shop.waiting}")
    assert "/approve" in waiting and "/deny" in waiting


def test_read_only_pages_offer_no_action(shop: Shop) -> None:
    app = shoal.App("shop", store=shop.store, clock=shop.clock)
    with TestClient(shoal.web.asgi(app, read_only=True)) as client:
        for path in (f"/runs/{shop.failed}", f"/runs/{shop.sleeping}", "/approvals",
                     "/dead-letters", f"/runs/{shop.parent}"):
            html = page(client, path)
            assert "data-act=" not in html and '<dialog id="confirm"' not in html, path
            assert 'id="read-only"' in html


def test_refusals_are_pages(client: TestClient) -> None:
    assert "No run with id" in page(client, "/runs/nope", 404)
    assert "Unknown status" in page(client, "/runs?status=lost", 400)
    assert "Unknown time range" in page(client, "/runs?within=forever", 400)


def test_a_console_never_opened_says_so() -> None:
    # a console on a URL, mounted where no lifespan opens its App
    service = Starlette(routes=[Mount("/ops", shoal.web.asgi("memory://"))])
    with TestClient(service) as client:
        got = client.get("/ops/runs")
    assert got.status_code == 503 and "lifespan" in got.text
    assert got.headers["content-type"].startswith("text/plain")


def test_runs_pages_follow_the_cursor(client: TestClient) -> None:
    first = page(client, "/runs?limit=2")
    link = re.search(r'href="(\?[^"]*cursor=[^"]*)" rel="next"', first)
    assert link is not None
    second = page(client, "/runs" + link.group(1).replace("&amp;", "&"))
    ids = re.findall(r'href="/runs/([0-9a-f-]{36})"', first)
    assert ids and not set(ids) & set(re.findall(r'href="/runs/([0-9a-f-]{36})"', second))
    assert "First page" in second


def test_mounted_under_a_path_every_link_keeps_it(shop: Shop) -> None:
    app = shoal.App("shop", store=shop.store, clock=shop.clock)
    service = Starlette(routes=[Mount("/ops", shoal.web.asgi(app))])
    with TestClient(service) as client:
        html = page(client, "/ops/")
        links = re.findall(r'(?:href|src|data-live|action)="(/[^"]*)"', html)
        assert links and all(link.startswith("/ops/") for link in links), links


# -- replicas and providers from the coordination store ---------------------------------------


async def html_of(app: shoal.App, path: str) -> str:
    """The page ``path`` of a console over ``app``, in this event loop (the Apps run in it)."""
    transport = httpx.ASGITransport(app=shoal.web.asgi(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        got = await http.get(path)
    assert got.status_code == 200, got.text
    return got.text


async def advance_until(clock: VirtualClock, done: Any, seconds: float = 10.0) -> None:
    """Advance the clock in small ticks until ``done()`` is true (the heartbeats run)."""
    for _ in range(int(seconds / 0.25)):
        if done():
            return
        await clock.advance(0.25)
        await settle()
    assert done(), "not reached in time"


def replica(store: MemoryStore, clock: VirtualClock, name: str, version: str) -> shoal.App:
    app = shoal.App("shop", store=store, clock=clock, instance_id=name, version=version,
                    membership_interval=1.0)

    @app.workflow(name="noop")
    async def noop(ctx: shoal.RunContext, input: Any) -> None:
        return None

    return app


async def test_replicas_page_shows_slots_a_held_lock_its_waiter_meters_and_providers() -> None:
    clock, store = VirtualClock(time.time()), MemoryStore()
    a = replica(store, clock, "api-1", "2026.12.1")
    b = replica(store, clock, "api-2", "2026.12.2")
    gpt = a.provider("gpt", max_concurrent=8, tokens_per_minute=200_000,
                     breaker=shoal.Breaker(failures=2, window=60, cooldown=300))
    async with a, b:
        await advance_until(clock, lambda: a.slots(4) is not None and b.slots(4) is not None)
        async with gpt.call(tokens=1200):
            pass
        with pytest.raises(ConnectionError):
            async with gpt.call():
                raise ConnectionError("gpt: 502")
        await a.meter(["calls"], [90_000])
        granted: list[int] = []

        async def second() -> None:
            async with b.lock("settlement") as lock:
                granted.append(lock.token)

        async with a.lock("settlement") as held:
            waiter = asyncio.create_task(second())
            await settle()
            replicas, overview = await html_of(a, "/replicas"), await html_of(a, "/")
        await asyncio.wait_for(waiter, 5)
    assert granted == [held.token + 1]

    instances = section(replicas, "instances")
    assert re.search(r"api-1 live 2026\.12\.1 \S+ (ms|s) ago · .*? UTC \d of 2 0",
                     instances), instances
    assert re.search(r"api-2 live 2026\.12\.2 .* ago .* \d of 2 0", instances), instances
    assert {m for m in re.findall(r"(\d) of 2", instances)} == {"0", "1"}
    assert "None: every instance" in section(replicas, "registered")
    slots = section(replicas, "slots")
    assert slots.count("owns") == 2 and "api-1" in slots and "api-2" in slots
    locks = section(replicas, "locks")
    assert re.search(rf"settlement api-1 {held.token} in \S+ s · .*? UTC api-2 ticket \d+",
                     locks), locks
    assert re.search(r"calls 1 min (2\d|30) s in 1 min", section(replicas, "meters"))
    providers = section(replicas, "providers")
    assert "gpt 0 / 8 no limit 1,200 / 200,000" in providers, providers
    assert "closed 1 of 2 failures in 1 min" in providers, providers
    assert 'id="membership-note" hidden' in replicas and 'id="incomplete"' not in replicas

    assert re.search(r'data-bind="instances">2<', overview)
    live = section(overview, "instances")
    assert re.search(r"api-1 2026\.12\.1 .* ago .* \d of 2 0 api-2 2026\.12\.2", live), live


async def test_without_membership_the_pages_say_so() -> None:
    clock, store = VirtualClock(time.time()), MemoryStore()
    async with replica(store, clock, "w-9", "v1"):
        pass
    console = shoal.App("shop", store=store, clock=clock)

    async def redis_down(limit: int) -> Any:
        raise shoal.StoreUnavailableError("Redis at redis://cache:6379 does not answer.")

    console.coordination_view = redis_down  # type: ignore[method-assign]
    replicas = await html_of(console, "/replicas")
    note = re.search(r'<p class="flash err" id="membership-note">(.*?)</p>', replicas, re.S)
    assert note is not None and "Membership unavailable" in note.group(1)
    assert "Redis at redis://cache:6379 does not answer." in note.group(1)
    assert section(replicas, "instances").startswith("w-9 unknown")
    assert 'id="slots"' not in replicas and 'id="locks"' not in replicas
    overview = await html_of(console, "/")
    assert re.search(r'data-bind="instances">\?<', overview)
    assert 'id="membership-note">' in overview
    assert section(overview, "instances").startswith("w-9 unknown")


async def test_a_view_cut_at_its_limit_says_it_is_incomplete() -> None:
    clock, store = VirtualClock(time.time()), MemoryStore()
    app = replica(store, clock, "api-1", "v1")
    async with app:
        held = [await app.lock(f"k{i:03}").__aenter__() for i in range(101)]
        html = await html_of(app, "/replicas")
        for lock in held:
            await app._locks.release(lock)
    assert 'id="incomplete"' in html and "incomplete" in html
    assert section(html, "locks").count(" api-1 ") == 100


# -- helpers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seconds, text", [
    (0.25, "250 ms"), (4.25, "4.2 s"), (42, "42 s"), (185, "3 min 5 s"), (3600, "1 h"),
    (7800, "2 h 10 min"), (86400 * 3 + 3600 * 4, "3 d 4 h"), (-90, "-1 min 30 s"), (None, ""),
])
def test_duration(seconds: float | None, text: str) -> None:
    assert pages.duration(seconds) == text


def test_short_keeps_the_end_of_an_id() -> None:
    assert pages.short("01a2319f-cc7d-7021-bb54-17b108f4a0d3") == "…17b108f4a0d3"
    assert pages.short("run-1") == "run-1" and pages.short(None) == ""


def test_chart_scales_to_the_busiest_minute() -> None:
    got = pages.chart([0, 5, 10], width=300, height=100)
    assert got["max"] == 10 and got["total"] == 15
    heights = [b["h"] for b in got["bars"]]
    assert heights[0] == 0 and heights[2] == 96 and heights[1] == 48
    assert [b["ago"] for b in got["bars"]] == [2, 1, 0]
    assert all(b["y"] + b["h"] == 100 for b in got["bars"])
    assert pages.chart([0, 0])["max"] == 0


def test_timeline_lays_steps_end_to_end() -> None:
    run = {"started_at": 100.0, "created_at": 99.0, "finished_at": None}
    steps = [{"seq": 1, "name": "a", "finished": True, "finished_at": 102.0,
              "since_previous": 2.0, "output": 1, "epoch": 1},
             {"seq": 2, "name": "b", "finished": True, "finished_at": 106.0,
              "since_previous": 4.0, "output": 2, "epoch": 1},
             {"seq": 3, "name": "shoal.sleep", "finished": False, "finished_at": None,
              "since_previous": None, "output": {"until": 200.0}, "epoch": 2}]
    got = pages.timeline(run, steps, now=110.0)
    rows = got["rows"]
    assert (got["start"], got["end"]) == (100.0, 110.0)
    assert [(r.left, r.width) for r in rows] == [(0.0, 20.0), (20.0, 40.0), (60.0, 40.0)]
    assert [r.took for r in rows] == [2.0, 4.0, None]
    assert rows[2].open and rows[2].target == 200.0
    assert got["estimated"] and all(r.estimated for r in rows)


def test_timeline_draws_each_step_from_its_start() -> None:
    # a gap between steps (the workflow's own code) stays a gap; a retried step's bar spans
    # its tries; a sleep in progress runs from when the run reached it; an older step without
    # a start falls back to the end of the step before it
    run = {"started_at": 100.0, "created_at": 99.0, "finished_at": None}
    steps = [{"seq": 1, "name": "a", "finished": True, "started_at": 101.0,
              "finished_at": 102.0, "since_previous": 2.0, "output": 1, "epoch": 1,
              "attempt": 1, "retries": 0},
             {"seq": 2, "name": "b", "finished": True, "started_at": 104.0,
              "finished_at": 106.0, "since_previous": 4.0, "output": 2, "epoch": 1,
              "attempt": 1, "retries": 2},
             {"seq": 3, "name": "old", "finished": True, "started_at": None,
              "finished_at": 107.0, "since_previous": 1.0, "output": 3, "epoch": 1,
              "attempt": None, "retries": None},
             {"seq": 4, "name": "shoal.sleep", "finished": False, "started_at": 108.0,
              "finished_at": None, "since_previous": None, "output": {"until": 200.0},
              "epoch": 1, "attempt": 1, "retries": 0}]
    got = pages.timeline(run, steps, now=110.0)
    rows = got["rows"]
    assert [(r.left, r.width) for r in rows] == [(10.0, 10.0), (40.0, 20.0), (60.0, 10.0),
                                                 (80.0, 20.0)]
    assert [r.took for r in rows] == [1.0, 2.0, 1.0, None]
    assert [r.estimated for r in rows] == [False, False, True, False]
    assert got["estimated"]
    assert not pages.timeline(run, steps[:2], now=110.0)["estimated"]


def test_run_page_shows_each_steps_attempt_epoch_and_retries(client: TestClient,
                                                             shop: Shop) -> None:
    html = page(client, f"/runs/{shop.failed}")
    steps = html[html.index('id="steps"'):html.index("</section>", html.index('id="steps"'))]
    assert "attempt 1" in steps and "epoch " in steps
    assert "retr" not in steps                      # no retry taken, none shown
    assert "Written before shoal" not in html       # every step has its start


def test_tree_nests_by_parent_and_keeps_orphans_on_top() -> None:
    rows = [{"id": "r", "parent_id": None}, {"id": "a", "parent_id": "r"},
            {"id": "b", "parent_id": "a"}, {"id": "x", "parent_id": "cut"}]
    got = pages.tree(rows)
    assert [n["run"]["id"] for n in got] == ["r", "x"]
    assert got[0]["children"][0]["children"][0]["run"]["id"] == "b"


def test_runs_query_turns_a_range_into_created_from() -> None:
    assert pages.runs_query({"within": "1h", "status": "", "q": "k"}, now=10_000.0) == {
        "q": "k", "created_from": "6400.0"}
    with pytest.raises(Refused) as refused:
        pages.runs_query({"within": "1y"}, now=0.0)
    assert refused.value.status == 400 and refused.value.field == "within"
    assert pages.page_link({"q": "a b", "cursor": "c"}, cursor=None) == "?q=a+b"
    assert pages.page_link({}, cursor="z") == "?cursor=z"


async def test_ledger_page_lists_charges_a_page_at_a_time_filtered_and_escaped() -> None:
    store, clock = MemoryStore(), VirtualClock(time.time())
    app = shoal.App("shop", store=store, clock=clock)
    async with app.open():
        for i in range(5):
            await app.spend(0.5 + i, tenant="acme" if i % 2 else SCRIPT)
        first = await html_of(app, "/ledger?limit=2")
        assert section(first, "ledger").count("usd") == 2
        assert_escaped(first)
        after = re.search(r'id="next-page" href="([^"]+)"', first)
        assert after is not None
        second = await html_of(app, after.group(1).replace("&amp;", "&"))
        assert section(second, "ledger").count("usd") == 2
        assert section(first, "ledger") != section(second, "ledger")
        acme = await html_of(app, "/ledger?tenant=acme")
        rows = section(acme, "ledger")
        assert rows.count("usd") == 2 and "1.5" in rows and "3.5" in rows
        assert "ledger →" in await html_of(app, "/replicas")
