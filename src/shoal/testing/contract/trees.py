"""The run trees' contract: keys shared by a root's descendants (first writer wins, they go with
the root, they carry its tenant), a parent waiting for its child, a root's cancel reaching its
tree (:class:`~shoal.ports.Trees`, with the run queue).

Subclass :class:`TreeContract` and provide the ``store`` and ``other`` fixtures (see
:mod:`shoal.testing.contract`).
"""

from __future__ import annotations

import asyncio

from shoal.ports import Store
from shoal.testing.contract.support import LEASE, NS, T0, add, claim, fence, new_run, replace_parent
from shoal.types import RunStatus, Settlement, Step


class TreeContract:
    """Run trees: every backend of :class:`~shoal.ports.Trees` behaves like this. The
    store gets ``now`` explicitly in every call."""

    # -- trees: request-wide state and child runs ---------------------------------------------

    async def test_tree_keys_first_wins_and_go_with_the_root(
        self, store: Store, other: Store
    ) -> None:
        root = await add(store)
        got = await asyncio.gather(
            store.save_tree_key(root.id, "subtopic:7", {"by": "a"}, "a", T0),
            other.save_tree_key(root.id, "subtopic:7", {"by": "b"}, "b", T0))
        assert sorted(got) == [False, True]
        winner = "a" if got[0] else "b"
        assert await other.get_tree_key(root.id, "subtopic:7") == {"by": winner}
        # the claimant that stored it gets True again (a re-executed step)
        assert await store.save_tree_key(root.id, "subtopic:7", {"by": "x"}, winner, T0)
        assert await store.get_tree_key(root.id, "missing") is None
        assert await store.get_tree_key("other-root", "subtopic:7") is None
        [c] = await claim(store)
        assert await store.suspend_run(fence(c), Step(1, "shoal.sleep", {}, False, 0),
                                       "sleeping", T0 + 5, None, T0)
        assert await store.get_tree_key(root.id, "subtopic:7") == {"by": winner}  # kept
        [c] = await claim(store, now=T0 + 5)
        assert await store.settle_run(fence(c), Settlement("succeeded"), T0 + 6)
        assert await store.get_tree_key(root.id, "subtopic:7") is None           # gone

    async def test_a_tree_key_carries_its_roots_tenant(self, store: Store, other: Store) -> None:
        """Each key carries the tenant of its tree's root run, whichever run of the tree stored
        it; the keys of another tree carry theirs."""
        acme = await add(store, tenant="acme")
        plain = await add(store)
        child, _ = await store.create_run(replace_parent(new_run(T0 + 1), acme),
                                          max_queued=None, admission="reject")
        assert child.tenant == "acme" and child.root_id == acme.id
        assert await store.save_tree_key(acme.id, "paper:2", 1, "root-step", T0)
        assert await other.save_tree_key(child.root_id, "paper:1", 2, "child-step", T0 + 1)
        assert await store.save_tree_key(plain.id, "paper:1", 3, "s", T0)
        assert not await store.save_tree_key(acme.id, "paper:1", 4, "late", T0 + 2)   # taken
        assert await other.tree_keys(acme.id) == [("paper:1", "acme"), ("paper:2", "acme")]
        assert await store.tree_keys(plain.id) == [("paper:1", "default")]
        assert not await store.save_tree_key("no-such-root", "paper:1", 5, "s", T0)
        assert await store.tree_keys("no-such-root") == []
        await store.cancel_run(acme.id, T0 + 3)                          # the root ends
        assert await store.tree_keys(acme.id) == []
        assert await other.tree_keys(plain.id) == [("paper:1", "default")]

    async def test_a_child_ending_wakes_its_waiting_parent(self, store: Store) -> None:
        parent = await add(store)
        [p] = await claim(store, limit=1)
        child, _ = await store.create_run(replace_parent(new_run(T0 + 1), parent),
                                          max_queued=None, admission="reject")
        assert child.parent_id == parent.id and child.root_id == parent.id
        waiting = await store.wait_child(fence(p), Step(1, "shoal.child", {}, False, 0),
                                         child.id, T0 + 1)
        assert waiting is not None and not waiting.status.final
        r = await store.get_run(parent.id)
        assert r is not None and r.status == RunStatus.WAITING
        [c] = await claim(store, owner="b", now=T0 + 2)
        assert c.id == child.id
        assert await claim(store, now=T0 + 2) == []                  # the parent is not due
        assert await store.settle_run(fence(c), Settlement("succeeded", output=7), T0 + 3)
        [p] = await claim(store, now=T0 + 3)                          # due at once
        assert p.id == parent.id
        done = await store.wait_child(fence(p), Step(1, "shoal.child", {}, False, 0),
                                      child.id, T0 + 4)
        assert done is not None and done.status == RunStatus.SUCCEEDED
        [s] = await store.load_steps(parent.id)
        assert s.finished and s.output == {"status": "succeeded", "output": 7, "error": None}

    async def test_a_child_that_fails_by_recovery_or_cancel_wakes_the_parent(
        self, store: Store
    ) -> None:
        parent = await add(store)
        [p] = await claim(store, limit=1)
        child, _ = await store.create_run(replace_parent(new_run(T0 + 1, max_attempts=1),
                                                         parent),
                                          max_queued=None, admission="reject")
        await store.wait_child(fence(p), Step(1, "c", {}, False, 0), child.id, T0 + 1)
        [c] = await claim(store, now=T0 + 1)
        [failed] = await store.recover_runs(NS, T0 + 1 + LEASE)        # its worker died
        assert failed.id == child.id and failed.status == RunStatus.FAILED
        [p] = await claim(store, now=T0 + 1 + LEASE)
        assert p.id == parent.id
        second, _ = await store.create_run(replace_parent(new_run(T0 + 40), parent),
                                           max_queued=None, admission="reject")
        await store.wait_child(fence(p), Step(2, "c", {}, False, 0), second.id, T0 + 41)
        await store.cancel_run(second.id, T0 + 42)
        [p] = await claim(store, now=T0 + 42)
        assert p.id == parent.id and c.id == child.id

    async def test_cancelling_a_root_cancels_its_tree(self, store: Store) -> None:
        root = await add(store)
        [r] = await claim(store, limit=1)
        queued, _ = await store.create_run(replace_parent(new_run(T0 + 1), root),
                                           max_queued=None, admission="reject")
        running, _ = await store.create_run(replace_parent(new_run(T0 + 2), root),
                                            max_queued=None, admission="reject")
        [c] = await claim(store, owner="b", now=T0 + 2, limit=1)
        assert c.id == queued.id
        [c2] = await claim(store, owner="b", now=T0 + 2, limit=1)
        assert c2.id == running.id
        assert await store.settle_run(fence(c), Settlement("retry", error="x", run_at=T0 + 99),
                                      T0 + 3)
        cancelled = await store.cancel_run(root.id, T0 + 4)
        assert cancelled is not None and cancelled.cancel_requested
        q = await store.get_run(queued.id)
        assert q is not None and q.status == RunStatus.CANCELLED
        rn = await store.get_run(running.id)
        assert rn is not None and rn.status == RunStatus.RUNNING and rn.cancel_requested
        assert r.id == root.id
