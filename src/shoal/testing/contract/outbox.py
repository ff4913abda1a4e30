"""The outbox's contract: entries written once with their step (never by a writer fenced out),
taken by one deliverer at a time, retried and dead-lettered (:class:`~shoal.ports.Outbox`, with
the checkpoints that write them).

Subclass :class:`OutboxContract` and provide the ``store`` and ``other`` fixtures (see
:mod:`shoal.testing.contract`).
"""

from __future__ import annotations

from shoal.ports import Store
from shoal.testing.contract.support import LEASE, NS, T0, add, claim, entries, fence
from shoal.types import Step


class OutboxContract:
    """The outbox: every backend of :class:`~shoal.ports.Outbox` behaves like this.
    The store gets ``now`` explicitly in every call."""

    # -- outbox ------------------------------------------------------------------------------

    async def test_outbox_entries_are_written_once_with_their_step(
        self, store: Store, other: Store
    ) -> None:
        run = await add(store)
        [a] = await claim(store)
        sent = entries(a, 1, "email", "sms")
        assert await store.checkpoint_step(fence(a), Step(1, "s", 1, True, 0), LEASE, T0, sent)
        # the same step checkpointed again (it is finished): its entries are not added again
        again = entries(a, 1, "email", "sms", now=T0 + 1)
        assert await store.checkpoint_step(fence(a), Step(1, "s", 1, True, 0), LEASE, T0 + 1,
                                           again)
        # a fenced-out writer adds nothing
        await store.recover_runs(NS, T0 + 1 + LEASE)
        [b] = await claim(other, owner="b", now=T0 + 1 + LEASE)
        assert not await store.checkpoint_step(fence(a), Step(2, "t", 2, True, 0), LEASE,
                                               T0 + 40, entries(a, 2, "email"))
        got = await other.claim_outbox(NS, ["email", "sms"], T0 + 50, 30.0, 10)
        assert sorted((e.topic, e.key) for e in got) == [("email", f"{run.id}:1:0"),
                                                         ("sms", f"{run.id}:1:1")]
        assert b.id == run.id

    async def test_outbox_delivery_is_taken_retried_and_dead_lettered(
        self, store: Store, other: Store
    ) -> None:
        await add(store)
        [a] = await claim(store)
        assert await store.checkpoint_step(fence(a), Step(1, "s", 1, True, 0), LEASE, T0,
                                           entries(a, 1, "email", "audit"))
        [e] = await store.claim_outbox(NS, ["email"], T0, 30.0, 10)     # only its topics
        assert e.topic == "email" and e.attempts == 0 and e.payload == {"n": 0}
        assert await other.claim_outbox(NS, ["email"], T0 + 29, 30.0, 10) == []   # taken
        await store.finish_delivery(e.id, T0 + 1, "ConnectionError: down", T0 + 5)
        assert await other.claim_outbox(NS, ["email"], T0 + 4, 30.0, 10) == []
        [e2] = await other.claim_outbox(NS, ["email"], T0 + 5, 30.0, 10)
        assert e2.id == e.id and e2.attempts == 1 and e2.error == "ConnectionError: down"
        await other.finish_delivery(e2.id, T0 + 6, "ConnectionError: down", None)   # dead
        [dead] = await store.dead_letters(NS)
        assert dead.id == e.id and dead.dead and dead.attempts == 2
        assert await store.claim_outbox(NS, ["email"], T0 + 999, 30.0, 10) == []
        [audit] = await store.claim_outbox(NS, ["audit"], T0 + 7, 30.0, 10)
        await store.finish_delivery(audit.id, T0 + 8)
        await store.finish_delivery(audit.id, T0 + 9, "late failure", T0 + 10)   # ignored
        assert await store.claim_outbox(NS, ["audit"], T0 + 999, 30.0, 10) == []
        assert [d.id for d in await store.dead_letters(NS)] == [e.id]

    async def test_outbox_entries_are_taken_earliest_due_first(self, store: Store) -> None:
        """Which entries a claim with a limit takes: the earliest due, then the oldest."""
        await add(store)
        [a] = await claim(store)
        assert await store.checkpoint_step(fence(a), Step(1, "s", 1, True, 0), LEASE, T0,
                                           entries(a, 1, "email"))
        assert await store.checkpoint_step(fence(a), Step(2, "t", 2, True, 0), LEASE, T0 + 1,
                                           entries(a, 2, "email", now=T0 + 1))
        [old] = await store.claim_outbox(NS, ["email"], T0 + 1, 30.0, 1)
        assert old.seq == 1
        await store.finish_delivery(old.id, T0 + 2, "ConnectionError: down", T0 + 50)
        [first] = await store.claim_outbox(NS, ["email"], T0 + 60, 30.0, 1)   # due since T0 + 1
        assert first.seq == 2
        [then] = await store.claim_outbox(NS, ["email"], T0 + 60, 30.0, 1)    # due at T0 + 50
        assert then.id == old.id
