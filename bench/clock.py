"""What ``VirtualClock.advance`` costs per virtual day, this tree's clock beside an older one.

    .venv/bin/python bench/clock.py                  # about 3 minutes (the old clock is slow)
    .venv/bin/python bench/clock.py --hours 2        # a quick look: 2 virtual hours, shown per day
    .venv/bin/python bench/clock.py --before none    # this tree's clock only
    .venv/bin/python bench/clock.py --before d65dde7 # the clock of another commit

"before" is ``src/shoal/testing/clock.py`` as it is at ``--before`` (default ``main``, read with
``git show``), loaded as a module of its own; "after" is this tree's. Both drive the same shoal
(this tree's App, memory store), so the table shows the clock alone. Each scenario runs in a
new event loop whose selector counts the loop's turns, and a wrapper of ``clock.sleep`` counts
the wake-ups the app's loops asked for. Columns: wall and CPU seconds per virtual day (the
process's CPU time: one core), event-loop turns and wake-ups per virtual day, CPU µs per
wake-up. Scenarios:

- ``nothing due``: a bare clock with one sleeper at the end of a day, one ``advance(86400)``.
- ``idle app``: an ``App`` with no run, one ``advance`` over the span (its loops: a membership
  beat every 5 s; the maintenance services sleep until the memory store says work is due, and
  the heartbeat, with nothing to renew, until a run starts).
- ``idle app, hourly``: the same span in ``advance(3600)`` calls, as a test often moves.
- ``a little work``: the idle app with 10 runs, each a plain-function step (a thread) and an
  hour's ``ctx.sleep``, over and over: 10 threads and 10 durable sleeps an hour.
- ``docs/testing.md``: the first example of that page, its own ``VirtualClock`` replaced by the
  clock measured (two virtual days and an hour; shown per example, not per day).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import shoal
import shoal.testing
from shoal.testing import clock as this_clock

ROOT = Path(__file__).resolve().parent.parent
DAY = 86400.0
Scenario = Callable[[Any, float], Awaitable[int]]   # (clock, span) -> wake-ups counted


class CountingSelector(selectors.DefaultSelector):
    """Every turn of the event loop calls ``select`` once."""

    turns = 0

    def select(self, timeout: float | None = None) -> list[Any]:
        self.turns += 1
        return super().select(timeout)


def old_clock(rev: str) -> Any:
    """The module ``shoal.testing.clock`` as it is at ``rev``."""
    source = subprocess.run(["git", "show", f"{rev}:src/shoal/testing/clock.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp(prefix="shoal-clock-")) / "clock_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("clock_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def counting(clock: Any) -> list[int]:
    """Count the sleeps asked of ``clock`` (each one a wake-up once its time comes)."""
    count = [0]
    sleep = clock.sleep

    async def counted(seconds: float) -> None:
        count[0] += 1
        await sleep(seconds)

    clock.sleep = counted
    return count


async def nothing_due(clock: Any, span: float) -> int:
    """One sleeper at the end of ``span``, one advance: nothing else is due."""
    task = asyncio.ensure_future(clock.sleep(span))
    await clock.advance(span)
    await task
    return 1


def fetch(n: int) -> int:
    """A plain function: a step that runs in a thread."""
    return n + 1


async def hourly(ctx: shoal.RunContext, hours: int) -> int:
    """A step, then an hour's durable sleep, ``hours`` times."""
    n = 0
    for _ in range(hours):
        n = await ctx.step(f"fetch{n}", fetch, n)
        await ctx.sleep(3600)
    return n


async def with_app(clock: Any, span: float, step: float | None, runs: int) -> int:
    """An app on the memory store with ``runs`` hourly runs, advanced over ``span`` in steps
    of ``step`` (one advance without); the wake-ups asked meanwhile."""
    app = shoal.App("bench-clock", store="memory://", clock=clock)
    app.workflow(hourly)
    count = counting(clock)
    async with app:
        for _ in range(runs):
            await app.dispatch(hourly, int(span // 3600) + 1)
        await clock.advance(1)
        count[0] = 0
        moved = 0.0
        while moved < span:
            by = min(step or span, span - moved)
            await clock.advance(by)
            moved += by
        return count[0]


async def idle(clock: Any, span: float) -> int:
    return await with_app(clock, span, None, 0)


async def idle_hourly(clock: Any, span: float) -> int:
    return await with_app(clock, span, 3600, 0)


async def little_work(clock: Any, span: float) -> int:
    return await with_app(clock, span, 3600, 10)


def docs_example() -> str:
    text = (ROOT / "docs" / "testing.md").read_text()
    start = text.index("```python\n") + len("```python\n")
    return text[start:text.index("```", start)]


def run_docs(module: Any) -> tuple[float, float, int]:
    """The docs example with ``shoal.testing.VirtualClock`` replaced; (wall, cpu, turns)."""
    code = docs_example()
    selector = CountingSelector()
    policy = asyncio.get_event_loop_policy()
    real_new = policy.new_event_loop
    policy.new_event_loop = lambda: asyncio.SelectorEventLoop(selector)  # type: ignore[method-assign]
    saved = shoal.testing.VirtualClock
    shoal.testing.VirtualClock = module.VirtualClock  # type: ignore[misc]
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        exec(compile(code, "docs/testing.md", "exec"), {"__name__": "__docs__"})
        return time.perf_counter() - wall, time.process_time() - cpu, selector.turns
    finally:
        shoal.testing.VirtualClock = saved  # type: ignore[misc]
        policy.new_event_loop = real_new  # type: ignore[method-assign]


def measure(module: Any, scenario: Scenario, span: float) -> tuple[float, float, int, int]:
    """(wall s, cpu s, turns, wake-ups) of ``scenario`` over ``span`` on ``module``'s clock."""
    selector = CountingSelector()
    loop = asyncio.SelectorEventLoop(selector)
    try:
        clock = module.VirtualClock()
        wall, cpu = time.perf_counter(), time.process_time()
        turns = selector.turns
        wakes = loop.run_until_complete(scenario(clock, span))
        return (time.perf_counter() - wall, time.process_time() - cpu,
                selector.turns - turns, wakes)
    finally:
        loop.close()


SCENARIOS: dict[str, Scenario] = {
    "nothing due": nothing_due,
    "idle app": idle,
    "idle app, hourly": idle_hourly,
    "a little work": little_work,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=24.0,
                        help="virtual hours each scenario advances (shown per day)")
    parser.add_argument("--before", default="main",
                        help="the commit whose clock is 'before' ('none': skip it)")
    parser.add_argument("--no-docs", action="store_true", help="skip docs/testing.md")
    args = parser.parse_args()
    logging.getLogger("shoal").setLevel(logging.ERROR)
    clocks = {"after": this_clock}
    if args.before != "none":
        clocks = {"before": old_clock(args.before), **clocks}
    span = args.hours * 3600
    per_day = DAY / span
    print(f"VirtualClock.advance: {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}, Python {sys.version.split()[0]}, {args.hours:g} virtual "
          f"hours a scenario, shown per virtual day; before = {args.before}")
    print(f"{'scenario':18} {'clock':6} {'wall s':>8} {'CPU s':>8} {'turns':>10} "
          f"{'wake-ups':>9} {'CPU us/wake':>12}")
    for name, scenario in SCENARIOS.items():
        for label, module in clocks.items():
            whole_day = scenario is nothing_due
            wall, cpu, turns, wakes = measure(module, scenario, DAY if whole_day else span)
            scale = 1.0 if whole_day else per_day
            print(f"{name:18} {label:6} {wall * scale:8.3f} {cpu * scale:8.3f} "
                  f"{turns * scale:10,.0f} {wakes * scale:9,.0f} "
                  f"{1e6 * cpu / max(wakes, 1):12.1f}")
    if not args.no_docs:
        for label, module in clocks.items():
            wall, cpu, turns = run_docs(module)
            print(f"{'docs/testing.md':18} {label:6} {wall:8.3f} {cpu:8.3f} {turns:10,} "
                  f"{'':>9} {'':>12}   (the whole example)")


if __name__ == "__main__":
    main()
