"""The contract of what a console reads (:class:`~shoal.ports.RunInspection`): runs found by
filters a page at a time, newest first, without a gap or a repeat; one run with its steps
(and when each was written), signals, pauses, outbox entries and tree; the runs that ended per
minute; and the outbox's ``redrive`` of a dead letter (only while it is dead).

Subclass :class:`InspectionContract` and provide the ``store`` and ``other`` fixtures (see
:mod:`shoal.testing.contract`).
"""

from __future__ import annotations

from typing import Any, Literal

from shoal.ports import Store
from shoal.testing.contract.support import (
    APPROVED,
    NS,
    T0,
    add,
    claim,
    entries,
    fence,
    new_pause,
    new_run,
    replace_parent,
)
from shoal.types import Run, RunFilter, Settlement, Step

Outcome = Literal["succeeded", "failed", "cancelled"]


async def ended(store: Store, run: Run, now: float, outcome: Outcome = "succeeded") -> None:
    """Claim ``run`` (due, of workflow wf or other) and settle it with ``outcome`` at ``now``;
    the other runs claimed go back to the queue."""
    for r in await claim(store, now=now):
        if r.id == run.id:
            assert await store.settle_run(fence(r), Settlement(outcome, error="boom"), now)
        else:
            assert await store.release_run(fence(r), now)
    await store.recover_runs(NS, now)


async def pages(store: Store, where: RunFilter, size: int) -> list[list[str]]:
    """Every page of ``search_runs(NS, where)`` of ``size`` runs, as their ids."""
    out: list[list[str]] = []
    before = None
    while True:
        page = await store.search_runs(NS, where, before=before, limit=size)
        if not page:
            return out
        out.append([r.id for r in page])
        before = page[-1].id


class InspectionContract:
    """A console's reads and the redrive of a dead letter."""

    async def test_run_owners_count_the_running_runs_of_each_owner(
        self, store: Store, other: Store
    ) -> None:
        assert await other.run_owners(NS) == []
        for i in range(5):
            await add(store, T0 + i)
        await add(store, T0, namespace="elsewhere")
        first = await claim(store, "b", T0 + 10, limit=2)            # leases until T0 + 40
        second = await claim(store, "a", T0 + 20, limit=1)           # until T0 + 50
        third = await claim(store, "b", T0 + 30, limit=1)            # until T0 + 60
        assert await store.settle_run(fence(second[0]), Settlement("succeeded"), T0 + 31)
        owners = await other.run_owners(NS)
        assert [(o.owner, o.running) for o in owners] == [("b", 3)]
        assert owners[0].lease_until == third[0].lease_expires_at
        assert first[0].lease_expires_at is not None
        assert await store.release_run(fence(third[0]), T0 + 32)     # interrupted: not running
        assert [(o.owner, o.running) for o in await other.run_owners(NS)] == [("b", 2)]
        await claim(store, "a", T0 + 40, limit=5)
        got = await other.run_owners(NS)
        assert [(o.owner, o.running) for o in got] == [("a", 1), ("b", 2)]
        assert [(o.owner, o.running) for o in await other.run_owners(NS, limit=1)] == [("a", 1)]
        assert await other.run_owners("elsewhere") == []

    async def test_search_finds_runs_by_each_filter_newest_first(
        self, store: Store, other: Store
    ) -> None:
        a = await add(store, T0, tenant="acme", idem="order-1")
        b = await add(store, T0 + 1, workflow="other", key="c1")
        c = await add(store, T0 + 2, key="c1")
        d = await add(store, T0 + 3, tenant="acme")
        await add(store, T0 + 4, namespace="elsewhere", idem="order-1")
        await ended(store, a, T0 + 5, "failed")
        await ended(store, d, T0 + 6)

        async def ids(**given: Any) -> list[str]:
            return [r.id for r in await other.search_runs(NS, RunFilter(**given))]

        assert await ids() == [d.id, c.id, b.id, a.id]
        assert await ids(status="failed") == [a.id]
        assert await ids(status="succeeded") == [d.id]
        assert await ids(status="queued") == [c.id, b.id]
        assert await ids(status="running") == []
        assert await ids(workflow="other") == [b.id]
        assert await ids(tenant="acme") == [d.id, a.id]
        assert await ids(tenant="acme", status="failed") == [a.id]
        assert await ids(idempotency_key="order-1") == [a.id]
        assert await ids(idempotency_key="order-2") == []
        assert await ids(concurrency_key="c1") == [c.id, b.id]
        assert await ids(concurrency_key="c1", workflow="wf") == [c.id]
        assert await ids(created_from=T0 + 1, created_to=T0 + 3) == [c.id, b.id]
        assert await ids(created_from=T0 + 3) == [d.id]
        assert await ids(created_to=T0) == []
        found = await other.search_runs(NS, RunFilter(status="failed"))
        assert found == [await store.get_run(a.id)]      # whole runs, as get_run reads them
        assert await other.search_runs("elsewhere", RunFilter(status="failed")) == []

    async def test_search_pages_without_a_gap_or_a_repeat(
        self, store: Store, other: Store
    ) -> None:
        runs = [await add(store, T0 + i * 0.01, tenant="t" if i % 3 else "u")
                for i in range(23)]
        newest_first = [r.id for r in reversed(runs)]
        got = await pages(other, RunFilter(), 5)
        assert [len(p) for p in got] == [5, 5, 5, 5, 3]
        assert [i for p in got for i in p] == newest_first
        of_u = [r.id for r in reversed(runs) if r.tenant == "u"]
        assert [i for p in await pages(other, RunFilter(tenant="u"), 2) for i in p] == of_u
        # a run dispatched meanwhile is newer than every page: reading on never shows it
        first = await other.search_runs(NS, RunFilter(), limit=5)
        await add(store, T0 + 1)
        rest = await other.search_runs(NS, RunFilter(), before=first[-1].id, limit=100)
        assert [r.id for r in first + rest] == newest_first
        assert await other.search_runs(NS, RunFilter(), limit=0) == []

    async def test_inspect_run_reads_everything_kept_about_it(
        self, store: Store, other: Store
    ) -> None:
        assert await other.inspect_run("nope") is None
        root = await add(store, T0, input={"q": "<script>alert(1)</script>"})
        [r] = await claim(store, now=T0)
        assert await store.checkpoint_step(fence(r), Step(0, "fetch", {"ok": 1}, True, 0), 30,
                                           T0 + 1, entries(r, 0, "email", "audit", now=T0 + 1))
        child, _ = await store.create_run(replace_parent(new_run(T0 + 2), r), max_queued=None,
                                          admission="reject")
        grandchild, _ = await store.create_run(replace_parent(new_run(T0 + 3), child),
                                               max_queued=None, admission="reject")
        await store.send_signal(r.id, "paid", {"n": 1}, "sig-1", T0 + 4)
        pause = new_pause(r, T0 + 5)
        assert await store.create_pause(fence(r), Step(1, "refund", None, False, 0), pause,
                                        T0 + 5)
        record = await other.inspect_run(root.id)
        assert record is not None
        assert record.run == await store.get_run(root.id)
        assert [(s.seq, s.name, s.output, s.finished, s.epoch, s.finished_at)
                for s in record.steps] == [(0, "fetch", {"ok": 1}, True, r.lease_epoch, T0 + 1),
                                           (1, "refund", None, False, r.lease_epoch, None)]
        assert [(s.id, s.name, s.payload, s.created_at, s.consumed)
                for s in record.signals] == [("sig-1", "paid", {"n": 1}, T0 + 4, False)]
        assert [p.id for p in record.pauses] == [pause.id]
        assert [(e.topic, e.seq, e.index) for e in record.outbox] == [("email", 0, 0),
                                                                      ("audit", 0, 1)]
        assert [x.id for x in record.tree] == [root.id, child.id, grandchild.id]
        assert [x.parent_id for x in record.tree] == [None, root.id, child.id]

        # a resolved pause stays (until pruned); a child's tree is its root's
        await store.resolve_pause(pause.id, APPROVED, T0 + 6)
        again = await other.inspect_run(child.id)
        assert again is not None and again.run.id == child.id
        assert again.steps == () and again.signals == () and again.outbox == ()
        assert [x.id for x in again.tree] == [root.id, child.id, grandchild.id]
        after = await other.inspect_run(root.id)
        assert after is not None
        [resolved] = after.pauses
        assert resolved.status == "resolved" and resolved.decision == APPROVED
        short = await other.inspect_run(grandchild.id, tree_limit=2)
        assert short is not None and [x.id for x in short.tree] == [root.id, child.id]

    async def test_a_step_keeps_its_start_attempt_and_retries(
        self, store: Store, other: Store
    ) -> None:
        # each path that writes a step: the checkpoint alone, with outbox entries, an
        # unfinished sleep and its end, a signal consumed at once; and a step without them
        run = await add(store, T0)
        [r] = await claim(store, now=T0)
        f, a = fence(r), r.attempts
        assert await store.checkpoint_step(f, Step(0, "plain", 1, True, 0, T0 + 0.25, a, 0),
                                           30, T0 + 1)
        assert await store.checkpoint_step(f, Step(1, "sent", 2, True, 0, T0 + 1.5, a, 3), 30,
                                           T0 + 2, entries(r, 1, "email", now=T0 + 2))
        assert await store.checkpoint_step(f, Step(2, "old", 3, True, 0), 30, T0 + 3)
        await store.send_signal(run.id, "go", {"n": 1}, "sig-1", T0 + 3)
        got = await store.wait_signal(f, Step(3, "shoal.wait_for:go", {}, False, 0, T0 + 3.5, a,
                                              0), "go", None, T0 + 4)
        assert got is not None and got.received
        asleep = Step(4, "shoal.sleep", {"until": T0 + 60}, False, 0, T0 + 5, a, 0)
        assert await store.suspend_run(f, asleep, "sleeping", T0 + 60, None, T0 + 5)
        record = await other.inspect_run(run.id)
        assert record is not None
        timeline = [(s.seq, s.started_at, s.finished_at, s.attempt, s.retries, s.epoch)
                    for s in record.steps]
        e = r.lease_epoch
        assert timeline == [(0, T0 + 0.25, T0 + 1, a, 0, e), (1, T0 + 1.5, T0 + 2, a, 3, e),
                            (2, None, T0 + 3, None, None, e), (3, T0 + 3.5, T0 + 4, a, 0, e),
                            (4, T0 + 5, None, a, 0, e)]
        # replay reads them too; the sleep's end, written by the next attempt, keeps its start
        assert [(s.started_at, s.attempt, s.retries) for s in await other.load_steps(run.id)
                ] == [(T0 + 0.25, a, 0), (T0 + 1.5, a, 3), (None, None, None),
                      (T0 + 3.5, a, 0), (T0 + 5, a, 0)]
        [again] = await claim(store, now=T0 + 60)
        woke = Step(4, "shoal.sleep", {"until": T0 + 60}, True, 0, T0 + 5, again.attempts, 0)
        assert await store.checkpoint_step(fence(again), woke, 30, T0 + 61)
        # a stale fence writes nothing, the start included
        late = Step(5, "late", 5, True, 0, T0 + 61, a, 9)
        assert not await store.checkpoint_step(f, late, 30, T0 + 62)
        after = await other.inspect_run(run.id)
        assert after is not None
        assert [(s.seq, s.started_at, s.finished_at, s.attempt, s.epoch)
                for s in after.steps[4:]] == [(4, T0 + 5, T0 + 61, again.attempts,
                                               again.lease_epoch)]

    async def test_finished_per_minute(self, store: Store, other: Store) -> None:
        since = T0 + 600.0
        cases: tuple[tuple[float, Outcome], ...] = (
            (since - 0.5, "succeeded"), (since, "succeeded"), (since + 59.9, "failed"),
            (since + 60, "succeeded"), (since + 179.9, "cancelled"), (since + 180, "succeeded"))
        for at, outcome in cases:
            await ended(store, await add(store, T0), at, outcome)
        await add(store, T0)                                     # live: not counted
        elsewhere = await add(store, T0, namespace="elsewhere")
        [e] = await store.claim_runs("elsewhere", ["wf"], "a", 1, 30, since + 1)
        await store.settle_run(fence(e), Settlement("succeeded"), since + 1)
        assert elsewhere.id == e.id
        assert await other.finished_per_minute(NS, since, 3) == [2, 1, 1]
        assert await other.finished_per_minute(NS, since - 60, 2) == [1, 2]
        assert await other.finished_per_minute(NS, since + 3600, 5) == [0] * 5
        assert await other.finished_per_minute("elsewhere", since, 1) == [1]

    async def test_redrive_makes_a_dead_letter_deliverable_once(
        self, store: Store, other: Store
    ) -> None:
        assert await store.redrive(NS, "nope", T0) == (None, False)
        await add(store, T0)
        [r] = await claim(store, now=T0)
        sent = entries(r, 0, "email", "audit", now=T0)
        assert await store.checkpoint_step(fence(r), Step(0, "s", 1, True, 0), 30, T0, sent)
        email, audit = sent
        for e in await store.claim_outbox(NS, ["email", "audit"], T0, 30, 10):
            await store.finish_delivery(e.id, T0 + 1, "down" if e.id == email.id else None,
                                        None)
        assert [d.id for d in await store.dead_letters(NS)] == [email.id]

        entry, redriven = await store.redrive(NS, email.id, T0 + 10)
        assert redriven and entry is not None
        assert (entry.id, entry.dead, entry.attempts, entry.next_at, entry.delivered_at) == (
            email.id, False, 0, T0 + 10, None)
        assert await store.dead_letters(NS) == []
        again, twice = await other.redrive(NS, email.id, T0 + 11)   # not dead any more
        assert not twice and again == entry
        delivered, no = await other.redrive(NS, audit.id, T0 + 11)
        assert not no and delivered is not None and delivered.delivered_at == T0 + 1
        assert [e.id for e in await other.claim_outbox(NS, ["email"], T0 + 9, 30, 10)] == []
        await other.finish_delivery(email.id, T0 + 9, "down again", None)   # dead once more
        assert await other.redrive("elsewhere", email.id, T0 + 9) == (None, False)
        [still] = await other.dead_letters(NS)            # another namespace changed nothing
        assert (still.id, still.dead, still.attempts) == (email.id, True, 1)
        assert (await other.redrive(NS, email.id, T0 + 10))[1]
        assert [e.id for e in await other.claim_outbox(NS, ["email"], T0 + 10, 30, 10)] == [
            email.id]
