"""Bursts never fail for want of a connection, on every backend; a store that is really down
still fails every waiting call promptly.

PostgreSQL tests use the server of ``test_postgres.py`` (``SHOAL_TEST_POSTGRES``), a schema of
their own, dropped afterwards; without a server they skip, except under ``CI``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from test_postgres import URL, _drop, _require_postgres, _url

import shoal
from shoal.backends.postgres import PostgresStore
from shoal.errors import StoreUnavailableError
from shoal.testing.contract import T0, add, claim

BURST = 10_000


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store of the test's own; PostgreSQL with a pool of 2 connections, which 10,000
    callers at once overwhelmed before they took turns."""
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shoal.db'}"
    else:
        _require_postgres()
        schema = f"shoal_t_{secrets.token_hex(6)}"
        yield _url(schema, pool_min_size="1", pool_max_size="2")
        _drop(schema)


async def test_a_burst_of_dispatches_from_one_process_all_succeed(store_url: str) -> None:
    app = shoal.App("burst", store=store_url)

    @app.workflow
    async def echo(ctx: shoal.RunContext, n: int) -> int:
        return n

    started = time.monotonic()
    async with app.open():
        runs = await asyncio.wait_for(
            asyncio.gather(*(app.dispatch(echo, n) for n in range(BURST))), 50)
        assert len({run.id for run in runs}) == BURST
        last = await app.get_run(runs[-1].id)
        assert last.input == BURST - 1 and last.status == shoal.RunStatus.QUEUED
    assert time.monotonic() - started < 50


class _Proxy:
    """A TCP proxy to the test server that can be cut, as a crash of the server or of the
    network would: open connections close, new ones are refused."""

    def __init__(self) -> None:
        target = urlsplit(URL)
        self.host, self.port = target.hostname or "127.0.0.1", target.port or 5432
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self.writers += [writer, up_writer]

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()


@pytest.fixture
async def proxied(schema: str) -> AsyncIterator[tuple[_Proxy, str]]:
    """A proxy and the URL of a schema of the test's own through it."""
    proxy = _Proxy()
    port = await proxy.start()
    direct = urlsplit(_url(schema, pool_min_size="1", pool_max_size="2", pool_timeout="1"))
    netloc = direct.netloc.rsplit("@", 1)[0] + "@" if "@" in direct.netloc else ""
    yield proxy, direct._replace(netloc=f"{netloc}127.0.0.1:{port}").geturl()
    if proxy.server is not None:
        proxy.cut()


async def test_a_burst_on_a_store_that_went_down_fails_within_pool_timeout(
    proxied: tuple[_Proxy, str],
) -> None:
    """Every one of 1,000 calls waiting their turn fails with StoreUnavailableError within
    about pool_timeout (1 s): the queue does not wait pool_timeout per caller ahead."""
    proxy, url = proxied
    store = PostgresStore.from_url(url)
    await store.open()
    try:
        assert await store.get_run("nothing") is None
        proxy.cut()
        started = time.monotonic()
        got = await asyncio.gather(*(store.get_run("nothing") for _ in range(1000)),
                                   return_exceptions=True)
        took = time.monotonic() - started
        assert all(isinstance(e, StoreUnavailableError) for e in got), \
            {repr(e) for e in got if not isinstance(e, StoreUnavailableError)}
        assert took < 2.5, took
    finally:
        await store.close()


async def test_calls_queued_when_the_store_closes_fail_with_a_clear_error(schema: str) -> None:
    store = PostgresStore.from_url(_url(schema, pool_min_size="1", pool_max_size="1"))
    await store.open()
    calls = [asyncio.ensure_future(store.get_run(f"r{n}")) for n in range(50)]
    await asyncio.sleep(0)
    await store.close()
    got = await asyncio.gather(*calls, return_exceptions=True)
    errors = [e for e in got if isinstance(e, BaseException)]
    assert errors and all(isinstance(e, StoreUnavailableError) for e in errors), errors
    assert all("was closed before this operation got a connection" in str(e) for e in errors), \
        {str(e) for e in errors}


async def test_lease_renewals_go_before_a_burst(schema: str) -> None:
    """A renewal asked for while 3,000 creates wait for the pool's 2 connections is answered
    before them: a burst never costs an instance its leases."""
    store = PostgresStore.from_url(_url(schema, pool_min_size="1", pool_max_size="2"))
    await store.open()
    try:
        await add(store, T0)
        [run] = await claim(store, now=T0)
        burst = [asyncio.ensure_future(add(store, T0 + 1)) for _ in range(3000)]
        await asyncio.sleep(0.05)
        renewal = await store.renew_leases("a", {run.id: run.lease_epoch}, 30.0, T0 + 1)
        assert renewal.renewed == {run.id}
        waiting = sum(not b.done() for b in burst)
        await asyncio.gather(*burst)
        assert waiting > 1000, waiting      # it went ahead of most of the burst
    finally:
        await store.close()
