"""Recovery: every poll interval, requeue the runs whose claim expired (a crashed instance: the
attempt counts) or was released (a stop: it does not), log once per run the started runs left to
an instance of their own code version, then ask the engine for a scheduling pass (runs that
became due with time, and those just requeued, are claimed then). Any instance may do it: the
store's ``recover_runs`` is atomic and idempotent."""

from __future__ import annotations

import logging
from collections.abc import Callable

from shoal.clock import Clock
from shoal.engine.runner import Registry
from shoal.maintenance.service import Reporter, Service
from shoal.ports import RunQueue
from shoal.telemetry import NOTHING, Telemetry
from shoal.types import Run

log = logging.getLogger("shoal")


def _fields(event: str, run: Run) -> dict[str, str]:
    """``extra=`` of a record about ``run``."""
    return {"event": event, "run_id": run.id, "workflow": run.workflow, "tenant": run.tenant}


class Recovery(Service):
    name = "recovery"

    def __init__(self, clock: Clock, interval: float, reporter: Reporter, store: RunQueue,
                 namespace: str, version: str | None, registry: Registry,
                 kick: Callable[[], None], telemetry: Telemetry = NOTHING) -> None:
        super().__init__(clock, interval, reporter)
        self._store = store
        self._namespace = namespace
        self._version = version
        self._registry = registry
        self._kick = kick
        self._telemetry = telemetry
        self._incompatible_logged: set[str] = set()

    async def run_once(self) -> None:
        await self.recover()
        self._kick()

    async def recover(self) -> None:
        """Recovery without the scheduling pass (``app.poll`` runs the pass itself, inline)."""
        now = self.clock.now()
        for run in await self._store.recover_runs(self._namespace, now):
            log.info("run.recovered: %s %s -> %s", run.workflow, run.id, run.status,
                     extra=_fields("run.recovered", run))
            self._telemetry.run_recovered(run)
            if run.status.final:
                log.error("recovery.failed: %s %s: %s", run.workflow, run.id, run.error,
                          extra=_fields("recovery.failed", run))
        await self._log_incompatible(now)

    async def _log_incompatible(self, now: float) -> None:
        """Log, once per run, the started runs left to an instance of their own version."""
        registry = self._registry
        found = await self._store.incompatible_runs(
            self._namespace, list(registry.workflows), self._version, registry.any_version(),
            now)
        for run in found:
            if run.id in self._incompatible_logged:
                continue
            if len(self._incompatible_logged) > 100_000:
                self._incompatible_logged.clear()
            self._incompatible_logged.add(run.id)
            log.warning("recovery.incompatible: %s %s was started by version %r; this instance "
                        "is %r and leaves it to an instance of that version (or set "
                        "on_incompatible='resume' on the workflow)", run.workflow, run.id,
                        run.version, self._version,
                        extra=_fields("recovery.incompatible", run))
