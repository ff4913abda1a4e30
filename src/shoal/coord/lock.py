"""``app.lock``: one holder at a time per key, across replicas, with a fencing token.

A request queues in the store (FIFO by ticket) and waits until the store names it as the next in
line (a release wakes the new first waiter only: NOTIFY, pub/sub, an in-process event), or until
what it waits for ends by itself (the lease of the holder or of the waiter right ahead of it),
or a third of its lease has passed (it asks again to keep its place; a lost wake-up costs at most
that). A request waits as long as it takes for the holders, but not for a store it cannot ask:
once its asks have failed for a whole lease (each one bounded by the store's own time-out, such
as Redis' ``socket_timeout``), it raises StoreUnavailableError.
Once held, the lock is renewed every lease/3; :attr:`Lock.signal` is set as soon as it is lost:
a renewal refused, or no renewal confirmed before the lease less the drift margin
(:data:`~shoal.clock.DRIFT_MARGIN`, a tenth of it) ran out (store unreachable, a pause): another
replica, whose clock may be a little ahead, takes the lock once the lease ended by its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from shoal import _threads, _usercode
from shoal._tasks import first_of
from shoal.abort import AbortSignal, set_aborted
from shoal.clock import DRIFT_MARGIN, Clock
from shoal.errors import LockLostError, StoreUnavailableError
from shoal.ports import CoordStore
from shoal.telemetry import NOTHING, Telemetry
from shoal.types import LockGrant

log = logging.getLogger("shoal")
T = TypeVar("T")


class Lock:
    """A held lock: ``keys``, the fencing ``token`` (strictly increasing per key: pass it to the
    resource you protect, which refuses a smaller one), and ``signal``."""

    def __init__(self, keys: tuple[str, ...], token: int, holder: str, held_until: float,
                 acquired_at: float, waited: float) -> None:
        self.keys = keys
        self.token = token
        self.holder = holder
        self.signal = AbortSignal()
        self.held_until = held_until      # the lease may have passed from then on
        self.acquired_at = acquired_at
        self.waited = waited

    def __repr__(self) -> str:
        return f"<shoal.Lock {list(self.keys)} token={self.token} lost={self.signal.aborted}>"


def lock_keys(key_or_keys: str | Sequence[str]) -> tuple[str, ...]:
    """The distinct keys of a request; a clear error for bad input."""
    keys = [key_or_keys] if isinstance(key_or_keys, str) else key_or_keys
    if not isinstance(keys, Sequence) or not keys:
        raise ValueError(
            f"app.lock() takes a key or a non-empty list of keys, not {key_or_keys!r}.")
    for key in keys:
        if not isinstance(key, str) or not key:
            raise ValueError(f"A lock key is a non-empty str, not {key!r} (in {key_or_keys!r}).")
    # as written (the first names the metrics group); each store takes them in its own order
    return tuple(dict.fromkeys(keys))


def key_group(keys: Sequence[str]) -> str:
    """The metrics group of a request: the part of its first key before ':'."""
    return keys[0].split(":", 1)[0]


class LockRequest:
    """What ``app.lock(keys)`` returns: ``async with`` it to hold the lock."""

    def __init__(self, manager: LockManager, keys: tuple[str, ...],
                 prepare: Callable[[], Awaitable[None]] | None = None) -> None:
        self._manager = manager
        self._keys = keys
        self._prepare = prepare
        self._lock: Lock | None = None

    async def __aenter__(self) -> Lock:
        if self._lock is not None:
            raise RuntimeError("This app.lock(...) is already entered; call app.lock() again.")
        if self._prepare is not None:
            await self._prepare()
        self._lock = await self._manager.acquire(self._keys)
        return self._lock

    async def __aexit__(self, *exc: object) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            await self._manager.release(lock)


class LockManager:
    """Acquires, renews and releases the locks of one app."""

    def __init__(self, coord: Callable[[], CoordStore], clock: Clock, namespace: str,
                 instance_id: str, lease: float, observers: list[Any]) -> None:
        self._coord = coord
        self.clock = clock
        self.namespace = namespace
        self.instance_id = instance_id
        self.lease = lease
        self._observers = observers
        self._renewals: dict[str, asyncio.Task[None]] = {}
        self._pending: set[asyncio.Future[Any]] = set()
        self.telemetry: Telemetry = NOTHING    # the app's, set by app.instrument

    def _fields(self, event: str) -> dict[str, Any]:
        """``extra=`` of a record of this instance's."""
        return {"event": event, "instance": self.instance_id}

    async def acquire(self, keys: tuple[str, ...]) -> Lock:
        """Wait for the lock on ``keys`` and hold it (renewed) until :meth:`release`."""
        telemetry = self.telemetry
        told = telemetry.lock_wait_started(keys)
        asked: list[bool] = []   # the store's first answer: was it a grant (the lock free)?
        try:
            lock = await self._acquire(keys, asked)
        except BaseException:
            telemetry.lock_wait_ended(told, keys, False, asked[:1] == [False])
            raise
        telemetry.lock_wait_ended(told, keys, True, asked[:1] == [False])
        return lock

    async def _acquire(self, keys: tuple[str, ...], asked: list[bool]) -> Lock:
        """Wait for the lock; the store's first answer goes in ``asked`` (True: a grant), for
        telemetry to tell a free lock from one handed over."""
        coord = self._coord()
        holder = f"{self.instance_id}/{secrets.token_hex(6)}"
        started = self.clock.now()
        granted: LockGrant | None = None
        try:
            async with coord.lock_watch(self.namespace, keys, holder) as watch:
                failing: float | None = None      # when the first of the failed asks was sent
                while granted is None:
                    sent = self.clock.now()
                    try:
                        got = await coord.lock_acquire(self.namespace, keys, holder, self.lease,
                                                       sent)
                    except Exception as e:
                        if failing is None:
                            failing = sent
                            log.warning("lock.unavailable: %s: %s; still waiting for %s",
                                        type(e).__name__, e, list(keys),
                                        extra=self._fields("lock.unavailable"))
                        self._give_up_after_a_lease(keys, failing, e)
                        # the store may have granted it before the error: give back whatever
                        # we have, or we would queue behind ourselves until our own lease ends
                        with contextlib.suppress(Exception):
                            await coord.lock_release(self.namespace, keys, holder)
                        await self.clock.sleep(min(self.lease / 3, 1.0))
                        continue
                    failing = None
                    if not asked:
                        asked.append(isinstance(got, LockGrant))
                    if isinstance(got, LockGrant):
                        if self.clock.now() < sent + self.lease:
                            granted = got
                            break
                        # answered after its own lease ended: another may hold it already
                        await coord.lock_release(self.namespace, keys, holder)
                        continue
                    # ask again when told, when something ahead ends, or to keep our place
                    wake_at = min(got.retry_at, sent + self.lease / 3)
                    await first_of(watch.wait(), self.clock, wake_at - self.clock.now())
        except BaseException:
            # cancelled or failed while queued (or right after the grant): leave nothing behind
            with contextlib.suppress(Exception):
                await asyncio.shield(coord.lock_release(self.namespace, keys, holder))
            raise
        now = self.clock.now()
        lock = Lock(keys, granted.token, holder, sent + self.lease, now, now - started)
        self._renewals[holder] = asyncio.create_task(self._renew(lock),
                                                     name=f"shoal-lock-{keys[0]}")
        self._notify("on_lock_acquired", keys, key_group(keys), lock.waited)
        return lock

    def _give_up_after_a_lease(self, keys: tuple[str, ...], failing: float,
                               error: Exception) -> None:
        """Raise StoreUnavailableError once the asks have failed for a whole lease (from
        ``failing``, when the first of them was sent): a lock waits as long as it takes for its
        holders, not for a store it cannot reach (its place in the queue ends with that lease
        anyway)."""
        if self.clock.now() - failing < self.lease:
            return
        raise StoreUnavailableError(
            f"app.lock({list(keys)!r}) gave up: the coordination store could not be asked for "
            f"{self.lease:g} s (the lease); last error: {type(error).__name__}: {error}. "
            f"Check that the store can be reached (its address, database and TLS), then ask "
            f"again.") from error

    async def release(self, lock: Lock) -> None:
        lost = lock.signal.aborted
        # from here on the lock may have another holder: tell whatever still runs under it
        set_aborted(lock.signal, LockLostError(lock.keys, "it was released"))
        task = self._renewals.pop(lock.holder, None)
        if task is not None:
            task.cancel()
            # not suppress(BaseException): that would also swallow a cancel of the caller
            await asyncio.wait([task])
        try:
            await self._coord().lock_release(self.namespace, lock.keys, lock.holder)
        except Exception as e:
            # the lease ends by itself; the next holder waits for it at most that long
            log.warning("lock.release_failed: %s: %s; %s ends with its lease",
                        type(e).__name__, e, list(lock.keys),
                        extra=self._fields("lock.release_failed"))
        held = self.clock.now() - lock.acquired_at
        self.telemetry.lock_released(lock.keys, held, lost)
        self._notify("on_lock_released", lock.keys, key_group(lock.keys), held, lost)

    async def locked(self, keys: tuple[str, ...], fn: Callable[[AbortSignal], Any]) -> Any:
        lock = await self.acquire(keys)
        try:
            if inspect.iscoroutinefunction(fn):
                return await _usercode.awaited(fn(lock.signal))
            # a plain function runs in a thread: blocking the loop would stop the renewals
            thread = _threads.run(_usercode.wrap(fn), lock.signal)
            try:
                result = await asyncio.shield(thread)
            except asyncio.CancelledError:
                # a thread cannot be stopped: tell it, and keep the lock (renewed) until it
                # returns, so nobody else holds it meanwhile
                set_aborted(lock.signal, LockLostError(lock.keys, "the caller was cancelled"))
                await asyncio.wait([thread])
                raise
            if inspect.isawaitable(result):
                result = await result
            return result
        finally:
            await asyncio.shield(self.release(lock))

    async def _renew(self, lock: Lock) -> None:
        coord = self._coord()
        failing = False
        while True:
            # a third of the lease after the last confirmed renewal (or grant) was sent
            await self.clock.sleep(max(0.0, lock.held_until - self.lease * 2 / 3
                                       - self.clock.now()))
            while True:
                sent = self.clock.now()
                remaining = lock.held_until - self.lease * DRIFT_MARGIN - sent
                if remaining <= 0:
                    self._lost(lock, "the lease ran out before a renewal was confirmed "
                                     "(store unreachable or this process paused)")
                    return
                try:
                    call = asyncio.ensure_future(coord.lock_renew(
                        self.namespace, lock.keys, lock.holder, self.lease, sent))
                    if not await first_of(call, self.clock, remaining):
                        self._lost(lock, "the store did not confirm a renewal before the lease "
                                         "ran out (less the drift margin)")
                        return
                    renewed = call.result()
                except Exception as e:
                    if not failing:    # once per outage, not once per retry
                        log.warning("lock.renew_failed: %s: %s; retrying while the lease lasts",
                                    type(e).__name__, e, extra=self._fields("lock.renew_failed"))
                    failing = True
                    await self.clock.sleep(min(self.lease / 10, 1.0, max(
                        0.0, lock.held_until - self.lease * DRIFT_MARGIN - self.clock.now())))
                    continue
                if not renewed:
                    self._lost(lock, "renewal refused: the lease had ended and the lock may "
                                     "have another holder")
                    return
                lock.held_until = sent + self.lease
                failing = False
                break

    def _lost(self, lock: Lock, reason: str) -> None:
        log.warning("lock.lost: %s (token %d): %s", list(lock.keys), lock.token, reason,
                    extra=self._fields("lock.lost"))
        set_aborted(lock.signal, LockLostError(lock.keys, reason))

    def _notify(self, method: str, *args: Any) -> None:
        for observer in self._observers:
            fn = getattr(observer, method, None)
            if fn is None:
                continue
            try:
                result = fn(*args)
                if asyncio.iscoroutine(result):
                    self._pending.add(task := asyncio.ensure_future(result))
                    task.add_done_callback(self._pending.discard)
            except Exception:
                log.exception("observer.failed: %s.%s", type(observer).__name__, method,
                              extra=self._fields("observer.failed"))
