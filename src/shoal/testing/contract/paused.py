"""The contract of paused workflows (:meth:`~shoal.ports.WorkflowRegistry.pause_workflow`): no
claim of any handle starts a run of a paused workflow (of every tenant, or of one), a due sleeper
or waiter included, while runs of other workflows and tenants are claimed as before, even when
the paused ones come first in claim order; running runs go on; resuming makes them claimable.

Subclass :class:`PausedWorkflowContract` and provide the ``store`` and ``other`` fixtures (see
:mod:`shoal.testing.contract`).
"""

from __future__ import annotations

from shoal.ports import Store
from shoal.testing.contract.support import NS, T0, add, claim, fence
from shoal.types import PausedWorkflow, Settlement, Step


class PausedWorkflowContract:
    """``pause_workflow``, ``resume_workflow``, ``paused_workflows`` and the claims they hold
    back."""

    async def test_a_paused_workflows_runs_are_not_claimed_by_any_handle(
        self, store: Store, other: Store
    ) -> None:
        # the paused runs come first in claim order: they must take no room of the limit
        paused = [await add(store, T0, priority=5) for _ in range(3)]
        free = await add(store, T0, workflow="other")
        assert await store.pause_workflow(NS, "wf", None, T0)
        assert [r.id for r in await claim(other, limit=1, now=T0 + 1)] == [free.id]
        assert await claim(store, now=T0 + 2) == []
        assert await other.paused_workflows(NS) == [PausedWorkflow("wf", None, T0)]
        assert await other.paused_workflows("elsewhere") == []
        for run in paused:
            got = await other.get_run(run.id)
            assert got is not None and got.status == "queued"
        # dispatch still queues
        late = await add(other, T0 + 3)
        assert await claim(store, now=T0 + 4) == []
        assert await other.resume_workflow(NS, "wf", None, T0 + 5)
        assert await store.paused_workflows(NS) == []
        claimed = await claim(other, now=T0 + 5)
        assert sorted(r.id for r in claimed) == sorted([*(r.id for r in paused), late.id])

    async def test_a_pause_of_one_tenant_holds_back_that_tenant_only(
        self, store: Store, other: Store
    ) -> None:
        acme = await add(store, T0, tenant="acme")
        plain = await add(store, T0 + 1)
        assert await store.pause_workflow(NS, "wf", "acme", T0 + 2)
        assert [r.id for r in await claim(other, now=T0 + 3)] == [plain.id]
        # a pause of every tenant and one of a tenant are two pauses, resumed apart
        assert await store.pause_workflow(NS, "wf", None, T0 + 4)
        assert await other.paused_workflows(NS) == [
            PausedWorkflow("wf", None, T0 + 4), PausedWorkflow("wf", "acme", T0 + 2)]
        assert await other.resume_workflow(NS, "wf", None, T0 + 5)
        assert await claim(store, now=T0 + 6) == []
        assert await other.resume_workflow(NS, "wf", "acme", T0 + 7)
        assert [r.id for r in await claim(store, now=T0 + 8)] == [acme.id]

    async def test_a_paused_tenants_run_first_of_a_key_does_not_hold_back_another_tenants(
        self, store: Store, other: Store
    ) -> None:
        # the key is shared by both tenants' runs, and the paused tenant's comes first
        held = await add(store, T0, tenant="acme", key="k")
        free = await add(store, T0 + 1, tenant="globex", key="k")
        assert await store.pause_workflow(NS, "wf", "acme", T0 + 2)
        assert [r.id for r in await claim(other, now=T0 + 3)] == [free.id]
        assert await other.resume_workflow(NS, "wf", "acme", T0 + 4)
        assert await claim(store, now=T0 + 5) == []   # the key is held by the run claimed
        got = await store.get_run(held.id)
        assert got is not None and got.status == "queued"

    async def test_pausing_twice_keeps_the_first_and_resuming_nothing_is_a_no_op(
        self, store: Store, other: Store
    ) -> None:
        assert not await store.resume_workflow(NS, "wf", None, T0)
        assert await store.pause_workflow(NS, "wf", None, T0)
        assert not await other.pause_workflow(NS, "wf", None, T0 + 1)
        assert not await other.resume_workflow(NS, "wf", "acme", T0 + 1)
        assert not await other.resume_workflow("elsewhere", "wf", None, T0 + 1)
        assert await store.paused_workflows(NS) == [PausedWorkflow("wf", None, T0)]
        assert await other.resume_workflow(NS, "wf", None, T0 + 2)
        assert not await store.resume_workflow(NS, "wf", None, T0 + 3)
        assert await store.paused_workflows(NS) == []

    async def test_a_due_sleeper_of_a_paused_workflow_does_not_resume(
        self, store: Store, other: Store
    ) -> None:
        run = await add(store, T0)
        [c] = await claim(store, now=T0)
        assert await store.suspend_run(fence(c), Step(1, "shoal.sleep", {}, False, 0),
                                       "sleeping", T0 + 10, None, T0)
        assert await other.pause_workflow(NS, "wf", "default", T0 + 1)
        assert await claim(store, now=T0 + 20) == []
        got = await other.get_run(run.id)
        assert got is not None and got.status == "sleeping"
        assert await other.resume_workflow(NS, "wf", "default", T0 + 21)
        [woke] = await claim(store, now=T0 + 22)
        assert woke.id == run.id and woke.resume_reason == "woke"

    async def test_running_runs_of_a_paused_workflow_go_on(
        self, store: Store, other: Store
    ) -> None:
        await add(store, T0)
        [c] = await claim(store, now=T0)
        assert await other.pause_workflow(NS, "wf", None, T0 + 1)
        renewal = await store.renew_leases("a", {c.id: c.lease_epoch}, 30.0, T0 + 2)
        assert c.id in renewal.renewed
        assert await store.checkpoint_step(fence(c), Step(1, "s", {"ok": 1}, True, 1), 30.0,
                                           T0 + 3)
        assert await store.settle_run(fence(c), Settlement("succeeded", {"ok": 1}), T0 + 4)
        got = await other.get_run(c.id)
        assert got is not None and got.status == "succeeded"
