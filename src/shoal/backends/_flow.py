"""The flow rules a claim enforces (``claim_runs(flow=)``), as the stores that walk their
candidates in Python hold them: the memory reference and SQLite (one writer, so the counts it
reads in its write transaction are exact). A claim builds one :class:`Shares` from the counts
the store read, asks :meth:`Shares.fits` of each candidate in claim order (a candidate that does
not fit is skipped: it takes no room of the claim's limit) and :meth:`Shares.take` of each one
it claims, so that a batch never overshoots. A rule adds its check to both:

- ``max_running`` / ``max_running_per_tenant``: the runs in ``running`` of a workflow (of a
  tenant), counted once by the store (every run in ``running`` holds a share, its lease expired
  or not; a sleeping or waiting run holds none, so one that is due again needs one);
- ``rate_limit``: the first starts (``started_at``) of a workflow and rate key after the
  window's start (``now - rate_per``), counted by the store when the claim first meets the
  window (``first_starts``). Only a first start (a run never started, ``started_at`` None: an
  operator's retry clears it) is held by a rate and counts in it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from shoal.types import FlowLimits

# (workflow, rate key): the window of first starts a rate counts
Window = tuple[str, str]


def capped(flow: Mapping[str, FlowLimits] | None) -> dict[str, FlowLimits]:
    """The workflows of ``flow`` with a ``max_running`` or a ``max_running_per_tenant``."""
    return {w: f for w, f in (flow or {}).items()
            if f.max_running is not None or f.max_running_per_tenant is not None}


def rated(flow: Mapping[str, FlowLimits] | None, now: float) -> dict[str, tuple[int, float]]:
    """The workflows of ``flow`` with a ``rate_limit``: the limit and the start of the window
    ending at ``now`` (a first start at ``s`` counts while ``now - s < rate_per``)."""
    return {w: (f.rate_limit, now - f.rate_per) for w, f in (flow or {}).items()
            if f.rate_limit is not None and f.rate_per is not None}


class Shares:
    """Runs in ``running`` of each capped workflow (and of each of its tenants), and first
    starts in each rated workflow's window, as the claim counted them, and what the batch takes
    on top."""

    def __init__(self, flow: Mapping[str, FlowLimits] | None,
                 running: Iterable[tuple[str, str, int]] = (), now: float = 0.0,
                 first_starts: Callable[[str, str | None, float], int] | None = None) -> None:
        """``running``: (workflow, tenant, how many of its runs are in ``running``);
        ``first_starts(workflow, rate_key, since)``: how many of its runs first started after
        ``since`` (needed when ``flow`` has a rate)."""
        self.caps = capped(flow)
        self.rates = rated(flow, now)
        assert first_starts is not None or not self.rates
        self._first_starts = first_starts
        self.workflows: Counter[str] = Counter()
        self.tenants: Counter[tuple[str, str]] = Counter()
        self.starts: dict[Window, int] = {}
        for workflow, tenant, n in running:
            if workflow not in self.caps:
                continue
            self.workflows[workflow] += n
            self.tenants[(workflow, tenant)] += n

    def _window(self, workflow: str, rate_key: str | None, first: bool) -> Window | None:
        """The window a candidate's start counts in, counted; None when no rate holds it."""
        if not first or workflow not in self.rates:
            return None
        window = (workflow, rate_key or "")   # None: dispatched before the rate, counted as ''
        if window not in self.starts:
            assert self._first_starts is not None
            self.starts[window] = self._first_starts(workflow, rate_key,
                                                     self.rates[workflow][1])
        return window

    def fits(self, workflow: str, tenant: str, rate_key: str | None = None,
             first: bool = False) -> bool:
        """Whether one more run of ``workflow`` and ``tenant`` may be running, and (``first``:
        it never started) whether its window of ``rate_key`` has room for its first start."""
        f = self.caps.get(workflow)
        if f is not None and not (
                (f.max_running is None or self.workflows[workflow] < f.max_running)
                and (f.max_running_per_tenant is None
                     or self.tenants[(workflow, tenant)] < f.max_running_per_tenant)):
            return False
        window = self._window(workflow, rate_key, first)
        return window is None or self.starts[window] < self.rates[workflow][0]

    def take(self, workflow: str, tenant: str, rate_key: str | None = None,
             first: bool = False) -> None:
        """The batch claims a run of ``workflow`` and ``tenant``: it holds a share, and a first
        start takes a place of its window."""
        if workflow in self.caps:
            self.workflows[workflow] += 1
            self.tenants[(workflow, tenant)] += 1
        window = self._window(workflow, rate_key, first)
        if window is not None:
            self.starts[window] += 1

    def full(self) -> tuple[list[str], list[str], list[str]]:
        """What a scan may skip: the capped workflows with no share left, the (workflow,
        tenant) pairs with none left, each as ``workflow + "\\x1f" + tenant``, and the windows
        counted with no room left, as ``workflow + "\\x1f" + rate_key`` ('': no key; a rate key
        is never '')."""
        workflows = sorted(w for w, f in self.caps.items()
                           if f.max_running is not None and self.workflows[w] >= f.max_running)
        tenants = sorted(f"{w}\x1f{t}" for (w, t), n in self.tenants.items()
                         if (cap := self.caps[w].max_running_per_tenant) is not None and n >= cap)
        windows = sorted(f"{w}\x1f{k}" for (w, k), n in self.starts.items()
                         if n >= self.rates[w][0])
        return workflows, tenants, windows
