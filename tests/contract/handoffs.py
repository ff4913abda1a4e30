"""Lock hand-offs through ``app.lock``'s LockManager, over each coordination backend: a test
that needs the coordination layer, so it is not part of the store contract
(:mod:`shoal.testing.contract` imports no app or engine). Mixed into the contract classes of
``test_coord_*.py`` beside :class:`~shoal.testing.contract.CoordContract`, with their fixtures
(pytest puts this directory on sys.path; ``conftest.py`` has pytest rewrite its asserts)."""

from __future__ import annotations

import asyncio
from typing import Any

from shoal.clock import SystemClock
from shoal.coord.lock import LockManager
from shoal.ports import CoordStore
from shoal.types import LockGrant, LockWait


class LockManagerHandOffs:
    """Provide the ``coord`` and ``other`` fixtures (a CoordContract's)."""

    # the most refused asks per acquisition (a store whose FIFO is best effort, as Redlock's,
    # may allow more)
    refused_per_handoff = 1.6

    async def test_lock_managers_ask_once_per_hand_off(
        self, coord: CoordStore, other: CoordStore
    ) -> None:
        """Eight app.lock callers (on two handles) take one key in turns: each acquisition
        costs at most about one refused ask besides the grant, not one per waiter woken."""
        refused = [0]

        class Counting:
            def __init__(self, store: CoordStore) -> None:
                self._store = store

            def __getattr__(self, name: str) -> Any:
                return getattr(self._store, name)

            async def lock_acquire(self, *args: Any) -> LockGrant | LockWait:
                got = await self._store.lock_acquire(*args)
                refused[0] += isinstance(got, LockWait)
                return got

        clock = SystemClock()
        stores = [Counting(coord), Counting(other)]
        managers = [LockManager(lambda s=stores[i % 2]: s, clock,  # type: ignore[misc]
                                "handoffs", f"m{i}", 30.0, []) for i in range(8)]
        rounds = 6
        holding: list[int] = []
        tokens: list[int] = []

        async def loop(i: int) -> None:
            # one after the other at first: contenders that queue at the same instant may be
            # queued in different orders on Redlock's servers (its FIFO is best effort)
            await asyncio.sleep(0.005 * i)
            for _ in range(rounds):
                lock = await managers[i].acquire(("k",))
                holding.append(i)
                assert holding == [i], holding
                tokens.append(lock.token)
                await asyncio.sleep(0.01)
                holding.remove(i)
                await managers[i].release(lock)

        await asyncio.wait_for(asyncio.gather(*(loop(i) for i in range(8))), 60)
        assert tokens == sorted(tokens) and len(set(tokens)) == 8 * rounds
        per = refused[0] / (8 * rounds)
        # an acquisition queues once (1) and is woken when it is next; the old wake-everyone
        # hand-off cost about one refused ask per waiter still queued (~4.5 here)
        assert per <= self.refused_per_handoff, f"{per:.2f} refused asks per acquisition"

