"""The contract of concurrency limits: up to N runs of one workflow and concurrency key started
and not ended at once, N given by the claimer (``claim_runs(..., concurrency_limits=)``,
``settle_and_claim``), enforced by the store inside the claim (invariant 4 with N holders).

Subclass :class:`ConcurrencyLimitContract` and provide the ``store`` and ``other`` fixtures (see
:mod:`shoal.testing.contract`).
"""

from __future__ import annotations

from shoal import _ids
from shoal.ports import Store
from shoal.testing.contract.support import LEASE, NS, T0, add, fence
from shoal.types import Run, RunStatus, Settlement, Step

_TWO = {"wf": 2}


async def _claim(store: Store, now: float = T0, limits: dict[str, int] | None = None,
                 limit: int = 10, owner: str = "a") -> list[Run]:
    return await store.claim_runs(NS, ["wf", "other"], owner, limit, LEASE, now,
                                  concurrency_limits=_TWO if limits is None else limits)


class ConcurrencyLimitContract:
    """Runs of a workflow with a concurrency limit N: every backend behaves like this."""

    async def test_n_runs_of_a_key_at_once_and_the_next_when_one_ends(self, store: Store,
                                                                      other: Store) -> None:
        runs = [await add(store, T0 + i, key="k") for i in range(3)]
        # a claim takes one run of a key that has not started: the next claim the second
        [a] = await _claim(store, T0 + 3)
        [b] = await _claim(other, T0 + 3, owner="b")
        assert [a.id, b.id] == [runs[0].id, runs[1].id]
        assert await _claim(store, T0 + 4) == []
        assert await _claim(other, T0 + 4, owner="b") == []
        assert await store.settle_run(fence(a), Settlement("succeeded"), T0 + 5)
        [c] = await _claim(other, T0 + 5, owner="b")
        assert c.id == runs[2].id
        assert await _claim(store, T0 + 6) == []

    async def test_settle_and_claim_keeps_the_limit(self, store: Store) -> None:
        runs = [await add(store, T0 + i, key="k") for i in range(4)]
        [a] = await _claim(store, T0 + 4)
        held, got = await store.settle_and_claim([], NS, ["wf"], "a", 10, LEASE, T0 + 4,
                                                 concurrency_limits=_TWO)
        assert held == [] and [r.id for r in got] == [runs[1].id]
        held, got = await store.settle_and_claim([], NS, ["wf"], "a", 10, LEASE, T0 + 5,
                                                 concurrency_limits=_TWO)
        assert got == []
        held, got = await store.settle_and_claim(
            [(fence(a), Settlement("succeeded"), T0 + 6)], NS, ["wf"], "a", 10, LEASE, T0 + 6,
            concurrency_limits=_TWO)
        assert held == [True]
        # the claim may or may not see the place the settlement freed: the next one does
        got += await _claim(store, T0 + 7)
        assert [r.id for r in got] == [runs[2].id]

    async def test_a_full_key_blocks_no_other_key_or_workflow(self, store: Store) -> None:
        full = [await add(store, T0 + i, key="k", priority=5) for i in range(3)]
        assert len(await _claim(store, T0 + 3)) == 1
        assert len(await _claim(store, T0 + 3)) == 1
        behind = [await add(store, T0 + 4, key="j"), await add(store, T0 + 4),
                  await add(store, T0 + 4, key="k", workflow="other")]
        got = await _claim(store, T0 + 5, limit=3)
        assert {r.id for r in got} == {r.id for r in behind}
        assert (await store.get_run(full[2].id)).status == RunStatus.QUEUED  # type: ignore[union-attr]

    async def test_sleeping_and_waiting_runs_hold_a_place(self, store: Store) -> None:
        runs = [await add(store, T0 + i, key="k") for i in range(3)]
        [a] = await _claim(store, T0 + 3)
        [b] = await _claim(store, T0 + 3)
        assert await store.suspend_run(fence(a), Step(1, "shoal.sleep", {"until": T0 + 50},
                                                      False, 1), "sleeping", T0 + 50, None, T0 + 4)
        got = await store.wait_signal(fence(b), Step(1, "shoal.wait_for:go", {}, False, 0),
                                      "go", None, T0 + 4)
        assert got is not None and got.parked
        assert await _claim(store, T0 + 10) == []
        # both wake together: a run that holds a place is claimed beside another of its key
        await store.send_signal(b.id, "go", None, _ids.new_id(T0 + 50), T0 + 50)
        got_both = await _claim(store, T0 + 50)
        assert {r.id for r in got_both} == {runs[0].id, runs[1].id}
        assert await _claim(store, T0 + 51) == []

    async def test_a_limit_raised_or_lowered_takes_effect_at_the_next_claim(
        self, store: Store
    ) -> None:
        runs = [await add(store, T0 + i, key="k") for i in range(5)]
        [a] = await _claim(store, T0 + 5, limits={})   # a limit of one, as without limits
        assert await _claim(store, T0 + 5, limits={}) == []
        [b] = await _claim(store, T0 + 6)                # raised to 2 (a new deploy)
        [c] = await _claim(store, T0 + 6, limits={"wf": 3})
        assert [a.id, b.id, c.id] == [r.id for r in runs[:3]]
        assert await _claim(store, T0 + 7, limits={"wf": 3}) == []
        # lowered to 2: the three holders keep running, nothing starts until fewer than 2 hold
        assert await store.settle_run(fence(a), Settlement("succeeded"), T0 + 8)
        assert await _claim(store, T0 + 8) == []
        assert await store.settle_run(fence(b), Settlement("succeeded"), T0 + 9)
        [d] = await _claim(store, T0 + 9)
        assert d.id == runs[3].id
        assert await _claim(store, T0 + 9) == []
        # and the slots they left are taken again: no run is stranded
        assert await store.settle_run(fence(c), Settlement("succeeded"), T0 + 10)
        [e] = await _claim(store, T0 + 10)
        assert e.id == runs[4].id
