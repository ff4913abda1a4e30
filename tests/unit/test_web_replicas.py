"""The console's replicas and providers data (/api/replicas, /api/providers, the overview's
instances and open circuits) while Apps run: members with their version and heartbeat, slot
assignments, locks with their waiters and fencing tokens, meters, runs held, and each
provider's calls in flight, window use, 429 pause and breaker, all read without writing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx
import pytest

import shoal
import shoal.web
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock, settle

INTERVAL = 1.0


async def get(app: shoal.App, path: str) -> Any:
    """GET ``path`` of the console over ``app``, in this event loop (the Apps run in it)."""
    transport = httpx.ASGITransport(app=shoal.web.asgi(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        got = await http.get(path)
    assert got.status_code == 200, got.text
    return got.json()


def make(store: MemoryStore, clock: VirtualClock, name: str, version: str) -> shoal.App:
    app = shoal.App("shop", store=store, clock=clock, instance_id=name, version=version,
                    membership_interval=INTERVAL)

    @app.workflow(name="noop")
    async def noop(ctx: shoal.RunContext, input: Any) -> None:
        return None

    return app


async def until(clock: VirtualClock, done: Any, seconds: float = 10.0) -> None:
    """Advance the clock in small ticks until ``done()`` (a bool, or an awaitable of one)."""

    async def check() -> bool:
        got = done()
        return bool(await got if asyncio.iscoroutine(got) else got)

    for _ in range(int(seconds / 0.25)):
        if await check():
            return
        await clock.advance(0.25)
        await settle()
    assert await check(), "not reached in time"


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[VirtualClock, shoal.App, shoal.App, asyncio.Event]]:
    clock = VirtualClock(time.time())
    store = MemoryStore()
    a, b = make(store, clock, "a", "v1"), make(store, clock, "b", "v2")
    gate = asyncio.Event()

    @a.workflow(name="hold")
    async def hold(ctx: shoal.RunContext, input: Any) -> None:
        await gate.wait()

    async with a, b:
        await until(clock, lambda: a.slots(4) is not None and b.slots(4) is not None)
        yield clock, a, b, gate
        gate.set()


async def test_replicas_show_members_slots_locks_meters_and_runs_held(
    cluster: tuple[VirtualClock, shoal.App, shoal.App, asyncio.Event],
) -> None:
    clock, a, b, _ = cluster
    run = await a.dispatch("hold", None)
    await until(clock, lambda: _status_is(a, run.id, shoal.RunStatus.RUNNING))
    held = await a.lock("settle").__aenter__()
    waiting = asyncio.create_task(b.lock("settle").__aenter__())
    await settle()
    await a.meter(["calls"], [5000])

    got = await get(a, "/api/replicas")
    assert got["membership"]["available"] and got["complete"]
    assert got["coordination"] == "the run store"
    live = {i["id"]: i for i in got["instances"]}
    assert set(live) == {"a", "b"}
    for name, version in (("a", "v1"), ("b", "v2")):
        one = live[name]
        assert one["live"] is True and one["version"] == version
        assert clock.now() - 2 * INTERVAL <= one["last_heartbeat"] <= clock.now()
        assert one["heartbeat_until"] > clock.now()
        assert [m.rpartition("/")[0] for m in one["members"]] == [name]
        assert "membership" in one["sources"]
    assert live["a"]["runs_held"] == 1 and live["b"]["runs_held"] == 0
    assert live["a"]["lease_until"] == (await a.get_run(run.id)).lease_expires_at
    assert live["a"]["sources"] == ["membership", "runs", "registrations"]
    assert live["a"]["workflows"] == ["hold", "noop"] and live["a"]["registered_at"]
    assert live["b"]["sources"] == ["membership", "registrations"]
    assert live["b"]["workflows"] == ["noop"]
    slots = sorted((live[n]["slot"]["index"], live[n]["slot"]["of"]) for n in ("a", "b"))
    assert slots == [(0, 2), (1, 2)]
    assert [s["state"] for s in got["slots"]] == ["owns", "owns"]
    assert [s["instance"] for s in got["slots"]] == sorted(
        ["a", "b"], key=lambda n: live[n]["members"][0])
    assert got["membership"]["roster"] == [s["member"] for s in got["slots"]]

    [lock] = got["locks"]
    assert (lock["key"], lock["token"], lock["holder"], lock["holder_instance"]) == (
        "settle", held.token, held.holder, "a")
    assert lock["expires_at"] > clock.now() and lock["expires_in"] > 0
    [waiter] = lock["waiters"]
    assert waiter["instance"] == "b" and waiter["holder"].startswith("b/")
    [meter] = got["meters"]
    assert meter["key"] == "calls" and 0 < meter["debt_ms"] <= 5000

    overview = await get(a, "/api/overview")
    assert sorted(i["id"] for i in overview["instances"]) == ["a", "b"]
    assert overview["membership"] == {"available": True, "error": None}

    await a._locks.release(held)
    waiter_lock = await asyncio.wait_for(waiting, 5)
    assert waiter_lock.token == held.token + 1
    await b._locks.release(waiter_lock)
    assert (await get(a, "/api/replicas"))["locks"] == []


async def test_a_stopped_replica_leaves_the_live_list_and_stays_registered(
    cluster: tuple[VirtualClock, shoal.App, shoal.App, asyncio.Event],
) -> None:
    clock, a, b, _ = cluster
    await b.close()
    got = await get(a, "/api/replicas")
    assert [i["id"] for i in got["instances"]] == ["a"]
    assert [r["id"] for r in got["registered"]] == ["b"]
    await until(clock, lambda: a.slots(4) == [0, 1, 2, 3])
    got = await get(a, "/api/replicas")
    assert [(s["instance"], s["index"], s["of"], s["state"]) for s in got["slots"]] == [
        ("a", 0, 1, "owns")]
    assert [i["id"] for i in (await get(a, "/api/overview"))["instances"]] == ["a"]


async def test_the_console_reads_without_writing(
    cluster: tuple[VirtualClock, shoal.App, shoal.App, asyncio.Event],
) -> None:
    """A console whose clock is far ahead sees every row ended, and deletes none of them."""
    clock, a, _, _ = cluster
    await a.meter(["calls"], [5000])
    ahead = shoal.App("shop", store=a.store, clock=VirtualClock(clock.now() + 3600))
    got = await get(ahead, "/api/replicas")
    assert got["membership"]["available"] and got["meters"] == []
    assert all(i["live"] is False for i in got["instances"])
    again = await get(a, "/api/replicas")
    assert sorted(i["id"] for i in again["instances"] if i["live"]) == ["a", "b"]
    assert [m["key"] for m in again["meters"]] == ["calls"]


async def test_without_coordination_the_store_alone_lists_the_instances() -> None:
    clock = VirtualClock(time.time())
    store = MemoryStore()
    worker = make(store, clock, "w", "v1")
    async with worker:
        pass
    console = shoal.App("shop", store=store, clock=clock)
    console._coord = _no_coordination  # type: ignore[method-assign]
    got = await get(console, "/api/replicas")
    assert got["membership"]["available"] is False
    assert "coordination" in got["membership"]["error"]
    [one] = got["instances"]
    assert (one["id"], one["live"], one["version"], one["sources"]) == (
        "w", None, None, ["registrations"])
    assert got["slots"] == got["locks"] == got["meters"] == [] and not got["complete"]
    assert [i["id"] for i in (await get(console, "/api/overview"))["instances"]] == ["w"]


async def _status_is(app: shoal.App, run_id: str, status: shoal.RunStatus) -> bool:
    return (await app.get_run(run_id)).status == status


def _no_coordination() -> Any:
    raise shoal.ConfigurationError("The store keeps no coordination (shoal.ports.CoordStore).")


async def test_providers_show_calls_windows_pauses_and_the_breaker() -> None:
    clock = VirtualClock(time.time())
    app = shoal.App("shop", store=MemoryStore(), clock=clock)
    openai = app.provider("openai", max_concurrent=4, requests_per_minute=100,
                          tokens_per_minute=10_000,
                          breaker=shoal.Breaker(failures=2, window=60, cooldown=30))
    plain = app.provider("plain", max_concurrent=2)
    async with app:
        async with openai.call(tokens=300):
            pass
        inside = asyncio.Event()
        leave = asyncio.Event()

        async def busy() -> None:
            async with openai.call(tokens=50):
                inside.set()
                await leave.wait()

        task = asyncio.create_task(busy())
        await asyncio.wait_for(inside.wait(), 5)
        [p, q] = (await get(app, "/api/providers"))["providers"]
        assert p["name"] == "openai" and p["error"] is None
        assert p["state"] == {"in_flight": 1, "requests_last_minute": 2,
                              "tokens_last_minute": 350, "paused_until": None,
                              "breaker": "closed", "open_until": None,
                              "trial_in_flight": False, "failures_in_window": 0,
                              "concurrency_limit": 4}
        assert q["state"]["breaker"] is None and q["state"]["failures_in_window"] is None
        leave.set()
        await task

        for _ in range(2):
            with pytest.raises(ConnectionError):
                async with openai.call():
                    raise ConnectionError("provider down")
        async with plain.call() as call:
            call.rate_limited(retry_after=20)
        [p, q] = (await get(app, "/api/providers"))["providers"]
        assert p["state"]["in_flight"] == 0
        assert p["state"]["breaker"] == "open" and p["state"]["failures_in_window"] == 2
        assert p["open_until"] == pytest.approx(clock.now() + 30)
        assert q["state"]["paused_until"] == pytest.approx(clock.now() + 20)
        assert q["paused_until"] == q["state"]["paused_until"]
        assert p["state"]["paused_until"] is None
        assert [c["name"] for c in (await get(app, "/api/overview"))["open_circuits"]] == [
            "openai"]
        await clock.advance(31)
        [p, q] = (await get(app, "/api/providers"))["providers"]
        assert p["state"]["breaker"] == "half-open" and p["open_until"] is None
        assert not p["state"]["trial_in_flight"] and q["state"]["paused_until"] is None
        async with openai.call():
            [p, _] = (await get(app, "/api/providers"))["providers"]
            assert p["state"]["trial_in_flight"] and p["state"]["breaker"] == "half-open"
        [p, _] = (await get(app, "/api/providers"))["providers"]
        assert p["state"]["breaker"] == "closed" and p["state"]["failures_in_window"] == 0
