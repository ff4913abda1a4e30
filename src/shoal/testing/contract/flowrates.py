"""The contract of rate limits (``claim_runs(flow={workflow: FlowLimits(rate_limit=N,
rate_per=S)})``, ``settle_and_claim``): at most N first starts of a workflow and rate key
(``NewRun.rate_key``) in any window of S seconds, across every claimer, enforced by the store
inside the claim. A run over the limit stays queued and is claimed when the window allows; a
run held back takes no room of the claim's ``limit``; a run that started before (a resumption:
woken, resumed, retried after a failed attempt, recovered) is never held and never counts.

The window ends at the claim's ``now``: a first start at ``s`` counts while ``now - s < S``.

``NewRun.rate_key`` is the key a run's first start counts under; dispatch writes '' (no key)
for a run of a workflow with a rate and no key function, and None for a run of a workflow
without a rate (so that the stores index only the first starts of rated workflows). A run
written with None before its workflow had a rate counts under '' once a claimer with the rate
first starts it; a first start by a claimer without the rate counts in no window.

Subclass :class:`RateLimitContract` and provide the ``store`` and ``other`` fixtures (see
:mod:`shoal.testing.contract`).
"""

from __future__ import annotations

from shoal.ports import Store
from shoal.testing.contract.support import LEASE, NS, T0, add, fence, new_run
from shoal.types import FlowLimits, Run, RunStatus, Settlement, Step


def _rate(limit: int, per: float) -> dict[str, FlowLimits]:
    return {"wf": FlowLimits(rate_limit=limit, rate_per=per)}


async def _claim(store: Store, now: float, flow: dict[str, FlowLimits], limit: int = 10,
                 owner: str = "a") -> list[Run]:
    return await store.claim_runs(NS, ["wf", "other"], owner, limit, LEASE, now, flow=flow)


async def _status(store: Store, run: Run) -> RunStatus:
    got = await store.get_run(run.id)
    assert got is not None
    return got.status


class RateLimitContract:
    """Runs of a workflow with a rate limit: every backend behaves like this."""

    async def test_the_limit_binds_in_one_batch_and_across_claimers(
        self, store: Store, other: Store
    ) -> None:
        rate = _rate(2, 10.0)
        runs = [await add(store, T0 + i * 0.001) for i in range(5)]
        got = await _claim(store, T0 + 1, rate)
        assert [r.id for r in got] == [r.id for r in runs[:2]]
        assert await _claim(other, T0 + 1, rate, owner="b") == []
        assert await _claim(store, T0 + 5, rate) == []
        # the runs over the limit stay queued: not failed, not dropped
        assert [await _status(other, r) for r in runs[2:]] == [RunStatus.QUEUED] * 3
        # a claimer without the rate (another code version) is not held by it
        [free] = await _claim(other, T0 + 5, {}, limit=1, owner="b")
        assert free.id == runs[2].id

    async def test_the_window_slides(self, store: Store, other: Store) -> None:
        rate = _rate(2, 10.0)
        runs = [await add(store, T0 + i * 0.001) for i in range(5)]
        [a] = await _claim(store, T0, rate, limit=1)
        [b] = await _claim(other, T0 + 4, rate, owner="b")
        assert [a.id, b.id] == [runs[0].id, runs[1].id]
        assert await _claim(store, T0 + 9.5, rate) == []
        # a's start leaves the window at T0 + 10, b's at T0 + 14: one start each time
        [c] = await _claim(other, T0 + 10, rate, owner="b")
        assert c.id == runs[2].id
        assert await _claim(store, T0 + 13.5, rate) == []
        [d] = await _claim(store, T0 + 14, rate)
        assert d.id == runs[3].id
        assert await _claim(store, T0 + 19.5, rate) == []
        [e] = await _claim(other, T0 + 20, rate, owner="b")
        assert e.id == runs[4].id

    async def test_each_rate_key_has_a_window_of_its_own(self, store: Store,
                                                         other: Store) -> None:
        rate = _rate(1, 60.0)
        news = [new_run(T0 + i * 0.001, rate_key=key)
                for i, key in enumerate(["x", "x", "y", None, "y", None, "z"])]
        # a batch's rate keys are stored as a single run's are
        runs = [run for run, _ in await store.create_runs(news, max_queued=None,
                                                          admission="reject")]
        got = await _claim(store, T0 + 1, rate)
        assert [r.id for r in got] == [runs[i].id for i in (0, 2, 3, 6)]
        assert await _claim(other, T0 + 2, rate, owner="b") == []
        got = await _claim(other, T0 + 61, rate, owner="b")
        assert [r.id for r in got] == [runs[i].id for i in (1, 4, 5)]

    async def test_a_run_dispatched_before_its_workflow_had_a_rate_counts_without_a_key(
        self, store: Store, other: Store
    ) -> None:
        rate = _rate(2, 60.0)
        before = [await add(store, T0 + i * 0.001) for i in range(3)]       # rate_key None
        after = await add(store, T0 + 0.01, rate_key="")                   # dispatched since
        # a claimer without the rate (the old code) starts one: it counts in no window
        [old] = await _claim(other, T0 + 1, {}, limit=1, owner="b")
        assert old.id == before[0].id
        # a claimer with the rate: the runs without a key and those of '' share one window
        got = await _claim(store, T0 + 2, rate)
        assert [r.id for r in got] == [r.id for r in before[1:]]
        assert await _claim(other, T0 + 3, rate, owner="b") == []
        await store.register_workflows(NS, {"wf": {"rate_limit": {"limit": 2, "per": 60.0}}},
                                       T0 + 3)
        assert await other.hold_reason(after.id, T0 + 3) == "rate_limit"
        assert await other.held_back(NS, T0 + 3) == {"wf": {"rate_limit": 1}}
        # the window moves past their first starts (T0 + 2), not past the old claimer's
        [last] = await _claim(other, T0 + 62, rate, owner="b")
        assert last.id == after.id

    async def test_a_held_workflow_takes_no_room_from_other_workflows(self,
                                                                      store: Store) -> None:
        rate = _rate(2, 10.0)
        held = [await add(store, T0, priority=5) for _ in range(6)]
        behind = [await add(store, T0 + 1, workflow="other") for _ in range(3)]
        got = await _claim(store, T0 + 2, rate, limit=5)
        assert [r.id for r in got] == [*(r.id for r in held[:2]), *(r.id for r in behind)]
        late = await add(store, T0 + 3, workflow="other")
        # four runs of a full window ahead of it in claim order: a claim of one takes it
        [got_late] = await _claim(store, T0 + 3, rate, limit=1)
        assert got_late.id == late.id

    async def test_resumptions_are_never_held_and_never_counted(self, store: Store,
                                                                other: Store) -> None:
        rate = _rate(1, 100.0)
        a = await add(store, T0)
        b = await add(store, T0 + 0.001)
        [a1] = await _claim(store, T0 + 1, rate)
        assert a1.id == a.id
        # a failed attempt's retry starts again at once, though the window is full
        assert await store.settle_run(fence(a1), Settlement("retry", run_at=T0 + 2), T0 + 1.5)
        [a2] = await _claim(other, T0 + 2, rate, owner="b")
        assert a2.id == a.id and a2.started_at == T0 + 1
        # as does a run whose sleep ended
        assert await store.suspend_run(fence(a2), Step(1, "shoal.sleep", {"until": T0 + 3},
                                                       False, 1), "sleeping", T0 + 3, None, T0 + 2)
        [a3] = await _claim(store, T0 + 3, rate)
        assert a3.id == a.id
        assert await _status(store, b) == RunStatus.QUEUED
        # only a's first start counted: it leaves the window at T0 + 101 and b starts
        assert await _claim(other, T0 + 100.5, rate, owner="b") == []
        assert await store.settle_run(fence(a3), Settlement("succeeded"), T0 + 100.6)
        [b1] = await _claim(other, T0 + 101, rate, owner="b")
        assert b1.id == b.id

    async def test_settle_and_claim_keeps_the_rate(self, store: Store) -> None:
        rate = _rate(1, 10.0)
        runs = [await add(store, T0 + i * 0.001) for i in range(3)]
        [a] = await _claim(store, T0 + 1, rate)
        held, got = await store.settle_and_claim(
            [(fence(a), Settlement("succeeded"), T0 + 2)], NS, ["wf"], "a", 10, LEASE, T0 + 2,
            flow=rate)
        assert held == [True] and got == []
        held, got = await store.settle_and_claim([], NS, ["wf"], "a", 10, LEASE, T0 + 11,
                                                 flow=rate)
        assert [r.id for r in got] == [runs[1].id]

    async def test_an_operators_retry_is_a_first_start_held_by_the_rate(
        self, store: Store
    ) -> None:
        rate = _rate(1, 100.0)
        a = await add(store, T0)
        b = await add(store, T0 + 0.001)
        [a1] = await _claim(store, T0 + 1, rate)
        assert a1.id == a.id
        assert await store.settle_run(fence(a1), Settlement("failed", error="boom"), T0 + 2)
        [b1] = await _claim(store, T0 + 101, rate)
        assert b1.id == b.id
        retried, changed = await store.retry_run(NS, a.id, None, T0 + 102)
        assert changed and retried is not None
        # b's start fills the window: a starts again when it leaves it
        assert await _claim(store, T0 + 150, rate) == []
        [a2] = await _claim(store, T0 + 201, rate)
        assert a2.id == a.id and a2.started_at == T0 + 201
