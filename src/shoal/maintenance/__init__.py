"""Maintenance: the work an instance does beside executing runs, as small services, each its own
loop with its own interval and its own failure handling, started and stopped together:

=================  =========================================================  ===============
service            does                                                        every
=================  =========================================================  ===============
heartbeat          renews the leases of the runs executing here                ``heartbeat``,
                                                                               while any runs
pause.expiry       denies approvals whose time ran out                         lease / 3
pause.notify       calls the ``on_pause_notify`` handlers for new pauses        lease / 3, and
                                                                               when one is made
outbox.delivery    hands due outbox entries to their handlers                  lease / 3, and
                                                                               when a step
                                                                               wrote some
recovery           requeues expired or released claims, then a claim pass      lease / 3
admission          releases parked runs under ``max_queued``                   lease / 3
retention          deletes old final runs, resolved pauses, stale coordination  lease / 3
cron               one loop per trigger, firing each tick once                  its schedule
=================  =========================================================  ===============

On the memory store every periodic service but the heartbeat sleeps, after a pass that found
nothing due before its next interval, until the store says work is due or is written to
(:class:`~shoal.maintenance.service.DueWork`).

A new service subclasses :class:`~shoal.maintenance.service.Service` (a pass every interval) or
:class:`~shoal.maintenance.service.Triggered` (a pass in the background, also on demand), and is
added in :meth:`Maintenance.build`; options of its own are a record (as
:class:`~shoal.maintenance.retention.RetentionConfig`) that is a field of
:class:`MaintenanceConfig`, filled in by the app
(:meth:`shoal.app.options.AppConfig.maintenance`). The engine itself keeps claim, execute and
settle.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from shoal._tasks import cancel_and_wait
from shoal.clock import Clock
from shoal.engine.runner import Engine, Registry
from shoal.health import Health, HealthStatus
from shoal.maintenance.admission import AdmissionRelease
from shoal.maintenance.cron import Cron, Fire
from shoal.maintenance.heartbeat import Heartbeat
from shoal.maintenance.outbox import OutboxDelivery
from shoal.maintenance.pauses import PauseExpiry, PauseNotification
from shoal.maintenance.recovery import Recovery
from shoal.maintenance.retention import Retention, RetentionConfig
from shoal.maintenance.service import Pass, Reporter, Service, Triggered, due_work
from shoal.ports import Store
from shoal.telemetry import Telemetry


@dataclass(frozen=True, kw_only=True)
class MaintenanceConfig:
    """What the maintenance services of one instance run by, built once by the app from its
    validated configuration and passed whole; a service's own options are a record of their
    own here."""

    namespace: str
    lease: float                      # the periodic services pass every lease / 3
    version: str | None               # recovery takes over runs of this code version only
    retention: RetentionConfig
    max_queued: int | None = None     # None: no admission service
    # coordination is kept in the run store (no App(coordination=...)): retention prunes it
    # there too, so its pass is due whenever that could be
    coordination_in_store: bool = True

    @property
    def interval(self) -> float:
        """Between two passes of each periodic service."""
        return self.lease / 3


@dataclass
class Maintenance:
    """The maintenance services of one instance, beside its engine."""

    heartbeat: Heartbeat
    expiry: PauseExpiry
    notification: PauseNotification
    delivery: OutboxDelivery
    recovery: Recovery
    admission: AdmissionRelease | None     # only with App(max_queued=...)
    retention: Retention
    cron: Cron
    schedule_pass: Pass                    # the engine's, for app.poll()
    _first_round: asyncio.Task[None] | None = None
    _stopped: bool = False

    @property
    def services(self) -> list[Service]:
        """Every periodic loop but the heartbeat, in start order."""
        admission = [self.admission] if self.admission is not None else []
        return [self.expiry, self.notification, self.delivery, self.recovery, *admission,
                self.retention]

    @classmethod
    def build(cls, engine: Engine, store: Store, clock: Clock, config: MaintenanceConfig,
              registry: Registry, fire: Fire,
              prune_coordination: Callable[[float], Awaitable[None]]) -> Maintenance:
        """The services of one instance; on a store that says when work is due (the memory
        store), each sleeps until its work is (retention only when coordination is kept in
        that store too: it prunes that as well)."""
        reporter = Reporter(clock, registry.on_error, config.interval)
        built = cls._build(engine, store, clock, config, registry, fire, prune_coordination,
                           reporter, engine.telemetry)
        known = due_work(store)
        if known is not None:
            retention = config.retention
            for service in built.services:
                if service is built.retention and not config.coordination_in_store:
                    continue
                service.quiet_on(known, functools.partial(
                    known.next_due, config.namespace, service.name,
                    run_retention=retention.run_retention,
                    pause_retention=retention.pause_retention))
        return built

    @classmethod
    def _build(cls, engine: Engine, store: Store, clock: Clock, config: MaintenanceConfig,
               registry: Registry, fire: Fire,
               prune_coordination: Callable[[float], Awaitable[None]], reporter: Reporter,
               telemetry: Telemetry) -> Maintenance:
        every, ns, lease = config.interval, config.namespace, config.lease
        return cls(
            heartbeat=Heartbeat(clock, engine.heartbeat, reporter, engine.renew,
                                engine.until_renewing),
            expiry=PauseExpiry(clock, every, reporter, store, ns, engine.kick),
            notification=PauseNotification(clock, every, reporter, store, ns, lease,
                                           registry.on_pause_notify, telemetry),
            delivery=OutboxDelivery(clock, every, reporter, store, ns, lease,
                                    registry.outbox_handlers, telemetry),
            recovery=Recovery(clock, every, reporter, store, ns, config.version, registry,
                              engine.kick, telemetry),
            admission=(AdmissionRelease(clock, every, reporter, store, ns, config.max_queued,
                                        engine.kick)
                       if config.max_queued is not None else None),
            retention=Retention(clock, every, reporter, store, ns, config.retention,
                                prune_coordination),
            cron=Cron(clock, every, reporter, list(registry.crons.values()), fire),
            schedule_pass=engine.schedule_pass,
        )

    def start(self) -> None:
        self._stopped = False
        now = self.heartbeat.clock.now()
        for service in [self.heartbeat, *self.services]:
            service.started_at = now
        self.cron.start()
        self.heartbeat.start()
        self._first_round = asyncio.create_task(self._start_in_turn(), name="shoal-maintenance")

    async def _start_in_turn(self) -> None:
        """The first passes go one after another, as one poll did, then each service goes on
        at its own interval. All at once, they took the store's connections from the first
        claims (3 % of the runs/s of a short benchmark). A first pass that raises does not
        hold the others; one that hangs does, and liveness reports it."""
        for service in self.services:
            if self._stopped:
                return
            await service.pass_once()
            service.start(first=False)

    async def stop(self) -> None:
        """Stop every service but the heartbeat, which renews the runs still draining."""
        self._stopped = True
        if self._first_round is not None:
            await cancel_and_wait(self._first_round)
        await self.cron.stop()
        for service in self.services:
            await service.stop()

    async def stop_heartbeat(self) -> None:
        """After the last local run ended."""
        await self.heartbeat.stop()

    async def poll(self) -> None:
        """One round now, in order, each pass raising its failure (``app.poll``): renew, deny
        expired approvals, start notification and delivery, recover, release held runs, a
        scheduling pass, retention."""
        await self.heartbeat.run_once()
        await self.expiry.run_once()
        self.notification.trigger()
        self.delivery.trigger()
        await self.recovery.recover()
        if self.admission is not None:
            await self.admission.run_once()
        await self.schedule_pass()
        await self.retention.run_once()

    def liveness(self) -> Health:
        """Unhealthy when a periodic service's pass has not come back for three of its
        intervals (every such service is named), or the heartbeat's."""
        stuck = [s for s in self.services if s.stuck_for() > 3 * s.interval]
        if stuck:
            worst = max(stuck, key=lambda s: s.stuck_for() / s.interval)
            return Health(HealthStatus.UNHEALTHY,
                          f"stuck: no poll completed for {worst.stuck_for():.0f} s (every "
                          f"{worst.interval:g} s expected; stuck: "
                          f"{', '.join(s.name for s in stuck)})")
        beat = self.heartbeat
        if beat.stuck_for() > 3 * beat.interval:
            return Health(HealthStatus.UNHEALTHY,
                          f"stuck: no lease renewal pass completed for {beat.stuck_for():.0f} s "
                          f"(every {beat.interval:g} s expected)")
        return Health(HealthStatus.HEALTHY)

    def outbox_written(self) -> None:
        self.delivery.trigger()

    def pause_created(self) -> None:
        self.notification.trigger()


__all__ = ["Maintenance", "MaintenanceConfig", "Reporter", "RetentionConfig", "Service",
           "Triggered"]
