"""Turns at a store's connections (``shoal.backends.postgres.turns``): first come, first served,
lease renewals first, and a caller's patience counted against the queue's progress."""

from __future__ import annotations

import asyncio
import time

import pytest

from shoal.backends.postgres.turns import Turns


async def test_turns_go_in_order_and_urgent_ones_first() -> None:
    turns = Turns(1, patience=5.0)
    await turns.take()
    order: list[str] = []

    async def wait(name: str, urgent: bool = False) -> None:
        await turns.take(urgent=urgent)
        order.append(name)
        turns.give()

    tasks = [asyncio.create_task(wait("a")), asyncio.create_task(wait("b")),
             asyncio.create_task(wait("renewal", urgent=True))]
    await asyncio.sleep(0.01)
    assert turns.waiting == 3
    turns.give()
    await asyncio.gather(*tasks)
    assert order == ["renewal", "a", "b"]
    turns.close()


async def test_a_cancelled_waiter_hands_its_turn_on() -> None:
    turns = Turns(1, patience=5.0)
    await turns.take()
    first = asyncio.create_task(turns.take())
    second = asyncio.create_task(turns.take())
    await asyncio.sleep(0.01)
    turns.give()          # granted to first, which is cancelled before it runs
    first.cancel()
    await asyncio.wait_for(second, 1.0)
    turns.give()
    await asyncio.wait_for(turns.take(), 1.0)   # no turn was lost
    turns.close()


async def test_waiters_fail_only_when_the_queue_stops_moving() -> None:
    turns = Turns(1, patience=0.3)
    await turns.take()
    waiters = [asyncio.create_task(turns.take()) for _ in range(3)]
    for _ in range(6):    # 0.6 s in all, but someone is served every 0.1 s
        await asyncio.sleep(0.1)
        turns.served()
    assert not any(w.done() for w in waiters)
    started = time.monotonic()
    for w in waiters:      # every one of them, at once
        with pytest.raises(TimeoutError):
            await w
    assert 0.2 < time.monotonic() - started < 0.6
    assert turns.waiting == 0
    turns.give()
    await asyncio.wait_for(turns.take(), 1.0)   # the turn held all along is free again
    turns.close()


async def test_time_the_event_loop_was_held_up_is_not_counted() -> None:
    """A loop blocked past the patience (CPU-bound code, a burst's tasks starting) is no
    sign of a dead store: it counts as one late tick, not as its length."""
    turns = Turns(1, patience=0.3)
    await turns.take()
    waiter = asyncio.create_task(turns.take())
    await asyncio.sleep(0.01)
    time.sleep(0.5)       # noqa: ASYNC251 (blocks the loop on purpose)
    await asyncio.sleep(0.1)
    assert not waiter.done()
    turns.give()
    await asyncio.wait_for(waiter, 1.0)
    turns.close()
