"""Replay before deploy: a run's recorded history (``shoal export``) run through the workflow code
as it is now, with no store and no side effects, to find where new code would take another path
than the runs already in flight took (Temporal's ``Replayer`` is the model).

The history format, version 1 (a JSON object)::

    {"format": "shoal.history", "version": 1, "exported_at": 1767225600.0,
     "run": {"id", "namespace", "tenant", "workflow", "version", "status", "input", "output",
             "error", "attempts", "max_attempts", "priority", "parent_id", "root_id",
             "created_at", "started_at", "finished_at", "lease_epoch"},
     "steps": [{"seq", "name", "output", "finished", "epoch", "started_at", "attempt",
                "retries"}, ...]}

``steps`` are the run's checkpoints in ``seq`` order: steps (their JSON results), and sleeps,
signal waits, approvals, child starts and child results under their ``shoal.*`` names.

``graph`` (optional: absent from histories exported by shoal before it) holds the run's
LangGraph checkpoints (``run_graph``'s thread is the run), oldest first, each as the store keeps
it: ``{"checkpoint_ns", "checkpoint_id", "parent_id", "type", "checkpoint" (base64),
"metadata", "run_id", "created_at", "writes": [{"task_id", "idx", "channel", "type", "value"
(base64), "task_path"}, ...]}``. ``run_graph`` checks them against the current graph in a
replay.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, cast

from shoal import _json
from shoal.clock import SystemClock
from shoal.engine.context import Execution, ReplayStop, RunContext, RunHost
from shoal.engine.runner import WorkflowSpec, typed_input, typed_output
from shoal.telemetry import NOTHING
from shoal.types import Fence, GraphCheckpoint, GraphWrite, Run, RunStatus, Step

FORMAT = "shoal.history"
VERSION = 1

_RUN_FIELDS = ("id", "namespace", "tenant", "workflow", "version", "status", "input", "output",
               "error", "attempts", "max_attempts", "priority", "parent_id", "root_id",
               "created_at", "started_at", "finished_at", "lease_epoch")


class HistoryFormatError(ValueError):
    """A history that is not one ``shoal export`` writes (or of a newer version)."""


@dataclass(frozen=True)
class History:
    """A run's recorded history: the run's row and its checkpoints in ``seq`` order, and its
    LangGraph checkpoints, oldest first (None: not recorded in the history)."""

    run: Run
    steps: tuple[Step, ...]
    exported_at: float | None = None
    graph: tuple[GraphCheckpoint, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        run = {name: getattr(self.run, name) for name in _RUN_FIELDS}
        run["status"] = str(self.run.status)
        data = {"format": FORMAT, "version": VERSION, "exported_at": self.exported_at,
                "run": run, "steps": [asdict(s) for s in self.steps]}
        if self.graph is not None:
            data["graph"] = [_graph_json(c) for c in self.graph]
        return data

    @classmethod
    def from_json(cls, data: object) -> History:
        """The history ``data`` holds; ``HistoryFormatError`` naming what is wrong."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise HistoryFormatError(
                "not a shoal run history: a JSON object with \"format\": \"shoal.history\" is "
                "expected, as `shoal export RUN_ID` writes it")
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version > VERSION:
            raise HistoryFormatError(
                f"history version {version!r}: this shoal reads version {VERSION} and older; "
                f"export it again with this version of shoal, or upgrade shoal")
        run, steps = data.get("run"), data.get("steps")
        if not isinstance(run, Mapping) or not isinstance(steps, list):
            raise HistoryFormatError("a history has a \"run\" object and a \"steps\" list")
        for key in ("id", "workflow"):
            if not isinstance(run.get(key), str) or not run[key]:
                raise HistoryFormatError(f"the history's run has no {key!r}")
        try:
            status = RunStatus(run.get("status", "running"))
        except ValueError:
            raise HistoryFormatError(f"the history's run has an unknown status "
                                     f"{run.get('status')!r}") from None
        graph = data.get("graph")
        if graph is not None and not isinstance(graph, list):
            raise HistoryFormatError("a history's \"graph\" is a list of LangGraph checkpoints")
        return cls(_run(run, status), tuple(_steps(steps)), _number(data.get("exported_at")),
                   None if graph is None else tuple(_graph(run["id"], graph)))


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def _run(row: Mapping[str, Any], status: RunStatus) -> Run:
    run_id = row["id"]
    return Run(
        id=run_id, namespace=str(row.get("namespace", "")), tenant=str(row.get("tenant", "")),
        workflow=row["workflow"], input=row.get("input"), output=row.get("output"),
        error=row.get("error"), status=status, priority=int(row.get("priority") or 0),
        created_at=_number(row.get("created_at")) or 0.0, run_at=None,
        attempts=int(row.get("attempts") or 1), max_attempts=int(row.get("max_attempts") or 1),
        concurrency_key=None, idempotency_key=None, owner=None, lease_expires_at=None,
        lease_epoch=int(row.get("lease_epoch") or 1), cancel_requested=False,
        version=row.get("version"), parent_id=row.get("parent_id"),
        root_id=str(row.get("root_id") or run_id), wait_for=None, held=False,
        started_at=_number(row.get("started_at")), finished_at=_number(row.get("finished_at")))


def _steps(rows: list[Any]) -> list[Step]:
    steps = []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping) or not isinstance(row.get("seq"), int) \
                or not isinstance(row.get("name"), str):
            raise HistoryFormatError(f"step {i} of the history has no int \"seq\" and str "
                                     f"\"name\"")
        steps.append(Step(
            seq=row["seq"], name=row["name"], output=row.get("output"),
            finished=bool(row.get("finished", True)), epoch=int(row.get("epoch") or 1),
            started_at=_number(row.get("started_at")), attempt=row.get("attempt"),
            retries=row.get("retries")))
    return sorted(steps, key=lambda s: s.seq)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _graph_json(c: GraphCheckpoint) -> dict[str, Any]:
    return {"checkpoint_ns": c.checkpoint_ns, "checkpoint_id": c.checkpoint_id,
            "parent_id": c.parent_id, "type": c.type, "checkpoint": _b64(c.checkpoint),
            "metadata": c.metadata, "run_id": c.run_id, "created_at": c.created_at,
            "writes": [{"task_id": w.task_id, "idx": w.idx, "channel": w.channel,
                        "type": w.type, "value": _b64(w.value), "task_path": w.task_path}
                       for w in c.writes]}


def _graph(thread_id: str, rows: list[Any]) -> list[GraphCheckpoint]:
    """The LangGraph checkpoints of a history's ``graph`` list, as the store keeps them."""
    found = []
    for i, row in enumerate(rows):
        try:
            writes = tuple(
                GraphWrite(str(w["task_id"]), int(w["idx"]), str(w["channel"]), str(w["type"]),
                           base64.b64decode(w["value"], validate=True), str(w["task_path"]))
                for w in row.get("writes") or ())
            metadata = row.get("metadata") or {}
            if not isinstance(metadata, dict):
                raise TypeError("metadata")
            found.append(GraphCheckpoint(
                thread_id=thread_id, checkpoint_ns=str(row["checkpoint_ns"]),
                checkpoint_id=str(row["checkpoint_id"]),
                parent_id=None if row.get("parent_id") is None else str(row["parent_id"]),
                type=str(row["type"]),
                checkpoint=base64.b64decode(row["checkpoint"], validate=True),
                metadata=metadata,
                run_id=None if row.get("run_id") is None else str(row["run_id"]),
                created_at=_number(row.get("created_at")) or 0.0, writes=writes))
        except (KeyError, TypeError, ValueError, AttributeError, binascii.Error):
            raise HistoryFormatError(
                f"LangGraph checkpoint {i} of the history's \"graph\" is not one `shoal "
                f"export` writes (checkpoint_ns, checkpoint_id, type, checkpoint in base64, "
                f"writes)") from None
    return found


@dataclass(frozen=True)
class Mismatch:
    """Where the code left the recorded path: at checkpoint ``seq``, recorded as ``recorded``
    (None: the history has no more), the code reached ``new`` (None: it returned). ``detail``
    says what differs when the names are the same: a LangGraph graph whose recorded
    super-steps the current graph would not take."""

    seq: int
    recorded: str | None
    new: str | None
    detail: str | None = None


@dataclass(frozen=True)
class ReplayResult:
    """What a replay found. ``outcome``: ``"ended"`` (the code reached the end of the history
    on the recorded path: an unfinished or unrecorded position), ``"returned"`` (the workflow
    returned where the history ends), ``"raised"`` (it raised ``error``), ``"mismatch"`` (it
    left the recorded path: ``mismatch`` says where). ``ok`` is False for a mismatch, and for
    an exception unless the recorded run failed too. ``replayed``: the recorded checkpoints
    the code went through, of ``steps``. ``unchecked``: what the replay could not check (a
    LangGraph graph whose super-steps the history does not hold), each said in a sentence."""

    run_id: str
    workflow: str
    outcome: str
    ok: bool
    replayed: int
    steps: int
    mismatch: Mismatch | None = None
    error: str | None = None
    unchecked: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "workflow": self.workflow, "ok": self.ok,
                "outcome": self.outcome, "replayed": self.replayed, "steps": self.steps,
                "mismatch": None if self.mismatch is None else asdict(self.mismatch),
                "error": self.error, "unchecked": list(self.unchecked)}

    def __str__(self) -> str:
        text = self._verdict()
        for note in self.unchecked:
            text += f"; NOT CHECKED: {note}"
        return text

    def _verdict(self) -> str:
        head = f"run {self.run_id} ({self.workflow}): "
        if self.mismatch is not None:
            m = self.mismatch
            if m.detail is not None:
                return head + f"nondeterministic at #{m.seq} ({m.recorded!r}): {m.detail}"
            if m.new is None:
                return (head + f"nondeterministic: the workflow returned after "
                        f"{self.replayed} checkpoints, but the history records #{m.seq} as "
                        f"{m.recorded!r}")
            return (head + f"nondeterministic at #{m.seq}: recorded {m.recorded!r}, the code "
                    f"reached {m.new!r}")
        done = f"{self.replayed} of {self.steps} recorded checkpoints replayed"
        if self.outcome == "raised":
            verdict = "as recorded (the run failed)" if self.ok else "the run had not failed"
            return head + f"the workflow raised {self.error} ({verdict}); {done}"
        if self.outcome == "returned":
            return head + f"ok: the workflow returned; {done}"
        return head + f"ok: the code follows the history to its end; {done}"


class _NoStore:
    """The store of a replay: a replay stops before any write, so a call reaching here is
    refused."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"a replay makes no store calls (store.{name})")
        return refused


class _ReplayHost:
    """The :class:`RunHost` of a replay: no store, no telemetry, nothing dispatched."""

    def __init__(self, workflows: Mapping[str, WorkflowSpec], max_payload_bytes: int) -> None:
        self.store = _NoStore()
        self.clock = SystemClock()
        self.lease = 30.0
        self.max_payload_bytes = max_payload_bytes
        self.telemetry = NOTHING
        self.workflows = workflows

    async def spend(self, ctx: RunContext, amount: float, currency: str) -> None:
        return None

    async def start_child(self, parent: Run, workflow: Any, input: Any, key: str,
                          options: dict[str, Any]) -> Run:
        raise RuntimeError("a replay starts no child run")

    def outbox_written(self) -> None:
        return None

    def pause_created(self) -> None:
        return None


async def replay(spec: WorkflowSpec, history: History,
                 workflows: Mapping[str, WorkflowSpec] | None = None,
                 max_payload_bytes: int = _json.MAX_PAYLOAD_BYTES) -> ReplayResult:
    """Run ``spec``'s function over ``history``: each recorded checkpoint returns its recorded
    outcome without running anything; the replay stops, successfully, where the history ends,
    and reports the first position where the code leaves the recorded path."""
    run = history.run
    recorded = {s.seq: s for s in history.steps}
    x = Execution(run=run, fence=Fence(run.id, "replay", run.lease_epoch), steps=recorded,
                  held_until=math.inf, replay_only=True, recorded_graph=history.graph)
    host = _ReplayHost(workflows if workflows is not None else {spec.name: spec},
                       max_payload_bytes)
    x.start()
    ctx = RunContext(cast(RunHost, host), x)
    x.context = ctx

    def result(outcome: str, ok: bool, mismatch: Mismatch | None = None,
               error: str | None = None, replayed: int | None = None) -> ReplayResult:
        return ReplayResult(run.id, run.workflow, outcome, ok,
                            x.seq if replayed is None else replayed, len(recorded), mismatch,
                            error, tuple(x.unchecked))

    try:
        output = await spec.fn(ctx, typed_input(spec, run))
        if output is not None:
            typed_output(spec, output, max_payload_bytes)
        misuse = x.check_code(ended=True)
        if misuse is not None:
            raise misuse
    except ReplayStop as stop:
        if stop.ended:
            return result("ended", True, replayed=stop.seq - 1)
        return result("mismatch", False,
                      Mismatch(stop.seq, stop.recorded, stop.new, stop.detail),
                      replayed=stop.seq - 1)
    except Exception as e:
        return result("raised", run.status == RunStatus.FAILED,
                      error=f"{type(e).__name__}: {e}")
    finally:
        x.detach()
    beyond = sorted(seq for seq in recorded if seq > x.seq)
    if beyond:
        return result("mismatch", False, Mismatch(beyond[0], recorded[beyond[0]].name, None))
    return result("returned", True)
