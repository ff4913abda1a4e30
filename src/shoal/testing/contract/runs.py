"""The run queue's contract: creating and reading runs, the workflow registry, claims under a
lease, concurrency keys, versions, renewals and fencing, settlements, recovery, retries, durable
sleeps and signals, cancel, admission control and retention (:class:`~shoal.ports.RunQueue`,
:class:`~shoal.ports.WorkflowRegistry`, :class:`~shoal.ports.Checkpoints`).

Subclass :class:`RunContract` and provide the ``store`` and ``other`` fixtures (see
:mod:`shoal.testing.contract`).
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from shoal import _ids
from shoal.errors import AdmissionRejectedError
from shoal.ports import Store
from shoal.testing.contract.support import LEASE, NS, T0, add, claim, entries, fence, new_run
from shoal.types import (
    WORKFLOW_INSTANCE_RETENTION,
    Fence,
    RunStatus,
    Settlement,
    Step,
    WorkflowInfo,
)


class RunContract:
    """Runs from dispatch to their end: every backend of the run queue behaves like this.
    The store gets ``now`` explicitly in every call."""

    # -- creating and reading runs ---------------------------------------------------------

    async def test_create_get_and_list(self, store: Store) -> None:
        a = await add(store, T0, input={"x": [1, "two", None, True, 2.5]})
        b = await add(store, T0 + 1, tenant="t2")
        got = await store.get_run(a.id)
        assert got is not None
        assert got.status == RunStatus.QUEUED and got.input == {"x": [1, "two", None, True, 2.5]}
        assert got.attempts == 0 and got.owner is None and got.root_id == a.id
        assert await store.get_run("no-such-run") is None
        assert [r.id for r in await store.list_runs(NS)] == [a.id, b.id]
        assert [r.id for r in await store.list_runs(NS, after=a.id)] == [b.id]
        assert [r.id for r in await store.list_runs(NS, tenant="t2")] == [b.id]
        assert [r.id for r in await store.list_runs(NS, limit=1)] == [a.id]
        assert await store.list_runs("elsewhere") == []

    async def test_idempotency_key_maps_to_one_run(self, store: Store, other: Store) -> None:
        first, created = await store.create_run(new_run(idem="order-42"), max_queued=None,
                                                admission="reject")
        assert created
        again, created = await other.create_run(new_run(T0 + 5, idem="order-42"),
                                                max_queued=None, admission="reject")
        assert not created and again.id == first.id
        other_tenant, created = await store.create_run(
            new_run(idem="order-42", tenant="t2"), max_queued=None, admission="reject")
        assert created and other_tenant.id != first.id
        other_wf, created = await store.create_run(
            new_run(idem="order-42", workflow="other"), max_queued=None, admission="reject")
        assert created and other_wf.id != first.id
        # still the same run once it is final
        [c] = await claim(store, limit=1)
        assert c.id == first.id
        assert await store.settle_run(fence(c), Settlement("succeeded", output=1), T0)
        third, created = await store.create_run(new_run(T0 + 9, idem="order-42"),
                                                max_queued=None, admission="reject")
        assert not created and third.id == first.id
        assert len(await store.list_runs(NS)) == 3

    # -- creating runs in a batch -----------------------------------------------------------

    async def test_create_runs_answers_each_item_in_order(self, store: Store,
                                                          other: Store) -> None:
        old, _ = await other.create_run(new_run(idem="old"), max_queued=None, admission="reject")
        news = [new_run(T0 + 1, input={"i": 0}), new_run(T0 + 1, idem="k", input={"i": 1}),
                new_run(T0 + 1, idem="old", input={"i": 2}),
                new_run(T0 + 1, idem="k", input={"i": 3}),             # k again in the batch
                new_run(T0 + 1, input=[4, "four"], priority=7, delay=30, max_attempts=9),
                new_run(T0 + 1, idem="k", tenant="t2", input={"i": 5}),
                new_run(T0 + 1, idem="k", workflow="other", input={"i": 6})]
        got = await store.create_runs(news, max_queued=None, admission="reject")
        assert [created for _, created in got] == [True, True, False, False, True, True, True]
        runs = [run for run, _ in got]
        assert runs[2].id == old.id and runs[2].input == {"n": 1}
        assert runs[3].id == runs[1].id and runs[3].input == {"i": 1}   # the first item's
        for new, (run, created) in zip(news, got, strict=True):
            if created:
                assert run == await other.get_run(new.id)
                assert (run.id, run.status, run.held, run.root_id, run.attempts, run.owner) == (
                    new.id, RunStatus.QUEUED, False, new.id, 0, None)
        assert (runs[4].input, runs[4].priority, runs[4].run_at, runs[4].max_attempts) == (
            [4, "four"], 7, T0 + 31, 9)
        assert (runs[5].tenant, runs[6].workflow) == ("t2", "other")
        assert len(await store.list_runs(NS)) == 6
        assert await store.create_runs([], max_queued=None, admission="reject") == []
        # every item a repeat: nothing new, the same runs
        again = await other.create_runs([new_run(T0 + 2, idem="k"), new_run(T0 + 2, idem="old")],
                                        max_queued=None, admission="reject")
        assert [(r.id, c) for r, c in again] == [(runs[1].id, False), (old.id, False)]
        assert len(await store.list_runs(NS)) == 6

    async def test_create_runs_are_claimed_in_batch_order_by_their_keys(
        self, store: Store
    ) -> None:
        news = [new_run(T0, key="c1"), new_run(T0, key="c1"), new_run(T0, key="c2"),
                new_run(T0), new_run(T0, priority=5)]
        got = await store.create_runs(news, max_queued=None, admission="reject")
        assert [r.concurrency_key for r, _ in got] == ["c1", "c1", "c2", None, None]
        claimed = await claim(store, now=T0 + 1)
        assert [r.id for r in claimed] == [news[4].id, news[0].id, news[2].id, news[3].id]
        assert await store.settle_run(fence(claimed[1]), Settlement("succeeded"), T0 + 2)
        [second] = await claim(store, now=T0 + 2)
        assert second.id == news[1].id

    async def test_create_runs_admission_reject_refuses_the_whole_batch(
        self, store: Store
    ) -> None:
        await store.create_run(new_run(T0, idem="a"), max_queued=3, admission="reject")
        with pytest.raises(AdmissionRejectedError, match="nothing of the batch was stored"):
            await store.create_runs([new_run(T0 + 1) for _ in range(3)], max_queued=3,
                                    admission="reject")
        assert len(await store.list_runs(NS)) == 1
        # repeats (of a stored key, of a key earlier in the batch) are not new runs
        got = await store.create_runs(
            [new_run(T0 + 2, idem="a"), new_run(T0 + 2, idem="b"), new_run(T0 + 2, idem="b"),
             new_run(T0 + 2)], max_queued=3, admission="reject")
        assert [c for _, c in got] == [False, True, False, True]
        assert not any(r.held for r, _ in got)
        # full: a batch of repeats still answers, one new run does not fit
        got = await store.create_runs([new_run(T0 + 3, idem="b"), new_run(T0 + 3, idem="a")],
                                      max_queued=3, admission="reject")
        assert [c for _, c in got] == [False, False]
        with pytest.raises(AdmissionRejectedError):
            await store.create_runs([new_run(T0 + 4, idem="a"), new_run(T0 + 4, idem="c")],
                                    max_queued=3, admission="reject")
        assert len(await store.list_runs(NS)) == 3

    async def test_create_runs_admission_park_holds_the_rest_in_order(
        self, store: Store
    ) -> None:
        before, _ = await store.create_run(new_run(T0), max_queued=3, admission="park")
        news = [new_run(T0 + 1, priority=9 - i, idem=f"i{i}") for i in range(5)]
        news.insert(2, new_run(T0 + 1, idem="i0"))          # a repeat takes no room
        got = await store.create_runs(news, max_queued=3, admission="park")
        assert [(c, r.held) for r, c in got] == [(True, False), (True, False), (False, False),
                                                 (True, True), (True, True), (True, True)]
        # while runs are held, a new one is held behind them even when there is room
        [c] = await claim(store, now=T0 + 2, limit=1)
        assert c.id == news[0].id
        [(late, _)] = await store.create_runs([new_run(T0 + 3)], max_queued=3,
                                              admission="park")
        assert late.held
        held = [news[3].id, news[4].id, news[5].id, late.id]
        assert await store.release_held(NS, 3, T0 + 4) == 1      # oldest first: batch order
        claimed = await claim(store, now=T0 + 4)
        assert [r.id for r in claimed] == [news[1].id, held[0], before.id]
        assert await store.release_held(NS, 3, T0 + 5) == 3
        assert [r.id for r in await claim(store, now=T0 + 5)] == held[1:]

    async def test_create_runs_store_all_or_nothing(self, store: Store, other: Store) -> None:
        taken = await add(store, T0)
        bad = [new_run(T0 + 1, idem="x"), new_run(T0 + 1),
               dataclasses.replace(new_run(T0 + 1), id=taken.id)]   # a row the store refuses
        with pytest.raises(Exception):  # noqa: B017   # the backend's own integrity error
            await store.create_runs(bad, max_queued=None, admission="reject")
        twice = [new_run(T0 + 2, idem="x")] * 2
        with pytest.raises(ValueError, match="twice"):
            await store.create_runs(twice, max_queued=None, admission="reject")
        assert [r.id for r in await other.list_runs(NS)] == [taken.id]
        # the key of the refused batch is free
        [(run, created)] = await other.create_runs([new_run(T0 + 3, idem="x")],
                                                   max_queued=None, admission="reject")
        assert created and run.created_at == T0 + 3

    async def test_create_runs_large_batches_without_keys(self, store: Store,
                                                          other: Store) -> None:
        # PostgreSQL copies such a batch in (COPY): its text format escapes tabs, line breaks
        # and backslashes, which every text column may hold
        odd = "tab\there\nline\r\\back\\slash \u00e9 \u2028"
        news = [new_run(T0 + 1, input={"i": i, "s": odd if i % 2 else "plain", "q": 'a"b'},
                        tenant=odd if i == 7 else "default", key=odd if i == 9 else None,
                        priority=i % 3 - 1, delay=i % 2 * 0.5, max_attempts=i % 4 + 1)
                for i in range(250)]
        news[11] = dataclasses.replace(news[11], version=odd, parent_id=odd, root_id=odd)
        news[12] = dataclasses.replace(news[12], workflow=odd, input=[odd, None, 2.5])
        got = await store.create_runs(news, max_queued=None, admission="reject")
        assert [(run.id, created) for run, created in got] == [(n.id, True) for n in news]
        for new, (run, _) in zip(news, got, strict=True):
            assert run == await other.get_run(new.id)
            assert (run.tenant, run.workflow, run.input, run.priority, run.created_at,
                    run.run_at, run.max_attempts, run.concurrency_key, run.version,
                    run.parent_id, run.root_id, run.status, run.held) == (
                new.tenant, new.workflow, new.input, new.priority, new.created_at, new.run_at,
                new.max_attempts, new.concurrency_key, new.version, new.parent_id,
                new.root_id, RunStatus.QUEUED, False)
        # all or nothing: a batch with one id that is taken stores none of its runs
        bad = [new_run(T0 + 2) for _ in range(150)]
        bad.append(dataclasses.replace(new_run(T0 + 2), id=news[0].id))
        with pytest.raises(Exception):  # noqa: B017   # the backend's own integrity error
            await store.create_runs(bad, max_queued=None, admission="reject")
        assert len(await other.list_runs(NS, limit=1000)) == 250
        # admission counts them: what fits is queued, the rest held, in batch order
        got = await store.create_runs([new_run(T0 + 3) for _ in range(120)], max_queued=300,
                                      admission="park")
        assert [run.held for run, _ in got] == [False] * 50 + [True] * 70
        with pytest.raises(AdmissionRejectedError):
            await store.create_runs([new_run(T0 + 4) for _ in range(120)], max_queued=300,
                                    admission="reject")
        assert len(await other.list_runs(NS, limit=1000)) == 370

    async def test_workflow_registry(self, store: Store, other: Store) -> None:
        assert await store.get_workflow(NS, "wf") is None
        await store.register_workflows(NS, {"wf": {"max_attempts": 7}, "b": {}}, T0)
        assert await other.get_workflow(NS, "wf") == {"max_attempts": 7}
        await other.register_workflows(NS, {"wf": {"max_attempts": 2}}, T0 + 1)
        assert await store.get_workflow(NS, "wf") == {"max_attempts": 2}
        assert await store.get_workflow("elsewhere", "wf") is None

    async def test_the_instances_that_registered_each_workflow(
        self, store: Store, other: Store
    ) -> None:
        await store.register_workflows(NS, {"wf": {"max_attempts": 7}, "b": {}}, T0,
                                       instance="i1")
        await other.register_workflows(NS, {"wf": {"max_attempts": 2}}, T0 + 1, instance="i2")
        await store.register_workflows(NS, {"wf": {"max_attempts": 2}}, T0 + 2, instance="i1")
        await store.register_workflows("elsewhere", {"x": {}}, T0 + 3)
        assert await other.list_workflows(NS) == [
            WorkflowInfo(NS, "b", {}, T0, (("i1", T0),)),
            WorkflowInfo(NS, "wf", {"max_attempts": 2}, T0 + 2, (("i1", T0 + 2), ("i2", T0 + 1))),
        ]
        assert [(w.namespace, w.name, w.instances) for w in await store.list_workflows(None)] == [
            (NS, "b", (("i1", T0),)), (NS, "wf", (("i1", T0 + 2), ("i2", T0 + 1))),
            ("elsewhere", "x", ())]
        # an instance that registered nothing for the retention is forgotten
        later = T0 + 1 + WORKFLOW_INSTANCE_RETENTION + 0.5
        await other.register_workflows(NS, {"b": {}}, later, instance="i3")
        assert [(w.name, w.instances) for w in await store.list_workflows(NS)] == [
            ("b", (("i3", later),)), ("wf", (("i1", T0 + 2),))]

    # -- claiming --------------------------------------------------------------------------

    async def test_claim_order_priority_then_fifo(self, store: Store) -> None:
        low = await add(store, T0)
        high = await add(store, T0 + 1, priority=5)
        low2 = await add(store, T0 + 2)
        later = await add(store, T0, delay=60)
        claimed = await claim(store, now=T0 + 3, limit=2)
        assert [r.id for r in claimed] == [high.id, low.id]
        [rest] = await claim(store, now=T0 + 3)
        assert rest.id == low2.id
        assert await claim(store, now=T0 + 59) == []
        [due] = await claim(store, now=T0 + 60)
        assert due.id == later.id

    async def test_claim_takes_a_lease(self, store: Store, other: Store) -> None:
        run = await add(store)
        [c] = await claim(store, owner="inst-1", now=T0 + 1)
        assert c.id == run.id and c.status == RunStatus.RUNNING and c.owner == "inst-1"
        assert c.lease_epoch == 1 and c.attempts == 1 and c.started_at == T0 + 1
        assert c.lease_expires_at == T0 + 1 + LEASE
        assert await claim(other, owner="inst-2", now=T0 + 1) == []

    async def test_claim_only_registered_workflows(self, store: Store) -> None:
        await add(store, workflow="mine")
        assert await claim(store, workflows=("theirs",)) == []
        assert len(await claim(store, workflows=("mine",))) == 1

    async def test_concurrent_claims_never_share_a_run(self, store: Store, other: Store) -> None:
        for i in range(20):
            await add(store, T0 + i * 0.001)
        got = await asyncio.gather(*(claim(s, owner=f"o{i}", now=T0 + 1, limit=3)
                                     for i, s in enumerate([store, other] * 4)))
        ids = [r.id for batch in got for r in batch]
        assert len(ids) == len(set(ids)) == 20

    # -- concurrency keys ------------------------------------------------------------------

    async def test_concurrency_key_one_at_a_time(self, store: Store) -> None:
        a1 = await add(store, T0, key="c1")
        a2 = await add(store, T0 + 1, key="c1")
        b1 = await add(store, T0 + 2, key="c2")
        free = await add(store, T0 + 3)
        claimed = await claim(store, now=T0 + 5)
        assert {r.id for r in claimed} == {a1.id, b1.id, free.id}
        assert await claim(store, now=T0 + 5) == []
        first = next(r for r in claimed if r.id == a1.id)
        assert await store.settle_run(fence(first), Settlement("succeeded"), T0 + 6)
        [second] = await claim(store, now=T0 + 6)
        assert second.id == a2.id

    async def test_concurrency_key_is_per_workflow(self, store: Store) -> None:
        await add(store, key="k")
        await add(store, T0 + 1, key="k", workflow="other")
        assert len(await claim(store, now=T0 + 1)) == 2

    async def test_key_held_while_sleeping_waiting_interrupted_and_retrying(
        self, store: Store
    ) -> None:
        first = await add(store, T0, key="k")
        second = await add(store, T0 + 1, key="k")
        [c] = await claim(store, now=T0 + 1)
        assert c.id == first.id
        f = fence(c)
        # sleeping keeps the key
        assert await store.suspend_run(f, Step(1, "shoal.sleep", {"until": T0 + 50}, False, 1),
                                       "sleeping", T0 + 50, None, T0 + 2)
        assert await claim(store, now=T0 + 10) == []
        [c] = await claim(store, now=T0 + 50)
        assert c.id == first.id
        # waiting keeps the key
        got = await store.wait_signal(fence(c), Step(2, "shoal.wait_for:go", {}, False, 0),
                                      "go", None, T0 + 51)
        assert got is not None and got.parked
        assert await claim(store, now=T0 + 52) == []
        await store.send_signal(first.id, "go", None, _ids.new_id(T0 + 53), T0 + 53)
        [c] = await claim(store, now=T0 + 53)
        assert c.id == first.id
        # interrupted (released by a graceful stop) keeps the key
        assert await store.release_run(fence(c), T0 + 54)
        assert (await store.get_run(first.id)).status == RunStatus.INTERRUPTED  # type: ignore[union-attr]
        assert await claim(store, now=T0 + 54) == []
        await store.recover_runs(NS, T0 + 55)
        [c] = await claim(store, now=T0 + 55)
        assert c.id == first.id
        # a retry waiting for its backoff keeps the key
        assert await store.settle_run(fence(c), Settlement("retry", error="boom",
                                                           run_at=T0 + 70), T0 + 56)
        assert await claim(store, now=T0 + 60) == []
        [c] = await claim(store, now=T0 + 70)
        assert c.id == first.id and c.attempts == 2
        assert await store.settle_run(fence(c), Settlement("succeeded"), T0 + 71)
        [c] = await claim(store, now=T0 + 71)
        assert c.id == second.id

    # -- versions and why a run is delivered --------------------------------------------------

    async def test_a_started_run_is_claimed_by_its_own_version(self, store: Store) -> None:
        run = await add(store)
        [c] = await store.claim_runs(NS, ["wf"], "a", 1, LEASE, T0, version="v1")
        assert c.version == "v1" and c.resume_reason == "dispatched"
        assert await store.suspend_run(fence(c), Step(1, "shoal.sleep", {}, False, 0),
                                       "sleeping", T0 + 10, None, T0)
        assert await store.claim_runs(NS, ["wf"], "b", 1, LEASE, T0 + 10, version="v2") == []
        [left] = await store.incompatible_runs(NS, ["wf"], "v2", [], T0 + 10)
        assert left.id == run.id
        assert await store.incompatible_runs(NS, ["wf"], "v1", [], T0 + 10) == []
        assert await store.incompatible_runs(NS, ["wf"], "v2", ["wf"], T0 + 10) == []
        [c] = await store.claim_runs(NS, ["wf"], "b", 1, LEASE, T0 + 10, version="v2",
                                     any_version=["wf"])
        assert c.id == run.id and c.version == "v1" and c.resume_reason == "woke"

    async def test_resume_reasons(self, store: Store) -> None:
        await add(store)
        [c] = await claim(store)
        assert c.resume_reason == "dispatched"
        assert await store.settle_run(fence(c), Settlement("retry", error="e", run_at=T0), T0)
        [c] = await claim(store)
        assert c.resume_reason == "dispatched"
        got = await store.wait_signal(fence(c), Step(1, "w", {}, False, 0), "go", None, T0)
        assert got is not None and got.parked
        await store.send_signal(c.id, "go", 1, _ids.new_id(T0), T0)
        [c] = await claim(store)
        assert c.resume_reason == "resumed"
        await store.recover_runs(NS, T0 + LEASE)
        [c] = await claim(store, now=T0 + LEASE)
        assert c.resume_reason == "recovered"

    async def test_a_run_that_ends_keeps_why_it_was_last_delivered(self, store: Store) -> None:
        run = await add(store)
        await claim(store)
        await store.recover_runs(NS, T0 + LEASE)                  # its first instance died
        [c] = await claim(store, now=T0 + LEASE)
        assert c.resume_reason == "recovered"
        assert await store.settle_run(fence(c), Settlement("failed", error="E"), T0 + LEASE)
        r = await store.get_run(run.id)
        assert r is not None and r.status == RunStatus.FAILED and r.resume_reason == "recovered"

    # -- leases and fencing ----------------------------------------------------------------

    async def test_renew_extends_only_the_holders_lease(self, store: Store) -> None:
        run = await add(store)
        [c] = await claim(store, owner="a", now=T0)
        ok = await store.renew_leases("a", {run.id: c.lease_epoch}, LEASE, T0 + 10)
        assert ok.renewed == {run.id} and not ok.cancel_requested
        assert (await store.get_run(run.id)).lease_expires_at == T0 + 10 + LEASE  # type: ignore[union-attr]
        assert (await store.renew_leases("b", {run.id: c.lease_epoch}, LEASE, T0 + 10)).renewed \
            == frozenset()
        assert (await store.renew_leases("a", {run.id: c.lease_epoch + 1}, LEASE,
                                          T0 + 10)).renewed == frozenset()
        # renewed in time: not recovered
        assert await store.recover_runs(NS, T0 + LEASE + 5) == []

    async def test_fenced_writes_after_a_lost_lease_are_refused(
        self, store: Store, other: Store
    ) -> None:
        run = await add(store)
        [a] = await claim(store, owner="a", now=T0)
        assert await store.checkpoint_step(fence(a), Step(1, "one", {"v": "a"}, True, 0),
                                           LEASE, T0 + 1)
        # a is frozen past its lease; b recovers and claims
        [rec] = await other.recover_runs(NS, T0 + 1 + LEASE)
        assert rec.id == run.id and rec.status == RunStatus.QUEUED and rec.attempts == 2
        [b] = await claim(other, owner="b", now=T0 + 1 + LEASE)
        assert b.lease_epoch == a.lease_epoch + 1
        now = T0 + 2 + LEASE
        assert not await store.checkpoint_step(fence(a), Step(2, "two", {"v": "a"}, True, 0),
                                               LEASE, now)
        assert not await store.settle_run(fence(a), Settlement("succeeded", output="a"), now)
        assert not await store.release_run(fence(a), now)
        assert not await store.suspend_run(fence(a), Step(2, "shoal.sleep", {}, False, 0),
                                           "sleeping", now + 9, None, now)
        assert await store.wait_signal(fence(a), Step(2, "w", {}, False, 0), "x", None,
                                       now) is None
        assert (await store.renew_leases("a", {run.id: a.lease_epoch}, LEASE, now)).renewed \
            == frozenset()
        steps = await other.load_steps(run.id)
        assert [(s.seq, s.name, s.output, s.epoch) for s in steps] == [(1, "one", {"v": "a"}, 1)]
        assert await other.checkpoint_step(fence(b), Step(2, "two", {"v": "b"}, True, 0),
                                           LEASE, now)
        assert await other.settle_run(fence(b), Settlement("succeeded", output="b"), now)
        final = await store.get_run(run.id)
        assert final is not None and final.status == RunStatus.SUCCEEDED and final.output == "b"
        steps = await store.load_steps(run.id)
        assert [(s.seq, s.output, s.epoch) for s in steps] == [(1, {"v": "a"}, 1),
                                                              (2, {"v": "b"}, 2)]

    async def test_a_finished_checkpoint_is_never_replaced(self, store: Store) -> None:
        await add(store)
        [c] = await claim(store)
        assert await store.checkpoint_step(fence(c), Step(1, "one", 1, True, 0), LEASE, T0)
        assert await store.checkpoint_step(fence(c), Step(1, "one", 2, True, 0), LEASE, T0)
        [s] = await store.load_steps(c.id)
        assert s.output == 1 and s.finished

    async def test_recover_counts_a_crash_as_an_attempt(self, store: Store) -> None:
        run = await add(store, max_attempts=2)
        [c] = await claim(store, now=T0)
        assert await store.recover_runs(NS, T0 + LEASE - 1) == []
        [r] = await store.recover_runs(NS, T0 + LEASE)
        assert r.status == RunStatus.QUEUED and r.attempts == 2 and r.owner is None
        [c] = await claim(store, now=T0 + LEASE)
        assert c.attempts == 2
        [r] = await store.recover_runs(NS, T0 + 2 * LEASE)
        assert r.id == run.id and r.status == RunStatus.FAILED and "stopped" in (r.error or "")

    async def test_released_run_is_requeued_without_an_attempt(self, store: Store) -> None:
        await add(store)
        [c] = await claim(store)
        assert await store.release_run(fence(c), T0 + 1)
        [r] = await store.recover_runs(NS, T0 + 1)
        assert r.status == RunStatus.QUEUED and r.attempts == 1
        [c2] = await claim(store, owner="b", now=T0 + 1)
        assert c2.attempts == 1 and c2.lease_epoch == 2

    async def test_retry_and_final_settlements(self, store: Store) -> None:
        run = await add(store)
        [c] = await claim(store)
        assert await store.settle_run(fence(c), Settlement("retry", error="E: x", run_at=T0 + 9),
                                      T0 + 1)
        r = await store.get_run(run.id)
        assert r is not None and r.status == RunStatus.QUEUED and r.attempts == 2
        assert r.error == "E: x" and r.owner is None
        assert await claim(store, now=T0 + 8) == []
        [c] = await claim(store, now=T0 + 9)
        assert await store.settle_run(fence(c), Settlement("failed", error="E: y"), T0 + 10)
        r = await store.get_run(run.id)
        assert r is not None and r.status == RunStatus.FAILED and r.finished_at == T0 + 10

    async def test_settle_and_claim_settles_and_claims_together(self, store: Store) -> None:
        holder = await add(store, T0, key="k")
        waiter = await add(store, T0 + 1, key="k")    # waits for the key holder
        plain = await add(store, T0 + 2)
        later = [await add(store, T0 + 3 + i) for i in range(3)]
        claimed = await claim(store, now=T0 + 5, limit=2)
        assert [r.id for r in claimed] == [holder.id, plain.id]
        held, plain_c = claimed
        stale = Fence(plain_c.id, plain_c.owner or "", plain_c.lease_epoch + 1)
        answers, runs = await store.settle_and_claim(
            [(fence(held), Settlement("succeeded", output=[1]), T0 + 6),
             (stale, Settlement("succeeded", output=[2]), T0 + 6)],
            NS, ["wf"], "b", 2, LEASE, T0 + 7)
        # each settlement fenced on its own; the claim takes the due runs in claim order, the
        # run waiting for the key the first settlement freed included or not (PostgreSQL
        # claims in the same statement, which does not see that key freed): a claim after it
        # takes that run
        assert answers == [True, False]
        ids = [r.id for r in runs]
        assert ids in ([waiter.id, later[0].id], [later[0].id, later[1].id]), ids
        assert all(r.status == RunStatus.RUNNING and r.owner == "b"
                   and r.lease_expires_at == T0 + 7 + LEASE for r in runs)
        if waiter.id not in ids:
            assert [r.id for r in await claim(store, "b", now=T0 + 7, limit=1)] == [waiter.id]
        left = [r.id for r in later if r.id not in ids]
        done = await store.get_run(holder.id)
        assert done is not None and done.status == RunStatus.SUCCEEDED
        assert done.output == [1] and done.finished_at == T0 + 6
        still = await store.get_run(plain.id)
        assert still is not None and still.status == RunStatus.RUNNING and still.owner == "a"
        # limit 0: the settlements alone
        retried = Settlement("retry", error="E: x", run_at=T0 + 50)
        assert await store.settle_and_claim([(fence(plain_c), retried, T0 + 8)],
                                            NS, ["wf"], "b", 0, LEASE, T0 + 8) == ([True], [])
        again = await store.get_run(plain.id)
        assert again is not None and again.status == RunStatus.QUEUED and again.attempts == 2
        # no settlement: a claim
        answers, runs = await store.settle_and_claim([], NS, ["wf"], "c", 5, LEASE, T0 + 9)
        assert answers == [] and [r.id for r in runs] == left

    async def test_a_run_keeps_the_traceback_of_the_attempt_that_last_settled(
        self, store: Store, other: Store
    ) -> None:
        first = "Traceback (most recent call last):\n  ...\nValueError: é 1\n" + "x" * 70_000
        failed, succeeded, crashed = [await add(store, T0 + i / 10, max_attempts=2)
                                      for i in range(3)]
        for run in (failed, succeeded, crashed):
            assert (await store.get_run(run.id)).traceback is None  # type: ignore[union-attr]
            [c] = await claim(store, now=T0 + 1, limit=1)
            assert c.id == run.id
            assert await store.settle_run(fence(c), Settlement(
                "retry", error="ValueError: é 1", run_at=T0 + 2, traceback=first), T0 + 1)
            r = await other.get_run(run.id)
            assert r is not None and r.status == RunStatus.QUEUED and r.traceback == first
        # each settlement replaces it: a failure by its own, a success by none
        [c] = await claim(store, now=T0 + 2, limit=1)
        assert await store.settle_run(fence(c), Settlement(
            "failed", error="KeyError: 'k'", traceback="KeyError: 'k'\n"), T0 + 3)
        [c] = await claim(store, now=T0 + 3, limit=1)
        assert await store.settle_run(fence(c), Settlement("succeeded", output=1), T0 + 4)
        # an attempt that crashed raised nothing: the run fails without a traceback
        [c] = await claim(store, now=T0 + 4, limit=1)
        assert [r.id for r in await store.recover_runs(NS, T0 + 5 + LEASE)] == [crashed.id]
        runs = {r.id: r for r in await other.list_runs(NS)}
        assert runs[failed.id].status == RunStatus.FAILED
        assert runs[failed.id].traceback == "KeyError: 'k'\n"
        assert runs[succeeded.id].status == RunStatus.SUCCEEDED
        assert runs[succeeded.id].traceback is None and runs[succeeded.id].error is None
        assert runs[crashed.id].status == RunStatus.FAILED and runs[crashed.id].traceback is None

    async def test_a_run_and_its_outbox_entries_keep_their_trace_context(
        self, store: Store, other: Store
    ) -> None:
        """The trace context given at creation is kept as it was written (one run, a batch
        inserted row by row, a large batch without keys: PostgreSQL copies it in) and comes
        back with every read of the run, its claim and recovery among them; an outbox entry
        keeps its step's."""
        carrier = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",' \
                  ' "tracestate": "k=v\\t,é"}'
        one = await store.create_run(dataclasses.replace(new_run(T0), trace_context=carrier),
                                     max_queued=None, admission="reject")
        small = [dataclasses.replace(new_run(T0, idem=f"k{i}"), trace_context=f"{carrier}{i}")
                 for i in range(3)]
        large = [dataclasses.replace(new_run(T0), trace_context=carrier if i % 2 else None)
                 for i in range(250)]
        made = [one, *await store.create_runs(small, max_queued=None, admission="reject"),
                *await store.create_runs(large, max_queued=None, admission="reject")]
        wanted = [carrier] + [n.trace_context for n in small + large]
        assert [r.trace_context for r, _ in made] == wanted
        for (run, _), context in zip(made, wanted, strict=True):
            read = await other.get_run(run.id)
            assert read is not None and read.trace_context == context
        [a] = await claim(store, now=T0 + 1, limit=1)
        assert a.id == one[0].id and a.trace_context == carrier
        sent = [dataclasses.replace(e, trace_context=carrier if e.index == 0 else None)
                for e in entries(a, 1, "email", "sms")]
        assert await store.checkpoint_step(fence(a), Step(1, "s", 1, True, 0), LEASE, T0 + 1,
                                           sent)
        got = await other.claim_outbox(NS, ["email", "sms"], T0 + 2, 30.0, 10)
        assert sorted((e.topic, e.trace_context) for e in got) == [("email", carrier),
                                                                   ("sms", None)]
        [lost] = await store.recover_runs(NS, T0 + 2 + LEASE)
        assert lost.id == a.id and lost.trace_context == carrier

    # -- retrying a failed or cancelled run ------------------------------------------------

    async def test_retry_starts_a_failed_run_again_from_its_checkpoints(
        self, store: Store, other: Store
    ) -> None:
        run = await add(store, max_attempts=2, idem="order-7")
        [c] = await claim(store)
        assert await store.checkpoint_step(fence(c), Step(1, "charge", 1, True, 0), LEASE, T0,
                                           entries(c, 1, "email", "sms"))
        assert await store.settle_run(fence(c), Settlement("failed", error="E: x"), T0 + 1)
        # unknown, another namespace's, another tenant's: nothing is found, nothing changes
        assert await store.retry_run(NS, "missing", None, T0 + 2) == (None, False)
        assert await store.retry_run("elsewhere", run.id, None, T0 + 2) == (None, False)
        assert await store.retry_run(NS, run.id, "t2", T0 + 2) == (None, False)
        failed = await store.get_run(run.id)
        assert failed is not None and failed.status == RunStatus.FAILED

        r, won = await other.retry_run(NS, run.id, "default", T0 + 5)
        assert won and r is not None and r.id == run.id
        assert r.status == RunStatus.QUEUED and r.attempts == 0 and r.max_attempts == 2
        assert r.run_at == T0 + 5 and r.started_at is None and r.finished_at is None
        assert r.owner is None and not r.cancel_requested and r.resume_reason == "retried"
        assert await store.get_run(run.id) == r
        # the idempotency key still names this one run
        again, created = await store.create_run(new_run(T0 + 6, idem="order-7"),
                                                max_queued=None, admission="reject")
        assert not created and again.id == run.id and again.status == RunStatus.QUEUED
        [c2] = await claim(store, owner="b", now=T0 + 6)
        assert c2.id == run.id and c2.attempts == 1 and c2.lease_epoch > c.lease_epoch
        assert c2.resume_reason == "retried"
        # its finished step replays: checkpointed again, its outbox entries exist once
        [s] = await store.load_steps(run.id)
        assert (s.seq, s.name, s.finished, s.output) == (1, "charge", True, 1)
        assert await store.checkpoint_step(fence(c2), Step(1, "charge", 1, True, 0), LEASE,
                                           T0 + 7, entries(c2, 1, "email", "sms", now=T0 + 7))
        sent = await store.claim_outbox(NS, ["email", "sms"], T0 + 8, 30.0, 10)
        assert sorted(e.key for e in sent) == [f"{run.id}:1:0", f"{run.id}:1:1"]
        # a live run is not retried
        r, won = await store.retry_run(NS, run.id, None, T0 + 8)
        assert not won and r is not None and r.status == RunStatus.RUNNING and r.owner == "b"

    async def test_retry_refuses_live_and_succeeded_runs(self, store: Store) -> None:
        queued = await add(store)
        done = await add(store, T0 + 1)
        [c] = await claim(store, limit=1)
        assert c.id == queued.id
        assert await store.retry_run(NS, queued.id, None, T0 + 2) == (c, False)
        assert await store.suspend_run(fence(c), Step(1, "shoal.sleep", {"until": T0 + 50},
                                                      False, 0), "sleeping", T0 + 50, None, T0)
        r, won = await store.retry_run(NS, queued.id, None, T0 + 2)
        assert not won and r is not None and r.status == RunStatus.SLEEPING
        [d] = await claim(store, now=T0 + 2)
        assert d.id == done.id
        assert await store.settle_run(fence(d), Settlement("succeeded", output=3), T0 + 3)
        r, won = await store.retry_run(NS, done.id, None, T0 + 4)
        assert not won and r is not None and r.status == RunStatus.SUCCEEDED and r.output == 3

    async def test_a_retried_cancelled_run_waits_for_its_key_and_waits_afresh(
        self, store: Store
    ) -> None:
        first = await add(store, key="k")
        [c] = await claim(store)
        assert await store.checkpoint_step(fence(c), Step(1, "pick", 1, True, 0), LEASE, T0)
        got = await store.wait_signal(fence(c), Step(2, "shoal.wait_for:go", {}, False, 0),
                                      "go", None, T0)
        assert got is not None and got.parked
        cancelled = await store.cancel_run(first.id, T0 + 1)
        assert cancelled is not None and cancelled.status == RunStatus.CANCELLED
        second = await add(store, T0 + 2, key="k")
        [c2] = await claim(store, now=T0 + 2)
        assert c2.id == second.id
        r, won = await store.retry_run(NS, first.id, None, T0 + 3)
        assert won and r is not None and not r.cancel_requested and r.wait_for is None
        # the key is held by the second run: the retried one waits as a new run would
        assert await claim(store, now=T0 + 3) == []
        assert await store.settle_run(fence(c2), Settlement("succeeded"), T0 + 4)
        [c3] = await claim(store, now=T0 + 4)
        assert c3.id == first.id and c3.resume_reason == "retried"
        # the wait in progress when it was cancelled starts over; the finished step stays
        assert [(s.seq, s.finished) for s in await store.load_steps(first.id)] == [(1, True)]
        renewal = await store.renew_leases("a", {c3.id: c3.lease_epoch}, LEASE, T0 + 5)
        assert renewal.renewed == {c3.id} and renewal.cancel_requested == frozenset()

    async def test_two_racing_retries_of_one_run_one_wins(
        self, store: Store, other: Store
    ) -> None:
        run = await add(store)
        [c] = await claim(store)
        assert await store.settle_run(fence(c), Settlement("failed", error="E"), T0 + 1)
        results = await asyncio.gather(store.retry_run(NS, run.id, None, T0 + 2),
                                       other.retry_run(NS, run.id, None, T0 + 2))
        assert sorted(won for _, won in results) == [False, True]
        for r, _ in results:
            assert r is not None and r.status == RunStatus.QUEUED
        [again] = await claim(store, now=T0 + 2)
        assert again.id == run.id and again.attempts == 1

    # -- sleeping, signals -----------------------------------------------------------------

    async def test_sleep_is_due_at_its_time(self, store: Store, other: Store) -> None:
        run = await add(store)
        [c] = await claim(store)
        assert await store.suspend_run(fence(c), Step(1, "shoal.sleep", {"until": T0 + 100},
                                                      False, 0), "sleeping", T0 + 100, None, T0)
        r = await store.get_run(run.id)
        assert r is not None and r.status == RunStatus.SLEEPING and r.owner is None
        assert await claim(other, owner="b", now=T0 + 99) == []
        [c2] = await claim(other, owner="b", now=T0 + 100)
        assert c2.id == run.id and c2.attempts == 1 and c2.lease_epoch == 2
        [s] = await other.load_steps(run.id)
        assert s.name == "shoal.sleep" and not s.finished and s.output == {"until": T0 + 100}

    async def test_signal_sent_before_the_wait_is_kept(self, store: Store, other: Store) -> None:
        run = await add(store)
        await other.send_signal(run.id, "paid", {"amount": 5}, _ids.new_id(T0), T0)
        [c] = await claim(store)
        got = await store.wait_signal(fence(c), Step(1, "shoal.wait_for:paid", {}, False, 0),
                                      "paid", None, T0 + 1)
        assert got is not None and got.received and got.payload == {"amount": 5}
        [s] = await store.load_steps(run.id)
        assert s.finished and s.output == {"payload": {"amount": 5}}
        # consumed exactly once
        again = await store.wait_signal(fence(c), Step(2, "shoal.wait_for:paid", {}, False, 0),
                                        "paid", None, T0 + 2)
        assert again is not None and again.parked and not again.received

    async def test_signal_sent_after_the_wait_wakes_the_run(
        self, store: Store, other: Store
    ) -> None:
        run = await add(store)
        [c] = await claim(store)
        got = await store.wait_signal(fence(c), Step(1, "shoal.wait_for:paid", {}, False, 0),
                                      "paid", None, T0)
        assert got is not None and got.parked
        r = await store.get_run(run.id)
        assert r is not None and r.status == RunStatus.WAITING and r.wait_for == "paid"
        await other.send_signal(run.id, "unrelated", 1, _ids.new_id(T0 + 1), T0 + 1)
        assert await claim(store, now=T0 + 1000) == []
        await other.send_signal(run.id, "paid", 2, _ids.new_id(T0 + 2), T0 + 2)
        [c] = await claim(store, now=T0 + 2)
        got = await store.wait_signal(fence(c), Step(1, "shoal.wait_for:paid", {}, False, 0),
                                      "paid", None, T0 + 3)
        assert got is not None and got.received and got.payload == 2
        assert await store.send_signal("missing", "x", None, _ids.new_id(T0), T0) is None

    async def test_wait_deadline(self, store: Store) -> None:
        await add(store)
        [c] = await claim(store)
        got = await store.wait_signal(fence(c), Step(1, "w", {}, False, 0), "go", T0 + 10, T0)
        assert got is not None and got.parked
        assert await claim(store, now=T0 + 9) == []
        [c] = await claim(store, now=T0 + 10)
        late = await store.wait_signal(fence(c), Step(1, "w", {}, False, 0), "go", T0 + 10,
                                       T0 + 10)
        assert late is not None and not late.received and not late.parked

    # -- cancel ----------------------------------------------------------------------------

    async def test_cancel(self, store: Store) -> None:
        queued = await add(store)
        running = await add(store, T0 + 1)
        [c] = await claim(store, limit=1)
        assert c.id == queued.id
        q = await store.cancel_run(queued.id, T0 + 2)
        assert q is not None and q.status == RunStatus.RUNNING and q.cancel_requested
        renewal = await store.renew_leases("a", {c.id: c.lease_epoch}, LEASE, T0 + 3)
        assert renewal.cancel_requested == {c.id}
        assert await store.settle_run(fence(c), Settlement("cancelled"), T0 + 4)
        x = await store.cancel_run(running.id, T0 + 5)
        assert x is not None and x.status == RunStatus.CANCELLED
        assert await claim(store, now=T0 + 6) == []
        done = await store.cancel_run(queued.id, T0 + 7)
        assert done is not None and done.status == RunStatus.CANCELLED
        assert await store.cancel_run("missing", T0) is None

    # -- admission -------------------------------------------------------------------------

    async def test_admission_reject_stores_nothing(self, store: Store) -> None:
        for i in range(2):
            await store.create_run(new_run(T0 + i), max_queued=2, admission="reject")
        with pytest.raises(AdmissionRejectedError):
            await store.create_run(new_run(T0 + 3), max_queued=2, admission="reject")
        assert len(await store.list_runs(NS)) == 2
        [c] = await claim(store, limit=1, now=T0 + 4)
        _, created = await store.create_run(new_run(T0 + 5), max_queued=2, admission="reject")
        assert created
        # a started run queued again for its retry is not waiting for admission
        assert await store.settle_run(fence(c), Settlement("retry", error="x", run_at=T0 + 99),
                                      T0 + 6)
        with pytest.raises(AdmissionRejectedError):
            await store.create_run(new_run(T0 + 7), max_queued=2, admission="reject")
        [c2] = await claim(store, limit=1, now=T0 + 8)
        assert c2.id != c.id
        _, created = await store.create_run(new_run(T0 + 9), max_queued=2, admission="reject")
        assert created

    async def test_admission_park_holds_then_releases_in_order(self, store: Store) -> None:
        await store.create_run(new_run(T0), max_queued=1, admission="park")
        held = []
        for i in range(3):
            run, _ = await store.create_run(new_run(T0 + 1 + i, priority=9 - i), max_queued=1,
                                            admission="park")
            assert run.held and run.status == RunStatus.QUEUED
            held.append(run)
        assert await store.release_held(NS, 1, T0 + 5) == 0
        [first] = await claim(store, now=T0 + 5)
        assert not first.held
        assert await store.release_held(NS, 1, T0 + 6) == 1
        [nxt] = await claim(store, now=T0 + 6)
        assert nxt.id == held[0].id
        assert await store.release_held(NS, 5, T0 + 7) == 2
        assert [r.id for r in await claim(store, now=T0 + 7)] == [held[1].id, held[2].id]

    # -- retention -------------------------------------------------------------------------

    async def test_prune_deletes_only_old_final_runs(self, store: Store) -> None:
        old = await add(store, T0)
        live = await add(store, T0 + 1)
        recent = await add(store, T0 + 2)
        [a, b, c] = await claim(store, now=T0 + 2)
        assert await store.checkpoint_step(fence(a), Step(1, "s", 1, True, 0), LEASE, T0 + 3)
        await store.send_signal(old.id, "x", None, _ids.new_id(T0 + 3), T0 + 3)
        assert await store.settle_run(fence(a), Settlement("succeeded"), T0 + 10)
        assert await store.settle_run(fence(c), Settlement("failed", error="e"), T0 + 50)
        assert await store.prune_runs(NS, T0 + 10, 10) == 0     # finished_at < before only
        assert await store.prune_runs(NS, T0 + 100, 1) == 1     # bounded, oldest first
        assert await store.get_run(old.id) is None and await store.load_steps(old.id) == []
        assert await store.prune_runs(NS, T0 + 100, 10) == 1
        assert await store.get_run(recent.id) is None
        assert (await store.get_run(live.id)) is not None         # running: never pruned
        assert await store.prune_runs("elsewhere", T0 + 1000, 10) == 0
        assert b.id == live.id
