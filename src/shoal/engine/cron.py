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

from shoal import _checks
from shoal._checks import CONFIG
from shoal.errors import ConfigurationError

# how far from an instant a change of offset is looked for (changes are at most 2 hours)
_PROBE = timedelta(hours=3)


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
        """The trigger; raises ``ConfigurationError`` naming the option that cannot work."""
        _checks.text(name, "@app.cron(name)", CONFIG)
        if not isinstance(expression, str) or not croniter.is_valid(expression):
            raise ConfigurationError(
                f"Cron trigger {name!r}: {expression!r} is not a cron expression; write five "
                f"fields 'minute hour day month weekday' (or six, seconds last), e.g. "
                f"'*/5 * * * *'.")
        _checks.text(tz, f"Cron trigger {name!r}: tz", CONFIG)
        try:
            zone = zoneinfo.ZoneInfo(tz)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ConfigurationError(
                f"Cron trigger {name!r}: unknown time zone {tz!r}; use an IANA name such as "
                f"'UTC' or 'Europe/Paris'.") from None
        return cls(name, expression, workflow, zone,
                   _checks.seconds(catch_up, f"Cron trigger {name!r}: catch_up", CONFIG))

    @property
    def every_pass(self) -> bool:
        """Whether the schedule fires in both passes of a repeated hour (clocks going back): when
        its minute or hour field starts with ``*`` (``*/5 * * * *``, ``0 * * * *``, ``@hourly``),
        as in Vixie cron. A schedule at fixed hours and minutes (``30 2 * * *``) fires once, in
        the first pass."""
        fields = self.expression.split()
        if fields[0].startswith("@"):
            return fields[0] == "@hourly"
        return fields[0].startswith("*") or fields[1].startswith("*")

    def _instants(self, wall: datetime) -> list[float]:
        """When a naive wall time of the zone happens: once; twice in the hour the clocks go
        back over (the second pass kept only for ``every_pass``); or, skipped by clocks going
        forward, once at the end of the gap."""
        first = wall.replace(tzinfo=self.tz, fold=0).timestamp()
        second = wall.replace(tzinfo=self.tz, fold=1).timestamp()
        if first == second:
            return [first]
        if first < second:
            return [first, second] if self.every_pass else [first]
        # in a gap: fold=1 reads it with the offset after the change (an instant before it),
        # fold=0 with the one before (after it); the change is between, found to the second
        lo, hi = second, first
        after = self._offset(first)
        while hi - lo > 0.5:
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if self._offset(mid) == after else (mid, hi)
        return [float(round(hi))]

    def _offset(self, at: float) -> timedelta | None:
        return datetime.fromtimestamp(at, self.tz).utcoffset()

    def _wall(self, at: float) -> datetime:
        return datetime.fromtimestamp(at, self.tz).replace(tzinfo=None)

    def _shift(self, at: float) -> timedelta:
        """How far wall time may run backwards near ``at``: the size of a change of offset
        within _PROBE of it (clocks going back or forward), else nothing."""
        probe = _PROBE.total_seconds()
        offsets = [o for o in (self._offset(at - probe), self._offset(at),
                               self._offset(at + probe)) if o is not None]
        return max(offsets) - min(offsets) if offsets else timedelta(0)

    # Ticks are found among the zone's naive wall times (croniter on naive datetimes: no time
    # zone arithmetic), each mapped to its instants. Wall time runs backwards only where clocks
    # go back, by the size of the change: near one the search starts that much earlier (later
    # for the latest tick), and it stops that far in wall time past the best tick found.

    def next_tick(self, now: float) -> float:
        """The first tick after ``now``."""
        ticks = croniter(self.expression, self._wall(now) - self._shift(now))
        best: float | None = None
        stop = datetime.max
        while True:
            at = ticks.get_next(datetime)
            if at > stop:
                assert best is not None   # stop is set with best
                return best
            for t in self._instants(at):
                if t > now and (best is None or t < best):
                    best = t
                    stop = self._wall(t) + self._shift(t)

    def latest_tick(self, now: float) -> float:
        """The last tick at or before ``now`` (seconds since the epoch)."""
        wall = self._wall(now) + timedelta(milliseconds=1)
        ticks = croniter(self.expression, wall + self._shift(now))
        best: float | None = None
        stop = datetime.min
        while True:
            at = ticks.get_prev(datetime)
            if at < stop:
                assert best is not None   # stop is set with best
                return best
            for t in self._instants(at):
                if t <= now and (best is None or t > best):
                    best = t
                    stop = self._wall(t) - self._shift(t)

    def due(self, now: float) -> float | None:
        """The tick to fire now, if the latest one is within ``catch_up``."""
        tick = self.latest_tick(now)
        return tick if now - tick <= self.catch_up else None

    def idempotency_key(self, tick: float) -> str:
        stamp = datetime.fromtimestamp(tick, self.tz).isoformat()
        return f"cron:{self.name}:{stamp}"
