"""Several worker processes serve a workflow of ``rate_limit=shoal.Rate(3, per=1.0,
key=partner)`` over one store (a SQLite file, a PostgreSQL schema): from the log of the runs'
first starts (``rate_app.py``), no window of a partner held more than three starts, and the
rate bound (the runs of a partner waited for the window: their starts span at least two
windows, and a window held three)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rate_app
from backends import postgres_schema
from harness import Processes, read_log, wait_all_final

HERE = Path(__file__).resolve().parent
LIMIT, PER = 3, 1.0
PER_PARTNER = 9
# The log's times are the workers' own, taken a moment after the claim the store counted (each
# process its own moment): a window of the log is checked a little shorter than the rate's.
SLACK = 0.15


def most_in_a_window(records: list[dict[str, Any]], width: float) -> dict[str, int]:
    """Per key, the most starts within ``width`` seconds of one another (a window
    ``[t, t + width)`` from each start ``t``)."""
    times: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r["kind"] == "start":
            times[r["key"]].append(r["t"])
    most = {}
    for key, ts in times.items():
        ts.sort()
        most[key] = max(sum(1 for u in ts[i:] if u < t + width) for i, t in enumerate(ts))
    return most


def test_most_in_a_window_counts_starts_within_the_width() -> None:
    log = [{"kind": "start", "key": "a", "t": t} for t in (0.0, 0.5, 0.99, 1.0, 1.6)]
    log.append({"kind": "start", "key": "b", "t": 3.0})
    assert most_in_a_window(log, 1.0) == {"a": 3, "b": 1}
    assert most_in_a_window(log, 0.5) == {"a": 2, "b": 1}


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shoal.db'}?busy_timeout=30"
    else:
        with postgres_schema("shoal_rate_") as url:
            yield url


@pytest.mark.timeout(180)
async def test_workers_never_start_more_than_the_rate_allows(tmp_path: Path,
                                                             store_url: str) -> None:
    log = tmp_path / "effects.log"
    app = rate_app.make_app(store_url, limit=LIMIT, per=PER)
    procs = Processes(tmp_path, HERE / "rate_app.py", "RATE",
                      {"RATE_STORE": store_url, "RATE_LOG": str(log), "RATE_N": str(LIMIT),
                       "RATE_PER": str(PER), "RATE_MAX_LIFE": "170"})
    try:
        async with app.open():   # migrates the store before the workers open it
            for n in range(3):
                procs.start_worker(f"w{n}")
            await procs.wait_started(log)   # every worker claims from the first dispatch
            runs = await app.dispatch_many("call", [
                {"partner": partner, "n": i} for i in range(PER_PARTNER)
                for partner in ("ana", "bo")])
            final = await wait_all_final(app.store, rate_app.NAMESPACE, len(runs), timeout=120)
            codes = procs.stop_workers()
            assert all(code == 0 for code in codes.values()), (codes, procs.stderr_tail())
        assert {r.id for r in final} == {r.id for r in runs}
        assert all(r.status.value == "succeeded" for r in final), [r.error for r in final]
        records = [r for r in read_log(log) if r["kind"] == "start"]
        assert len(records) == len(runs), "a run's first start was logged once"
        assert len({r["pid"] for r in records}) > 1, "one worker did all"
        most = most_in_a_window(records, PER - SLACK)
        assert max(most.values()) <= LIMIT, most
        # the rate binds: every partner's window filled, and its runs waited for the next ones
        assert most == {"ana": LIMIT, "bo": LIMIT}, most
        for partner in ("ana", "bo"):
            ts = sorted(r["t"] for r in records if r["key"] == partner)
            assert ts[-1] - ts[0] >= (PER_PARTNER // LIMIT - 1) * PER - SLACK, (partner, ts)
    except BaseException:
        print(procs.stderr_tail())
        raise
    finally:
        procs.cleanup()
