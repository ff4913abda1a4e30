"""The coordination contract on Redis (one server) and on Redlock (three), plus what only they
have to show: a quorum that survives a stopped server, credentials kept out of addresses, and a
store that starts while Redis is down and carries on once it is back. The servers (the test
server, or ``redis-server`` processes of the test's own), key prefixes, and the skip without a
server (a failure under ``CI``) are ``redis_support.py``'s; the fixtures ``prefix``, ``trio``
and ``rl_prefix`` are ``conftest.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from handoffs import LockManagerHandOffs
from redis_support import (
    URL,
    OnTheTrio,
    Server,
    drop,
    new_prefix,
    opened,
    redlock,
    running_servers,
    sync_client,
)

from shoal.backends.memory import MemoryStore
from shoal.backends.redis import RedisCoordStore, Redlock
from shoal.errors import ConfigurationError, StoreUnavailableError
from shoal.ports import CoordStore
from shoal.testing.contract import NS, T0, CoordContract, CoordDifferential
from shoal.testing.contract.coordination import LEASE, grant, queued
from shoal.types import LockGrant

# -- retention: Redis collects its keys by itself ----------------------------------------------
#
# The contract's prune tests do not apply here: prune_coordination deletes nothing on Redis (every
# key it would concern carries a real-time cleanup expiry, and the fencing counters must stay).
# The Redis classes override them with what Redis does instead.


def _pttls(url: str, prefix: str) -> dict[str, int]:
    """Every key under ``prefix`` (without it) -> its PTTL."""
    with sync_client(url) as client:
        return {k.decode()[len(prefix) + 1:]: int(client.pttl(k))
                for k in client.scan_iter(match=f"{prefix}:*")}


async def _prune_is_left_to_expiries(coord: CoordStore, url: str, prefix: str) -> None:
    await coord.meter(NS, ["drained"], [1000], T0)          # empty from T0 + 1
    await grant(coord, ["k"], "h1")
    await queued(coord, ["k"], "gone", T0 + 1)              # its waiter lease ends T0 + 11
    assert await coord.prune_coordination(NS, T0 + 20, 100) == 0
    ttl = _pttls(url, prefix)
    for row in ("meter:drained", "waiting:k", "queue:k"):
        assert ttl[f"{NS}:{row}"] >= 3_600_000 - 60_000, (row, ttl)   # a cleanup expiry
    assert ttl[f"{NS}:fence:k"] == -1, ttl                  # the fencing counter stays
    assert await coord.meter(NS, ["drained"], [0], T0 + 20) == [0]
    assert (await grant(coord, ["k"], "h2", T0 + 20)).token == 2


async def _prune_deletes_nothing(coord: CoordStore) -> None:
    await coord.meter(NS, [f"m{i}" for i in range(5)], [10] * 5, T0)
    assert await coord.prune_coordination(NS, T0 + 1, 2) == 0
    assert await coord.meter(NS, [f"m{i}" for i in range(5)], [0] * 5, T0 + 1) == [0] * 5


# -- one server -------------------------------------------------------------------------------


class TestRedisCoordination(CoordContract, CoordDifferential, LockManagerHandOffs):
    differential_seeds = (20261129,)
    differential_calls = 400

    @pytest.fixture
    async def coord(self, prefix: str) -> AsyncIterator[RedisCoordStore]:
        async with opened(RedisCoordStore(URL, prefix=prefix)) as s:
            yield s

    @pytest.fixture
    async def other(self, prefix: str) -> AsyncIterator[RedisCoordStore]:
        """A second store object (its own connections) over the same keys."""
        async with opened(RedisCoordStore(URL, prefix=prefix)) as s:
            yield s

    # not applicable on Redis (see _prune_is_left_to_expiries): what Redis does instead
    async def test_prune_deletes_drained_meters_and_ended_waiters(  # type: ignore[override]
        self, coord: CoordStore, prefix: str
    ) -> None:
        await _prune_is_left_to_expiries(coord, URL, prefix)

    async def test_prune_deletes_at_most_its_limit(self, coord: CoordStore) -> None:
        await _prune_deletes_nothing(coord)


async def test_fencing_and_ticket_counters_never_expire_and_rows_do(
    prefix: str,
) -> None:
    s = RedisCoordStore(URL, prefix=prefix)
    await s.open()
    try:
        await grant(s, ["k"], "h1")
        await queued(s, ["k"], "h2", T0 + 1)
        await s.meter(NS, ["m"], [1000], T0)
        await s.heartbeat(NS, "a", None, T0, 15, 10)
        await s.heartbeat(NS, "a", None, T0 + 10, 15, 10)
        with sync_client(URL) as client:
            ttl = {k.decode(): client.pttl(k) for k in client.scan_iter(match=f"{prefix}:*")}
        base = f"{prefix}:{NS}"
        assert ttl[f"{base}:fence:k"] == -1 and ttl[f"{base}:tickets"] == -1, ttl
        assert ttl[f"{base}:roster"] == -1, ttl
        for row in ("lock:k", "queue:k", "waiting:k", "meter:m", "members"):
            assert ttl[f"{base}:{row}"] >= 3_600_000 - 60_000, (row, ttl)
    finally:
        await s.close()


async def test_floats_come_back_exactly(prefix: str) -> None:
    s = RedisCoordStore(URL, prefix=prefix)
    ref = MemoryStore()
    await s.open()
    try:
        now, lease = T0 + 0.1 + 0.2, 1 / 3
        for store in (s, ref):
            g = await store.lock_acquire(NS, ["k"], "h1", lease, now)
            assert g == LockGrant(1, now + lease)
        calls = [(["a", "b"], [0.1, 1 / 3], T0 + 0.7), (["a", "a"], [2.5e-7, 1e9], T0 + 1.3),
                 (["b"], [0.0], T0 + 0.9)]
        for keys, deltas, at in calls:
            assert await s.meter(NS, keys, deltas, at) == await ref.meter(NS, keys, deltas, at)
    finally:
        await s.close()


async def test_namespaces_with_separators_never_meet(prefix: str) -> None:
    s = RedisCoordStore(URL, prefix=prefix)
    await s.open()
    try:
        await grant(s, ["b:lock:c"], "h1", ns="a")
        await grant(s, ["c"], "h2", ns="a:lock:b")
        assert await s.meter("x:meter:y", ["z"], [5], T0) == [5]
        assert await s.meter("x", ["y:meter:z"], [0], T0) == [0]
    finally:
        await s.close()


# -- addresses and outages --------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "redis://user:hunter2@127.0.0.1:6379/0",
    "redis://:hunter2@127.0.0.1:6379",
    "rediss://default:hunter2@redis.example.com:6380/1",
])
def test_credentials_in_the_address_are_refused_with_the_password_masked(url: str) -> None:
    with pytest.raises(ConfigurationError) as e:
        RedisCoordStore(url)
    message = str(e.value)
    assert "hunter2" not in message and "***" in message, message
    assert "password=" in message and "SHOAL_REDIS_PASSWORD" in message, message


def test_a_password_in_the_query_is_refused_without_showing_it() -> None:
    with pytest.raises(ConfigurationError) as e:
        RedisCoordStore("redis://127.0.0.1:6379/0?password=hunter2")
    assert "hunter2" not in str(e.value)


def test_addresses_that_are_not_redis_are_refused() -> None:
    for url in ("http://127.0.0.1:6379", "redis://127.0.0.1:6379/zero"):
        with pytest.raises(ConfigurationError):
            RedisCoordStore(url)


@pytest.fixture
def down_port() -> Iterator[Server]:
    server = Server()
    yield server
    server.cleanup()


async def test_a_store_opens_while_redis_is_down_and_works_once_it_is_back(
    down_port: Server,
) -> None:
    s = RedisCoordStore(down_port.url, password=None, socket_timeout=0.5, prefix=new_prefix())
    await s.open()
    try:
        for op in (lambda: s.lock_acquire(NS, ["k"], "h1", LEASE, T0), s.ping,
                   lambda: s.meter(NS, ["m"], [1], T0)):
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError) as e:
                await op()
            assert time.monotonic() - started < 1.5
            assert f"127.0.0.1:{down_port.port}" in str(e.value)
        async with s.lock_watch(NS, ["k"], "h1") as watch:  # a watch does not raise either
            down_port.start()
            await asyncio.wait_for(watch.wait(), 5.0)     # the connection woke it
            g = await s.lock_acquire(NS, ["k"], "h1", LEASE, T0)
            assert isinstance(g, LockGrant)
    finally:
        await s.close()


async def test_a_password_never_shows_in_an_unavailable_error(down_port: Server) -> None:
    s = RedisCoordStore(down_port.url, password="hunter2", socket_timeout=0.3)
    await s.open()
    try:
        with pytest.raises(StoreUnavailableError) as e:
            await s.ping()
        assert "hunter2" not in str(e.value) and "hunter2" not in repr(s)
    finally:
        await s.close()


async def test_a_restart_of_redis_wakes_every_watch_and_the_store_carries_on(
    down_port: Server,
) -> None:
    down_port.start()
    s = RedisCoordStore(down_port.url, socket_timeout=0.5, prefix=new_prefix())
    await s.open()
    try:
        async with s.lock_watch(NS, ["k"], "h2") as watch:
            waiting = asyncio.ensure_future(watch.wait())
            await asyncio.sleep(0.05)
            assert not waiting.done()
            down_port.stop()
            down_port.start()
            await asyncio.wait_for(waiting, 5.0)
            await grant(s, ["k"], "h1")
            await queued(s, ["k"], "h2")
            # and the new pub/sub connection hears another handle's release
            other = RedisCoordStore(down_port.url, prefix=s.prefix)
            await other.open()
            try:
                waiting = asyncio.ensure_future(watch.wait())
                await asyncio.sleep(0.05)
                assert not waiting.done()
                await other.lock_release(NS, ["k"], "h1")
                await asyncio.wait_for(waiting, 3.0)
            finally:
                await other.close()
    finally:
        await s.close()


# -- Redlock over three servers ---------------------------------------------------------------


class TestRedlockCoordination(OnTheTrio, CoordContract, LockManagerHandOffs):
    # FIFO is best effort across three queues: a split vote costs a few asks (about 1 per
    # acquisition mostly, up to ~2 seen; 7-24 when every waiter was woken)
    refused_per_handoff = 4.0

    @pytest.fixture
    def coord(self, quorum: Redlock) -> Redlock:
        return quorum

    # not applicable on Redis (see _prune_is_left_to_expiries): what Redis does instead, on the
    # first server (meters live there only; lock keys expire alike on every server)
    async def test_prune_deletes_drained_meters_and_ended_waiters(  # type: ignore[override]
        self, coord: CoordStore, trio: list[Server], rl_prefix: str
    ) -> None:
        await _prune_is_left_to_expiries(coord, trio[0].url, rl_prefix)

    async def test_prune_deletes_at_most_its_limit(self, coord: CoordStore) -> None:
        await _prune_deletes_nothing(coord)


def test_redlock_takes_an_odd_number_of_servers() -> None:
    stores = [RedisCoordStore(f"redis://127.0.0.1:{6379 + i}") for i in range(3)]
    assert isinstance(Redlock(stores), CoordStore) and isinstance(stores[0], CoordStore)
    stores = stores[:2]
    with pytest.raises(ConfigurationError, match="odd number of addresses, 2 given"):
        Redlock(stores)
    with pytest.raises(ConfigurationError, match="0 given"):
        Redlock([])


@pytest.fixture
def own_trio() -> Iterator[list[Server]]:
    """Three servers of this test's own, which it may stop."""
    with running_servers(3) as servers:
        yield servers


async def test_redlock_holds_with_one_server_of_three_stopped(own_trio: list[Server]) -> None:
    r = redlock(own_trio, new_prefix(), timeout=0.5)
    await r.open()
    try:
        g1 = await grant(r, ["k"], "h1")
        own_trio[2].stop()
        assert await r.lock_renew(NS, ["k"], "h1", LEASE, T0 + 5)
        await queued(r, ["k"], "h2", T0 + 6)
        await r.lock_release(NS, ["k"], "h1")
        g2 = await grant(r, ["k"], "h2", T0 + 7)
        assert g2.token > g1.token
        async with r.lock_watch(NS, ["k"], "h3") as watch:
            await queued(r, ["k"], "h3", T0 + 8)
            await r.lock_release(NS, ["k"], "h2")
            await asyncio.wait_for(watch.wait(), 3.0)
        await grant(r, ["k"], "h3", T0 + 8)
        assert await r.meter(NS, ["m"], [5], T0) == [5]     # the first server answers
    finally:
        await r.close()


async def test_redlock_hands_off_at_once_with_one_server_of_three_stopped(
    own_trio: list[Server],
) -> None:
    """A watch made while a server is known to be down does not wait for that server's
    subscription, and the next waiter is woken by the two others."""
    r = redlock(own_trio, new_prefix(), timeout=1.0)
    await r.open()
    try:
        async with r.lock_watch(NS, ["k"], "h0"):       # the pub/sub connections are up
            pass
        own_trio[1].stop()
        await asyncio.sleep(0.3)                         # the listener has seen it drop
        await grant(r, ["k"], "h1")
        started = time.monotonic()
        async with r.lock_watch(NS, ["k"], "h2") as watch:
            assert time.monotonic() - started < 0.5, "it waited for the stopped server"
            await queued(r, ["k"], "h2", T0 + 1)
            await r.lock_release(NS, ["k"], "h1")
            started = time.monotonic()
            await asyncio.wait_for(watch.wait(), 3.0)
            assert time.monotonic() - started < 0.5
        await grant(r, ["k"], "h2", T0 + 1)
    finally:
        await r.close()


async def test_redlock_waits_for_a_majority_of_wake_ups_without_spinning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A waiter named by one server of three waits the grace for a second one asleep: before,
    each round of that wait also waited on the watch already done, so it returned at once and
    the grace was a busy loop (about 4000 rounds and 50 ms of CPU per such wake-up)."""
    from shoal.backends._watches import EventWatch
    from shoal.backends.redis.redlock import _QUORUM_GRACE, _QuorumWatch

    watches = [EventWatch(NS, ["k"], "h") for _ in range(3)]
    rounds = [0]
    real = asyncio.wait

    async def counted(*args: object, **kwargs: object) -> object:
        rounds[0] += 1
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(asyncio, "wait", counted)
    watches[0].event.set()                                  # one server named it, no other
    started = time.monotonic()
    await _QuorumWatch(watches, 2).wait()
    assert time.monotonic() - started >= _QUORUM_GRACE * 0.9
    assert rounds[0] <= 5, f"{rounds[0]} rounds of asyncio.wait in one grace"
    assert not watches[0].event.is_set(), "its wake-up was consumed"


async def test_redlock_grants_nothing_without_a_majority_and_a_holder_loses_it(
    own_trio: list[Server],
) -> None:
    r = redlock(own_trio, new_prefix(), timeout=0.5)
    await r.open()
    try:
        g1 = await grant(r, ["k"], "h1")
        own_trio[1].stop()
        own_trio[2].stop()
        started = time.monotonic()
        # too few answer to tell: unavailable (the lock layer retries until its lease runs out,
        # then sets the holder's signal), never a confirmed renewal
        with pytest.raises(StoreUnavailableError, match="majority"):
            await r.lock_renew(NS, ["k"], "h1", LEASE, T0 + 5)
        # and so is a request (the lock layer asks again, and gives up after a lease of this)
        with pytest.raises(StoreUnavailableError, match=r"only 1 of 3 servers .* majority \(2\)"):
            await r.lock_acquire(NS, ["other"], "h2", LEASE, T0 + 5)
        await r.lock_release(NS, ["k"], "h1")                # no error either
        assert time.monotonic() - started < 3.0
        # the servers come back (empty: they kept nothing): a majority grants again, and the
        # token still goes up, since the first server remembers it
        own_trio[1].start()
        own_trio[2].start()
        g2 = await grant(r, ["k"], "h3", T0 + 6)
        assert g2.token > g1.token
        assert await r.lock_renew(NS, ["k"], "h3", LEASE, T0 + 7)
    finally:
        await r.close()


async def test_redlock_tokens_increase_across_a_minority_that_forgot(
    own_trio: list[Server],
) -> None:
    """A server restarted empty counts from 0 again; the majority's raised counters keep the
    tokens going up all the same."""
    r = redlock(own_trio, new_prefix(), timeout=0.5)
    await r.open()
    try:
        tokens = []
        for i, victim in enumerate([0, 1, 2, 0]):
            g = await grant(r, ["k"], f"h{i}", T0 + i)
            tokens.append(g.token)
            await r.lock_release(NS, ["k"], f"h{i}")
            own_trio[victim].stop()
            own_trio[victim].start()
        assert tokens == sorted(set(tokens)), tokens
    finally:
        await r.close()


async def test_redlock_split_votes_resolve(trio: list[Server]) -> None:
    """Contenders asking at once on three servers may split them; the partial grants are given
    back, and every contender is served once, with increasing tokens."""
    prefix = new_prefix()
    locks = [redlock(trio, prefix) for _ in range(3)]
    for r in locks:
        await r.open()
    try:
        holding: list[str] = []
        tokens: list[int] = []

        async def contender(r: Redlock, name: str) -> None:
            async with r.lock_watch(NS, ["k"], name) as watch:
                while True:
                    got = await r.lock_acquire(NS, ["k"], name, LEASE, T0)
                    if isinstance(got, LockGrant):
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(watch.wait(), 0.3)
            holding.append(name)
            assert len(holding) == 1, holding
            tokens.append(got.token)
            await asyncio.sleep(0.001)
            holding.remove(name)
            await r.lock_release(NS, ["k"], name)

        await asyncio.wait_for(asyncio.gather(
            *(contender(locks[i % 3], f"c{i}") for i in range(9))), 20)
        assert tokens == sorted(set(tokens)) and len(tokens) == 9
    finally:
        for r in locks:
            await r.close()
        for server in trio:
            drop(server.url, prefix)
