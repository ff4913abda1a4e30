"""Waiting helpers shared by the unit tests (no wall-clock sleeps: loop turns only)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import shoal
from shoal.testing import settle


async def until(check: Callable[[], Awaitable[bool]], rounds: int = 300) -> None:
    """Let the event loop run until ``check()`` holds; fail after ``rounds`` settles."""
    for _ in range(rounds):
        if await check():
            return
        await settle()
    raise AssertionError("condition not reached")


def status_is(app: shoal.App, run_id: str, status: str) -> Callable[[], Awaitable[bool]]:
    """A check for ``until``: the run has ``status``."""
    async def check() -> bool:
        return (await app.get_run(run_id)).status == status
    return check
