"""A replay's check of a LangGraph graph against the super-steps its run recorded.

``shoal replay`` returns each recorded ``langgraph`` segment without running the graph, so the
graph's own record (its checkpoints and their pending writes, exported with the run) is what
tells whether the current graph would take the same path. Nothing of the graph runs here: the
check reads the record and the current graph's structure (its nodes and edges). It finds:

- a node the record ran, or routed to (``branch:to:NODE``, a join, a ``Send``), that the
  current graph has no longer (removed, renamed);
- a route the record took from a node that the current graph has no edge for (a static edge
  moved or removed; a conditional edge whose declared destinations no longer hold it);
- a static edge of the current graph that a node the record completed did not take (an edge
  added or moved).

A conditional edge's function is not called (it may call a model): its recorded destination is
checked against the destinations it declares (``path_map``), when it declares them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ormsgpack
from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, StateGraph

from shoal.types import GraphCheckpoint

_SERDE = JsonPlusSerializer()      # run_graph's checkpointer serializes with LangGraph's default
_CONSTRUCTED = (0, 1, 2)           # its msgpack extensions of an object made from arguments
_SPECIAL = frozenset(WRITES_IDX_MAP)   # error, scheduled, interrupt, resume: no state, no route
_NULL_TASK = "00000000-0000-0000-0000-000000000000"   # LangGraph's writes of no task (resume)
_PULL_PATH = "~__pregel_pull, "    # a node's task path: (PULL, node name)
_SEEN_NOT_NODES = frozenset({"__input__", "__interrupt__"})
_BRANCH = "branch:to:"
_SENDS = "__pregel_tasks"
_ERROR = "__error__"


@dataclass
class _Task:
    """A task the record ran from one checkpoint: its node (None: a ``Send``'s task, whose path
    does not name it), the channels it wrote, and whether it completed there."""

    node: str | None
    channels: list[str] = field(default_factory=list)
    sends: list[str] = field(default_factory=list)
    completed: bool = False


class _Edges:
    """The edges of a current ``StateGraph``: where each node goes for sure (static edges, joins)
    and where it may go (plus conditional edges' and ``Command`` destinations declared)."""

    def __init__(self, builder: StateGraph[Any, Any, Any, Any]) -> None:
        self.builder = builder
        self.joins = {f"join:{'+'.join(starts)}:{end}": end
                      for starts, end in builder.waiting_edges}

    def static(self, node: str) -> set[str]:
        b = self.builder
        return ({end for start, end in b.edges if start == node and end != END}
                | {end for starts, end in b.waiting_edges if node in starts and end != END})

    def possible(self, node: str) -> set[str] | None:
        """Every node ``node`` may go to; None when a conditional edge of it declares no
        destinations (it may go anywhere)."""
        targets = self.static(node)
        for branch in self.builder.branches.get(node, {}).values():
            if branch.ends is None:
                return None
            targets |= {end for end in branch.ends.values() if end != END}
        spec = self.builder.nodes.get(node)
        ends = getattr(spec, "ends", None) or ()
        targets |= {end for end in ends if end != END}
        return targets


def graph_changes(graph: Any, recorded: Sequence[GraphCheckpoint]
                  ) -> tuple[str | None, list[str]]:
    """The first way (a sentence naming the super-step, the node and what to do) in which
    ``graph`` would not take the super-steps ``recorded`` (a run's checkpoints, oldest first),
    or None; and, in sentences, what this check could not cover."""
    unchecked: list[str] = []
    root = sorted((c for c in recorded if c.checkpoint_ns == ""), key=lambda c: c.checkpoint_id)
    if len(root) < len(recorded):
        unchecked.append("the super-steps of the graph's subgraphs (only the graph's own are "
                         "checked against it)")
    builder = getattr(graph, "builder", None)
    edges = _Edges(builder) if isinstance(builder, StateGraph) else None
    if edges is None and root:
        unchecked.append("the edges of a graph not built with StateGraph (only the names of "
                         "its nodes are checked)")
    nodes = set(getattr(graph, "nodes", {}))
    seen = {c.checkpoint_id: _loads(c.type, c.checkpoint)["versions_seen"] for c in root}
    child = {c.parent_id: c for c in reversed(root) if c.parent_id is not None}
    sent: dict[str, set[str]] = {}   # by checkpoint: the nodes its tasks sent to (Send)
    for c in root:
        after = child.get(c.checkpoint_id)
        tasks = _tasks(c, seen[c.checkpoint_id], None if after is None
                       else seen[after.checkpoint_id], sent.get(c.parent_id or "", set()))
        sent[c.checkpoint_id] = {node for task in tasks for node in task.sends}
        step = c.metadata.get("step")
        where = "a super-step" if not isinstance(step, int) else f"super-step {step + 1}"
        for task in tasks:
            problem = _task_changes(task, nodes, edges)
            if problem is not None:
                return f"{where}: {problem}", unchecked
    return None, unchecked


def _tasks(c: GraphCheckpoint, seen: dict[str, Any], seen_after: dict[str, Any] | None,
           pushed: set[str]) -> list[_Task]:
    """The tasks the record ran from checkpoint ``c``: those that wrote (named by their
    path), and, when the super-step completed (``seen_after``, the next checkpoint's
    ``versions_seen``), the nodes that saw new versions though they wrote nothing, but for
    those ``pushed`` (sent to by the step before: their tasks, unnamed, are among those that
    wrote)."""
    by_id: dict[str, _Task] = {}
    for w in c.writes:
        if w.task_id == _NULL_TASK:
            continue
        task = by_id.get(w.task_id)
        if task is None:
            node = w.task_path[len(_PULL_PATH):] if w.task_path.startswith(_PULL_PATH) else None
            task = by_id[w.task_id] = _Task(node)
        task.channels.append(w.channel)
        if w.channel == _SENDS:
            packet = _loads(w.type, w.value)    # Send: ("langgraph.types", "Send", [node, …])
            if isinstance(packet, tuple) and len(packet) == 3 and packet[1] == "Send" \
                    and isinstance(packet[2], list) and isinstance(packet[2][0], str):
                task.sends.append(packet[2][0])
    tasks = list(by_id.values())
    for task in tasks:   # a super-step that completed has every one of its tasks completed
        task.completed = seen_after is not None or (
            _ERROR not in task.channels and any(ch not in _SPECIAL for ch in task.channels))
    if seen_after is not None:
        wrote = {t.node for t in tasks}
        tasks += [_Task(name, completed=True) for name, versions in seen_after.items()
                  if name not in _SEEN_NOT_NODES and name not in wrote
                  and name not in pushed and versions != seen.get(name)]
    return tasks


def _loads(type_: str, data: bytes) -> Any:
    """A recorded value as plain data: what LangGraph's serializer stored, with each object
    kept as ``(module, name, arguments)`` and nothing of it constructed (so none of the graph's
    own types is loaded: a replay only reads the record's names)."""
    if type_ != "msgpack":
        return _SERDE.loads_typed((type_, data))
    return ormsgpack.unpackb(data, ext_hook=_shape, option=ormsgpack.OPT_NON_STR_KEYS)


def _shape(code: int, data: bytes) -> Any:
    if code in _CONSTRUCTED:
        return tuple(ormsgpack.unpackb(data, ext_hook=_shape,
                                       option=ormsgpack.OPT_NON_STR_KEYS))
    return None


def _task_changes(task: _Task, nodes: set[str], edges: _Edges | None) -> str | None:
    """How the current graph (``nodes``, ``edges``) differs from what ``task`` recorded."""
    if task.node is not None and task.node not in nodes:
        return (f"the recorded graph ran node {task.node!r}, which the current graph does not "
                f"have (its nodes: {_names(nodes)}): a run that has not passed it would not "
                f"run it; keep the node (under its old name) while such runs are in flight")
    went: set[str] = set(task.sends)
    for channel in task.channels:
        if channel.startswith(_BRANCH):
            went.add(channel[len(_BRANCH):])
        elif channel.startswith("join:"):
            end = None if edges is None else edges.joins.get(channel)
            if end is None and edges is not None:
                return (f"node {task.node!r} took the edge {channel!r}, which the current graph "
                        f"does not have")
            if end is not None:
                went.add(end)
    source = "a node" if task.node is None else f"node {task.node!r}"
    for target in sorted(went):
        if target not in nodes:
            return (f"{source} went on to {target!r}, which the current graph does not have "
                    f"(its nodes: {_names(nodes)}): keep the node while runs that went there "
                    f"are in flight")
    if edges is None or task.node is None:
        return None
    possible = edges.possible(task.node)
    strays = sorted(went - set(task.sends) - (possible if possible is not None else went))
    if strays:
        return (f"node {task.node!r} went on to {_names(strays)}, but the current graph has no "
                f"edge from {task.node!r} there (it goes to {_names(possible or ())}); a node "
                f"that goes there with Command(goto=...) declares it: "
                f"add_node(..., destinations=(...))")
    missed = sorted(edges.static(task.node) - went) if task.completed else []
    if missed:
        return (f"node {task.node!r} went on to {_names(went) if went else 'nothing'}, but "
                f"the current graph has an edge from {task.node!r} to {_names(missed)}, which "
                f"the recorded run did not take: the current graph would route differently")
    return None


def _names(names: Any) -> str:
    listed = sorted(n for n in names if not n.startswith("__"))
    return ", ".join(repr(n) for n in listed) if listed else "none"
