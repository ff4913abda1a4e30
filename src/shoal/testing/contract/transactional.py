"""The contract of runs dispatched in the caller's own transaction
(:class:`~shoal.ports.TransactionalDispatch`, what ``app.dispatch(..., connection=conn)`` and
``app.dispatch_many(..., connection=conn)`` use): the run, or the whole batch, exists if and only
if the caller's transaction commits, together with the caller's own writes; idempotency keys and
admission behave as in ``create_run`` and ``create_runs``, counting what the transaction sees; a
connection to another database, or of another kind, is refused.

Subclass :class:`TransactionalContract` and provide, beside ``store`` and ``other`` (see
:mod:`shoal.testing.contract`), two fixtures that return a factory of :class:`CallerTransaction`
context managers: ``caller`` (transactions on the store's database, with a table of the
caller's own that the store must not mistake for its ``runs``) and ``stranger`` (transactions
on another database, which the store refuses).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import pytest

from shoal.errors import AdmissionRejectedError, ConfigurationError
from shoal.ports import Store, TransactionalDispatch
from shoal.testing.contract.support import NS, T0, add, claim, new_run


class CallerTransaction(Protocol):
    """A caller's own open transaction, as a test drives it: ``connection`` is what the caller
    hands to ``create_run_in`` and ``create_runs_in``. It is rolled back at the end of its
    ``async with`` unless committed."""

    connection: object

    async def note(self, text: str) -> None:
        """Write ``text`` to the caller's own table, in this transaction."""

    async def notes(self) -> list[str]:
        """The texts in the caller's own table, as another connection reads them (committed)."""

    async def commit(self) -> None:
        """Commit the caller's transaction."""

    async def rollback(self) -> None:
        """Roll the caller's transaction back."""


Callers = Callable[[], AbstractAsyncContextManager[CallerTransaction]]


class _Both(Store, TransactionalDispatch, Protocol):
    pass


class TransactionalContract:
    """Runs written in a caller's transaction: there if and only if it commits."""

    async def test_a_committed_run_comes_with_the_caller_s_writes(
        self, store: _Both, other: Store, caller: Callers
    ) -> None:
        async with caller() as tx:
            await tx.note("order-1")
            run, created = await store.create_run_in(
                tx.connection, new_run(input={"order": 1}), max_queued=None, admission="reject")
            assert created and run.status == "queued" and run.input == {"order": 1}
            # not there for anyone else before the caller commits
            assert await other.get_run(run.id) is None
            assert await claim(other) == []
            await tx.commit()
            assert await tx.notes() == ["order-1"]
        got = await other.get_run(run.id)
        assert got is not None and got.status == "queued" and got.input == {"order": 1}
        [claimed] = await claim(other, now=T0 + 1)
        assert claimed.id == run.id

    async def test_the_trace_context_is_kept_in_the_caller_s_transaction(
        self, store: _Both, other: Store, caller: Callers
    ) -> None:
        carrier = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
        async with caller() as tx:
            run, _ = await store.create_run_in(
                tx.connection, dataclasses.replace(new_run(), trace_context=carrier),
                max_queued=None, admission="reject")
            batch = await store.create_runs_in(
                tx.connection, [dataclasses.replace(new_run(), trace_context=carrier),
                                new_run()], max_queued=None, admission="reject")
            await tx.commit()
        assert run.trace_context == carrier
        assert [r.trace_context for r, _ in batch] == [carrier, None]
        for r in (run, *(r for r, _ in batch)):
            got = await other.get_run(r.id)
            assert got is not None and got.trace_context == r.trace_context

    async def test_a_rolled_back_run_never_was(
        self, store: _Both, other: Store, caller: Callers
    ) -> None:
        async with caller() as tx:
            await tx.note("order-2")
            run, created = await store.create_run_in(
                tx.connection, new_run(idem="k"), max_queued=None, admission="reject")
            assert created
            await tx.rollback()
            assert await tx.notes() == []
        assert await other.get_run(run.id) is None
        assert await other.list_runs(NS) == []
        assert await claim(other, now=T0 + 1) == []
        # nor is its idempotency key taken
        again, created = await other.create_run(new_run(T0 + 1, idem="k"), max_queued=None,
                                                admission="reject")
        assert created and again.id != run.id

    async def test_idempotency_keys_as_in_create_run(
        self, store: _Both, other: Store, caller: Callers
    ) -> None:
        first, _ = await other.create_run(new_run(idem="a"), max_queued=None,
                                          admission="reject")
        async with caller() as tx:
            again, created = await store.create_run_in(
                tx.connection, new_run(T0 + 1, idem="a"), max_queued=None, admission="reject")
            assert not created and again.id == first.id
            b, created = await store.create_run_in(
                tx.connection, new_run(T0 + 2, idem="b"), max_queued=None, admission="reject")
            assert created
            # the transaction's own run, not committed yet, is the key's run
            b2, created = await store.create_run_in(
                tx.connection, new_run(T0 + 3, idem="b"), max_queued=1, admission="reject")
            assert not created and b2.id == b.id
            await tx.commit()
        assert [r.id for r in await other.list_runs(NS)] == [first.id, b.id]

    async def test_admission_counts_what_the_transaction_sees(
        self, store: _Both, other: Store, caller: Callers
    ) -> None:
        queued = await add(other)
        async with caller() as tx:
            await tx.note("kept")
            with pytest.raises(AdmissionRejectedError):
                await store.create_run_in(tx.connection, new_run(T0 + 1), max_queued=1,
                                          admission="reject")
            # refused, not failed: the caller's transaction goes on
            parked, created = await store.create_run_in(
                tx.connection, new_run(T0 + 2), max_queued=1, admission="park")
            assert created and parked.held
            mine, created = await store.create_run_in(
                tx.connection, new_run(T0 + 3), max_queued=3, admission="park")
            assert created and mine.held   # behind the one parked before it
            await tx.commit()
            assert await tx.notes() == ["kept"]
        assert [(r.id, r.held) for r in await other.list_runs(NS)] == [
            (queued.id, False), (parked.id, True), (mine.id, True)]
        assert [r.id for r in await claim(other, now=T0 + 5)] == [queued.id]

    async def test_a_concurrency_key_is_kept(
        self, store: _Both, other: Store, caller: Callers
    ) -> None:
        async with caller() as tx:
            a, _ = await store.create_run_in(tx.connection, new_run(key="c"), max_queued=None,
                                             admission="reject")
            b, _ = await store.create_run_in(tx.connection, new_run(T0 + 1, key="c"),
                                             max_queued=None, admission="reject")
            await tx.commit()
        assert [r.id for r in await claim(other, now=T0 + 2)] == [a.id]
        assert await claim(other, now=T0 + 2) == []
        assert (await other.get_run(b.id)).concurrency_key == "c"  # type: ignore[union-attr]

    async def test_a_connection_to_another_database_is_refused(
        self, store: _Both, other: Store, stranger: Callers
    ) -> None:
        async with stranger() as tx:
            with pytest.raises(ConfigurationError, match="connection="):
                await store.create_run_in(tx.connection, new_run(), max_queued=None,
                                          admission="reject")
            # the caller's transaction is as it was: its own writes still commit
            await tx.note("after")
            await tx.commit()
            assert await tx.notes() == ["after"]
        assert await other.list_runs(NS) == []

    async def test_a_connection_of_another_kind_is_a_type_error(self, store: _Both) -> None:
        with pytest.raises(TypeError, match="connection="):
            await store.create_run_in(object(), new_run(), max_queued=None, admission="reject")
        assert await store.list_runs(NS) == []

    # -- a batch in the caller's transaction (create_runs_in) -------------------------------

    async def test_a_committed_batch_comes_with_the_caller_s_writes(
        self, store: _Both, other: Store, caller: Callers
    ) -> None:
        news = [new_run(input={"i": i}, idem=f"o{i}" if i % 2 else None,
                        key="c" if i < 2 else None) for i in range(5)]
        async with caller() as tx:
            await tx.note("orders")
            got = await store.create_runs_in(tx.connection, news, max_queued=None,
                                             admission="reject")
            assert [(r.id, c, r.input) for r, c in got] == [
                (n.id, True, n.input) for n in news]
            # not there for anyone else before the caller commits
            assert await other.get_run(news[0].id) is None
            assert await other.list_runs(NS) == [] and await claim(other) == []
            await tx.commit()
            assert await tx.notes() == ["orders"]
        assert await other.list_runs(NS) == [r for r, _ in got]
        claimed = await claim(other, now=T0 + 1)
        # the concurrency key is kept: one of the two runs of key "c" starts
        assert [r.id for r in claimed] == [news[0].id, news[2].id, news[3].id, news[4].id]

    async def test_a_rolled_back_batch_never_was_and_its_keys_are_free(
        self, store: _Both, other: Store, caller: Callers
    ) -> None:
        news = [new_run(idem="a"), new_run(), new_run(idem="b")]
        async with caller() as tx:
            await tx.note("orders")
            got = await store.create_runs_in(tx.connection, news, max_queued=None,
                                             admission="reject")
            assert all(c for _, c in got)
            await tx.rollback()
            assert await tx.notes() == []
        assert await other.list_runs(NS) == []
        assert await claim(other, now=T0 + 1) == []
        again = await other.create_runs([new_run(T0 + 1, idem="a"), new_run(T0 + 1, idem="b")],
                                        max_queued=None, admission="reject")
        assert all(c for _, c in again)
        assert {r.id for r, _ in again}.isdisjoint(n.id for n in news)

    async def test_batch_keys_as_in_create_runs(
        self, store: _Both, other: Store, caller: Callers
    ) -> None:
        old, _ = await other.create_run(new_run(idem="old"), max_queued=None,
                                        admission="reject")
        async with caller() as tx:
            mine, _ = await store.create_run_in(tx.connection, new_run(idem="mine"),
                                                max_queued=None, admission="reject")
            news = [new_run(T0 + 1, idem="k", input={"i": 0}),
                    new_run(T0 + 1, idem="old", input={"i": 1}),
                    new_run(T0 + 1, idem="k", input={"i": 2}),      # k again in the batch
                    new_run(T0 + 1, idem="mine", input={"i": 3}),   # this transaction's
                    new_run(T0 + 1, input={"i": 4}),
                    new_run(T0 + 1, idem="k", tenant="t2", input={"i": 5})]
            got = await store.create_runs_in(tx.connection, news, max_queued=None,
                                             admission="reject")
            assert [(r.id, c) for r, c in got] == [
                (news[0].id, True), (old.id, False), (news[0].id, False), (mine.id, False),
                (news[4].id, True), (news[5].id, True)]
            assert got[2][0].input == {"i": 0} and got[1][0].input == {"n": 1}
            # under admission control (the keys looked up first), this batch's keys too
            again = [new_run(T0 + 2, idem="k"), new_run(T0 + 2, idem="old"),
                     new_run(T0 + 2, idem="mine"), new_run(T0 + 2)]
            got = await store.create_runs_in(tx.connection, again, max_queued=10,
                                             admission="reject")
            assert [(r.id, c) for r, c in got] == [
                (news[0].id, False), (old.id, False), (mine.id, False), (again[3].id, True)]
            await tx.commit()
        assert {r.id for r in await other.list_runs(NS)} == {
            old.id, mine.id, news[0].id, news[4].id, news[5].id, again[3].id}

    async def test_batch_admission_counts_what_the_transaction_sees(
        self, store: _Both, other: Store, caller: Callers
    ) -> None:
        queued = await add(other)
        async with caller() as tx:
            await tx.note("kept")
            mine, _ = await store.create_run_in(tx.connection, new_run(T0 + 1, idem="mine"),
                                                max_queued=None, admission="reject")
            # the committed run and this transaction's own: room for one more under 3
            with pytest.raises(AdmissionRejectedError, match="nothing of the batch"):
                await store.create_runs_in(tx.connection, [new_run(T0 + 2), new_run(T0 + 2)],
                                           max_queued=3, admission="reject")
            # refused, not failed: the caller's transaction goes on; a repeat takes no room
            got = await store.create_runs_in(
                tx.connection, [new_run(T0 + 3, idem="mine"), new_run(T0 + 3)], max_queued=3,
                admission="reject")
            assert [(r.id, c, r.held) for r, c in got] == [
                (mine.id, False, False), (got[1][0].id, True, False)]
            fits = got[1][0]
            # full: park holds them all, in batch order
            parked = await store.create_runs_in(
                tx.connection, [new_run(T0 + 4), new_run(T0 + 4, idem="mine"), new_run(T0 + 4)],
                max_queued=3, admission="park")
            assert [(c, r.held) for r, c in parked] == [(True, True), (False, False),
                                                        (True, True)]
            # and while runs are held, a new one is held behind them even with room
            [(late, created)] = await store.create_runs_in(
                tx.connection, [new_run(T0 + 5)], max_queued=100, admission="park")
            assert created and late.held
            await tx.commit()
            assert await tx.notes() == ["kept"]
        assert [(r.id, r.held) for r in await other.list_runs(NS)] == [
            (queued.id, False), (mine.id, False), (fits.id, False), (parked[0][0].id, True),
            (parked[2][0].id, True), (late.id, True)]
        assert [r.id for r in await claim(other, now=T0 + 6)] == [queued.id, mine.id, fits.id]

    async def test_a_batch_on_a_connection_to_another_database_is_refused(
        self, store: _Both, other: Store, stranger: Callers
    ) -> None:
        async with stranger() as tx:
            with pytest.raises(ConfigurationError, match="connection="):
                await store.create_runs_in(tx.connection, [new_run(), new_run(idem="k")],
                                           max_queued=None, admission="reject")
            with pytest.raises(ConfigurationError, match="connection="):
                await store.create_runs_in(tx.connection, [new_run()], max_queued=5,
                                           admission="park")
            # the caller's transaction is as it was: its own writes still commit
            await tx.note("after")
            await tx.commit()
            assert await tx.notes() == ["after"]
        assert await other.list_runs(NS) == []

    async def test_a_batch_on_a_connection_of_another_kind_is_a_type_error(
        self, store: _Both
    ) -> None:
        for news in ([new_run()], []):
            with pytest.raises(TypeError, match="connection="):
                await store.create_runs_in(object(), news, max_queued=None, admission="reject")
        assert await store.list_runs(NS) == []
