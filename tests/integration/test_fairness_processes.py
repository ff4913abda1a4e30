"""Three worker processes serve a workflow of ``fairness="tenant"`` over one store (a SQLite
file, a PostgreSQL schema): while they work through one tenant's backlog of 2,000 runs, another
tenant's five runs, dispatched behind it, start within a few claims, as the workers' own log of
starts shows; FIFO would start them after the whole backlog."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import fair_app
import pytest
from backends import postgres_schema
from harness import Processes, read_log, wait_until

HERE = Path(__file__).resolve().parent
BACKLOG = 2_000
SMALL = 5


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shoal.db'}?busy_timeout=30"
    else:
        with postgres_schema("shoal_fair_") as url:
            yield url


def starts(log: Path) -> list[dict[str, object]]:
    return sorted((r for r in read_log(log) if r["kind"] == "start"),
                  key=lambda r: float(r["t"]))   # type: ignore[arg-type]


@pytest.mark.timeout(180)
async def test_a_small_tenant_starts_early_behind_a_large_backlog(tmp_path: Path,
                                                                  store_url: str) -> None:
    log = tmp_path / "effects.log"
    app = fair_app.make_app(store_url)
    procs = Processes(tmp_path, HERE / "fair_app.py", "FAIR",
                      {"FAIR_STORE": store_url, "FAIR_LOG": str(log), "FAIR_MAX_LIFE": "170"})
    try:
        async with app.open():   # migrates the store before the workers open it
            for n in range(3):
                procs.start_worker(f"w{n}")
            await procs.wait_started(log)
            await app.dispatch_many("job", [{"seconds": 0.1}] * BACKLOG, tenant="big")

            async def working() -> int:   # the backlog is being worked by the workers
                started = sum(1 for r in read_log(log)
                              if r["kind"] == "start" and r["tenant"] == "big")
                return started if started >= 12 else 0

            big_started_when_dispatched = await wait_until(working, 30, "the backlog to start")
            small = await app.dispatch_many("job", [{"seconds": 0.1}] * SMALL, tenant="small")
            for run in small:
                assert await app.result(run.id, timeout=60) is None
            codes = procs.stop_workers()
            assert all(code == 0 for code in codes.values()), (codes, procs.stderr_tail())
        order = starts(log)
        assert len({r["pid"] for r in order}) > 1, "one worker did all"
        last_small = max(i for i, r in enumerate(order) if r["tenant"] == "small")
        big_before = sum(1 for r in order[:last_small] if r["tenant"] == "big")
        print(f"big runs started: {big_started_when_dispatched} at the small dispatch, "
              f"{big_before} at the last small start")
        # six slots: after the dispatch each claim deals the small tenant (none running) first;
        # a few big runs start meanwhile as slots free before the small runs are seen
        assert big_before - big_started_when_dispatched <= 30, (big_before, last_small)
        assert big_before < BACKLOG // 10, "the small tenant waited behind the backlog"
        assert sum(1 for r in order if r["tenant"] == "small") == SMALL
    except BaseException:
        print(procs.stderr_tail())
        raise
    finally:
        procs.cleanup()

