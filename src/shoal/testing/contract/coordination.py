"""The coordination contract: one body of tests every CoordStore backend must pass (locks,
membership, meters and their retention: :class:`~shoal.ports.CoordStore`).

Subclass :class:`CoordContract` in a pytest module and provide two async fixtures: ``coord``, an
opened, empty coordination store, and ``other``, a second opened handle to the *same* data
(another connection; for an in-process store, the same object). Times are passed as ``now``, so
the suite needs no clock. Needs pytest and pytest-asyncio (``asyncio_mode = "auto"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import pytest

from shoal.ports import CoordStore
from shoal.testing.contract.support import NS, T0
from shoal.types import LockGrant, LockWait

LEASE = 10.0
TTL = 15.0
WARMUP = 10.0


def exactly(t: float) -> Any:
    """``t`` to the millisecond (``pytest.approx`` alone allows a relative error of 1e-6: half an
    hour at these times)."""
    return pytest.approx(t, rel=0, abs=1e-3)


async def grant(coord: CoordStore, keys: list[str], holder: str, now: float = T0,
                lease: float = LEASE, ns: str = NS) -> LockGrant:
    got = await coord.lock_acquire(ns, keys, holder, lease, now)
    assert isinstance(got, LockGrant), f"{holder} should get {keys} at {now - T0:+g}, got {got}"
    return got


async def queued(coord: CoordStore, keys: list[str], holder: str, now: float = T0,
                 lease: float = LEASE, ns: str = NS) -> LockWait:
    got = await coord.lock_acquire(ns, keys, holder, lease, now)
    assert isinstance(got, LockWait), f"{holder} should wait for {keys} at {now - T0:+g}, got {got}"
    return got


class CoordContract:
    """Every CoordStore behaves like this. Provide the ``coord`` and ``other`` fixtures."""

    # -- locks ---------------------------------------------------------------------------------

    async def test_free_key_is_granted_and_held(self, coord: CoordStore) -> None:
        g = await grant(coord, ["k"], "h1")
        assert g.token == 1
        assert g.expires_at == pytest.approx(T0 + LEASE, abs=1e-3)
        w = await queued(coord, ["k"], "h2", T0 + 1)
        assert w.retry_at == pytest.approx(T0 + LEASE, abs=1e-3)

    async def test_release_then_the_next_gets_a_larger_token(self, coord: CoordStore) -> None:
        tokens = []
        for i in range(5):
            g = await grant(coord, ["k"], f"h{i}", T0 + i)
            tokens.append(g.token)
            await coord.lock_release(NS, ["k"], f"h{i}")
        assert tokens == sorted(set(tokens)), tokens
        other_key = await grant(coord, ["other"], "x")
        assert other_key.token == 1, "tokens count per key"

    async def test_a_grant_of_several_keys_takes_one_token_above_each(
        self, coord: CoordStore
    ) -> None:
        for i in range(3):
            await grant(coord, ["a"], f"a{i}")
            await coord.lock_release(NS, ["a"], f"a{i}")
        g = await grant(coord, ["a", "b"], "both")
        assert g.token == 4
        await queued(coord, ["b"], "b-only")
        await coord.lock_release(NS, ["a", "b"], "both")
        assert (await grant(coord, ["b"], "b-only")).token == 5

    async def test_waiters_are_served_in_order(self, coord: CoordStore) -> None:
        await grant(coord, ["k"], "h1")
        w2 = await queued(coord, ["k"], "h2", T0 + 1)
        w3 = await queued(coord, ["k"], "h3", T0 + 2)
        assert w3.ticket > w2.ticket
        await coord.lock_release(NS, ["k"], "h1")
        await queued(coord, ["k"], "h3", T0 + 3)        # h2 is first, even though h3 asks first
        await queued(coord, ["k"], "late", T0 + 3)      # and a newcomer queues behind both
        g2 = await grant(coord, ["k"], "h2", T0 + 3)
        await coord.lock_release(NS, ["k"], "h2")
        g3 = await grant(coord, ["k"], "h3", T0 + 4)
        assert g3.token > g2.token

    async def test_asking_again_keeps_the_place(self, coord: CoordStore) -> None:
        await grant(coord, ["k"], "h1")
        w = await queued(coord, ["k"], "h2", T0 + 1)
        await queued(coord, ["k"], "h3", T0 + 1)
        again = await queued(coord, ["k"], "h2", T0 + 2)
        assert again.ticket == w.ticket

    async def test_a_holder_whose_lease_ended_holds_nothing(self, coord: CoordStore) -> None:
        await grant(coord, ["k"], "h1")
        await queued(coord, ["k"], "h2", T0 + LEASE - 0.5)
        assert not await coord.lock_renew(NS, ["k"], "h1", LEASE, T0 + LEASE)
        g = await grant(coord, ["k"], "h2", T0 + LEASE)
        assert g.token == 2
        assert not await coord.lock_renew(NS, ["k"], "h1", LEASE, T0 + LEASE + 1)
        await coord.lock_release(NS, ["k"], "h1")      # a late release by the old holder: no effect
        await queued(coord, ["k"], "h3", T0 + LEASE + 1)

    async def test_renewal_extends_the_lease(self, coord: CoordStore) -> None:
        await grant(coord, ["a", "b"], "h1")
        assert await coord.lock_renew(NS, ["a", "b"], "h1", LEASE, T0 + 8)
        w = await queued(coord, ["b"], "h2", T0 + 12)
        assert w.retry_at == pytest.approx(T0 + 18, abs=1e-3)
        assert not await coord.lock_renew(NS, ["a", "b"], "h2", LEASE, T0 + 12)
        assert not await coord.lock_renew(NS, ["a", "c"], "h1", LEASE, T0 + 12)
        await queued(coord, ["a"], "h3", T0 + 12)

    async def test_a_waiter_that_stops_asking_leaves_the_queue(self, coord: CoordStore) -> None:
        await grant(coord, ["k"], "h1")
        await queued(coord, ["k"], "dead", T0 + 1)      # its waiter lease ends at T0 + 11
        w = await queued(coord, ["k"], "h3", T0 + 2)
        await coord.lock_release(NS, ["k"], "h1")
        w = await queued(coord, ["k"], "h3", T0 + 5)
        assert w.retry_at == pytest.approx(T0 + 1 + LEASE, abs=1e-3)
        await grant(coord, ["k"], "h3", T0 + 1 + LEASE)

    async def test_a_waiter_that_gives_up_leaves_the_queue(self, coord: CoordStore) -> None:
        await grant(coord, ["k"], "h1")
        await queued(coord, ["k"], "quitter", T0 + 1)
        await queued(coord, ["k"], "h3", T0 + 2)
        await coord.lock_release(NS, ["k"], "quitter")
        await coord.lock_release(NS, ["k"], "h1")
        await grant(coord, ["k"], "h3", T0 + 3)

    async def test_the_oldest_waiter_of_several_keys_is_not_overtaken(
        self, coord: CoordStore
    ) -> None:
        await grant(coord, ["a"], "A")
        await queued(coord, ["a", "b"], "X", T0 + 1)   # needs a and b
        await queued(coord, ["b"], "Y", T0 + 2)        # b is free, but X is ahead on it
        await queued(coord, ["b", "a"], "Z", T0 + 2)
        await coord.lock_release(NS, ["a"], "A")
        await queued(coord, ["b"], "Y", T0 + 3)
        await grant(coord, ["a", "b"], "X", T0 + 3)
        await coord.lock_release(NS, ["a", "b"], "X")
        await queued(coord, ["b", "a"], "Z", T0 + 4)   # Y asked for b before Z
        await grant(coord, ["b"], "Y", T0 + 4)
        await coord.lock_release(NS, ["b"], "Y")
        await grant(coord, ["b", "a"], "Z", T0 + 5)

    async def test_namespaces_never_meet(self, coord: CoordStore) -> None:
        await grant(coord, ["k"], "h1", ns="one")
        g = await grant(coord, ["k"], "h2", ns="two")
        assert g.token == 1
        await coord.lock_release("two", ["k"], "h1")
        await queued(coord, ["k"], "h3", ns="one")

    async def test_another_handle_sees_the_lock_and_wakes_the_watch(
        self, coord: CoordStore, other: CoordStore
    ) -> None:
        await grant(coord, ["k"], "h1")
        async with other.lock_watch(NS, ["k"], "h2") as watch:
            await queued(other, ["k"], "h2", T0 + 1)
            waiting = asyncio.ensure_future(watch.wait())
            await asyncio.sleep(0.05)
            assert not waiting.done(), "a watch must wait for a change"
            await coord.lock_release(NS, ["k"], "h1")
            await asyncio.wait_for(waiting, 3.0)
        await grant(other, ["k"], "h2", T0 + 1)

    async def test_a_change_before_wait_is_not_lost(
        self, coord: CoordStore, other: CoordStore
    ) -> None:
        await grant(coord, ["k"], "h1")
        async with other.lock_watch(NS, ["k"], "h2") as watch:
            await queued(other, ["k"], "h2", T0 + 1)
            await coord.lock_release(NS, ["k"], "h1")
            await asyncio.sleep(0.2)
            await asyncio.wait_for(watch.wait(), 3.0)

    async def test_contenders_on_two_handles_never_overlap(
        self, coord: CoordStore, other: CoordStore
    ) -> None:
        holding: list[str] = []
        log: list[tuple[str, int]] = []

        async def contender(store: CoordStore, name: str) -> None:
            async with store.lock_watch(NS, ["k"], name) as watch:
                while True:
                    got = await store.lock_acquire(NS, ["k"], name, LEASE, T0)
                    if isinstance(got, LockGrant):
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(watch.wait(), 0.5)
            holding.append(name)
            assert len(holding) == 1, holding
            log.append((name, got.token))
            await asyncio.sleep(0.002)
            holding.remove(name)
            await store.lock_release(NS, ["k"], name)

        await asyncio.gather(*(contender(s, f"c{i}") for i, s in zip(
            range(12), itertools.cycle([coord, other]), strict=False)))
        assert sorted(n for n, _ in log) == sorted(f"c{i}" for i in range(12))
        tokens = [t for _, t in log]
        assert tokens == sorted(tokens) and len(set(tokens)) == 12

    # -- hand-offs: one wake-up, for the waiter that is next -------------------------------------

    async def test_a_release_wakes_the_next_waiter_and_no_other(
        self, coord: CoordStore, other: CoordStore
    ) -> None:
        """Eight waiters on one key: each release wakes the one that is now first, and none of
        the others (the first seven hand-offs wake 1, not 8, 7, 6, … waiters)."""
        names = [f"w{i}" for i in range(8)]
        await grant(coord, ["k"], "h")
        async with contextlib.AsyncExitStack() as stack:
            watches = [await stack.enter_async_context(other.lock_watch(NS, ["k"], n))
                       for n in names]
            for i, n in enumerate(names):
                await queued(other, ["k"], n, T0 + 1 + i * 0.01)
            woke = [asyncio.ensure_future(w.wait()) for w in watches]
            try:
                await asyncio.sleep(0.1)
                assert not any(w.done() for w in woke), "nothing was released yet"
                holder = "h"
                for i, n in enumerate(names):
                    await coord.lock_release(NS, ["k"], holder)
                    await asyncio.wait_for(asyncio.shield(woke[i]), 3.0)
                    await asyncio.sleep(0.1)      # a wake-up for another would have come by now
                    early = [names[j] for j in range(i + 1, len(names)) if woke[j].done()]
                    assert not early, f"releasing {holder} woke {early} besides {n}"
                    await grant(other, ["k"], n, T0 + 2)
                    holder = n
            finally:
                for w in woke:
                    w.cancel()

    async def test_the_first_waiter_giving_up_wakes_the_next(
        self, coord: CoordStore, other: CoordStore
    ) -> None:
        """A waiter woken (or about to be) that leaves the queue instead of taking the lock
        passes the wake-up on; one that leaves from further back, or while the key is held,
        wakes nobody."""
        await grant(coord, ["k"], "h")
        async with other.lock_watch(NS, ["k"], "w1") as w1, \
                other.lock_watch(NS, ["k"], "w2") as w2, \
                other.lock_watch(NS, ["k"], "w3") as w3:
            for n in ("w1", "quitter", "w2", "w3"):
                await queued(other, ["k"], n, T0 + 1)
            woke = {n: asyncio.ensure_future(w.wait())
                    for n, w in (("w1", w1), ("w2", w2), ("w3", w3))}
            try:
                await coord.lock_release(NS, ["k"], "quitter")     # from the middle
                await other.lock_release(NS, ["k"], "nobody")      # holds and waits for nothing
                await asyncio.sleep(0.2)
                assert not any(t.done() for t in woke.values())
                await coord.lock_release(NS, ["k"], "h")
                await asyncio.wait_for(asyncio.shield(woke["w1"]), 3.0)
                await other.lock_release(NS, ["k"], "w1")          # cancelled once woken
                await asyncio.wait_for(asyncio.shield(woke["w2"]), 3.0)
                await asyncio.sleep(0.2)
                assert not woke["w3"].done()
                await grant(other, ["k"], "w2", T0 + 2)
            finally:
                for t in woke.values():
                    t.cancel()

    async def test_retry_at_is_the_end_of_the_holder_or_of_the_waiter_ahead(
        self, coord: CoordStore
    ) -> None:
        """A waiter is due when the live holder's lease ends or, if it is not first and that
        comes earlier, when the lease of the waiter right ahead of it does: a dead holder is
        noticed at its lease end even when the waiters ahead give up, and a dead waiter by the
        one waiter behind it."""
        await grant(coord, ["k"], "h")                                   # until T0 + 10
        assert (await queued(coord, ["k"], "w1", T0 + 1)).retry_at == exactly(T0 + LEASE)
        w2 = await queued(coord, ["k"], "w2", T0 + 2)                    # w1 until T0 + 11
        assert w2.retry_at == exactly(T0 + LEASE), "the holder's end, before w1's"
        assert (await queued(coord, ["k"], "w3", T0 + 3)).retry_at == exactly(T0 + LEASE)
        assert await coord.lock_renew(NS, ["k"], "h", LEASE, T0 + 5)     # until T0 + 15
        w2 = await queued(coord, ["k"], "w2", T0 + 6)                    # until T0 + 16
        assert w2.retry_at == exactly(T0 + 11), "w1's end, before the holder's"
        w3 = await queued(coord, ["k"], "w3", T0 + 7)
        assert w3.retry_at == exactly(T0 + 15), "the holder's end, before w2's"
        # w1 dies (its row ends at T0 + 11), the holder too (at T0 + 15): w2 is first now
        assert (await queued(coord, ["k"], "w2", T0 + 12)).retry_at == exactly(T0 + 15)
        assert (await queued(coord, ["k"], "w3", T0 + 13)).retry_at == exactly(T0 + 15)
        await grant(coord, ["k"], "w2", T0 + 15)                         # until T0 + 25
        w3 = await queued(coord, ["k"], "w3", T0 + 16)
        assert w3.retry_at == exactly(T0 + 15 + LEASE), "first now: the holder's end"
        # several keys: the earliest of what it waits for on each
        await grant(coord, ["c"], "hc", T0 + 20)                         # until T0 + 30
        await queued(coord, ["c"], "y", T0 + 21)                         # until T0 + 31
        await grant(coord, ["a"], "ha", T0 + 22)                         # until T0 + 32
        assert await coord.lock_renew(NS, ["c"], "hc", LEASE, T0 + 24)   # until T0 + 34
        x = await queued(coord, ["a", "c"], "x", T0 + 25)
        assert x.retry_at == exactly(T0 + 31), "y's end on c, before hc's on c and ha's on a"
        # a holder whose lease ended is due no more: the waiter ahead is
        await queued(coord, ["c"], "y", T0 + 30.5)                       # until T0 + 40.5
        x = await queued(coord, ["a", "c"], "x", T0 + 34.5)             # hc, ha ended
        assert x.retry_at == exactly(T0 + 40.5), "y's end on c; hc's and ha's are past"

    async def test_a_dead_holder_is_due_when_the_first_waiter_gives_up_before_its_end(
        self, coord: CoordStore
    ) -> None:
        """The holder dies; the first waiter gives up just before the holder's lease ends, while
        the holder's row is still there, so its release names nobody: the second waiter is due
        at the holder's lease end by itself, not at the end of the first waiter's lease."""
        dead = await grant(coord, ["k"], "dead")                         # until T0 + 10
        await queued(coord, ["k"], "w1", T0 + 1)                         # until T0 + 11
        w2 = await queued(coord, ["k"], "w2", T0 + 2)
        assert w2.retry_at == exactly(dead.expires_at), "the holder's end, before w1's"
        await coord.lock_release(NS, ["k"], "w1")                        # at T0 + 9.95
        assert (await grant(coord, ["k"], "w2", dead.expires_at)).token == dead.token + 1

    # -- membership ----------------------------------------------------------------------------

    async def beat(self, coord: CoordStore, member: str, held: int | None, now: float,
                   ns: str = NS) -> Any:
        return await coord.heartbeat(ns, member, held, now, TTL, WARMUP)

    async def test_a_new_member_waits_out_the_warmup(self, coord: CoordStore) -> None:
        v = await self.beat(coord, "m1", None, T0)
        assert v.members == () and not v.granted
        v = await self.beat(coord, "m1", None, T0 + 5)
        assert v.members == () and not v.granted
        v = await self.beat(coord, "m1", None, T0 + WARMUP)
        assert v.members == ("m1",) and v.granted
        again = await self.beat(coord, "m1", v.generation, T0 + 15)
        assert again.granted and again.generation == v.generation

    async def test_a_new_generation_waits_until_the_old_one_is_let_go(
        self, coord: CoordStore
    ) -> None:
        await self.beat(coord, "a", None, T0)
        g1 = await self.beat(coord, "a", None, T0 + 10)
        assert g1.granted
        await self.beat(coord, "b", None, T0 + 12)
        v = await self.beat(coord, "b", None, T0 + 22)
        assert v.members == ("a", "b") and v.generation > g1.generation
        assert not v.granted, "a still holds the old generation"
        v = await self.beat(coord, "a", g1.generation, T0 + 23)
        assert not v.granted, "a must first let go of the old generation"
        v = await self.beat(coord, "b", None, T0 + 23.5)
        assert not v.granted, "a has not said it let go yet"
        a2 = await self.beat(coord, "a", None, T0 + 24)
        assert a2.granted and a2.generation == v.generation
        b2 = await self.beat(coord, "b", None, T0 + 25)
        assert b2.granted and b2.generation == v.generation and b2.members == ("a", "b")

    async def test_a_member_whose_row_ended_is_gone(self, coord: CoordStore) -> None:
        await self.beat(coord, "a", None, T0)
        await self.beat(coord, "b", None, T0)
        ga = await self.beat(coord, "a", None, T0 + 10)
        gb = await self.beat(coord, "b", None, T0 + 10)
        assert ga.granted and gb.granted and ga.members == ("a", "b")
        v = await self.beat(coord, "b", gb.generation, T0 + 24)
        assert v.members == ("a", "b") and v.granted, "a's row lives until T0 + 25"
        v = await self.beat(coord, "b", gb.generation, T0 + 25)
        assert v.members == ("b",) and v.generation > gb.generation and not v.granted
        v = await self.beat(coord, "b", None, T0 + 25)
        assert v.granted and v.members == ("b",)
        back = await self.beat(coord, "a", None, T0 + 26)
        assert back.members == ("b",), "a member back from an outage joins again"
        assert not back.granted

    async def test_a_member_that_leaves_is_gone_at_the_next_heartbeat(
        self, coord: CoordStore, other: CoordStore
    ) -> None:
        await self.beat(coord, "a", None, T0)
        await self.beat(other, "b", None, T0)
        await self.beat(coord, "a", None, T0 + 10)
        await coord.leave(NS, "a")
        v = await self.beat(other, "b", None, T0 + 11)
        assert v.members == ("b",) and v.granted

    async def test_members_of_two_namespaces_never_meet(self, coord: CoordStore) -> None:
        await self.beat(coord, "a", None, T0, ns="one")
        await self.beat(coord, "b", None, T0, ns="two")
        va = await self.beat(coord, "a", None, T0 + 10, ns="one")
        vb = await self.beat(coord, "b", None, T0 + 10, ns="two")
        assert va.members == ("a",) and vb.members == ("b",) and va.granted and vb.granted

    # -- meters --------------------------------------------------------------------------------

    async def test_meter_adds_and_drains(self, coord: CoordStore) -> None:
        assert await coord.meter(NS, ["c1"], [0], T0) == [0]
        assert await coord.meter(NS, ["c1"], [6000], T0) == [6000]
        assert await coord.meter(NS, ["c1"], [6000], T0 + 1) == [11000]
        assert await coord.meter(NS, ["c1"], [0], T0 + 3) == [9000]
        assert await coord.meter(NS, ["c1"], [0], T0 + 100) == [0]
        assert await coord.meter(NS, ["c1"], [500], T0 + 100) == [500]

    async def test_meter_updates_several_keys_and_repeats_in_order(
        self, coord: CoordStore
    ) -> None:
        assert await coord.meter(NS, ["a", "all"], [1000, 1000], T0) == [1000, 1000]
        assert await coord.meter(NS, ["b", "all", "all"], [1000, 1000, 250], T0) == [
            1000, 2000, 2250]
        assert await coord.meter("elsewhere", ["all"], [0], T0) == [0]

    async def test_meter_never_undrains_for_a_clock_behind(self, coord: CoordStore) -> None:
        await coord.meter(NS, ["k"], [10_000], T0)
        assert await coord.meter(NS, ["k"], [0], T0 + 4) == [6000]
        assert await coord.meter(NS, ["k"], [0], T0 + 2) == [6000]
        assert await coord.meter(NS, ["k"], [0], T0 + 5) == [5000]

    async def test_meter_counts_every_concurrent_charge(
        self, coord: CoordStore, other: CoordStore
    ) -> None:
        stores = itertools.cycle([coord, other])
        await asyncio.gather(*(
            s.meter(NS, ["shared", f"own{i % 3}"], [7, 1], T0)
            for i, s in zip(range(60), stores, strict=False)))
        assert await coord.meter(NS, ["shared", "own0", "own1", "own2"], [0, 0, 0, 0], T0) == [
            420, 20, 20, 20]

    async def test_ping(self, coord: CoordStore) -> None:
        await coord.ping()

    # -- the console's read (coordination_view) ------------------------------------------------

    async def test_the_view_shows_live_members_with_their_beats_and_the_roster(
        self, coord: CoordStore, other: CoordStore
    ) -> None:
        empty = await other.coordination_view(NS, T0)
        assert (empty.generation, empty.roster, empty.members) == (0, (), ())
        await coord.heartbeat(NS, "m2", None, T0 + 1, TTL, WARMUP)
        await coord.heartbeat(NS, "m1", None, T0, TTL, WARMUP, version="v1")
        g = await coord.heartbeat(NS, "m1", None, T0 + WARMUP, TTL, WARMUP, version="v1.1")
        assert g.granted and g.members == ("m1",)
        view = await other.coordination_view(NS, T0 + 11)
        assert view.namespace == NS and view.at == T0 + 11
        assert (view.generation, view.roster) == (g.generation, ("m1",))
        assert [(m.member, m.held, m.version) for m in view.members] == [
            ("m1", g.generation, "v1.1"), ("m2", None, None)]
        m1, m2 = view.members
        assert (m1.joined_at, m1.beat_at, m1.expires_at) == (
            exactly(T0), exactly(T0 + WARMUP), exactly(T0 + WARMUP + TTL))
        assert (m2.joined_at, m2.beat_at, m2.expires_at) == (
            exactly(T0 + 1), exactly(T0 + 1), exactly(T0 + 1 + TTL))
        assert view.complete
        later = await other.coordination_view(NS, T0 + 1 + TTL)
        assert [m.member for m in later.members] == ["m1"], "m2's row ended"
        assert (await other.coordination_view("elsewhere", T0 + 11)).members == ()

    async def test_the_view_never_deletes_an_ended_member(
        self, coord: CoordStore, other: CoordStore
    ) -> None:
        await coord.heartbeat(NS, "m1", None, T0, TTL, WARMUP, version="v1")
        assert (await other.coordination_view(NS, T0 + 100)).members == ()
        again = await other.coordination_view(NS, T0 + 1)
        assert [(m.member, m.version) for m in again.members] == [("m1", "v1")], (
            "a read at a later now deleted the row")

    async def test_the_view_shows_held_and_waited_locks_with_tokens(
        self, coord: CoordStore, other: CoordStore
    ) -> None:
        await grant(coord, ["k1"], "h1")
        await coord.lock_release(NS, ["k1"], "h1")
        held = await grant(coord, ["k1"], "h2", T0 + 1)                 # token 2, until T0 + 11
        w1 = await queued(coord, ["k1"], "w1", T0 + 2)
        w2 = await queued(coord, ["k1"], "w2", T0 + 3)
        await grant(coord, ["ended"], "gone", T0 - 20)                  # its lease ended
        await grant(coord, ["free"], "h3", T0)
        w3 = await queued(coord, ["free"], "w3", T0 + 1)
        await coord.lock_release(NS, ["free"], "h3")                    # free, w3 next
        await grant(coord, ["k1"], "x", T0, ns="elsewhere")
        view = await other.coordination_view(NS, T0 + 5)
        assert [(lk.key, lk.token, lk.holder) for lk in view.locks] == [
            ("free", 1, None), ("k1", held.token, "h2")]
        free, k1 = view.locks
        assert k1.expires_at == exactly(T0 + 11) and free.expires_at is None
        assert [(w.holder, w.ticket) for w in k1.waiters] == [("w1", w1.ticket),
                                                              ("w2", w2.ticket)]
        assert k1.waiters[0].expires_at == exactly(T0 + 12)
        assert [(w.holder, w.ticket) for w in free.waiters] == [("w3", w3.ticket)]
        assert view.complete

    async def test_the_view_never_deletes_an_ended_waiter(
        self, coord: CoordStore, other: CoordStore
    ) -> None:
        await grant(coord, ["k"], "h1")                                 # until T0 + 10
        await queued(coord, ["k"], "w1", T0 + 1)                        # until T0 + 11
        assert (await other.coordination_view(NS, T0 + 100)).locks == ()
        view = await other.coordination_view(NS, T0 + 2)
        assert [(lk.holder, [w.holder for w in lk.waiters]) for lk in view.locks] == [
            ("h1", ["w1"])], "a read at a later now deleted the waiter"

    async def test_the_view_shows_meters_in_debt_without_draining_them(
        self, coord: CoordStore, other: CoordStore
    ) -> None:
        await coord.meter(NS, ["a", "b"], [5000, 1000], T0)
        view = await other.coordination_view(NS, T0 + 2)
        assert [(m.key, m.debt, m.updated_at) for m in view.meters] == [
            ("a", exactly(3000), exactly(T0))], "b is drained"
        assert (await other.coordination_view(NS, T0 + 100)).meters == ()
        assert [m.debt for m in (await other.coordination_view(NS, T0 + 1)).meters] == [
            exactly(4000)]
        assert await coord.meter(NS, ["a"], [0], T0 + 1) == [exactly(4000)], (
            "a read drained the meter")

    async def test_the_view_lists_at_most_its_limit(
        self, coord: CoordStore, other: CoordStore
    ) -> None:
        for i in range(3):
            await grant(coord, [f"k{i}"], f"h{i}")
            await queued(coord, ["k0"], f"w{i}", T0 + 1)
        await coord.meter(NS, ["m0", "m1", "m2"], [9000] * 3, T0)
        view = await other.coordination_view(NS, T0 + 1, limit=2)
        assert [lk.key for lk in view.locks] == ["k0", "k1"]
        assert [w.holder for w in view.locks[0].waiters] == ["w0", "w1"]
        assert [m.key for m in view.meters] == ["m0", "m1"]
        assert not view.complete
        whole = await other.coordination_view(NS, T0 + 1, limit=3)
        assert len(whole.locks) == 3 and len(whole.meters) == 3 and whole.complete

    # -- retention -----------------------------------------------------------------------------

    async def test_prune_deletes_drained_meters_and_ended_waiters(
        self, coord: CoordStore
    ) -> None:
        await coord.meter(NS, ["drained"], [1000], T0)          # empty from T0 + 1
        await coord.meter(NS, ["owed"], [100_000], T0)          # empty from T0 + 100
        await coord.meter("elsewhere", ["drained"], [1000], T0)
        await grant(coord, ["k"], "h1")
        await queued(coord, ["k"], "gone", T0 + 1)              # its waiter lease ends T0 + 11
        assert await coord.prune_coordination(NS, T0 + 20, 100) == 2
        assert await coord.prune_coordination(NS, T0 + 20, 100) == 0
        assert await coord.meter(NS, ["drained", "owed"], [0, 0], T0 + 20) == [0, 80_000]
        assert (await grant(coord, ["k"], "h2", T0 + 20)).token == 2, "fencing counters stay"
        assert await coord.meter("elsewhere", ["drained"], [0], T0) == [1000]

    async def test_prune_deletes_at_most_its_limit(self, coord: CoordStore) -> None:
        await coord.meter(NS, [f"m{i}" for i in range(5)], [10] * 5, T0)
        assert await coord.prune_coordination(NS, T0 + 1, 2) == 2
        assert await coord.prune_coordination(NS, T0 + 1, 10) == 3
