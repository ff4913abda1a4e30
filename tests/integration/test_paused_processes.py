"""A paused workflow over two real worker processes (``proc_app.py``), on a SQLite file and on a
PostgreSQL schema: while workflow ``long`` is paused, none of its queued runs starts on either
worker, though runs of ``chaos`` dispatched after them all finish, and the one run of ``long``
that was running when the pause came goes on to its end; once resumed, every run finishes.
Checked from the store's rows and from the steps' log, never by timing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import proc_app
import pytest
from backends import postgres_schema
from harness import Processes, read_log, wait_all_final, wait_until

HERE = Path(__file__).resolve().parent
PROC_APP = HERE / "proc_app.py"
NAMESPACE = proc_app.NAMESPACE


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The worker's store variable and its value: a SQLite path or a PostgreSQL schema's URL."""
    if request.param == "sqlite":
        yield "PROC_DB", str(tmp_path / "shoal.db")
    else:
        with postgres_schema("shoal_pause_") as url:
            yield "PROC_STORE", url


@pytest.mark.timeout(180)
async def test_a_paused_workflow_starts_on_no_worker_until_resumed(
    tmp_path: Path, store: tuple[str, str]
) -> None:
    variable, where = store
    log = tmp_path / "effects.log"
    app = proc_app.make_app(where, busy_timeout=30.0)
    procs = Processes(tmp_path, PROC_APP, "PROC",
                      {variable: where, "PROC_LOG": str(log), "PROC_LEASE": "2.0",
                       "PROC_DRAIN": "5", "PROC_MAX_LIFE": "170"})
    try:
        async with app.open():   # migrates the store before the workers open it
            for slot in ("A", "B"):
                procs.start_worker(slot)
            await procs.wait_started(log)
            # a run of long that is running when the pause comes: it goes on
            busy = await app.dispatch("long", {"durs": [0.0, 1.5, 0.0], "i": "busy"})

            async def busy_running() -> bool:
                return (await app.get_run(busy.id)).status == "running"
            await wait_until(busy_running, 30, "the first run of long to start")
            assert await app.pause_workflow("long")

            held = [await app.dispatch("long", {"durs": [0.0], "i": i}) for i in range(6)]
            others = [await app.dispatch("chaos", {"i": i}) for i in range(12)]

            async def others_done() -> bool:
                runs = [await app.get_run(r.id) for r in [busy, *others]]
                return all(r.status.final for r in runs)
            await wait_until(others_done, 60, "the runs of chaos and the busy run to end")
            assert (await app.get_run(busy.id)).status == "succeeded"
            for run in others:
                assert (await app.get_run(run.id)).status == "succeeded"
            for run in held:
                still = await app.get_run(run.id)
                assert still.status == "queued" and still.started_at is None, still
            held_ids = {r.id for r in held}
            assert not [r for r in read_log(log) if r.get("run") in held_ids]

            assert await app.resume_workflow("long")
            runs = await wait_all_final(app.store, NAMESPACE, 1 + len(held) + len(others), 60)
            assert {r.status.value for r in runs} == {"succeeded"}, runs
            assert {r["run"] for r in read_log(log) if r.get("kind") == "end"} >= held_ids
        codes = procs.stop_workers()
        assert set(codes.values()) == {0}, (codes, procs.stderr_tail())
    except BaseException:
        print(procs.stderr_tail())
        raise
    finally:
        procs.cleanup()
