"""Every error shoal raises on purpose. Each message says what happened and what to do."""

from __future__ import annotations


class ShoalError(Exception):
    """Base class of shoal's errors."""


class ConfigurationError(ShoalError):
    """The app or a store was configured in a way that cannot work."""


class StoreUnavailableError(ShoalError):
    """The store could not be opened or reached."""


class SchemaVersionError(ConfigurationError):
    """The store's schema is at a version this code cannot use: newer than the newest migration
    it knows (a rolled-back deploy), or behind it (or missing) while migrating is off
    (``App(migrate=False)``, ``shoal worker --no-migrate``), or while it cannot migrate (a
    client whose first call is a dispatch in the caller's open SQLite transaction, which holds
    the write lock migrating needs: ``why`` says so). ``found`` is 0 for no schema."""

    def __init__(self, store: str, found: int, expected: int, *, why: str | None = None,
                 ) -> None:
        if found > expected:
            text = (
                f"The store {store!r} is at schema version {found}, newer than version "
                f"{expected}, the newest this shoal knows: a newer release migrated it (a "
                f"rolled-back deploy?). shoal never downgrades a schema nor uses one it does not "
                f"know: deploy a release that knows version {found}, or restore the database "
                f"from before that migration.")
        else:
            what = ("holds no shoal schema (version 0)" if found == 0
                    else f"is at schema version {found}")
            why = why or "migrating is off (App(migrate=False) or shoal worker --no-migrate)"
            text = (
                f"The store {store!r} {what}, and this shoal needs version {expected}; {why}. "
                f"Run 'shoal migrate --store URL' (manage.py shoal_migrate under Django, flask "
                f"shoal migrate under Flask; as a role that may create tables), then start "
                f"again.")
        super().__init__(text)
        self.found = found
        self.expected = expected


class ClientClosedError(ShoalError):
    """A :class:`shoal.Client` or :class:`shoal.AsyncClient` call made after ``close()``, or
    in flight when ``close()`` was called (a thread waiting in ``result()``, for instance)."""

    def __init__(self, client: str, *, in_flight: bool) -> None:
        if in_flight:
            text = (f"{client} was closed while this call was in flight (client.close(), or "
                    f"the interpreter's exit); the call was abandoned. A dispatch among such "
                    f"calls may or may not have been stored: dispatch it again with its "
                    f"idempotency key on an open client.")
        else:
            text = (f"{client} is closed (client.close(), or the interpreter's exit): make a "
                    f"new client, and close it only when no call is left to make.")
        super().__init__(text)
        self.in_flight = in_flight


class UnknownRunError(ShoalError):
    """No run has this id."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"No run with id {run_id!r}. Check the id (shoal runs lists them).")
        self.run_id = run_id


class UnknownWorkflowError(ShoalError):
    """The workflow is registered neither here nor by any instance of this namespace."""

    def __init__(self, name: str, namespace: str) -> None:
        super().__init__(
            f"No workflow named {name!r} in namespace {namespace!r}. Register it with "
            f"@app.workflow(name={name!r}) in this app or in a started instance of the namespace, "
            f"or dispatch with allow_unregistered=True to queue the run for a worker that will "
            f"serve it."
        )
        self.name = name


class RunFailedError(ShoalError):
    """The awaited run ended ``failed``."""

    def __init__(self, run_id: str, error: str | None) -> None:
        super().__init__(f"Run {run_id} failed: {error}")
        self.run_id = run_id
        self.error = error


class RunCancelledError(ShoalError):
    """The awaited run ended ``cancelled``."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"Run {run_id} was cancelled.")
        self.run_id = run_id


class NonDeterminismError(ShoalError):
    """A replay reached a step whose name differs from the recorded one."""

    def __init__(self, run_id: str, seq: int, recorded: str, now: str) -> None:
        super().__init__(
            f"Run {run_id}: step #{seq} was recorded as {recorded!r} but the replay reached "
            f"{now!r}. Code outside ctx.step must be deterministic: take decisions from step "
            f"results, not from time, randomness or outside state."
        )
        self.run_id = run_id
        self.seq = seq
        self.recorded = recorded
        self.replayed = now


class WorkflowCodeError(ShoalError):
    """The workflow's code uses ``ctx`` in a way that cannot work: a step (or another durable
    call) inside a step's function, or a ``ctx.step(...)`` never awaited. The run fails at once,
    as for a ``NonDeterminismError``: running the same code again would fail the same way. The
    message names the call and says how to write it."""


class LeaseLostError(ShoalError):
    """This instance no longer holds the run's claim; the new owner continues it."""

    def __init__(self, run_id: str, owner: str) -> None:
        super().__init__(
            f"Instance {owner} lost its lease on run {run_id} (it expired and was taken over, or "
            f"the run was cancelled); this instance stopped executing it. "
            f"Not a failure of the run: the new owner continues from the last checkpoint. "
            f"If this happens often, raise App(lease=...) or look for a blocked event loop."
        )
        self.run_id = run_id
        self.owner = owner


class LockLostError(ShoalError):
    """A lock held by this instance was lost before it was released: its renewal was refused, or
    no renewal was confirmed before its lease ran out (store unreachable, a long pause)."""

    def __init__(self, keys: tuple[str, ...], reason: str) -> None:
        super().__init__(
            f"The lock on {list(keys)} was lost: {reason}. Another replica may hold it now; stop "
            f"the work it guarded (writes guarded by its fencing token are refused by a resource "
            f"that checks tokens). If this happens often, raise App(lease=...) or look for a "
            f"blocked event loop.",
        )
        self.keys = keys
        self.reason = reason


class AdmissionRejectedError(ShoalError):
    """``max_queued`` runs are already queued (or a batch of new runs would go over it) and the
    admission policy is ``reject``."""

    def __init__(self, namespace: str, max_queued: int, *, batch: int | None = None,
                 room: int = 0) -> None:
        if batch is None:
            text = (f"Namespace {namespace!r} already has {max_queued} queued runs (max_queued); "
                    f"the run was not stored.")
        else:   # app.dispatch_many: the batch is refused whole
            text = (f"Namespace {namespace!r} has room for {room} more queued runs under "
                    f"max_queued={max_queued}, and this batch has {batch} new runs; nothing of "
                    f"the batch was stored.")
        super().__init__(f"{text} Retry later, add workers, or use admission='park'.")
        self.max_queued = max_queued


class NotPausedError(ShoalError):
    """The pause was already resolved."""


class NotRetryableError(ShoalError):
    """``app.retry`` of a run that is not ``failed`` or ``cancelled``; nothing was changed."""

    def __init__(self, run_id: str, status: str) -> None:
        why = ("it succeeded: dispatch a new run to do the work again" if status == "succeeded"
               else "it has not ended: cancel it first, or wait for it to fail")
        super().__init__(f"Run {run_id} is {status} and cannot be retried ({why}). Only a "
                         f"failed or cancelled run can be retried.")
        self.run_id = run_id
        self.status = status


class UnknownPauseError(ShoalError):
    """No pause has this id."""


class UnknownOutboxEntryError(ShoalError):
    """No outbox entry of the namespace has this id."""


class NotDeadError(ShoalError):
    """``app.redrive`` of an outbox entry that is not dead-lettered; nothing was changed."""


class BudgetExceededError(ShoalError):
    """A cost budget has no room for a call's estimated cost; nothing was spent or counted."""

    def __init__(self, budget: str, spent: float, limit: float, amount: float,
                 currency: str) -> None:
        super().__init__(
            f"Over {budget}: {spent:g} {currency} spent of {limit:g}, and this call would add "
            f"{amount:g}. Raise the budget (app.budget(...)), or wait for the next day for a "
            f"daily budget.")
        self.budget = budget
        self.spent = spent
        self.limit = limit
        self.amount = amount
        self.currency = currency


class CircuitOpenError(ShoalError):
    """The provider's circuit breaker is open (too many failed calls, on any replica)."""

    def __init__(self, provider: str, until: float | None) -> None:
        when = (f"until {until:.3f} (epoch seconds)" if until is not None
                else "while a trial call is in flight")
        super().__init__(
            f"The circuit of provider {provider!r} is open {when}: recent calls failed on the "
            f"replicas. Fail fast or use a fallback; it half-opens by itself after its cooldown.")
        self.provider = provider
        self.until = until


class RateLimitTimeoutError(ShoalError, TimeoutError):
    """A provider call waited for room longer than its ``timeout``."""

    def __init__(self, provider: str, limit: str) -> None:
        super().__init__(
            f"A call to provider {provider!r} could not go within its timeout: waiting for "
            f"{limit}. Raise the timeout, lower the load, or raise the provider's limits.")
        self.provider = provider
        self.limit = limit
