"""The engine settles runs with ``settle_and_claim`` (a settlement and the claim it frees in one
statement); ``app.stats()`` must count what it ended, as it counts ``settle_run``'s."""

from __future__ import annotations

import contextlib

from test_postgres import _url

import shoal


async def test_runs_ended_by_the_engine_are_counted(schema: str) -> None:
    app = shoal.App("counts", store=_url(schema), max_concurrent_runs=8)

    @app.workflow(max_attempts=1)
    async def job(ctx: shoal.RunContext, n: int) -> int:
        if n % 5 == 0:
            raise ValueError(f"{n} is refused")
        return n

    async with app:
        runs = await app.dispatch_many(job, list(range(1, 51)))
        for run in runs:
            with contextlib.suppress(shoal.RunFailedError):
                await app.result(run.id, timeout=30)
        got = await app.stats()
    assert got.by_workflow == {"job": {"succeeded": 40, "failed": 10}}
    assert (got.by_status["succeeded"], got.by_status["failed"], got.finished) == (40, 10, 50)
    assert got.finished_last_minute == {"succeeded": 40, "failed": 10, "cancelled": 0}
