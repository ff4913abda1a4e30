"""The pauses' contract: a run parked on a human decision, resolved exactly once, expired,
notified once and pruned (:class:`~shoal.ports.Pauses`, with the run queue it parks runs of).

Subclass :class:`PauseContract` and provide the ``store`` and ``other`` fixtures (see
:mod:`shoal.testing.contract`).
"""

from __future__ import annotations

import asyncio

from shoal.ports import Store
from shoal.testing.contract.support import APPROVED, NS, T0, add, claim, fence, new_pause
from shoal.types import PauseWait, RunStatus, Settlement, Step


class PauseContract:
    """Pauses: every backend of :class:`~shoal.ports.Pauses` behaves like this. The store
    gets ``now`` explicitly in every call."""

    # -- pauses ----------------------------------------------------------------------------

    async def test_pause_parks_the_run_and_resolves_exactly_once(
        self, store: Store, other: Store
    ) -> None:
        run = await add(store, key="k")
        blocked = await add(store, T0 + 1, key="k")
        [c] = await claim(store, limit=1)
        pause = new_pause(c)
        step = Step(1, "shoal.approval:refund", {"pause_id": pause.id}, False, 0)
        assert await store.create_pause(fence(c), step, pause, T0 + 1)
        r = await store.get_run(run.id)
        assert r is not None and r.status == RunStatus.WAITING and r.owner is None
        assert await claim(store, now=T0 + 50) == []          # no slot, and it keeps its key
        assert [p.id for p in await other.list_pauses(NS)] == [pause.id]
        got = await other.get_pause(pause.id)
        assert got is not None and got.status == "pending" and got.request == {"amount": 40}
        results = await asyncio.gather(
            store.resolve_pause(pause.id, APPROVED, T0 + 2),
            other.resolve_pause(pause.id, {**APPROVED, "approved": False}, T0 + 2))
        assert sorted(won for _, won in results) == [False, True]
        final = await store.get_pause(pause.id)
        winner = next(p for p, won in results if won)
        assert final is not None and final.status == "resolved"
        assert final.decision == winner.decision and final.resolved_at == T0 + 2  # type: ignore[union-attr]
        assert await store.list_pauses(NS) == []
        [again] = await claim(store, now=T0 + 2)               # the run is due at once
        assert again.id == run.id and again.attempts == 1
        assert blocked.id != again.id
        assert await store.resolve_pause("missing", APPROVED, T0) == (None, False)
        assert not await store.create_pause(fence(c), step, new_pause(c), T0 + 3)  # old claim

    async def test_wait_pause_parks_only_while_the_pause_is_pending(
        self, store: Store, other: Store
    ) -> None:
        run = await add(store)
        [c] = await claim(store)
        pause = new_pause(c)
        step = Step(1, "shoal.approval:refund", {"pause_id": pause.id}, False, 0)
        assert await store.create_pause(fence(c), step, pause, T0)
        # a stray signal named after the pause delivers the run while the pause is pending
        await other.send_signal(run.id, f"shoal.pause:{pause.id}", None, "stray", T0 + 1)
        [c] = await claim(store, now=T0 + 1)
        assert c.id == run.id
        got = await store.wait_pause(fence(c), step, pause.id, T0 + 2)
        assert got is not None and got.parked
        assert got.pause is not None and got.pause.status == "pending"
        r = await store.get_run(run.id)
        assert r is not None and r.status == RunStatus.WAITING and r.owner is None
        assert await claim(store, now=T0 + 3) == []
        assert await store.wait_pause(fence(c), step, pause.id, T0 + 3) is None   # old claim
        _, won = await other.resolve_pause(pause.id, APPROVED, T0 + 4)
        assert won
        [c] = await claim(store, now=T0 + 4)          # the resolution found it parked
        got = await store.wait_pause(fence(c), step, pause.id, T0 + 5)
        assert got is not None and not got.parked
        assert got.pause is not None and got.pause.decision == APPROVED
        r = await store.get_run(run.id)
        assert r is not None and r.status == RunStatus.RUNNING and r.owner == c.owner
        assert await store.prune_pauses(NS, T0 + 5, 10) == 1
        assert await store.wait_pause(fence(c), step, pause.id, T0 + 6) == PauseWait(None, False)

    async def test_wait_pause_racing_a_resolution_never_strands_the_run(
        self, store: Store, other: Store
    ) -> None:
        for i in range(5):
            now = T0 + 100 * i
            run = await add(store, now)
            [c] = await claim(store, now=now)
            pause = new_pause(c, now)
            step = Step(1, "shoal.approval:refund", {"pause_id": pause.id}, False, 0)
            assert await store.create_pause(fence(c), step, pause, now)
            await other.send_signal(run.id, f"shoal.pause:{pause.id}", None, f"s{i}", now + 1)
            [c] = await claim(store, now=now + 1)
            got, (_, won) = await asyncio.gather(
                store.wait_pause(fence(c), step, pause.id, now + 2),
                other.resolve_pause(pause.id, APPROVED, now + 2))
            assert won and got is not None
            if got.parked:       # parked first: the resolution woke it
                [again] = await claim(store, now=now + 2)
                assert again.id == run.id
                c = again
            else:                # resolved first: seen, and the run still held
                assert got.pause is not None and got.pause.status == "resolved"
            assert await store.settle_run(fence(c), Settlement("succeeded"), now + 3)

    async def test_pauses_expire_and_are_pruned(self, store: Store) -> None:
        run = await add(store)
        [c] = await claim(store)
        pause = new_pause(c, expires_in=60)
        assert await store.create_pause(fence(c), Step(1, "a", {}, False, 0), pause, T0)
        assert await store.expire_pauses(NS, T0 + 59) == []
        [expired] = await store.expire_pauses(NS, T0 + 60)
        assert expired.id == pause.id and expired.decision["reason"] == "expired"
        assert expired.decision["approved"] is False
        assert await store.expire_pauses(NS, T0 + 61) == []
        [c] = await claim(store, now=T0 + 60)
        assert c.id == run.id
        _, won = await store.resolve_pause(pause.id, APPROVED, T0 + 61)
        assert not won
        assert await store.prune_pauses(NS, T0 + 60, 10) == 0
        assert await store.prune_pauses(NS, T0 + 61, 10) == 1
        assert await store.get_pause(pause.id) is None

    async def test_notifications_are_taken_by_one_instance_until_sent(
        self, store: Store, other: Store
    ) -> None:
        await add(store)
        [c] = await claim(store)
        pause = new_pause(c, expires_in=None)
        assert await store.create_pause(fence(c), Step(1, "a", {}, False, 0), pause, T0)
        [taken] = await store.claim_notifications(NS, T0, 30.0, 10)
        assert taken.id == pause.id and not taken.notified
        assert await other.claim_notifications(NS, T0 + 29, 30.0, 10) == []
        [retaken] = await other.claim_notifications(NS, T0 + 30, 30.0, 10)   # sender failed
        assert retaken.id == pause.id
        await other.mark_notified(pause.id)
        assert await store.claim_notifications(NS, T0 + 100, 30.0, 10) == []
        got = await store.get_pause(pause.id)
        assert got is not None and got.notified

    async def test_cancel_resolves_the_runs_pending_pause(self, store: Store) -> None:
        run = await add(store)
        [c] = await claim(store)
        pause = new_pause(c)
        assert await store.create_pause(fence(c), Step(1, "a", {}, False, 0), pause, T0)
        cancelled = await store.cancel_run(run.id, T0 + 1)
        assert cancelled is not None and cancelled.status == RunStatus.CANCELLED
        got = await store.get_pause(pause.id)
        assert got is not None and got.status == "resolved"
        assert got.decision["reason"] == "cancelled"
        assert await store.list_pauses(NS) == []
