"""Rate-limit state (:class:`shoal.ports.RateStore`) in the PostgreSQL store's own tables.

The semantics are those of the memory reference (:mod:`shoal.backends.memory.rates`). Each method is
one transaction, atomic against every other connection, sent as one pipeline (one round trip; the
server runs it as one implicit transaction, as :mod:`shoal.backends.postgres.coord` does). The first
statements take the locks, and the ones after them, whose READ COMMITTED snapshots are taken once
they are held, read and write (a window: the entries leaving, then the add):

- a slot key and a window key: an advisory transaction lock of the key. Their rows come and go
  (slots end, entries leave the window), so there may be no row to lock, and a table of key rows
  kept only to be locked would grow with every key ever used; a 64-bit hash of
  ``(schema, kind, namespace, key)`` serializes the key's operations and no others (two keys
  whose hashes collide only wait for each other);
- counters: their rows, created at 0 if missing, locked in "C" order of their keys, as the
  meters are (so two spends sharing counters never wait for each other in a cycle);
- a pause: one upsert, which locks its row itself;
- the cost ledger: a spend's row takes its id under an advisory transaction lock of the
  namespace's ledger, taken after the counters' row locks and held until the commit, so a
  namespace's rows commit in id order and a reader paging with ``after`` never passes a row that
  commits later with a smaller id (the spends of one namespace commit one at a time).

``queries.sql`` (under ``-- rate limits``) explains each statement.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from shoal.backends.postgres.connections import Connections, Q
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


class PostgresRateLimits:
    """Slots, windows, pauses, counters and the cost ledger for
    :class:`~shoal.backends.postgres.PostgresStore`, on ``db``. It keeps no state of its
    own."""

    def __init__(self, db: Connections) -> None:
        self.db = db

    def _rate_lock(self, kind: str, namespace: str, key: str) -> tuple[str, dict[str, Any]]:
        """The statement taking the advisory transaction lock of one slot or window key."""
        name = json.dumps(["shoal-rate", self.db.schema, kind, namespace, key])
        return Q["advisory_xact_lock"], {"key": name}

    # -- slots ---------------------------------------------------------------------------------

    async def slot_acquire(
        self, namespace: str, key: str, holder: str, max_slots: int, lease: float, now: float
    ) -> SlotGrant | SlotBusy:
        args: dict[str, Any] = {
            "namespace": namespace, "key": key, "holder": holder, "max_slots": int(max_slots),
            "now": float(now), "until": float(now + lease)}
        [row] = await self.db.retried([self._rate_lock("slot", namespace, key),
                                      (Q["rate_slot_acquire"], args)])
        if row["granted"]:
            return SlotGrant(now + lease)
        if row["retry_at"] is None:   # max_slots < 1 and nothing held: the reference fails too
            raise ValueError(f"slot_acquire: max_slots={max_slots} leaves no slot to wait for")
        return SlotBusy(row["retry_at"])

    async def slot_renew(
        self, namespace: str, key: str, holder: str, lease: float, now: float
    ) -> bool:
        args: dict[str, Any] = {"namespace": namespace, "key": key, "holder": holder,
                                "now": float(now), "until": float(now + lease)}
        [row] = await self.db.retried([self._rate_lock("slot", namespace, key),
                                      (Q["rate_slot_renew"], args)], urgent=True)
        return bool(row["renewed"] == 1)

    async def slot_release(self, namespace: str, key: str, holder: str) -> None:
        args: dict[str, Any] = {"namespace": namespace, "key": key, "holder": holder}
        await self.db.retried([self._rate_lock("slot", namespace, key),
                              (Q["rate_slot_release"], args)])

    # -- windows -------------------------------------------------------------------------------

    async def window_add(
        self, namespace: str, key: str, amount: float, window: float, limit: float | None,
        now: float,
    ) -> WindowResult:
        # The cost is the entries leaving (and, when refused, those walked): the key's running
        # total (rate_windows) stands for the rest, as in the memory reference.
        args: dict[str, Any] = {
            "namespace": namespace, "key": key, "amount": float(amount),
            "window": float(window), "limit": None if limit is None else float(limit),
            "now": float(now), "cutoff": float(now - window)}
        [row] = await self.db.retried([self._rate_lock("window", namespace, key),
                                      (Q["rate_window_prune"], args),
                                      (Q["rate_window_add"], args)])
        total: float = row["total"]
        if not row["added"]:
            return WindowResult(False, total, row["retry_at"])
        return WindowResult(True, total + amount)

    async def window_clear(self, namespace: str, key: str) -> None:
        await self.db.retried([self._rate_lock("window", namespace, key),
                              (Q["rate_window_clear"], {"namespace": namespace, "key": key})])

    # -- pauses --------------------------------------------------------------------------------

    async def pause_until(self, namespace: str, key: str, until: float, now: float) -> float:
        [row] = await self.db.retried([(Q["rate_pause_until"], {
            "namespace": namespace, "key": key, "until": float(until)})])
        kept: float = row["until"]
        return kept

    async def paused_until(self, namespace: str, key: str, now: float) -> float | None:
        rows = await self.db.retried([(Q["rate_paused_until"], {
            "namespace": namespace, "key": key, "now": float(now)})])
        return rows[0]["until"] if rows else None

    # -- the console's read ------------------------------------------------------------------

    async def read_rates(
        self, namespace: str, now: float, *, slots: Sequence[str] = (),
        windows: Sequence[tuple[str, float]] = (), pauses: Sequence[str] = (),
        counters: Sequence[str] = (),
    ) -> RateView:
        rows = await self.db.retried([(Q["read_rates"], {
            "namespace": namespace, "now": float(now), "slots": list(slots),
            "windows": [k for k, _ in windows],
            "cutoffs": [float(now - w) for _, w in windows],
            "pauses": list(pauses), "counters": list(counters)})])
        found: dict[str, dict[str, Any]] = {"slot": {}, "window": {}, "pause": {}, "counter": {}}
        for row in rows:
            found[row["kind"]][row["key"]] = row["value"]
        return RateView(
            slots={k: int(found["slot"][k]) for k in slots},
            windows={k: float(found["window"][k]) for k, _ in windows},
            pauses={k: found["pause"][k] for k in pauses},
            counters={k: float(found["counter"][k]) for k in counters})

    # -- admission: every need of a call at once ------------------------------------------------

    async def admit(
        self, namespace: str, holder: str, needs: Sequence[Need], now: float
    ) -> Admitted | Refused:
        """One pipeline: the advisory locks of every slot key (the circuit's trial slot among
        them) and every window key, in one order for every caller (slots then windows, each by
        key: prune_rates takes window keys in that order too, and the other operations take one
        lock each), so two admissions never wait for each other in a cycle; then the circuit's
        counter rows, in "C" order; then each window's rate_window_prune; then rate_admit,
        which decides and writes, with its generic plan (rate_admit_generic_plan)."""
        check_needs(needs)
        args: dict[str, Any] = {
            "namespace": namespace, "holder": holder, "now": float(now),
            "slot_pos": [], "slot_keys": [], "slot_max": [], "slot_until": [],
            "pause_pos": [], "pause_keys": [], "win_pos": [], "win_keys": [],
            "win_amounts": [], "win_lengths": [], "win_limits": [], "circuit_pos": None,
            "open": None, "opened": None, "closed": None, "trial": None, "trial_until": None}
        locks: set[tuple[str, str]] = set()
        prunes: list[tuple[str, dict[str, Any]]] = []
        for i, need in enumerate(needs):
            if isinstance(need, SlotNeed):
                args["slot_pos"].append(i)
                args["slot_keys"].append(need.key)
                args["slot_max"].append(int(need.max_slots))
                args["slot_until"].append(float(now + need.lease))
                locks.add(("slot", need.key))
            elif isinstance(need, PauseNeed):
                args["pause_pos"].append(i)
                args["pause_keys"].append(need.key)
            elif isinstance(need, WindowNeed):
                args["win_pos"].append(i)
                args["win_keys"].append(need.key)
                args["win_amounts"].append(float(need.amount))
                args["win_lengths"].append(float(need.window))
                args["win_limits"].append(None if need.limit is None else float(need.limit))
                locks.add(("window", need.key))
                prunes.append((Q["rate_window_prune"], {
                    "namespace": namespace, "key": need.key,
                    "cutoff": float(now - need.window)}))
            elif isinstance(need, CircuitNeed):
                args.update(circuit_pos=i, open=need.open, opened=need.opened,
                            closed=need.closed, trial=need.trial,
                            trial_until=float(now + need.lease))
                locks.add(("slot", need.trial))
        args["slot_keys_all"] = [key for kind, key in locks if kind == "slot"]
        steps = [self._rate_lock(kind, namespace, key) for kind, key in sorted(locks)]
        if args["circuit_pos"] is not None:
            # the circuit's counters, created at 0 if missing and locked in "C" order as
            # counter_add locks them (it holds no advisory lock: no cycle), so that rate_admit
            # marks them used now as counter_add's read does
            counters = {"namespace": namespace, "now": float(now),
                        "keys": [args["opened"], args["closed"]]}
            steps += [(Q["rate_counter_keys_create"], counters),
                      (Q["rate_counter_keys"], counters)]
        steps += prunes
        steps.append((Q["rate_admit_generic_plan"], {}))
        steps.append((Q["rate_admit"], args))
        [row] = await self.db.retried(steps)
        if row["refused"] is None:
            return Admitted(row["trial"])
        refused = needs[row["refused"]]
        if isinstance(refused, SlotNeed) and row["retry_at"] is None:
            # max_slots < 1 and nothing held: the reference fails too
            raise ValueError(f"admit: max_slots={refused.max_slots} leaves no slot to wait for")
        return Refused(row["refused"], row["retry_at"])

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
        args: dict[str, Any] = {
            "namespace": namespace, "keys": list(keys), "amounts": [float(a) for a in amounts],
            "limits": [None if x is None else float(x) for x in limits], "now": float(now),
            "entry": entry is not None, "tenant": None, "run_id": None, "root_id": None,
            "amount": None, "currency": None, "at": None, "provider": None, "tokens": None}
        if entry is not None:
            args.update(tenant=entry.tenant, run_id=entry.run_id, root_id=entry.root_id,
                        amount=float(entry.amount), currency=entry.currency, at=float(entry.at),
                        provider=entry.provider, tokens=entry.tokens)
        steps = [(Q["rate_counter_keys_create"], args), (Q["rate_counter_keys"], args)]
        if entry is not None:   # after the counters' locks, as every spend takes them
            steps.append(self._rate_lock("ledger", namespace, ""))
        steps.append((Q["rate_counter_add"], args))
        rows = await self.db.retried(steps)
        over = rows[0]["over"] if rows else None
        if over is not None:
            return CounterResult(False, [r["before"] for r in rows], over - 1)   # 1-based
        return CounterResult(True, [r["total"] for r in rows])

    async def ledger(
        self, namespace: str, tenant: str | None = None, root_id: str | None = None,
        limit: int = 1000, *, after: int | None = None, run_id: str | None = None,
        since: float | None = None, until: float | None = None,
    ) -> list[SpendEntry]:
        # one statement per narrowest filter, each walking its index from `after`
        query = (Q["cost_ledger_of_run"] if run_id is not None
                 else Q["cost_ledger_of_root"] if root_id is not None
                 else Q["cost_ledger_of_tenant"] if tenant is not None
                 else Q["cost_ledger"])
        rows = await self.db.retried([(query, {
            "namespace": namespace, "tenant": tenant, "root_id": root_id, "run_id": run_id,
            "after": 0 if after is None else int(after), "limit": int(limit),
            "since": None if since is None else float(since),
            "until": None if until is None else float(until)})])
        return [SpendEntry(r["tenant"], r["run_id"], r["root_id"], r["amount"], r["currency"],
                           r["at"], r["id"], r["provider"], r["tokens"]) for r in rows]

    # -- retention -----------------------------------------------------------------------------

    async def prune_rates(self, namespace: str, before: float, limit: int) -> int:
        """Ended slots, window entries dated at or before ``before``, ended pauses, then idle
        counters, at most ``limit`` rows in all, in one transaction; never the ledger.

        Windows keep running totals that match their entries: the keys of the entries to go are
        read first, then one pipeline takes their advisory locks (the ones window_add takes, in
        key order) and deletes, taking each key's deleted sum from its total, or deleting the
        total row when no entry is left. A key that got entries meanwhile is still correct (its
        entries are read again under the lock); one that was not read waits for the next batch."""
        args: dict[str, Any] = {"namespace": namespace, "before": float(before),
                                "limit": int(limit)}
        found = await self.db.retried([(Q["prune_window_keys"], args)])
        keys = sorted({r["key"] for r in found})
        steps = [self._rate_lock("window", namespace, k) for k in keys]
        steps.append((Q["prune_rates"], {**args, "keys": keys}))
        [row] = await self.db.retried(steps)
        deleted: int = row["deleted"]
        return deleted

