"""Several worker processes serve a workflow of ``concurrency_limit=2`` over one store (a SQLite
file, a PostgreSQL schema): from the log of the runs' starts and ends (``limit_app.py``), at most
two runs of a key ever overlapped, and two did (the limit binds, and lets two through)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import limit_app
import pytest
from backends import postgres_schema
from harness import Processes, read_log, wait_all_final

HERE = Path(__file__).resolve().parent
LIMIT = 2


def most_at_once(records: list[dict[str, Any]]) -> dict[str, int]:
    """Per key, the most runs between their start and their end at one time (an end before a
    start at the same time)."""
    events = sorted((r["t"], r["kind"] == "start", r["key"]) for r in records
                     if r["kind"] in ("start", "end"))
    now: dict[str, int] = defaultdict(int)
    most: dict[str, int] = defaultdict(int)
    for _, start, key in events:
        now[key] += 1 if start else -1
        most[key] = max(most[key], now[key])
    return dict(most)


def test_most_at_once_counts_overlaps() -> None:
    log = [{"kind": "start", "key": "a", "t": 1}, {"kind": "start", "key": "a", "t": 2},
           {"kind": "end", "key": "a", "t": 3}, {"kind": "start", "key": "a", "t": 3},
           {"kind": "start", "key": "b", "t": 3}, {"kind": "start", "key": "a", "t": 3.5},
           {"kind": "end", "key": "a", "t": 4}]
    assert most_at_once(log) == {"a": 3, "b": 1}


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shoal.db'}?busy_timeout=30"
    else:
        with postgres_schema("shoal_limit_") as url:
            yield url


@pytest.mark.timeout(180)
async def test_workers_never_run_more_than_the_limit_of_a_key(tmp_path: Path,
                                                              store_url: str) -> None:
    log = tmp_path / "effects.log"
    app = limit_app.make_app(store_url, limit=LIMIT)
    procs = Processes(tmp_path, HERE / "limit_app.py", "LIMIT",
                      {"LIMIT_STORE": store_url, "LIMIT_LOG": str(log), "LIMIT_N": str(LIMIT),
                       "LIMIT_MAX_LIFE": "170"})
    try:
        async with app.open():   # migrates the store before the workers open it
            for n in range(3):
                procs.start_worker(f"w{n}")
            await procs.wait_started(log)   # every worker claims from the first dispatch
            runs = [await app.dispatch("export", {"key": key, "seconds": 0.2})
                    for _ in range(8) for key in ("ana", "bo", "cy")]
            final = await wait_all_final(app.store, limit_app.NAMESPACE, len(runs), timeout=120)
            await procs.wait_started(log)
            codes = procs.stop_workers()
            assert all(code == 0 for code in codes.values()), (codes, procs.stderr_tail())
        assert {r.id for r in final} == {r.id for r in runs}
        assert all(r.status.value == "succeeded" for r in final), [r.error for r in final]
        records = read_log(log)
        assert len({r["pid"] for r in records if r["kind"] == "start"}) > 1, "one worker did all"
        most = most_at_once(records)
        assert max(most.values()) <= LIMIT, most
        assert LIMIT in most.values(), f"the limit never let {LIMIT} runs of a key through: {most}"
    except BaseException:
        print(procs.stderr_tail())
        raise
    finally:
        procs.cleanup()
