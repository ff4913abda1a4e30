"""The app over Redis: a Redlock quorum of three servers losing one, then two; Redis down when
the app starts. Real redis-server processes started by the test, a real clock, short leases."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis_support import (
    URL,
    Server,
    new_prefix,
    redlock,
    running_servers,
    server_prefix,
    silent_server,
)

import shoal
from shoal.backends.redis import RedisCoordStore

LEASE = 1.5


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    with running_servers(3) as trio:
        yield trio


def redlock_app(trio: list[Server], instance: str, prefix: str) -> shoal.App:
    quorum = redlock(trio, prefix, timeout=0.3)
    return shoal.App("redlock", store="memory://", coordination=quorum, instance_id=instance,
                     lease=LEASE, membership_interval=0.2)


async def test_redlock_survives_one_server_and_gives_up_after_a_lease_without_a_majority(
    servers: list[Server],
) -> None:
    prefix = new_prefix()
    a = redlock_app(servers, "a", prefix)
    b = redlock_app(servers, "b", prefix)
    async with a.open(), b.open():
        async with a.lock("k") as first:
            pass
        servers[0].stop()                                  # one of three down: still a majority
        async with b.lock("k") as second:
            assert second.token > first.token
            await asyncio.sleep(LEASE)                     # renewed through the outage
            assert not second.signal.aborted
        holder = await a.lock("k").__aenter__()
        servers[1].stop()                                  # two of three down: no majority
        started = time.monotonic()
        await asyncio.wait_for(holder.signal.wait(), LEASE + 2)
        assert time.monotonic() - started <= LEASE + 1.0, "the signal fires once the lease is out"
        assert isinstance(holder.signal.reason, shoal.LockLostError)
        waiter = asyncio.create_task(b.lock("k").__aenter__())
        started = time.monotonic()
        with pytest.raises(shoal.StoreUnavailableError, match="majority"):
            await asyncio.wait_for(waiter, LEASE + 3)      # nobody gets the lock without one
        assert time.monotonic() - started >= LEASE, "it asked for a whole lease first"
        waiter = asyncio.create_task(b.lock("k").__aenter__())
        await asyncio.sleep(LEASE / 2)
        assert not waiter.done()
        await a._locks.release(holder)
        servers[0].start()                                 # a majority again (restarted empty)
        got = await asyncio.wait_for(waiter, 10)
        assert got.token > holder.token, "the remembering server keeps tokens increasing"
        await b._locks.release(got)


async def test_redis_down_at_start_then_back(servers: list[Server]) -> None:
    redis_server = servers[0]
    redis_server.stop()
    app = shoal.App("down", store="memory://", instance_id="solo", lease=LEASE,
                    membership_interval=0.2,
                    coordination=RedisCoordStore(redis_server.url, prefix=new_prefix(),
                                                 socket_timeout=0.3))
    started = time.monotonic()
    async with app:
        assert time.monotonic() - started < 2, "an unreachable Redis never holds up start()"
        await asyncio.sleep(1.0)
        assert app.slots(4) is None
        with pytest.raises(shoal.StoreUnavailableError):
            await app.meter(["m"], [1])
        ready = await app.check_readiness()
        assert ready.status == shoal.HealthStatus.DEGRADED, ready
        redis_server.start()
        assigned = asyncio.Event()
        app.on_assigned(lambda a: assigned.set() if a is not None else None)
        await asyncio.wait_for(assigned.wait(), 5)
        assert app.slots(4) == [0, 1, 2, 3]
        assert await app.meter(["m"], [1]) == [1]
        assert (await app.check_readiness()).status == shoal.HealthStatus.HEALTHY


TIMEOUT = 0.3       # the stores' socket_timeout in the tests below


@pytest.fixture(params=["wrong port", "wrong database", "rediss:// to a plain server",
                        "redis:// to a TLS port", "a server that never answers"])
async def misconfigured(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, str]]:
    """An address as a deployment can get it wrong, and what the error must say."""
    case = request.param
    if case == "a server that never answers":
        async with silent_server() as url:
            yield url, f"no answer within {TIMEOUT:g} s"
        return
    server = Server(tls=case == "redis:// to a TLS port")
    try:
        if case == "wrong port":
            yield server.url, f"127.0.0.1:{server.port}"      # nothing started there
            return
        server.start()
        if case == "wrong database":
            yield f"{server.url}/99", "refused database 99"  # 16 databases by default
        elif case == "rediss:// to a plain server":
            yield server.url.replace("redis://", "rediss://"), "check the scheme too"
        else:
            yield server.url.replace("rediss://", "redis://"), "starts with rediss://"
    finally:
        server.cleanup()


async def test_a_misconfigured_redis_fails_every_call_within_a_documented_time(
    misconfigured: tuple[str, str],
) -> None:
    """meter and provider calls raise StoreUnavailableError within the socket timeout (one
    store call, nothing given back first); a lock request once it could not ask for a whole
    lease (docs/coordination.md: lease + 4 socket timeouts + 1 s at most); slots stay None."""
    url, says = misconfigured
    app = shoal.App("misconfigured", store="memory://", instance_id="solo", lease=LEASE,
                    membership_interval=0.2,
                    coordination=RedisCoordStore(url, prefix=new_prefix(),
                                                 socket_timeout=TIMEOUT))
    heard: list[object] = []
    async with app:
        app.on_assigned(heard.append)
        llm = app.provider("llm", max_concurrent=2, requests_per_minute=100,
                           breaker=shoal.Breaker())

        async def call() -> None:
            async with llm.call(tokens=10, timeout=30):
                raise AssertionError("the call went without a store")

        async def lock() -> None:
            async with app.lock("settlement"):
                raise AssertionError("locked without a store")

        for what, op, least, most in (
            ("meter", app.meter(["m"], [1]), 0.0, TIMEOUT + 0.5),
            ("provider.call", call(), 0.0, TIMEOUT + 0.5),
            ("lock", lock(), LEASE - 0.1, LEASE + 4 * TIMEOUT + 1.0 + 0.5),
        ):
            started = time.monotonic()
            with pytest.raises(shoal.StoreUnavailableError) as e:
                await asyncio.wait_for(op, most + 5)
            took = time.monotonic() - started
            assert least <= took <= most, f"{what} took {took:.2f} s"
            assert says in str(e.value), (what, str(e.value))
        assert app.slots(4) is None and heard == [None]


def test_addresses_carry_no_credentials() -> None:
    with pytest.raises(shoal.ConfigurationError) as e:
        shoal.App("x", store="memory://", coordination="redis://:s3cret@127.0.0.1:6379")
    assert "s3cret" not in str(e.value)
    assert "SHOAL_REDIS_PASSWORD" in str(e.value)
    with pytest.raises(shoal.ConfigurationError) as e:
        shoal.App("x", store="memory://",
                  coordination=["redis://a", "redis://b", "redis://u:pw@c", "redis://d"])
    assert str(e.value) == "Atomicity takes an odd number of addresses, 4 given."


async def test_a_console_on_a_store_url_reads_the_workers_redis_membership(
    tmp_path: Path,
) -> None:
    """``shoal.web.asgi(url, coordination=...)``, as ``shoal web --coordination`` makes it:
    the replicas page reads the membership the workers keep in Redis, not the run store's."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    import shoal.web

    with server_prefix() as prefix:
        url = f"sqlite:///{tmp_path / 'shop.db'}"
        worker = shoal.App("shop", store=url, coordination=RedisCoordStore(URL, prefix=prefix),
                           instance_id="w-1", version="v9", membership_interval=0.2)

        @worker.workflow
        async def noop(ctx: shoal.RunContext, input: object) -> None:
            return None

        async with worker:
            await _slots_assigned(worker, timeout=10.0)
            console = shoal.web.asgi(url, coordination=RedisCoordStore(URL, prefix=prefix))
            seen = await asyncio.to_thread(_replicas, TestClient(console))
            alone = await asyncio.to_thread(_replicas, TestClient(shoal.web.asgi(url)))
        [one] = seen["instances"]
        assert (one["id"], one["live"], one["version"], one["slot"]) == (
            "w-1", True, "v9", {"index": 0, "of": 1})
        assert seen["coordination"] == "RedisCoordStore"
        # without coordination=, the run store's membership is empty: w-1 is registered only
        assert alone["instances"] == [] and [r["id"] for r in alone["registered"]] == ["w-1"]


async def _slots_assigned(app: shoal.App, timeout: float) -> None:
    """Wait until ``app`` owns its slots (its first roster is granted); fail after ``timeout``
    seconds (a bound, not a speed check)."""
    deadline = time.monotonic() + timeout
    while app.slots(4) is None:
        assert time.monotonic() < deadline, f"no slots assigned within {timeout} s"
        await asyncio.sleep(0.05)


def _replicas(client: object) -> dict[str, object]:
    from starlette.testclient import TestClient

    assert isinstance(client, TestClient)
    with client:
        got = client.get("/api/replicas")
    assert got.status_code == 200, got.text
    data: dict[str, object] = got.json()
    return data
