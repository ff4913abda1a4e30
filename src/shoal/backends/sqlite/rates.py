"""Rate-limit state (:class:`shoal.ports.RateStore`) in the SQLite store's own tables.

The semantics are those of the memory reference (:mod:`shoal.backends.memory.rates`). Each method
that writes is one ``BEGIN IMMEDIATE`` transaction of the store's connection (its ``tx``): it holds
the file's write lock from its first read to its commit, so it is atomic across the processes
sharing the file (a slot count, a window total or a counter cannot change between the check and the
write). The two pure reads (``paused_until``, ``ledger``) are one ``SELECT`` each, which SQLite
runs as its own read transaction, without the write lock. ``queries.sql`` (under ``-- rate
limits``) has the statements.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from shoal import _json
from shoal.backends._sql import queries
from shoal.backends.sqlite.connection import SQLiteConnection, unavailable_on_failure
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

_Q = queries("sqlite")


@unavailable_on_failure
class SQLiteRateLimits:
    """Slots, windows, pauses, counters and the cost ledger for
    :class:`~shoal.backends.sqlite.SQLiteStore`. It keeps no state of its own."""

    def __init__(self, connection: SQLiteConnection) -> None:
        self.connection = connection

    # -- slots ---------------------------------------------------------------------------------

    async def slot_acquire(
        self, namespace: str, key: str, holder: str, max_slots: int, lease: float, now: float
    ) -> SlotGrant | SlotBusy:
        args = {"namespace": namespace, "key": key, "holder": holder, "now": now,
                "expires_at": now + lease}
        async with self.connection.tx() as db:
            db.execute(_Q["rate_slots_purge"], args)
            held, mine, first_end = db.execute(_Q["rate_slots_state"], args).fetchone()
            if mine or held < max_slots:
                db.execute(_Q["rate_slot_take"], args)
                return SlotGrant(now + lease)
        if first_end is None:   # max_slots < 1 and nothing held: the reference fails too
            raise ValueError(f"slot_acquire: max_slots={max_slots} leaves no slot to wait for")
        return SlotBusy(first_end)

    async def slot_renew(
        self, namespace: str, key: str, holder: str, lease: float, now: float
    ) -> bool:
        args = {"namespace": namespace, "key": key, "holder": holder, "now": now,
                "expires_at": now + lease}
        async with self.connection.tx() as db:
            return db.execute(_Q["rate_slot_renew"], args).rowcount == 1

    async def slot_release(self, namespace: str, key: str, holder: str) -> None:
        async with self.connection.tx() as db:
            db.execute(_Q["rate_slot_release"],
                       {"namespace": namespace, "key": key, "holder": holder})

    # -- windows -------------------------------------------------------------------------------

    async def window_add(
        self, namespace: str, key: str, amount: float, window: float, limit: float | None,
        now: float,
    ) -> WindowResult:
        # The cost is the entries leaving (and, when refused, those walked): the key's running
        # total (rate_windows) stands for the rest, as in the memory reference.
        args = {"namespace": namespace, "key": key, "amount": amount, "window": window,
                "limit": limit, "now": now, "cutoff": now - window}
        async with self.connection.tx() as db:
            stored, total = _window_total(db, args)
            if amount > 0 and limit is not None and total + amount > limit:
                if total != stored:
                    db.execute(_Q["rate_window_put"], {**args, "total": total})
                retry_at = (None if amount > limit     # it never fits
                            else _retry_at(db, args, total, amount, window, limit))
                return WindowResult(False, total, retry_at)
            if amount != 0:     # 0 is a read
                db.execute(_Q["rate_window_add"], args)
                total += amount
            if total != stored:     # no row reads as 0
                db.execute(_Q["rate_window_put"], {**args, "total": total})
        return WindowResult(True, total)

    async def window_clear(self, namespace: str, key: str) -> None:
        args = {"namespace": namespace, "key": key}
        async with self.connection.tx() as db:
            db.execute(_Q["rate_window_clear"], args)
            db.execute(_Q["rate_window_clear_total"], args)

    # -- the console's read ------------------------------------------------------------------

    async def read_rates(
        self, namespace: str, now: float, *, slots: Sequence[str] = (),
        windows: Sequence[tuple[str, float]] = (), pauses: Sequence[str] = (),
        counters: Sequence[str] = (),
    ) -> RateView:
        base: dict[str, Any] = {"namespace": namespace, "now": now}
        db = self.connection.db
        db.execute("BEGIN")        # deferred: one snapshot for the reads, no write lock
        try:
            live = {k: db.execute(_Q["rate_slots_live"], {**base, "key": k}).fetchone()[0]
                    for k in slots}
            totals = {k: _window_read(db, {**base, "key": k, "cutoff": now - w})
                      for k, w in windows}
            paused = {}
            for k in pauses:
                row = db.execute(_Q["rate_paused_until"], {**base, "key": k}).fetchone()
                paused[k] = None if row is None else float(row[0])
            found = {r["key"]: float(r["total"]) for r in db.execute(
                _Q["rate_counters_get"], {**base, "keys": _json.dumps(list(counters))})}
        finally:
            db.execute("COMMIT")
        return RateView(slots=live, windows=totals, pauses=paused,
                        counters={k: found.get(k, 0.0) for k in counters})

    # -- pauses --------------------------------------------------------------------------------

    async def pause_until(self, namespace: str, key: str, until: float, now: float) -> float:
        async with self.connection.tx() as db:
            kept: float = db.execute(_Q["rate_pause_until"], {
                "namespace": namespace, "key": key, "until": until}).fetchone()[0]
        return kept

    async def paused_until(self, namespace: str, key: str, now: float) -> float | None:
        cur = self.connection.db.execute(_Q["rate_paused_until"],
                                         {"namespace": namespace, "key": key, "now": now})
        try:
            row = cur.fetchone()
        finally:
            cur.close()     # no read snapshot left open
        return None if row is None else float(row[0])

    # -- admission: every need of a call at once ------------------------------------------------

    async def admit(
        self, namespace: str, holder: str, needs: Sequence[Need], now: float
    ) -> Admitted | Refused:
        check_needs(needs)
        ns: dict[str, Any] = {"namespace": namespace, "holder": holder, "now": now}
        trial: float | None = None
        counted: list[tuple[dict[str, Any], float]] = []     # (window args, total before)
        async with self.connection.tx() as db:
            # each need looked at in order (a refusal commits only what left: ended slots and
            # entries out of their windows), then, all met, each taken
            for i, need in enumerate(needs):
                if isinstance(need, SlotNeed):
                    busy = _slot_busy(db, {**ns, "key": need.key}, need.max_slots)
                    if busy is not None:
                        return Refused(i, busy)
                elif isinstance(need, PauseNeed):
                    until = _paused(db, {**ns, "key": need.key})
                    if until is not None:
                        return Refused(i, until)
                elif isinstance(need, WindowNeed):
                    args = {**ns, "key": need.key, "amount": need.amount,
                            "window": need.window, "cutoff": now - need.window}
                    stored, total = _window_total(db, args)
                    if total != stored:
                        db.execute(_Q["rate_window_put"], {**args, "total": total})
                    if need.limit is not None and total + need.amount > need.limit:
                        return Refused(i, None if need.amount > need.limit else _retry_at(
                            db, args, total, need.amount, need.window, need.limit))
                    counted.append((args, total))
                else:
                    until = _paused(db, {**ns, "key": need.open})
                    if until is not None:
                        return Refused(i, until)
                    totals = {r["key"]: float(r["total"]) for r in db.execute(
                        _Q["rate_counters_get"], {"namespace": namespace, "keys": _json.dumps(
                            [need.opened, need.closed])})}
                    opened = totals.get(need.opened, 0.0)
                    closed = totals.get(need.closed, 0.0)
                    # read as counter_add reads: used now (so retention keeps a circuit in use)
                    db.executemany(_Q["rate_counter_put"], [
                        {"namespace": namespace, "key": key, "total": total, "now": now}
                        for key, total in ((need.opened, opened), (need.closed, closed))])
                    if opened > closed:
                        if _slot_busy(db, {**ns, "key": need.trial}, 1) is not None:
                            return Refused(i, None)
                        trial = opened
            for need in needs:
                if isinstance(need, SlotNeed) or (isinstance(need, CircuitNeed)
                                                  and trial is not None):
                    key = need.key if isinstance(need, SlotNeed) else need.trial
                    db.execute(_Q["rate_slot_take"],
                               {**ns, "key": key, "expires_at": now + need.lease})
            for args, total in counted:
                db.execute(_Q["rate_window_add"], args)
                db.execute(_Q["rate_window_put"], {**args, "total": total + args["amount"]})
        return Admitted(trial)

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
        async with self.connection.tx() as db:
            stored: dict[str, float] = {
                r["key"]: r["total"] for r in db.execute(_Q["rate_counters_get"], {
                    "namespace": namespace, "keys": _json.dumps(sorted(set(keys)))})}
            before = [stored.get(k, 0.0) for k in keys]
            running: dict[str, float] = {}
            after = []
            for i, (key, amount, limit) in enumerate(zip(keys, amounts, limits, strict=True)):
                total = running.get(key, before[i]) + amount    # a key named twice counts twice
                if amount > 0 and limit is not None and total > limit:
                    return CounterResult(False, before, i)      # nothing written
                running[key] = total
                after.append(total)
            db.executemany(_Q["rate_counter_put"], [
                {"namespace": namespace, "key": k, "total": t, "now": now}
                for k, t in running.items()])
            if entry is not None:
                db.execute(_Q["cost_ledger_add"], {
                    "namespace": namespace, "tenant": entry.tenant, "run_id": entry.run_id,
                    "root_id": entry.root_id, "amount": entry.amount,
                    "currency": entry.currency, "at": entry.at, "provider": entry.provider,
                    "tokens": entry.tokens})
        return CounterResult(True, after)

    async def ledger(
        self, namespace: str, tenant: str | None = None, root_id: str | None = None,
        limit: int = 1000, *, after: int | None = None, run_id: str | None = None,
        since: float | None = None, until: float | None = None,
    ) -> list[SpendEntry]:
        # one statement per narrowest filter, each walking its index from `after`
        query = (_Q["cost_ledger_of_run"] if run_id is not None
                 else _Q["cost_ledger_of_root"] if root_id is not None
                 else _Q["cost_ledger_of_tenant"] if tenant is not None
                 else _Q["cost_ledger"])
        args: dict[str, Any] = {"namespace": namespace, "tenant": tenant, "root_id": root_id,
                                "run_id": run_id, "since": since, "until": until,
                                "after": 0 if after is None else int(after), "limit": limit}
        cur = self.connection.db.execute(query, args)
        try:
            rows = cur.fetchall()
        finally:
            cur.close()     # no read snapshot left open
        return [SpendEntry(r["tenant"], r["run_id"], r["root_id"], r["amount"], r["currency"],
                           r["at"], r["id"], r["provider"], r["tokens"]) for r in rows]

    # -- retention -----------------------------------------------------------------------------

    async def prune_rates(self, namespace: str, before: float, limit: int) -> int:
        """Ended slots, window entries dated at or before ``before``, ended pauses, then idle
        counters, at most ``limit`` rows in all, in one transaction; never the ledger. A window
        whose entries go has their sum taken from its running total, oldest first as window_add
        does, and its total row deleted when no entry is left."""
        args: dict[str, Any] = {"namespace": namespace, "before": before}
        deleted = 0
        async with self.connection.tx() as db:
            deleted += db.execute(_Q["prune_rate_slots"], {**args, "limit": limit}).rowcount
            if deleted < limit:
                deleted += _prune_windows(db, namespace, before, limit - deleted)
            for name in ("prune_rate_pauses", "prune_rate_counters"):
                if deleted >= limit:
                    break
                deleted += db.execute(_Q[name], {**args, "limit": limit - deleted}).rowcount
        return deleted


def _slot_busy(db: sqlite3.Connection, args: dict[str, Any], max_slots: int) -> float | None:
    """Forget the key's ended slots; None if ``args["holder"]`` may take one, else when the
    first live one ends."""
    db.execute(_Q["rate_slots_purge"], args)
    held, mine, first_end = db.execute(_Q["rate_slots_state"], args).fetchone()
    if mine or held < max_slots:
        return None
    if first_end is None:   # max_slots < 1 and nothing held: the reference fails too
        raise ValueError(f"admit: max_slots={max_slots} leaves no slot to wait for")
    return float(first_end)


def _paused(db: sqlite3.Connection, args: dict[str, Any]) -> float | None:
    row = db.execute(_Q["rate_paused_until"], args).fetchone()
    return None if row is None else float(row[0])


def _window_read(db: sqlite3.Connection, args: dict[str, Any]) -> float:
    """The key's total over the window at ``args["cutoff"]``, as :func:`_window_total` finds
    it, without deleting anything."""
    row = db.execute(_Q["rate_window_total"], args).fetchone()
    total = 0.0 if row is None else float(row[0])
    leaving = db.execute(_Q["rate_window_leaving"], args).fetchall()
    if leaving:
        for (gone,) in leaving:
            total -= gone
        if not db.execute(_Q["rate_window_stays"], args).fetchone()[0]:
            total = 0.0
    return total


def _window_total(db: sqlite3.Connection, args: dict[str, Any]) -> tuple[float, float]:
    """Delete the key's entries that left the window (``args["cutoff"]``); its running total as
    stored and without them (exactly 0 when none is left). The caller stores the new total."""
    row = db.execute(_Q["rate_window_total"], args).fetchone()
    stored = total = 0.0 if row is None else float(row[0])
    leaving = db.execute(_Q["rate_window_leaving"], args).fetchall()
    if leaving:
        for (gone,) in leaving:     # oldest first, as the reference subtracts them
            total -= gone
        db.execute(_Q["rate_window_prune"], args)
        if not db.execute(_Q["rate_window_any"], args).fetchone()[0]:
            total = 0.0             # no drift survives an empty window
    return stored, total


def _retry_at(
    db: sqlite3.Connection, args: dict[str, Any], total: float, amount: float, window: float,
    limit: float,
) -> float | None:
    """When a refused ``amount`` (not above ``limit``) fits: the time of the entry whose leaving,
    with every entry before it (oldest first), makes room, plus the window — the reference's
    walk, reading the entries from the oldest only as far as needed. None if it never fits (the
    window holds negative corrections)."""
    left = total
    cur = db.execute(_Q["rate_window_walk"], args)
    try:
        for at, gone in cur:
            left -= gone
            if left + amount <= limit:
                return float(at + window)
    finally:
        cur.close()     # the rest of the window is never read
    return None


def _prune_windows(db: sqlite3.Connection, namespace: str, before: float, limit: int) -> int:
    """Delete up to ``limit`` window entries dated at or before ``before`` (oldest first) and
    keep each key's running total the sum of its remaining entries (no row: no entry)."""
    rows = db.execute(_Q["prune_window_entries_find"],
                      {"namespace": namespace, "before": before, "limit": limit}).fetchall()
    if not rows:
        return 0
    leaving: dict[str, list[float]] = {}
    for _, key, amount in rows:
        leaving.setdefault(key, []).append(amount)
    db.execute(_Q["prune_window_entries"], {"rowids": _json.dumps([r[0] for r in rows])})
    for key, amounts in leaving.items():
        args = {"namespace": namespace, "key": key}
        if not db.execute(_Q["rate_window_any"], args).fetchone()[0]:
            db.execute(_Q["rate_window_clear_total"], args)
            continue
        row = db.execute(_Q["rate_window_total"], args).fetchone()
        total = 0.0 if row is None else float(row[0])
        for gone in amounts:     # oldest first, as window_add subtracts them
            total -= gone
        db.execute(_Q["rate_window_put"], {**args, "total": total})
    return len(rows)
