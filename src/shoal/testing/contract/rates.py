"""The rate-limit contract: one body of tests every RateStore backend must pass (slots, windows,
pauses, admissions, counters, the ledger and their retention: :class:`~shoal.ports.RateLimits`
and :class:`~shoal.ports.Ledger`).

Subclass :class:`RateContract` in a pytest module and provide two async fixtures: ``rates``, an
opened, empty store, and ``other``, a second opened handle to the *same* data (for an in-process
store, the same object). Times are passed as ``now``; the suite needs no clock.

A store whose slots, windows and pauses expire by themselves (Redis) overrides the two tests
that prune them (``test_prune_deletes_ended_slots_windows_and_pauses`` and
``test_prune_rates_deletes_at_most_its_limit``) with what it does instead; every store prunes
idle counters exactly, by ``now``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
from collections.abc import Sequence
from typing import Any

import pytest

from shoal.ports import RateStore
from shoal.testing.contract.support import NS, T0
from shoal.types import (
    Admitted,
    CircuitNeed,
    Need,
    PauseNeed,
    Refused,
    SlotBusy,
    SlotGrant,
    SlotNeed,
    SpendEntry,
    WindowNeed,
)


async def _stepwise(
    rates: RateStore, namespace: str, holder: str, needs: Sequence[Need], now: float
) -> Admitted | Refused:
    """:meth:`RateStore.admit` made of the other operations (not atomic): each need asked in
    order; a refusal gives back the slots taken; window amounts are counted once all are met
    (a refused window_add counts nothing)."""
    taken: list[str] = []
    trial: float | None = None

    async def refuse(i: int, retry_at: float | None) -> Refused:
        for key in taken:
            await rates.slot_release(namespace, key, holder)
        return Refused(i, retry_at)

    for i, need in enumerate(needs):
        if isinstance(need, SlotNeed):
            got = await rates.slot_acquire(namespace, need.key, holder, need.max_slots,
                                           need.lease, now)
            if isinstance(got, SlotBusy):
                return await refuse(i, got.retry_at)
            taken.append(need.key)
        elif isinstance(need, PauseNeed):
            until = await rates.paused_until(namespace, need.key, now)
            if until is not None:
                return await refuse(i, until)
        elif isinstance(need, WindowNeed):
            read = await rates.window_add(namespace, need.key, 0, need.window, None, now)
            if need.limit is not None and read.total + need.amount > need.limit:
                refused = await rates.window_add(namespace, need.key, need.amount, need.window,
                                                 need.limit, now)
                assert not refused.added
                return await refuse(i, refused.retry_at)
        else:
            until = await rates.paused_until(namespace, need.open, now)
            if until is not None:
                return await refuse(i, until)
            opened, closed = (await rates.counter_add(
                namespace, [need.opened, need.closed], [0, 0], [None, None], now)).totals
            if opened > closed:
                got = await rates.slot_acquire(namespace, need.trial, holder, 1, need.lease, now)
                if isinstance(got, SlotBusy):
                    return await refuse(i, None)
                taken.append(need.trial)
                trial = opened
    for need in needs:
        if isinstance(need, WindowNeed):
            added = await rates.window_add(namespace, need.key, need.amount, need.window, None,
                                           now)
            assert added.added
    return Admitted(trial)


class RateContract:
    """Every RateStore behaves like this. Provide the ``rates`` and ``other`` fixtures."""

    # -- slots ---------------------------------------------------------------------------------

    async def test_slots_up_to_the_maximum(self, rates: RateStore) -> None:
        for holder in ("a", "b", "c"):
            got = await rates.slot_acquire(NS, "p:slots", holder, 3, 60, T0)
            assert got == SlotGrant(T0 + 60)
        busy = await rates.slot_acquire(NS, "p:slots", "d", 3, 60, T0 + 1)
        assert busy == SlotBusy(T0 + 60)
        again = await rates.slot_acquire(NS, "p:slots", "b", 3, 60, T0 + 2)
        assert again == SlotGrant(T0 + 62), "a holder asking again keeps its slot"
        await rates.slot_release(NS, "p:slots", "a")
        assert isinstance(await rates.slot_acquire(NS, "p:slots", "d", 3, 60, T0 + 3), SlotGrant)
        assert isinstance(await rates.slot_acquire(NS, "p:slots", "e", 3, 60, T0 + 3), SlotBusy)

    async def test_a_slot_ends_with_its_lease_unless_renewed(self, rates: RateStore) -> None:
        await rates.slot_acquire(NS, "k", "a", 1, 60, T0)
        await rates.slot_acquire(NS, "k", "b", 2, 60, T0)
        assert await rates.slot_renew(NS, "k", "a", 60, T0 + 50)
        busy = await rates.slot_acquire(NS, "k", "c", 2, 60, T0 + 55)
        assert busy == SlotBusy(T0 + 60)
        assert not await rates.slot_renew(NS, "k", "b", 60, T0 + 60), "b's lease ended"
        assert await rates.slot_acquire(NS, "k", "c", 2, 60, T0 + 60) == SlotGrant(T0 + 120)
        assert isinstance(await rates.slot_acquire(NS, "k", "b", 2, 60, T0 + 61), SlotBusy)
        assert not await rates.slot_renew(NS, "k", "nobody", 60, T0 + 61)
        await rates.slot_release(NS, "k", "nobody")

    async def test_slots_of_namespaces_and_keys_never_meet(self, rates: RateStore) -> None:
        await rates.slot_acquire("one", "k", "a", 1, 60, T0)
        assert isinstance(await rates.slot_acquire("two", "k", "b", 1, 60, T0), SlotGrant)
        assert isinstance(await rates.slot_acquire("one", "k2", "b", 1, 60, T0), SlotGrant)

    async def test_concurrent_slot_takers_never_pass_the_maximum(
        self, rates: RateStore, other: RateStore
    ) -> None:
        stores = itertools.cycle([rates, other])
        got = await asyncio.gather(*(
            s.slot_acquire(NS, "hot", f"h{i}", 3, 60, T0)
            for i, s in zip(range(20), stores, strict=False)))
        assert sum(isinstance(g, SlotGrant) for g in got) == 3

    # -- windows -------------------------------------------------------------------------------

    async def test_a_window_counts_and_refuses_past_its_limit(self, rates: RateStore) -> None:
        w = await rates.window_add(NS, "p:rpm", 1, 60, 3, T0)
        assert (w.added, w.total) == (True, 1)
        await rates.window_add(NS, "p:rpm", 1, 60, 3, T0 + 10)
        await rates.window_add(NS, "p:rpm", 1, 60, 3, T0 + 20)
        refused = await rates.window_add(NS, "p:rpm", 1, 60, 3, T0 + 30)
        assert (refused.added, refused.total) == (False, 3)
        assert refused.retry_at == pytest.approx(T0 + 60, abs=1e-3)
        read = await rates.window_add(NS, "p:rpm", 0, 60, 3, T0 + 30)
        assert (read.added, read.total) == (True, 3)
        assert (await rates.window_add(NS, "p:rpm", 1, 60, 3, T0 + 60)).added
        assert (await rates.window_add(NS, "p:rpm", 0, 60, 3, T0 + 75)).total == 2

    async def test_a_window_says_when_a_large_amount_fits(self, rates: RateStore) -> None:
        for i, amount in enumerate([500, 300, 100]):
            await rates.window_add(NS, "p:tpm", amount, 60, 1000, T0 + i)
        refused = await rates.window_add(NS, "p:tpm", 700, 60, 1000, T0 + 5)
        assert not refused.added and refused.retry_at == pytest.approx(T0 + 61, abs=1e-3)
        never = await rates.window_add(NS, "p:tpm", 1001, 60, 1000, T0 + 5)
        assert not never.added and never.retry_at is None
        unlimited = await rates.window_add(NS, "p:tpm", 5000, 60, None, T0 + 5)
        assert unlimited.added and unlimited.total == 5900

    async def test_a_negative_amount_corrects_and_is_never_refused(
        self, rates: RateStore
    ) -> None:
        await rates.window_add(NS, "p:tpm", 1000, 60, 1000, T0)
        corrected = await rates.window_add(NS, "p:tpm", -400, 60, 1000, T0 + 1)
        assert corrected.added and corrected.total == 600
        assert (await rates.window_add(NS, "p:tpm", 400, 60, 1000, T0 + 2)).added

    async def test_an_entry_dated_earlier_leaves_at_its_own_time(
        self, rates: RateStore
    ) -> None:
        await rates.window_add(NS, "p:tpm", 500, 60, 1000, T0)
        await rates.window_add(NS, "p:tpm", 300, 60, 1000, T0 + 30)
        corrected = await rates.window_add(NS, "p:tpm", -400, 60, None, T0)   # dated T0
        assert corrected.total == 400
        later = await rates.window_add(NS, "p:tpm", 0, 60, 1000, T0 + 61)
        assert later.total == 300, "the estimate and its correction left together"
        assert (await rates.window_add(NS, "p:tpm", 0, 60, 1000, T0 + 91)).total == 0

    async def test_a_busy_window_keeps_an_exact_count(self, rates: RateStore) -> None:
        for i in range(600):                        # ten calls a second for a minute
            got = await rates.window_add(NS, "p:rpm", 1, 60, 600, T0 + i / 10)
            assert got.added
        refused = await rates.window_add(NS, "p:rpm", 1, 60, 600, T0 + 59.95)
        assert not refused.added and refused.total == 600
        assert refused.retry_at == pytest.approx(T0 + 60, abs=1e-3)
        assert (await rates.window_add(NS, "p:rpm", 0, 60, 600, T0 + 90.05)).total == 299
        assert (await rates.window_add(NS, "p:rpm", 0, 60, 600, T0 + 200)).total == 0
        assert (await rates.window_add(NS, "p:rpm", 1, 60, 600, T0 + 200)).total == 1

    async def test_a_window_clears(self, rates: RateStore) -> None:
        await rates.window_add(NS, "p:failures", 1, 60, None, T0)
        await rates.window_clear(NS, "p:failures")
        assert (await rates.window_add(NS, "p:failures", 0, 60, None, T0)).total == 0
        await rates.window_clear(NS, "never-used")

    async def test_concurrent_window_adds_never_pass_the_limit(
        self, rates: RateStore, other: RateStore
    ) -> None:
        stores = itertools.cycle([rates, other])
        got = await asyncio.gather(*(
            s.window_add(NS, "hot", 1, 60, 7, T0)
            for _, s in zip(range(20), stores, strict=False)))
        assert sum(g.added for g in got) == 7
        assert (await rates.window_add(NS, "hot", 0, 60, 7, T0)).total == 7

    # -- pauses --------------------------------------------------------------------------------

    async def test_a_later_pause_is_kept(self, rates: RateStore, other: RateStore) -> None:
        assert await rates.paused_until(NS, "p:cooldown", T0) is None
        assert await rates.pause_until(NS, "p:cooldown", T0 + 30, T0) == T0 + 30
        assert await other.pause_until(NS, "p:cooldown", T0 + 10, T0 + 1) == T0 + 30
        assert await other.paused_until(NS, "p:cooldown", T0 + 29) == T0 + 30
        assert await rates.paused_until(NS, "p:cooldown", T0 + 30) is None
        assert await rates.pause_until(NS, "p:cooldown", T0 + 90, T0 + 31) == T0 + 90
        assert await rates.paused_until("elsewhere", "p:cooldown", T0) is None

    # -- admission: every need of a call at once ------------------------------------------------

    async def test_admit_takes_every_need_at_once(self, rates: RateStore) -> None:
        needs: list[Need] = [SlotNeed("t:slots", 1, 60), SlotNeed("p:slots", 2, 30),
                             PauseNeed("p:cooldown"), WindowNeed("t:rpm", 1, 60, 2),
                             WindowNeed("p:tpm", 500, 60, 1000)]
        assert await rates.admit(NS, "a", needs, T0) == Admitted(None)
        assert await rates.slot_acquire(NS, "t:slots", "b", 1, 60, T0 + 1) == SlotBusy(T0 + 60)
        assert await rates.slot_acquire(NS, "p:slots", "b", 2, 60, T0 + 1) == SlotGrant(T0 + 61)
        assert await rates.slot_acquire(NS, "p:slots", "c", 2, 60, T0 + 1) == SlotBusy(T0 + 30)
        assert (await rates.window_add(NS, "t:rpm", 0, 60, None, T0 + 1)).total == 1
        assert (await rates.window_add(NS, "p:tpm", 0, 60, None, T0 + 1)).total == 500
        # the entries were counted at T0: they leave the window a minute later
        assert (await rates.window_add(NS, "p:tpm", 0, 60, None, T0 + 60)).total == 0
        assert await rates.admit(NS, "z", [], T0) == Admitted(None)

    async def test_admit_is_all_or_nothing(self, rates: RateStore) -> None:
        await rates.window_add(NS, "p:tpm", 900, 60, None, T0 - 30)
        needs: list[Need] = [SlotNeed("p:slots", 1, 60), WindowNeed("p:rpm", 1, 60, 10),
                             WindowNeed("p:tpm", 200, 60, 1000)]
        assert await rates.admit(NS, "a", needs, T0) == Refused(2, T0 + 30)
        # nothing taken: the slot is free and the requests window empty
        assert await rates.slot_acquire(NS, "p:slots", "b", 1, 60, T0) == SlotGrant(T0 + 60)
        assert (await rates.window_add(NS, "p:rpm", 0, 60, None, T0)).total == 0
        assert (await rates.window_add(NS, "p:tpm", 0, 60, None, T0)).total == 900
        await rates.slot_release(NS, "p:slots", "b")
        assert await rates.admit(NS, "a", needs, T0 + 30) == Admitted(None)
        assert (await rates.window_add(NS, "p:tpm", 0, 60, None, T0 + 30)).total == 200

    async def test_admit_names_the_first_need_refused(self, rates: RateStore) -> None:
        await rates.slot_acquire(NS, "s", "other", 1, 20, T0)
        await rates.pause_until(NS, "p", T0 + 25, T0)
        await rates.window_add(NS, "w", 3, 60, None, T0 - 10)
        slot, pause = SlotNeed("s", 1, 60), PauseNeed("p")
        never, later = WindowNeed("w", 11, 60, 10), WindowNeed("w", 8, 60, 10)
        assert await rates.admit(NS, "a", [never, slot, pause], T0) == Refused(0, None)
        assert await rates.admit(NS, "a", [later, slot, pause], T0) == Refused(0, T0 + 50)
        assert await rates.admit(NS, "a", [pause, slot], T0) == Refused(0, T0 + 25)
        assert await rates.admit(NS, "a", [slot, pause], T0) == Refused(0, T0 + 20)
        assert await rates.admit(NS, "a", [PauseNeed("q"), pause, slot], T0) == \
            Refused(1, T0 + 25)
        assert await rates.admit(NS, "a", [slot, pause], T0 + 20) == Refused(1, T0 + 25)
        assert await rates.admit(NS, "a", [slot, pause, later], T0 + 25) == Refused(2, T0 + 50)
        assert await rates.admit(NS, "a", [slot, pause, later], T0 + 50) == Admitted(None)
        # a holder that holds the slot already is admitted again (its slot extended)
        assert await rates.admit(NS, "a", [slot], T0 + 60) == Admitted(None)
        assert await rates.slot_acquire(NS, "s", "b", 1, 60, T0 + 100) == SlotBusy(T0 + 120)

    async def test_admit_asks_the_circuit(self, rates: RateStore) -> None:
        circuit = CircuitNeed("c:open", "c:opened", "c:closed", "c:trial", 60)
        slot = SlotNeed("s", 5, 60)
        assert await rates.admit(NS, "a", [circuit, slot], T0) == Admitted(None)
        assert await rates.slot_acquire(NS, "c:trial", "x", 1, 60, T0) == SlotGrant(T0 + 60), \
            "a closed circuit takes no trial slot"
        await rates.slot_release(NS, "c:trial", "x")
        # opened: the cooldown, then half-open
        await rates.pause_until(NS, "c:open", T0 + 30, T0)
        await rates.counter_add(NS, ["c:opened"], [1], [1], T0)
        assert await rates.admit(NS, "a", [circuit, slot], T0 + 1) == Refused(0, T0 + 30)
        assert await rates.admit(NS, "a", [circuit, slot], T0 + 30) == Admitted(1.0)
        assert await rates.admit(NS, "b", [circuit], T0 + 31) == Refused(0, None)
        assert await rates.slot_acquire(NS, "c:trial", "b", 1, 60, T0 + 31) == SlotBusy(T0 + 90)
        # a trial refused by a later need is not taken
        await rates.slot_release(NS, "c:trial", "a")
        await rates.pause_until(NS, "p", T0 + 40, T0 + 31)
        assert await rates.admit(NS, "b", [circuit, PauseNeed("p")], T0 + 32) == Refused(1, T0 + 40)
        assert await rates.admit(NS, "c", [circuit], T0 + 32) == Admitted(1.0)
        # closed again: no trial
        await rates.counter_add(NS, ["c:closed"], [1], [1], T0 + 33)
        assert await rates.admit(NS, "d", [circuit], T0 + 33) == Admitted(None)

    async def test_admit_keeps_the_counters_of_a_circuit_in_use(self, rates: RateStore) -> None:
        """Looking at the circuit marks its counters used, as counter_add's read does: retention
        never prunes the counters of a breaker in use (pruning "closed" alone would trip it)."""
        circuit = CircuitNeed("c:open", "c:opened", "c:closed", "c:trial", 60)
        await rates.counter_add(NS, ["c:opened", "c:closed"], [2, 2], [None, None], T0)
        assert await rates.admit(NS, "a", [circuit], T0 + 100) == Admitted(None)
        await rates.prune_rates(NS, T0 + 50, 100)
        totals = await rates.counter_add(NS, ["c:opened", "c:closed"], [0, 0], [None, None],
                                         T0 + 100)
        assert totals.totals == [2, 2]

    async def test_admit_writes_no_counter_of_a_circuit_it_never_reached(
        self, rates: RateStore
    ) -> None:
        """A need refused before the circuit, or the circuit's own pause in force: its counters
        are not looked at, so nothing is written for them (retention finds no counter)."""
        circuit = CircuitNeed("c:open", "c:opened", "c:closed", "c:trial", 60)
        await rates.slot_acquire(NS, "s", "other", 1, 60, T0)
        assert await rates.admit(NS, "a", [SlotNeed("s", 1, 60), circuit], T0) == \
            Refused(0, T0 + 60)
        await rates.pause_until(NS, "c:open", T0 + 30, T0)
        assert await rates.admit(NS, "a", [circuit], T0) == Refused(0, T0 + 30)
        assert await rates.prune_rates(NS, T0 + 1, 100) == 0

    async def test_admit_refuses_a_key_named_twice(self, rates: RateStore) -> None:
        wrong: list[list[Need]] = [
            [SlotNeed("s", 1, 60), SlotNeed("s", 2, 60)],
            [WindowNeed("w", 1, 60, None), WindowNeed("w", 2, 60, 5)],
            [PauseNeed("p"), CircuitNeed("p", "o", "c", "t", 60)],
            [WindowNeed("w", 0, 60, 5)]]
        for needs in wrong:
            with pytest.raises(ValueError):
                await rates.admit(NS, "a", needs, T0)

    async def test_concurrent_admissions_never_pass_a_limit(
        self, rates: RateStore, other: RateStore
    ) -> None:
        stores = itertools.cycle([rates, other])
        tenant, provider = SlotNeed("t:slots", 4, 60), SlotNeed("p:slots", 6, 60)
        rpm, tpm = WindowNeed("p:rpm", 1, 60, 5), WindowNeed("p:tpm", 10, 60, 100)
        orders: list[list[Need]] = [[tenant, provider, rpm, tpm], [provider, tenant, tpm, rpm],
                                    [tpm, rpm, tenant]]
        got = await asyncio.gather(*(
            s.admit(NS, f"h{i}", orders[i % 3], T0)
            for i, s in zip(range(30), stores, strict=False)))
        assert sum(isinstance(g, Admitted) for g in got) == 4     # the tenant's 4 slots
        assert (await rates.window_add(NS, "p:rpm", 0, 60, None, T0)).total == 4
        assert (await rates.window_add(NS, "p:tpm", 0, 60, None, T0)).total == 40
        granted = await rates.admit(NS, "late", [provider, rpm], T0)
        assert granted == Admitted(None)
        assert await rates.admit(NS, "later", [provider, rpm], T0) == Refused(1, T0 + 60)

    async def test_concurrent_admissions_take_one_trial(
        self, rates: RateStore, other: RateStore
    ) -> None:
        """Replicas racing for a half-open circuit: one trial goes, the others are refused
        (retry_at None); once it is freed, or its lease ends, the next one goes."""
        stores = itertools.cycle([rates, other])
        circuit = CircuitNeed("c:open", "c:opened", "c:closed", "c:trial", 60)
        await rates.counter_add(NS, ["c:opened", "c:closed"], [3, 2], [None, None], T0)
        got = await asyncio.gather(*(
            s.admit(NS, f"h{i}", [circuit, SlotNeed("p:slots", 10, 60)], T0)
            for i, s in zip(range(20), stores, strict=False)))
        admitted = [i for i, g in enumerate(got) if isinstance(g, Admitted)]
        assert len(admitted) == 1 and got[admitted[0]] == Admitted(3.0), got
        assert all(g == Refused(0, None) for g in got if not isinstance(g, Admitted)), got
        await rates.slot_release(NS, "c:trial", f"h{admitted[0]}")
        assert await other.admit(NS, "next", [circuit], T0 + 1) == Admitted(3.0)
        # a trial whose lease ran out (its holder stalled or died) frees the place by itself
        assert await rates.admit(NS, "late", [circuit], T0 + 60) == Refused(0, None)
        assert await rates.admit(NS, "late", [circuit], T0 + 61) == Admitted(3.0)
        assert not await other.slot_renew(NS, "c:trial", "next", 60, T0 + 62)

    async def test_admit_is_the_step_by_step_operations_all_or_nothing(
        self, rates: RateStore
    ) -> None:
        """Random admissions in one namespace, and the same needs met one by one with the other
        operations in another (each slot, pause, window and circuit asked in order, the slots
        given back on a refusal, the window amounts counted once every need is met): the same
        answers, call for call. Amounts are multiples of 1/4, so every sum is exact."""
        rnd = random.Random(1129)
        now, calls = T0, 0
        for step in range(300):
            now += rnd.choice([0, 0, 0.25, 0.5, 1, 3])
            op = rnd.random()
            if op < 0.12:
                key, holder = rnd.choice(["s1", "s2", "trial"]), f"h{rnd.randrange(calls + 1)}"
                for ns in ("one", "two"):
                    await rates.slot_release(ns, key, holder)
                continue
            if op < 0.18:
                until = now + rnd.choice([0, 2, 10])
                key = rnd.choice(["p", "open"])
                assert await rates.pause_until("one", key, until, now) == \
                    await rates.pause_until("two", key, until, now)
                continue
            if op < 0.24:
                key, amount = rnd.choice([("opened", 1), ("closed", 1)])
                for ns in ("one", "two"):
                    await rates.counter_add(ns, [key], [amount], [None], now)
                continue
            needs: list[Need] = []
            if rnd.random() < 0.3:
                needs.append(CircuitNeed("open", "opened", "closed", "trial", 20))
            for key in rnd.sample(["s1", "s2"], rnd.randint(0, 2)):
                needs.append(SlotNeed(key, rnd.choice([1, 2, 3]), rnd.choice([5.0, 20.0])))
            if rnd.random() < 0.5:
                needs.append(PauseNeed("p"))
            for key in rnd.sample(["w1", "w2"], rnd.randint(0, 2)):
                needs.append(WindowNeed(key, rnd.choice([0.25, 1, 2, 3, 12]), 10.0,
                                        rnd.choice([None, 6, 10])))
            rnd.shuffle(needs)
            calls += 1
            holder = f"h{calls}"
            got = await rates.admit("one", holder, needs, now)
            expected = await _stepwise(rates, "two", holder, needs, now)
            assert got == expected, (step, needs, got, expected)
        for key in ("w1", "w2"):
            totals = [(await rates.window_add(ns, key, 0, 10.0, None, now)).total
                      for ns in ("one", "two")]
            assert totals[0] == totals[1], (key, totals)

    # -- counters and the ledger ---------------------------------------------------------------

    async def test_counters_add_all_or_nothing_under_limits(self, rates: RateStore) -> None:
        keys = ["run:r1:usd", "root:r1:usd", "tenant:t1:2026-01-01:usd"]
        got = await rates.counter_add(NS, keys, [0.5, 0.5, 0.5], [1.0, None, 2.0], T0)
        assert got.added and got.totals == [0.5, 0.5, 0.5]
        refused = await rates.counter_add(NS, keys, [0.6, 0.6, 0.6], [1.0, None, 2.0], T0)
        assert not refused.added and refused.over == 0 and refused.totals == [0.5, 0.5, 0.5]
        read = await rates.counter_add(NS, keys, [0, 0, 0], [None, None, None], T0)
        assert read.added and read.totals == [0.5, 0.5, 0.5]
        corrected = await rates.counter_add(NS, keys, [-0.25, 0.25, 0], [1.0, None, 2.0], T0)
        assert corrected.totals == [0.25, 0.75, 0.5]

    async def test_a_counter_named_twice_counts_twice(self, rates: RateStore) -> None:
        got = await rates.counter_add(NS, ["k", "k"], [1, 2], [None, 3], T0)
        assert got.added and got.totals == [1, 3]
        refused = await rates.counter_add(NS, ["k", "k"], [1, 1], [None, 4], T0)
        assert not refused.added and refused.over == 1
        assert (await rates.counter_add(NS, ["k"], [0], [None], T0)).totals == [3]

    async def test_the_ledger_keeps_every_added_spend(
        self, rates: RateStore, other: RateStore
    ) -> None:
        e1 = SpendEntry("t1", "r1", "r1", 0.25, "usd", T0)
        e2 = SpendEntry("t2", "r2", "r9", 1.5, "eur", T0 + 1)
        await rates.counter_add(NS, ["a"], [0.25], [None], T0, e1)
        await other.counter_add(NS, ["b"], [1.5], [None], T0 + 1, e2)
        refused = await rates.counter_add(NS, ["a"], [5], [1], T0 + 2,
                                          SpendEntry("t1", "r1", "r1", 5, "usd", T0 + 2))
        assert not refused.added
        rows = await rates.ledger(NS)
        assert [unwritten(r) for r in rows] == [e1, e2]
        assert rows[0].id is not None and rows[1].id is not None and rows[0].id < rows[1].id
        assert await other.ledger(NS, tenant="t2") == [rows[1]]
        assert await other.ledger(NS, root_id="r1") == [rows[0]]
        assert await other.ledger(NS, run_id="r2") == [rows[1]]
        assert await rates.ledger("elsewhere") == []

    async def test_the_ledger_keeps_the_provider_and_tokens_of_a_row(
        self, rates: RateStore, other: RateStore
    ) -> None:
        """A priced provider call's row names its provider and the tokens it used; a row of
        other spending leaves both None. Every filter reads them back."""
        call = SpendEntry("t1", "r1", "r1", 0.0125, "usd", T0, provider="openai", tokens=1250)
        other_spend = SpendEntry("t1", "r1", "r1", 0.05, "usd", T0 + 1)
        large = SpendEntry("t1", None, None, 9.5, "usd", T0 + 2, provider="p", tokens=3 * 2**31)
        for i, e in enumerate((call, other_spend, large)):
            await (rates, other)[i % 2].counter_add(NS, ["c"], [e.amount], [None], e.at, e)
        rows = await rates.ledger(NS)
        assert [unwritten(r) for r in rows] == [call, other_spend, large]
        for read in (other.ledger(NS, tenant="t1"), other.ledger(NS, root_id="r1"),
                     other.ledger(NS, run_id="r1")):
            assert [(r.provider, r.tokens) for r in await read][:2] == [
                ("openai", 1250), (None, None)]

    async def test_the_ledger_pages_by_id_without_gaps_or_repeats(
        self, rates: RateStore, other: RateStore
    ) -> None:
        """Rows written through two handles, many at the same time, several in one call each:
        ids strictly increase in the order written; pages after the last id read seen join
        into the whole ledger, rows written between two pages included."""
        written = [SpendEntry(f"t{i % 2}", f"r{i % 3}", f"root{i % 4}", i / 4, "usd",
                              T0 + i // 5) for i in range(23)]
        for i, e in enumerate(written[:17]):
            await (rates, other)[i % 2].counter_add(NS, ["c"], [e.amount], [None], e.at, e)
        whole = await rates.ledger(NS)
        assert [unwritten(r) for r in whole] == written[:17]
        assert increasing(whole)
        pages: list[list[SpendEntry]] = []
        after = None
        while True:
            page = await (rates, other)[len(pages) % 2].ledger(NS, limit=5, after=after)
            assert len(page) <= 5
            if not page:
                break
            pages.append(page)
            after = page[-1].id
            if len(pages) == 2:      # rows written while the ledger is being read
                for e in written[17:]:
                    await rates.counter_add(NS, ["c"], [e.amount], [None], e.at, e)
        assert [unwritten(r) for page in pages for r in page] == written
        assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
        assert await rates.ledger(NS, after=after) == []
        assert await rates.ledger(NS, after=0) == await rates.ledger(NS)
        assert await rates.ledger(NS, limit=0) == []
        assert await rates.ledger("elsewhere", after=0) == []

    async def test_ledger_filters_page_too(self, rates: RateStore) -> None:
        written = [SpendEntry(f"t{i % 2}", f"r{i % 3}", f"root{i % 4}" if i % 5 else None,
                              1.0, "usd", T0 + i // 3) for i in range(40)]
        for e in written:
            await rates.counter_add(NS, [], [], [], e.at, e)
        whole = await rates.ledger(NS)
        filters: list[dict[str, Any]] = [
            {"tenant": "t1"}, {"root_id": "root2"}, {"run_id": "r0"},
            {"tenant": "t0", "root_id": "root2"}, {"tenant": "t1", "run_id": "r2"},
            {"run_id": "r1", "root_id": "root3"}, {"since": T0 + 4}, {"until": T0 + 7},
            {"since": T0 + 2, "until": T0 + 9, "tenant": "t0"},
            {"since": T0 + 5, "until": T0 + 5}, {"tenant": "nobody"}]
        for f in filters:
            expected = [r for r in whole if _matches(r, **f)]
            assert await rates.ledger(NS, limit=1000, **f) == expected, f
            pages: list[SpendEntry] = []
            after = None
            while page := await rates.ledger(NS, limit=3, after=after, **f):
                assert len(page) <= 3
                pages += page
                after = page[-1].id
            assert pages == expected, f

    async def test_concurrent_spends_get_ids_in_the_order_readers_see(
        self, rates: RateStore, other: RateStore
    ) -> None:
        """Spends on unrelated counters from two handles at once, read while they are written:
        a reader paging from the last id it saw ends with every row, each once."""
        seen: list[SpendEntry] = []
        after: int | None = None
        reading = asyncio.Lock()     # one reader, reading on from where it stopped

        async def read() -> None:
            nonlocal after
            async with reading:
                while page := await rates.ledger(NS, limit=4, after=after):
                    seen.extend(page)
                    after = page[-1].id

        async def spend(i: int) -> None:
            store = (rates, other)[i % 2]
            await store.counter_add(NS, [f"own{i}"], [1], [None], T0,
                                    SpendEntry(f"t{i % 3}", f"r{i}", None, 1, "usd", T0))
            await read()

        await asyncio.gather(*(spend(i) for i in range(24)))
        await read()
        assert sorted(e.run_id or "" for e in seen) == sorted(f"r{i}" for i in range(24))
        assert increasing(seen)

    async def test_concurrent_spends_never_pass_a_limit(
        self, rates: RateStore, other: RateStore
    ) -> None:
        stores = itertools.cycle([rates, other])
        got = await asyncio.gather(*(
            s.counter_add(NS, ["budget", f"own{i % 2}"], [1, 1], [9, None], T0,
                          SpendEntry("t", f"r{i}", None, 1, "usd", T0))
            for i, s in zip(range(30), stores, strict=False)))
        assert sum(g.added for g in got) == 9
        totals = await rates.counter_add(NS, ["budget", "own0", "own1"], [0, 0, 0],
                                         [None] * 3, T0)
        assert totals.totals[0] == 9 and totals.totals[1] + totals.totals[2] == 9
        assert len(await rates.ledger(NS)) == 9

    # -- retention -----------------------------------------------------------------------------

    # -- the console's read (read_rates) ------------------------------------------------------

    async def test_read_rates_sees_slots_windows_pauses_and_counters(
        self, rates: RateStore, other: RateStore
    ) -> None:
        for holder in ("h1", "h2"):
            await rates.slot_acquire(NS, "s", holder, 5, 10, T0)            # until T0 + 10
        await rates.slot_acquire(NS, "s", "h3", 5, 1, T0)                   # until T0 + 1
        await rates.window_add(NS, "w", 1, 60, None, T0)
        await rates.window_add(NS, "w", 2, 60, None, T0 + 30)
        await rates.pause_until(NS, "p", T0 + 50, T0)
        await rates.counter_add(NS, ["c"], [5], [None], T0)
        await rates.slot_acquire("elsewhere", "s", "x", 5, 10, T0)
        got = await other.read_rates(NS, T0 + 5, slots=["s", "never"],
                                     windows=[("w", 60), ("never", 60)],
                                     pauses=["p", "never"], counters=["c", "never"])
        assert got.slots == {"s": 2, "never": 0}
        assert got.windows == {"w": pytest.approx(3), "never": 0}
        assert got.pauses == {"p": pytest.approx(T0 + 50), "never": None}
        assert got.counters == {"c": pytest.approx(5), "never": 0}
        later = await other.read_rates(NS, T0 + 70, slots=["s"], windows=[("w", 60)],
                                       pauses=["p"], counters=["c"])
        assert later.slots == {"s": 0}
        assert later.windows == {"w": pytest.approx(2)}, "the entry at T0 left the window"
        assert later.pauses == {"p": None}
        assert (await rates.window_add(NS, "w", 0, 60, None, T0 + 70)).total == (
            pytest.approx(later.windows["w"]))
        assert (await other.read_rates(NS, T0 + 100, windows=[("w", 60)])).windows == {"w": 0}

    async def test_read_rates_never_writes(self, rates: RateStore, other: RateStore) -> None:
        await rates.slot_acquire(NS, "s", "h1", 1, 10, T0)
        await rates.window_add(NS, "w", 1, 60, None, T0)
        await rates.pause_until(NS, "p", T0 + 50, T0)
        await rates.counter_add(NS, ["c"], [5], [None], T0)
        gone = await other.read_rates(NS, T0 + 1000, slots=["s"], windows=[("w", 60)],
                                      pauses=["p"], counters=["c"])
        assert (gone.slots, gone.windows, gone.pauses) == ({"s": 0}, {"w": 0}, {"p": None})
        again = await other.read_rates(NS, T0 + 1, slots=["s"], windows=[("w", 60)],
                                       pauses=["p"], counters=["c"])
        assert again.slots == {"s": 1}, "a read at a later now forgot the slot"
        assert again.windows == {"w": pytest.approx(1)}, "a read forgot the window's entry"
        assert again.pauses == {"p": pytest.approx(T0 + 50)}
        assert isinstance(await rates.slot_acquire(NS, "s", "h2", 1, 10, T0 + 1), SlotBusy)
        # the counter was not marked used: retention still finds it idle since T0
        assert await rates.prune_rates(NS, T0 + 500, 100) >= 1
        assert (await other.read_rates(NS, T0 + 1, counters=["c"])).counters == {"c": 0}

    async def test_prune_deletes_idle_counters(self, rates: RateStore, other: RateStore) -> None:
        """Counters last updated (a spend or a read) before ``before`` go, by the app's clock;
        a counter pruned counts again from 0; the ledger stays."""
        await rates.counter_add(NS, ["old", "read"], [1, 1], [None, None], T0,
                                SpendEntry("t", None, None, 1, "usd", T0))
        await other.counter_add(NS, ["new"], [1], [None], T0 + 30)
        await rates.counter_add(NS, ["read"], [0], [None], T0 + 25)     # a read keeps it
        await rates.counter_add("elsewhere", ["old"], [1], [None], T0)
        assert await other.prune_rates(NS, T0, 100) == 0, "updated at T0 is not before T0"
        assert await rates.prune_rates(NS, T0 + 20, 100) == 1
        assert await other.prune_rates(NS, T0 + 20, 100) == 0
        got = await rates.counter_add(NS, ["old", "new", "read"], [0, 0, 0], [None] * 3, T0 + 31)
        assert got.totals == [0, 1, 1]
        assert (await rates.counter_add("elsewhere", ["old"], [0], [None], T0)).totals == [1]
        assert len(await rates.ledger(NS)) == 1, "the ledger is kept"

    async def test_prune_deletes_at_most_its_limit_of_counters(self, rates: RateStore) -> None:
        for i in range(5):
            await rates.counter_add(NS, [f"c{i}"], [1], [None], T0 + i)
        await rates.counter_add(NS, ["live"], [1], [None], T0 + 100)
        assert await rates.prune_rates(NS, T0 + 10, 2) == 2
        assert await rates.prune_rates(NS, T0 + 10, 10) == 3
        assert await rates.prune_rates(NS, T0 + 10, 10) == 0
        got = await rates.counter_add(NS, ["c0", "c4", "live"], [0, 0, 0], [None] * 3, T0 + 101)
        assert got.totals == [0, 0, 1]

    async def test_prune_deletes_idle_counters_oldest_first_then_in_key_order(
        self, rates: RateStore
    ) -> None:
        """A provider's circuit counters rely on the order: of a pair written at one time and
        cut by a batch, ``…-opened`` goes before ``…-reclosed``, never the other way."""
        await rates.counter_add(NS, ["p:circuit-reclosed", "p:circuit-opened"], [3, 3],
                                [None, None], T0)
        await rates.counter_add(NS, ["older"], [1], [None], T0 - 1)
        assert await rates.prune_rates(NS, T0 + 10, 2) == 2
        got = await rates.counter_add(NS, ["older", "p:circuit-opened", "p:circuit-reclosed"],
                                      [0, 0, 0], [None] * 3, T0 + 11)
        assert got.totals == [0, 0, 3]

    async def test_prune_deletes_ended_slots_windows_and_pauses(self, rates: RateStore) -> None:
        await rates.slot_acquire(NS, "s", "ended", 5, 10, T0)            # lease ends T0 + 10
        await rates.slot_acquire(NS, "s", "live", 5, 1000, T0)
        await rates.window_add(NS, "w", 1, 60, None, T0)
        await rates.window_add(NS, "w", 1, 60, None, T0 + 30)
        await rates.pause_until(NS, "p", T0 + 15, T0)
        await rates.counter_add(NS, ["new"], [1], [None], T0 + 30)
        # slot "ended", the window's entry of T0, the pause
        assert await rates.prune_rates(NS, T0 + 20, 100) == 3
        assert await rates.prune_rates(NS, T0 + 20, 100) == 0
        wide = await rates.window_add(NS, "w", 0, 1000, None, T0 + 31)
        assert wide.total == 1, "the pruned entry no longer counts, even in a wider window"
        assert await rates.slot_renew(NS, "s", "live", 1000, T0 + 31)
        assert await rates.paused_until(NS, "p", T0) is None, "the pause is gone"

    async def test_prune_rates_deletes_at_most_its_limit(self, rates: RateStore) -> None:
        for i in range(5):
            await rates.window_add(NS, "w", 1, 60, None, T0 + i)
        assert await rates.prune_rates(NS, T0 + 10, 2) == 2
        assert await rates.prune_rates(NS, T0 + 10, 10) == 3
        assert (await rates.window_add(NS, "w", 0, 1000, None, T0 + 11)).total == 0


def unwritten(row: SpendEntry) -> SpendEntry:
    """A ledger row as it was before the store gave it its id."""
    return dataclasses.replace(row, id=None)


def increasing(rows: list[SpendEntry]) -> bool:
    """Whether every row has an id, each larger than the one before."""
    ids = [r.id for r in rows]
    return all(isinstance(i, int) for i in ids) and all(
        a < b for a, b in itertools.pairwise(i for i in ids if i is not None))


def _matches(row: SpendEntry, tenant: str | None = None, root_id: str | None = None,
             run_id: str | None = None, since: float | None = None,
             until: float | None = None) -> bool:
    return ((tenant is None or row.tenant == tenant)
            and (root_id is None or row.root_id == root_id)
            and (run_id is None or row.run_id == run_id)
            and (since is None or row.at >= since)
            and (until is None or row.at < until))
