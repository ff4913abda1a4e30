"""Retention: every poll interval, delete a bounded batch of what is no longer needed: final
runs (with their steps, signals and delivered outbox entries) older than ``run_retention``,
resolved pauses older than ``pause_retention``, and coordination and rate-limit rows that can
no longer matter; and fold the counts the store keeps for ``stats``. Any instance may do it:
the deletes are idempotent, and a fold changes no count."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from shoal.clock import Clock
from shoal.maintenance.service import Reporter, Service
from shoal.ports import Pauses, RunQueue

log = logging.getLogger("shoal")

PRUNE_BATCH = 500   # rows of each kind deleted per pass at most


class RunStore(RunQueue, Pauses, Protocol):
    """What retention deletes from."""


@dataclass(frozen=True)
class RetentionConfig:
    """How long what retention deletes is kept (``App(run_retention, pause_retention)``)."""

    run_retention: float = 7 * 86400.0     # final runs, from their end
    pause_retention: float = 86400.0       # resolved pauses, from their resolution


class Retention(Service):
    name = "retention"

    def __init__(self, clock: Clock, interval: float, reporter: Reporter, store: RunStore,
                 namespace: str, config: RetentionConfig,
                 prune_coordination: Callable[[float], Awaitable[None]]) -> None:
        super().__init__(clock, interval, reporter)
        self._store = store
        self._namespace = namespace
        self._run_retention = config.run_retention
        self._pause_retention = config.pause_retention
        self._prune_coordination = prune_coordination

    async def run_once(self) -> None:
        now = self.clock.now()
        await self._store.prune_runs(self._namespace, now - self._run_retention, PRUNE_BATCH)
        # after the prune, whose deletes the store counts too
        await self._store.fold_stats(self._namespace, now)
        await self._store.prune_pauses(self._namespace, now - self._pause_retention,
                                       PRUNE_BATCH)
        try:     # coordination may live elsewhere (Redis): its outage is not the runs'
            await self._prune_coordination(now - self._run_retention)
        except Exception as e:
            log.warning("prune.failed: %s: %s", type(e).__name__, e,
                        extra={"event": "prune.failed"})
