"""Model-provider limits, circuit breakers and cost budgets shared by every replica.

``app.provider(name, …)`` returns a :class:`Provider`; ``async with provider.call(tokens=…)``
waits until the call may go: the provider's cooldown after a 429 has passed, its breaker is not
open, a concurrency slot is free and the per-minute windows (requests, tokens) have room — all
kept in the coordination store, so every replica counts the same calls. Each attempt to go is
one atomic store operation (``RateStore.admit``), whatever the number of limits: it takes every
slot and counts every window, or takes nothing and says which limit refused. Optional per-tenant
caps (``tenant_max_concurrent``, ``tenant_requests_per_minute``, ``tenant_tokens_per_minute``)
are kept the same way under keys that carry the tenant (``provider:{name}:tenant:{T}:…``), on
top of the provider-wide limits. Within one instance, callers waiting for the same provider are
served round robin by tenant (a tenant waiting for its own cap steps out of the turns meanwhile);
between instances, a freed slot or window room goes to whichever instance asks first.

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
import math
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shoal import _checks
from shoal._tasks import first_of
from shoal.clock import DRIFT_MARGIN, Clock
from shoal.errors import (
    BudgetExceededError,
    CircuitOpenError,
    RateLimitTimeoutError,
    StoreUnavailableError,
)
from shoal.ports import RateStore
from shoal.scope import current_run
from shoal.telemetry import NOTHING, Telemetry
from shoal.types import Admitted, CircuitNeed, Need, PauseNeed, SlotNeed, SpendEntry, WindowNeed

log = logging.getLogger("shoal")
T = TypeVar("T")

MINUTE = 60.0
SLOT_LEASE = 60.0           # a call's concurrency slot, renewed every third of it while it runs
POLL = 0.25                 # how often a waiter looks again for room freed by another instance
NO_ANSWER = "an answer from the coordination store"   # what a call waited for when it did not
ANSWER_GRACE = 1.0          # the least time a question to the store is given, even past a timeout


@dataclass(frozen=True)
class Breaker:
    """Open the provider's circuit for every replica after ``failures`` failed calls within
    ``window`` seconds; after ``cooldown`` seconds it is half-open until a trial call succeeds:
    one trial at a time (across replicas) goes, the other calls fail fast; the trial's success
    closes the circuit, its failure opens it for another ``cooldown``. Once open, the circuit
    never closes by itself (whatever ``window`` is): only a successful trial closes it."""

    failures: int = 5
    window: float = 60.0
    cooldown: float = 30.0

    def __post_init__(self) -> None:
        _checks.integer(self.failures, "Breaker(failures)", _checks.VALUE, low=1)
        for name in ("window", "cooldown"):
            _checks.seconds(getattr(self, name), f"Breaker({name})", _checks.VALUE, above=True)


@dataclass(frozen=True)
class Aimd:
    """Adapt the provider's concurrency to its 429s, for every replica: a 429 multiplies the
    limit of calls in flight by ``decrease`` (once per round of calls: the 429s of calls that
    went before the limit was last lowered lower it no further), never below ``min_concurrent``;
    each call that succeeds adds ``increase / limit`` back, so the limit grows by ``increase``
    for every ``limit`` calls that succeed, up to ``max_concurrent``."""

    decrease: float = 0.5
    increase: float = 1.0
    min_concurrent: int = 1

    def __post_init__(self) -> None:
        if (isinstance(self.decrease, bool) or not isinstance(self.decrease, (int, float))
                or not 0 < self.decrease < 1):
            raise ValueError(f"Aimd(decrease=…) takes a number between 0 and 1 (exclusive), "
                             f"not {self.decrease!r}.")
        if not _amount(self.increase) or self.increase == 0:
            raise ValueError(f"Aimd(increase=…) takes a finite number > 0, not "
                             f"{self.increase!r}.")
        _checks.integer(self.min_concurrent, "Aimd(min_concurrent)", _checks.VALUE, low=1)


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


Scope = tuple[str, float | None, str]    # a budget's counter key, its limit, what to call it


def utc_day(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).date().isoformat()


class Ledger:
    """The budgets of one app, over its rate store."""

    def __init__(self, rates: Callable[[], RateStore], clock: Clock, namespace: str) -> None:
        self._rates = rates
        self.clock = clock
        self.namespace = namespace
        self.budgets: dict[str, Budgets] = {}      # currency -> budgets
        self.telemetry: Telemetry = NOTHING        # the app's, set by app.instrument

    def _scopes(self, who: Spender, currency: str, now: float) -> list[Scope]:
        """(counter key, limit, what to call it) for each budget that applies."""
        b = self.budgets.get(currency, Budgets(currency=currency))
        scopes: list[Scope] = []
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

    async def reserve(self, who: Spender, amount: float, currency: str) -> list[Scope]:
        """Count ``amount`` under every budget that applies, or raise BudgetExceededError
        (nothing counted) if one would pass its limit — or, for an amount of 0, if one is
        already at or over its limit (a call estimated at nothing still spends). Returns the
        budgets counted, to pass to :meth:`record` (so a call that ends on the next UTC day
        corrects the day it was counted under)."""
        now = self.clock.now()
        scopes = self._scopes(who, currency, now)
        if amount == 0 and all(limit is None for _, limit, _ in scopes):
            return scopes            # nothing to count and nothing to check: no round trip
        result = await self._rates().counter_add(
            self.namespace, [k for k, _, _ in scopes], [amount] * len(scopes),
            [limit for _, limit, _ in scopes], now)
        over = result.over
        if result.added and amount <= 0:
            over = next((i for i, (_, limit, _) in enumerate(scopes)
                         if limit is not None and result.totals[i] >= limit), None)
        if not result.added or over is not None:
            assert over is not None
            _, limit, name = scopes[over]
            assert limit is not None
            raise BudgetExceededError(name, result.totals[over], limit, amount, currency)
        return scopes

    async def record(self, who: Spender, amount: float, currency: str,
                     reserved: float = 0.0, scopes: list[Scope] | None = None,
                     provider: str | None = None, tokens: int | None = None) -> None:
        """Record ``amount`` actually spent (in the ledger and every budget), replacing a
        reservation of ``reserved`` made under ``scopes`` (what :meth:`reserve` returned;
        default: the budgets that apply now). Never refused: the money is spent. ``provider``
        and ``tokens`` go into the ledger's row: what a provider call spent on."""
        now = self.clock.now()
        if scopes is None:
            scopes = self._scopes(who, currency, now)
        if amount == 0 and reserved == 0:
            return                   # nothing spent, nothing reserved: nothing to write
        entry = SpendEntry(who.tenant, who.run_id, who.root_id, amount, currency, now,
                           provider=provider, tokens=tokens)
        await self._rates().counter_add(
            self.namespace, [k for k, _, _ in scopes], [amount - reserved] * len(scopes),
            [None] * len(scopes), now, entry if amount else None)
        if amount:
            self.telemetry.spent(who.tenant, amount, currency)

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

    @property
    def busy(self) -> bool:
        """Whether a caller asking now would have to wait for its turn."""
        return self._busy or bool(self._queues)

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str, clock: Clock, deadline: float | None,
                   timed_out: Callable[[], BaseException]) -> AsyncIterator[None]:
        """Hold the turn; raise ``timed_out()`` if it has not come by ``deadline``."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(tenant, deque()).append(future)
        self._next()
        try:
            if deadline is None:
                await future
            elif not future.done() and not await first_of(future, clock,
                                                          deadline - clock.now()):
                raise timed_out()
        except BaseException:
            if future.done() and not future.cancelled():
                self._busy = False      # granted, then cancelled before it could be used
            else:
                future.cancel()
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


@dataclass
class _Taken:
    """What one call holds in the store, so that every way out gives all of it back.

    A slot is marked before it is asked for: a store error or a cancel while asking may leave it
    granted, and releasing a slot one does not hold changes nothing. A window entry is marked
    only once the store has answered that it was added: taking back one that was never added
    would let the window admit more than its limit (one that was added and is not taken back only
    counts a call too many for a minute)."""

    tenant: str = "default"             # whose call it is (the per-tenant keys carry it)
    trial: bool = False                 # the breaker's trial slot
    generation: float = 0.0             # the opening of the circuit the trial is for
    slot: bool = False                  # a concurrency slot
    request_at: float | None = None     # when the call's entry in the requests window was added
    tokens_at: float | None = None      # when its token estimate was added to the tokens window
    tenant_slot: bool = False           # a slot under the tenant's own concurrency cap
    tenant_request_at: float | None = None  # its entry in the tenant's requests window
    tenant_tokens_at: float | None = None   # its estimate in the tenant's tokens window
    aimd: tuple[int, float, float] | None = None   # AIMD as the call went: (limit, cut, lowered)
    # when the leases of the slots it holds end, as far as this instance knows: the time the
    # admission or the last renewal confirmed for all of them was sent, plus SLOT_LEASE
    held_until: float = 0.0


@dataclass(frozen=True)
class _Capped:
    """Admission found the call's tenant at its own cap (everything taken was given back): the
    caller leaves the turn and looks again at ``until`` (earlier if ``freed`` and a call of this
    instance frees a slot), within its deadline."""

    until: float
    why: str
    freed: bool = False


async def _shielded(work: Awaitable[None]) -> None:
    """Run ``work`` to its end even if the caller is cancelled meanwhile (the cancel is passed
    on once the work has ended, or at once on a second cancel: the work still ends)."""
    task = asyncio.ensure_future(work)
    _running.add(task)
    task.add_done_callback(_running.discard)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            await asyncio.wait([task])
        raise


_running: set[asyncio.Future[None]] = set()     # shielded work a cancelled caller left running


def _refusal(error: BaseException) -> str:
    """Why a call did not go, as telemetry names it (see ``Telemetry.provider_call_ended``)."""
    if isinstance(error, CircuitOpenError):
        return "circuit_open"
    if isinstance(error, BudgetExceededError):
        return "refused"
    if isinstance(error, RateLimitTimeoutError) and error.limit != NO_ANSWER:
        return "timed_out"
    if not isinstance(error, Exception):
        return "cancelled"
    return "store_failed"


def _store_failed(error: BaseException) -> bool:
    """Whether admission ended because the store failed or did not answer (not because a limit,
    the breaker or a budget said no, nor a cancel): asking it to give back would fail alike."""
    if isinstance(error, RateLimitTimeoutError):
        return error.limit == NO_ANSWER
    return isinstance(error, Exception) and not isinstance(
        error, (CircuitOpenError, BudgetExceededError))


@dataclass(frozen=True)
class ProviderState:
    """A provider as every replica's calls left it at ``at`` (:meth:`Provider.state`).

    ``in_flight``: calls holding one of its ``max_concurrent`` slots (counted only while that
    limit is set: without it a call takes no slot); ``requests_last_minute`` and
    ``tokens_last_minute``: what its windows counted over the last minute (only while the
    matching limit is set); ``paused_until``: the end of the pause after a 429, if in force;
    ``breaker``: None without a breaker, else ``closed``, ``open`` (until ``open_until``) or
    ``half-open`` (the cooldown is over: one trial call may go; ``trial_in_flight`` while it
    runs); ``failures_in_window``: failed calls counted in the breaker's window;
    ``concurrency_limit``: the calls in flight admitted now, ``max_concurrent`` lowered by AIMD
    after 429s (None without ``max_concurrent``)."""

    at: float
    in_flight: int
    requests_last_minute: float
    tokens_last_minute: float
    paused_until: float | None
    breaker: str | None
    open_until: float | None
    trial_in_flight: bool
    failures_in_window: float | None
    concurrency_limit: int | None = None


class Provider:
    """A model provider's limits, shared by every replica of the app.

    The circuit breaker's state is kept in the store, so that every replica sees the same:

    - two counters, ``circuit-opened`` and ``circuit-reclosed``, count the openings of the
      circuit and the trials that closed it (``closed <= opened <= closed + 1`` always holds).
      The circuit is *closed* while they are equal, and *tripped* while ``opened = closed + 1``.
      Every operation on either writes both at one time, and retention deletes idle counters
      oldest first, then in key order: of a pair cut by a batch, ``…-opened`` goes first, so a
      provider idle past ``run_retention`` never looks tripped (its name sorts first for that);
    - a pause, ``circuit-open``, is the cooldown after an opening or a failed trial;
    - a slot with one place, ``circuit-trial``, is the trial call in flight (renewed while it
      runs, freed by itself if its holder dies).

    States and transitions:

    - closed: calls go; failed calls are counted in the ``failures`` window. One that brings it
      to ``failures`` opens the circuit: the pause first (so no replica sees the circuit tripped
      without its cooldown), then ``opened`` + 1 under the limit ``closed + 1`` (replicas
      opening at once count one opening);
    - open (tripped, paused): every call raises CircuitOpenError(until);
    - half-open (tripped, pause over): the call that takes the trial slot goes (the pause, the
      counters and the trial slot are looked at in the call's one atomic admission: a trial that
      failed paused the circuit before it freed the slot); the others raise
      CircuitOpenError(None). The failures window plays no part: the circuit stays half-open,
      however long the trial takes, until a trial succeeds;
    - a trial that fails pauses the circuit again for ``cooldown`` (counters unchanged: open);
    - a trial that succeeds, if the opening it was a trial for is still the current one, clears
      the failures window, then adds 1 to ``closed`` under the limit of that opening (a trial
      left over from an earlier opening, whose slot was lost, cannot close a later one):
      closed.

    A call that answered 429, was cancelled, or went over a budget says nothing about an outage:
    it is neither a failure nor a success (a trial among them frees the slot for the next call).
    """

    def __init__(self, *, name: str, rates: Callable[[], RateStore], clock: Clock,
                 namespace: str, instance_id: str, ledger: Ledger, max_concurrent: int | None,
                 requests_per_minute: int | None, tokens_per_minute: int | None,
                 breaker: Breaker | None, price_per_token: float | None, currency: str,
                 tenant_max_concurrent: int | None = None,
                 tenant_requests_per_minute: int | None = None,
                 tenant_tokens_per_minute: int | None = None,
                 aimd: Aimd | None = None) -> None:
        self.name = name
        self._rates = rates
        self.clock = clock
        self.namespace = namespace
        self.instance_id = instance_id
        self.ledger = ledger
        self.max_concurrent = max_concurrent
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self.tenant_max_concurrent = tenant_max_concurrent
        self.tenant_requests_per_minute = tenant_requests_per_minute
        self.tenant_tokens_per_minute = tenant_tokens_per_minute
        self.breaker = breaker
        self.aimd = aimd
        self.price_per_token = price_per_token
        self.currency = currency
        self.telemetry: Telemetry = NOTHING       # the app's, set by app.instrument
        k = f"provider:{name}"
        self.keys = {"slots": f"{k}:slots", "requests": f"{k}:requests",
                     "tokens": f"{k}:tokens", "cooldown": f"{k}:cooldown",
                     "failures": f"{k}:failures", "open": f"{k}:circuit-open",
                     "trial": f"{k}:circuit-trial", "opened": f"{k}:circuit-opened",
                     "closed": f"{k}:circuit-reclosed", "cut": f"{k}:aimd-cut",
                     "lowered": f"{k}:aimd-lowered"}
        self._limits = ProviderLimits(self, rates)

    def tenant_keys(self, tenant: str) -> dict[str, str]:
        """The store keys of ``tenant``'s own caps on this provider."""
        k = f"provider:{self.name}:tenant:{tenant}"
        return {"slots": f"{k}:slots", "requests": f"{k}:requests", "tokens": f"{k}:tokens"}

    def __repr__(self) -> str:
        return f"<shoal.Provider {self.name!r}>"

    def call(self, tokens: int = 0, *, tenant: str | None = None, timeout: float | None = None,
             cost: float | None = None) -> ProviderCall:
        """``async with provider.call(tokens=…) as call``: wait until this call may go (up to
        ``timeout`` seconds, else RateLimitTimeoutError, also when the store has not answered
        by then), then make it. ``tokens`` is the
        estimate counted against tokens_per_minute (correct it with ``call.used``); ``cost``
        the estimated cost reserved under the budgets (default: tokens * price_per_token).
        The tenant defaults to the current run's. Raises CircuitOpenError at once while the
        breaker is open, BudgetExceededError when a budget has no room for the estimate."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(f"provider.call(tokens=…) takes an int >= 0, not {tokens!r}.")
        for option, limit in (("tokens_per_minute", self.tokens_per_minute),
                              ("tenant_tokens_per_minute", self.tenant_tokens_per_minute)):
            if limit is not None and tokens > limit:
                raise ValueError(
                    f"A call estimated at {tokens} tokens can never fit {self.name!r}'s "
                    f"{option}={limit}: split it or raise the limit.")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, (int, float))
                                    or math.isnan(timeout) or timeout < 0):
            raise ValueError(f"timeout must be None or a number of seconds >= 0, not "
                             f"{timeout!r}.")
        if cost is not None and not _amount(cost):
            raise ValueError(f"provider.call(cost=…) takes a finite number >= 0, not {cost!r}.")
        return ProviderCall(self, self._limits, tokens, tenant, timeout, cost)

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

    async def state(self) -> ProviderState:
        """What every replica's calls hold and have used now, read from the store without
        writing anything (one :meth:`~shoal.ports.RateStore.read_rates`): a console's view."""
        k, now = self.keys, self.clock.now()
        windows = [(k["requests"], MINUTE), (k["tokens"], MINUTE)]
        if self.breaker is not None:
            windows.append((k["failures"], self.breaker.window))
        got = await self._rates().read_rates(
            self.namespace, now, slots=[k["slots"], k["trial"]], windows=windows,
            pauses=[k["cooldown"], k["open"]],
            counters=[k["opened"], k["closed"], *((k["cut"],) if self.aimd else ())])
        breaker: str | None = None
        if self.breaker is not None:
            tripped = got.counters[k["opened"]] > got.counters[k["closed"]]
            breaker = ("closed" if not tripped else "open" if got.pauses[k["open"]] is not None
                       else "half-open")
        return ProviderState(
            at=now, in_flight=got.slots[k["slots"]],
            requests_last_minute=got.windows[k["requests"]],
            tokens_last_minute=got.windows[k["tokens"]],
            paused_until=got.pauses[k["cooldown"]], breaker=breaker,
            open_until=got.pauses[k["open"]] if self.breaker is not None else None,
            trial_in_flight=got.slots[k["trial"]] > 0,
            failures_in_window=(got.windows[k["failures"]] if self.breaker is not None
                                else None),
            concurrency_limit=(self._limits.limit(got.counters[k["cut"]]) if self.aimd is not None
                               else self.max_concurrent))


class ProviderLimits:
    """What the calls of one provider share in this instance, and the operations a call is made
    of (:class:`ProviderCall` is their only user): the coordination store's rates, the turns
    between waiting callers, the wake-up when a call frees a slot, admission, renewal, giving
    back, the breaker's and AIMD's accounting. The provider's limits are read from
    ``provider``."""

    def __init__(self, provider: Provider, rates: Callable[[], RateStore]) -> None:
        self.provider = provider
        self.rates = rates
        self.turns = _RoundRobin()
        self.freed = asyncio.Event()              # a call of this instance freed a slot
        self.waiting_for: str | None = None       # what the call holding the turn waits for

    def fields(self, event: str) -> dict[str, Any]:
        """``extra=`` of a record about this provider."""
        return {"event": event, "instance": self.provider.instance_id}

    # -- what a call does -----------------------------------------------------------------

    async def wait(self, until: float, deadline: float | None, why: str,
                   freed: bool = False, turn: bool = True) -> None:
        """Wait until ``until`` (or a freed slot, with ``freed``), or raise RateLimitTimeoutError
        at ``deadline`` if ``until`` is later. ``turn``: the caller holds the turn (callers behind
        it that time out say they waited for ``why``)."""
        p = self.provider
        now = p.clock.now()
        if turn:
            self.waiting_for = why
        if deadline is not None and until > deadline:
            if deadline > now:
                await p.clock.sleep(deadline - now)
            raise RateLimitTimeoutError(p.name, why)
        if freed:   # a call of this instance ending may free room before ``until``
            self.freed.clear()
            await first_of(self.freed.wait(), p.clock, until - now)
        else:
            await p.clock.sleep(max(0.0, until - now))

    def turn_timed_out(self) -> RateLimitTimeoutError:
        """A caller whose timeout passed while calls of this instance went first: it waited
        for what the call holding the turn waits for."""
        p = self.provider
        return RateLimitTimeoutError(
            p.name, self.waiting_for or "its turn behind this instance's other calls")

    async def answer(self, work: Awaitable[T], deadline: float | None) -> T:
        """What the store answers ``work`` (one store call), or RateLimitTimeoutError (waiting
        for :data:`NO_ANSWER`) once ``deadline`` has passed without an answer: a store that never
        answers cannot hold a call past its timeout. A question asked with less than
        :data:`ANSWER_GRACE` left is given that long (``timeout=0`` asks once, and a network
        store takes a moment to answer). The call is cancelled then; what it may have taken is
        given back as after any other timeout (see :class:`_Taken`)."""
        p = self.provider
        if deadline is None:
            return await work
        task = asyncio.ensure_future(work)
        left = max(deadline - p.clock.now(), ANSWER_GRACE)
        if not await first_of(task, p.clock, left):
            raise RateLimitTimeoutError(p.name, NO_ANSWER)
        return task.result()

    async def circuit(self, now: float) -> tuple[float, float]:
        """The circuit's counters: (openings, closings); tripped while the first is larger."""
        p = self.provider
        got = await self.rates().counter_add(
            p.namespace, [p.keys["opened"], p.keys["closed"]], [0.0, 0.0],
            [None, None], now)
        return got.totals[0], got.totals[1]

    def needs(self, tenant: str, tokens: int,
              limit: int | None = None) -> list[tuple[Need, str, bool]]:
        """What a call of ``tenant`` estimated at ``tokens`` needs from the store, in the order
        admission looks at it: ``(need, the limit it is for, whether it is the tenant's own
        cap)``. The breaker first; each tenant cap before the matching provider-wide limit, so a
        capped tenant is refused as such (and never counted against the provider's limits); the
        429 pause after the slot (a call that got a 429 pauses the provider before it frees its
        slot: the call that takes that slot sees the pause). ``limit``: the concurrency limit
        AIMD lowered ``max_concurrent`` to."""
        p = self.provider
        k, tk = p.keys, p.tenant_keys(tenant)
        needs: list[tuple[Need, str, bool]] = []
        if p.breaker is not None:
            needs.append((CircuitNeed(k["open"], k["opened"], k["closed"], k["trial"],
                                      SLOT_LEASE), "the circuit breaker", False))
        if p.tenant_max_concurrent is not None:
            needs.append((SlotNeed(tk["slots"], p.tenant_max_concurrent, SLOT_LEASE),
                          f"tenant_max_concurrent={p.tenant_max_concurrent}", True))
        if p.max_concurrent is not None:
            why = (f"max_concurrent={p.max_concurrent}" if limit is None
                   else f"max_concurrent={limit} (lowered by AIMD from {p.max_concurrent})")
            needs.append((SlotNeed(k["slots"], limit or p.max_concurrent, SLOT_LEASE), why,
                          False))
        needs.append((PauseNeed(k["cooldown"]), "the pause after a 429", False))
        if p.tenant_requests_per_minute is not None:
            needs.append((WindowNeed(tk["requests"], 1, MINUTE, p.tenant_requests_per_minute),
                          f"tenant_requests_per_minute={p.tenant_requests_per_minute}", True))
        if p.requests_per_minute is not None:
            needs.append((WindowNeed(k["requests"], 1, MINUTE, p.requests_per_minute),
                          f"requests_per_minute={p.requests_per_minute}", False))
        if p.tenant_tokens_per_minute is not None and tokens:
            needs.append((WindowNeed(tk["tokens"], tokens, MINUTE, p.tenant_tokens_per_minute),
                          f"tenant_tokens_per_minute={p.tenant_tokens_per_minute}", True))
        if p.tokens_per_minute is not None and tokens:
            needs.append((WindowNeed(k["tokens"], tokens, MINUTE, p.tokens_per_minute),
                          f"tokens_per_minute={p.tokens_per_minute}", False))
        return needs

    async def admit(self, holder: str, tokens: int, deadline: float | None,
                    taken: _Taken) -> _Capped | None:
        """Wait until the call may go and take what it needs, marking it in ``taken`` (what is
        marked there when this raises is for the caller to give back). Returns None once taken,
        or a :class:`_Capped` (nothing held) when the call's tenant is at one of its own caps:
        then the caller gives up the turn while it waits (see :meth:`ProviderCall.__aenter__`).
        Raises CircuitOpenError while the breaker does not let the call go.

        Each attempt is one atomic store operation (:meth:`RateStore.admit`, all or nothing):
        a refused attempt holds nothing, so there is nothing to give back before waiting."""
        p = self.provider
        try:
            while True:
                now = p.clock.now()
                if p.aimd is not None:   # the limit in force now, as every replica lowered it
                    taken.aimd = await self.answer(self.aimd_read(now), deadline)
                listed = self.needs(taken.tenant, tokens,
                                     None if taken.aimd is None else taken.aimd[0])
                needs = [need for need, _, _ in listed]
                # slots are marked before they are asked for (see _Taken); a window entry only
                # once the store has answered
                taken.trial = p.breaker is not None
                taken.tenant_slot = p.tenant_max_concurrent is not None
                taken.slot = p.max_concurrent is not None
                got = await self.answer(
                    self.rates().admit(p.namespace, holder, needs, now), deadline)
                if isinstance(got, Admitted):
                    taken.held_until = now + SLOT_LEASE
                    taken.trial = got.trial is not None
                    taken.generation = got.trial or 0.0
                    for need in needs:
                        if isinstance(need, WindowNeed):
                            self.counted(taken, need.key, now)
                    return None
                taken.trial = taken.tenant_slot = taken.slot = False
                need, why, tenant_cap = listed[got.part]
                if isinstance(need, CircuitNeed):
                    raise CircuitOpenError(p.name, got.retry_at)
                if isinstance(need, SlotNeed):   # a call of this instance may free one first
                    until = min(now + POLL if got.retry_at is None else got.retry_at,
                                now + POLL)
                    if tenant_cap:
                        return _Capped(until, why, freed=True)
                    await self.wait(until, deadline, why, freed=True)
                    continue
                until = got.retry_at or now + POLL
                if tenant_cap:
                    return _Capped(until, why)
                await self.wait(until, deadline, why)
        finally:
            self.waiting_for = None

    def counted(self, taken: _Taken, key: str, now: float) -> None:
        """Mark in ``taken`` that the call's entry in window ``key`` was counted at ``now``."""
        p = self.provider
        k, tk = p.keys, p.tenant_keys(taken.tenant)
        if key == k["requests"]:
            taken.request_at = now
        elif key == k["tokens"]:
            taken.tokens_at = now
        elif key == tk["requests"]:
            taken.tenant_request_at = now
        elif key == tk["tokens"]:
            taken.tenant_tokens_at = now

    async def give_back(self, holder: str, taken: _Taken, tokens: int = 0) -> None:
        """Give back what ``taken`` marks, unmarking each part once given back (so that, if one
        step raises, what is left is still marked). Window entries are taken back at the time
        they were added, so the correction leaves the window with them."""
        p = self.provider
        rates, ns, k = self.rates(), p.namespace, p.keys
        tk = p.tenant_keys(taken.tenant)
        if taken.trial:
            await rates.slot_release(ns, k["trial"], holder)
            taken.trial = False
        if taken.slot:
            await rates.slot_release(ns, k["slots"], holder)
            taken.slot = False
            self.freed.set()
        if taken.tenant_slot:
            await rates.slot_release(ns, tk["slots"], holder)
            taken.tenant_slot = False
            self.freed.set()
        if taken.request_at is not None:
            await rates.window_add(ns, k["requests"], -1, MINUTE, None, taken.request_at)
            taken.request_at = None
        if taken.tenant_request_at is not None:
            await rates.window_add(ns, tk["requests"], -1, MINUTE, None, taken.tenant_request_at)
            taken.tenant_request_at = None
        if taken.tokens_at is not None:
            if tokens:
                await rates.window_add(ns, k["tokens"], -tokens, MINUTE, None, taken.tokens_at)
            taken.tokens_at = None
        if taken.tenant_tokens_at is not None:
            if tokens:
                await rates.window_add(ns, tk["tokens"], -tokens, MINUTE, None,
                                       taken.tenant_tokens_at)
            taken.tenant_tokens_at = None

    async def renew(self, holder: str, taken: _Taken, lost: Callable[[str], None]) -> None:
        """Renew the slots the call holds (concurrency, the tenant's concurrency, trial) while it
        runs, moving ``taken.held_until`` on when every one was renewed. A slot whose renewal
        is refused was lost (its lease ended: the process stalled, or the store lost it):
        ``lost(why)`` is called, and renewal ends."""
        p = self.provider
        keys = {"slots": p.keys["slots"], "trial": p.keys["trial"],
                "tenant": p.tenant_keys(taken.tenant)["slots"]}
        names = {"slots": "concurrency", "trial": "breaker trial",
                 "tenant": f"tenant {taken.tenant!r} concurrency"}
        while True:
            await p.clock.sleep(SLOT_LEASE / 3)
            held = {"slots": taken.slot, "trial": taken.trial, "tenant": taken.tenant_slot}
            sent_at, confirmed = p.clock.now(), True
            for which in ("slots", "tenant", "trial"):
                if not held[which]:
                    continue
                try:
                    renewed = await self.rates().slot_renew(
                        p.namespace, keys[which], holder, SLOT_LEASE, sent_at)
                except Exception as e:
                    log.warning("provider.renew_failed: %s: %s: %s", p.name,
                                type(e).__name__, e, extra=self.fields("provider.renew_failed"))
                    confirmed = False
                    continue
                if not renewed:
                    log.warning("provider.slot_lost: %s: the %s slot of call %s ended before "
                                "the call did; another call may take it: the call is cancelled",
                                p.name, names[which], holder,
                                extra=self.fields("provider.slot_lost"))
                    lost(f"the store refused to renew its {names[which]} slot (its lease had "
                         f"ended)")
                    return
            if confirmed:
                taken.held_until = max(taken.held_until, sent_at + SLOT_LEASE)

    async def watch(self, taken: _Taken, lost: Callable[[str], None]) -> None:
        """Call ``lost`` once the slots' leases end, less the drift margin of them, without a
        renewal confirmed meanwhile: another replica may take a slot once its lease ends, and
        the call must not be in flight then (a store that does not answer refuses nothing)."""
        p = self.provider
        margin = SLOT_LEASE * DRIFT_MARGIN
        while (left := taken.held_until - margin - p.clock.now()) > 0:
            await p.clock.sleep(left)
        log.warning("provider.slot_expired: %s: no renewal of the slots of a call confirmed "
                    "before their lease ends (less the drift margin of %g s): the call is "
                    "cancelled", p.name, margin, extra=self.fields("provider.slot_expired"))
        lost(f"no renewal of its slots was confirmed by the store within their "
             f"{SLOT_LEASE:g} s lease (less the drift margin of {margin:g} s)")

    async def failed(self, taken: _Taken) -> None:
        """Count a failed call; open the circuit (see the class docstring) if it was the
        trial of the circuit's current opening, or the failure that reaches the threshold."""
        p = self.provider
        if p.breaker is None:
            return
        rates, ns, k, now = self.rates(), p.namespace, p.keys, p.clock.now()
        failures = await rates.window_add(ns, k["failures"], 1, p.breaker.window, None, now)
        if not taken.trial and failures.total < p.breaker.failures:
            return
        opened, closed = await self.circuit(now)
        if opened > closed:     # tripped: only the trial of this opening decides
            if taken.trial and taken.generation == opened:
                until = await rates.pause_until(ns, k["open"], now + p.breaker.cooldown, now)
                log.warning("provider.circuit_open: %s: the trial call failed; until %s",
                            p.name, until, extra=self.fields("provider.circuit_open"))
            return
        if failures.total < p.breaker.failures:
            return      # a trial of an opening that a later trial already closed
        until = await rates.pause_until(ns, k["open"], now + p.breaker.cooldown, now)
        await rates.counter_add(ns, [k["opened"]], [1.0], [closed + 1], now)
        log.warning("provider.circuit_open: %s after %g failures in %g s; until %s",
                    p.name, failures.total, p.breaker.window, until,
                    extra=self.fields("provider.circuit_open"))

    # -- AIMD: the concurrency limit after 429s ------------------------------------------------
    #
    # Two counters in the store, shared by every replica: ``aimd-cut``, how far the limit is
    # below max_concurrent (a float: successes give it back a fraction at a time), and
    # ``aimd-lowered``, how many times a 429 lowered it. A call remembers both as it goes; its 429
    # lowers the limit only if nobody lowered it since (``lowered`` + 1 under the limit of the
    # value it saw, one atomic counter_add): the 429s of a round of calls that went together
    # lower it once, as TCP halves its window once per round trip.

    def limit(self, cut: float) -> int:
        """The concurrency limit with the limit cut by ``cut``."""
        p = self.provider
        assert p.aimd is not None and p.max_concurrent is not None
        return max(p.aimd.min_concurrent, min(p.max_concurrent, math.floor(
            p.max_concurrent - max(0.0, cut) + 1e-9)))

    async def aimd_read(self, now: float) -> tuple[int, float, float]:
        """(the limit in force, the cut, the times lowered), read without writing."""
        p = self.provider
        k = p.keys
        got = await self.rates().read_rates(p.namespace, now,
                                             counters=[k["cut"], k["lowered"]])
        cut = got.counters[k["cut"]]
        return self.limit(cut), cut, got.counters[k["lowered"]]

    async def aimd_lower(self, taken: _Taken) -> None:
        """A 429: multiply the limit by ``decrease``, unless it was lowered since the call went."""
        p = self.provider
        assert p.aimd is not None and p.max_concurrent is not None
        if taken.aimd is None:
            return
        rates, ns, k, now = self.rates(), p.namespace, p.keys, p.clock.now()
        limit, cut, lowered = await self.aimd_read(now)
        if lowered > taken.aimd[2] or limit <= p.aimd.min_concurrent:
            return
        to = max(p.aimd.min_concurrent, math.floor(limit * p.aimd.decrease))
        got = await rates.counter_add(ns, [k["lowered"], k["cut"]],
                                      [1.0, p.max_concurrent - to - cut],
                                      [taken.aimd[2] + 1, None], now)
        if got.added:
            log.warning("provider.concurrency_lowered: %s: %d calls at once, was %d, after a 429",
                        p.name, to, limit, extra={"event": "provider.concurrency_lowered"})

    async def aimd_raise(self, taken: _Taken) -> None:
        """A success: give back ``increase / limit`` of a slot, if the limit is lowered."""
        p = self.provider
        assert p.aimd is not None
        if taken.aimd is None or taken.aimd[1] <= 0:
            return          # at max_concurrent as the call went: nothing to write
        rates, ns, k, now = self.rates(), p.namespace, p.keys, p.clock.now()
        limit, cut, _ = taken.aimd
        got = await rates.counter_add(ns, [k["cut"]], [-min(cut, p.aimd.increase / limit)],
                                      [None], now)
        if got.totals[0] < 0:   # successes on several replicas at once gave back too much
            await rates.counter_add(ns, [k["cut"]], [-got.totals[0]], [None], now)

    async def succeeded(self, taken: _Taken) -> None:
        p = self.provider
        if not taken.trial or p.breaker is None:
            return
        rates, ns, k, now = self.rates(), p.namespace, p.keys, p.clock.now()
        opened, closed = await self.circuit(now)
        if opened != taken.generation or closed >= opened:
            return      # a trial of an opening already closed: the failures are recent ones
        await rates.window_clear(ns, k["failures"])
        got = await rates.counter_add(ns, [k["closed"]], [1.0], [taken.generation], now)
        if got.added:
            log.info("provider.circuit_closed: %s", p.name,
                     extra=self.fields("provider.circuit_closed"))


def _amount(value: Any) -> bool:
    """A finite number >= 0 (not a bool)."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and value >= 0)


class ProviderCall:
    """One call through a provider: ``async with provider.call(…) as call``."""

    def __init__(self, provider: Provider, limits: ProviderLimits, tokens: int,
                 tenant: str | None, timeout: float | None, cost: float | None) -> None:
        self.provider = provider
        self._limits = limits   # what the provider's calls share, and the steps of a call
        self.tokens = tokens
        self._tenant = tenant
        self._timeout = timeout
        self._estimate = float(cost) if cost is not None else (
            tokens * provider.price_per_token if provider.price_per_token else 0.0)
        self._used_tokens: int | None = None
        self._used_cost: float | None = None
        self._retry_after: float | None = None
        self._holder = f"{provider.instance_id}/{secrets.token_hex(6)}"
        self._taken = _Taken()
        self._scopes: list[Scope] | None = None
        self._renewal: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._task: asyncio.Task[Any] | None = None    # the task inside the block
        self._cancelling = 0
        self._lost: str | None = None    # why the call was cancelled: its slots' lease ended
        self._entered = False
        self._told: Any = None      # the telemetry token of this call
        self.spender: Spender | None = None

    @property
    def _trial(self) -> bool:
        """Whether this call is the breaker's trial (the circuit is half-open)."""
        return self._taken.trial

    def used(self, tokens: int | None = None, cost: float | None = None) -> None:
        """What the call really used: corrects the token estimate in the per-minute window and
        the cost recorded against the budgets (default: tokens * price_per_token).

        In the tokens window, more tokens than estimated are added when the call ends (they
        count for a minute from then). Fewer tokens than estimated are taken back *at the time
        the estimate was counted*, so the correction leaves the window together with the
        estimate (taken back when the call ends, it would outlive the estimate and let the
        window pass its limit); a call that ends a minute or more after it went corrects
        nothing there, as its estimate has already left."""
        if tokens is not None:
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
                raise ValueError(f"call.used(tokens=…) takes an int >= 0, not {tokens!r}.")
            self._used_tokens = tokens
        if cost is not None:
            if not _amount(cost):
                raise ValueError(f"call.used(cost=…) takes a number >= 0, not {cost!r}.")
            self._used_cost = float(cost)

    def rate_limited(self, retry_after: float | None = None) -> None:
        """The provider answered 429: pause it for every replica for ``retry_after`` seconds
        (default 1 s) from the end of this call. A 429 is not a breaker failure, whatever the
        ``async with`` block raises afterwards."""
        if retry_after is not None and not _amount(retry_after):
            raise ValueError(f"retry_after is a number of seconds >= 0, not {retry_after!r}.")
        self._retry_after = float(retry_after) if retry_after is not None else 1.0

    async def __aenter__(self) -> ProviderCall:
        if self._entered:
            raise RuntimeError("This provider.call(…) was already entered; make a new one.")
        self._entered = True
        p = self.provider
        ctx = current_run.get()
        tenant = self._tenant or (ctx.tenant if ctx is not None else "default")
        self.spender = Spender(tenant, ctx.run_id if ctx is not None else None,
                               ctx.root_id if ctx is not None else None)
        self._told = p.telemetry.provider_call_started(p.name, tenant)
        try:
            await self._admitted(tenant)
        except BaseException as e:
            p.telemetry.provider_call_ended(self._told, p.name, _refusal(e), e)
            raise
        return self

    async def _admitted(self, tenant: str) -> None:
        """Wait until the call may go (see :meth:`Provider.call`), holding what it takes."""
        p, lim = self.provider, self._limits
        assert self.spender is not None
        deadline = (None if self._timeout is None or math.isinf(self._timeout)
                    else p.clock.now() + self._timeout)
        if p.breaker is not None and lim.turns.busy:
            # fail fast while the circuit is open, rather than wait for the turn to find out
            until = await lim.answer(p.open_until(), deadline)
            if until is not None:
                raise CircuitOpenError(p.name, until)
        # a reservation the store made but never confirmed in time stays counted: a budget
        # errs on the side of refusing, never of passing its limit
        self._scopes = await lim.answer(
            p.ledger.reserve(self.spender, self._estimate, p.currency), deadline)
        self._taken.tenant = tenant
        try:
            while True:
                async with lim.turns.turn(tenant, p.clock, deadline, lim.turn_timed_out):
                    capped = await lim.admit(self._holder, self.tokens, deadline, self._taken)
                if capped is None:
                    break
                # The tenant is at its own cap (it holds nothing now). Waiting for it while
                # holding the turn would stall every other tenant of this instance behind a cap
                # that is not theirs, so the call leaves the turn, waits outside the round robin
                # for its cap to have room (a call of this instance freeing a slot wakes it
                # early), then queues again: by then its tenant was served recently, so tenants
                # that waited meanwhile go first. Other callers of the capped tenant that get
                # the turn meanwhile find the same cap and step out too; a provider-wide limit
                # is still waited for holding the turn (it is every tenant's).
                await lim.wait(capped.until, deadline, capped.why, capped.freed, turn=False)
        except BaseException as e:
            if _store_failed(e):
                # the store failed or did not answer: giving back would wait for it again (a
                # store timeout per step, or for ever), so it goes on without the caller
                _running.add(task := asyncio.ensure_future(self._undo()))
                task.add_done_callback(_running.discard)
            else:
                await _shielded(self._undo())
            raise
        if p.max_concurrent is not None or p.tenant_max_concurrent is not None \
                or self._taken.trial:
            self._task = asyncio.current_task()
            self._cancelling = self._task.cancelling() if self._task is not None else 0
            self._renewal = asyncio.create_task(lim.renew(self._holder, self._taken, self._cut))
            self._watchdog = asyncio.create_task(lim.watch(self._taken, self._cut))

    def _cut(self, why: str) -> None:
        """The call's slots may be another call's now: cancel the block (``__aexit__`` makes
        the cancel a StoreUnavailableError), as a run whose lease ends is aborted."""
        if self._lost is None and self._task is not None:
            self._lost = why
            self._task.cancel()

    def _log_fields(self, event: str) -> dict[str, Any]:
        """``extra=`` of a record about this call: the run and tenant it is made for."""
        fields = self._limits.fields(event)
        if self.spender is not None:
            fields["tenant"] = self.spender.tenant
            if self.spender.run_id is not None:
                fields["run_id"] = self.spender.run_id
        return fields

    async def _undo(self) -> None:
        """The call did not go: give back what admission took, then the budget reservation."""
        p, lim = self.provider, self._limits
        await self._step("give back what admission took",
                         lim.give_back(self._holder, self._taken, self.tokens))
        assert self.spender is not None
        await self._step("refund the budget reservation",
                         p.ledger.record(self.spender, 0.0, p.currency,
                                         reserved=self._estimate, scopes=self._scopes))

    async def _step(self, what: str, work: Awaitable[None]) -> None:
        try:
            await work
        except Exception as e:
            p = self.provider
            log.warning("provider.exit_failed: %s: could not %s: %s: %s", p.name, what,
                        type(e).__name__, e, extra=self._log_fields("provider.exit_failed"))

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        tb: object) -> None:
        # never raises what the store says: the body's own exception (if any) goes on, or the
        # lost slots' if they cancelled the block
        for task in (self._watchdog, self._renewal):
            if task is not None:
                task.cancel()
        cut = False
        if self._lost is not None and self._task is not None:
            self._task.uncancel()   # the cancel of _cut, whether the block raised it or not
            cut = isinstance(error, asyncio.CancelledError) \
                and self._task.cancelling() <= self._cancelling
        try:
            await _shielded(self._finish(error))
        finally:
            p = self.provider
            result = ("rate_limited" if self._retry_after is not None else
                      "succeeded" if error is None else
                      "failed" if isinstance(error, Exception) else "cancelled")
            p.telemetry.provider_call_ended(self._told, p.name, result, error)
        if cut:
            raise StoreUnavailableError(
                f"The call to provider {p.name!r} was cancelled: {self._lost}. Another replica "
                f"may hold its slot now, and max_concurrent is kept across replicas. Check the "
                f"coordination store; a call cut off from it stops before its slot's lease "
                f"ends.") from error

    async def _finish(self, error: BaseException | None) -> None:
        """What a call does when it ends, each step on its own (one that fails is logged and
        the others still run), in an order that matters: the 429 pause, the breaker's
        accounting and the tokens used are in the store before the slots are freed, so no call
        can go in between without seeing them; the cost is recorded last."""
        p, lim = self.provider, self._limits
        rates, ns, k = lim.rates(), p.namespace, p.keys
        taken = self._taken
        for task in (self._renewal, self._watchdog):
            if task is not None:
                task.cancel()
                await asyncio.wait([task])
        now = p.clock.now()
        if self._retry_after is not None:
            await self._step("pause the provider after a 429", self._pause(now))
            if p.aimd is not None:
                await self._step("lower the concurrency limit", lim.aimd_lower(taken))
        if self._retry_after is not None:
            pass    # a 429 says nothing about an outage (a trial frees its slot for the next)
        elif error is None:
            await self._step("close the circuit", lim.succeeded(taken))
            if p.aimd is not None:
                await self._step("raise the concurrency limit", lim.aimd_raise(taken))
        elif isinstance(error, Exception) and not isinstance(error, BudgetExceededError):
            await self._step("count the failure", lim.failed(taken))
        if self._used_tokens is not None and p.tokens_per_minute is not None:
            await self._step("correct the tokens window",
                             self._correct_tokens(now, k["tokens"], taken.tokens_at))
        if self._used_tokens is not None and p.tenant_tokens_per_minute is not None:
            await self._step("correct the tenant's tokens window", self._correct_tokens(
                now, p.tenant_keys(taken.tenant)["tokens"], taken.tenant_tokens_at))
        if taken.slot:
            await self._step("free the concurrency slot",
                             rates.slot_release(ns, k["slots"], self._holder))
            taken.slot = False
            lim.freed.set()
        if taken.tenant_slot:
            await self._step("free the tenant's concurrency slot", rates.slot_release(
                ns, p.tenant_keys(taken.tenant)["slots"], self._holder))
            taken.tenant_slot = False
            lim.freed.set()
        if taken.trial:
            await self._step("free the breaker's trial slot",
                             rates.slot_release(ns, k["trial"], self._holder))
        cost = self._used_cost
        if cost is None:
            cost = (self._used_tokens * p.price_per_token
                    if self._used_tokens is not None and p.price_per_token else self._estimate)
        assert self.spender is not None
        await self._step("record the cost", p.ledger.record(
            self.spender, cost, p.currency, reserved=self._estimate, scopes=self._scopes,
            provider=p.name, tokens=self._used_tokens))

    async def _pause(self, now: float) -> None:
        p, lim = self.provider, self._limits
        assert self._retry_after is not None
        until = await lim.rates().pause_until(p.namespace, p.keys["cooldown"],
                                             now + self._retry_after, now)
        p.telemetry.provider_paused(p.name, self._retry_after)
        log.warning("provider.rate_limited: %s paused until %s for every replica",
                    p.name, until, extra=self._log_fields("provider.rate_limited"))

    async def _correct_tokens(self, now: float, key: str, counted_at: float | None) -> None:
        """Correct the estimate in the tokens window ``key`` (the provider's or the tenant's),
        where it was counted at ``counted_at`` (None: not counted), as :meth:`used` says."""
        p, lim = self.provider, self._limits
        assert self._used_tokens is not None
        counted = self.tokens if counted_at is not None else 0
        extra = self._used_tokens - counted
        if extra > 0:
            await lim.rates().window_add(p.namespace, key, extra, MINUTE, None, now)
        elif extra < 0 and counted_at is not None and now - counted_at < MINUTE:
            await lim.rates().window_add(p.namespace, key, extra, MINUTE, None, counted_at)


def check_provider_options(name: str, max_concurrent: Any, requests_per_minute: Any,
                           tokens_per_minute: Any, breaker: Any, price_per_token: Any,
                           tenant_max_concurrent: Any = None,
                           tenant_requests_per_minute: Any = None,
                           tenant_tokens_per_minute: Any = None,
                           currency: Any = "usd", aimd: Any = None) -> None:
    """Raise ``ValueError`` naming the first option of ``app.provider(...)`` that cannot
    work."""
    _checks.text(name, "app.provider(name)", _checks.VALUE)
    for option, value in (("max_concurrent", max_concurrent),
                          ("requests_per_minute", requests_per_minute),
                          ("tokens_per_minute", tokens_per_minute),
                          ("tenant_max_concurrent", tenant_max_concurrent),
                          ("tenant_requests_per_minute", tenant_requests_per_minute),
                          ("tenant_tokens_per_minute", tenant_tokens_per_minute)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"app.provider({name!r}, {option}=…) takes None or an int >= 1, "
                             f"not {value!r}.")
    if breaker is not None and not isinstance(breaker, Breaker):
        raise ValueError(f"app.provider({name!r}, breaker=…) takes a shoal.Breaker, not "
                         f"{breaker!r}.")
    if price_per_token is not None and (
            isinstance(price_per_token, bool) or not isinstance(price_per_token, (int, float))
            or not math.isfinite(price_per_token) or price_per_token < 0):
        raise ValueError(f"app.provider({name!r}, price_per_token=…) takes a finite number "
                         f">= 0, not {price_per_token!r}.")
    _checks.text(currency, f"app.provider({name!r}, currency)", _checks.VALUE)
    if aimd is not None and not isinstance(aimd, Aimd):
        raise ValueError(f"app.provider({name!r}, aimd=…) takes a shoal.Aimd, not {aimd!r}.")
    if aimd is not None and max_concurrent is None:
        raise ValueError(f"app.provider({name!r}, aimd=…) adapts max_concurrent: give "
                         f"max_concurrent too.")
    if aimd is not None and aimd.min_concurrent > max_concurrent:
        raise ValueError(f"app.provider({name!r}): Aimd(min_concurrent={aimd.min_concurrent}) "
                         f"is above max_concurrent={max_concurrent}.")
