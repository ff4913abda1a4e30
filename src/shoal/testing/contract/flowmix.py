"""The contract of flow rules together: several rules on one workflow (a run starts when every
rule lets it; under fairness, tenants take turns among the runs the other rules let start), and
workflows with different rules served by one claim (each held back by its own rules only, none
taking room of the claim's ``limit`` from the others). The memory store is the reference; every
store must claim exactly what it claims.

Subclass :class:`FlowRulesTogetherContract` and provide the ``store`` and ``other`` fixtures
(see :mod:`shoal.testing.contract`).
"""

from __future__ import annotations

from shoal.ports import Store
from shoal.testing.contract.support import LEASE, NS, T0, add, fence
from shoal.types import FlowLimits, Run, Settlement


async def _ids(runs: list[Run]) -> list[str]:
    return [r.id for r in runs]


class FlowRulesTogetherContract:
    """Flow rules combined: every backend behaves like this."""

    async def test_caps_and_a_rate_on_one_workflow(self, store: Store, other: Store) -> None:
        flow = {"wf": FlowLimits(max_running=3, max_running_per_tenant=2, rate_limit=2,
                                 rate_per=10.0)}
        spec = [("a", "x"), ("a", "x"), ("a", "y"), ("b", "x"), ("b", "x"), ("c", "y")]
        runs = [await add(store, T0 + i * 0.001, tenant=t, rate_key=k)
                for i, (t, k) in enumerate(spec)]
        plain = await add(store, T0 + 0.01, workflow="other")

        async def claim(s: Store, now: float) -> list[str]:
            return await _ids(await s.claim_runs(NS, ["wf", "other"], "a", 10, LEASE, now,
                                                 flow=flow))

        # a's third waits for its tenant's share, b's for key x's window; other is not held
        got = await store.claim_runs(NS, ["wf", "other"], "a", 10, LEASE, T0 + 1, flow=flow)
        assert await _ids(got) == [runs[i].id for i in (0, 1, 5)] + [plain.id]
        assert await store.settle_run(fence(got[0]), Settlement("succeeded"), T0 + 2)
        # a share of a and of the workflow, and room in y's window: a's third starts
        assert await claim(other, T0 + 3) == [runs[2].id]
        # x's window moved on, but the workflow has its three running
        assert await claim(store, T0 + 12) == []
        for run in (got[1], got[2]):
            assert await store.settle_run(fence(run), Settlement("succeeded"), T0 + 12)
        assert await claim(other, T0 + 13) == [runs[3].id, runs[4].id]

    async def test_workflows_with_different_rules_in_one_claim(self, store: Store) -> None:
        flow = {"capped": FlowLimits(max_running=1),
                "rated": FlowLimits(rate_limit=1, rate_per=60.0)}
        names = ["capped", "rated", "capped", "rated", "plain"]
        runs = [await add(store, T0 + i * 0.001, workflow=w) for i, w in enumerate(names)]
        serves = ["capped", "rated", "plain"]
        # the runs each rule holds back take no room: three asked, three claimed
        got = await store.claim_runs(NS, serves, "a", 3, LEASE, T0 + 1, flow=flow)
        assert await _ids(got) == [runs[i].id for i in (0, 1, 4)]
        for run in got:
            assert await store.settle_run(fence(run), Settlement("succeeded"), T0 + 2)
        got = await store.claim_runs(NS, serves, "a", 3, LEASE, T0 + 3, flow=flow)
        assert await _ids(got) == [runs[2].id]   # the rated one waits for its window
        got = await store.claim_runs(NS, serves, "a", 3, LEASE, T0 + 61, flow=flow)
        assert await _ids(got) == [runs[3].id]

    async def test_caps_a_rate_and_fairness_on_one_workflow(self, store: Store,
                                                             other: Store) -> None:
        flow = {"wf": FlowLimits(max_running=3, max_running_per_tenant=2, rate_limit=2,
                                 rate_per=10.0, fairness="tenant")}
        spec = [("a", "x"), ("a", "x"), ("a", "x"), ("a", "x"), ("b", "y"), ("b", "y"),
                ("c", "x")]
        a0, a1, a2, a3, b0, b1, c0 = [await add(store, T0 + i * 0.001, tenant=t, rate_key=k)
                                      for i, (t, k) in enumerate(spec)]

        async def claim(s: Store, now: float) -> list[Run]:
            return await s.claim_runs(NS, ["wf"], "a", 10, LEASE, now, flow=flow)

        # tenants take turns (first come, first served would take a0, a1 and b0)
        first = await claim(store, T0 + 1)
        assert await _ids(first) == [a0.id, b0.id, c0.id]
        assert await store.settle_run(fence(first[0]), Settlement("succeeded"), T0 + 2)
        # a has no run in running, but x's window is full: b's turn
        [b] = await claim(other, T0 + 3)
        assert b.id == b1.id
        # x's window moved on, but the workflow has its three running
        assert await claim(store, T0 + 12) == []
        for run in first[1:]:
            assert await store.settle_run(fence(run), Settlement("succeeded"), T0 + 12)
        # a's two: its tenant's share and x's window both allow two
        assert await _ids(await claim(other, T0 + 13)) == [a1.id, a2.id]
        assert (await store.get_run(a3.id)).status == "queued"  # type: ignore[union-attr]

    async def test_three_workflows_each_with_one_rule_in_one_claim(self, store: Store) -> None:
        flow = {"capped": FlowLimits(max_running=1),
                "rated": FlowLimits(rate_limit=1, rate_per=60.0),
                "fair": FlowLimits(fairness="tenant")}
        spec = [("fair", "a"), ("fair", "a"), ("capped", "a"), ("capped", "a"), ("rated", "a"),
                ("rated", "a"), ("fair", "b")]
        fa0, fa1, c0, c1, r0, r1, fb0 = [await add(store, T0 + i * 0.001, workflow=w, tenant=t)
                                         for i, (w, t) in enumerate(spec)]
        serves = ["capped", "rated", "fair"]
        # b's turn comes before a's second; the capped and rated runs held take no room
        got = await store.claim_runs(NS, serves, "a", 4, LEASE, T0 + 1, flow=flow)
        assert await _ids(got) == [fa0.id, c0.id, r0.id, fb0.id]
        got = await store.claim_runs(NS, serves, "a", 4, LEASE, T0 + 2, flow=flow)
        assert await _ids(got) == [fa1.id]
        for run in await store.list_runs(NS, status="running"):
            assert await store.settle_run(fence(run), Settlement("succeeded"), T0 + 3)
        got = await store.claim_runs(NS, serves, "a", 4, LEASE, T0 + 61, flow=flow)
        assert await _ids(got) == [c1.id, r1.id]
