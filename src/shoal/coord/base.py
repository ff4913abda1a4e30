"""The coordination protocol: locks, membership and meters kept in a shared store.

A :class:`CoordStore` is what ``app.lock``, ``app.slots`` and ``app.meter`` are built on. The run
stores (memory, SQLite, PostgreSQL) implement it beside the Store protocol, in their own tables;
Redis implements it alone. Each method is one atomic operation with one invariant, stated in its
docstring. Every key is scoped by ``namespace`` (the app's name): two namespaces never meet. Every
time is the app's clock, passed as ``now`` (seconds); a store never reads its own clock.

Locks (invariant 7: a key has at most one holder with a live lease; tokens strictly increase)

- ``holder`` is unique per acquisition (an instance locking one key twice queues behind itself).
- A holder's lease ends at ``expires_at``; a holder whose lease ended holds nothing, even if its
  row is still there.
- Waiters queue per key in ticket order (FIFO). A waiter row also has a lease: a waiter that stops
  asking (a dead process) leaves the queue when it ends, so it cannot block the queue for ever.
- A grant of several keys is atomic (all or nothing); tickets are ordered across keys, so the
  oldest waiter anywhere is never blocked by younger ones (no deadlock, no starvation).
- Wake-ups go to one waiter, not to the queue: a release wakes the first waiter of each key it
  leaves free (the next in line, the only one that can be granted); a waiter's ``retry_at`` is
  the lease end of the holder or, if it comes earlier, of the waiter right ahead of it, so a dead
  waiter is noticed by the one behind it, and a dead holder at its lease end even when the
  waiters ahead give up meanwhile (their release names nobody while the holder's row is there).
  A live holder renews long before its lease ends, so the waiters sleep until their own re-ask.
- The fencing token of a grant is ``max(last token of each key) + 1`` and becomes the last token of
  every key granted: strictly increasing per key, and one token guards all the keys of a grant.

Membership (invariant 8: a slot is owned by at most one member at a time)

- Members heartbeat with the generation they currently *hold* (act on), or None. The store keeps a
  roster: the sorted ids of live members that joined at least ``warmup`` ago, and a generation
  number that increases whenever the roster changes.
- A heartbeat grants the current generation only when no other live member holds another one: a
  member must report that it let go of the old assignment before anyone takes a new one.
- A member row ends ``ttl`` after the heartbeat's ``now``; the member itself stops acting well
  before (the coordination layer gives up its assignment after two intervals without a
  heartbeat), so a member whose row has ended holds nothing.

Meters (invariant 9: concurrent charges are never lost)

- Per key a debt in milliseconds that drains one millisecond per millisecond of ``now`` and never
  goes below zero; an update adds every delta of a call in one atomic operation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable


@dataclass(frozen=True)
class LockGrant:
    """The caller now holds every key of its request until ``expires_at`` (unless renewed)."""

    token: int
    expires_at: float


@dataclass(frozen=True)
class LockWait:
    """The caller is queued (its waiter row lives until ``now + lease``). ``ticket`` is its place.
    ``retry_at`` is when to ask again even if no wake-up comes: the earliest end, among its keys,
    of the lease of the live holder and of the lease of the live waiter right ahead of it, if any
    (``now + lease`` if there is neither). The holder's end counts for every waiter, not only the
    first: a waiter ahead that gives up while a dead holder's row is still there wakes nobody
    (a release cannot tell that the lease ended), so the waiters behind must not depend on it."""

    ticket: int
    retry_at: float


@dataclass(frozen=True)
class MemberView:
    """What a heartbeat sees: the roster (sorted member ids), its generation, and whether the
    caller now holds that generation (the store has recorded it as held by the caller)."""

    generation: int
    members: tuple[str, ...]
    granted: bool


class LockWatch(Protocol):
    """Wake-ups for one lock waiter (a ``holder``): created before it first asks, so that no
    wake-up meant for it can come before the watch exists."""

    async def wait(self) -> None:
        """Return once the holder may have become grantable since the watch was created or since
        ``wait`` last returned (at once if it already did). Never raises on timeout: the caller
        races it with its own clock."""
        ...


class EventWatch:
    """The usual :class:`LockWatch`: an event that whoever learns the holder may be granted sets
    (a release in this process, a NOTIFY, a pub/sub message; a reconnection or an error sets
    every watch, a spurious wake-up rather than a lost one); ``wait`` consumes it."""

    def __init__(self, namespace: str, keys: Sequence[str], holder: str) -> None:
        self.namespace = namespace
        self.keys = tuple(keys)
        self.holder = holder
        self.event = asyncio.Event()

    async def wait(self) -> None:
        await self.event.wait()
        self.event.clear()


W = TypeVar("W", bound=EventWatch)


class WatchRegistry(Generic[W]):
    """A store object's lock watches by (namespace, holder): what a release in this process wakes
    at once, and what a notification from elsewhere (NOTIFY, pub/sub, a poll) is dispatched to."""

    def __init__(self) -> None:
        self._by_holder: dict[tuple[str, str], set[W]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_holder)

    def add(self, watch: W) -> None:
        self._by_holder.setdefault((watch.namespace, watch.holder), set()).add(watch)

    def remove(self, watch: W) -> None:
        watches = self._by_holder.get((watch.namespace, watch.holder))
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._by_holder[(watch.namespace, watch.holder)]

    def every(self) -> set[W]:
        return {w for watches in self._by_holder.values() for w in watches}

    def wake(self, namespace: str, holders: Iterable[str]) -> None:
        """Wake the watches of these holders (the waiters a release named)."""
        for holder in holders:
            for watch in self._by_holder.get((namespace, holder), ()):
                watch.event.set()

    def wake_keys(self, namespace: str, keys: Sequence[str]) -> None:
        """Wake every watch of these keys: when who is next cannot be known (a release whose
        answer was lost)."""
        wanted = set(keys)
        for watch in self.every():
            if watch.namespace == namespace and wanted.intersection(watch.keys):
                watch.event.set()

    def wake_every(self) -> None:
        for watch in self.every():
            watch.event.set()


@runtime_checkable
class CoordStore(Protocol):
    async def lock_acquire(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> LockGrant | LockWait:
        """Take every key for ``holder`` if each is free (no holder with ``expires_at > now``)
        and ``holder`` has the smallest ticket among the live waiters (``expires_at > now``) of
        each key; then delete its waiter rows and return the grant (token as in the module doc,
        ``expires_at = now + lease``). Otherwise enqueue ``holder`` on every key with a new ticket
        (larger than every ticket given before in this namespace) if it is not queued yet, else
        extend its waiter rows to ``now + lease``, and return where it stands. Keys are distinct
        and non-empty; ``holder`` holds none of them when it asks."""
        ...

    async def lock_renew(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> bool:
        """Extend the lease of ``holder`` on every key to ``now + lease`` if it still holds all
        of them with ``expires_at > now``; else change nothing and return False."""
        ...

    async def lock_release(self, namespace: str, keys: Sequence[str], holder: str) -> None:
        """Delete whatever ``holder`` has on these keys: its hold (the fencing counter stays) and
        its waiter rows (a waiter that gives up). On each key where it held the lock (even with
        an ended lease) or was the first waiter, and which now has no holder, wake the watch of
        the new first waiter (smallest ticket; a waiter row whose lease ended counts, and its
        successor finds out by ``retry_at``): one wake-up per key, never the whole queue."""
        ...

    def lock_watch(
        self, namespace: str, keys: Sequence[str], holder: str
    ) -> AbstractAsyncContextManager[LockWatch]:
        """The wake-ups of ``holder`` waiting for these keys (see :class:`LockWatch`): from a
        release in this process and, where the store can, across processes (NOTIFY, pub/sub;
        SQLite polls ``data_version``)."""
        ...

    async def heartbeat(
        self,
        namespace: str,
        member: str,
        held: int | None,
        now: float,
        ttl: float,
        warmup: float,
    ) -> MemberView:
        """In one atomic step:

        1. delete member rows with ``expires_at <= now``;
        2. upsert ``member`` with ``expires_at = now + ttl`` and ``held``; ``joined_at = now``
           when the row is new (an ended row is gone by step 1, so a member back from an outage
           joins again);
        3. the roster is the sorted ids of members with ``joined_at + warmup <= now``; if it
           differs from the stored one, store it with the generation increased by one;
        4. if ``member`` is on the roster, ``held`` is None or the current generation, and every
           other member row holds None or the current generation: record ``held = generation``
           for ``member`` and answer ``granted=True``; else ``granted=False``.
        """
        ...

    async def leave(self, namespace: str, member: str) -> None:
        """Delete ``member``'s row (it holds nothing any more); the roster changes at the next
        heartbeat of any member."""
        ...

    async def meter(
        self, namespace: str, keys: Sequence[str], deltas: Sequence[float], now: float
    ) -> list[float]:
        """For each key in order: ``debt = max(0, debt - max(0, now - updated_at) * 1000) +
        delta``, floored at 0, stored with ``updated_at = max(updated_at, now)`` (a replica whose
        clock is behind never un-drains a debt); all keys in one atomic operation. Returns
        the new debts (ms). A key named twice is charged twice, in order. A key never charged
        has debt 0."""
        ...

    async def prune_coordination(self, namespace: str, before: float, limit: int) -> int:
        """Delete at most ``limit`` rows that can no longer matter: meters fully drained by
        ``before`` (``updated_at + debt / 1000 <= before``) and lock waiter rows whose lease
        ended by ``before``. Lock rows stay (they keep the fencing counters). Returns how many
        were deleted. A store whose keys expire by themselves (Redis) may delete nothing."""
        ...

    async def open(self) -> None:
        """Connect (or prepare to); a Redis store never raises here for an unreachable server."""
        ...

    async def close(self) -> None:
        ...

    async def ping(self) -> None:
        """Raise if the store cannot be reached."""
        ...


# -- rate limits, breakers and budgets (a model provider's limits shared by every replica) -------


@dataclass(frozen=True)
class SlotGrant:
    """The caller holds one of the key's slots until ``expires_at`` (unless renewed)."""

    expires_at: float


@dataclass(frozen=True)
class SlotBusy:
    """Every slot is held; ``retry_at`` is when the first of them ends by itself."""

    retry_at: float


@dataclass(frozen=True)
class WindowResult:
    """``added``: the amount was counted. ``total``: the window's total after the call.
    ``retry_at`` (when refused): the earliest time the amount would fit, as old entries leave."""

    added: bool
    total: float
    retry_at: float | None = None


@dataclass(frozen=True)
class SlotNeed:
    """Admission needs one of ``key``'s slots (at most ``max_slots`` live holders), held until
    ``now + lease``, as :meth:`RateStore.slot_acquire` gives it."""

    key: str
    max_slots: int
    lease: float


@dataclass(frozen=True)
class PauseNeed:
    """Admission needs ``key`` not paused at ``now`` (see :meth:`RateStore.paused_until`)."""

    key: str


@dataclass(frozen=True)
class WindowNeed:
    """Admission needs room for ``amount`` (> 0) in the window ``key`` of ``window`` seconds
    under ``limit``, counted at ``now``, as :meth:`RateStore.window_add` counts it."""

    key: str
    amount: float
    window: float
    limit: float | None


@dataclass(frozen=True)
class CircuitNeed:
    """Admission needs a breaker's circuit to let the call go: the pause ``open`` (the cooldown
    after an opening) not in force, and, while the circuit is tripped (counter ``opened`` above
    counter ``closed``), the one place of the trial slot ``trial``, held until ``now + lease``."""

    open: str
    opened: str
    closed: str
    trial: str
    lease: float


Need = SlotNeed | PauseNeed | WindowNeed | CircuitNeed


@dataclass(frozen=True)
class Admitted:
    """Every need was met: the slots are held until ``now + lease``, the window amounts were
    counted at ``now``. ``trial``: the circuit was tripped and the caller holds its trial slot,
    for the opening ``trial`` (the ``opened`` counter's value); None when the circuit was closed
    (or no circuit was asked about)."""

    trial: float | None = None


@dataclass(frozen=True)
class Refused:
    """Need ``part`` (its index in the request) was not met, and nothing was taken. ``retry_at``:
    when it may be met: the first slot's end, the pause's end, when the window has room (None
    if the amount can never fit), the circuit's cooldown end (None while a trial call holds
    the trial slot)."""

    part: int
    retry_at: float | None


def check_counter_args(keys: Sequence[str], amounts: Sequence[float],
                       limits: Sequence[float | None]) -> None:
    """Raise ValueError unless ``counter_add`` got one key, amount and limit per position."""
    if not len(keys) == len(amounts) == len(limits):
        raise ValueError(f"counter_add: {len(keys)} keys, {len(amounts)} amounts and "
                         f"{len(limits)} limits; one of each per position")


def check_needs(needs: Sequence[Need]) -> None:
    """Raise ValueError unless no key of a kind (slot, pause, window) is named twice in
    ``needs`` (a circuit's keys count as a pause and a slot) and every window amount is > 0."""
    seen: set[tuple[str, str]] = set()
    for need in needs:
        if isinstance(need, SlotNeed):
            named = [("slot", need.key)]
        elif isinstance(need, PauseNeed):
            named = [("pause", need.key)]
        elif isinstance(need, WindowNeed):
            if not need.amount > 0:
                raise ValueError(f"admit: window {need.key!r} needs an amount > 0, not "
                                 f"{need.amount!r}")
            named = [("window", need.key)]
        else:
            named = [("pause", need.open), ("slot", need.trial)]
        for kind_key in named:
            if kind_key in seen:
                raise ValueError(f"admit: the {kind_key[0]} {kind_key[1]!r} is named twice")
            seen.add(kind_key)


@dataclass(frozen=True)
class CounterResult:
    """``added``: every amount was counted (all or nothing). ``totals``: per position, the
    counter after that position's amount (a key named twice shows both steps); when refused,
    each counter as it was. ``over``: the position that would have passed its limit."""

    added: bool
    totals: list[float]
    over: int | None = None


@dataclass(frozen=True)
class SpendEntry:
    """One row of the cost ledger: who spent what, where, when (``at``: the app's clock).

    ``id`` is given by the store when the row is written (None on an entry not written yet):
    strictly increasing within a namespace, in the order rows become visible to readers, never
    reused, so ``ledger(after=rows[-1].id)`` reads on without a gap or a repeat."""

    tenant: str
    run_id: str | None
    root_id: str | None
    amount: float
    currency: str
    at: float
    id: int | None = None


@runtime_checkable
class RateStore(Protocol):
    """Rate-limit state, each operation atomic across instances (scoped by namespace, times from
    the app's clock):

    - slots: at most ``max_slots`` live holders per key (a provider's concurrent calls);
    - windows: sliding sums of amounts over the last ``window`` seconds (calls and tokens per
      minute, a breaker's failures);
    - pauses: a time before which a key is paused (a 429's cooldown, an open breaker); a later
      pause is kept;
    - counters: totals that only the caller resets, added all or nothing under limits (the spend
      behind budgets), with the cost ledger's rows.
    """

    async def slot_acquire(
        self, namespace: str, key: str, holder: str, max_slots: int, lease: float, now: float
    ) -> SlotGrant | SlotBusy:
        """Forget slots of ``key`` with ``expires_at <= now``. If ``holder`` holds a live slot,
        extend it to ``now + lease`` and grant it again; else if fewer than ``max_slots`` are
        held, give ``holder`` one until ``now + lease``; else answer when the first ends."""
        ...

    async def slot_renew(
        self, namespace: str, key: str, holder: str, lease: float, now: float
    ) -> bool:
        """Extend ``holder``'s slot to ``now + lease`` if it is still live; else False."""
        ...

    async def slot_release(self, namespace: str, key: str, holder: str) -> None:
        """Free ``holder``'s slot of ``key`` (nothing if it holds none)."""
        ...

    async def admit(
        self, namespace: str, holder: str, needs: Sequence[Need], now: float
    ) -> Admitted | Refused:
        """Meet every need of ``needs`` for ``holder``, in one atomic operation, all or nothing.
        The needs are looked at in order; the first that cannot be met is refused
        (:class:`Refused` names it) and nothing is taken or counted. Otherwise every slot is
        taken (or, if ``holder`` holds it already, extended) to ``now + lease``, every window
        amount counted at ``now``, and the circuit's trial slot taken if the circuit is tripped
        (:class:`Admitted`). Each need is met or refused exactly as its own operation
        (``slot_acquire``, ``paused_until``, ``window_add``) would meet or refuse it at that
        point; once the circuit's pause is found not in force, its counters are read as
        ``counter_add`` of 0 reads them (a counter never counted is 0; both are marked used at
        ``now``, which retention sees, whatever the answer). Ended slots and entries that left a
        window may be forgotten either way.
        Raises ValueError for the requests :func:`check_needs` refuses."""
        ...

    async def window_add(
        self, namespace: str, key: str, amount: float, window: float, limit: float | None,
        now: float,
    ) -> WindowResult:
        """Forget entries of ``key`` with ``at <= now - window``. If ``amount > 0``, ``limit`` is
        not None and ``total + amount > limit``: refuse (add nothing) and say when it would fit
        (the ``at + window`` of the oldest entry whose leaving makes room; None if it never can,
        i.e. ``amount > limit``). Otherwise add an entry ``(now, amount)`` (none for 0: a read;
        a negative amount corrects an estimate and is never refused) and return the new total.
        ``now`` may be earlier than other entries' times (a correction dated when its estimate
        was counted): the entry leaves the window at its own time.

        Cost: proportional to the entries leaving (and, when refused, to those walked to find
        ``retry_at``), never to the whole window — a window of a busy provider holds one entry
        per call of the last minute. Keep a running total beside the entries."""
        ...

    async def window_clear(self, namespace: str, key: str) -> None:
        """Forget every entry of ``key``."""
        ...

    async def pause_until(self, namespace: str, key: str, until: float, now: float) -> float:
        """Pause ``key`` until ``until`` unless it is already paused until later; return the
        pause in force. ``now`` is when the pause is set (a store whose keys expire by themselves
        gives the pause a cleanup expiry from it, so a pause never read again still goes)."""
        ...

    async def paused_until(self, namespace: str, key: str, now: float) -> float | None:
        """The end of ``key``'s pause if it is after ``now``, else None."""
        ...

    async def counter_add(
        self,
        namespace: str,
        keys: Sequence[str],
        amounts: Sequence[float],
        limits: Sequence[float | None],
        now: float,
        entry: SpendEntry | None = None,
    ) -> CounterResult:
        """Add ``amounts[i]`` to counter ``keys[i]`` (a new counter starts at 0) for every i,
        all or nothing: refused (nothing added, ``entry`` not written) if some positive amount
        would take its counter above ``limits[i]`` (None: no limit). When added, ``entry`` (if
        any) is appended to the cost ledger in the same operation, with the next id of the
        namespace (its own ``id`` is ignored). ``now`` is the counters' ``updated_at`` (for
        pruning). A read passes amounts of 0."""
        ...

    async def ledger(
        self, namespace: str, tenant: str | None = None, root_id: str | None = None,
        limit: int = 1000, *, after: int | None = None, run_id: str | None = None,
        since: float | None = None, until: float | None = None,
    ) -> list[SpendEntry]:
        """At most ``limit`` ledger rows with ``id > after`` (every row when None), in id order
        (oldest first), that match every filter given: ``tenant``, ``root_id``, ``run_id``
        (equal) and ``since <= at < until``. Each row has its ``id``; the next page is
        ``after=rows[-1].id``. A store reads by an index for tenant, root and run; ``at`` is
        each writer's clock, not in id order, so ``since``/``until`` filter the rows read in
        id order (a page reads until it has ``limit`` rows or reaches the end)."""
        ...

    async def prune_rates(self, namespace: str, before: float, limit: int) -> int:
        """Delete at most ``limit`` rows that can no longer matter: slots whose lease ended by
        ``before``, window entries dated at or before ``before`` (with their windows' totals
        when nothing is left), pauses that ended by ``before``, counters last updated before
        ``before`` (oldest first, then in key order: a provider's circuit counters rely on
        it). The ledger stays (it is the record of what was spent). Returns how many
        were deleted. A store whose keys expire by themselves (Redis) may leave slots, windows
        and pauses to their expiries, and counts only what it deleted."""
        ...
