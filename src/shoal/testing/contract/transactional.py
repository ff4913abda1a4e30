"""The contract of runs dispatched in the caller's own transaction
(:class:`~shoal.ports.TransactionalDispatch`, what ``app.dispatch(..., connection=conn)`` uses):
the run exists if and only if the caller's transaction commits, together with the caller's own
writes; idempotency keys and admission behave as in ``create_run``; a connection to another
database, or of another kind, is refused.

Subclass :class:`TransactionalContract` and provide, beside ``store`` and ``other`` (see
:mod:`shoal.testing.contract`), two fixtures that return a factory of :class:`CallerTransaction`
context managers: ``caller`` (transactions on the store's database, with a table of the
caller's own that the store must not mistake for its ``runs``) and ``stranger`` (transactions
on another database, which the store refuses).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import pytest

from shoal.errors import AdmissionRejectedError, ConfigurationError
from shoal.ports import Store, TransactionalDispatch
from shoal.testing.contract.support import NS, T0, add, claim, new_run


class CallerTransaction(Protocol):
    """A caller's own open transaction, as a test drives it: ``connection`` is what the caller
    hands to ``create_run_in``. It is rolled back at the end of its ``async with`` unless
    committed."""

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
