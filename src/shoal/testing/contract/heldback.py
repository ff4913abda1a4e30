"""The contract of :class:`~shoal.ports.FlowView`: which flow-control rule holds back a
namespace's due queued runs, counted from the rules the workflows table keeps and the store's
runs and pauses, each run under the first rule that holds it, each count capped; and the rule
that holds back one run.

The state is made directly (runs claimed into ``running``, pauses, key holders, first starts
in a window), so the suite does not depend on how a claim enforces each rule.

Subclass :class:`FlowViewContract` and provide the ``store`` and ``other`` fixtures (see
:mod:`shoal.testing.contract`).
"""

from __future__ import annotations

from shoal.ports import Store
from shoal.testing.contract.support import LEASE, NS, T0, add, claim, fence
from shoal.types import Settlement


class FlowViewContract:
    """``held_back`` and ``hold_reason``."""

    async def test_max_running_holds_back_the_due_queued_runs_of_a_full_workflow(
        self, store: Store, other: Store
    ) -> None:
        await store.register_workflows(NS, {"wf": {"max_running": 2}, "other": {}}, T0)
        runs = [await add(store, T0 + i) for i in range(4)]
        later = await add(store, T0, delay=100)          # not due: held by nothing
        await add(store, T0, workflow="other")           # no rule
        a, b = await claim(store, now=T0 + 5, limit=2, workflows=("wf",))
        assert {a.id, b.id} == {runs[0].id, runs[1].id}
        assert await other.held_back(NS, T0 + 6) == {"wf": {"max_running": 2}}
        assert await other.hold_reason(runs[3].id, T0 + 6) == "max_running"
        assert await other.hold_reason(a.id, T0 + 6) is None          # running
        assert await other.hold_reason(later.id, T0 + 6) is None      # not due
        assert await other.hold_reason("no-such-run", T0 + 6) is None
        assert await store.held_back("elsewhere", T0 + 6) == {}
        # a share frees: nothing is held back, the runs wait for a worker only
        assert await store.settle_run(fence(a), Settlement("succeeded"), T0 + 7)
        assert await other.held_back(NS, T0 + 8) == {}
        assert await other.hold_reason(runs[3].id, T0 + 8) is None

    async def test_max_running_per_tenant_holds_back_the_full_tenants_runs_only(
        self, store: Store, other: Store
    ) -> None:
        await store.register_workflows(NS, {"wf": {"max_running_per_tenant": 1}}, T0)
        acme = [await add(store, T0 + i, tenant="acme") for i in range(3)]
        globex = await add(store, T0 + 5, tenant="globex")
        [first] = await claim(store, now=T0 + 6, limit=1)
        assert first.id == acme[0].id
        assert await other.held_back(NS, T0 + 7) == {"wf": {"max_running_per_tenant": 2}}
        assert await other.hold_reason(acme[2].id, T0 + 7) == "max_running_per_tenant"
        assert await other.hold_reason(globex.id, T0 + 7) is None

    async def test_a_paused_run_is_counted_as_paused_before_any_limit(
        self, store: Store, other: Store
    ) -> None:
        await store.register_workflows(NS, {"wf": {"max_running": 1}}, T0)
        await add(store, T0)
        acme = [await add(store, T0 + 1 + i, tenant="acme") for i in range(2)]
        plain = [await add(store, T0 + 3 + i) for i in range(2)]
        await claim(store, now=T0 + 5, limit=1)
        assert await store.pause_workflow(NS, "wf", "acme", T0 + 6)
        assert await other.held_back(NS, T0 + 7) == {"wf": {"paused": 2, "max_running": 2}}
        assert await other.hold_reason(acme[0].id, T0 + 7) == "paused"
        assert await other.hold_reason(plain[0].id, T0 + 7) == "max_running"
        assert await store.pause_workflow(NS, "wf", None, T0 + 8)
        assert await other.held_back(NS, T0 + 9) == {"wf": {"paused": 4}}
        assert await other.hold_reason(plain[1].id, T0 + 9) == "paused"
        # a workflow that is paused but registered by no instance is counted too
        await add(store, T0, workflow="unknown")
        assert await store.pause_workflow(NS, "unknown", None, T0 + 10)
        assert (await other.held_back(NS, T0 + 11))["unknown"] == {"paused": 1}

    async def test_a_key_with_concurrency_limit_holders_holds_back_its_next_runs(
        self, store: Store, other: Store
    ) -> None:
        await store.register_workflows(
            NS, {"wf": {"key_from_input": True, "concurrency_limit": 2}}, T0)
        k = [await add(store, T0 + i, key="k") for i in range(4)]
        j = await add(store, T0 + 5, key="j")
        plain = await add(store, T0 + 6)
        limits = {"wf": 2}
        first = await store.claim_runs(NS, ["wf"], "a", 10, LEASE, T0 + 7,
                                       concurrency_limits=limits)
        assert {r.id for r in first} == {k[0].id, j.id, plain.id}
        [second] = await store.claim_runs(NS, ["wf"], "a", 10, LEASE, T0 + 8,
                                          concurrency_limits=limits)
        assert second.id == k[1].id
        assert await other.held_back(NS, T0 + 9) == {"wf": {"concurrency_limit": 2}}
        assert await other.hold_reason(k[3].id, T0 + 9) == "concurrency_limit"
        # one place frees (the holder ends): the next run of k waits for a worker only
        holder = next(r for r in first if r.id == k[0].id)
        assert await store.settle_run(fence(holder), Settlement("succeeded"), T0 + 10)
        assert await other.held_back(NS, T0 + 11) == {}
        assert await other.hold_reason(k[2].id, T0 + 11) is None

    async def test_a_full_rate_window_holds_back_first_starts_until_it_moves_on(
        self, store: Store, other: Store
    ) -> None:
        await store.register_workflows(
            NS, {"wf": {"rate_limit": {"limit": 2, "per": 60.0}}}, T0)
        # rate_key '': as dispatch writes the runs of a workflow with a rate and no key
        runs = [await add(store, T0 + i, rate_key="") for i in range(4)]
        await claim(store, now=T0 + 10, limit=2)        # two first starts at T0 + 10
        assert await other.held_back(NS, T0 + 20) == {"wf": {"rate_limit": 2}}
        assert await other.hold_reason(runs[2].id, T0 + 20) == "rate_limit"
        # started runs that ended still count until the window has moved past their start
        for r in await other.list_runs(NS, status="running"):
            assert await store.settle_run(fence(r), Settlement("succeeded"), T0 + 30)
        assert await other.held_back(NS, T0 + 69) == {"wf": {"rate_limit": 2}}
        assert await other.held_back(NS, T0 + 71) == {}
        assert await other.hold_reason(runs[2].id, T0 + 71) is None

    async def test_the_rate_window_is_each_rate_keys_own(self, store: Store,
                                                         other: Store) -> None:
        await store.register_workflows(
            NS, {"wf": {"rate_limit": {"limit": 1, "per": 60.0}}}, T0)
        x = [await add(store, T0 + i, rate_key="x") for i in range(3)]
        y = await add(store, T0 + 3, rate_key="y")
        unkeyed = await add(store, T0 + 4)
        claimed = await claim(store, now=T0 + 10, limit=1)   # x's window fills, no other
        assert [r.id for r in claimed] == [x[0].id]
        # x's other two are the rate's; y and the run without a key wait for a worker only
        assert await other.held_back(NS, T0 + 20) == {"wf": {"rate_limit": 2}}
        assert await other.hold_reason(x[1].id, T0 + 20) == "rate_limit"
        assert await other.hold_reason(y.id, T0 + 20) is None
        assert await other.hold_reason(unkeyed.id, T0 + 20) is None
        assert await other.held_back(NS, T0 + 71) == {}

    async def test_each_count_stops_at_the_cap(self, store: Store, other: Store) -> None:
        await store.register_workflows(NS, {"wf": {"max_running": 1}}, T0)
        for i in range(6):
            await add(store, T0 + i)
        await claim(store, now=T0 + 10, limit=1)
        assert await other.held_back(NS, T0 + 11, cap=3) == {"wf": {"max_running": 3}}
        assert await other.held_back(NS, T0 + 11) == {"wf": {"max_running": 5}}
