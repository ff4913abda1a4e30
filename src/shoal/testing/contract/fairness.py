"""The contract of tenant fairness (``claim_runs(flow=...)`` with ``fairness="tenant"``, and
:meth:`~shoal.ports.WorkflowRegistry.set_tenant_weight`): among the due queued runs of one
priority of such a workflow, the claim deals places to tenants in turns, the next to the tenant
with the fewest runs of the workflow in ``running`` per unit of weight (counting those the claim
takes before it; ties: the older run), so that one batch interleaves tenants, a tenant with one
run behind another's large backlog starts within a couple of claims, priorities still come
first, paused tenants are skipped and other workflows keep their places.

Subclass :class:`FairnessContract` and provide the ``store`` and ``other`` fixtures (see
:mod:`shoal.testing.contract`). ``BACKLOG`` is the size of the large backlog (100,000).
"""

from __future__ import annotations

from shoal.ports import Store
from shoal.testing.contract.support import LEASE, NS, T0, add, new_run
from shoal.types import FlowLimits, Run

FAIR = {"wf": FlowLimits(fairness="tenant")}


async def fair_claim(store: Store, now: float, limit: int = 10, owner: str = "a",
                     workflows: tuple[str, ...] = ("wf", "other")) -> list[Run]:
    """Claim with ``wf`` under ``fairness="tenant"`` (``other`` has no flow rule)."""
    return await store.claim_runs(NS, list(workflows), owner, limit, LEASE, now, flow=FAIR)


def tenants(runs: list[Run]) -> list[str]:
    return sorted(r.tenant for r in runs)


class FairnessContract:
    """``fairness="tenant"`` in the claim, and the stored tenant weights."""

    BACKLOG = 100_000

    async def test_one_batch_interleaves_tenants_where_fifo_takes_the_oldest(
        self, store: Store, other: Store
    ) -> None:
        for workflow in ("other", "wf"):   # the same runs for a workflow without the rule
            for i in range(6):
                await add(store, T0 + i, tenant="acme", workflow=workflow)
            for i in range(3):
                await add(store, T0 + 10 + i, tenant="bo", workflow=workflow)
        fifo = await fair_claim(other, T0 + 20, limit=4, workflows=("other",))
        assert tenants(fifo) == ["acme"] * 4
        got = await fair_claim(store, T0 + 21, limit=4, workflows=("wf",))
        assert tenants(got) == ["acme", "acme", "bo", "bo"]
        # each tenant's runs are its oldest
        assert max(r.created_at for r in got if r.tenant == "acme") == T0 + 1
        assert max(r.created_at for r in got if r.tenant == "bo") == T0 + 11

    async def test_claims_take_turns_by_the_runs_each_tenant_has_running(
        self, store: Store, other: Store
    ) -> None:
        for i in range(5):
            await add(store, T0 + i, tenant="acme")
        for i in range(5):
            await add(store, T0 + 10 + i, tenant="bo")
        seen = []
        for i, handle in enumerate([store, other] * 3):   # two claimers, one run each time
            [run] = await fair_claim(handle, T0 + 20 + i, limit=1, owner=f"o{i % 2}")
            seen.append(run.tenant)
        # ties (as many running) go to the older run: acme's
        assert seen == ["acme", "bo", "acme", "bo", "acme", "bo"]
        # a tenant arriving late has none running: it goes next
        late = await add(store, T0 + 30, tenant="cy")
        [run] = await fair_claim(other, T0 + 31, limit=1)
        assert run.id == late.id

    async def test_a_weight_gives_a_tenant_that_many_turns_and_is_shared(
        self, store: Store, other: Store
    ) -> None:
        assert await store.tenant_weights(NS) == {}
        await store.set_tenant_weight(NS, "acme", 3)
        await store.set_tenant_weight("elsewhere", "bo", 5)
        assert await other.tenant_weights(NS) == {"acme": 3.0}
        for i in range(10):
            await add(store, T0 + 20 + i, tenant="acme")
        for i in range(10):
            await add(store, T0 + i, tenant="bo")   # bo's are older
        got = await fair_claim(other, T0 + 40, limit=8)
        # scores acme 0, 1/3, 2/3, 1, 4/3, 5/3; bo 0, 1: bo's older runs win the ties
        assert tenants(got) == ["acme"] * 6 + ["bo"] * 2
        # 1 is the default: stored as no weight
        await other.set_tenant_weight(NS, "acme", 1)
        assert await store.tenant_weights(NS) == {}
        await other.set_tenant_weight(NS, "bo", 0.5)
        assert await store.tenant_weights(NS) == {"bo": 0.5}

    async def test_a_lone_run_behind_a_large_backlog_starts_within_two_claims(
        self, store: Store, other: Store
    ) -> None:
        batch = 5_000
        for start in range(0, self.BACKLOG, batch):
            news = [new_run(T0 + (start + i) * 1e-4, tenant="big")
                    for i in range(min(batch, self.BACKLOG - start))]
            await store.create_runs(news, max_queued=None, admission="reject")
        lone = await add(store, T0 + 20, tenant="small")
        claims = 0
        found = False
        while not found:
            claims += 1
            assert claims <= 2, "the lone run did not start within two claims"
            found = any(r.id == lone.id for r in await fair_claim(
                (store, other)[claims % 2], T0 + 30 + claims, limit=1))
        # and in a batch of 16 behind it, at once
        late = await add(store, T0 + 40, tenant="late")
        got = await fair_claim(other, T0 + 41, limit=16)
        assert late.id in {r.id for r in got} and len(got) == 16

    async def test_a_batch_goes_to_the_tenants_with_fewest_running_among_many(
        self, store: Store, other: Store
    ) -> None:
        for j in range(3):
            news = [new_run(T0 + j * 100 + i, tenant=f"t{i:02d}") for i in range(40)]
            await store.create_runs(news, max_queued=None, admission="reject")
        first = await fair_claim(store, T0 + 400, limit=20)
        assert tenants(first) == [f"t{i:02d}" for i in range(20)]   # one each, oldest first
        got = await fair_claim(other, T0 + 401, limit=4)
        assert tenants(got) == ["t20", "t21", "t22", "t23"]
        assert all(r.created_at < T0 + 100 for r in got)   # each one's oldest

    async def test_priorities_still_come_first(self, store: Store, other: Store) -> None:
        for i in range(3):
            await add(store, T0 + i, tenant="acme")
        assert len(await fair_claim(store, T0 + 5, limit=3)) == 3   # acme has three running
        low = await add(store, T0 + 6, tenant="bo")
        high = await add(store, T0 + 7, tenant="acme", priority=5)
        got = await fair_claim(other, T0 + 8, limit=1)
        assert [r.id for r in got] == [high.id]
        assert [r.id for r in await fair_claim(other, T0 + 9, limit=1)] == [low.id]

    async def test_other_workflows_keep_their_places_and_their_fifo(
        self, store: Store, other: Store
    ) -> None:
        plain = [await add(store, T0 + i, tenant="acme", workflow="other") for i in range(3)]
        await add(store, T0 + 3, tenant="bo", workflow="other")
        fair = [await add(store, T0 + 10 + i, tenant="acme") for i in range(2)]
        bo = await add(store, T0 + 12, tenant="bo")
        late = await add(store, T0 + 13, tenant="acme", workflow="other")
        # FIFO over both workflows gives the first four places to `other` (its four oldest
        # runs) and the next two to wf: fairness keeps that, and deals wf's two to its tenants
        got = await fair_claim(store, T0 + 20, limit=6)
        ids = {r.id for r in got}
        assert {r.id for r in plain} <= ids and late.id not in ids
        assert [r.tenant for r in got if r.workflow == "other"].count("bo") == 1
        # wf got two places, dealt one to each tenant
        assert sorted(r.id for r in got if r.workflow == "wf") == sorted([fair[0].id, bo.id])

    async def test_a_paused_tenant_is_skipped(self, store: Store, other: Store) -> None:
        for i in range(3):
            await add(store, T0 + i, tenant="acme")
        bo = [await add(store, T0 + 10 + i, tenant="bo") for i in range(2)]
        assert await other.pause_workflow(NS, "wf", "acme", T0 + 15)
        got = await fair_claim(store, T0 + 20, limit=3)
        assert sorted(r.id for r in got) == sorted(r.id for r in bo)
        assert await other.resume_workflow(NS, "wf", "acme", T0 + 21)
        assert tenants(await fair_claim(store, T0 + 22, limit=3)) == ["acme"] * 3

    async def test_a_batch_takes_one_run_of_a_free_key_under_fairness(
        self, store: Store, other: Store
    ) -> None:
        first = await add(store, T0, tenant="acme", key="k")
        await add(store, T0 + 1, tenant="bo", key="k")
        await add(store, T0 + 2, tenant="bo", key="k")
        got = await fair_claim(store, T0 + 5, limit=10)
        assert [r.id for r in got] == [first.id]
        assert await fair_claim(other, T0 + 6, limit=10) == []

