"""What every backend's ``create_runs`` shares: checking a batch, telling its first item of each
idempotency key from the repeats, admission of its new runs, the run a new row is, and the
answers in the batch's order. The stores differ only in how they read and write the rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from shoal import _json
from shoal.errors import AdmissionRejectedError
from shoal.types import NewRun, Run, RunStatus

# (tenant, workflow, idempotency key): what invariant 5 maps to one run, within a namespace
Key = tuple[str, str, str]


def key_of(new: NewRun) -> Key | None:
    return None if new.idempotency_key is None else (
        new.tenant, new.workflow, new.idempotency_key)


def namespace_of(news: Sequence[NewRun]) -> str:
    """The one namespace of a non-empty batch; ``ValueError`` for a batch of several, or with
    an id twice (nothing is stored then)."""
    namespace = news[0].namespace
    if any(n.namespace != namespace for n in news):
        raise ValueError("create_runs takes the runs of one namespace per batch")
    if len({n.id for n in news}) != len(news):
        raise ValueError("create_runs was given one run id twice in a batch")
    return namespace


def firsts(news: Sequence[NewRun], stored: Mapping[Key, Run] | None = None) -> list[int]:
    """The positions of the items that make a new run: those without an idempotency key, and
    the first of each key not in ``stored``, in batch order."""
    seen: set[Key] = set(stored or ())
    out = []
    for i, new in enumerate(news):
        key = key_of(new)
        if key is None:
            out.append(i)
        elif key not in seen:
            seen.add(key)
            out.append(i)
    return out


def held_flags(namespace: str, count: int, queued: int, parked: int, max_queued: int | None,
               admission: str) -> list[bool]:
    """Whether each of ``count`` new runs, in order, is stored held, with ``queued`` runs
    waiting to start and ``parked`` held ones already there. ``"reject"`` raises
    ``AdmissionRejectedError`` unless they all fit; ``"park"`` holds those beyond the room
    (all of them while a run is held, so the held keep their order)."""
    if max_queued is None or count == 0:
        return [False] * count
    room = 0 if parked > 0 else max(0, max_queued - queued)
    if count > room and admission == "reject":
        raise AdmissionRejectedError(namespace, max_queued, batch=count, room=room)
    return [i >= room for i in range(count)]


def queued_run(new: NewRun, held: bool, text: str | None = None) -> Run:
    """The row ``new`` becomes when inserted, as a store reads it back (``text``: its input's
    JSON text as ``shoal._json.dumps`` writes it, when the caller has it already)."""
    run = object.__new__(Run)
    # What Run's generated __init__ does, without its object.__setattr__ per field (the class
    # is frozen): 0.2 us instead of 2.3, for each run of a batch. _QUEUED names every field.
    vars(run).update(
        _QUEUED, id=new.id, namespace=new.namespace, tenant=new.tenant, workflow=new.workflow,
        input=_json.copy(new.input) if text is None else _json.decode(text),
        priority=new.priority, created_at=new.created_at, run_at=new.run_at,
        max_attempts=new.max_attempts, concurrency_key=new.concurrency_key,
        idempotency_key=new.idempotency_key, version=new.version, parent_id=new.parent_id,
        root_id=new.root_id or new.id, held=held, trace_context=new.trace_context)
    return run


# Every field of a run just inserted, as queued_run starts it: queued, never claimed.
_QUEUED: dict[str, object] = {
    **dict.fromkeys(f.name for f in dataclasses.fields(Run)),
    "status": RunStatus.QUEUED, "attempts": 0, "lease_epoch": 0, "cancel_requested": False,
}


def answers(news: Sequence[NewRun], inserted: Mapping[str, Run],
            stored: Mapping[Key, Run]) -> list[tuple[Run, bool]]:
    """Per item, in order: its run and whether this batch inserted it for that item. An item
    not inserted gets the run of its key (stored before, or inserted for an earlier item)."""
    by_key = dict(stored)
    for run in inserted.values():
        if run.idempotency_key is not None:
            by_key.setdefault((run.tenant, run.workflow, run.idempotency_key), run)
    out = []
    for new in news:
        mine = inserted.get(new.id)
        if mine is not None:
            out.append((mine, True))
            continue
        key = key_of(new)
        found = None if key is None else by_key.get(key)
        if found is None:
            raise AssertionError(f"create_runs lost the run of {new.id} (key {key})")
        out.append((found, False))
    return out
