"""The contract of running caps: at most ``max_running`` runs of a workflow in ``running`` at
once, and at most ``max_running_per_tenant`` of one tenant's, N given by the claimer
(``claim_runs(..., flow={workflow: FlowLimits(...)})``, ``settle_and_claim``), enforced by the
store inside the claim, across every handle. A sleeping or waiting run holds no share, so one
that becomes due needs a share to resume; a run whose lease expired holds its share until it is
recovered; a run held back by a cap takes no room of the claim's ``limit``.

Subclass :class:`RunningCapContract` and provide the ``store`` and ``other`` fixtures (see
:mod:`shoal.testing.contract`).
"""

from __future__ import annotations

from shoal import _ids
from shoal.ports import Store
from shoal.testing.contract.support import LEASE, NS, T0, add, fence
from shoal.types import FlowLimits, Run, RunStatus, Settlement, Step

_THREE = {"wf": FlowLimits(max_running=3)}


async def _claim(store: Store, now: float = T0, flow: dict[str, FlowLimits] | None = None,
                 limit: int = 10, owner: str = "a") -> list[Run]:
    return await store.claim_runs(NS, ["wf", "other"], owner, limit, LEASE, now,
                                  flow=_THREE if flow is None else flow)


async def _running(store: Store, runs: list[Run]) -> list[Run]:
    got = [await store.get_run(r.id) for r in runs]
    return [r for r in got if r is not None and r.status == RunStatus.RUNNING]


async def _status(store: Store, run: Run) -> str:
    got = await store.get_run(run.id)
    assert got is not None
    return got.status


class RunningCapContract:
    """Runs of a workflow with ``max_running`` / ``max_running_per_tenant``: every backend
    behaves like this."""

    async def test_the_cap_binds_within_a_batch_and_across_claimers(
        self, store: Store, other: Store
    ) -> None:
        runs = [await add(store, T0 + i * 0.001) for i in range(6)]
        first = await _claim(store, T0 + 1, limit=2)
        assert [r.id for r in first] == [r.id for r in runs[:2]]
        # the batch stops at the cap: 2 running + 1, not the 4 it asks for
        second = await _claim(other, T0 + 1, limit=4, owner="b")
        assert [r.id for r in second] == [runs[2].id]
        assert await _claim(store, T0 + 2) == []
        assert await _claim(other, T0 + 2, owner="b") == []
        assert len(await _running(store, runs)) == 3
        # a share freed: exactly one more starts, the next in claim order
        assert await store.settle_run(fence(first[0]), Settlement("succeeded"), T0 + 3)
        [nxt] = await _claim(other, T0 + 4, owner="b")
        assert nxt.id == runs[3].id
        assert await _claim(store, T0 + 4) == []
        assert len(await _running(other, runs)) == 3

    async def test_settle_and_claim_keeps_the_cap(self, store: Store) -> None:
        runs = [await add(store, T0 + i * 0.001) for i in range(5)]
        held, got = await store.settle_and_claim([], NS, ["wf"], "a", 10, LEASE, T0 + 1,
                                                 flow=_THREE)
        assert held == [] and [r.id for r in got] == [r.id for r in runs[:3]]
        held, more = await store.settle_and_claim(
            [(fence(got[0]), Settlement("succeeded"), T0 + 2)], NS, ["wf"], "a", 10, LEASE,
            T0 + 2, flow=_THREE)
        assert held == [True]
        # the claim may or may not see the share the settlement freed: the next one does
        more += await _claim(store, T0 + 3)
        assert [r.id for r in more] == [runs[3].id]
        assert len(await _running(store, runs)) == 3

    async def test_workflows_left_out_of_flow_are_not_capped(self, store: Store) -> None:
        for i in range(4):
            await add(store, T0 + i * 0.001, workflow="other")
        capped = [await add(store, T0 + 1 + i * 0.001) for i in range(4)]
        got = await _claim(store, T0 + 2, flow={"wf": FlowLimits(max_running=1)})
        assert sorted(r.workflow for r in got) == ["other"] * 4 + ["wf"]
        assert [r.id for r in got if r.workflow == "wf"] == [capped[0].id]

    async def test_a_full_workflow_takes_no_room_of_the_limit(
        self, store: Store, other: Store
    ) -> None:
        # the capped runs come first in claim order, many of them
        capped = [await add(store, T0 + i * 0.001, priority=5) for i in range(12)]
        assert len(await _claim(store, T0 + 1, limit=3)) == 3
        behind = [await add(store, T0 + 2 + i * 0.001, workflow="other") for i in range(3)]
        got = await _claim(other, T0 + 3, limit=3, owner="b")
        assert [r.id for r in got] == [r.id for r in behind]
        # nor does the part of a batch past the cap: one share left, then the others
        assert await store.settle_run(fence((await _running(store, capped))[0]),
                                      Settlement("succeeded"), T0 + 4)
        more = [await add(store, T0 + 5 + i * 0.001, workflow="other") for i in range(3)]
        got = await _claim(other, T0 + 6, limit=4, owner="b")
        assert [r.id for r in got] == [capped[3].id, *(r.id for r in more)]

    async def test_a_batch_filling_a_workflow_leaves_the_rest_to_the_runs_behind(
        self, store: Store
    ) -> None:
        # far more runs of the capped workflow ahead than a claim would scan for its limit
        capped = [await add(store, T0 + i * 0.001, priority=5) for i in range(80)]
        behind = [await add(store, T0 + 1 + i * 0.001, workflow="other") for i in range(3)]
        got = await _claim(store, T0 + 2, {"wf": FlowLimits(max_running=1)}, limit=3)
        assert [r.id for r in got] == [capped[0].id, behind[0].id, behind[1].id]
        got = await _claim(store, T0 + 2, {"wf": FlowLimits(max_running_per_tenant=2)},
                           limit=3)
        assert [r.id for r in got] == [capped[1].id, behind[2].id]

    async def test_sleeping_and_waiting_runs_hold_no_share_and_need_one_to_resume(
        self, store: Store, other: Store
    ) -> None:
        runs = [await add(store, T0 + i * 0.001) for i in range(5)]
        flow = {"wf": FlowLimits(max_running=2)}
        a, b = await _claim(store, T0 + 1, flow)
        assert await store.suspend_run(fence(a), Step(1, "shoal.sleep", {"until": T0 + 50},
                                                      False, 1), "sleeping", T0 + 50, None, T0 + 2)
        parked = await store.wait_signal(fence(b), Step(1, "shoal.wait_for:go", {}, False, 0),
                                         "go", None, T0 + 2)
        assert parked is not None and parked.parked
        # both hold no share: two more start
        c, d = await _claim(other, T0 + 3, flow, owner="b")
        assert [c.id, d.id] == [runs[2].id, runs[3].id]
        # the sleeper is due and the waiter signalled, but no share is free: they stay
        await store.send_signal(b.id, "go", None, _ids.new_id(T0 + 50), T0 + 50)
        assert await _claim(store, T0 + 51, flow) == []
        assert await _status(other, a) == "sleeping"
        assert await _status(other, b) == "waiting"
        # a share frees: the first in claim order of the due ones resumes, then the next
        assert await store.settle_run(fence(c), Settlement("succeeded"), T0 + 52)
        [woke] = await _claim(other, T0 + 53, flow, owner="b")
        assert woke.id == a.id and woke.resume_reason == "woke"
        assert await _claim(store, T0 + 53, flow) == []
        assert await store.settle_run(fence(d), Settlement("succeeded"), T0 + 54)
        [resumed] = await _claim(store, T0 + 55, flow)
        assert resumed.id == b.id and resumed.resume_reason == "resumed"
        assert await _status(other, runs[4]) == "queued"

    async def test_per_tenant_caps_are_per_tenant(self, store: Store, other: Store) -> None:
        flow = {"wf": FlowLimits(max_running_per_tenant=2)}
        acme = [await add(store, T0 + i * 0.001, tenant="acme") for i in range(4)]
        globex = [await add(store, T0 + 1 + i * 0.001, tenant="globex") for i in range(3)]
        got = await _claim(store, T0 + 2, flow, limit=3)
        # acme's third takes no room: globex's first runs in the batch
        assert [r.id for r in got] == [acme[0].id, acme[1].id, globex[0].id]
        got = await _claim(other, T0 + 2, flow, owner="b")
        assert [r.id for r in got] == [globex[1].id]
        assert await _claim(store, T0 + 3, flow) == []
        assert await store.settle_run(fence(got[0]), Settlement("succeeded"), T0 + 4)
        [nxt] = await _claim(other, T0 + 5, flow, owner="b")
        assert nxt.id == globex[2].id

    async def test_a_workflow_cap_and_a_tenant_cap_together(self, store: Store) -> None:
        flow = {"wf": FlowLimits(max_running=3, max_running_per_tenant=2)}
        acme = [await add(store, T0 + i * 0.001, tenant="acme") for i in range(3)]
        globex = [await add(store, T0 + 1 + i * 0.001, tenant="globex") for i in range(3)]
        other = await add(store, T0 + 2, workflow="other")
        got = await _claim(store, T0 + 3, flow)
        assert [r.id for r in got] == [acme[0].id, acme[1].id, globex[0].id, other.id]
        assert await _claim(store, T0 + 4, flow) == []

    async def test_an_expired_lease_holds_its_share_until_recovered(
        self, store: Store, other: Store
    ) -> None:
        runs = [await add(store, T0 + i * 0.001) for i in range(3)]
        flow = {"wf": FlowLimits(max_running=1)}
        [a] = await _claim(store, T0 + 1, flow)
        # the owner died: its lease has run out, but the run is still `running`
        late = T0 + 1 + LEASE + 5
        assert await _claim(other, late, flow, owner="b") == []
        assert [r.id for r in await other.recover_runs(NS, late)] == [a.id]
        [again] = await _claim(other, late + 1, flow, owner="b")
        assert again.id == a.id and again.resume_reason == "recovered"
        assert await _status(store, runs[1]) == "queued"

    async def test_a_run_held_by_the_cap_does_not_take_its_keys_place(self, store: Store) -> None:
        flow = {"wf": FlowLimits(max_running_per_tenant=1)}
        first = await add(store, T0, tenant="acme")
        held = await add(store, T0 + 1, tenant="acme", key="k")
        free = await add(store, T0 + 2, tenant="globex", key="k")
        got = await _claim(store, T0 + 3, flow)
        assert [r.id for r in got] == [first.id, free.id]
        assert await _status(store, held) == "queued"

    async def test_a_cap_changed_by_a_deploy_takes_effect_at_the_next_claim(
        self, store: Store
    ) -> None:
        runs = [await add(store, T0 + i * 0.001) for i in range(6)]
        got = await _claim(store, T0 + 1, {"wf": FlowLimits(max_running=2)})
        assert len(got) == 2
        got += await _claim(store, T0 + 2, {"wf": FlowLimits(max_running=4)})   # raised
        assert [r.id for r in got] == [r.id for r in runs[:4]]
        # lowered to 2: the four running go on, nothing starts until fewer than 2 run
        for r in got[:2]:
            assert await store.settle_run(fence(r), Settlement("succeeded"), T0 + 3)
        assert await _claim(store, T0 + 4, {"wf": FlowLimits(max_running=2)}) == []
        assert await store.settle_run(fence(got[2]), Settlement("succeeded"), T0 + 5)
        [e] = await _claim(store, T0 + 6, {"wf": FlowLimits(max_running=2)})
        assert e.id == runs[4].id
        # no cap at all (a deploy without it): the rest starts, nothing is stranded
        [f] = await _claim(store, T0 + 7, {})
        assert f.id == runs[5].id
