"""The in-memory rate-limit state: the reference semantics of :class:`shoal.ports.RateStore`.

Every method runs without an await between its reads and writes, so each is atomic on the event
loop. :class:`~shoal.stores.memory.MemoryStore` inherits it.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shoal.ports import check_counter_args, check_needs
from shoal.types import (
    Admitted,
    CircuitNeed,
    CounterResult,
    Need,
    PauseNeed,
    RateView,
    Refused,
    SlotBusy,
    SlotGrant,
    SlotNeed,
    SpendEntry,
    WindowNeed,
    WindowResult,
)


@dataclass
class _Window:
    """A sliding window: its entries ``(at, amount)`` in time order and their running total."""

    entries: list[tuple[float, float]] = field(default_factory=list)
    total: float = 0.0


def _at(entry: tuple[float, float]) -> float:
    return entry[0]


def _id(entry: SpendEntry) -> int:
    assert entry.id is not None
    return entry.id


def _fits_at(w: _Window, amount: float, window: float, limit: float) -> float | None:
    """When a refused ``amount`` fits: the ``at + window`` of the entry whose leaving, with every
    entry before it (oldest first), makes room; None if it never fits."""
    if amount > limit:
        return None
    left = w.total
    for at, a in w.entries:
        left -= a
        if left + amount <= limit:
            return at + window
    return None


class MemoryRateLimits:
    """Slots, windows, pauses, counters and the cost ledger in this process's memory."""

    def __init__(self) -> None:
        self._slots: dict[tuple[str, str], dict[str, float]] = {}       # holder -> expires_at
        self._windows: dict[tuple[str, str], _Window] = {}
        self._rate_pauses: dict[tuple[str, str], float] = {}
        self._counters: dict[tuple[str, str], tuple[float, float]] = {}  # total, updated_at
        self._ledger: dict[str, list[SpendEntry]] = {}                  # in id order

    # -- slots ---------------------------------------------------------------------------------

    async def slot_acquire(
        self, namespace: str, key: str, holder: str, max_slots: int, lease: float, now: float
    ) -> SlotGrant | SlotBusy:
        busy = self._slot_busy(namespace, key, holder, max_slots, now)
        if busy is not None:
            return SlotBusy(busy)
        self._slots[(namespace, key)][holder] = now + lease
        return SlotGrant(now + lease)

    async def slot_renew(
        self, namespace: str, key: str, holder: str, lease: float, now: float
    ) -> bool:
        slots = self._slots.get((namespace, key), {})
        if slots.get(holder, now) <= now:
            return False
        slots[holder] = now + lease
        return True

    async def slot_release(self, namespace: str, key: str, holder: str) -> None:
        self._slots.get((namespace, key), {}).pop(holder, None)

    # -- windows -------------------------------------------------------------------------------

    async def window_add(
        self, namespace: str, key: str, amount: float, window: float, limit: float | None,
        now: float,
    ) -> WindowResult:
        w = self._window(namespace, key, window, now)
        total = w.total
        if amount > 0 and limit is not None and total + amount > limit:
            return WindowResult(False, total, _fits_at(w, amount, window, limit))
        if amount != 0:
            bisect.insort(w.entries, (now, amount), key=_at)   # after entries of the same time
            w.total += amount
        return WindowResult(True, w.total)

    async def window_clear(self, namespace: str, key: str) -> None:
        self._windows.pop((namespace, key), None)

    # -- pauses --------------------------------------------------------------------------------

    async def pause_until(self, namespace: str, key: str, until: float, now: float) -> float:
        kept = max(self._rate_pauses.get((namespace, key), until), until)
        self._rate_pauses[(namespace, key)] = kept
        return kept

    async def paused_until(self, namespace: str, key: str, now: float) -> float | None:
        return self._paused(namespace, key, now)

    def _paused(self, namespace: str, key: str, now: float) -> float | None:
        until = self._rate_pauses.get((namespace, key))
        return until if until is not None and until > now else None

    # -- admission: every need of a call at once ------------------------------------------------

    async def admit(
        self, namespace: str, holder: str, needs: Sequence[Need], now: float
    ) -> Admitted | Refused:
        check_needs(needs)
        trial: float | None = None
        for i, need in enumerate(needs):      # look at each, in order, taking nothing
            if isinstance(need, SlotNeed):
                busy = self._slot_busy(namespace, need.key, holder, need.max_slots, now)
                if busy is not None:
                    return Refused(i, busy)
            elif isinstance(need, PauseNeed):
                until = self._paused(namespace, need.key, now)
                if until is not None:
                    return Refused(i, until)
            elif isinstance(need, WindowNeed):
                w = self._window(namespace, need.key, need.window, now)
                if need.limit is not None and w.total + need.amount > need.limit:
                    return Refused(i, _fits_at(w, need.amount, need.window, need.limit))
            else:
                until = self._paused(namespace, need.open, now)
                if until is not None:
                    return Refused(i, until)
                opened, closed = (self._counters.get((namespace, k), (0.0, now))[0]
                                  for k in (need.opened, need.closed))
                # read as counter_add reads: used now (so retention keeps a circuit in use)
                for key, total in ((need.opened, opened), (need.closed, closed)):
                    self._counters[(namespace, key)] = (total, now)
                if opened > closed:
                    if self._slot_busy(namespace, need.trial, holder, 1, now) is not None:
                        return Refused(i, None)
                    trial = opened
        for need in needs:                    # all met: take them
            if isinstance(need, SlotNeed):
                self._slots[(namespace, need.key)][holder] = now + need.lease
            elif isinstance(need, WindowNeed):
                w = self._windows[(namespace, need.key)]
                bisect.insort(w.entries, (now, need.amount), key=_at)
                w.total += need.amount
            elif isinstance(need, CircuitNeed) and trial is not None:
                self._slots[(namespace, need.trial)][holder] = now + need.lease
        return Admitted(trial)

    def _slot_busy(
        self, namespace: str, key: str, holder: str, max_slots: int, now: float
    ) -> float | None:
        """Forget ``key``'s ended slots; None if ``holder`` may take one, else when the first
        live one ends."""
        slots = self._slots.setdefault((namespace, key), {})
        for who in [w for w, until in slots.items() if until <= now]:
            del slots[who]
        if holder in slots or len(slots) < max_slots:
            return None
        return min(slots.values())

    def _window(self, namespace: str, key: str, window: float, now: float) -> _Window:
        """``key``'s window with the entries that left it (``at <= now - window``) forgotten."""
        w = self._windows.setdefault((namespace, key), _Window())
        # entries leave from the oldest: the cost is the entries leaving, not the window's size
        leaving = bisect.bisect_right(w.entries, now - window, key=_at)
        for _, gone in w.entries[:leaving]:
            w.total -= gone
        del w.entries[:leaving]
        if not w.entries:
            w.total = 0.0            # no drift survives an empty window
        return w

    # -- the console's read ------------------------------------------------------------------

    async def read_rates(
        self, namespace: str, now: float, *, slots: Sequence[str] = (),
        windows: Sequence[tuple[str, float]] = (), pauses: Sequence[str] = (),
        counters: Sequence[str] = (),
    ) -> RateView:
        totals: dict[str, float] = {}
        for key, window in windows:
            w = self._windows.get((namespace, key), _Window())
            leaving = bisect.bisect_right(w.entries, now - window, key=_at)
            total = w.total
            for _, gone in w.entries[:leaving]:
                total -= gone
            totals[key] = total if leaving < len(w.entries) else 0.0
        return RateView(
            slots={k: sum(1 for until in self._slots.get((namespace, k), {}).values()
                          if until > now) for k in slots},
            windows=totals,
            pauses={k: self._paused(namespace, k, now) for k in pauses},
            counters={k: self._counters.get((namespace, k), (0.0, now))[0] for k in counters})

    # -- counters and the ledger ---------------------------------------------------------------

    async def counter_add(
        self,
        namespace: str,
        keys: Sequence[str],
        amounts: Sequence[float],
        limits: Sequence[float | None],
        now: float,
        entry: SpendEntry | None = None,
    ) -> CounterResult:
        check_counter_args(keys, amounts, limits)
        before = [self._counters.get((namespace, k), (0.0, now))[0] for k in keys]
        running: dict[str, float] = {}
        after = []
        for i, (key, amount, limit) in enumerate(zip(keys, amounts, limits, strict=True)):
            total = running.get(key, before[i]) + amount    # a key named twice counts twice
            if amount > 0 and limit is not None and total > limit:
                return CounterResult(False, before, i)
            running[key] = total
            after.append(total)
        for key, total in running.items():
            self._counters[(namespace, key)] = (total, now)
        if entry is not None:
            rows = self._ledger.setdefault(namespace, [])
            rows.append(dataclasses.replace(entry, id=_id(rows[-1]) + 1 if rows else 1))
        return CounterResult(True, after)

    async def ledger(
        self, namespace: str, tenant: str | None = None, root_id: str | None = None,
        limit: int = 1000, *, after: int | None = None, run_id: str | None = None,
        since: float | None = None, until: float | None = None,
    ) -> list[SpendEntry]:
        rows = self._ledger.get(namespace, [])
        start = 0 if after is None else bisect.bisect_right(rows, after, key=_id)
        found: list[SpendEntry] = []
        for e in rows[start:]:
            if len(found) >= limit:
                break
            if ((tenant is None or e.tenant == tenant)
                    and (root_id is None or e.root_id == root_id)
                    and (run_id is None or e.run_id == run_id)
                    and (since is None or e.at >= since)
                    and (until is None or e.at < until)):
                found.append(e)
        return found

    # -- retention -----------------------------------------------------------------------------

    def _rate_ends(self, namespace: str) -> Iterable[float]:
        """When each row ``prune_rates`` deletes stops mattering (it deletes those that stopped
        before its ``before``)."""
        for (ns, _), slots in self._slots.items():
            if ns == namespace:
                yield from slots.values()
        for (ns, _), w in self._windows.items():
            if ns == namespace and w.entries:
                yield w.entries[0][0]
        for (ns, _), until in self._rate_pauses.items():
            if ns == namespace:
                yield until
        for (ns, _), (_, updated_at) in self._counters.items():
            if ns == namespace:
                yield math.nextafter(updated_at, math.inf)   # older than: just after

    async def prune_rates(self, namespace: str, before: float, limit: int) -> int:
        deleted = 0
        for (ns, _), slots in self._slots.items():
            for holder in [h for h, until in slots.items() if ns == namespace and until <= before]:
                if deleted >= limit:
                    return deleted
                del slots[holder]
                deleted += 1
        for key, w in list(self._windows.items()):
            if key[0] != namespace:
                continue
            leaving = bisect.bisect_right(w.entries, before, key=_at)
            leaving = min(leaving, limit - deleted)
            for _, gone in w.entries[:leaving]:
                w.total -= gone
            del w.entries[:leaving]
            deleted += leaving
            if not w.entries:
                del self._windows[key]
            if deleted >= limit:
                return deleted
        for key, until in list(self._rate_pauses.items()):
            if deleted >= limit:
                return deleted
            if key[0] == namespace and until <= before:
                del self._rate_pauses[key]
                deleted += 1
        # oldest first, then in key order (as every store: see Provider's circuit counters)
        for key, (_, updated_at) in sorted(self._counters.items(),
                                           key=lambda kv: (kv[1][1], kv[0][1])):
            if deleted >= limit:
                return deleted
            if key[0] == namespace and updated_at < before:
                del self._counters[key]
                deleted += 1
        return deleted
