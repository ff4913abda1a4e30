"""The rate-limit contract on Redis (one server) and on Redlock (three servers, the rate limits on
the first), plus what only Redis has to show: which keys expire, which are pruned and which never
go, the ledger as a stream read in pages, floats that come back exactly, and the same answers as
the memory reference over random calls (``RateDifferential``'s, and a window near its limit)
(servers, key prefixes, and the skip without a server or failure under ``CI``:
``redis_support.py``; the fixtures ``prefix``, ``trio`` and ``rl_prefix``: ``conftest.py``).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis_support import URL, OnTheTrio, Server, opened, redlock, sync_client

import shoal
from shoal.backends.memory import MemoryStore
from shoal.backends.redis import RedisCoordStore, Redlock
from shoal.ports import RateStore
from shoal.testing import VirtualClock
from shoal.testing.contract import NS, T0, RateContract, RateDifferential
from shoal.testing.contract.rates import increasing, unwritten
from shoal.types import SlotBusy, SlotGrant, SpendEntry, WindowResult

# -- one server -------------------------------------------------------------------------------


@pytest.fixture
async def store(prefix: str) -> AsyncIterator[RedisCoordStore]:
    async with opened(RedisCoordStore(URL, prefix=prefix)) as s:
        yield s


class TestRedisRateLimits(RateContract, RateDifferential):
    # replicas' clocks apart, amounts whose sums round: Redis adds in the reference's order
    differential = "apart"
    differential_seeds = (20261129,)
    differential_calls = 1500

    @pytest.fixture
    async def rates(self, store: RedisCoordStore) -> RedisCoordStore:
        return store

    @pytest.fixture
    async def other(self, prefix: str) -> AsyncIterator[RedisCoordStore]:
        """A second store object (its own connections) over the same keys."""
        async with opened(RedisCoordStore(URL, prefix=prefix)) as s:
            yield s

    # not applicable on Redis (see _prune_is_left_to_expiries): what Redis does instead
    async def test_prune_deletes_ended_slots_windows_and_pauses(  # type: ignore[override]
        self, rates: RateStore, prefix: str
    ) -> None:
        await _prune_is_left_to_expiries(rates, URL, prefix)

    async def test_prune_rates_deletes_at_most_its_limit(self, rates: RateStore) -> None:
        await _prune_leaves_windows(rates)


def _ttls(url: str, prefix: str) -> dict[str, int]:
    """Every key under ``prefix`` (without it) -> its PTTL."""
    with sync_client(url) as client:
        return {k.decode()[len(prefix) + 1:]: int(client.pttl(k))
                for k in client.scan_iter(match=f"{prefix}:*")}


async def test_what_expires_what_is_pruned_and_what_stays(
    store: RedisCoordStore, prefix: str
) -> None:
    hour = 3_600_000
    await store.slot_acquire(NS, "s", "a", 2, 60, T0)
    await store.slot_acquire(NS, "long", "a", 2, 1000, T0)
    await store.slot_acquire(NS, "long", "b", 2, 1, T0)       # a short lease keeps the long keep
    await store.window_add(NS, "w", 1, 7200, None, T0)
    await store.counter_add(NS, ["c"], [1], [None], T0, SpendEntry("t", None, None, 1, "usd", T0))
    assert await store.pause_until(NS, "p", T0 + 30, T0) == T0 + 30
    ttl = _ttls(URL, prefix)
    for kept in ("rcount:c", "rcounters", "ledger_rows", "ledger_id"):
        assert ttl[f"{NS}:{kept}"] == -1, (kept, ttl)        # pruned through the index, or kept
    assert hour + 30_000 - 60_000 <= ttl[f"{NS}:rpause:p"] <= hour + 30_000, \
        "a pause expires an hour after it ends, read or not"
    assert hour - 60_000 <= ttl[f"{NS}:rslots:s"] <= hour, ttl
    assert ttl[f"{NS}:rslots:long"] >= 10_000_000 - 60_000, ttl
    assert ttl[f"{NS}:rwz:w"] >= 14_400_000 - 60_000, ttl
    assert ttl[f"{NS}:rwt:w"] >= 14_400_000 - 60_000, ttl
    # an ended pause read keeps its expiry; an earlier pause changes nothing; a later one is kept
    # with its own, longer expiry
    assert await store.paused_until(NS, "p", T0 + 30) is None
    assert hour + 30_000 - 60_000 <= _ttls(URL, prefix)[f"{NS}:rpause:p"] <= hour + 30_000
    assert await store.pause_until(NS, "p", T0 + 10, T0 + 40) == T0 + 30, "it still answers"
    assert _ttls(URL, prefix)[f"{NS}:rpause:p"] <= hour + 30_000
    assert await store.pause_until(NS, "p", T0 + 7200, T0 + 40) == T0 + 7200
    assert _ttls(URL, prefix)[f"{NS}:rpause:p"] >= hour + (7200 - 40) * 1000 - 60_000
    assert await store.pause_until(NS, "ended", T0, T0 + 5) == T0      # set after its end
    assert hour - 60_000 <= _ttls(URL, prefix)[f"{NS}:rpause:ended"] <= hour
    # a window whose entries all left, and a slot hash whose slots all ended, are deleted
    await store.window_add(NS, "w", 0, 7200, None, T0 + 7200)
    await store.slot_acquire(NS, "s", "b", 1, 60, T0 + 120)
    await store.slot_release(NS, "s", "b")
    ttl = _ttls(URL, prefix)
    assert f"{NS}:rwz:w" not in ttl and f"{NS}:rwt:w" not in ttl, ttl
    assert f"{NS}:rslots:s" not in ttl, ttl


async def test_idle_counters_go_with_their_index_entries(
    store: RedisCoordStore, prefix: str
) -> None:
    """prune_rates deletes a counter and its entry in the index; a counter a spend touched
    after the index was read is checked again and stays."""
    for i in range(3):
        await store.counter_add(NS, [f"c{i}"], [1], [None], T0 + i)
    with sync_client(URL) as client:
        index = {k.decode(): v for k, v in
                 client.zrange(f"{prefix}:{NS}:rcounters", 0, -1, withscores=True)}
    assert index == {"c0": T0, "c1": T0 + 1, "c2": T0 + 2}
    assert await store.prune_rates(NS, T0 + 1, 10) == 1
    ttl = _ttls(URL, prefix)
    assert f"{NS}:rcount:c0" not in ttl and f"{NS}:rcount:c1" in ttl, ttl
    # the index said c1 was idle before T0 + 5; a spend touched it since
    await store.counter_add(NS, ["c1"], [1], [None], T0 + 10)
    got = await store._script("rate_prune_counters",
                              [f"{prefix}:{NS}:rcounters", f"{prefix}:{NS}:rcount:c1"],
                              [repr(T0 + 5), "c1"])
    assert got == 0
    assert (await store.counter_add(NS, ["c1"], [0], [None], T0 + 10)).totals == [2]
    assert await store.prune_rates(NS, T0 + 20, 10) == 2
    with sync_client(URL) as client:
        assert client.zcard(f"{prefix}:{NS}:rcounters") == 0
    assert not [k for k in _ttls(URL, prefix) if "rcount" in k]


async def test_the_poll_prunes_idle_budget_counters_by_the_apps_clock(prefix: str) -> None:
    """Over Redis, a poll deletes the budget counters idle for run_retention on the app's
    (virtual) clock, as on the SQL stores; the ledger stays."""
    clock = VirtualClock()
    app = shoal.App("budgets", store="memory://", clock=clock, instance_id="p",
                    coordination=RedisCoordStore(URL, prefix=prefix), run_retention=100.0)

    def counters() -> list[str]:
        return sorted(k.split(":rcount:", 1)[1] for k in _ttls(URL, prefix) if ":rcount:" in k)

    async with app:
        await app.spend(1.0, tenant="acme")
        await clock.advance(50)
        await app.spend(2.0, tenant="globex")
        day = "2026-01-01"
        assert counters() == [f"spend:tenant:acme:{day}:usd", f"spend:tenant:globex:{day}:usd"]
        await clock.advance(70)          # acme's idle for 120 s, globex's for 70 s
        await app.poll()
        assert counters() == [f"spend:tenant:globex:{day}:usd"]
        assert [r.tenant for r in await app.ledger()] == ["acme", "globex"]
        assert await app.spent(tenant="acme") == {
            f"the daily budget of tenant 'acme' ({day} UTC)": 0.0}


async def test_a_window_forgets_out_of_order_entries_and_keeps_the_order(
    store: RedisCoordStore, prefix: str
) -> None:
    """Entries added with a clock going back and forth (replicas' clocks differ) are kept by
    their time, so the ones leaving are the oldest; the others keep their expiry, and entries of
    the same time stay in the order they were added."""
    for at, amount in [(T0 + 10, 1), (T0, 2), (T0 + 20, 4), (T0 + 5, 8), (T0 + 10, 0.5)]:
        await store.window_add(NS, "w", amount, 60, None, at)
    got = await store.window_add(NS, "w", 0, 60, None, T0 + 66)
    assert got.total == 5.5
    with sync_client(URL) as client:
        rows = [(r.decode(), at) for r, at in
                client.zrange(f"{prefix}:{NS}:rwz:w", 0, -1, withscores=True)]
        kept = client.hgetall(f"{prefix}:{NS}:rwt:w")
    assert [(r.split()[1], at) for r, at in rows] == [("1", T0 + 10), ("0.5", T0 + 10),
                                                      ("4", T0 + 20)]
    assert float(kept[b"total"]) == 5.5
    assert _ttls(URL, prefix)[f"{NS}:rwz:w"] > 3_000_000
    assert _ttls(URL, prefix)[f"{NS}:rwt:w"] > 3_000_000


async def test_a_window_add_reads_only_the_entries_leaving(
    store: RedisCoordStore, prefix: str
) -> None:
    """The total is the running total kept beside the entries, not a sum of them: a total
    planted in the hash is what comes back (so a call never reads the whole window), entries
    leaving are subtracted from it, and an empty window starts again from exactly 0."""
    for i in range(3000):
        await store.window_add(NS, "w", 0.1, 60, None, T0 + i / 100)
    with sync_client(URL) as client:
        client.hset(f"{prefix}:{NS}:rwt:w", "total", "1000")
    got = await store.window_add(NS, "w", 0, 60, None, T0 + 60.005)    # the first entry leaves
    assert got.total == pytest.approx(999.9, rel=1e-12)
    assert (await store.window_add(NS, "w", 0, 60, None, T0 + 90)).total == 0.0
    assert _ttls(URL, prefix).keys().isdisjoint({f"{NS}:rwz:w", f"{NS}:rwt:w"})
    assert (await store.window_add(NS, "w", 0.1, 60, None, T0 + 90)).total == 0.1


async def test_a_busy_window_walks_only_as_far_as_room_is_made(store: RedisCoordStore) -> None:
    """A refusal in a 10k-entry window finds retry_at near the oldest entries (read in small
    chunks from the oldest) or deep in the window, as the reference does."""
    ref = MemoryStore()
    for s in (store, ref):
        for i in range(10_000):
            assert (await s.window_add(NS, "w", 1, 60, 10_000, T0 + i / 200)).added
    for amount, now in [(1, T0 + 50.001), (3000, T0 + 50.002), (10_000, T0 + 50.003),
                        (10_001, T0 + 50.004)]:
        got = await store.window_add(NS, "w", amount, 60, 10_000, now)
        assert got == await ref.window_add(NS, "w", amount, 60, 10_000, now), amount
    later = await store.window_add(NS, "w", 0, 60, 10_000, T0 + 70)
    assert later == await ref.window_add(NS, "w", 0, 60, 10_000, T0 + 70)
    assert 7998 <= later.total <= 8000


async def test_a_lost_total_is_summed_again_from_the_entries(
    store: RedisCoordStore, prefix: str
) -> None:
    """A total hash gone while the entries stayed (evicted under memory pressure) is rebuilt from
    the entries once, and new entries still get members of their own."""
    for amount in [1, 2, 4]:
        await store.window_add(NS, "w", amount, 60, None, T0)
    with sync_client(URL) as client:
        client.delete(f"{prefix}:{NS}:rwt:w")
    assert (await store.window_add(NS, "w", 1, 60, None, T0)).total == 8
    assert (await store.window_add(NS, "w", 0, 60, None, T0 + 1)).total == 8
    with sync_client(URL) as client:
        assert client.zcard(f"{prefix}:{NS}:rwz:w") == 4


async def test_a_window_of_the_layout_before_counts_as_empty(
    store: RedisCoordStore, prefix: str
) -> None:
    with sync_client(URL) as client:
        client.rpush(f"{prefix}:{NS}:rwin:w", f"{T0!r} 5")
    assert (await store.window_add(NS, "w", 1, 60, None, T0 + 1)).total == 1


async def test_floats_come_back_exactly(store: RedisCoordStore) -> None:
    ref = MemoryStore()
    now, lease = T0 + 0.1 + 0.2, 1 / 3
    for s in (store, ref):
        assert await s.slot_acquire(NS, "k", "a", 1, lease, now) == SlotGrant(now + lease)
        assert await s.slot_acquire(NS, "k", "b", 1, lease, now) == SlotBusy(now + lease)
        assert await s.pause_until(NS, "p", now + lease, now) == now + lease
        assert await s.paused_until(NS, "p", now) == now + lease
    amounts = [0.1, 0.2, 0.3, 1 / 3, 1e-9, 2, 7e15, -0.1]
    for i, amount in enumerate(amounts):
        at = T0 + i * 0.1
        got = await store.window_add(NS, "w", amount, 0.7, 7e15 + 1, at)
        assert got == await ref.window_add(NS, "w", amount, 0.7, 7e15 + 1, at), (i, got)
        got_c = await store.counter_add(NS, ["c", "c"], [amount, 1 / 7], [None, 7e15], at)
        assert got_c == await ref.counter_add(NS, ["c", "c"], [amount, 1 / 7], [None, 7e15], at)
    row = SpendEntry("t", "r", None, 0.1 + 0.2, "usd", T0 + 1 / 3)
    await store.counter_add(NS, [], [], [], T0, row)
    assert [unwritten(r) for r in await store.ledger(NS)] == [row]


async def test_namespaces_with_separators_never_meet(store: RedisCoordStore) -> None:
    await store.slot_acquire("a", "b:rslots:c", "h1", 1, 60, T0)
    assert isinstance(await store.slot_acquire("a:rslots:b", "c", "h2", 1, 60, T0), SlotGrant)
    await store.window_add("x:rwz:y", "z", 5, 60, None, T0)
    assert (await store.window_add("x", "y:rwz:z", 0, 60, None, T0)).total == 0
    await store.counter_add("x:ledger", [], [], [], T0, SpendEntry("t", None, None, 1, "usd", T0))
    assert await store.ledger("x") == []


async def test_no_slot_to_give_is_refused_like_the_reference(store: RedisCoordStore) -> None:
    ref = MemoryStore()
    for s in (store, ref):
        with pytest.raises(ValueError):
            await s.slot_acquire(NS, "k", "a", 0, 60, T0)
        await s.slot_acquire(NS, "k", "a", 1, 60, T0)
        assert await s.slot_acquire(NS, "k", "b", 0, 60, T0) == SlotBusy(T0 + 60)
    with pytest.raises(ValueError, match="2 keys, 1 amounts"):
        await store.counter_add(NS, ["a", "b"], [1], [None, None], T0)


async def test_a_long_ledger_is_read_in_pages(
    store: RedisCoordStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of a ledger longer than a chunk (1,000 rows): filtered or not, pages after the last
    id join into the whole; a filtered page reads chunks until it has its rows, no further."""
    entries = [SpendEntry(f"t{i % 3}", f"r{i % 7}", f"root{i % 5}", i / 10, "usd", T0 + i)
               for i in range(2345)]
    for e in entries:
        assert (await store.counter_add(NS, ["spend"], [e.amount], [None], e.at, e)).added
    whole = await store.ledger(NS, limit=5000)
    assert [unwritten(r) for r in whole] == entries and increasing(whole)
    assert [r.id for r in whole] == list(range(1, 2346))
    assert await store.ledger(NS) == whole[:1000]
    assert await store.ledger(NS, after=1500, limit=1000) == whole[1500:2345]
    assert await store.ledger(NS, tenant="t1", limit=300) == \
        [r for r in whole if r.tenant == "t1"][:300]
    pages: list[SpendEntry] = []
    after = None
    while page := await store.ledger(NS, tenant="t2", root_id="root4", limit=40, after=after):
        pages += page
        after = page[-1].id
    assert pages == [r for r in whole if r.tenant == "t2" and r.root_id == "root4"]
    assert await store.ledger(NS, run_id="r3", since=T0 + 100, until=T0 + 140) == \
        [r for r in whole if r.run_id == "r3" and T0 + 100 <= r.at < T0 + 140]
    assert await store.ledger(NS, limit=0) == []
    client = store._redis()
    reads: list[int] = []
    xrange = client.xrange

    async def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(kwargs["count"])
        return await xrange(*args, **kwargs)

    monkeypatch.setattr(client, "xrange", counted)
    assert len(await store.ledger(NS, tenant="t0", limit=5)) == 5
    assert reads == [1000], "one chunk holds the page's rows"
    reads.clear()
    assert len(await store.ledger(NS, root_id="root1", limit=300)) == 300    # rows 1..1496
    assert reads == [1000, 1000]
    reads.clear()
    assert await store.ledger(NS, after=2300, limit=10) == whole[2300:2310]
    assert reads == [10], "without a filter, a page reads its rows only"


async def test_an_exported_ledger_is_trimmed_and_ids_go_on(
    store: RedisCoordStore, prefix: str
) -> None:
    """What the docs say to do with an exported prefix: XTRIM MINID past the last id exported;
    pages go on from there and new rows never reuse an id, even once every row was trimmed."""
    for i in range(5):
        await store.counter_add(NS, [], [], [], T0, SpendEntry("t", None, None, i, "usd", T0))
    exported = await store.ledger(NS, limit=3)
    last = exported[-1].id
    assert last == 3
    with sync_client(URL) as client:
        client.xtrim(f"{prefix}:{NS}:ledger_rows", minid=last + 1, approximate=False)
    rest = await store.ledger(NS)
    assert [r.amount for r in rest] == [3, 4] and rest == await store.ledger(NS, after=last)
    with sync_client(URL) as client:
        client.xtrim(f"{prefix}:{NS}:ledger_rows", minid=6, approximate=False)
    assert await store.ledger(NS) == []
    await store.counter_add(NS, [], [], [], T0, SpendEntry("t", None, None, 9, "usd", T0))
    [new] = await store.ledger(NS, after=5)
    assert new.id == 6 and new.amount == 9


def test_redis_stores_and_redlock_are_rate_stores() -> None:
    stores = [RedisCoordStore(f"redis://127.0.0.1:{6379 + i}") for i in range(3)]
    assert isinstance(stores[0], RateStore) and isinstance(Redlock(stores), RateStore)


# -- the memory reference, call for call ------------------------------------------------------


def _same(got: object, expected: object) -> bool:
    """Equal, except that window totals agree to the last bits: a running total's rounding
    depends on the order of its additions and subtractions."""
    if isinstance(got, WindowResult) and isinstance(expected, WindowResult):
        return (got.added, got.retry_at) == (expected.added, expected.retry_at) and \
            got.total == pytest.approx(expected.total, rel=1e-9, abs=1e-9)
    return got == expected


async def test_windows_near_their_limits_match_the_reference(store: RedisCoordStore) -> None:
    """A window kept near its limit, entries out of clock order: the refusals and their
    retry_at (the oldest entries, by time and then as added, whose leaving makes room) match."""
    rng = random.Random(61)
    ref = MemoryStore()
    clock, retries = T0, 0
    for step in range(800):
        clock += rng.choice([0.0, 0.0, 0.5, 1.0, 2.0])
        now = clock + rng.choice([0.0, -1.5, 1.0, -0.5])
        amount = rng.choice([1, 2, 0.1, 1 / 3, 0.7, 2.5, 3, -0.5, 0])
        limit = rng.choice([10, 10.0, 7.7, 100 / 9])
        got = await store.window_add(NS, "w", amount, 20.0, limit, now)
        expected = await ref.window_add(NS, "w", amount, 20.0, limit, now)
        assert _same(got, expected), (step, amount, limit, got, expected)
        retries += got.retry_at is not None
    assert retries > 100, retries


# -- Redlock: the first server ----------------------------------------------------------------


class TestRedlockRateLimits(OnTheTrio, RateContract):
    @pytest.fixture
    def rates(self, quorum: Redlock) -> Redlock:
        return quorum

    # not applicable on Redis (see _prune_is_left_to_expiries): the same, on the first server
    async def test_prune_deletes_ended_slots_windows_and_pauses(  # type: ignore[override]
        self, rates: RateStore, trio: list[Server], rl_prefix: str
    ) -> None:
        await _prune_is_left_to_expiries(rates, trio[0].url, rl_prefix)

    async def test_prune_rates_deletes_at_most_its_limit(self, rates: RateStore) -> None:
        await _prune_leaves_windows(rates)


async def test_redlock_keeps_rate_limits_on_its_first_server(
    trio: list[Server], rl_prefix: str
) -> None:
    r = redlock(trio, rl_prefix)
    await r.open()
    try:
        assert isinstance(await r.slot_acquire(NS, "s", "a", 1, 60, T0), SlotGrant)
        assert await r.slot_renew(NS, "s", "a", 60, T0 + 1)
        assert (await r.window_add(NS, "w", 1, 60, None, T0)).added
        assert await r.pause_until(NS, "p", T0 + 5, T0) == T0 + 5
        assert await r.paused_until(NS, "p", T0) == T0 + 5
        row = SpendEntry("t", "r", "r", 1.5, "usd", T0)
        assert (await r.counter_add(NS, ["c"], [1.5], [2.0], T0, row)).added
        [written] = await r.ledger(NS, tenant="t", root_id="r", limit=10, after=0)
        assert unwritten(written) == row and written.id == 1
        assert await r.ledger(NS, run_id="r", after=1) == []
        first = set(_ttls(trio[0].url, rl_prefix))
        assert first == {f"{NS}:rslots:s", f"{NS}:rwz:w", f"{NS}:rwt:w", f"{NS}:rpause:p",
                         f"{NS}:rcount:c", f"{NS}:rcounters", f"{NS}:ledger_rows",
                         f"{NS}:ledger_id"}, first
        assert not _ttls(trio[1].url, rl_prefix) and not _ttls(trio[2].url, rl_prefix)
        await r.slot_release(NS, "s", "a")
        await r.window_clear(NS, "w")
        assert await r.prune_rates(NS, T0 + 1, 10) == 1
        assert set(_ttls(trio[0].url, rl_prefix)) == {
            f"{NS}:rpause:p", f"{NS}:ledger_rows", f"{NS}:ledger_id"}
    finally:
        await r.close()


# -- retention: Redis collects slots, windows and pauses by itself ------------------------------
#
# The contract's prune tests of slots, windows and pauses do not apply here: they carry real-time
# cleanup expiries (a pause from the moment it is set), and prune_rates leaves them to those.
# Counters are pruned exactly, through their index (the contract's counter tests run as they
# are); the ledger is kept everywhere.


async def _prune_is_left_to_expiries(rates: RateStore, url: str, prefix: str) -> None:
    await rates.slot_acquire(NS, "s", "ended", 5, 10, T0)            # lease ends T0 + 10
    await rates.window_add(NS, "w", 1, 60, None, T0)
    await rates.pause_until(NS, "p", T0 + 15, T0)
    await rates.counter_add(NS, ["old"], [1], [None], T0,
                            SpendEntry("t", None, None, 1, "usd", T0))
    assert await rates.prune_rates(NS, T0 + 20, 100) == 1, "the idle counter only"
    ttl = _ttls(url, prefix)
    for row in ("rslots:s", "rwz:w", "rwt:w", "rpause:p"):
        assert ttl[f"{NS}:{row}"] > 0, (row, ttl)                     # a cleanup expiry
    assert f"{NS}:rcount:old" not in ttl and ttl[f"{NS}:ledger_rows"] == -1, ttl
    assert (await rates.counter_add(NS, ["old"], [0], [None], T0 + 20)).totals == [0]
    assert len(await rates.ledger(NS)) == 1


async def _prune_leaves_windows(rates: RateStore) -> None:
    for i in range(5):
        await rates.window_add(NS, "w", 1, 60, None, T0 + i)
    assert await rates.prune_rates(NS, T0 + 10, 2) == 0
    assert (await rates.window_add(NS, "w", 0, 1000, None, T0 + 11)).total == 5


async def test_aimd_lowers_the_limit_for_every_replica_over_redis(prefix: str) -> None:
    """A 429 on one replica lowers the concurrency limit the other replica admits calls under:
    AIMD's counters live in Redis beside the slots."""
    clock = VirtualClock()
    store = MemoryStore()
    apps = [shoal.App("aimd", store=store, clock=clock, instance_id=f"r{i}",
                      coordination=RedisCoordStore(URL, prefix=prefix)) for i in range(2)]
    a, b = (app.provider("openai", max_concurrent=6, aimd=shoal.Aimd()) for app in apps)
    async with apps[0].open(), apps[1].open():
        async with a.call() as call:
            call.rate_limited(retry_after=0)
        assert (await b.state()).concurrency_limit == 3
        held = [b.call() for _ in range(3)]
        for h in held:
            await h.__aenter__()
        with pytest.raises(shoal.RateLimitTimeoutError, match="lowered by AIMD from 6"):
            async with a.call(timeout=0):
                pass
        for h in held:
            await h.__aexit__(None, None, None)
        assert (await a.state()).concurrency_limit == 4     # 3 successes at 3: one slot back
