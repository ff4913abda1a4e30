"""Several worker processes serve a workflow of ``max_running=N`` and one of
``max_running_per_tenant=N`` over one store (a SQLite file, a PostgreSQL schema). From the
workers' own log of the runs' starts and ends (``cap_app.py``):

- at most N runs of the workflow (of a tenant) ever ran at once, and N did (the caps bind);
- a worker killed with SIGKILL while holding shares gives them back within lease + poll: its
  runs start again on another worker, and the cap still holds (a killed run counts until it is
  recovered);
- a new deploy with another N (the workers restarted with it) takes effect, and every run ends:
  none is stranded.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cap_app
import pytest
from backends import postgres_schema
from harness import Processes, read_log, wait_all_final, wait_until

HERE = Path(__file__).resolve().parent


def most_at_once(records: list[dict[str, Any]], group: Any,
                 killed: dict[int, float] | None = None) -> dict[Any, int]:
    """Per ``group(record)``, the most runs between their start and their end at one time (an
    end before a start at the same time). A start with no end ran until its worker was killed
    (``killed``: pid -> time of the kill)."""
    ends = {(r["run"], r["pid"]) for r in records if r["kind"] == "end"}
    events = [(r["t"], r["kind"] == "start", group(r)) for r in records
              if r["kind"] in ("start", "end")]
    for r in records:
        if r["kind"] == "start" and (r["run"], r["pid"]) not in ends:
            assert killed is not None and r["pid"] in killed, f"a run never ended: {r}"
            events.append((killed[r["pid"]], False, group(r)))
    now: dict[Any, int] = defaultdict(int)
    most: dict[Any, int] = defaultdict(int)
    for _, start, key in sorted(events):
        now[key] += 1 if start else -1
        most[key] = max(most[key], now[key])
    return dict(most)


def test_most_at_once_counts_overlaps_and_killed_runs() -> None:
    log = [{"kind": "start", "run": "a", "pid": 1, "k": "x", "t": 1},
           {"kind": "start", "run": "b", "pid": 2, "k": "x", "t": 2},
           {"kind": "end", "run": "a", "pid": 1, "k": "x", "t": 3},
           {"kind": "start", "run": "c", "pid": 1, "k": "x", "t": 3},
           {"kind": "start", "run": "b", "pid": 3, "k": "x", "t": 4.5},
           {"kind": "end", "run": "c", "pid": 1, "k": "x", "t": 5},
           {"kind": "end", "run": "b", "pid": 3, "k": "x", "t": 6}]
    assert most_at_once(log, lambda r: r["k"], killed={2: 4.0}) == {"x": 2}
    assert most_at_once(log, lambda r: r["k"], killed={2: 4.6}) == {"x": 3}
    with pytest.raises(AssertionError, match="never ended"):
        most_at_once(log, lambda r: r["k"])


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shoal.db'}?busy_timeout=30"
    else:
        with postgres_schema("shoal_cap_") as url:
            yield url


def _procs(tmp_path: Path, store_url: str, log: Path) -> Processes:
    return Processes(tmp_path, HERE / "cap_app.py", "CAP",
                     {"CAP_STORE": store_url, "CAP_LOG": str(log), "CAP_MAX_LIFE": "170"})


@pytest.mark.timeout(180)
async def test_workers_never_run_more_than_the_caps(tmp_path: Path, store_url: str) -> None:
    log = tmp_path / "effects.log"
    app = cap_app.make_app(store_url)
    procs = _procs(tmp_path, store_url, log)
    try:
        async with app.open():   # migrates the store before the workers open it
            for n in range(3):
                procs.start_worker(f"w{n}", CAP_N="3", CAP_T="2")
            await procs.wait_started(log)
            runs = [await app.dispatch("capped", {"seconds": 0.3}) for _ in range(15)]
            runs += [await app.dispatch("per_tenant", {"seconds": 0.3}, tenant=tenant)
                     for _ in range(6) for tenant in ("acme", "globex", "initech")]
            final = await wait_all_final(app.store, cap_app.NAMESPACE, len(runs), timeout=120)
            codes = procs.stop_workers()
            assert all(code == 0 for code in codes.values()), (codes, procs.stderr_tail())
        assert {r.id for r in final} == {r.id for r in runs}
        assert all(r.status.value == "succeeded" for r in final), [r.error for r in final]
        records = read_log(log)
        assert len({r["pid"] for r in records if r["kind"] == "start"}) > 1, "one worker did all"
        capped = most_at_once([r for r in records if r.get("workflow") == "capped"],
                              lambda r: r["workflow"])
        assert capped == {"capped": 3}, capped     # never more, and the cap was reached
        tenants = most_at_once([r for r in records if r.get("workflow") == "per_tenant"],
                               lambda r: r["tenant"])
        assert max(tenants.values()) <= 2 and 2 in tenants.values(), tenants
        # and the tenants' runs ran side by side: more than one tenant's cap at once
        together = most_at_once([r for r in records if r.get("workflow") == "per_tenant"],
                                lambda r: r["workflow"])
        assert together["per_tenant"] > 2, together
    except BaseException:
        print(procs.stderr_tail())
        raise
    finally:
        procs.cleanup()


@pytest.mark.timeout(180)
async def test_a_killed_worker_gives_its_shares_back_and_a_deploy_changes_the_cap(
    tmp_path: Path, store_url: str
) -> None:
    log = tmp_path / "effects.log"
    app = cap_app.make_app(store_url)
    procs = _procs(tmp_path, store_url, log)
    killed: dict[int, float] = {}
    try:
        async with app.open():
            for n in range(3):
                procs.start_worker(f"w{n}", CAP_N="2", CAP_T="2")
            await procs.wait_started(log)
            runs = [await app.dispatch("capped", {"seconds": 1.5}) for _ in range(12)]

            async def two_running() -> list[dict[str, Any]]:
                starts = [r for r in read_log(log) if r["kind"] == "start"]
                return starts if len(starts) >= 2 else []

            first = (await wait_until(two_running, 30, "two runs to start", step=0.02))[0]
            [slot] = [s for s, p in procs.live.items() if p.pid == first["pid"]]
            procs.kill(slot)   # SIGKILL, mid step: its runs stay `running` until recovered
            killed[first["pid"]] = time.time()
            held = {r["run"] for r in read_log(log)
                    if r["kind"] == "start" and r["pid"] == first["pid"]}

            async def restarted() -> bool:
                again = {r["run"] for r in read_log(log) if r["kind"] == "start"
                         and r["pid"] != first["pid"] and r["t"] > killed[first["pid"]]}
                return held <= again

            await wait_until(restarted, 30, "the killed worker's runs to start again",
                             step=0.05)
            back = time.time() - killed[first["pid"]]
            # lease + the poll that recovers (lease / 3), and a claim's wake-up
            assert back < cap_app.LEASE * (1 + 1 / 3) + 2.0, back

            # a new deploy: every worker restarted with max_running=3
            async def five_ended() -> bool:
                return sum(1 for r in read_log(log) if r["kind"] == "end") >= 5

            await wait_until(five_ended, 60, "five runs to end")
            codes = procs.stop_workers()
            assert all(code == 0 for code in codes.values()), (codes, procs.stderr_tail())
            deployed = time.time()
            for n in range(3, 5):
                procs.start_worker(f"w{n}", CAP_N="3", CAP_T="2")
            runs += [await app.dispatch("capped", {"seconds": 1.0}) for _ in range(6)]
            final = await wait_all_final(app.store, cap_app.NAMESPACE, len(runs), timeout=120)
            codes = procs.stop_workers()
            assert all(code == 0 for code in codes.values()), (codes, procs.stderr_tail())
        assert {r.id for r in final} == {r.id for r in runs}
        assert all(r.status.value == "succeeded" for r in final), [r.error for r in final]
        records = read_log(log)
        before = most_at_once([r for r in records if r.get("t", 0) < deployed],
                              lambda r: r.get("workflow"), killed)
        after = most_at_once([r for r in records if r.get("t", 0) >= deployed],
                             lambda r: r.get("workflow"), killed)
        assert before["capped"] == 2, before   # with a killed run counted until recovered
        assert after["capped"] == 3, after     # the new deploy's cap binds
    except BaseException:
        print(procs.stderr_tail())
        raise
    finally:
        procs.cleanup()
