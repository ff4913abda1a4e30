"""The counts :mod:`shoal.backends._held` asks of the memory store, over its runs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from shoal.types import KEY_HOLDING_STATUSES, Run, RunStatus


class MemoryHoldCounts:
    """:class:`~shoal.backends._held.HoldCounts` over ``runs`` (a function giving a
    namespace's runs as they are now)."""

    def __init__(self, runs: Callable[[str], Iterable[Run]],
                 rate_keys: Mapping[str, str] | None = None) -> None:
        """``rate_keys``: run id -> its rate key (the runs without one left out)."""
        self._runs = runs
        self._rate_keys = rate_keys or {}

    async def running_counts(
        self, namespace: str, workflows: Sequence[str]
    ) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for r in self._runs(namespace):
            if r.status == RunStatus.RUNNING and r.workflow in workflows:
                out[(r.workflow, r.tenant)] = out.get((r.workflow, r.tenant), 0) + 1
        return out

    async def first_starts(self, namespace: str, workflow: str, rate_key: str | None,
                           since: float, limit: int) -> int:
        return min(limit, self._starts(list(self._runs(namespace)), workflow, rate_key, since))

    def _starts(self, runs: Iterable[Run], workflow: str, rate_key: str | None,
                since: float) -> int:
        keys = self._rate_keys
        return sum(1 for r in runs
                   if r.workflow == workflow and r.started_at is not None
                   and r.started_at > since and keys.get(r.id) == (rate_key or ""))

    async def rate_key(self, namespace: str, run_id: str) -> str | None:
        return self._rate_keys.get(run_id)

    async def count_due(
        self, namespace: str, workflow: str, now: float, cap: int, *,
        tenants: Sequence[str] | None = None, skip: Sequence[str] = (),
        first_only: bool = False, key_limit: int | None = None,
        rate: tuple[int, float] | None = None, rate_full: bool = True,
    ) -> int:
        runs = list(self._runs(namespace))
        n = 0
        for r in runs:
            if (r.workflow != workflow or r.status != RunStatus.QUEUED or r.held
                    or r.run_at is None or r.run_at > now
                    or (tenants is not None and r.tenant not in tenants) or r.tenant in skip
                    or ((first_only or key_limit is not None or rate is not None)
                        and r.started_at is not None)):
                continue
            if key_limit is not None and (r.concurrency_key is None or _holders(
                    runs, workflow, r.concurrency_key) < key_limit):
                continue
            if rate is not None and (self._starts(runs, workflow, self._rate_keys.get(r.id),
                                                  rate[1]) >= rate[0]) != rate_full:
                continue
            n += 1
            if n == cap:
                break
        return n

    async def key_holders(self, namespace: str, workflow: str, key: str, cap: int) -> int:
        return min(cap, _holders(list(self._runs(namespace)), workflow, key))


def _holders(runs: Iterable[Run], workflow: str, key: str) -> int:
    return sum(1 for o in runs
               if o.workflow == workflow and o.concurrency_key == key
               and o.started_at is not None
               and (o.status in KEY_HOLDING_STATUSES or o.status == RunStatus.QUEUED))
