"""The counterexamples ``test_store_properties.py`` found, shrunk, as plain tests on every store
(memory, SQLite, and PostgreSQL in a schema of the test's own: skipped without a server, failed
under ``CI``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shoal.backends.memory import MemoryStore
from shoal.backends.sqlite import SQLiteStore
from shoal.ports import Store
from shoal.testing.contract import NS, T0, new_run
from shoal.types import Pause, Run


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s: Store
    if request.param == "memory":
        s = MemoryStore()
        await s.open()
    elif request.param == "sqlite":
        s = SQLiteStore(str(tmp_path / "shoal.db"))
        await s.open()
    else:
        from test_postgres import _open

        s = await _open(request.getfixturevalue("schema"))
    yield s
    await s.close()


def times_of(record: Run | Pause) -> dict[str, object]:
    names = ("created_at", "run_at", "lease_expires_at", "started_at", "finished_at",
             "expires_at", "resolved_at")
    return {n: getattr(record, n) for n in names if getattr(record, n, None) is not None}


async def test_the_times_of_a_run_written_are_floats_as_when_it_is_read(store: Store) -> None:
    # SQLite gave back a whole-second time as an int from a write (RETURNING), a float from a
    # read of the same row
    [(run, _)] = await store.create_runs([new_run(T0)], max_queued=None, admission="reject")
    [claimed] = await store.claim_runs(NS, ["wf"], "a", 1, 30.0, T0)
    cancelled = await store.cancel_run(run.id, T0)      # a request: the run is running
    assert cancelled is not None and cancelled.cancel_requested
    for answer in (run, claimed, cancelled):
        assert all(type(t) is float for t in times_of(answer).values()), times_of(answer)
    assert times_of(cancelled) == times_of(await store.get_run(run.id))  # type: ignore[arg-type]
