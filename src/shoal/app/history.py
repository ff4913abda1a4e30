"""Replay before deploy, at the app: ``export`` reads a run's recorded history from the store
(``shoal export RUN_ID``), ``replay`` runs an app's workflow code over one
(``shoal.testing.replay``, ``shoal replay FILE --app MODULE:APP``). The format is
:mod:`shoal.engine.replay`'s."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shoal.app.core import App
from shoal.engine.replay import History, HistoryFormatError, ReplayResult
from shoal.engine.replay import replay as replay_history
from shoal.errors import UnknownWorkflowError
from shoal.ports import GraphCheckpoints


async def export(app: App, run_id: str, *, tenant: str | None = None) -> dict[str, Any]:
    """Run ``run_id``'s recorded history (its row, its checkpoints in order, and the LangGraph
    checkpoints of its thread, oldest first) as the JSON object ``shoal export`` writes. Raises
    ``UnknownRunError``."""
    run = await app.get_run(run_id, tenant=tenant)
    steps = await app.store.load_steps(run_id)
    graph = None
    if isinstance(app.store, GraphCheckpoints):   # run_graph's thread is the run
        found = await app.store.list_graph_checkpoints(run.namespace, run.tenant,
                                                       thread_id=run_id)
        graph = tuple(sorted(found, key=lambda c: (c.checkpoint_ns, c.checkpoint_id)))
    return History(run, tuple(steps), app.clock.now(), graph).to_json()


def read(history: History | Mapping[str, Any] | str | os.PathLike[str]) -> History:
    """A history given as itself, as the JSON object ``export`` makes, or as the path of a file
    holding it; ``HistoryFormatError`` (a ValueError) naming what is wrong."""
    if isinstance(history, History):
        return history
    if isinstance(history, (str, os.PathLike)):
        path = Path(history)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise HistoryFormatError(f"cannot read the history {str(path)!r}: "
                                     f"{e.strerror or e}") from None
        except ValueError as e:
            raise HistoryFormatError(f"{str(path)!r} is not JSON: {e}") from None
        return History.from_json(data)
    return History.from_json(history)


async def replay(app: App,
                 history: History | Mapping[str, Any] | str | os.PathLike[str]) -> ReplayResult:
    """Run ``app``'s code of the history's workflow over the recorded history, writing nothing
    and running no step: each recorded step, sleep, wait, approval and child returns its
    recorded outcome; the replay stops where the history ends. Returns what it found
    (``result.ok``, the first ``result.mismatch``: seq, recorded name, new name). Raises
    ``UnknownWorkflowError`` when ``app`` does not register the workflow."""
    found = read(history)
    workflows = app._registry.workflows
    spec = workflows.get(found.run.workflow)
    if spec is None:
        raise UnknownWorkflowError(found.run.workflow, app.namespace)
    return await replay_history(spec, found, workflows, app.max_payload_bytes)


__all__ = ["History", "HistoryFormatError", "ReplayResult", "export", "read", "replay"]
