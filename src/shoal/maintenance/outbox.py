"""Outbox delivery: hand the due entries of the topics this instance handles to their handlers,
every poll interval and as soon as a step here wrote some. Delivered on success; otherwise due
again after a backoff, or dead-lettered after the handler's ``max_deliveries``. One pass at a
time here, and each entry is taken for a lease, so no two handlers get it at once."""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Mapping

from shoal._tasks import call_handler
from shoal.clock import Clock
from shoal.engine.runner import OutboxHandlerSpec
from shoal.maintenance.service import Reporter, Triggered
from shoal.ports import Outbox
from shoal.telemetry import NOTHING, Telemetry
from shoal.types import OutboxEntry

log = logging.getLogger("shoal")

DELIVERY_BATCH = 10   # entries taken at once


class OutboxDelivery(Triggered):
    name = "outbox.delivery"

    def __init__(self, clock: Clock, interval: float, reporter: Reporter, store: Outbox,
                 namespace: str, lease: float,
                 handlers: Mapping[str, OutboxHandlerSpec],
                 telemetry: Telemetry = NOTHING) -> None:
        super().__init__(clock, interval, reporter)
        self._store = store
        self._namespace = namespace
        self._lease = lease
        self._handlers = handlers
        self._telemetry = telemetry

    def trigger(self) -> None:
        if self._handlers:
            super().trigger()

    async def run_once(self) -> None:
        if not self._handlers:
            return
        while await self._deliver_batch():
            pass

    async def _deliver_batch(self) -> bool:
        """Deliver one batch; True when it was full (more may be due)."""
        claimed_at = self.clock.now()
        entries = await self._store.claim_outbox(self._namespace, list(self._handlers),
                                                 claimed_at, self._lease, DELIVERY_BATCH)
        # Entries are taken for one lease; one not handed over before a margin of it is left
        # is left alone, to be taken again (by anyone) once the lease passes.
        deadline = claimed_at + self._lease * 0.8
        for entry in entries:
            remaining = deadline - self.clock.now()
            if remaining <= 0:
                return False
            told = self._telemetry.delivery_started(entry)
            # what telemetry is told if writing the outcome fails: the entry is taken again
            # once its lease passes
            result, error = "store_failed", None
            try:
                try:
                    await call_handler(self._handlers[entry.topic].fn, self.clock, remaining,
                                       copy.deepcopy(entry.payload), entry.key)
                except Exception as e:
                    error = e
                    result = await self._failed(entry, e)
                    continue
                await self._store.finish_delivery(entry.id, self.clock.now())
                result = "delivered"
            finally:
                self._telemetry.delivery_ended(told, entry, result, error)
        return len(entries) == DELIVERY_BATCH

    async def _failed(self, entry: OutboxEntry, e: Exception) -> str:
        """Record a failed delivery: due again after a backoff (``retry``), or dead-lettered
        after the handler's ``max_deliveries`` (``dead``)."""
        now = self.clock.now()
        error = f"{type(e).__name__}: {e}"
        if entry.attempts + 1 >= self._handlers[entry.topic].max_deliveries:
            log.error("outbox.dead: %s %s after %d deliveries: %s", entry.topic,
                      entry.key, entry.attempts + 1, error,
                      extra={"event": "outbox.dead", "run_id": entry.run_id})
            await self._store.finish_delivery(entry.id, now, error, None)
            return "dead"
        delay = min(300.0, 2.0 ** entry.attempts) * random.uniform(0.5, 1.0)
        log.warning("outbox.retry: %s %s: %s; again in %.1fs", entry.topic,
                    entry.key, error, delay,
                    extra={"event": "outbox.retry", "run_id": entry.run_id})
        await self._store.finish_delivery(entry.id, now, error, now + delay)
        self.trigger_at(now + delay)
        return "retry"
