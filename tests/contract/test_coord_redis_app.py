"""The app over Redis: a Redlock quorum of three servers losing one, then two; Redis down when
the app starts. Real redis-server processes started by the test, a real clock, short leases."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from redis_support import Server, new_prefix, redlock, running_servers

import shoal
from shoal.stores.redis import RedisCoordStore

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


def test_addresses_carry_no_credentials() -> None:
    with pytest.raises(shoal.ConfigurationError) as e:
        shoal.App("x", store="memory://", coordination="redis://:s3cret@127.0.0.1:6379")
    assert "s3cret" not in str(e.value)
    assert "SHOAL_REDIS_PASSWORD" in str(e.value)
    with pytest.raises(shoal.ConfigurationError) as e:
        shoal.App("x", store="memory://",
                  coordination=["redis://a", "redis://b", "redis://u:pw@c", "redis://d"])
    assert str(e.value) == "Atomicity takes an odd number of addresses, 4 given."
