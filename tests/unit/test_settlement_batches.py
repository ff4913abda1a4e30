"""The engine writes settlements in batches, two at once at most, each with the claim of the
slots it frees: the store's answer may come late, and meanwhile the runs the other batch
brought execute. Never more runs execute than slots, and never more runs are claimed than
slots plus the runs whose settlement is being written."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from helpers import until

import shoal
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock
from shoal.types import Fence, Run, Settlement

SLOTS = 6


class SlowStore(MemoryStore):
    """Answers settle_and_claim a few loop turns late, and records what it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most_in_flight = 0
        self.settling = 0   # settlements in the batches in flight
        self.over = 0       # runs claimed past the slots and the runs settling elsewhere

    async def settle_and_claim(self, settlements: Sequence[tuple[Fence, Settlement, float]],
                               *args: Any, **kwargs: Any) -> tuple[list[bool], list[Run]]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.settling += len(settlements)
        try:
            for _ in range(3):
                await asyncio.sleep(0)
            held, claimed = await super().settle_and_claim(settlements, *args, **kwargs)
            running = [r for r in await self.list_runs("test", limit=1000)
                       if r.status == "running"]
            # the runs of the other batch in flight still show running until its answer
            elsewhere = self.settling - len(settlements)
            self.over = max(self.over, len(running) - SLOTS - elsewhere)
            return held, claimed
        finally:
            self.in_flight -= 1
            self.settling -= len(settlements)


async def test_two_batches_in_flight_never_run_or_claim_past_the_slots() -> None:
    store = SlowStore()
    app = shoal.App("test", store=store, clock=VirtualClock(), lease=30.0,
                    max_concurrent_runs=SLOTS)
    executing = 0
    most_executing = 0

    @app.workflow
    async def work(ctx: shoal.RunContext, input: Any) -> int:
        nonlocal executing, most_executing
        executing += 1
        most_executing = max(most_executing, executing)
        for _ in range(input % 3):
            await asyncio.sleep(0)
        executing -= 1
        return int(input)

    async with app:
        runs = await app.dispatch_many(work, list(range(60)))

        async def done() -> bool:
            return [(await app.get_run(r.id)).status for r in runs] == ["succeeded"] * 60

        await until(done, rounds=2000)
    assert [(await app.get_run(r.id)).output for r in runs] == list(range(60))
    assert 1 < most_executing <= SLOTS
    assert store.most_in_flight == 2      # the batches overlapped
    assert store.over <= 0
