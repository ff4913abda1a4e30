"""The contract of flow rules together: several rules on one workflow (a run starts when every
rule lets it), and workflows with different rules served by one claim (each held back by its
own rules only, none taking room of the claim's ``limit`` from the others). The memory store is
the reference; every store must claim exactly what it claims.

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
