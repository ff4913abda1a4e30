"""The order of a claim under ``fairness="tenant"`` (:class:`~shoal.types.FlowLimits`), shared by
the memory reference and the SQLite store (the PostgreSQL claim computes the same in SQL:
``postgres/flow.py``).

The rule. Take the due runs in claim order (priority descending, created_at, id). For each
workflow with fairness, its queued runs of one priority keep the places they have in that order,
but are dealt to them in turns: the k-th queued run of tenant ``t`` (k = 0, 1, ..., counted in
``t``'s own claim order, over every priority) scores ``(running + k) / weight``, where
``running`` is how many runs of the workflow and tenant are in ``running`` when the claim starts
and ``weight`` the tenant's (:meth:`~shoal.ports.WorkflowRegistry.set_tenant_weight`, 1 when
unset); the place that FIFO would give to the j-th oldest run goes to the run of j-th lowest
score (ties: the older run, then the smaller id). So the next run is the one of the tenant with
the fewest runs in ``running`` per unit of weight, counting those the claim takes before it, and
a batch interleaves tenants. Sleeping and waiting runs that are due, runs of other priorities and
runs of other workflows keep their places: fairness changes who gets a workflow's places, never
how many places it gets nor where.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from shoal.types import FlowLimits

C = TypeVar("C")


def fair_order(
    candidates: Sequence[C],
    fair: Callable[[C], bool],
    of: Callable[[C], tuple[str, str, int, float, str]],
    running: Mapping[tuple[str, str], int],
    weights: Mapping[str, float],
) -> list[C]:
    """``candidates`` (in claim order) with the queued runs of fair workflows dealt as the
    module says. ``fair(c)``: ``c`` is a queued run of a workflow with fairness; ``of(c)``: its
    (workflow, tenant, priority, created_at, id); ``running``: runs in ``running`` per
    (workflow, tenant); ``weights``: per tenant (1 when missing)."""
    taken: dict[tuple[str, str], int] = {}
    groups: dict[tuple[str, int], list[int]] = {}
    scores: dict[int, tuple[float, float, str]] = {}
    for at, c in enumerate(candidates):
        if not fair(c):
            continue
        workflow, tenant, priority, created_at, run_id = of(c)
        k = taken.get((workflow, tenant), 0)
        taken[(workflow, tenant)] = k + 1
        score = (running.get((workflow, tenant), 0) + k) / weights.get(tenant, 1.0)
        scores[at] = (score, created_at, run_id)
        groups.setdefault((workflow, priority), []).append(at)
    if not groups:
        return list(candidates)
    out = list(candidates)
    for places in groups.values():
        # places are in claim order, which within one priority is (created_at, id)
        for place, at in zip(places, sorted(places, key=scores.__getitem__), strict=True):
            out[place] = candidates[at]
    return out


def fair_workflows(flow: Mapping[str, FlowLimits] | None, workflows: Sequence[str]) -> list[str]:
    """The workflows of ``workflows`` whose ``flow`` limits ask for ``fairness="tenant"``."""
    if not flow:
        return []
    return sorted(w for w in set(workflows)
                  if (limits := flow.get(w)) is not None and limits.fairness == "tenant")
