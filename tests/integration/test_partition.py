"""Invariant 11 over PostgreSQL with real processes: worker A reaches the server through a proxy
that cuts a partition (``blackhole.py``: the bytes stop, nothing is refused or reset), worker B
directly. A's runs are cut mid-step, one in its plain-function step (a thread), one in its async
step. Checked from the log of side effects (``cut_app.py``) and the rows: A's last side effect of
each run comes before B's first (A stopped before its lease ended: B took the run over only
then); once the partition ends, A writes nothing over B's work and goes on serving (B stopped,
a new run is A's); each run was charged one attempt for the cut.

The partition ends each of the three ways the proxy knows: healed (what was held is delivered),
dropped (every connection reset) and forgotten (the connections of before stay held for ever:
only a connection given up on by the worker itself lets it serve again).

The server is ``SHOAL_TEST_POSTGRES`` (a schema of the test's own, dropped afterwards; skipped
without a server, failed under ``CI``).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import cut_app
import pytest
from backends import postgres_schema
from blackhole import Blackhole
from harness import Processes, read_log, wait_until

import shoal

HERE = Path(__file__).resolve().parent
LEASE = 3.0


def through(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{port}" if user
                                     else f"127.0.0.1:{port}"))


def effects(log: Path) -> dict[tuple[str, str], list[float]]:
    """(run, instance) -> the times of its side effects, in order."""
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in read_log(log):
        if r["kind"] == "effect":
            out[r["run"], r["instance"]].append(r["t"])
    return out


def events(log: Path, name: str, instance: str) -> list[dict[str, Any]]:
    return [r for r in read_log(log) if r["kind"] == "event" and r["event"] == name
            and r["instance"] == instance]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("end", ["heal", "drop", "forget"])
async def test_a_worker_cut_off_from_postgres_stops_before_its_lease_ends(
        tmp_path: Path, end: str) -> None:
    log = tmp_path / "effects.log"
    with postgres_schema("shoal_cut_") as url:
        parts = urlsplit(url)
        with Blackhole(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
            procs = Processes(tmp_path, HERE / "cut_app.py", "CUT",
                              {"CUT_LOG": str(log), "CUT_LEASE": str(LEASE),
                               "CUT_MAX_LIFE": "230"})
            try:
                await partitioned(procs, proxy, url, log, end)
            except BaseException:
                print(procs.stderr_tail(40))
                raise
            finally:
                proxy.heal()     # nothing left hanging on the proxy while the workers stop
                procs.cleanup()


async def partitioned(procs: Processes, proxy: Blackhole, url: str, log: Path, end: str) -> None:
    a = procs.spawn(["worker"], "worker-a", CUT_INSTANCE="a",
                    CUT_STORE=through(url, proxy.port))
    await wait_until(lambda: _started(log, "a"), 30, "worker A to start")
    app = cut_app.make_app(url)
    async with app.open():
        x = await app.dispatch("effects", {"cut": "plain"})
        y = await app.dispatch("effects", {"cut": "coro"})

        async def a_at_work() -> bool:
            seen = effects(log)
            return len(seen[x.id, "a"]) >= 5 and len(seen[y.id, "a"]) >= 5
        await wait_until(a_at_work, 60, "worker A to be in the steps it is cut in")
        assert {(await app.get_run(r.id)).owner for r in (x, y)} == {"a"}
        b = procs.spawn(["worker"], "worker-b", CUT_INSTANCE="b", CUT_STORE=url)
        await wait_until(lambda: _started(log, "b"), 30, "worker B to start")

        proxy.hold()                                           # A is cut off

        async def b_done() -> bool:
            runs = [await app.get_run(r.id) for r in (x, y)]
            return all(r.status == shoal.RunStatus.SUCCEEDED for r in runs)
        await wait_until(b_done, 90, "worker B to take both runs over and finish them",
                         step=0.2)
        assert len(events(log, "lease.expired", "a")) == 2     # A's watchdog, not the store

        {"heal": proxy.heal, "drop": proxy.drop, "forget": proxy.forget}[end]()
        b.terminate()
        assert await asyncio.to_thread(b.wait, 30) == 0

        z = await app.dispatch("effects", {})                  # A goes on serving
        assert await app.result(z.id, timeout=150) == ["a", "a"]

        seen = effects(log)
        # x was cut in its first step, y in its second: A had checkpointed y's first
        for r, output in ((x, ["b", "b"]), (y, ["a", "b"])):
            ours, theirs = seen[r.id, "a"], seen[r.id, "b"]
            assert ours and theirs
            assert max(ours) < min(theirs), (r.id, max(ours) - min(theirs))
            done = await app.get_run(r.id)
            assert done.output == output                       # B's work stands
            assert done.attempts == 2                          # one attempt for the cut
            steps = await app.store.load_steps(r.id)
            assert [s.epoch for s in steps] == [1 if output[0] == "a" else 2, 2], steps
        assert a.poll() is None, "worker A exited"
        gaps = [round(min(seen[r.id, "b"]) - max(seen[r.id, "a"]), 2) for r in (x, y)]
        print(f"{end}: {proxy.connections} connections through the proxy; A's last effect "
              f"before B's first by {gaps} s")


async def _started(log: Path, instance: str) -> bool:
    return bool(events(log, "app.started", instance))

