"""The flow rules a claim enforces (``claim_runs(flow=)``), as the stores that walk their
candidates in Python hold them: the memory reference and SQLite (one writer, so the counts it
reads in its write transaction are exact). A claim builds one :class:`Shares` from the counts
the store read, asks :meth:`Shares.fits` of each candidate in claim order (a candidate that does
not fit is skipped: it takes no room of the claim's limit) and :meth:`Shares.take` of each one
it claims, so that a batch never overshoots. A rule adds its check to both."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from shoal.types import FlowLimits


def capped(flow: Mapping[str, FlowLimits] | None) -> dict[str, FlowLimits]:
    """The workflows of ``flow`` with a ``max_running`` or a ``max_running_per_tenant``."""
    return {w: f for w, f in (flow or {}).items()
            if f.max_running is not None or f.max_running_per_tenant is not None}


class Shares:
    """Runs in ``running`` of each capped workflow (and of each of its tenants), as the claim
    counted them, and the shares the batch takes on top."""

    def __init__(self, flow: Mapping[str, FlowLimits] | None,
                 running: Iterable[tuple[str, str, int]] = ()) -> None:
        """``running``: (workflow, tenant, how many of its runs are in ``running``)."""
        self.caps = capped(flow)
        self.workflows: Counter[str] = Counter()
        self.tenants: Counter[tuple[str, str]] = Counter()
        for workflow, tenant, n in running:
            if workflow not in self.caps:
                continue
            self.workflows[workflow] += n
            self.tenants[(workflow, tenant)] += n

    def fits(self, workflow: str, tenant: str) -> bool:
        """Whether one more run of ``workflow`` and ``tenant`` may be running."""
        f = self.caps.get(workflow)
        if f is None:
            return True
        return ((f.max_running is None or self.workflows[workflow] < f.max_running)
                and (f.max_running_per_tenant is None
                     or self.tenants[(workflow, tenant)] < f.max_running_per_tenant))

    def take(self, workflow: str, tenant: str) -> None:
        """The batch claims a run of ``workflow`` and ``tenant``: it holds a share."""
        if workflow in self.caps:
            self.workflows[workflow] += 1
            self.tenants[(workflow, tenant)] += 1

    def full(self) -> tuple[list[str], list[str]]:
        """The capped workflows with no share left, and the (workflow, tenant) pairs with none
        left, each as ``workflow + "\\x1f" + tenant``: what a scan may skip."""
        workflows = sorted(w for w, f in self.caps.items()
                           if f.max_running is not None and self.workflows[w] >= f.max_running)
        tenants = sorted(f"{w}\x1f{t}" for (w, t), n in self.tenants.items()
                         if (cap := self.caps[w].max_running_per_tenant) is not None and n >= cap)
        return workflows, tenants
