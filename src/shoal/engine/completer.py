"""The completer: the settlements of the executions ending here, written in batches apart from
the engine that executes them. Each batch goes with the claim of as many runs as it leaves
slots free (``store.settle_and_claim``: one transaction on the SQL stores, the claim committed
with the settlements, so an instance never holds more claims than slots)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from shoal.clock import Clock
from shoal.engine.context import Execution
from shoal.scope import outside_run
from shoal.types import Fence, Run, Settlement

SETTLE_BATCH = 500   # settlements written together at most

# a settlement queued: the execution, its settlement, when it was asked, and its caller's answer
_Queued = tuple[Execution, Settlement, float, "asyncio.Future[bool]"]


class CompleterHost(Protocol):
    """What the completer asks of the engine that hands it settlements."""

    @property
    def claim_lock(self) -> asyncio.Lock:
        """Held for each claim: scheduling passes and settlement batches claim one at a time,
        or two would claim past the free slots."""

    def claimable(self) -> int:
        """Runs a batch may claim now, for the slots free (0 while the instance stops)."""

    async def settle_and_claim(self, settlements: list[tuple[Fence, Settlement, float]],
                               limit: int, now: float) -> tuple[Sequence[bool], list[Run]]:
        """Write the settlements (each fenced: False where the claim was lost) and claim up to
        ``limit`` runs at ``now``, at once."""

    def launch_claimed(self, runs: list[Run], claimed_at: float) -> None:
        """Execute the runs a batch claimed at ``claimed_at``."""

    def kick(self) -> None:
        """Ask for a scheduling pass soon."""


class Completer:
    """Takes the settlements of ending executions (:meth:`settle`) and writes them, a batch at
    a time, from one task of its own: it is never cancelled with a caller or a scheduling
    pass, and writes what is queued even while the instance stops (then without claiming).
    Settlements queued while a batch is written go in the next, at most one per run, so each
    is answered as if alone; a batch that fails answers each of its callers with the error."""

    def __init__(self, host: CompleterHost, clock: Clock) -> None:
        self._host = host
        self._clock = clock
        self._queued: list[_Queued] = []
        self._writer: asyncio.Task[None] | None = None

    async def settle(self, x: Execution, settlement: Settlement, now: float) -> bool:
        """Write ``settlement`` of ``x`` (finishing) in the next batch: True once committed,
        False when the claim was lost (fenced). Raises what the store raised for its batch."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queued.append((x, settlement, now, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write(), name="shoal-settle",
                                               context=outside_run())
        # a cancelled caller cancels only its own future: the settlement is written all the same
        return await done

    def _next_batch(self) -> list[_Queued]:
        """Take the next batch off the queue: at most :data:`SETTLE_BATCH`, one per run."""
        batch: list[_Queued] = []
        rest: list[_Queued] = []
        runs: set[str] = set()
        for item in self._queued:
            if item[0].run.id in runs or len(batch) >= SETTLE_BATCH:
                rest.append(item)
            else:
                runs.add(item[0].run.id)
                batch.append(item)
        self._queued = rest
        return batch

    async def _write(self) -> None:
        host = self._host
        while self._queued:
            async with host.claim_lock:
                batch = self._next_batch()
                for x, _, _, _ in batch:
                    x.settling()   # their slots are free for this batch's claim
                free = host.claimable()
                claimed = await self._write_batch(batch, free)
            if free and len(claimed) >= free:
                host.kick()   # there may be more due than this batch freed

    async def _write_batch(self, batch: list[_Queued], free: int) -> list[Run]:
        """Write one batch with a claim of up to ``free`` runs, answer its callers and launch
        what it claimed: the runs claimed (none when the write failed)."""
        host = self._host
        sent = self._clock.now()
        try:
            held, claimed = await host.settle_and_claim(
                [(x.fence, settlement, at) for x, settlement, at, _ in batch], free, sent)
            if len(held) != len(batch):
                raise RuntimeError(f"the store answered {len(held)} of {len(batch)} "
                                   f"settlements")
        except BaseException as e:
            for x, _, _, done in batch:
                x.settle_failed()
                if done.done():
                    continue
                if isinstance(e, Exception):
                    done.set_exception(e)
                else:   # the loop is going away: so are the callers
                    done.cancel()
            if not isinstance(e, Exception):
                raise
            return []
        for (_, _, _, done), ok in zip(batch, held, strict=True):
            if not done.done():
                done.set_result(ok)
        host.launch_claimed(claimed, sent)
        return claimed
