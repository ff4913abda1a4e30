"""What the benchmarks share: percentiles, the machine header, the file system of the temporary
folder, a one-value PostgreSQL query, and the no-op and 5-step workloads of the overhead
benches (observability.py, tracing.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import shoal


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


async def pg_one(conn: Any, sql: str, params: Any = None) -> Any:
    return (await (await conn.execute(sql, params)).fetchone())[0]


def filesystem_of(path: Path) -> str:
    best, kind = "", "unknown"
    with contextlib.suppress(OSError), open("/proc/mounts") as mounts:
        for line in mounts:
            parts = line.split()
            if len(parts) >= 3 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                best, kind = parts[1], parts[2]
    return kind


def machine(title: str) -> str:
    commit = "unknown"
    with contextlib.suppress(Exception):
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).parent, check=True).stdout.strip()
    return (f"[bold]{title}[/]: {os.cpu_count()} cores "
            f"({len(os.sched_getaffinity(0))} usable), Python {platform.python_version()}, "
            f"{platform.platform()}, shoal {shoal.__version__} at {commit}, load average "
            f"{os.getloadavg()[0]:.2f} at the start")


STEPS = 5   # the steps of the "steps5" workload


def add_workloads(app: Any, runs: int, done: asyncio.Event) -> None:
    """Register the overhead benches' two workflows on ``app``: ``noop`` (returns at once) and
    ``steps5`` (five async steps, each checkpointed); ``done`` is set once ``runs`` of them
    have ended."""
    ended = [0]

    def one() -> None:
        ended[0] += 1
        if ended[0] >= runs:
            done.set()

    async def bump(i: int) -> int:
        return i + 1

    @app.workflow(name="noop")
    async def noop(ctx: Any, input: Any) -> None:
        one()

    @app.workflow(name="steps5")
    async def steps5(ctx: Any, input: Any) -> int:
        value = 0
        for i in range(STEPS):
            value = await ctx.step(f"step{i}", bump, value)
        one()
        return value
