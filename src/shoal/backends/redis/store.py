"""Coordination on Redis: locks, membership and meters, one Lua script per atomic operation.

Redis keeps no runs; it is a :class:`~shoal.ports.CoordStore` only. Each operation of the
protocol is one script in ``lua/`` (its header documents every key and argument), so it is
atomic on the server. Every time is the app's clock, passed to the script as ``now``: Redis
``TIME`` is never read, so a VirtualClock moves Redis leases like any other store's.

Keys, per namespace (``{ns}`` is the namespace with ``%`` and ``:`` percent-encoded, so one
namespace can never reach into another's keys; ``{key}`` is the lock or meter key as given)::

    {prefix}:{ns}:tickets          string  the namespace's last waiter ticket      never expires
    {prefix}:{ns}:fence:{key}      string  the key's last fencing token            never expires
    {prefix}:{ns}:lock:{key}       hash    holder, expires_at                      cleanup expiry
    {prefix}:{ns}:queue:{key}      zset    waiting holder -> ticket                cleanup expiry
    {prefix}:{ns}:waiting:{key}    hash    waiting holder -> expires_at            cleanup expiry
    {prefix}:{ns}:inbox:{key}      hash    waiting holder -> its store's channel   cleanup expiry
    {prefix}:{ns}:members          hash    member -> "joined_at expires_at held"   cleanup expiry
    {prefix}:{ns}:roster           hash    generation, members (JSON array)        never expires
    {prefix}:{ns}:beats            hash    member -> "beat_at =version" or "… -"   cleanup expiry
    {prefix}:{ns}:meter:{key}      hash    debt (ms), updated_at                   cleanup expiry

and, per store object, the pub/sub channel ``{prefix}:_inbox:{random}``: a release that makes one
of its waiters the next in line publishes ``[namespace, waiter]`` there, so a hand-off wakes that
waiter and no other (the key's other waiters, in this process or elsewhere, hear nothing). A
"cleanup expiry" is a real-time ``PEXPIRE`` far longer
than any lease (at least an hour): it only collects rows nobody uses any more; correctness rests
on the ``expires_at`` compared with ``now`` inside the scripts.

Connections are made lazily: :meth:`RedisCoordStore.open` succeeds while Redis is down, each
operation raises :class:`~shoal.errors.StoreUnavailableError` within ``socket_timeout`` while it
cannot be reached or used (nothing listening, a database the server does not have, a TLS
mismatch, a server that never answers), and the next operation after Redis is back simply works.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from importlib import resources
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import AuthenticationError, OutOfMemoryError, ReadOnlyError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shoal.backends._watches import EventWatch, WatchRegistry
from shoal.errors import ConfigurationError, StoreUnavailableError
from shoal.ports import check_counter_args, check_needs
from shoal.types import (
    Admitted,
    CoordinationView,
    CounterResult,
    LockGrant,
    LockState,
    LockWait,
    LockWaiter,
    MemberState,
    MemberView,
    MeterState,
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

T = TypeVar("T")

_SCRIPTS = ("lock_acquire", "lock_renew", "lock_release", "raise_fence", "heartbeat", "meter",
            "rate_slot_acquire", "rate_slot_renew", "rate_window_add", "rate_admit",
            "rate_pause_until", "rate_paused_until", "rate_counter_add", "rate_prune_counters")
_UNREACHABLE = (
    RedisConnectionError, RedisTimeoutError, ReadOnlyError, OutOfMemoryError, OSError, TimeoutError
)
_KEEP = 3600.0          # seconds: the least real time a garbage-collectable row outlives its use
_IDLE_PING = 15.0       # seconds of silence on the pub/sub connection before it is pinged


class _SetupRefused(RedisConnectionError):
    """Redis refused to set a new connection up (selecting the database of the address): a
    connection that cannot be used, reported as StoreUnavailableError like one not made."""


async def _set_up(connection: Any) -> None:
    """What redis-py does on a new connection (authenticate, select the database), with a
    refusal raised as :class:`_SetupRefused` rather than the ResponseError of a command."""
    try:
        await connection.on_connect()
    except ResponseError as e:
        raise _SetupRefused(str(e)) from e


def _load(name: str) -> str:
    return resources.files("shoal.backends.redis").joinpath("lua", f"{name}.lua").read_text()


def _keep_ms(lease: float) -> str:
    return str(int(max(10.0 * lease, _KEEP) * 1000))


def _window_keep_ms(window: float) -> str:
    return str(int(min(max(2.0 * window, _KEEP), 1e12) * 1000))


def _num(x: float) -> str:
    return repr(float(x))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _parse(url: str) -> tuple[str, str, int, int]:
    """``(scheme, host, port, db)`` of a ``redis://`` or ``rediss://`` address without
    credentials; raises ConfigurationError otherwise (never showing a password)."""
    from shoal.backends._urls import mask_url

    try:
        parts = urlsplit(url)
        port = parts.port or 6379
    except ValueError as e:
        raise ConfigurationError(
            f"Cannot read the Redis address {mask_url(url)!r} ({e}): "
            f"give it as 'redis://host:6379/0' or 'rediss://host:6380/0'."
        ) from None
    shown = mask_url(url).split("?", 1)[0]
    if parts.password is not None or parts.username:
        raise ConfigurationError(
            f"The Redis address {shown!r} carries credentials. Give the address without them "
            f"and pass the password separately (password=..., which the app takes from the "
            f"environment variable SHOAL_REDIS_PASSWORD)."
        )
    if parts.scheme not in ("redis", "rediss"):
        raise ConfigurationError(
            f"{shown!r} is not a Redis address: give it as 'redis://host:6379/0' "
            f"(or 'rediss://' for TLS)."
        )
    if parts.query:
        raise ConfigurationError(
            f"The Redis address {shown!r} has options after '?'; shoal takes none there. "
            f"Give 'redis://host:6379/0' and pass the password separately (password=..., or "
            f"SHOAL_REDIS_PASSWORD)."
        )
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ConfigurationError(
            f"The Redis address {shown!r} names database {path!r}; a database is a number, "
            f"as in 'redis://host:6379/0'."
        )
    return parts.scheme, parts.hostname or "localhost", port, int(path or 0)


def _quote(namespace: str) -> str:
    return namespace.replace("%", "%25").replace(":", "%3A")


# keys coordination_view's SCAN may walk: SCAN walks the whole database, not one namespace
VIEW_SCAN = 10_000
_VIEW_KINDS = ("lock", "queue", "meter")


def _glob(text: str) -> str:
    """``text`` as a literal in a ``SCAN MATCH`` pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


async def _scan(client: Redis, base: str) -> tuple[list[tuple[str, str]], bool]:
    """``(kind, key)`` of the namespace's lock, queue and meter keys that a ``SCAN`` of at most
    :data:`VIEW_SCAN` keys finds, and whether the walk went through the whole database."""
    found: list[tuple[str, str]] = []
    cursor, walked = 0, 0
    while True:
        cursor, names = await client.scan(cursor, match=f"{_glob(base)}:*", count=1000)
        walked += 1000
        for name in names:
            rest = _text(name)[len(base) + 1:]
            kind, _, key = rest.partition(":")
            if kind in _VIEW_KINDS:
                found.append((kind, key))
        if cursor == 0:
            return found, True
        if walked >= VIEW_SCAN:
            return found, False


def _member_states(members: dict[Any, Any], beats: dict[Any, Any],
                   now: float) -> tuple[MemberState, ...]:
    """The live members of the members hash, with their beats (see ``heartbeat.lua``)."""
    out = []
    beats = {_text(k): v for k, v in beats.items()}
    for name, row in members.items():
        parts = _text(row).split(" ")
        if len(parts) != 3 or float(parts[1]) <= now:
            continue
        beat_at: float | None = None
        version: str | None = None
        beat = beats.get(_text(name))
        if beat is not None:
            at, _, flag = _text(beat).partition(" ")
            beat_at = float(at)
            version = flag[1:] if flag.startswith("=") else None
        out.append(MemberState(_text(name), float(parts[0]), float(parts[1]),
                               None if parts[2] == "-" else int(parts[2]), beat_at, version))
    return tuple(sorted(out, key=lambda m: m.member))


def _lock_state(key: str, row: list[Any], now: float) -> LockState:
    """A key's live hold and live waiters from its hold, fence, queue and waiter hashes."""
    (holder, expires), fence, queue, waiting = row
    live = holder is not None and expires is not None and float(_text(expires)) > now
    waiters = []
    waiting = {_text(k): v for k, v in waiting.items()}
    for name, ticket in queue:
        until = waiting.get(_text(name))
        if until is not None and float(_text(until)) > now:
            waiters.append(LockWaiter(_text(name), int(ticket), float(_text(until))))
    return LockState(key, 0 if fence is None else int(_text(fence)),
                     _text(holder) if live else None,
                     float(_text(expires)) if live else None, tuple(waiters))


def _meter_state(key: str, row: list[Any], now: float) -> MeterState | None:
    """A meter's debt drained to ``now`` as ``meter.lua`` drains it; None when 0."""
    debt_text, at_text = row
    if debt_text is None or at_text is None:
        return None
    at = float(_text(at_text))
    debt = max(0.0, float(_text(debt_text)) - max(0.0, now - at) * 1000.0)
    return MeterState(key, debt, at) if debt > 0 else None


class RedisCoordStore:
    """Locks, membership and meters on one Redis server (a :class:`CoordStore`).

    ``url`` is ``redis://host:port/db`` or ``rediss://…`` and carries no credentials (a user or
    password in it raises ConfigurationError); the password is passed as ``password``. Keys live
    under ``prefix``. Operations raise StoreUnavailableError within about ``socket_timeout`` while
    Redis cannot be reached. One pub/sub connection per store object, subscribed to the store
    object's own channel (its inbox), serves every lock watch.
    """

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        prefix: str = "shoal",
        socket_timeout: float = 2.0,
    ) -> None:
        scheme, self._host, self._port, self._db = _parse(url)
        self._ssl = scheme == "rediss"
        self.address = f"{scheme}://{self._host}:{self._port}/{self._db}"
        self.prefix = prefix
        self._password = password
        self._timeout = socket_timeout
        self._client: Redis | None = None
        self._scripts: dict[str, AsyncScript] = {}
        # pub/sub: one listener task and connection, subscribed to this store object's inbox,
        # for every watch of this store
        self._inbox = f"{prefix}:_inbox:{secrets.token_hex(8)}"
        self._watches: WatchRegistry[EventWatch] = WatchRegistry()
        self._subscribed = asyncio.Event()     # the inbox is subscribed on a live connection
        self._down = asyncio.Event()           # the last connection failed, none succeeded since
        self._pubsub: PubSub | None = None
        self._listener: asyncio.Task[None] | None = None
        self._wake_on_connect = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def __repr__(self) -> str:
        return f"RedisCoordStore({self.address!r}, prefix={self.prefix!r})"

    # -- connection ----------------------------------------------------------------------------

    async def open(self) -> None:
        """Prepare the client; connects lazily, so this succeeds while Redis is down."""
        self._closed = False
        self._redis()

    async def close(self) -> None:
        """Stop the pub/sub listener and close every connection."""
        self._closed = True
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(BaseException):
                await listener
        self._drop_pubsub()
        self._down.clear()
        if self._tasks:                   # pub/sub connections closing in the background
            await asyncio.wait(list(self._tasks), timeout=self._timeout)
        for task in list(self._tasks):
            task.cancel()
        client, self._client = self._client, None
        self._scripts = {}
        if client is not None:
            with contextlib.suppress(*_UNREACHABLE):
                await client.aclose()

    def _redis(self) -> Redis:
        if self._client is None:
            self._client = Redis(
                host=self._host,
                port=self._port,
                db=self._db,
                password=self._password,
                ssl=self._ssl,
                socket_timeout=self._timeout,
                socket_connect_timeout=self._timeout,
                retry=Retry(NoBackoff(), 0),
                decode_responses=True,
                redis_connect_func=_set_up,
            )
            self._scripts = {n: self._client.register_script(_load(n)) for n in _SCRIPTS}
        return self._client

    def _unavailable(self, e: BaseException) -> StoreUnavailableError:
        if isinstance(e, AuthenticationError):
            return StoreUnavailableError(
                f"Redis at {self.address} refused the connection's credentials ({e}). "
                f"Check the password given to shoal (SHOAL_REDIS_PASSWORD)."
            )
        if isinstance(e, _SetupRefused):
            return StoreUnavailableError(
                f"Redis at {self.address} refused database {self._db} ({e}). A database is a "
                f"number below the server's 'databases' setting (16 by default): fix the number "
                f"at the end of the address."
            )
        silent = isinstance(e, TimeoutError)
        reason = str(e) or (f"no answer within {self._timeout:g} s" if silent
                            else type(e).__name__)
        hint = ""
        if self._ssl and silent:
            hint = (" A server without TLS on this port does not answer a rediss:// address "
                    "either: check the scheme too.")
        elif not self._ssl and ("reset" in reason.lower() or "closed" in reason.lower()):
            hint = (" A server that takes only TLS on this port closes plain connections: if "
                    "so, the address starts with rediss://.")
        return StoreUnavailableError(
            f"Redis at {self.address} is unavailable ({reason}). Check that the server runs "
            f"and can be reached from here; shoal keeps trying and carries on once it "
            f"answers.{hint}"
        )

    async def _call(self, op: Callable[[Redis], Awaitable[T]]) -> T:
        try:
            async with asyncio.timeout(self._timeout):
                return await op(self._redis())
        except _UNREACHABLE as e:
            raise self._unavailable(e) from e

    async def _script(self, name: str, keys: Sequence[str], args: Sequence[str]) -> Any:
        async def run(client: Redis) -> Any:
            return await self._scripts[name](keys=list(keys), args=list(args), client=client)

        return await self._call(run)

    async def ping(self) -> None:
        """Raise StoreUnavailableError if Redis cannot be reached."""

        async def run(client: Redis) -> None:
            await client.ping()

        await self._call(run)

    # -- names ---------------------------------------------------------------------------------

    def _base(self, namespace: str) -> str:
        return f"{self.prefix}:{_quote(namespace)}"

    def _channel(self, namespace: str, key: str) -> str:
        return f"{self._base(namespace)}:changed:{key}"

    # -- locks ---------------------------------------------------------------------------------

    async def lock_acquire(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> LockGrant | LockWait:
        base = self._base(namespace)
        names = [f"{base}:tickets"]
        for k in keys:
            names += [f"{base}:lock:{k}", f"{base}:queue:{k}", f"{base}:waiting:{k}",
                      f"{base}:fence:{k}", f"{base}:inbox:{k}"]
        got = await self._script(
            "lock_acquire", names,
            [holder, _num(lease), _num(now), _keep_ms(lease), self._inbox])
        granted, number, at = got
        if int(granted):
            return LockGrant(int(number), float(_text(at)))
        return LockWait(int(number), float(_text(at)))

    async def lock_renew(
        self, namespace: str, keys: Sequence[str], holder: str, lease: float, now: float
    ) -> bool:
        base = self._base(namespace)
        got = await self._script(
            "lock_renew", [f"{base}:lock:{k}" for k in keys],
            [holder, _num(lease), _num(now), _keep_ms(lease)])
        return bool(int(got))

    async def lock_release(self, namespace: str, keys: Sequence[str], holder: str) -> None:
        base = self._base(namespace)
        names: list[str] = []
        for k in keys:
            names += [f"{base}:lock:{k}", f"{base}:queue:{k}", f"{base}:waiting:{k}",
                      f"{base}:inbox:{k}"]
        try:
            mine = await self._script("lock_release", names, [holder, namespace, self._inbox])
        except BaseException:
            # it may have run: whoever is next here must not wait for its timer
            self._watches.wake_keys(namespace, keys)
            raise
        # the script publishes to other store objects' inboxes; this one's waiters need no trip
        self._watches.wake(namespace, [_text(h) for h in mine])

    async def raise_fence(self, namespace: str, keys: Sequence[str], token: int) -> None:
        """Raise the fencing counter of every key to at least ``token`` (for Redlock: the next
        grant of these keys on this server then takes a larger token)."""
        base = self._base(namespace)
        await self._script("raise_fence", [f"{base}:fence:{k}" for k in keys], [str(int(token))])

    @asynccontextmanager
    async def lock_watch(
        self, namespace: str, keys: Sequence[str], holder: str
    ) -> AsyncIterator[EventWatch]:
        """A watch woken when a release names ``holder`` as the next in line: through this
        store object's inbox (pub/sub) from any process, at once by a release through this store
        object, and by a reconnection of the pub/sub connection (a message may have been
        missed). Entering waits until Redis confirmed the inbox subscription (the first time,
        at most ``socket_timeout``); it does not raise while Redis is unreachable."""
        watch = EventWatch(namespace, keys, holder)
        self._watches.add(watch)
        try:
            if not self._subscribed.is_set():
                if self._listener is None and not self._closed:
                    self._listener = asyncio.get_running_loop().create_task(self._listen())
                if not self._down.is_set():
                    # connecting: wait for it (a watch made while Redis is down does not)
                    settled = [asyncio.ensure_future(e.wait())
                               for e in (self._subscribed, self._down)]
                    try:
                        await asyncio.wait(settled, timeout=self._timeout,
                                           return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        for task in settled:
                            task.cancel()
                if not self._subscribed.is_set():
                    # a release may name this holder before the inbox is subscribed, and that
                    # message is lost: the subscription, once confirmed, wakes every watch
                    self._wake_on_connect = True
                    if not self._down.is_set():
                        watch.event.set()     # slow to confirm, not down: look once now too
            yield watch
        finally:
            self._watches.remove(watch)

    # -- pub/sub -------------------------------------------------------------------------------

    def _drop_pubsub(self) -> None:
        """Forget the pub/sub connection (closed in the background)."""
        pubsub, self._pubsub = self._pubsub, None
        self._subscribed.clear()
        if pubsub is not None:
            self._spawn(self._close_pubsub(pubsub))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close_pubsub(self, pubsub: PubSub) -> None:
        with contextlib.suppress(Exception):
            # untyped before redis 8.2, typed since: either way without an ignore to go stale
            await cast(Any, pubsub).aclose()

    async def _listen(self) -> None:
        """Keep one pub/sub connection subscribed to this store object's inbox and wake the
        watches its messages name; reconnect (with a short backoff) whenever it fails."""
        delay = 0.05
        while not self._closed:
            pubsub = self._redis().pubsub()
            try:
                async with asyncio.timeout(self._timeout):
                    await cast(Any, pubsub).connect()   # typed or not, as aclose()
                self._pubsub = pubsub
                await pubsub.subscribe(self._inbox)
                delay = 0.05
                await self._read(pubsub)
            except Exception:
                pass                      # unreachable, or a broken reply: reconnect
            finally:
                if self._pubsub is not pubsub:
                    self._spawn(self._close_pubsub(pubsub))
                self._wake_on_connect = True
                self._down.set()
                self._drop_pubsub()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _read(self, pubsub: PubSub) -> None:
        idle = 0.0
        pinged = False
        while True:
            message = await pubsub.get_message(timeout=self._timeout)
            if message is None:
                idle += self._timeout
                if idle >= _IDLE_PING + 2 * self._timeout and pinged:
                    raise RedisTimeoutError("the pub/sub connection stopped answering")
                if idle >= _IDLE_PING and not pinged:
                    pinged = True
                    await pubsub.ping()
                continue
            idle, pinged = 0.0, False
            kind = _text(message.get("type"))
            if kind == "message":
                try:
                    namespace, holder = json.loads(_text(message.get("data")))
                    self._watches.wake(str(namespace), [str(holder)])
                except (ValueError, TypeError):     # not ours to read: look anyway
                    self._watches.wake_every()
            elif kind == "subscribe" and _text(message.get("channel")) == self._inbox:
                self._subscribed.set()
                self._down.clear()
                if self._wake_on_connect:
                    # anything published while there was no subscription is covered by this
                    self._wake_on_connect = False
                    self._watches.wake_every()

    # -- membership ----------------------------------------------------------------------------

    async def heartbeat(
        self,
        namespace: str,
        member: str,
        held: int | None,
        now: float,
        ttl: float,
        warmup: float,
        *,
        version: str | None = None,
    ) -> MemberView:
        base = self._base(namespace)
        got = await self._script(
            "heartbeat", [f"{base}:members", f"{base}:roster", f"{base}:beats"],
            [member, "-" if held is None else str(int(held)), _num(now), _num(ttl),
             _num(warmup), _keep_ms(ttl), "-" if version is None else f"={version}"])
        generation, granted, *ids = got
        return MemberView(int(generation), tuple(sorted(_text(i) for i in ids)),
                          bool(int(granted)))

    async def leave(self, namespace: str, member: str) -> None:
        base = self._base(namespace)

        async def run(client: Redis) -> None:
            async with client.pipeline(transaction=True) as pipe:
                pipe.hdel(f"{base}:members", member)
                pipe.hdel(f"{base}:beats", member)
                await pipe.execute()

        await self._call(run)

    # -- the console's read --------------------------------------------------------------------

    async def coordination_view(
        self, namespace: str, now: float, limit: int = 100
    ) -> CoordinationView:
        """Read with read-only commands (nothing is written, no expiry changed), in two
        transactions (MULTI/EXEC), each one snapshot: the members, their beats and the roster;
        then the locks and meters found between them. Redis keeps no index of a namespace's
        locks and meters: they are found by ``SCAN`` (which walks the whole database, not only
        this namespace) of at most :data:`VIEW_SCAN` keys; when the database holds more,
        ``complete`` is False and the locks and meters listed are those the walk reached.
        Members and the roster are always read whole."""
        base = self._base(namespace)
        found = await self._call(lambda client: _scan(client, base))
        keys, walked = found
        locks = sorted({k for kind, k in keys if kind in ("lock", "queue")})
        meters = sorted({k for kind, k in keys if kind == "meter"})

        async def read(client: Redis) -> list[Any]:
            async with client.pipeline(transaction=True) as pipe:
                pipe.hgetall(f"{base}:members")
                pipe.hgetall(f"{base}:beats")
                pipe.hgetall(f"{base}:roster")
                for k in locks:
                    pipe.hmget(f"{base}:lock:{k}", "holder", "expires_at")
                    pipe.get(f"{base}:fence:{k}")
                    pipe.zrange(f"{base}:queue:{k}", 0, -1, withscores=True)
                    pipe.hgetall(f"{base}:waiting:{k}")
                for k in meters:
                    pipe.hmget(f"{base}:meter:{k}", "debt", "updated_at")
                return list(await pipe.execute())

        got = await self._call(read)
        members, beats, roster = got[:3]
        lock_rows = [got[3 + 4 * i: 7 + 4 * i] for i in range(len(locks))]
        meter_rows = got[3 + 4 * len(locks):]
        held = [_lock_state(k, row, now) for k, row in zip(locks, lock_rows, strict=True)]
        live = [lock for lock in held if lock.holder is not None or lock.waiters]
        debts = [m for m in (_meter_state(k, row, now)
                             for k, row in zip(meters, meter_rows, strict=True))
                 if m is not None]
        stored = {_text(k): _text(v) for k, v in roster.items()}
        return CoordinationView(
            namespace, now, int(stored.get("generation", "0")),
            tuple(json.loads(stored.get("members", "[]"))),
            _member_states(members, beats, now),
            tuple(replace(lock, waiters=lock.waiters[:limit]) for lock in live[:limit]),
            tuple(debts[:limit]),
            complete=walked and len(live) <= limit and len(debts) <= limit
            and all(len(lock.waiters) <= limit for lock in live))

    # -- meters --------------------------------------------------------------------------------

    async def meter(
        self, namespace: str, keys: Sequence[str], deltas: Sequence[float], now: float
    ) -> list[float]:
        if len(keys) != len(deltas):
            raise ValueError(f"meter: {len(keys)} keys but {len(deltas)} deltas")
        if not keys:
            return []
        base = self._base(namespace)
        got = await self._script(
            "meter", [f"{base}:meter:{k}" for k in keys],
            [_num(now), _keep_ms(0.0), *(_num(d) for d in deltas)])
        return [float(_text(debt)) for debt in got]

    # -- retention -----------------------------------------------------------------------------

    async def prune_coordination(self, namespace: str, before: float, limit: int) -> int:
        """Nothing to delete: Redis collects these keys by itself. Meters, holds, queues, waiter
        rows and members carry a real-time cleanup expiry (an hour at least) that ends them once
        nobody uses them. What never expires stays on purpose: the fencing counters (a key's
        tokens must keep increasing), the namespace's ticket counter and its roster. Returns 0."""
        return 0

    # -- rate limits: slots, windows, pauses, counters and the cost ledger (a RateStore) --------
    #
    # Keys, per namespace ({ns} encoded as above, {key} as given)::
    #
    #   {prefix}:{ns}:rslots:{key}   hash    holder -> expires_at        cleanup expiry (>= 10 x
    #                                                                     lease, an hour at least)
    #   {prefix}:{ns}:rwz:{key}      zset    '<seq> <amount>' by at       cleanup expiry (>= 2 x
    #   {prefix}:{ns}:rwt:{key}      hash    total, seq                   window, an hour at least)
    #   {prefix}:{ns}:rpause:{key}   string  the end of the pause         cleanup expiry: the
    #                                                                     pause, then an hour
    #   {prefix}:{ns}:rcount:{key}   hash    total, updated_at            pruned (prune_rates)
    #   {prefix}:{ns}:rcounters      zset    counter key -> updated_at    its entries pruned
    #   {prefix}:{ns}:ledger_rows    stream  '<id>-0' -> row (JSON)       never expires
    #   {prefix}:{ns}:ledger_id      string  the last ledger id           never expires
    #
    # Counters are pruned exactly, by the app's clock, as the SQL stores prune them: each spend
    # writes its counters' updated_at into the namespace's index (rcounters) in the same script,
    # and prune_rates reads the idlest from the index (a range by score, O(log n + batch)) and
    # deletes those still idle in one script. A real-time expiry would need the app's retention
    # in the store and would not follow a VirtualClock.
    #
    # The ledger is a stream whose entry ids are the ledger ids ('<id>-0', the id from the
    # INCR of ledger_id in the script that writes the row), so a page after an id is one XRANGE
    # from 'after + 1' (O(log n + page)), rows are stored compactly, and an exported prefix can be
    # trimmed with XTRIM MINID or XDEL; ids keep increasing after a trim (ledger_id stays). A
    # filtered page reads the stream in chunks from 'after' on the client, until it has 'limit'
    # matches or reaches the end: Redis keeps no index by tenant, root or run. The ledger of the
    # layout before (a list under 'ledger') is not read.
    #
    # A window is a sorted set of its entries by time beside a running total (the memory
    # reference's layout): the entries leaving are a range by score, read, subtracted and removed,
    # so a call costs the entries leaving, not the whole window. The total is kept as '%.17g'
    # text; its last bit may differ from a sum in another order. An empty window's total is 0
    # (the hash is deleted). Windows of the layout before (a list under rwin:{key}) are not read:
    # they count as empty and go with their cleanup expiry. Cleanup expiries are never shortened.

    async def slot_acquire(
        self, namespace: str, key: str, holder: str, max_slots: int, lease: float, now: float
    ) -> SlotGrant | SlotBusy:
        got = await self._script(
            "rate_slot_acquire", [f"{self._base(namespace)}:rslots:{key}"],
            [holder, str(int(max_slots)), _num(lease), _num(now), _keep_ms(lease)])
        granted, at = int(got[0]), _text(got[1])
        if granted:
            return SlotGrant(float(at))
        if not at:
            raise ValueError(f"slot_acquire: max_slots is {max_slots}; at least 1 is needed")
        return SlotBusy(float(at))

    async def slot_renew(
        self, namespace: str, key: str, holder: str, lease: float, now: float
    ) -> bool:
        got = await self._script(
            "rate_slot_renew", [f"{self._base(namespace)}:rslots:{key}"],
            [holder, _num(lease), _num(now), _keep_ms(lease)])
        return bool(int(got))

    async def slot_release(self, namespace: str, key: str, holder: str) -> None:
        name = f"{self._base(namespace)}:rslots:{key}"

        async def run(client: Redis) -> None:
            await client.hdel(name, holder)

        await self._call(run)

    async def window_add(
        self, namespace: str, key: str, amount: float, window: float, limit: float | None,
        now: float,
    ) -> WindowResult:
        base = self._base(namespace)
        got = await self._script(
            "rate_window_add", [f"{base}:rwz:{key}", f"{base}:rwt:{key}"],
            [_num(amount), _num(window), "-" if limit is None else _num(limit), _num(now),
             _window_keep_ms(window)])
        added, total, retry_at = int(got[0]), _text(got[1]), _text(got[2])
        return WindowResult(bool(added), float(total), float(retry_at) if retry_at else None)

    async def window_clear(self, namespace: str, key: str) -> None:
        base = self._base(namespace)

        async def run(client: Redis) -> None:
            await client.delete(f"{base}:rwz:{key}", f"{base}:rwt:{key}")

        await self._call(run)

    async def pause_until(self, namespace: str, key: str, until: float, now: float) -> float:
        got = await self._script(
            "rate_pause_until", [f"{self._base(namespace)}:rpause:{key}"],
            [_num(until), _num(now), _keep_ms(0.0)])
        return float(_text(got))

    async def paused_until(self, namespace: str, key: str, now: float) -> float | None:
        got = await self._script(
            "rate_paused_until", [f"{self._base(namespace)}:rpause:{key}"],
            [_num(now), _keep_ms(0.0)])
        return None if got is None else float(_text(got))

    async def read_rates(
        self, namespace: str, now: float, *, slots: Sequence[str] = (),
        windows: Sequence[tuple[str, float]] = (), pauses: Sequence[str] = (),
        counters: Sequence[str] = (),
    ) -> RateView:
        """Read-only commands in one MULTI/EXEC (one snapshot): nothing is forgotten and no
        expiry changes. A window whose total hash is gone while entries stay (evicted) is summed
        from its entries in a second read."""
        base = self._base(namespace)

        async def read(client: Redis) -> list[Any]:
            async with client.pipeline(transaction=True) as pipe:
                for k in slots:
                    pipe.hvals(f"{base}:rslots:{k}")
                for k, w in windows:
                    cutoff = _num(now - w)
                    pipe.hget(f"{base}:rwt:{k}", "total")
                    pipe.zrangebyscore(f"{base}:rwz:{k}", "-inf", cutoff)
                    pipe.zcount(f"{base}:rwz:{k}", f"({cutoff}", "+inf")
                for k in pauses:
                    pipe.get(f"{base}:rpause:{k}")
                for k in counters:
                    pipe.hget(f"{base}:rcount:{k}", "total")
                return list(await pipe.execute())

        got = iter(await self._call(read))
        live = {k: sum(1 for until in next(got) if float(_text(until)) > now) for k in slots}
        totals: dict[str, float] = {}
        for k, w in windows:
            stored, leaving, staying = next(got), next(got), next(got)
            if not staying:
                totals[k] = 0.0
            elif stored is None:
                totals[k] = await self._window_sum(base, k, now - w)
            else:
                total = float(_text(stored))
                for member in leaving:       # oldest first, as rate_window_add subtracts them
                    total -= float(_text(member).rsplit(" ", 1)[1])
                totals[k] = total
        paused: dict[str, float | None] = {}
        for k in pauses:
            until = next(got)
            paused[k] = (float(_text(until)) if until is not None
                         and float(_text(until)) > now else None)
        found = {k: next(got) for k in counters}
        return RateView(slots=live, windows=totals, pauses=paused,
                        counters={k: 0.0 if v is None else float(_text(v))
                                  for k, v in found.items()})

    async def _window_sum(self, base: str, key: str, cutoff: float) -> float:
        """The sum of a window's entries after ``cutoff`` (its total hash is missing)."""

        async def read(client: Redis) -> list[Any]:
            return list(await client.zrangebyscore(f"{base}:rwz:{key}", f"({_num(cutoff)}",
                                                   "+inf"))

        return sum(float(_text(m).rsplit(" ", 1)[1]) for m in await self._call(read))

    async def admit(
        self, namespace: str, holder: str, needs: Sequence[Need], now: float
    ) -> Admitted | Refused:
        check_needs(needs)
        base = self._base(namespace)
        keys: list[str] = []
        args = [holder, _num(now), _keep_ms(0.0)]
        for need in needs:
            if isinstance(need, SlotNeed):
                keys.append(f"{base}:rslots:{need.key}")
                args += ["slot", str(int(need.max_slots)), _num(need.lease),
                         _keep_ms(need.lease)]
            elif isinstance(need, PauseNeed):
                keys.append(f"{base}:rpause:{need.key}")
                args.append("pause")
            elif isinstance(need, WindowNeed):
                keys += [f"{base}:rwz:{need.key}", f"{base}:rwt:{need.key}"]
                args += ["window", _num(need.amount), _num(need.window),
                         "-" if need.limit is None else _num(need.limit),
                         _window_keep_ms(need.window)]
            else:
                keys += [f"{base}:rpause:{need.open}", f"{base}:rcount:{need.opened}",
                         f"{base}:rcount:{need.closed}", f"{base}:rslots:{need.trial}",
                         f"{base}:rcounters"]
                args += ["circuit", _num(need.lease), _keep_ms(need.lease), need.opened,
                         need.closed]
        got = await self._script("rate_admit", keys, args)
        if int(got[0]):
            trial = _text(got[1])
            return Admitted(float(trial) if trial else None)
        part, retry_at = int(got[1]), _text(got[2])
        refused = needs[part]
        if isinstance(refused, SlotNeed) and not retry_at:
            raise ValueError(f"admit: max_slots is {refused.max_slots}; at least 1 is needed")
        return Refused(part, float(retry_at) if retry_at else None)

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
        base = self._base(namespace)
        counter = f"{base}:rcount:"
        args = [_num(now), "" if entry is None else self._ledger_row(entry),
                str(len(counter.encode()))]
        for amount, limit in zip(amounts, limits, strict=True):
            args += [_num(amount), "-" if limit is None else _num(limit)]
        got = await self._script(
            "rate_counter_add", [f"{base}:ledger_rows", f"{base}:ledger_id", f"{base}:rcounters",
                                 *(counter + k for k in keys)], args)
        added, over, *totals = got
        return CounterResult(bool(int(added)), [float(_text(t)) for t in totals],
                             None if int(added) else int(over))

    async def ledger(
        self, namespace: str, tenant: str | None = None, root_id: str | None = None,
        limit: int = 1000, *, after: int | None = None, run_id: str | None = None,
        since: float | None = None, until: float | None = None,
    ) -> list[SpendEntry]:
        """Reads the stream from ``after`` in chunks (one XRANGE each) until ``limit`` rows
        match or the stream ends: a filter is checked here, on every row read."""
        name = f"{self._base(namespace)}:ledger_rows"
        filtered = any(f is not None for f in (tenant, root_id, run_id, since, until))
        rows: list[SpendEntry] = []
        start = 0 if after is None else int(after)
        while len(rows) < limit:
            count = min(limit - len(rows), 1000) if not filtered else 1000

            async def run(client: Redis, first: int = start + 1, count: int = count) -> Any:
                return await client.xrange(name, f"{first}-0", "+", count=count)

            chunk = await self._call(run)
            for stream_id, fields in chunk:
                start = int(_text(stream_id).split("-", 1)[0])
                e = self._ledger_entry(_text(fields["row"]), start)
                if ((tenant is None or e.tenant == tenant)
                        and (root_id is None or e.root_id == root_id)
                        and (run_id is None or e.run_id == run_id)
                        and (since is None or e.at >= since)
                        and (until is None or e.at < until)):
                    rows.append(e)
                    if len(rows) == limit:
                        break
            if len(chunk) < count:
                break
        return rows

    async def prune_rates(self, namespace: str, before: float, limit: int) -> int:
        """Counters last updated before ``before``, at most ``limit``, found through the
        namespace's index (see the key table above) and checked again as they are deleted.
        Slots, windows (entries and total) and pauses are left to their real-time cleanup
        expiries; the ledger is kept on every store (it is the record of what was spent).
        Returns how many counters were deleted."""
        if limit <= 0:
            return 0
        base = self._base(namespace)
        index = f"{base}:rcounters"

        async def idle(client: Redis) -> list[Any]:
            return list(await client.zrangebyscore(index, "-inf", f"({_num(before)}",
                                                   start=0, num=limit))

        found = [_text(k) for k in await self._call(idle)]
        if not found:
            return 0
        got = await self._script("rate_prune_counters",
                                 [index, *(f"{base}:rcount:{k}" for k in found)],
                                 [_num(before), *found])
        return int(got)

    @staticmethod
    def _ledger_row(e: SpendEntry) -> str:
        # encoded here, not by the script's cjson (which keeps 14 digits): floats read back exact
        fields = [e.tenant, e.run_id, e.root_id, e.amount, e.currency, e.at]
        if e.provider is not None or e.tokens is not None:
            fields += [e.provider, e.tokens]
        return json.dumps(fields, separators=(",", ":"))

    @staticmethod
    def _ledger_entry(row: str, id: int) -> SpendEntry:
        # a row of other spending (or written before tokens were kept) has six fields
        tenant, run_id, root_id, amount, currency, at, *more = json.loads(row)
        provider, tokens = more if more else (None, None)
        return SpendEntry(tenant, run_id, root_id, amount, currency, at, id, provider, tokens)
