"""The contract of ``stats`` and ``fold_stats`` (:class:`~shoal.ports.RunQueue`): exact counts
of a namespace's runs by status, workflow and tenant after a mix of every way a run moves, the
age of the oldest due run, the runs that ended in the last minute (whole seconds of ``now``),
pending pauses and the outbox; and a fold that never changes an answer.

Subclass :class:`StatsContract` and provide the ``store`` and ``other`` fixtures (see
:mod:`shoal.testing.contract`).
"""

from __future__ import annotations

from typing import Any

from shoal.ports import Store
from shoal.testing.contract.support import NS, T0, add, claim, entries, fence, new_pause, new_run
from shoal.types import QueueDepth, RunStatus, Settlement, Stats, Step

FINAL = ("succeeded", "failed", "cancelled")


def counts(**given: int) -> dict[str, int]:
    """Runs per status, every status present (``given`` the ones that are not 0)."""
    return {s.value: given.get(s.value, 0) for s in RunStatus}


def ended(**given: int) -> dict[str, int]:
    """Runs per final status, every final status present."""
    return {s: given.get(s, 0) for s in FINAL}


async def read(store: Store, other: Store, now: float, **expected: Any) -> Stats:
    """``store.stats(NS, now)``, checked against ``expected`` (fields of :class:`Stats`); then
    the same answer again after ``other`` folds the counts at ``now``."""
    got = await store.stats(NS, now)
    assert got.namespace == NS and got.at == now
    for name, value in expected.items():
        assert getattr(got, name) == value, (name, getattr(got, name), value)
    await other.fold_stats(NS, now)
    assert await store.stats(NS, now) == got
    return got


class StatsContract:
    """A namespace's stats: every backend of the run queue answers exactly this."""

    async def test_an_empty_namespace(self, store: Store, other: Store) -> None:
        await add(store, namespace="elsewhere")
        got = await read(store, other, T0, by_status=counts(), by_workflow={}, queued={},
                         oldest_due_age=None, finished_last_minute=ended(), pending_pauses=0,
                         outbox_backlog=0, dead_letters=0)
        assert (got.live, got.executing, got.finished) == (0, 0, 0)

    async def test_counts_after_every_way_a_run_moves(self, store: Store, other: Store) -> None:
        a = await add(store, T0)
        b = await add(store, T0 + 0.1, tenant="t2")
        c = await add(store, T0 + 0.2, workflow="other")
        d = await add(store, T0 + 0.3, delay=100)
        e = await add(store, T0 + 0.4)
        f, created = await store.create_run(new_run(T0 + 0.5, tenant="t2"), max_queued=1,
                                            admission="park")
        assert created and f.held
        await add(store, T0, namespace="elsewhere")
        assert [r.id for r in await claim(store, now=T0 + 1, limit=3)] == [a.id, b.id, c.id]
        got = await read(
            store, other, T0 + 1, by_status=counts(queued=3, running=3),
            by_workflow={"wf": {"queued": 3, "running": 2}, "other": {"running": 1}},
            queued={"default": QueueDepth(due=1, delayed=1), "t2": QueueDepth(held=1)},
            oldest_due_age=(T0 + 1) - (T0 + 0.4), finished_last_minute=ended())
        assert (got.live, got.executing, got.finished) == (6, 3, 0)

        runs = {r.id: r for r in await store.list_runs(NS)}
        assert await store.settle_run(fence(runs[a.id]), Settlement("succeeded", output=1),
                                      T0 + 2)
        assert await store.settle_run(fence(runs[b.id]), Settlement("failed", error="E"),
                                      T0 + 3)
        assert await store.settle_run(fence(runs[c.id]), Settlement("retry", run_at=T0 + 50),
                                      T0 + 3)
        got = await read(
            store, other, T0 + 4, by_status=counts(queued=4, succeeded=1, failed=1),
            by_workflow={"wf": {"queued": 3, "succeeded": 1, "failed": 1},
                         "other": {"queued": 1}},
            queued={"default": QueueDepth(due=1, delayed=2), "t2": QueueDepth(held=1)},
            oldest_due_age=(T0 + 4) - (T0 + 0.4), finished_last_minute=ended(succeeded=1, failed=1))
        assert (got.live, got.executing, got.finished) == (4, 0, 2)

        # a sleep, a cancel of a queued run: due again once the sleep is over
        [claimed_e] = await claim(store, now=T0 + 5)
        assert claimed_e.id == e.id
        sleep = Step(1, "shoal.sleep", {"until": T0 + 20}, False, 0)
        assert await store.suspend_run(fence(claimed_e), sleep, "sleeping", T0 + 20, None, T0 + 6)
        assert (await store.cancel_run(d.id, T0 + 6)).status == RunStatus.CANCELLED  # type: ignore[union-attr]
        await read(store, other, T0 + 7,
                   by_status=counts(queued=2, sleeping=1, succeeded=1, failed=1, cancelled=1),
                   queued={"default": QueueDepth(delayed=1), "t2": QueueDepth(held=1)},
                   oldest_due_age=None,
                   finished_last_minute=ended(succeeded=1, failed=1, cancelled=1))
        await read(store, other, T0 + 25, oldest_due_age=5.0,
                   by_workflow={"wf": {"queued": 1, "sleeping": 1, "succeeded": 1, "failed": 1,
                                       "cancelled": 1},
                                "other": {"queued": 1}})

        # an approval (waiting, a pending pause) and a released claim (interrupted)
        [woken] = await claim(store, now=T0 + 25)
        assert woken.id == e.id
        step = Step(2, "shoal.approval:refund", {"pause_id": "p"}, False, 0)
        assert await store.create_pause(fence(woken), step, new_pause(woken, T0 + 26), T0 + 26)
        g = await add(store, T0 + 26, workflow="other")
        [claimed_g] = await claim(store, now=T0 + 27)
        assert claimed_g.id == g.id and await store.release_run(fence(claimed_g), T0 + 27)
        await read(store, other, T0 + 28,
                   by_status=counts(queued=2, waiting=1, interrupted=1, succeeded=1, failed=1,
                                    cancelled=1),
                   by_workflow={"wf": {"queued": 1, "waiting": 1, "succeeded": 1, "failed": 1,
                                       "cancelled": 1},
                                "other": {"queued": 1, "interrupted": 1}},
                   pending_pauses=1, oldest_due_age=None)

        # a failed run retried is live again; a pruned run is counted no more
        run, retried = await store.retry_run(NS, b.id, None, T0 + 30)
        assert retried and run is not None and run.status == RunStatus.QUEUED
        assert await store.prune_runs(NS, T0 + 2.5, 10) == 1        # a, finished at T0 + 2
        await read(store, other, T0 + 31,
                   by_status=counts(queued=3, waiting=1, interrupted=1, cancelled=1),
                   by_workflow={"wf": {"queued": 2, "waiting": 1, "cancelled": 1},
                                "other": {"queued": 1, "interrupted": 1}},
                   queued={"default": QueueDepth(delayed=1),
                           "t2": QueueDepth(due=1, held=1)},
                   oldest_due_age=1.0, finished_last_minute=ended(cancelled=1))
        # a late fold, then a read of a clock that far on: the totals stay, the minute is over
        await read(store, other, T0 + 500, by_status=counts(queued=3, waiting=1,
                                                            interrupted=1, cancelled=1),
                   finished_last_minute=ended())
        # the other namespace is apart
        assert (await store.stats("elsewhere", T0 + 31)).by_status == counts(queued=1)

    async def test_the_last_minute_is_counted_in_whole_seconds(
        self, store: Store, other: Store
    ) -> None:
        outcomes = [(T0 + 0.5, "succeeded"), (T0 + 1.0, "failed"), (T0 + 59.9, "succeeded"),
                    (T0 + 60.5, "cancelled")]
        for i, _ in enumerate(outcomes):
            await add(store, T0 - 10 + i)
        claimed = await claim(store, now=T0, limit=len(outcomes))
        for run, (at, outcome) in zip(claimed, outcomes, strict=True):
            assert await store.settle_run(fence(run), Settlement(outcome), at)  # type: ignore[arg-type]
        # since floor(now) - 59: T0 + 1 at T0 + 60.x, T0 + 2 at T0 + 61
        await read(store, other, T0 + 60.0, finished_last_minute=ended(succeeded=1, failed=1,
                                                                       cancelled=1))
        await read(store, other, T0 + 60.99, finished_last_minute=ended(succeeded=1, failed=1,
                                                                        cancelled=1))
        await read(store, other, T0 + 61.0, finished_last_minute=ended(succeeded=1,
                                                                       cancelled=1))
        await read(store, other, T0 + 119.5, finished_last_minute=ended(cancelled=1))
        await read(store, other, T0 + 120, finished_last_minute=ended())
        # folded by an instance whose clock is a minute ahead: the same answers
        await other.fold_stats(NS, T0 + 121)
        await read(store, other, T0 + 60.0, finished_last_minute=ended(succeeded=1, failed=1,
                                                                       cancelled=1))
        await read(store, other, T0 + 61.0, finished_last_minute=ended(succeeded=1,
                                                                       cancelled=1))
        await read(store, other, T0 + 300, by_status=counts(succeeded=2, failed=1, cancelled=1),
                   finished_last_minute=ended())

    async def test_the_oldest_due_run(self, store: Store, other: Store) -> None:
        await add(store, T0, delay=30)                       # due at T0 + 30
        await add(store, T0 + 5)                             # due at T0 + 5
        held, _ = await store.create_run(new_run(T0 + 1), max_queued=1, admission="park")
        assert held.held                                     # never due while held
        await read(store, other, T0 + 4, oldest_due_age=None)
        await read(store, other, T0 + 10, oldest_due_age=5.0)
        await read(store, other, T0 + 40, oldest_due_age=35.0)
        # claims go by priority and creation, not by how long a run has been due
        [first] = await claim(store, now=T0 + 40, limit=1)
        assert first.run_at == T0 + 40 and first.created_at == T0
        await read(store, other, T0 + 41, oldest_due_age=36.0,
                   queued={"default": QueueDepth(due=1, held=1)})

    async def test_pauses_and_the_outbox(self, store: Store, other: Store) -> None:
        run = await add(store)
        [c] = await claim(store)
        sent = entries(c, 1, "email", "sms", "hook", now=T0)
        assert await store.checkpoint_step(fence(c), Step(1, "send", None, True, 0), 30.0, T0,
                                           sent)
        await read(store, other, T0, outbox_backlog=3, dead_letters=0, pending_pauses=0)
        await store.finish_delivery(sent[0].id, T0 + 1)
        await store.finish_delivery(sent[1].id, T0 + 1, "ConnectionError", None)   # dead
        await store.finish_delivery(sent[2].id, T0 + 1, "ConnectionError", T0 + 9)  # again later
        step = Step(2, "shoal.approval:refund", {"pause_id": "p"}, False, 0)
        assert await store.create_pause(fence(c), step, new_pause(c, T0 + 2), T0 + 2)
        await read(store, other, T0 + 2, outbox_backlog=1, dead_letters=1, pending_pauses=1,
                   by_status=counts(waiting=1))
        assert run.id == c.id
