"""app.lock, app.locked, app.slots, app.on_assigned and app.meter, through the public API, on
several instances over one store (memory, then SQLite) and one VirtualClock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers import until

import shoal
from shoal.backends.memory import MemoryStore
from shoal.backends.sqlite import SQLiteStore
from shoal.ports import CoordStore, Store
from shoal.testing import VirtualClock, cluster, settle
from shoal.types import LockGrant

LEASE = 30.0
INTERVAL = 5.0


def make(store: Any, clock: Any, instance_id: str, namespace: str = "coord") -> shoal.App:
    return shoal.App(namespace, store=store, clock=clock, instance_id=instance_id, lease=LEASE,
                     membership_interval=INTERVAL)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else SQLiteStore(
        str(tmp_path / "coord.db"))
    await s.open()
    yield s
    await s.close()


@pytest.fixture
async def two(clock: VirtualClock, store: Store) -> AsyncIterator[list[shoal.App]]:
    async with cluster(make, instances=2, clock=clock, store=store) as apps:
        yield apps


# -- lock -------------------------------------------------------------------------------------


async def test_lock_is_exclusive_fifo_and_tokens_increase(two: list[shoal.App]) -> None:
    a, b = two
    order: list[tuple[str, int]] = []
    holding: list[str] = []

    async def worker(app: shoal.App, name: str) -> None:
        async with app.lock("settlement") as lock:
            holding.append(name)
            assert holding == [name], f"two holders at once: {holding}"
            order.append((name, lock.token))
            await asyncio.sleep(0)
            await settle(5)
            holding.remove(name)

    first = await a.lock("settlement").__aenter__()
    tasks = []
    for i in range(6):
        tasks.append(asyncio.create_task(worker(a if i % 2 else b, f"w{i}")))
        await settle()        # each queues before the next asks: FIFO by arrival
    await a._locks.release(first)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)   # woken by releases, no clock advance
    assert [n for n, _ in order] == [f"w{i}" for i in range(6)]
    tokens = [first.token] + [t for _, t in order]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


async def test_released_on_exception_and_locked_returns_the_result(
    two: list[shoal.App],
) -> None:
    a, b = two
    with pytest.raises(ZeroDivisionError):
        async with a.lock(["x", "y"]):
            raise ZeroDivisionError
    seen: list[shoal.AbortSignal] = []

    def sync_fn(signal: shoal.AbortSignal) -> str:
        seen.append(signal)
        return "done"

    assert await asyncio.wait_for(b.locked(["y", "x"], sync_fn), 2) == "done"

    async def async_fn(signal: shoal.AbortSignal) -> int:
        signal.raise_if_aborted()
        return 42

    assert await asyncio.wait_for(a.locked("x", async_fn), 2) == 42
    # once released, the lock may have another holder: its signal says so
    assert seen[0].aborted and "released" in str(seen[0].reason)


async def test_a_cancelled_locked_call_keeps_the_lock_until_its_thread_returns(
    two: list[shoal.App],
) -> None:
    a, b = two
    import threading
    go = threading.Event()
    saw_abort: list[bool] = []

    def work(signal: shoal.AbortSignal) -> None:
        go.wait(5)
        saw_abort.append(signal.aborted)

    task = asyncio.create_task(a.locked("k", work))
    await asyncio.sleep(0.05)
    task.cancel()
    other = asyncio.create_task(b.lock("k").__aenter__())
    await asyncio.sleep(0.1)
    assert not other.done(), "the thread still runs under the lock"
    go.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert saw_abort == [True], "the thread was told through its signal"
    lock = await asyncio.wait_for(other, 2)
    await b._locks.release(lock)


async def test_a_grant_answered_after_its_lease_is_not_used(
    clock: VirtualClock, two: list[shoal.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = two
    store = a.store
    assert isinstance(store, CoordStore)
    real = store.lock_acquire
    late = {"first": True}

    async def slow(*args: Any) -> Any:
        got = await real(*args)
        if late["first"]:
            late["first"] = False
            await clock.sleep(LEASE + 1)        # the answer arrives after the lease
        return got

    monkeypatch.setattr(store, "lock_acquire", slow)
    task = asyncio.create_task(a.lock("k").__aenter__())
    await settle()
    await clock.advance(LEASE + 2)
    await until(lambda: _done(task))
    lock = task.result()
    assert lock.token == 2, "the late grant was given back and a fresh one taken"
    assert lock.held_until > clock.now() and not lock.signal.aborted
    await a._locks.release(lock)


async def test_an_error_after_the_store_granted_does_not_queue_behind_itself(
    clock: VirtualClock, two: list[shoal.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = two
    store = a.store
    assert isinstance(store, CoordStore)
    real = store.lock_acquire
    failed = {"once": True}

    async def granted_then_lost(*args: Any) -> Any:
        got = await real(*args)
        if failed["once"]:
            failed["once"] = False
            raise shoal.StoreUnavailableError("the answer was lost")
        return got

    monkeypatch.setattr(store, "lock_acquire", granted_then_lost)
    task = asyncio.create_task(a.lock("k").__aenter__())
    await settle()
    await clock.advance(1.5)                    # one retry delay, far less than the lease
    await until(lambda: _done(task))
    await a._locks.release(task.result())


async def test_several_keys_in_any_order_never_deadlock(two: list[shoal.App]) -> None:
    a, b = two
    held: set[str] = set()

    async def worker(app: shoal.App, keys: list[str], rounds: int) -> None:
        for _ in range(rounds):
            async with app.lock(keys):
                assert not held & set(keys), (held, keys)
                held.update(keys)
                await settle(2)
                held.difference_update(keys)

    await asyncio.wait_for(asyncio.gather(
        worker(a, ["p", "q"], 10), worker(b, ["q", "p"], 10), worker(a, ["q"], 10),
        worker(b, ["p", "r"], 10), worker(a, ["r", "q", "p"], 10)), 10)


async def test_a_dead_holder_loses_the_lock_when_its_lease_ends(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, _ = two
    store = a.store
    assert isinstance(store, CoordStore)
    # a holder that never renews: a process that died right after taking the lock
    dead = await store.lock_acquire("coord", ["k"], "dead-process", LEASE, clock.now())
    assert isinstance(dead, LockGrant)
    task = asyncio.create_task(a.lock("k").__aenter__())
    await settle()
    await clock.advance(LEASE - 1)
    assert not task.done()
    await clock.advance(2)
    await until(lambda: _done(task))
    lock = task.result()
    assert lock.token == dead.token + 1
    await a._locks.release(lock)


async def _done(task: asyncio.Task[Any]) -> bool:
    return task.done()


async def test_the_lock_is_renewed_while_held(clock: VirtualClock, two: list[shoal.App]) -> None:
    a, b = two
    async with a.lock("k") as lock:
        waiting = asyncio.create_task(b.lock("k").__aenter__())
        for _ in range(10):
            await clock.advance(LEASE / 2)
        assert not waiting.done() and not lock.signal.aborted
    await until(lambda: _done(waiting))
    await b._locks.release(waiting.result())


async def test_the_signal_fires_when_renewal_is_refused(
    clock: VirtualClock, two: list[shoal.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = two
    async with a.lock("k") as lock:
        async def refuse(*args: Any) -> bool:
            return False
        monkeypatch.setattr(a.store, "lock_renew", refuse)
        await clock.advance(LEASE / 3 + 1)
        assert lock.signal.aborted
        with pytest.raises(shoal.LockLostError, match="renewal refused"):
            lock.signal.raise_if_aborted()


async def test_the_signal_fires_when_the_store_is_unreachable_past_the_lease(
    clock: VirtualClock, two: list[shoal.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = two
    async with a.lock("k") as lock:
        async def down(*args: Any) -> bool:
            raise shoal.StoreUnavailableError("down")
        monkeypatch.setattr(a.store, "lock_renew", down)
        await clock.advance(LEASE * 0.9 - 1)
        assert not lock.signal.aborted, "the lease still holds, less the drift margin"
        await clock.advance(1.5)     # the lease less a tenth: another's clock may be ahead
        assert lock.signal.aborted
        assert isinstance(lock.signal.reason, shoal.LockLostError)
        assert "ran out" in str(lock.signal.reason)


async def test_the_signal_fires_before_the_lease_ends_when_the_store_does_not_answer(
    clock: VirtualClock, two: list[shoal.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal that never comes back (a partition that holds the bytes) does not hold the
    signal past the lease less the drift margin, whatever the store does."""
    a, _ = two
    async with a.lock("k") as lock:
        async def hang(*args: Any) -> bool:
            await asyncio.Event().wait()
            return True
        monkeypatch.setattr(a.store, "lock_renew", hang)
        await clock.advance(LEASE * 0.9 - 0.5)
        assert not lock.signal.aborted
        await clock.advance(1)
        assert lock.signal.aborted and "drift margin" in str(lock.signal.reason)


async def test_a_waiter_keeps_waiting_through_an_outage(
    clock: VirtualClock, two: list[shoal.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, b = two
    real = b.store.lock_acquire  # type: ignore[attr-defined]

    async def down(*args: Any) -> Any:
        raise shoal.StoreUnavailableError("down")

    monkeypatch.setattr(b.store, "lock_acquire", down)
    task = asyncio.create_task(b.lock("k").__aenter__())
    await clock.advance(10)
    assert not task.done()
    monkeypatch.setattr(b.store, "lock_acquire", real)
    await clock.advance(2)
    await until(lambda: _done(task))
    await b._locks.release(task.result())


async def test_a_waiter_gives_up_once_the_store_failed_for_a_whole_lease(
    clock: VirtualClock, two: list[shoal.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock waits as long as it takes for its holders, not for a store it cannot ask."""
    _, b = two
    asks: list[float] = []

    async def down(*args: Any) -> Any:
        asks.append(clock.now())
        raise shoal.StoreUnavailableError("Redis at redis://10.0.0.9:6379/0 is unavailable")

    monkeypatch.setattr(b.store, "lock_acquire", down)
    monkeypatch.setattr(b.store, "lock_release", down)
    started = clock.now()
    task = asyncio.create_task(b.lock(["k", "j"]).__aenter__())
    for _ in range(int(LEASE) - 1):
        await clock.advance(1)
    assert not task.done(), "gave up before a lease had passed"
    await clock.advance(2)
    assert task.done(), "still waiting a lease after the store stopped answering"
    with pytest.raises(shoal.StoreUnavailableError) as e:
        await task
    assert str(e.value).startswith("app.lock(['k', 'j']) gave up: the coordination store could "
                                   "not be asked for 30 s (the lease); last error: "
                                   "StoreUnavailableError: Redis at redis://10.0.0.9:6379/0")
    assert len([t for t in asks if t - started <= LEASE]) > LEASE / 2, "it kept asking"


async def test_a_waiter_behind_a_live_holder_waits_longer_than_a_lease(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = two
    async with a.lock("k"):
        task = asyncio.create_task(b.lock("k").__aenter__())
        for _ in range(int(3 * LEASE)):
            await clock.advance(1)
        assert not task.done()
    await until(lambda: _done(task))
    await b._locks.release(task.result())


async def test_a_cancelled_waiter_leaves_the_queue(two: list[shoal.App]) -> None:
    a, b = two
    first = await a.lock("k").__aenter__()
    quitter = asyncio.create_task(b.lock("k").__aenter__())
    await settle()
    patient = asyncio.create_task(a.lock("k").__aenter__())
    await settle()
    quitter.cancel()
    await settle()
    await a._locks.release(first)
    await until(lambda: _done(patient))
    await a._locks.release(patient.result())


async def test_a_dead_holder_is_noticed_at_its_lease_end_with_one_ask_per_waiter(
    clock: VirtualClock, two: list[shoal.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight waiters behind a holder that died: when its lease ends, the first waiter takes the
    lock. The seven others ask once then too (the holder's end is every waiter's retry_at, so
    that a waiter ahead giving up meanwhile cannot leave the rest waiting, its release naming
    nobody), are refused, and sleep until their next lease/3 re-ask: one round of asks per dead
    holder, like one of those re-asks."""
    a, b = two
    store = a.store
    assert isinstance(store, CoordStore)
    start = clock.now()
    dead = await store.lock_acquire("coord", ["k"], "dead-process", LEASE, start)
    assert isinstance(dead, LockGrant)
    await clock.advance(5)      # their re-asks to keep their places fall at 15, 25, then 40 …
    asks: list[float] = []
    real = store.lock_acquire

    async def counted(*args: Any) -> Any:
        asks.append(clock.now() - start)
        return await real(*args)

    monkeypatch.setattr(store, "lock_acquire", counted)
    waiters = [asyncio.create_task(app.lock("k").__aenter__()) for app in [a, b] * 4]
    await settle()
    await clock.advance(LEASE - 5 - 1)
    assert not any(w.done() for w in waiters)
    before = len(asks)
    await clock.advance(2)
    await until(lambda: _done(waiters[0]))
    await clock.advance(LEASE / 3 - 2 - 0.1)    # up to just before the re-asks at 40
    assert asks[before:] == [LEASE] * 8, "each asked once, at the holder's lease end"
    lock = waiters[0].result()
    assert lock.token == dead.token + 1 and not any(w.done() for w in waiters[1:])
    for w in waiters[1:]:
        w.cancel()
    await asyncio.gather(*waiters[1:], return_exceptions=True)
    await a._locks.release(lock)


async def test_a_waiter_that_died_first_in_line_holds_up_the_next_for_its_lease_at_most(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    a, b = two
    store = a.store
    assert isinstance(store, CoordStore)
    held = await a.lock("k").__aenter__()
    await clock.advance(1)
    # a waiter that never asks again: a process killed while it was first in line
    assert not isinstance(await store.lock_acquire("coord", ["k"], "dead", LEASE, clock.now()),
                          LockGrant)
    await clock.advance(1)
    patient = asyncio.create_task(b.lock("k").__aenter__())
    await settle()
    await clock.advance(3)
    await a._locks.release(held)        # names the dead waiter: nobody hears it
    await clock.advance(LEASE - 6)      # the dead waiter's row lives until 1 + LEASE
    assert not patient.done()
    await clock.advance(2)
    await until(lambda: _done(patient))
    await b._locks.release(patient.result())


async def test_a_dead_holder_loses_the_lock_at_its_lease_end_when_the_first_waiter_gives_up(
    clock: VirtualClock, two: list[shoal.App]
) -> None:
    """A release names the next waiter only on a key with no holder, and a dead holder's row is
    still there: the second waiter is due at the holder's lease end by its own retry_at (the
    earlier of the holder's end and the first waiter's), not at its lease/3 re-ask."""
    a, b = two
    store = a.store
    assert isinstance(store, CoordStore)
    start = clock.now()
    dead = await store.lock_acquire("coord", ["k"], "dead-process", LEASE, start)
    assert isinstance(dead, LockGrant)                  # until start + 30, never renewed
    await clock.advance(1)
    first = asyncio.create_task(a.lock("k").__aenter__())     # due at the holder's end
    await settle()
    await clock.advance(18.9)
    second = asyncio.create_task(b.lock("k").__aenter__())    # due at the holder's end too
    await settle()
    await clock.advance(LEASE - 0.05 - 19.9)            # +29.95: the first waiter gives up
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    try:
        await clock.advance(1.05)                       # +31: the holder's lease ended at +30
        await until(lambda: _done(second))
        assert second.result().token == dead.token + 1
    finally:
        await clock.advance(10)                         # (if not: the lease/3 re-ask, +39.9)
        await until(lambda: _done(second))
        await b._locks.release(second.result())


async def test_a_waiter_cancelled_as_it_is_woken_passes_the_lock_on(
    two: list[shoal.App],
) -> None:
    """No timer is involved: the cancelled waiter's leaving wakes the next one."""
    a, b = two
    held = await a.lock("k").__aenter__()
    woken = asyncio.create_task(b.lock("k").__aenter__())
    await settle()
    patient = asyncio.create_task(a.lock("k").__aenter__())
    await settle()
    await a._locks.release(held)         # wakes `woken` alone …
    woken.cancel()                       # … which is cancelled before it asks
    with pytest.raises(asyncio.CancelledError):
        await woken
    await until(lambda: _done(patient))  # the clock never moves
    await a._locks.release(patient.result())


async def test_lock_keys_are_checked(two: list[shoal.App]) -> None:
    a, _ = two
    for bad in ([], "", [""], [1], None):
        with pytest.raises(ValueError, match="lock"):
            a.lock(bad)  # type: ignore[arg-type]


async def test_apps_of_two_namespaces_never_meet(clock: VirtualClock, store: Store) -> None:
    one = make(store, clock, "i1", namespace="one")
    two = make(store, clock, "i2", namespace="two")
    async with one, two:
        async with one.lock("k"), two.lock("k"):
            pass
        await one.meter(["k"], [1000])
        assert await two.meter(["k"], [0]) == [0]


# -- slots ------------------------------------------------------------------------------------


async def step(clock: VirtualClock, seconds: float, apps: list[shoal.App], total: int = 16,
               tick: float = 0.5) -> None:
    """Advance in small ticks, checking at each that no slot has two owners."""
    for _ in range(int(seconds / tick)):
        await clock.advance(tick)
        owners: dict[int, str] = {}
        for app in apps:
            for s in app.slots(total) or []:
                assert s not in owners, f"slot {s} owned by {owners[s]} and {app.instance_id}"
                owners[s] = app.instance_id


def owned(apps: list[shoal.App], total: int = 16) -> list[int]:
    return sorted(s for app in apps for s in app.slots(total) or [])


async def test_one_replica_owns_every_slot_after_about_two_intervals(
    clock: VirtualClock, store: Store
) -> None:
    app = make(store, clock, "solo")
    seen: list[shoal.Assignment | None] = []
    off = app.on_assigned(seen.append)
    assert seen == [None]
    async with app:
        assert app.slots(4) is None
        await step(clock, 1.5 * INTERVAL, [app])
        assert app.slots(4) is None, "a replica that just started owns nothing"
        await step(clock, INTERVAL, [app])
        assert app.slots(4) == [0, 1, 2, 3]
        assert seen == [None, shoal.Assignment(0, 1)]
        off()
    assert app.slots(4) is None


async def test_slots_are_split_and_rebalanced_without_overlap(
    clock: VirtualClock, store: Store
) -> None:
    apps = [make(store, clock, f"r{i}") for i in range(3)]
    await apps[0].start()
    await apps[1].start()
    try:
        await step(clock, 3 * INTERVAL, apps[:2])
        assert owned(apps[:2]) == list(range(16))
        assert {len(a.slots(16) or []) for a in apps[:2]} == {8}
        await apps[2].start()                            # a replica joins
        await step(clock, 4 * INTERVAL, apps)
        assert owned(apps) == list(range(16))
        assert all(a.slots(16) for a in apps)
        await apps[0].close(timeout=0)                   # a replica leaves
        await step(clock, 3 * INTERVAL, apps[1:])
        assert owned(apps[1:]) == list(range(16))
    finally:
        for app in apps:
            await app.close(timeout=0)


async def test_a_frozen_replica_lets_go_before_others_take_its_slots(
    clock: VirtualClock, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(store, CoordStore)
    apps = [make(store, clock, f"r{i}") for i in range(2)]
    async with apps[0], apps[1]:
        await step(clock, 3 * INTERVAL, apps)
        assert owned(apps) == list(range(16))
        frozen = apps[0]
        membership = frozen._membership
        assert membership is not None
        never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def hang(*args: Any) -> Any:
            return await never             # the store never answers this replica

        monkeypatch.setattr(membership.coord, "heartbeat", _only_for(
            membership.member, hang, store.heartbeat))
        await step(clock, 5 * INTERVAL, apps)    # never two owners at any tick
        assert frozen.slots(16) is None
        assert apps[1].slots(16) == list(range(16))
        never.cancel()


def _only_for(member: str, replacement: Any, real: Any) -> Any:
    async def heartbeat(namespace: str, who: str, *args: Any, **kwargs: Any) -> Any:
        if who == member:
            return await replacement()
        return await real(namespace, who, *args, **kwargs)
    return heartbeat


async def test_slots_answer_none_while_the_store_is_down_then_come_back(
    clock: VirtualClock, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(store, CoordStore)
    app = make(store, clock, "solo")
    async with app:
        await step(clock, 3 * INTERVAL, [app])
        assert app.slots(2) == [0, 1]
        real = store.heartbeat

        async def down(*args: Any, **kwargs: Any) -> Any:
            raise shoal.StoreUnavailableError("down")

        monkeypatch.setattr(store, "heartbeat", down)
        await step(clock, 2 * INTERVAL + 1, [app])
        assert app.slots(2) is None
        monkeypatch.setattr(store, "heartbeat", real)
        await step(clock, 4 * INTERVAL, [app])
        assert app.slots(2) == [0, 1]


async def test_a_raising_listener_leaves_the_replica_owning_nothing(
    clock: VirtualClock, store: Store
) -> None:
    apps = [make(store, clock, f"r{i}") for i in range(2)]
    async with apps[0], apps[1]:
        calls: list[Any] = []
        good: list[Any] = []
        first_owned: list[tuple[float, Any]] = []

        def bad(assignment: shoal.Assignment | None) -> None:
            calls.append(assignment)
            if assignment is not None:
                raise RuntimeError("listener bug")

        apps[0].on_assigned(good.append)      # called before the bad one, so it hears A first
        apps[0].on_assigned(bad)
        apps[1].on_assigned(lambda a: first_owned.append((clock.now(), a)))
        await step(clock, 6 * INTERVAL, apps)
        assert calls[0] is None and any(c is not None for c in calls)
        assert calls[-1] is None and good[-1] is None, "every listener hears None at the break"
        assert apps[0].slots(16) is None
        assert apps[1].slots(16) == list(range(16)), "the others take its share"


async def test_listeners_let_go_when_validity_ends_even_with_a_heartbeat_in_flight(
    clock: VirtualClock, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(store, CoordStore)
    app = make(store, clock, "solo")
    heard: list[tuple[float, Any]] = []
    app.on_assigned(lambda a: heard.append((clock.now(), a)))
    async with app:
        await step(clock, 3 * INTERVAL, [app])
        assert heard[-1][1] == shoal.Assignment(0, 1)
        real = store.heartbeat
        sent: list[float] = []

        async def slow_then_hang(*args: Any, **kwargs: Any) -> Any:
            if not sent:        # the last granted beat answers after 0.9 intervals
                sent.append(clock.now())
                await clock.sleep(0.9 * INTERVAL)
                return await real(*args)
            return await asyncio.get_running_loop().create_future()   # then never again

        monkeypatch.setattr(store, "heartbeat", slow_then_hang)
        await step(clock, 5 * INTERVAL, [app], tick=0.1)
        dropped_at = heard[-1][0]
        assert heard[-1][1] is None
        # validity ends two intervals after the granted beat was sent: listeners hear it then,
        # not a heartbeat timeout later (the store's row lives one interval longer)
        assert dropped_at <= sent[0] + 2 * INTERVAL + 0.15, (dropped_at - sent[0])


async def test_an_async_listener_lets_go_before_another_replica_takes_over(
    clock: VirtualClock, store: Store
) -> None:
    apps = [make(store, clock, f"r{i}") for i in range(2)]
    working: dict[int, str] = {}         # slot -> replica whose workers run it
    overlaps: list[Any] = []

    def listener_for(name: str) -> Any:
        async def listener(assignment: shoal.Assignment | None) -> None:
            mine = [s for s, who in working.items() if who == name]
            for slot in mine:            # stopping a worker takes a while
                await clock.sleep(0.5 * INTERVAL)
                del working[slot]
            for slot in (assignment.slots(8) if assignment else []):
                if slot in working:
                    overlaps.append((clock.now(), slot, working[slot], name))
                working[slot] = name
        return listener

    await apps[0].start()
    offs = [apps[0].on_assigned(listener_for("r0"))]
    try:
        await step(clock, 3 * INTERVAL, apps[:1], total=8)
        assert sorted(working) == list(range(8))
        await apps[1].start()
        offs.append(apps[1].on_assigned(listener_for("r1")))
        await step(clock, 12 * INTERVAL, apps, total=8, tick=0.25)
        assert overlaps == []
        assert sorted(working) == list(range(8)) and set(working.values()) == {"r0", "r1"}
    finally:
        for off in offs:      # nothing advances the virtual clock while the apps close
            off()
        for app in apps:
            await app.close(timeout=0)


async def test_slots_total_is_checked(two: list[shoal.App]) -> None:
    with pytest.raises(ValueError, match="total"):
        two[0].slots(0)


# -- meter ------------------------------------------------------------------------------------


async def test_meter_across_replicas(clock: VirtualClock, two: list[shoal.App]) -> None:
    a, b = two
    assert await a.meter(["appraise:c1", "appraise"], [6000, 6000]) == [6000, 6000]
    assert await b.meter(["appraise:c2", "appraise"], [6000, 6000]) == [6000, 12000]
    await clock.advance(2)
    assert await b.meter(["appraise"], [0]) == [10000]


async def test_meter_input_is_checked(two: list[shoal.App]) -> None:
    a, _ = two
    with pytest.raises(TypeError, match="lists"):
        await a.meter("k", [1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="same length"):
        await a.meter(["a", "b"], [1])
    with pytest.raises(ValueError, match="finite"):
        await a.meter(["a"], [float("nan")])
    with pytest.raises(ValueError, match="non-empty str"):
        await a.meter([""], [1])


# -- configuration and metrics ----------------------------------------------------------------


def test_an_even_number_of_addresses_is_refused() -> None:
    with pytest.raises(shoal.ConfigurationError) as e:
        shoal.App("x", store="memory://", coordination=["redis://a", "redis://b"])
    assert str(e.value) == "Atomicity takes an odd number of addresses, 2 given."
    with pytest.raises(shoal.ConfigurationError, match="redis://"):
        shoal.App("x", store="memory://", coordination="postgresql://x/y")


async def test_metrics_hooks(clock: VirtualClock, store: Store) -> None:
    events: list[tuple[Any, ...]] = []

    class Metrics:
        def on_lock_acquired(self, keys: tuple[str, ...], group: str, waited: float) -> None:
            events.append(("acquired", keys, group, waited))

        def on_lock_released(self, keys: tuple[str, ...], group: str, held: float,
                             lost: bool) -> None:
            events.append(("released", keys, group, held, lost))

        def on_slots_assigned(self, assignment: shoal.Assignment | None) -> None:
            events.append(("slots", assignment))

    app = make(store, clock, "m")
    app.observe(Metrics())
    async with app:
        async with app.lock("report:daily"):
            await clock.advance(3)
        await step(clock, 3 * INTERVAL, [app])
    assert events[0] == ("acquired", ("report:daily",), "report", 0.0)
    assert events[1] == ("released", ("report:daily",), "report", 3.0, False)
    assert ("slots", shoal.Assignment(0, 1)) in events


async def test_the_poll_prunes_coordination_state(clock: VirtualClock, store: Store) -> None:
    assert isinstance(store, CoordStore)
    app = shoal.App("coord", store=store, clock=clock, instance_id="p", lease=30.0,
                    membership_interval=INTERVAL, run_retention=100.0)
    async with app:
        await app.meter(["drained"], [1000])
        await clock.advance(50)
        assert await store.prune_coordination("coord", clock.now() - 100, 10) == 0
        await clock.advance(120)         # polls every 10 s: the drained meter goes
        if isinstance(store, MemoryStore):
            assert ("coord", "drained") not in store._meters
        # nothing left for a prune to find: the poll already deleted it
        assert await store.prune_coordination("coord", clock.now() - 100, 10) == 0
        assert await app.meter(["drained"], [0]) == [0]
