"""The contract of a run's progress (:meth:`~shoal.ports.Checkpoints.record_progress`): the
latest value only, kept with the run and read back by every read of it; fenced like every write of
a running run, so a stale execution never overwrites the current one's; left as it is when the run
yields, ends, is retried or recovered (only a new report replaces it).

Subclass :class:`ProgressContract` and provide the ``store`` and ``other`` fixtures (see
:mod:`shoal.testing.contract`).
"""

from __future__ import annotations

from shoal.ports import Store
from shoal.testing.contract.support import LEASE, NS, T0, add, claim, fence
from shoal.types import Fence, Progress, RunFilter, Settlement, Step

HALF = Progress(0.5, "half way", {"rows": 500, "of": [1, 2.5, None], "name": "ünï ✓"}, T0 + 1)


class ProgressContract:
    """``record_progress`` and ``Run.progress``."""

    async def test_the_latest_progress_is_read_with_the_run(
        self, store: Store, other: Store
    ) -> None:
        run = await add(store, T0)
        assert run.progress is None
        assert (await other.get_run(run.id)).progress is None   # type: ignore[union-attr]
        [r] = await claim(store, now=T0)
        assert r.progress is None
        assert await store.record_progress(fence(r), HALF)
        for read in (await other.get_run(run.id),
                     *(await other.list_runs(NS)),
                     *(await other.search_runs(NS, RunFilter())),
                     (await other.inspect_run(run.id)).run):   # type: ignore[union-attr]
            assert read is not None and read.progress == HALF
        later = Progress(None, None, {}, T0 + 2)
        assert await store.record_progress(fence(r), later)
        got = await other.get_run(run.id)
        assert got is not None and got.progress == later    # the latest only: nothing merged
        assert got.status == "running" and got.lease_expires_at == r.lease_expires_at

    async def test_a_stale_execution_cannot_write_progress(
        self, store: Store, other: Store
    ) -> None:
        run = await add(store, T0)
        [first] = await claim(store, "a", T0)
        assert await store.record_progress(fence(first), HALF)
        assert await store.recover_runs(NS, T0 + LEASE + 1)      # a's lease expired
        [second] = await claim(other, "b", T0 + LEASE + 2)
        assert second.lease_epoch == first.lease_epoch + 1
        assert second.progress == HALF           # not a checkpoint: kept until a new report
        stale = Progress(0.9, "stale", {}, T0 + LEASE + 3)
        assert not await store.record_progress(fence(first), stale)
        assert not await store.record_progress(
            Fence(run.id, "a", second.lease_epoch), stale)     # its epoch, another owner
        assert not await store.record_progress(Fence("nope", "b", 1), stale)
        got = await other.get_run(run.id)
        assert got is not None and got.progress == HALF
        fresh = Progress(0.1, "again", {}, T0 + LEASE + 4)
        assert await other.record_progress(fence(second), fresh)
        got = await store.get_run(run.id)
        assert got is not None and got.progress == fresh

    async def test_progress_is_kept_but_refused_once_the_claim_ended(
        self, store: Store, other: Store
    ) -> None:
        run = await add(store, T0)
        [r] = await claim(store, now=T0)
        assert await store.record_progress(fence(r), HALF)
        step = Step(0, "shoal.sleep", {"until": T0 + 5}, False, 0)
        assert await store.suspend_run(fence(r), step, "sleeping", T0 + 5, None, T0 + 2)
        late = Progress(1.0, "late", {}, T0 + 3)
        assert not await store.record_progress(fence(r), late)
        [r] = await claim(store, now=T0 + 5)                  # woke
        got = await other.get_run(run.id)
        assert got is not None and got.progress == HALF
        assert await store.settle_run(fence(r), Settlement("retry", error="E", run_at=T0 + 6),
                                      T0 + 5)
        [r] = await claim(store, now=T0 + 6)
        assert await store.record_progress(fence(r), late)
        assert await store.settle_run(fence(r), Settlement("succeeded", output=1), T0 + 7)
        assert not await store.record_progress(fence(r), HALF)
        got = await other.get_run(run.id)
        assert got is not None and got.status == "succeeded" and got.progress == late

    async def test_progress_leaves_the_other_runs_alone(self, store: Store, other: Store) -> None:
        a = await add(store, T0)
        b = await add(store, T0 + 0.5)
        ra, rb = await claim(store, now=T0 + 1)
        assert {ra.id, rb.id} == {a.id, b.id}
        assert await store.record_progress(fence(ra), HALF)
        quarter = Progress(0.25, None, {}, T0 + 2)
        assert await store.record_progress(fence(rb), quarter)
        got = {r.id: r.progress for r in await other.list_runs(NS)}
        assert got == {ra.id: HALF, rb.id: quarter}
