"""Model-provider limits, circuit breakers and cost budgets shared by every replica.

``app.provider(name, …)`` returns a :class:`Provider`; ``async with provider.call(tokens=…)``
waits until the call may go: the provider's cooldown after a 429 has passed, its breaker is not
open, a concurrency slot is free and the per-minute windows (requests, tokens) have room — all
kept in the coordination store, so every replica counts the same calls. Within one instance,
callers waiting for the same provider are served round robin by tenant; between instances, a
freed slot or window room goes to whichever instance asks first.

Budgets (``app.budget(…)``) are counters in the same store: a call reserves its estimated cost
under every budget that applies (per run, per root, per tenant per UTC day) before it goes, all
or nothing, and corrects it to the actual cost when it ends. So replicas spending concurrently
never pass a budget by more than what their calls cost beyond their estimates.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import secrets
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shoal.clock import Clock
from shoal.coord.base import RateStore, SlotGrant, SpendEntry
from shoal.coord.lock import first_of
from shoal.errors import BudgetExceededError, CircuitOpenError, RateLimitTimeoutError

log = logging.getLogger("shoal")

MINUTE = 60.0
SLOT_LEASE = 60.0           # a call's concurrency slot, renewed every third of it while it runs
POLL = 0.25                 # how often a waiter looks again for room freed by another instance


@dataclass(frozen=True)
class Breaker:
    """Open the provider's circuit for every replica after ``failures`` failed calls within
    ``window`` seconds; after ``cooldown`` seconds one trial call goes (half-open): its success
    closes the circuit, its failure opens it again."""

    failures: int = 5
    window: float = 60.0
    cooldown: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.failures, int) or self.failures < 1:
            raise ValueError(f"Breaker(failures) must be an int >= 1, not {self.failures!r}.")
        for name in ("window", "cooldown"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"Breaker({name}) must be a positive number of seconds, not "
                                 f"{value!r}.")


@dataclass(frozen=True)
class Budgets:
    """Spending limits in ``currency``: per run, per root run (its whole tree), per tenant per
    UTC day (``tenants`` overrides ``per_tenant_day`` for named tenants)."""

    per_run: float | None = None
    per_root: float | None = None
    per_tenant_day: float | None = None
    currency: str = "usd"
    tenants: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Spender:
    """Whose money a call spends: the run it is made for (if any) and its tenant."""

    tenant: str
    run_id: str | None = None
    root_id: str | None = None


def utc_day(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).date().isoformat()


class Ledger:
    """The budgets of one app, over its rate store."""

    def __init__(self, rates: Callable[[], RateStore], clock: Clock, namespace: str) -> None:
        self._rates = rates
        self.clock = clock
        self.namespace = namespace
        self.budgets: dict[str, Budgets] = {}      # currency -> budgets

    def _scopes(self, who: Spender, currency: str, now: float
                ) -> list[tuple[str, float | None, str]]:
        """(counter key, limit, what to call it) for each budget that applies."""
        b = self.budgets.get(currency, Budgets(currency=currency))
        scopes: list[tuple[str, float | None, str]] = []
        if who.run_id is not None:
            scopes.append((f"spend:run:{who.run_id}:{currency}", b.per_run,
                           f"the per-run budget of run {who.run_id}"))
        if who.root_id is not None:
            scopes.append((f"spend:root:{who.root_id}:{currency}", b.per_root,
                           f"the per-root budget of run tree {who.root_id}"))
        day = utc_day(now)
        scopes.append((f"spend:tenant:{who.tenant}:{day}:{currency}",
                       b.tenants.get(who.tenant, b.per_tenant_day),
                       f"the daily budget of tenant {who.tenant!r} ({day} UTC)"))
        return scopes

    async def reserve(self, who: Spender, amount: float, currency: str) -> None:
        """Count ``amount`` under every budget that applies, or raise BudgetExceededError
        (nothing counted) if one would pass its limit."""
        now = self.clock.now()
        scopes = self._scopes(who, currency, now)
        result = await self._rates().counter_add(
            self.namespace, [k for k, _, _ in scopes], [amount] * len(scopes),
            [limit for _, limit, _ in scopes], now)
        if not result.added:
            assert result.over is not None
            _, limit, name = scopes[result.over]
            assert limit is not None
            raise BudgetExceededError(name, result.totals[result.over], limit, amount, currency)

    async def record(self, who: Spender, amount: float, currency: str,
                     reserved: float = 0.0) -> None:
        """Record ``amount`` actually spent (in the ledger and every budget), replacing a
        reservation of ``reserved``. Never refused: the money is spent."""
        now = self.clock.now()
        scopes = self._scopes(who, currency, now)
        entry = SpendEntry(who.tenant, who.run_id, who.root_id, amount, currency, now)
        await self._rates().counter_add(
            self.namespace, [k for k, _, _ in scopes], [amount - reserved] * len(scopes),
            [None] * len(scopes), now, entry if amount else None)

    async def spent(self, who: Spender, currency: str) -> dict[str, float]:
        now = self.clock.now()
        scopes = self._scopes(who, currency, now)
        result = await self._rates().counter_add(
            self.namespace, [k for k, _, _ in scopes], [0.0] * len(scopes),
            [None] * len(scopes), now)
        return {name: total for (_, _, name), total in zip(scopes, result.totals, strict=True)}


class _RoundRobin:
    """One acquirer at a time per provider in this instance, given in turn to the tenant served
    least recently (a tenant that just arrived goes before one that was just served)."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}
        self._served: dict[str, int] = {}      # tenant -> when it was last given the turn
        self._turns = 0
        self._busy = False

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str) -> AsyncIterator[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(tenant, deque()).append(future)
        self._next()
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self._busy = False      # granted, then cancelled before it could be used
            else:
                queue = self._queues.get(tenant)
                if queue is not None and future in queue:
                    queue.remove(future)
                    if not queue:
                        del self._queues[tenant]
            self._next()
            raise
        try:
            yield
        finally:
            self._busy = False
            self._next()

    def _next(self) -> None:
        if self._busy:
            return
        while self._queues:
            # dicts keep arrival order: among tenants never served, the first to arrive
            tenant = min(self._queues, key=lambda t: self._served.get(t, -1))
            queue = self._queues[tenant]
            future = queue.popleft()
            if not queue:
                del self._queues[tenant]
            if future.done():
                continue
            self._turns += 1
            self._served[tenant] = self._turns
            if len(self._served) > 10_000:   # forget tenants that are not waiting
                self._served = {t: n for t, n in self._served.items() if t in self._queues}
            self._busy = True
            future.set_result(None)
            return


class Provider:
    """A model provider's limits, shared by every replica of the app."""

    def __init__(self, *, name: str, rates: Callable[[], RateStore], clock: Clock,
                 namespace: str, instance_id: str, ledger: Ledger, max_concurrent: int | None,
                 requests_per_minute: int | None, tokens_per_minute: int | None,
                 breaker: Breaker | None, price_per_token: float | None, currency: str) -> None:
        self.name = name
        self._rates = rates
        self.clock = clock
        self.namespace = namespace
        self.instance_id = instance_id
        self.ledger = ledger
        self.max_concurrent = max_concurrent
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self.breaker = breaker
        self.price_per_token = price_per_token
        self.currency = currency
        self._turns = _RoundRobin()
        self._freed = asyncio.Event()
        k = f"provider:{name}"
        self.keys = {"slots": f"{k}:slots", "requests": f"{k}:requests",
                     "tokens": f"{k}:tokens", "cooldown": f"{k}:cooldown",
                     "failures": f"{k}:failures", "open": f"{k}:circuit-open",
                     "trial": f"{k}:circuit-trial"}

    def __repr__(self) -> str:
        return f"<shoal.Provider {self.name!r}>"

    def call(self, tokens: int = 0, *, tenant: str | None = None, timeout: float | None = None,
             cost: float | None = None) -> ProviderCall:
        """``async with provider.call(tokens=…) as call``: wait until this call may go (up to
        ``timeout`` seconds, else RateLimitTimeoutError), then make it. ``tokens`` is the
        estimate counted against tokens_per_minute (correct it with ``call.used``); ``cost``
        the estimated cost reserved under the budgets (default: tokens * price_per_token).
        The tenant defaults to the current run's. Raises CircuitOpenError at once while the
        breaker is open, BudgetExceededError when a budget has no room for the estimate."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(f"provider.call(tokens=…) takes an int >= 0, not {tokens!r}.")
        if self.tokens_per_minute is not None and tokens > self.tokens_per_minute:
            raise ValueError(
                f"A call estimated at {tokens} tokens can never fit {self.name!r}'s "
                f"tokens_per_minute={self.tokens_per_minute}: split it or raise the limit.")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise ValueError(f"timeout must be None or a number of seconds >= 0, not "
                             f"{timeout!r}.")
        return ProviderCall(self, tokens, tenant, timeout, cost)

    async def open_until(self) -> float | None:
        """When the breaker closes again (half-opens), if it is open now."""
        if self.breaker is None:
            return None
        return await self._rates().paused_until(self.namespace, self.keys["open"],
                                                self.clock.now())

    async def cooldown_until(self) -> float | None:
        """When the pause after a 429 ends, if the provider is paused now."""
        return await self._rates().paused_until(self.namespace, self.keys["cooldown"],
                                                self.clock.now())

    # -- what a call does -----------------------------------------------------------------

    async def _wait(self, until: float, deadline: float | None, why: str,
                    freed: bool = False) -> None:
        now = self.clock.now()
        if deadline is not None and until > deadline:
            if deadline > now:
                await self.clock.sleep(deadline - now)
            raise RateLimitTimeoutError(self.name, why)
        if freed:   # a call of this instance ending may free room before ``until``
            self._freed.clear()
            await first_of(self._freed.wait(), self.clock, until - now)
        else:
            await self.clock.sleep(max(0.0, until - now))

    async def _admit(self, holder: str, tokens: int, deadline: float | None) -> bool:
        """Wait until the call may go and take what it needs; True if it is a breaker trial."""
        rates, ns, k = self._rates(), self.namespace, self.keys
        while True:
            now = self.clock.now()
            trial = False
            if self.breaker is not None:
                until = await rates.paused_until(ns, k["open"], now)
                if until is not None:
                    raise CircuitOpenError(self.name, until)
                failures = await rates.window_add(ns, k["failures"], 0, self.breaker.window,
                                                  None, now)
                if failures.total >= self.breaker.failures:   # half-open: one trial at a time
                    got = await rates.slot_acquire(ns, k["trial"], holder, 1, SLOT_LEASE, now)
                    if not isinstance(got, SlotGrant):
                        raise CircuitOpenError(self.name, None)
                    trial = True
            cooldown = await rates.paused_until(ns, k["cooldown"], now)
            if cooldown is not None:
                await self._release_trial(trial, holder)
                await self._wait(cooldown, deadline, "the pause after a 429")
                continue
            if self.max_concurrent is not None:
                slot = await rates.slot_acquire(ns, k["slots"], holder, self.max_concurrent,
                                                SLOT_LEASE, now)
                if not isinstance(slot, SlotGrant):
                    await self._release_trial(trial, holder)
                    await self._wait(min(slot.retry_at, now + POLL), deadline,
                                     f"max_concurrent={self.max_concurrent}", freed=True)
                    continue
            if self.requests_per_minute is not None:
                added = await rates.window_add(ns, k["requests"], 1, MINUTE,
                                               self.requests_per_minute, now)
                if not added.added:
                    await self._give_back(holder, trial)
                    await self._wait(added.retry_at or now + POLL, deadline,
                                     f"requests_per_minute={self.requests_per_minute}")
                    continue
            if self.tokens_per_minute is not None and tokens:
                added = await rates.window_add(ns, k["tokens"], tokens, MINUTE,
                                               self.tokens_per_minute, now)
                if not added.added:
                    if self.requests_per_minute is not None:
                        await rates.window_add(ns, k["requests"], -1, MINUTE, None, now)
                    await self._give_back(holder, trial)
                    await self._wait(added.retry_at or now + POLL, deadline,
                                     f"tokens_per_minute={self.tokens_per_minute}")
                    continue
            return trial

    async def _release_trial(self, trial: bool, holder: str) -> None:
        if trial:
            await self._rates().slot_release(self.namespace, self.keys["trial"], holder)

    async def _give_back(self, holder: str, trial: bool) -> None:
        if self.max_concurrent is not None:
            await self._rates().slot_release(self.namespace, self.keys["slots"], holder)
        await self._release_trial(trial, holder)

    async def _renew(self, holder: str) -> None:
        while True:
            await self.clock.sleep(SLOT_LEASE / 3)
            try:
                await self._rates().slot_renew(self.namespace, self.keys["slots"], holder,
                                               SLOT_LEASE, self.clock.now())
            except Exception as e:
                log.warning("provider.renew_failed: %s: %s: %s", self.name, type(e).__name__, e,
                            extra={"event": "provider.renew_failed"})

    async def _failed(self, trial: bool) -> None:
        if self.breaker is None:
            return
        rates, ns, k, now = self._rates(), self.namespace, self.keys, self.clock.now()
        failures = await rates.window_add(ns, k["failures"], 1, self.breaker.window, None, now)
        if trial or failures.total >= self.breaker.failures:
            until = await rates.pause_until(ns, k["open"], now + self.breaker.cooldown)
            log.warning("provider.circuit_open: %s after %g failures in %g s; until %s",
                        self.name, failures.total, self.breaker.window, until,
                        extra={"event": "provider.circuit_open"})

    async def _succeeded(self, trial: bool) -> None:
        if trial and self.breaker is not None:
            await self._rates().window_clear(self.namespace, self.keys["failures"])
            log.info("provider.circuit_closed: %s", self.name,
                     extra={"event": "provider.circuit_closed"})


class ProviderCall:
    """One call through a provider: ``async with provider.call(…) as call``."""

    def __init__(self, provider: Provider, tokens: int, tenant: str | None,
                 timeout: float | None, cost: float | None) -> None:
        self.provider = provider
        self.tokens = tokens
        self._tenant = tenant
        self._timeout = timeout
        self._estimate = cost if cost is not None else (
            tokens * provider.price_per_token if provider.price_per_token else 0.0)
        self._used_tokens: int | None = None
        self._used_cost: float | None = None
        self._retry_after: float | None = None
        self._holder = f"{provider.instance_id}/{secrets.token_hex(6)}"
        self._trial = False
        self._renewal: asyncio.Task[None] | None = None
        self._entered = False
        self.spender: Spender | None = None

    def used(self, tokens: int | None = None, cost: float | None = None) -> None:
        """What the call really used: corrects the token estimate in the per-minute window and
        the cost recorded against the budgets (default: tokens * price_per_token)."""
        if tokens is not None:
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
                raise ValueError(f"call.used(tokens=…) takes an int >= 0, not {tokens!r}.")
            self._used_tokens = tokens
        if cost is not None:
            if not isinstance(cost, (int, float)) or cost < 0:
                raise ValueError(f"call.used(cost=…) takes a number >= 0, not {cost!r}.")
            self._used_cost = float(cost)

    def rate_limited(self, retry_after: float | None = None) -> None:
        """The provider answered 429: pause it for every replica for ``retry_after`` seconds
        (default 1 s) from the end of this call. A 429 is not a breaker failure."""
        if retry_after is not None and (not isinstance(retry_after, (int, float))
                                        or retry_after < 0):
            raise ValueError(f"retry_after is a number of seconds >= 0, not {retry_after!r}.")
        self._retry_after = float(retry_after) if retry_after is not None else 1.0

    async def __aenter__(self) -> ProviderCall:
        if self._entered:
            raise RuntimeError("This provider.call(…) was already entered; make a new one.")
        self._entered = True
        p = self.provider
        from shoal.engine.context import current_context
        ctx = current_context.get()
        tenant = self._tenant or (ctx.tenant if ctx is not None else "default")
        self.spender = Spender(tenant, ctx.run_id if ctx is not None else None,
                               ctx.root_id if ctx is not None else None)
        deadline = None if self._timeout is None else p.clock.now() + self._timeout
        await p.ledger.reserve(self.spender, self._estimate, p.currency)
        try:
            async with p._turns.turn(tenant):
                self._trial = await p._admit(self._holder, self.tokens, deadline)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(p.ledger.record(self.spender, 0.0, p.currency,
                                                     reserved=self._estimate))
            raise
        if p.max_concurrent is not None:
            self._renewal = asyncio.create_task(p._renew(self._holder))
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        tb: object) -> None:
        p = self.provider
        rates, ns, k = p._rates(), p.namespace, p.keys
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(BaseException):
                await self._renewal
        try:
            if p.max_concurrent is not None:
                await rates.slot_release(ns, k["slots"], self._holder)
                p._freed.set()
            now = p.clock.now()
            if self._retry_after is not None:
                until = await rates.pause_until(ns, k["cooldown"], now + self._retry_after)
                log.warning("provider.rate_limited: %s paused until %s for every replica",
                            p.name, until, extra={"event": "provider.rate_limited"})
            if (self._used_tokens is not None and p.tokens_per_minute is not None
                    and self._used_tokens != self.tokens):
                await rates.window_add(ns, k["tokens"], self._used_tokens - self.tokens, MINUTE,
                                       None, now)
            cost = self._used_cost
            if cost is None:
                cost = (self._used_tokens * p.price_per_token
                        if self._used_tokens is not None and p.price_per_token else
                        self._estimate)
            assert self.spender is not None
            await p.ledger.record(self.spender, cost, p.currency, reserved=self._estimate)
            if error is not None and not isinstance(error, (asyncio.CancelledError,
                                                            BudgetExceededError)):
                await p._failed(self._trial)
            elif error is None and self._retry_after is None:
                await p._succeeded(self._trial)
            elif self._retry_after is not None and self._trial:
                pass   # a 429 says nothing about an outage: the next call is the trial
        finally:
            await p._release_trial(self._trial, self._holder)


def check_provider_options(name: str, max_concurrent: Any, requests_per_minute: Any,
                           tokens_per_minute: Any, breaker: Any, price_per_token: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"app.provider(name): a non-empty str, not {name!r}.")
    for option, value in (("max_concurrent", max_concurrent),
                          ("requests_per_minute", requests_per_minute),
                          ("tokens_per_minute", tokens_per_minute)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"app.provider({name!r}, {option}=…) takes None or an int >= 1, "
                             f"not {value!r}.")
    if breaker is not None and not isinstance(breaker, Breaker):
        raise ValueError(f"app.provider({name!r}, breaker=…) takes a shoal.Breaker, not "
                         f"{breaker!r}.")
    if price_per_token is not None and (not isinstance(price_per_token, (int, float))
                                        or price_per_token < 0):
        raise ValueError(f"app.provider({name!r}, price_per_token=…) takes a number >= 0, not "
                         f"{price_per_token!r}.")
