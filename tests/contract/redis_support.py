"""Redis test support shared by ``test_coord_redis.py``, ``test_rate_redis.py`` and
``test_coord_redis_app.py`` (pytest puts this directory on sys.path).

The single server is ``SHOAL_TEST_REDIS`` (default ``redis://127.0.0.1:6379``); each test uses a
prefix of its own and deletes every key under it afterwards. Without a reachable server those
tests skip with a message, except under ``CI``, where they fail. The Redlock tests start their
own ``redis-server`` processes (``Server``) on free ports and kill them afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import NoReturn, TypeVar

import pytest
import redis

from shoal.backends.redis import RedisCoordStore, Redlock

S = TypeVar("S", RedisCoordStore, Redlock)

URL = os.environ.get("SHOAL_TEST_REDIS", "redis://127.0.0.1:6379")


def sync_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=3, socket_connect_timeout=3)


@functools.cache
def _unreachable() -> str | None:
    """Why the test server cannot be used, or None when it can."""
    try:
        with sync_client(URL) as client:
            client.ping()
    except redis.RedisError as e:
        return str(e).strip() or type(e).__name__
    return None


def _skip_or_fail(message: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def require_redis() -> None:
    reason = _unreachable()
    if reason is None:
        return
    from shoal.stores import mask_url

    _skip_or_fail(f"Redis at {mask_url(URL)} is not reachable ({reason}); "
                  f"set SHOAL_TEST_REDIS to a server where the tests may write keys")


def drop(url: str, prefix: str) -> None:
    """Delete every key under ``prefix``."""
    with sync_client(url) as client:
        names = list(client.scan_iter(match=f"{prefix}:*", count=500))
        if names:
            client.delete(*names)


def new_prefix() -> str:
    return f"shoal_t_{secrets.token_hex(6)}"


@contextlib.contextmanager
def own_prefix(urls: Iterable[str]) -> Iterator[str]:
    """A new prefix; afterwards every key under it is deleted on each server of ``urls``."""
    name = new_prefix()
    yield name
    for url in urls:
        drop(url, name)


@contextlib.contextmanager
def server_prefix() -> Iterator[str]:
    """A new prefix on the test server (skipped without one, failed under ``CI``); every key
    under it deleted afterwards."""
    require_redis()
    with own_prefix([URL]) as name:
        yield name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A ``redis-server`` process of the test's own, on a fixed port, stopped and started at
    will; nothing saved to disk. With ``tls``, the port takes TLS only (a self-signed
    certificate made with ``openssl`` in the server's directory; clients are not verified)."""

    def __init__(self, port: int | None = None, tls: bool = False) -> None:
        self.port = port or free_port()
        self.tls = tls
        self.url = f"{'rediss' if tls else 'redis'}://127.0.0.1:{self.port}"
        self.dir = tempfile.mkdtemp(prefix="shoal-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    def _tls_args(self) -> list[str]:
        openssl = shutil.which("openssl")
        if openssl is None:
            _skip_or_fail("openssl is not in PATH (it makes the TLS server's certificate)")
        cert, key = os.path.join(self.dir, "cert.pem"), os.path.join(self.dir, "key.pem")
        subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", cert],
                       check=True, capture_output=True)
        return ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", cert,
                "--tls-key-file", key, "--tls-ca-cert-file", cert, "--tls-auth-clients", "no"]

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            _skip_or_fail("redis-server is not in PATH")
        ports = self._tls_args() if self.tls else ["--port", str(self.port)]
        self.proc = subprocess.Popen(
            [binary, *ports, "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5,
                                 ssl=self.tls, ssl_cert_reqs="none") as c:
                    c.ping()
                return
            except redis.RedisError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """The address of a TCP server that accepts connections and never answers a byte (a hung
    Redis, or a port taken by something else); closed afterwards."""
    writers: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        while await reader.read(4096):       # read what is sent until the client goes
            pass
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


@contextlib.contextmanager
def running_servers(n: int = 3) -> Iterator[list[Server]]:
    """``n`` servers, started; killed and their directories removed afterwards."""
    servers = [Server() for _ in range(n)]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.cleanup()


@contextlib.asynccontextmanager
async def opened(store: S) -> AsyncIterator[S]:
    """``store``, open for the ``with`` block."""
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def redlock(servers: list[Server], prefix: str, timeout: float = 2.0) -> Redlock:
    """A Redlock quorum over ``servers`` (``timeout``: each store's socket timeout)."""
    return Redlock([RedisCoordStore(s.url, prefix=prefix, socket_timeout=timeout)
                    for s in servers])


class OnTheTrio:
    """For a contract class (put first among the bases): ``quorum``, a Redlock over the module's
    ``trio`` under the test's ``rl_prefix`` (fixtures of ``conftest.py``), and ``other``, a
    second Redlock object (its own connections) over the same keys."""

    @pytest.fixture
    async def quorum(self, trio: list[Server], rl_prefix: str) -> AsyncIterator[Redlock]:
        async with opened(redlock(trio, rl_prefix)) as r:
            yield r

    @pytest.fixture
    async def other(self, trio: list[Server], rl_prefix: str) -> AsyncIterator[Redlock]:
        async with opened(redlock(trio, rl_prefix)) as r:
            yield r
