"""The probe server (``shoal.app.probes``) over real sockets, and ``App(health_port=...)``:
/livez and /readyz answer 200 when healthy or degraded, 503 when unhealthy (a store that
refuses, an app stopping)."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest

import shoal
from shoal.app import probes
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock, settle


async def raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as is; the status, the headers (lower-case names) and the body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value for name, value in
               (line.split(": ", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


async def get(url: str, method: str = "GET") -> tuple[int, Any]:
    """A request with urllib (in a thread): the status and the JSON body."""
    def call() -> tuple[int, bytes]:
        request = urllib.request.Request(url, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    status, body = await asyncio.to_thread(call)
    return status, json.loads(body) if body else None


@pytest.fixture
async def server() -> Any:
    """A probe server on a free port with a JSON route, a text route and one that raises."""
    async def ok() -> probes.Response:
        return 200, probes.JSON, b'{"ok": true}'

    async def broken() -> probes.Response:
        raise RuntimeError("the check broke")

    routes = {"/ok": ok, "/broken": broken}
    srv = await probes.serve("127.0.0.1", 0, routes)
    yield srv.sockets[0].getsockname()[1], routes
    srv.close()
    await srv.wait_closed()


async def test_get_and_head(server: Any) -> None:
    port, _ = server
    status, headers, body = await raw(port, b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, body) == (200, b'{"ok": true}')
    assert headers["content-type"] == "application/json"
    assert headers["content-length"] == str(len(body)) and headers["connection"] == "close"
    status, headers, body = await raw(port, b"HEAD /ok HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, body, headers["content-length"]) == (200, b"", "12")
    # a query string is ignored; bare LF line ends and HTTP/1.0 are accepted
    status, _, body = await raw(port, b"GET /ok?verbose=1 HTTP/1.0\n\n")
    assert (status, body) == (200, b'{"ok": true}')


async def test_unknown_path_other_methods_and_bad_requests(server: Any) -> None:
    port, routes = server
    status, _, body = await raw(port, b"GET /nope HTTP/1.1\r\n\r\n")
    assert status == 404 and b"/nope" in body
    status, headers, _ = await raw(port, b"POST /ok HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
    assert status == 405 and headers["allow"] == "GET, HEAD"
    for method in (b"PUT", b"DELETE", b"OPTIONS"):
        assert (await raw(port, method + b" /ok HTTP/1.1\r\n\r\n"))[0] == 405
    assert (await raw(port, b"GARBAGE\r\n\r\n"))[0] == 400
    assert (await raw(port, b"GET /ok SPDY/3\r\n\r\n"))[0] == 400
    status, _, body = await raw(port, b"GET /broken HTTP/1.1\r\n\r\n")
    assert status == 500 and body == b"RuntimeError: the check broke\n"

    async def late() -> probes.Response:
        return 200, probes.TEXT, b"late\n"

    routes["/late"] = late                      # a route added later is served
    assert (await raw(port, b"GET /late HTTP/1.1\r\n\r\n"))[2] == b"late\n"


async def test_a_request_over_the_limit_is_refused(server: Any) -> None:
    port, _ = server
    huge = b"GET /ok HTTP/1.1\r\nX-Pad: " + b"a" * probes.MAX_REQUEST_BYTES + b"\r\n\r\n"
    assert (await raw(port, huge))[0] == 431
    many = b"GET /ok HTTP/1.1\r\n" + b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n" * 300 + b"\r\n"
    assert (await raw(port, many))[0] == 431
    assert (await raw(port, b"GET /ok HTTP/1.1\r\n\r\n"))[0] == 200     # still serving


async def test_a_client_that_hangs_up_or_dawdles(server: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    port, _ = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /ok HTT")
    writer.write_eof()                                      # hangs up half way: no answer
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.close()                                          # connects and leaves at once
    monkeypatch.setattr(probes, "REQUEST_TIMEOUT", 0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /ok HTTP/1.1\r\n")                   # never ends its headers
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert (await raw(port, b"GET /ok HTTP/1.1\r\n\r\n"))[0] == 200


class Store(MemoryStore):
    """A memory store whose ping can be made to fail."""

    ping_error: Exception | None = None

    async def ping(self) -> None:
        if self.ping_error is not None:
            raise self.ping_error


def held_app(store: MemoryStore, clock: VirtualClock, **options: Any) -> shoal.App:
    app = shoal.App("probes", store=store, clock=clock, health_host="127.0.0.1",
                    health_port=0, **options)

    @app.workflow
    async def hold(ctx: shoal.RunContext, input: Any) -> None:
        await ctx.step("hold", asyncio.Event().wait)

    return app


async def test_app_serves_probes_while_started() -> None:
    store, clock = Store(), VirtualClock()
    app = held_app(store, clock)
    assert app.health_address is None
    await app.start()
    try:
        address = app.health_address
        assert address is not None and address[0] == "127.0.0.1" and address[1] > 0
        base = f"http://127.0.0.1:{address[1]}"
        assert await get(base + "/livez") == (
            200, {"status": "healthy", "reason": "ok", "checks": {}})
        assert await get(base + "/readyz") == (
            200, {"status": "healthy", "reason": "ok",
                  "checks": {"liveness": "ok", "store": "ok"}})
        assert (await get(base + "/livez", "HEAD"))[0] == 200

        store.ping_error = ConnectionError("connection refused")      # the store is down
        assert await get(base + "/readyz") == (
            503, {"status": "unhealthy", "reason": "store: ConnectionError: connection refused",
                  "checks": {"liveness": "ok", "store": "ConnectionError: connection refused"}})
        assert (await get(base + "/livez"))[0] == 200                # not dead for it
        store.ping_error = None

        await app.dispatch("hold")
        await settle()
    finally:
        closing = asyncio.create_task(app.close(timeout=10))
        await settle()
        stopping = {"status": "unhealthy", "reason": "stopping"}
        assert await get(base + "/livez") == (503, {**stopping, "checks": {}})
        assert await get(base + "/readyz") == (
            503, {**stopping, "checks": {"liveness": "stopping"}})
        await clock.advance(10)                          # the held run is interrupted
        await closing
    assert app.health_address is None
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", address[1])


async def test_readiness_is_degraded_but_200_while_a_circuit_is_open() -> None:
    store, clock = MemoryStore(), VirtualClock()
    app = held_app(store, clock)
    openai = app.provider("openai", breaker=shoal.Breaker(failures=1, window=60, cooldown=30))
    async with app:
        assert app.health_address is not None
        url = f"http://127.0.0.1:{app.health_address[1]}/readyz"
        with pytest.raises(ConnectionError):
            async with openai.call():
                raise ConnectionError("503 from the provider")   # the circuit opens
        assert await get(url) == (200, {
            "status": "degraded", "reason": "circuit open: openai",
            "checks": {"liveness": "ok", "store": "ok", "provider:openai": "circuit open"}})
        await clock.advance(30)                                  # half-open: ready again
        assert await get(url) == (200, {
            "status": "healthy", "reason": "ok",
            "checks": {"liveness": "ok", "store": "ok", "provider:openai": "ok"}})


async def test_a_port_taken_or_out_of_range() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        app = shoal.App("probes", store="memory://", health_host="127.0.0.1", health_port=port)
        with pytest.raises(shoal.ConfigurationError,
                           match=rf"App\(health_port={port}, health_host='127.0.0.1'\) cannot "
                                 rf"listen on 127.0.0.1:{port}: .*health_port=None"):
            await app.start()
        assert app.check_liveness().reason == "not started" and app.health_address is None
        await app.close()
    finally:
        taken.close()
    for bad in (-1, 65536, "8081", True, 80.0):
        with pytest.raises(shoal.ConfigurationError, match=r"App\(health_port\) must be an int"):
            shoal.App("probes", store="memory://", health_port=bad)  # type: ignore[arg-type]
    with pytest.raises(shoal.ConfigurationError, match=r"App\(health_host\)"):
        shoal.App("probes", store="memory://", health_port=0, health_host="")
