"""The console's read model and actions: plain functions of an :class:`~shoal.App` that return
JSON-able dicts (what ``/api/`` answers, and what the pages render). Everything goes through the
App's public methods or the store's ports, exactly as the CLI does: nothing here writes SQL.

Times are seconds since the epoch (floats, the app's clock); the pages show them in the
browser's zone. Every value that comes from a run (inputs, outputs, errors, keys, names) is
returned as data; the pages escape it when they render it.

Shapes (``Run`` and the others below are these dicts):

``run_summary`` (a row of a list)::

    {"id", "workflow", "tenant", "status", "priority", "created_at", "started_at",
     "finished_at", "attempts", "max_attempts", "idempotency_key", "concurrency_key",
     "owner", "parent_id", "root_id", "error",          # error: its first line, or None
     "progress"}     # the latest ctx.progress: {"fraction", "message", "data", "at"} or None

``run_full`` (every field a run has)::

    run_summary + {"namespace", "input", "output", "error" (whole), "traceback", "run_at",
                   "lease_expires_at", "lease_epoch", "cancel_requested", "version",
                   "wait_for", "held", "resume_reason", "final"}

``pause``::

    {"id", "run_id", "tenant", "name", "request", "status", "decision", "created_at",
     "expires_at", "resolved_at", "age", "expires_in"}  # decision: {"approved", "data", "by",
                                                         # "reason"} or None while pending

``outbox_entry``::

    {"id", "run_id", "seq", "index", "key", "topic", "payload", "created_at", "attempts",
     "next_at", "delivered_at", "dead", "error", "state"}  # state: delivered|pending|dead

``instance``, ``slot``, ``lock``, ``meter`` (``/api/replicas``) and ``provider_state``
(``/api/providers``): see :func:`instance_dicts`, :func:`slot_dicts`, :func:`lock_dict`,
:func:`meter_dict` and :func:`provider_state_dict`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from shoal.app import App
from shoal.coord.provider import ProviderState
from shoal.errors import (
    ConfigurationError,
    NotDeadError,
    NotPausedError,
    NotRetryableError,
    StoreUnavailableError,
    UnknownOutboxEntryError,
    UnknownPauseError,
    UnknownRunError,
)
from shoal.ports import RunInspection
from shoal.stores import mask_url
from shoal.types import (
    HELD_BACK_CAP,
    HOLD_REASONS,
    CoordinationView,
    LockState,
    MeterState,
    OutboxEntry,
    Pause,
    Progress,
    Run,
    RunFilter,
    RunOwner,
    RunRecord,
    RunStatus,
    SpendEntry,
    StepRecord,
    WorkflowInfo,
)

MINUTES = 60          # the overview's chart: runs ended per minute over the last hour
PAGE = 50             # runs per page unless asked otherwise
MAX_PAGE = 500
MAX_OWNERS = 1000     # owners of running runs listed on the replicas page
LEDGER_DAY = 10_000   # ledger rows of today summed per tenant on the budgets page
VIEW_LIMIT = 100      # locks, meters, waiters per lock and registered instances listed


class Refused(Exception):
    """An action the console refuses: ``status`` is the HTTP status (400 bad input naming
    ``field``, 404 unknown, 409 the run or pause moved on, 403 read-only), ``message`` why."""

    def __init__(self, status: int, message: str, field: str | None = None,
                 current: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.current = current

    def body(self) -> dict[str, Any]:
        """``{"error": message, "field"?: name, "current"?: status now}``."""
        out: dict[str, Any] = {"error": self.message}
        if self.field is not None:
            out["field"] = self.field
        if self.current is not None:
            out["current"] = self.current
        return out


# -- records as dicts --------------------------------------------------------------------------


def _first_line(text: str | None) -> str | None:
    return None if text is None else (text.strip().splitlines() or [""])[0]


def run_summary(run: Run) -> dict[str, Any]:
    """A run as a row of a list (see the module doc)."""
    return {
        "id": run.id, "workflow": run.workflow, "tenant": run.tenant,
        "status": run.status.value, "priority": run.priority, "created_at": run.created_at,
        "started_at": run.started_at, "finished_at": run.finished_at,
        "attempts": run.attempts, "max_attempts": run.max_attempts,
        "idempotency_key": run.idempotency_key, "concurrency_key": run.concurrency_key,
        "owner": run.owner, "parent_id": run.parent_id, "root_id": run.root_id,
        "error": _first_line(run.error), "progress": progress_dict(run.progress),
    }


def progress_dict(progress: Progress | None) -> dict[str, Any] | None:
    """A run's latest progress: ``{"fraction", "message", "data", "at"}``, None before any."""
    if progress is None:
        return None
    return {"fraction": progress.fraction, "message": progress.message, "data": progress.data,
            "at": progress.at}


def run_full(run: Run) -> dict[str, Any]:
    """Every field of a run (see the module doc)."""
    return run_summary(run) | {
        "namespace": run.namespace, "input": run.input, "output": run.output,
        "error": run.error, "traceback": run.traceback, "run_at": run.run_at,
        "lease_expires_at": run.lease_expires_at, "lease_epoch": run.lease_epoch,
        "cancel_requested": run.cancel_requested, "version": run.version,
        "wait_for": run.wait_for, "held": run.held, "resume_reason": run.resume_reason,
        "final": run.status.final,
    }


def pause_dict(pause: Pause, now: float) -> dict[str, Any]:
    """A pause, with its ``age`` and ``expires_in`` (seconds, None without expiry) at ``now``."""
    return {
        "id": pause.id, "run_id": pause.run_id, "tenant": pause.tenant, "name": pause.name,
        "request": pause.request, "status": pause.status, "decision": pause.decision,
        "created_at": pause.created_at, "expires_at": pause.expires_at,
        "resolved_at": pause.resolved_at, "age": now - pause.created_at,
        "expires_in": None if pause.expires_at is None else pause.expires_at - now,
    }


def outbox_dict(entry: OutboxEntry) -> dict[str, Any]:
    """An outbox entry with its delivery ``state``: delivered, pending or dead."""
    state = "dead" if entry.dead else "delivered" if entry.delivered_at is not None else "pending"
    return {
        "id": entry.id, "run_id": entry.run_id, "seq": entry.seq, "index": entry.index,
        "key": entry.key, "topic": entry.topic, "payload": entry.payload,
        "created_at": entry.created_at, "attempts": entry.attempts, "next_at": entry.next_at,
        "delivered_at": entry.delivered_at, "dead": entry.dead, "error": entry.error,
        "state": state,
    }


def step_dicts(steps: tuple[StepRecord, ...], started_at: float | None) -> list[dict[str, Any]]:
    """Each step with its ``started_at`` (when its function began; a sleep or a wait: when the
    run reached it), ``duration`` (to ``finished_at``), the run's ``attempt`` that executed it
    and the in-place ``retries`` it took, None where unknown (steps written before shoal
    stored them); and ``since_previous``: seconds from the end of the step before it (the
    run's first start for the first step) to its own end, what a step without a start shows."""
    out = []
    previous = started_at
    for s in steps:
        since = (None if s.finished_at is None or previous is None
                 else max(0.0, s.finished_at - previous))
        duration = (None if s.finished_at is None or s.started_at is None
                    else max(0.0, s.finished_at - s.started_at))
        out.append({"seq": s.seq, "name": s.name, "finished": s.finished, "epoch": s.epoch,
                    "attempt": s.attempt, "retries": s.retries, "started_at": s.started_at,
                    "finished_at": s.finished_at, "duration": duration,
                    "since_previous": since, "output": s.output})
        if s.finished_at is not None:
            previous = s.finished_at
    return out


def spend_dict(rows: list[SpendEntry]) -> dict[str, Any]:
    """``{"entries": [{"id", "tenant", "run_id", "root_id", "amount", "currency", "at",
    "provider", "tokens"}], "total": {currency: sum}}``."""
    total: dict[str, float] = {}
    for r in rows:
        total[r.currency] = total.get(r.currency, 0.0) + r.amount
    return {"entries": [{"id": r.id, "tenant": r.tenant, "run_id": r.run_id,
                         "root_id": r.root_id, "amount": r.amount, "currency": r.currency,
                         "at": r.at, "provider": r.provider, "tokens": r.tokens}
                        for r in rows],
            "total": total}


def _instance_of(member: str) -> str:
    """The instance id in a membership or lock holder id (``"<instance_id>/<random>"``)."""
    instance, slash, _ = member.rpartition("/")
    return instance if slash else member


def _blank(instance: str) -> dict[str, Any]:
    return {"id": instance, "live": None, "version": None, "last_heartbeat": None,
            "heartbeat_until": None, "joined_at": None, "members": [], "slot": None,
            "runs_held": 0, "lease_until": None, "registered_at": None, "workflows": [],
            "sources": []}


def instance_dicts(view: CoordinationView | None, registrations: list[WorkflowInfo],
                   owners: list[RunOwner]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(instances, registered)`` for ``/api/replicas``. An ``instance``::

        {"id", "live", "version", "last_heartbeat", "heartbeat_until", "joined_at",
         "members", "slot", "runs_held", "lease_until", "registered_at", "workflows",
         "sources"}

    From the membership (``sources`` has ``"membership"``): ``version``, ``last_heartbeat``
    (when its latest heartbeat was sent, the app's clock), ``heartbeat_until`` (its row ends
    then unless it beats again), ``joined_at``, ``members`` (its membership ids: one per
    process start; two while a restarted instance's old row ends) and ``slot`` (``{"index",
    "of"}`` while it owns slots ``index, index + of, …``; else None). From the running runs
    (``"runs"``, ``store.run_owners``): ``runs_held`` and ``lease_until``, the latest end of
    their leases. From the
    registrations (``"registrations"``): ``workflows`` and ``registered_at`` (its latest
    start). ``live``: True with a live membership row, False without one while the
    membership could be read, None when it could not. Instances by id."""
    found: dict[str, dict[str, Any]] = {}
    by_registration: dict[str, dict[str, Any]] = {}
    for info in registrations:
        for instance, at in info.instances:
            one = by_registration.setdefault(instance, {"id": instance, "registered_at": at,
                                                         "workflows": []})
            one["registered_at"] = max(one["registered_at"], at)
            one["workflows"].append(info.name)
    if view is not None:
        for m in view.members:
            one = found.setdefault(_instance_of(m.member), _blank(_instance_of(m.member)))
            one["members"].append(m.member)
            if one["last_heartbeat"] is None or (m.beat_at or 0) >= one["last_heartbeat"]:
                one["version"], one["last_heartbeat"] = m.version, m.beat_at
            one["heartbeat_until"] = max(one["heartbeat_until"] or 0.0, m.expires_at)
            one["joined_at"] = min(one["joined_at"] or m.joined_at, m.joined_at)
            if m.held == view.generation and m.member in view.roster:
                one["slot"] = {"index": view.roster.index(m.member), "of": len(view.roster)}
            if "membership" not in one["sources"]:
                one["sources"].append("membership")
    for owner in owners:
        one = found.setdefault(owner.owner, _blank(owner.owner))
        one["runs_held"], one["lease_until"] = owner.running, owner.lease_until
        one["sources"].append("runs")
    if view is None:
        for instance in by_registration:
            found.setdefault(instance, _blank(instance))
    for instance, one in found.items():
        one["live"] = None if view is None else "membership" in one["sources"]
        reg = by_registration.get(instance)
        if reg is not None:
            one["registered_at"], one["workflows"] = reg["registered_at"], reg["workflows"]
            one["sources"].append("registrations")
    registered = sorted((r for i, r in by_registration.items() if i not in found),
                        key=lambda r: (-r["registered_at"], r["id"]))[:VIEW_LIMIT]
    return sorted(found.values(), key=lambda i: i["id"]), registered


def slot_dicts(view: CoordinationView) -> list[dict[str, Any]]:
    """Each member on the roster, in roster order: ``{"member", "instance", "index", "of",
    "state"}``; ``state`` is ``owns`` (the store recorded that it acts on this generation: it
    owns slots ``index, index + of, …`` of any total), ``waiting`` (on the roster but not
    granted yet: another member still holds an older generation) or ``gone`` (on the stored
    roster, but its row ended: the next heartbeat of any member makes a new roster)."""
    held = {m.member: m.held for m in view.members}
    out = []
    for i, member in enumerate(view.roster):
        state = ("gone" if member not in held else
                 "owns" if held[member] == view.generation else "waiting")
        out.append({"member": member, "instance": _instance_of(member), "index": i,
                    "of": len(view.roster), "state": state})
    return out


def lock_dict(lock: LockState, now: float) -> dict[str, Any]:
    """``{"key", "token", "holder", "holder_instance", "expires_at", "expires_in",
    "waiters": [{"holder", "instance", "ticket", "expires_at"}]}``: ``token`` is the key's last
    fencing token (the holder's while held); ``holder`` None while the key is free between a
    release and its next waiter's grant; waiters next first."""
    return {"key": lock.key, "token": lock.token, "holder": lock.holder,
            "holder_instance": None if lock.holder is None else _instance_of(lock.holder),
            "expires_at": lock.expires_at,
            "expires_in": None if lock.expires_at is None else lock.expires_at - now,
            "waiters": [{"holder": w.holder, "instance": _instance_of(w.holder),
                         "ticket": w.ticket, "expires_at": w.expires_at}
                        for w in lock.waiters]}


def meter_dict(meter: MeterState) -> dict[str, Any]:
    """``{"key", "debt_ms", "updated_at"}``: the debt now (it drains 1 ms per ms)."""
    return {"key": meter.key, "debt_ms": meter.debt, "updated_at": meter.updated_at}


def provider_state_dict(state: ProviderState) -> dict[str, Any]:
    """A provider's :class:`~shoal.ProviderState` without its ``at``."""
    return {"in_flight": state.in_flight, "requests_last_minute": state.requests_last_minute,
            "tokens_last_minute": state.tokens_last_minute,
            "paused_until": state.paused_until, "breaker": state.breaker,
            "open_until": state.open_until, "trial_in_flight": state.trial_in_flight,
            "failures_in_window": state.failures_in_window,
            "concurrency_limit": state.concurrency_limit}


# -- the console -------------------------------------------------------------------------------


@dataclass
class Console:
    """The console over one App (one namespace). ``read_only`` refuses every action."""

    app: App
    read_only: bool = False
    # given the App of a service (True), or opened on a store URL by the console itself
    in_process: bool = True

    @property
    def inspection(self) -> RunInspection:
        store = self.app.store
        if not isinstance(store, RunInspection):
            raise TypeError(f"The store {mask_url(store.url)!r} has no console reads "
                            f"(shoal.ports.RunInspection).")
        return store

    def config(self) -> dict[str, Any]:
        """``{"namespace", "store" (password masked), "instance_id", "read_only",
        "in_process"}``: ``in_process`` is True when the console was given an App (then the
        providers, budgets and cron schedules defined in it are shown)."""
        return {"namespace": self.app.namespace, "store": mask_url(self.app.store.url),
                "instance_id": self.app.instance_id, "read_only": self.read_only,
                "in_process": self.in_process}

    # -- reads ---------------------------------------------------------------------------------

    async def overview(self) -> dict[str, Any]:
        """``{"namespace", "at", "stats": {...}, "finished_per_minute": {"since", "width",
        "counts": [60 ints, oldest first; the last is the minute now under way]},
        "instances": [instance], "membership": {"available", "error"}, "open_circuits":
        [provider], "pending_approvals", "dead_letters"}``.

        ``instances``: the live ones (``live`` True: a heartbeat in the membership), and those
        holding running runs with no heartbeat (``live`` False is left out: stopped); without
        a readable coordination store, every instance the store knows of (``live`` None), as
        ``/api/replicas`` lists them. ``open_circuits``: the providers (as ``/api/providers``)
        whose breaker is open or half-open.

        ``stats`` is ``app.stats()``: ``{"by_status": {status: n}, "by_workflow": {workflow:
        {status: n}}, "queued": {tenant: {"due", "delayed", "held", "total"}},
        "oldest_due_age", "finished_last_minute": {status: n}, "pending_pauses",
        "outbox_backlog", "dead_letters", "live", "executing", "finished", "held_back":
        [{"workflow", "reason", "runs", "text", "capped"}], "paused": [{"workflow", "tenant",
        "paused_at"}]}``: ``held_back`` the due queued runs each flow-control rule holds back
        (``reason`` a key of ``HOLD_REASONS``, ``text`` what it means, ``capped`` when the
        count reached ``HELD_BACK_CAP``: at least that many)."""
        stats = await self.app.stats()
        now = stats.at
        since = (math.floor(now / 60) - (MINUTES - 1)) * 60.0
        counts = await self.inspection.finished_per_minute(self.app.namespace, since, MINUTES)
        replicas = await self.replicas()
        return {
            "namespace": stats.namespace, "at": now,
            "stats": {
                "by_status": stats.by_status, "by_workflow": stats.by_workflow,
                "queued": {t: {"due": q.due, "delayed": q.delayed, "held": q.held,
                               "total": q.total} for t, q in stats.queued.items()},
                "oldest_due_age": stats.oldest_due_age,
                "finished_last_minute": stats.finished_last_minute,
                "pending_pauses": stats.pending_pauses, "outbox_backlog": stats.outbox_backlog,
                "dead_letters": stats.dead_letters, "live": stats.live,
                "executing": stats.executing, "finished": stats.finished,
                "held_back": [{"workflow": w, "reason": reason, "runs": n,
                               "text": HOLD_REASONS.get(reason, reason),
                               "capped": n >= HELD_BACK_CAP}
                              for w, reasons in sorted(stats.held_back.items())
                              for reason, n in reasons.items()],
                "paused": [{"workflow": p.workflow, "tenant": p.tenant,
                            "paused_at": p.paused_at} for p in stats.paused],
            },
            "finished_per_minute": {"since": since, "width": 60, "counts": counts},
            "instances": [i for i in replicas["instances"] if i["live"] is not False],
            "membership": {"available": replicas["membership"]["available"],
                           "error": replicas["membership"]["error"]},
            "open_circuits": [p for p in (await self.providers())["providers"]
                              if p["state"] is not None
                              and p["state"]["breaker"] in ("open", "half-open")],
            "pending_approvals": stats.pending_pauses,
            "dead_letters": stats.dead_letters,
        }

    async def runs(self, query: Mapping[str, str]) -> dict[str, Any]:
        """A page of runs, newest first: ``{"runs": [run_summary], "next_cursor": str|None}``.

        ``query`` (all optional): ``status``, ``workflow``, ``tenant``, ``created_from`` and
        ``created_to`` (seconds), ``idempotency_key``, ``concurrency_key``, ``q`` (a run id, an
        idempotency key or a concurrency key: runs that have it as any of the three),
        ``cursor`` (a page's ``next_cursor``), ``limit`` (1..500, default 50). Bad values are a
        :class:`Refused` 400 naming the parameter."""
        where, limit, cursor = parse_run_query(query)
        text = (query.get("q") or "").strip()
        if not text:
            found = await self.inspection.search_runs(self.app.namespace, where,
                                                      before=cursor, limit=limit + 1)
        else:
            found = await self._search(where, text, cursor, limit + 1)
        page = found[:limit]
        return {"runs": [run_summary(r) for r in page],
                "next_cursor": page[-1].id if len(found) > limit else None}

    async def _search(self, where: RunFilter, text: str, cursor: str | None,
                      limit: int) -> list[Run]:
        """Runs whose id, idempotency key or concurrency key is ``text`` (and that match
        ``where``), newest first, below ``cursor``: three keyset reads merged."""
        store, ns = self.inspection, self.app.namespace
        found: dict[str, Run] = {}
        for by_key in (replace(where, idempotency_key=text),
                       replace(where, concurrency_key=text)):
            for r in await store.search_runs(ns, by_key, before=cursor, limit=limit):
                found[r.id] = r
        try:
            run = await self.app.get_run(text)
        except UnknownRunError:
            run = None
        if run is not None and (cursor is None or run.id < cursor) and where.matches(run):
            found[run.id] = run
        return sorted(found.values(), key=lambda r: r.id, reverse=True)[:limit]

    async def run(self, run_id: str) -> dict[str, Any]:
        """``{"run": run_full, "at", "steps": [{"seq", "name", "finished", "epoch", "attempt",
        "retries", "started_at", "finished_at", "duration", "since_previous", "output"}],
        "signals": [{"id", "name", "payload", "created_at",
        "consumed"}], "pauses": [pause], "tree": [run_summary], "outbox": [outbox_entry],
        "spend": spend_dict, "actions": {"cancel", "retry", "signal": bool}, "hold": {"reason",
        "text"}|None}``: ``hold`` the flow-control rule holding the queued run back, if one
        does (``app.hold_reason``); ``tree`` is
        the runs of its root's tree (root first, each with its ``parent_id``; at most 200),
        ``actions`` what may be asked of it now (all False when read-only), ``at`` the time
        of the read (the app's clock). 404 when unknown."""
        record = await self._record(run_id)
        now = self.app.clock.now()
        run = record.run
        spend = await self.app.ledger(run_id=run.id, limit=1000)
        live = not run.status.final and not self.read_only
        reason = (await self.app.hold_reason(run.id) if run.status == RunStatus.QUEUED
                  else None)
        return {
            "run": run_full(run), "at": now,
            "steps": step_dicts(record.steps, run.started_at),
            "signals": [{"id": s.id, "name": s.name, "payload": s.payload,
                         "created_at": s.created_at, "consumed": s.consumed}
                        for s in record.signals],
            "pauses": [pause_dict(p, now) for p in record.pauses],
            "tree": [run_summary(r) for r in record.tree],
            "outbox": [outbox_dict(e) for e in record.outbox],
            "spend": spend_dict(spend),
            "actions": {"cancel": live, "signal": live,
                        "retry": not self.read_only and run.status in (
                            RunStatus.FAILED, RunStatus.CANCELLED)},
            "hold": None if reason is None else {"reason": reason,
                                                 "text": HOLD_REASONS.get(reason, reason)},
        }

    async def _record(self, run_id: str) -> RunRecord:
        record = await self.inspection.inspect_run(run_id)
        if record is None or record.run.namespace != self.app.namespace:
            raise Refused(404, f"No run with id {run_id!r} in namespace "
                               f"{self.app.namespace!r}.")
        return record

    async def approvals(self) -> dict[str, Any]:
        """``{"approvals": [pause + {"workflow"}]}``: every pending pause, oldest first
        (at most 1,000)."""
        now = self.app.clock.now()
        pauses = await self.app.pending_pauses(limit=1000)
        out = []
        for p in pauses:
            try:
                workflow: str | None = (await self.app.get_run(p.run_id)).workflow
            except UnknownRunError:
                workflow = None
            out.append(pause_dict(p, now) | {"workflow": workflow})
        return {"approvals": out}

    async def dead_letters(self) -> dict[str, Any]:
        """``{"dead_letters": [outbox_entry]}``, oldest first (at most 1,000)."""
        return {"dead_letters": [outbox_dict(e) for e in await self.app.dead_letters(1000)]}

    async def replicas(self) -> dict[str, Any]:
        """``{"coordination": str, "membership": {"available", "error", "generation",
        "roster"}, "instances": [instance], "registered": [{"id", "registered_at",
        "workflows"}], "slots": [slot], "locks": [lock], "meters": [meter], "complete"}``
        (``instance``, ``slot``, ``lock``, ``meter``: see the module doc).

        Where each part comes from: the coordination store's membership (every started App
        heartbeats every ``membership_interval``; read by ``app.coordination_view()``, which
        writes nothing) gives the live instances, their code version, last heartbeat and slot
        assignment, and the locks and meters; the running runs (their ``owner`` and lease)
        give ``runs_held`` and ``lease_until``; the workflow registrations (each start of an
        instance, kept 30 days) give ``workflows`` and ``registered_at``. Without a readable
        coordination store (``membership.available`` False, ``error`` says why) the instances
        are those that registered or hold runs, ``live`` None, as the store alone knows them.
        ``registered``: instances that registered workflows but are neither live nor holding
        runs (stopped, or restarted under another id), newest first, at most 100."""
        coordination = self.app.coordination
        where = ("the run store" if coordination is None else
                 mask_url(coordination) if isinstance(coordination, str) else
                 ", ".join(mask_url(a) for a in coordination)
                 if isinstance(coordination, list) else type(coordination).__name__)
        try:
            view: CoordinationView | None = await self.app.coordination_view(VIEW_LIMIT)
            error = None
        except (ConfigurationError, StoreUnavailableError) as e:
            view, error = None, str(e)
        registrations = await self.app.store.list_workflows(self.app.namespace)
        owners = await self.inspection.run_owners(self.app.namespace, MAX_OWNERS)
        instances, registered = instance_dicts(view, registrations, owners)
        return {
            "coordination": where,
            "membership": {"available": view is not None, "error": error,
                           "generation": None if view is None else view.generation,
                           "roster": [] if view is None else list(view.roster)},
            "instances": instances,
            "registered": registered,
            "slots": [] if view is None else slot_dicts(view),
            "locks": [] if view is None else [lock_dict(lk, view.at) for lk in view.locks],
            "meters": [] if view is None else [meter_dict(m) for m in view.meters],
            "complete": view is not None and view.complete,
        }

    async def providers(self) -> dict[str, Any]:
        """``{"in_process": bool, "providers": [{"name", "max_concurrent",
        "requests_per_minute", "tokens_per_minute", "tenant_max_concurrent",
        "tenant_requests_per_minute", "tenant_tokens_per_minute", "price_per_token",
        "currency", "breaker": {"failures", "window", "cooldown"}|None, "open_until",
        "paused_until", "state": provider_state|None, "error": str|None}]}``: the providers
        defined in the App the console was given (a console opened on a store URL knows of
        none: they live in the code of the workers). ``state`` is what every replica's calls
        hold and used now, read from the store without writing (``provider.state()``; None
        and ``error`` when the store cannot be read): ``{"in_flight", "requests_last_minute",
        "tokens_last_minute", "paused_until", "breaker": "closed"|"open"|"half-open"|None,
        "open_until", "trial_in_flight", "failures_in_window", "concurrency_limit"}``.
        ``open_until``: the breaker is open until then; ``paused_until``: a 429's pause (both
        repeated from ``state``)."""
        out = []
        for p in self.app.providers.values():
            b = p.breaker
            try:
                state: ProviderState | None = await p.state()
                error = None
            except (ConfigurationError, StoreUnavailableError) as e:
                state, error = None, str(e)
            out.append({
                "name": p.name, "max_concurrent": p.max_concurrent,
                "requests_per_minute": p.requests_per_minute,
                "tokens_per_minute": p.tokens_per_minute,
                "tenant_max_concurrent": p.tenant_max_concurrent,
                "tenant_requests_per_minute": p.tenant_requests_per_minute,
                "tenant_tokens_per_minute": p.tenant_tokens_per_minute,
                "price_per_token": p.price_per_token, "currency": p.currency,
                "breaker": None if b is None else {"failures": b.failures, "window": b.window,
                                                   "cooldown": b.cooldown},
                "open_until": None if state is None else state.open_until,
                "paused_until": None if state is None else state.paused_until,
                "state": None if state is None else provider_state_dict(state),
                "error": error})
        return {"in_process": self.in_process, "providers": out}

    async def budgets(self) -> dict[str, Any]:
        """``{"in_process": bool, "day": "YYYY-MM-DD" (UTC, the app's clock), "budgets":
        [{"currency", "per_run", "per_root", "per_tenant_day", "tenants": {tenant: limit},
        "spent_today": {tenant: amount}, "partial": bool}]}``: the limits set in the App the
        console was given; ``spent_today`` sums today's ledger rows per tenant (the first
        10,000; ``partial`` when there were more)."""
        now = self.app.clock.now()
        day = math.floor(now / 86400) * 86400.0
        rows = await self.app.ledger(since=day, limit=LEDGER_DAY + 1)
        out = []
        for currency, b in sorted(self.app.budgets.items()):
            spent: dict[str, float] = {}
            for r in rows[:LEDGER_DAY]:
                if r.currency == currency:
                    spent[r.tenant] = spent.get(r.tenant, 0.0) + r.amount
            out.append({"currency": currency, "per_run": b.per_run, "per_root": b.per_root,
                        "per_tenant_day": b.per_tenant_day, "tenants": dict(b.tenants),
                        "spent_today": spent, "partial": len(rows) > LEDGER_DAY})
        return {"in_process": self.in_process,
                "day": time.strftime("%Y-%m-%d", time.gmtime(day)), "budgets": out}

    async def cron(self) -> dict[str, Any]:
        """``{"in_process": bool, "schedules": [{"name", "expression", "workflow", "tz",
        "last_tick", "last_run": {"id", "status"}|None, "next_tick"}]}``: the schedules of the
        App the console was given; ``last_run`` is the run the last tick made (None when it has
        not fired, e.g. a tick missed beyond ``catch_up``, or was pruned)."""
        now = self.app.clock.now()
        out = []
        for name, t in sorted(self.app.cron_triggers.items()):
            last = t.latest_tick(now)
            made = await self.inspection.search_runs(
                self.app.namespace, RunFilter(workflow=t.workflow,
                                              idempotency_key=t.idempotency_key(last)), limit=1)
            out.append({"name": name, "expression": t.expression, "workflow": t.workflow,
                        "tz": str(t.tz), "last_tick": last,
                        "last_run": {"id": made[0].id, "status": made[0].status.value}
                        if made else None,
                        "next_tick": t.next_tick(now)})
        return {"in_process": self.in_process, "schedules": out}

    async def ledger(self, query: Mapping[str, str]) -> dict[str, Any]:
        """A page of the cost ledger: ``spend_dict`` + ``{"next_after": int|None}``; query
        ``tenant``, ``run_id``, ``root_id``, ``after``, ``limit`` (1..1000, default 100)."""
        limit = _int(query, "limit", 100, 1, 1000) or 100
        after = _int(query, "after", None, 0, None)
        rows = await self.app.ledger(tenant=query.get("tenant") or None,
                                     run_id=query.get("run_id") or None,
                                     root_id=query.get("root_id") or None,
                                     after=after, limit=limit + 1)
        page = rows[:limit]
        return spend_dict(page) | {
            "next_after": page[-1].id if len(rows) > limit and page else None}

    # -- actions -------------------------------------------------------------------------------

    def _writable(self) -> None:
        if self.read_only:
            raise Refused(403, "This console is read-only (started with --read-only): no "
                               "action is taken.")

    async def cancel(self, run_id: str) -> dict[str, Any]:
        """``{"run": run_full}``: cancelled at once, or (running) asked of its owner. 409 when
        the run had already ended."""
        self._writable()
        before = await self._get(run_id)
        if before.status.final:
            raise _moved_on(before, "cancel")
        after = await self.app.cancel(run_id)
        if after.status.final and after.status != RunStatus.CANCELLED:
            raise _moved_on(after, "cancel")
        return {"run": run_full(after)}

    async def retry(self, run_id: str) -> dict[str, Any]:
        """``{"run": run_full}`` queued again (``app.retry``). 409 unless failed or
        cancelled."""
        self._writable()
        await self._get(run_id)
        try:
            run = await self.app.retry(run_id)
        except NotRetryableError:
            raise _moved_on(await self._get(run_id), "retry") from None
        return {"run": run_full(run)}

    async def signal(self, run_id: str, body: Any) -> dict[str, Any]:
        """Body ``{"name": str, "payload": JSON}`` -> ``{"run": run_full}``. 409 when the run
        has ended (no one would receive it)."""
        self._writable()
        body = _object(body)
        name = body.get("name")
        if not isinstance(name, str) or not name.strip():
            raise Refused(400, "A signal needs a name: a non-empty string.", "name")
        run = await self._get(run_id)
        if run.status.final:
            raise _moved_on(run, "signal")
        try:
            await self.app.signal(run_id, name, body.get("payload"))
        except (TypeError, ValueError) as e:
            raise Refused(400, str(e), "payload") from None
        return {"run": run_full(await self._get(run_id))}

    async def answer(self, pause_id: str, approved: bool, body: Any) -> dict[str, Any]:
        """Approve or deny a pending pause. Body ``{"by": str, "reason": str|None,
        "data": JSON}`` (``by``, the operator's name, is required) -> ``{"pause": pause}``.
        409 when it was answered or expired meanwhile; 404 when unknown."""
        self._writable()
        body = _object(body)
        by, reason = body.get("by"), body.get("reason")
        if not isinstance(by, str) or not by.strip():
            raise Refused(400, "Who decides? 'by' is the operator's name: a non-empty string.",
                          "by")
        if reason is not None and not isinstance(reason, str):
            raise Refused(400, "'reason' is a string or null.", "reason")
        try:
            pause = await self.app.resume(pause_id, approved=approved, data=body.get("data"),
                                          by=by.strip(), reason=reason or None)
        except UnknownPauseError as e:
            raise Refused(404, str(e)) from None
        except NotPausedError as e:
            raise Refused(409, str(e), current="resolved") from None
        except (TypeError, ValueError) as e:
            raise Refused(400, str(e), "data") from None
        now = self.app.clock.now()
        return {"pause": pause_dict(pause, now)}

    async def redrive(self, entry_id: str) -> dict[str, Any]:
        """``{"entry": outbox_entry}`` made deliverable again. 409 when it is not dead any
        more (redriven meanwhile), 404 when unknown."""
        self._writable()
        try:
            entry = await self.app.redrive(entry_id)
        except UnknownOutboxEntryError as e:
            raise Refused(404, str(e)) from None
        except NotDeadError as e:
            raise Refused(409, str(e)) from None
        return {"entry": outbox_dict(entry)}

    async def _get(self, run_id: str) -> Run:
        try:
            return await self.app.get_run(run_id)
        except UnknownRunError:
            raise Refused(404, f"No run with id {run_id!r} in namespace "
                               f"{self.app.namespace!r}.") from None


_DONE = {"cancel": "cancelled", "retry": "retried", "signal": "signalled"}


def _moved_on(run: Run, action: str) -> Refused:
    """409: the run is not (or no longer) in a status where ``action`` applies."""
    return Refused(409, f"Run {run.id} is {run.status.value} now: it cannot be "
                        f"{_DONE[action]}. Nothing was changed.", current=run.status.value)


# -- input -------------------------------------------------------------------------------------


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise Refused(400, "The request body is a JSON object.", "body")
    return body


def _int(query: Mapping[str, str], name: str, default: int | None, low: int,
         high: int | None) -> int | None:
    text = query.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise Refused(400, f"{name} is an integer, not {text!r}.", name) from None
    if value < low or (high is not None and value > high):
        raise Refused(400, f"{name} is between {low} and {high}, not {value}."
                      if high is not None else f"{name} is at least {low}.", name)
    return value


def _time(query: Mapping[str, str], name: str) -> float | None:
    text = query.get(name)
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise Refused(400, f"{name} is a time in seconds since the epoch, not {text!r}.",
                      name) from None
    if not math.isfinite(value):
        raise Refused(400, f"{name} is a finite number of seconds.", name)
    return value


def parse_run_query(query: Mapping[str, str]) -> tuple[RunFilter, int, str | None]:
    """The filter, page size and cursor of a runs query; :class:`Refused` 400 naming a bad
    parameter."""
    status = query.get("status") or None
    if status is not None and status not in {s.value for s in RunStatus}:
        raise Refused(400, f"Unknown status {status!r}: one of "
                           f"{', '.join(s.value for s in RunStatus)}.", "status")
    where = RunFilter(
        status=status, workflow=query.get("workflow") or None,
        tenant=query.get("tenant") or None,
        created_from=_time(query, "created_from"), created_to=_time(query, "created_to"),
        idempotency_key=query.get("idempotency_key") or None,
        concurrency_key=query.get("concurrency_key") or None)
    limit = _int(query, "limit", PAGE, 1, MAX_PAGE) or PAGE
    return where, limit, query.get("cursor") or None
