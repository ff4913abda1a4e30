"""Cron triggers: each tick fires exactly one run across every instance (invariant 10).

The run of a tick is dispatched with the idempotency key ``cron:<trigger>:<tick>``; creating a
run under an idempotency key is one atomic operation in every store, so of the instances that
see a tick due, exactly one creates its run and the others get that same run back. That atomic
claim is the per-(trigger, tick) lock; no other lock is needed.
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo

from croniter import croniter

from shoal.errors import ConfigurationError


@dataclass(frozen=True)
class CronTrigger:
    """``expression`` (5 fields, or 6 with seconds last) in time zone ``tz``, firing
    ``workflow``. A tick missed by more than ``catch_up`` seconds (every instance was down) is
    skipped; within it, the latest missed tick fires once when an instance comes back."""

    name: str
    expression: str
    workflow: str
    tz: tzinfo
    catch_up: float

    @classmethod
    def parse(cls, expression: str, *, name: str, workflow: str, tz: str,
              catch_up: float) -> CronTrigger:
        if not isinstance(expression, str) or not croniter.is_valid(expression):
            raise ConfigurationError(
                f"Cron trigger {name!r}: {expression!r} is not a cron expression; write five "
                f"fields 'minute hour day month weekday' (or six, seconds last), e.g. "
                f"'*/5 * * * *'.")
        try:
            zone = zoneinfo.ZoneInfo(tz)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ConfigurationError(
                f"Cron trigger {name!r}: unknown time zone {tz!r}; use an IANA name such as "
                f"'UTC' or 'Europe/Paris'.") from None
        if not isinstance(catch_up, (int, float)) or catch_up < 0:
            raise ConfigurationError(
                f"Cron trigger {name!r}: catch_up must be seconds >= 0, not {catch_up!r}.")
        return cls(name, expression, workflow, zone, float(catch_up))

    def latest_tick(self, now: float) -> float:
        """The last tick at or before ``now`` (seconds since the epoch)."""
        start = datetime.fromtimestamp(now, self.tz) + timedelta(milliseconds=1)
        return float(croniter(self.expression, start).get_prev(float))

    def next_tick(self, now: float) -> float:
        """The first tick after ``now``."""
        start = datetime.fromtimestamp(now, self.tz)
        return float(croniter(self.expression, start).get_next(float))

    def due(self, now: float) -> float | None:
        """The tick to fire now, if the latest one is within ``catch_up``."""
        tick = self.latest_tick(now)
        return tick if now - tick <= self.catch_up else None

    def idempotency_key(self, tick: float) -> str:
        stamp = datetime.fromtimestamp(tick, self.tz).isoformat()
        return f"cron:{self.name}:{stamp}"
