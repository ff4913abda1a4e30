"""The console's JSON API (shoal.web) through Starlette's TestClient, on the memory store (the
App given) and on SQLite (the console opening its own App on the URL): each route's data, the
keyset paging and filters, each action and its refusal when the run moved on, the token, the
login cookie, CSRF, read-only, the masked URL and hostile values returned as data."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

import shoal
import shoal.web
from shoal.backends.memory import MemoryStore
from shoal.cli import cli
from shoal.ports import Store
from shoal.testing import VirtualClock, settle

XSS = '"><img src=x onerror=alert(1)><script>alert(2)</script>'


@dataclass
class Runs:
    failed: str
    hostile: str
    waiting: str
    pause: str
    sleeping: str
    dead: str
    entry: str
    child: str
    done: int


def worker(store: Store, clock: VirtualClock) -> shoal.App:
    app = shoal.App("shop", store=store, clock=clock, instance_id="worker-1")

    @app.workflow(max_attempts=1)
    async def charge(ctx: shoal.RunContext, input: dict[str, Any]) -> Any:
        await ctx.step("reserve", lambda: {"ok": True})
        raise RuntimeError(f"card declined: {input['why']}")

    @app.workflow
    async def refund(ctx: shoal.RunContext, input: Any) -> Any:
        decision = await ctx.approval("refund", {"amount": 40, "note": XSS})
        return decision.approved

    @app.workflow
    async def nap(ctx: shoal.RunContext, input: Any) -> Any:
        await ctx.sleep(3600)

    @app.workflow
    async def notify(ctx: shoal.RunContext, input: Any) -> Any:
        def send() -> int:
            ctx.outbox.send("email", {"to": "a@example.com"})
            return 1

        await ctx.step("sent", send)
        return await (await ctx.start_child("leaf", {})).result()

    @app.workflow
    async def leaf(ctx: shoal.RunContext, input: Any) -> Any:
        return "leaf"

    @app.outbox_handler("email", max_deliveries=1)
    async def email(payload: Any, key: str) -> None:
        raise ConnectionError("smtp down")

    return app


async def populate(store: Store, clock: VirtualClock) -> Runs:
    """Runs in every state the console shows, made by a worker that is then stopped."""
    app = worker(store, clock)
    async with app:
        failed = await app.dispatch("charge", {"why": "expired"}, idempotency_key="order-7")
        hostile = await app.dispatch("charge", {"why": XSS}, concurrency_key=XSS)
        waiting = await app.dispatch("refund", None)
        sleeping = await app.dispatch("nap", None, concurrency_key="c-1")
        notify = await app.dispatch("notify", None)
        for _ in range(40):
            await settle()
            await clock.advance(1)
            await app.poll()
            if (await app.get_run(notify.id)).status == shoal.RunStatus.SUCCEEDED and \
                    await app.dead_letters():
                break
        [pause] = await app.pending_pauses()
        [entry] = await app.dead_letters()
        [child] = [r for r in await app.list_runs(workflow="leaf")]
        done = sum(1 for r in await app.list_runs() if r.status.final)
    return Runs(failed.id, hostile.id, waiting.id, pause.id, sleeping.id, notify.id, entry.id,
                child.id, done)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(time.time())


@pytest.fixture
def memory(clock: VirtualClock) -> Iterator[tuple[TestClient, Runs, shoal.App]]:
    store = MemoryStore()
    runs = asyncio.run(populate(store, clock))
    app = shoal.App("shop", store=store, clock=clock)
    with TestClient(shoal.web.asgi(app)) as client:
        client.get("/api/config")            # the CSRF cookie
        yield client, runs, app


def post(client: TestClient, path: str, body: Any = None,
         headers: dict[str, str] | None = None) -> Any:
    """A POST as the pages send it: JSON body and the X-CSRF-Token header."""
    sent = {"x-csrf-token": client.cookies.get("shoal_csrf") or ""} | (headers or {})
    return client.post(path, json=body, headers=sent)


def ids(response: Any) -> list[str]:
    assert response.status_code == 200, response.text
    return [r["id"] for r in response.json()["runs"]]


# -- reads -----------------------------------------------------------------------------------


def test_overview(memory: tuple[TestClient, Runs, shoal.App]) -> None:
    client, runs, _ = memory
    got = client.get("/api/overview").json()
    stats = got["stats"]
    assert stats["by_status"]["failed"] == 2 and stats["by_status"]["waiting"] == 1
    assert stats["by_status"]["sleeping"] == 1 and stats["finished"] == runs.done
    assert stats["by_workflow"]["charge"] == {"failed": 2}
    assert got["pending_approvals"] == 1 and got["dead_letters"] == 1
    chart = got["finished_per_minute"]
    assert len(chart["counts"]) == 60 and chart["width"] == 60
    assert sum(chart["counts"]) == runs.done          # all ended within the last hour
    assert chart["since"] + 60 * 60 > got["at"] >= chart["since"] + 59 * 60
    assert got["open_circuits"] == []
    assert got["instances"] == [], "worker-1 stopped: no heartbeat, no run held"
    replicas = client.get("/api/replicas").json()
    assert [r["id"] for r in replicas["registered"]] == ["worker-1"]
    assert replicas["registered"][0]["workflows"] == ["charge", "leaf", "nap", "notify",
                                                      "refund"]


def test_run_detail_step_timeline(clock: VirtualClock) -> None:
    """Each step's start (its first try), end, duration, the attempt that executed it and the
    retries it took: attempt 1 writes "first" and then fails; attempt 2 replays it and runs
    "second", which fails once and succeeds on its in-place retry."""
    store = MemoryStore()
    app = shoal.App("shop", store=store, clock=clock, instance_id="worker-1")
    tries: list[float] = []

    def second() -> str:
        tries.append(clock.now())
        if len(tries) == 1:
            raise ConnectionError("once")
        return "ok"

    @app.workflow(max_attempts=2)
    async def flaky(ctx: shoal.RunContext, input: Any) -> Any:
        await ctx.step("first", lambda: 1)
        if ctx.attempt == 1:
            raise RuntimeError("again")
        return await ctx.step.with_options(retries=1)("second", second)

    async def run() -> str:
        async with app:
            handle = await app.dispatch("flaky", None)
            for _ in range(300):
                await settle()
                if (await app.get_run(handle.id)).status.final:
                    break
                await clock.advance(1)
                await app.poll()
            return handle.id

    run_id = asyncio.run(run())
    with TestClient(shoal.web.asgi(shoal.App("shop", store=store, clock=clock))) as client:
        got = client.get(f"/api/runs/{run_id}").json()
        html = client.get(f"/runs/{run_id}").text
    assert got["run"]["status"] == "succeeded" and got["run"]["attempts"] == 2
    first, last = got["steps"]
    assert (first["name"], first["attempt"], first["retries"]) == ("first", 1, 0)
    assert (last["name"], last["attempt"], last["retries"]) == ("second", 2, 1)
    assert last["epoch"] > first["epoch"]
    # the step begins before its thread runs (the test advances the clock meanwhile)
    assert last["started_at"] <= tries[0] < tries[1] <= last["finished_at"]
    for step in (first, last):
        assert step["duration"] == step["finished_at"] - step["started_at"] >= 0
    assert "attempt 2" in html and "1 retry" in html and "Written before shoal" not in html


def test_runs_filters_search_and_paging(memory: tuple[TestClient, Runs, shoal.App]) -> None:
    client, runs, _ = memory
    assert ids(client.get("/api/runs?status=failed")) == [runs.hostile, runs.failed]
    assert ids(client.get("/api/runs?workflow=refund")) == [runs.waiting]
    assert ids(client.get("/api/runs", params={"q": "order-7"})) == [runs.failed]
    assert ids(client.get("/api/runs", params={"q": runs.sleeping})) == [runs.sleeping]
    assert ids(client.get("/api/runs", params={"q": "c-1"})) == [runs.sleeping]
    assert ids(client.get("/api/runs", params={"q": XSS})) == [runs.hostile]
    assert ids(client.get("/api/runs", params={"q": "nothing"})) == []
    assert ids(client.get("/api/runs", params={"idempotency_key": "order-7"})) == [runs.failed]
    assert ids(client.get("/api/runs", params={"tenant": "other"})) == []
    future = str(time.time() + 86400)
    assert ids(client.get("/api/runs", params={"created_from": future})) == []
    everything = ids(client.get("/api/runs"))
    assert len(everything) == 6 and everything == sorted(everything, reverse=True)
    seen, cursor = [], None
    while True:
        page = client.get("/api/runs", params={"limit": 4, **({"cursor": cursor} if cursor
                                                               else {})}).json()
        seen += [r["id"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == everything


@pytest.mark.parametrize("query, field", [
    ({"status": "lost"}, "status"), ({"limit": "0"}, "limit"), ({"limit": "x"}, "limit"),
    ({"created_from": "yesterday"}, "created_from"), ({"created_to": "nan"}, "created_to"),
])
def test_runs_bad_parameters(memory: tuple[TestClient, Runs, shoal.App],
                             query: dict[str, str], field: str) -> None:
    client, _, _ = memory
    got = client.get("/api/runs", params=query)
    assert got.status_code == 400 and got.json()["field"] == field


def test_run_detail(memory: tuple[TestClient, Runs, shoal.App]) -> None:
    client, runs, _ = memory
    failed = client.get(f"/api/runs/{runs.failed}").json()
    run = failed["run"]
    assert run["status"] == "failed" and run["idempotency_key"] == "order-7"
    assert "RuntimeError: card declined: expired" in run["traceback"]
    assert run["attempts"] == 1 and run["max_attempts"] == 1 and run["final"]
    [step] = failed["steps"]
    assert step["name"] == "reserve" and step["finished"] and step["output"] == {"ok": True}
    assert step["epoch"] == run["lease_epoch"] and step["since_previous"] >= 0
    assert step["attempt"] == 1 and step["retries"] == 0
    assert step["started_at"] is not None and step["duration"] >= 0
    assert failed["actions"] == {"cancel": False, "signal": False, "retry": True}

    waiting = client.get(f"/api/runs/{runs.waiting}").json()
    [pause] = waiting["pauses"]
    assert pause["id"] == runs.pause and pause["status"] == "pending"
    assert pause["request"] == {"amount": 40, "note": XSS}
    assert waiting["actions"] == {"cancel": True, "signal": True, "retry": False}

    dead = client.get(f"/api/runs/{runs.dead}").json()
    [entry] = dead["outbox"]
    assert entry["state"] == "dead" and entry["error"] and "smtp down" in entry["error"]
    assert [(r["id"], r["parent_id"]) for r in dead["tree"]] == [
        (runs.dead, None), (runs.child, runs.dead)]
    child = client.get(f"/api/runs/{runs.child}").json()
    assert [r["id"] for r in child["tree"]] == [runs.dead, runs.child]
    assert dead["spend"] == {"entries": [], "total": {}}

    missing = client.get("/api/runs/nope")
    assert missing.status_code == 404 and "nope" in missing.json()["error"]


def test_approvals_and_dead_letters(memory: tuple[TestClient, Runs, shoal.App]) -> None:
    client, runs, _ = memory
    [pause] = client.get("/api/approvals").json()["approvals"]
    assert pause["id"] == runs.pause and pause["workflow"] == "refund"
    assert pause["age"] >= 0 and pause["age"] + pause["expires_in"] == 86400
    [entry] = client.get("/api/dead-letters").json()["dead_letters"]
    assert entry["id"] == runs.entry and entry["topic"] == "email" and entry["dead"]


def test_in_process_pages(clock: VirtualClock) -> None:
    store = MemoryStore()
    app = shoal.App("shop", store=store, clock=clock)
    app.provider("openai", max_concurrent=4, requests_per_minute=100,
                 breaker=shoal.Breaker(failures=2))
    app.budget(per_tenant_day=5.0, tenants={"acme": 10.0})

    @app.cron("*/5 * * * *")
    async def sweep(ctx: shoal.RunContext, input: Any) -> None:
        return None

    asyncio.run(app.spend(1.5, tenant="acme"))
    with TestClient(shoal.web.asgi(app)) as client:
        [p] = client.get("/api/providers").json()["providers"]
        assert (p["name"], p["max_concurrent"], p["requests_per_minute"]) == ("openai", 4, 100)
        assert p["breaker"]["failures"] == 2 and p["open_until"] is None
        [b] = client.get("/api/budgets").json()["budgets"]
        assert b["per_tenant_day"] == 5.0 and b["tenants"] == {"acme": 10.0}
        assert b["spent_today"] == {"acme": 1.5}
        [s] = client.get("/api/cron").json()["schedules"]
        assert s["workflow"] == "sweep" and s["last_run"] is None
        assert s["last_tick"] <= clock.now() < s["next_tick"]
        ledger = client.get("/api/ledger").json()
        assert ledger["total"] == {"usd": 1.5} and ledger["next_after"] is None


# -- actions ---------------------------------------------------------------------------------


def test_cancel_and_refused_when_moved_on(memory: tuple[TestClient, Runs, shoal.App]) -> None:
    client, runs, _ = memory
    done = post(client, f"/api/runs/{runs.sleeping}/cancel")
    assert done.status_code == 200 and done.json()["run"]["status"] == "cancelled"
    again = post(client, f"/api/runs/{runs.sleeping}/cancel")
    assert again.status_code == 409 and again.json()["current"] == "cancelled"
    assert post(client, "/api/runs/nope/cancel").status_code == 404


def test_retry(memory: tuple[TestClient, Runs, shoal.App]) -> None:
    client, runs, _ = memory
    got = post(client, f"/api/runs/{runs.failed}/retry")
    assert got.status_code == 200 and got.json()["run"]["status"] == "queued"
    again = post(client, f"/api/runs/{runs.failed}/retry")
    assert again.status_code == 409 and again.json()["current"] == "queued"
    assert post(client, f"/api/runs/{runs.dead}/retry").status_code == 409   # succeeded


def test_signal(memory: tuple[TestClient, Runs, shoal.App]) -> None:
    client, runs, app = memory
    sent = post(client, f"/api/runs/{runs.sleeping}/signal", {"name": "go", "payload": [1]})
    assert sent.status_code == 200
    record = asyncio.run(app.store.inspect_run(runs.sleeping))
    assert record is not None and [(s.name, s.payload) for s in record.signals] == [("go", [1])]
    for body, field in (({"payload": 1}, "name"), ({"name": "  "}, "name"), ([1], "body"),
                        ({"name": "x", "payload": float("inf")}, "payload")):
        bad = client.post(f"/api/runs/{runs.sleeping}/signal",
                          content=json.dumps(body),
                          headers={"x-csrf-token": client.cookies["shoal_csrf"]})
        assert bad.status_code == 400 and bad.json()["field"] == field, (body, bad.text)
    not_json = client.post(f"/api/runs/{runs.sleeping}/signal", content=b"{oops",
                           headers={"x-csrf-token": client.cookies["shoal_csrf"]})
    assert not_json.status_code == 400 and not_json.json()["field"] == "body"
    ended = post(client, f"/api/runs/{runs.failed}/signal", {"name": "go"})
    assert ended.status_code == 409 and ended.json()["current"] == "failed"


def test_approve_and_deny(memory: tuple[TestClient, Runs, shoal.App]) -> None:
    client, runs, app = memory
    path = f"/api/approvals/{runs.pause}"
    missing = post(client, f"{path}/approve", {"reason": "fine"})
    assert missing.status_code == 400 and missing.json()["field"] == "by"
    ok = post(client, f"{path}/deny", {"by": "ana", "reason": "too much"})
    assert ok.status_code == 200
    assert ok.json()["pause"]["decision"] == {"approved": False, "data": None, "by": "ana",
                                              "reason": "too much"}
    late = post(client, f"{path}/approve", {"by": "bob"})
    assert late.status_code == 409 and "denied by ana" in late.json()["error"]
    assert post(client, "/api/approvals/nope/approve", {"by": "bob"}).status_code == 404
    assert asyncio.run(app.get_run(runs.waiting)).run_at is not None   # due: it continues


def test_redrive(memory: tuple[TestClient, Runs, shoal.App]) -> None:
    client, runs, _app = memory
    ok = post(client, f"/api/dead-letters/{runs.entry}/redrive")
    assert ok.status_code == 200
    entry = ok.json()["entry"]
    assert entry["state"] == "pending" and entry["attempts"] == 0
    assert client.get("/api/dead-letters").json()["dead_letters"] == []
    again = post(client, f"/api/dead-letters/{runs.entry}/redrive")
    assert again.status_code == 409 and "not dead-lettered" in again.json()["error"]
    assert post(client, "/api/dead-letters/nope/redrive").status_code == 404


# -- safety ----------------------------------------------------------------------------------


def test_csrf_is_required_on_every_post(memory: tuple[TestClient, Runs, shoal.App]) -> None:
    client, runs, app = memory
    path = f"/api/runs/{runs.sleeping}/cancel"
    assert client.post(path).status_code == 403
    assert client.post(path, headers={"x-csrf-token": "guess"}).status_code == 403
    foreign = post(client, path, headers={"origin": "https://evil.example"})
    assert foreign.status_code == 403 and "another site" in foreign.json()["error"]
    assert asyncio.run(app.get_run(runs.sleeping)).status == "sleeping"   # nothing changed
    same = post(client, path, headers={"origin": "http://testserver"})
    assert same.status_code == 200


def test_read_only_refuses_every_action(clock: VirtualClock) -> None:
    store = MemoryStore()
    runs = asyncio.run(populate(store, clock))
    app = shoal.App("shop", store=store, clock=clock)
    with TestClient(shoal.web.asgi(app, read_only=True)) as client:
        assert client.get("/api/config").json()["read_only"] is True
        detail = client.get(f"/api/runs/{runs.sleeping}").json()
        assert detail["actions"] == {"cancel": False, "signal": False, "retry": False}
        for path in (f"/api/runs/{runs.sleeping}/cancel", f"/api/runs/{runs.failed}/retry",
                     f"/api/approvals/{runs.pause}/approve",
                     f"/api/dead-letters/{runs.entry}/redrive"):
            refused = post(client, path, {"by": "ana"})
            assert refused.status_code == 403 and "read-only" in refused.json()["error"]
    assert asyncio.run(app.get_run(runs.sleeping)).status == "sleeping"
    assert len(asyncio.run(app.pending_pauses())) == 1


def test_token_bearer_and_login_cookie(clock: VirtualClock) -> None:
    store = MemoryStore()
    runs = asyncio.run(populate(store, clock))
    app = shoal.App("shop", store=store, clock=clock)
    with TestClient(shoal.web.asgi(app, token="s3cret")) as client:
        assert client.get("/api/overview").status_code == 401
        wrong = {"authorization": "Bearer nope"}
        assert client.get("/api/overview", headers=wrong).status_code == 401
        bearer = {"authorization": "Bearer s3cret"}
        assert client.get("/api/overview", headers=bearer).status_code == 200
        # a bearer call needs no CSRF token (no browser sends the header by itself)
        assert client.post(f"/api/runs/{runs.sleeping}/cancel",
                           headers=bearer).status_code == 200
        page = client.get("/", follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"] == "/login?next=%2F"
        form = client.get("/login?next=/runs")
        assert form.status_code == 200 and 'name="token"' in form.text
        csrf = client.cookies["shoal_csrf"]
        bad = client.post("/login", data={"token": "nope", "csrf_token": csrf, "next": "/runs"})
        assert bad.status_code == 401 and "shoal_session" not in client.cookies
        stale = client.post("/login", data={"token": "s3cret", "csrf_token": "x"})
        assert stale.status_code == 403
        ok = client.post("/login", data={"token": "s3cret", "csrf_token": csrf,
                                         "next": "//evil.example/"}, follow_redirects=False)
        assert ok.status_code == 303 and ok.headers["location"] == "/"
        cookie = next(v for k, v in ok.headers.multi_items() if k == "set-cookie"
                  and v.startswith("shoal_session="))
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "s3cret" not in cookie
        assert client.get("/api/overview").status_code == 200           # by the cookie
        no_csrf = client.post(f"/api/dead-letters/{runs.entry}/redrive")
        assert no_csrf.status_code == 403                                # a cookie is not enough
        assert post(client, f"/api/dead-letters/{runs.entry}/redrive").status_code == 200
        out = client.post("/logout", data={"csrf_token": csrf}, follow_redirects=False)
        assert out.status_code == 303
        assert client.get("/api/overview").status_code == 401


def test_the_store_url_is_shown_masked(clock: VirtualClock) -> None:
    store = MemoryStore()
    store.url = "postgresql://ana:hunter2@db.internal:5432/shop?password=hunter2"
    with TestClient(shoal.web.asgi(shoal.App("shop", store=store, clock=clock))) as client:
        got = client.get("/api/config")
        assert "hunter2" not in got.text and "ana:***@db.internal" in got.json()["store"]


def test_hostile_values_are_data(memory: tuple[TestClient, Runs, shoal.App]) -> None:
    client, runs, _ = memory
    got = client.get(f"/api/runs/{runs.hostile}")
    assert got.headers["content-type"] == "application/json"
    assert got.headers["x-content-type-options"] == "nosniff"
    run = got.json()["run"]
    assert run["input"] == {"why": XSS} and run["concurrency_key"] == XSS
    assert XSS in run["error"]
    login = client.get("/login", params={"next": "/" + XSS})
    assert "<script>alert(2)" not in login.text and "&lt;script&gt;" in login.text


def test_a_console_on_a_sqlite_url(tmp_path: Path, clock: VirtualClock) -> None:
    url = f"sqlite:///{tmp_path / 'shop.db'}"

    async def fill() -> Runs:
        store = shoal.App("shop", store=url).store
        await store.open()
        try:
            return await populate(store, clock)
        finally:
            await store.close()

    runs = asyncio.run(fill())
    console = shoal.web.asgi(url)                         # the namespace found in the store
    with TestClient(console) as client:
        client.get("/api/config")
        assert client.get("/api/config").json()["namespace"] == "shop"
        assert ids(client.get("/api/runs?status=failed")) == [runs.hostile, runs.failed]
        detail = client.get(f"/api/runs/{runs.dead}").json()
        assert [e["state"] for e in detail["outbox"]] == ["dead"]
        assert post(client, f"/api/approvals/{runs.pause}/approve",
                    {"by": "ana"}).status_code == 200
        assert post(client, f"/api/dead-letters/{runs.entry}/redrive").status_code == 200
        got = client.get("/api/overview").json()
        assert got["pending_approvals"] == 0 and sum(
            got["finished_per_minute"]["counts"]) == runs.done


def test_a_console_not_opened_says_why(tmp_path: Path) -> None:
    console = shoal.web.asgi(f"sqlite:///{tmp_path / 'x.db'}")
    client = TestClient(console)                     # no lifespan: never entered
    got = client.get("/api/overview")
    assert got.status_code == 503 and "lifespan" in got.json()["error"]


def test_shoal_web_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    got = CliRunner().invoke(cli, ["--store", f"sqlite:///{tmp_path / 'x.db'}", "web",
                                   "--host", "0.0.0.0"])
    assert got.exit_code == 1 and "--token" in got.output and "0.0.0.0" in got.output
