"""Lease renewal keeps its own schedule, on every backend and in real time: no other work of an
instance (outbox delivery, pause notification, recovery) can make a healthy instance lose its
own runs; an instance never executes one run twice at once; and a stop is prompt whatever
moment it lands on."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from backends import postgres_schema

import shoal
from shoal.backends.memory import MemoryStore

pytestmark = pytest.mark.slow

BACKENDS = ["memory", "sqlite", "postgres"]
LEASE = 2.0


@contextlib.contextmanager
def store_url(kind: str, tmp_path: Path) -> Iterator[str | None]:
    """A store URL of the test's own (None: one MemoryStore object, shared by the apps)."""
    if kind == "memory":
        yield None
    elif kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'shoal.db'}"
    else:
        with postgres_schema("renew") as url:
            yield url


@contextlib.asynccontextmanager
async def stores(kind: str, tmp_path: Path, count: int) -> AsyncIterator[list[Any]]:
    """``count`` store handles on one backend: one shared object for memory, one URL (each App
    opens its own connection) for SQLite and PostgreSQL."""
    with store_url(kind, tmp_path) as url:
        if url is None:
            yield [MemoryStore()] * count
        else:
            yield [url] * count


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_slow_outbox_handler_never_costs_a_long_step_its_lease(
        kind: str, tmp_path: Path) -> None:
    """Entries written by another instance, each taking 0.7 x lease to deliver, beside a step of
    4 x lease on the delivering instance: the step starts once and the run keeps attempt 1."""
    starts: list[float] = []
    started = asyncio.Event()
    delivered: list[str] = []
    async with stores(kind, tmp_path, 2) as (s1, s2):
        deliverer = shoal.App("renew", store=s1, instance_id="deliverer", lease=LEASE)
        writer = shoal.App("renew", store=s2, instance_id="writer", lease=LEASE)

        @deliverer.workflow(name="long", max_attempts=5)
        async def long(ctx: shoal.RunContext, input: Any) -> str:
            async def work() -> str:
                starts.append(time.monotonic())
                started.set()
                await asyncio.sleep(4 * LEASE)
                return "done"
            return await ctx.step("work", work)

        @deliverer.outbox_handler("mail")
        async def mail(payload: Any, key: str) -> None:
            await asyncio.sleep(0.7 * LEASE)
            delivered.append(key)

        @writer.workflow(name="send")
        async def send(ctx: shoal.RunContext, input: Any) -> None:
            def write() -> None:
                for i in range(3):
                    ctx.outbox.send("mail", {"i": i})
            await ctx.step("write", write)

        async with deliverer, writer:
            run = await deliverer.dispatch("long")
            await started.wait()
            for _ in range(3):
                await writer.dispatch("send")
            assert await deliverer.result(run.id, timeout=8 * LEASE) == "done"
            final = await deliverer.get_run(run.id)
        assert len(starts) == 1, f"the step started {len(starts)} times"
        assert final.attempts == 1
        assert delivered, "the handler delivered nothing meanwhile: the test proves nothing"


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_plain_function_handler_blocking_for_longer_than_the_lease(
        kind: str, tmp_path: Path) -> None:
    """A plain ``def`` handler runs in a thread: blocking for 1.5 x lease, it holds no renewal
    back, and the long step beside it still starts once. The delivery pass stops waiting for
    it at 0.8 x lease; the entry is tried again after its claim (a lease) passed."""
    starts: list[float] = []
    calls: list[str] = []
    release = threading.Event()
    async with stores(kind, tmp_path, 1) as (s1,):
        app = shoal.App("renew", store=s1, instance_id="one", lease=LEASE)

        @app.workflow(name="long")
        async def long(ctx: shoal.RunContext, input: Any) -> str:
            def write() -> None:
                ctx.outbox.send("slow", {})
            await ctx.step("write", write)

            async def work() -> str:
                starts.append(time.monotonic())
                await asyncio.sleep(3 * LEASE)
                return "done"
            return await ctx.step("work", work)

        @app.outbox_handler("slow")
        def slow(payload: Any, key: str) -> None:
            calls.append(key)
            release.wait(1.5 * LEASE)      # blocks its thread, not the event loop

        async with app:
            run = await app.dispatch("long")
            assert await app.result(run.id, timeout=8 * LEASE) == "done"
            final = await app.get_run(run.id)
            release.set()
        assert len(starts) == 1
        assert final.attempts == 1
        assert len(calls) >= 2, "the entry whose delivery outlived its claim was not tried again"
        assert len(set(calls)) == 1


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("body", ["no await", "await 0", "await 10 ms", "dispatch"])
async def test_start_then_close_is_prompt(kind: str, body: str, tmp_path: Path) -> None:
    """``async with app: ...`` ends within a second whatever the body does: a close landing
    while the first poll is starting must not lose the cancellation of the poll loop."""
    async with stores(kind, tmp_path, 1) as (s1,):
        for _ in range(5):          # several times: the moment a close lands varies
            app = shoal.App("renew", store=s1, instance_id="one", lease=30.0)

            @app.workflow(name="noop")
            async def noop(ctx: shoal.RunContext, input: Any) -> None:
                return None

            started = time.monotonic()

            async def cycle(app: shoal.App = app) -> None:
                async with app:
                    if body == "await 0":
                        await asyncio.sleep(0)
                    elif body == "await 10 ms":
                        await asyncio.sleep(0.01)
                    elif body == "dispatch":
                        await app.dispatch("noop")

            await asyncio.wait_for(cycle(), timeout=10)
            took = time.monotonic() - started
            assert took < 1.5, f"start -> close took {took:.2f} s"
