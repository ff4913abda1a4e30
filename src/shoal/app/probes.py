"""A tiny HTTP/1.1 server for probes (``/livez``, ``/readyz``; a metrics route may join them):
GET and HEAD only, one request per connection (``Connection: close``), a bounded request, no
dependency. Not a web framework: each route is a function of nothing that returns the status,
the content type and the body."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Protocol

from shoal.health import Health, HealthStatus

log = logging.getLogger("shoal")

Response = tuple[int, str, bytes]            # status, content type, body
Route = Callable[[], Awaitable[Response]]

MAX_REQUEST_BYTES = 8192     # the request line and headers together; a probe sends ~100
REQUEST_TIMEOUT = 10.0       # seconds to send them; a client that dawdles longer is dropped
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"


class HealthChecks(Protocol):
    """What the health routes ask: ``shoal.App`` is one."""

    def check_liveness(self) -> Health: ...

    async def check_readiness(self) -> Health: ...


def health_response(health: Health) -> Response:
    """200 for healthy or degraded, 503 for unhealthy; the Health as JSON
    (``{"status", "reason", "checks"}``)."""
    status = 503 if health.status == HealthStatus.UNHEALTHY else 200
    body = {"status": str(health.status), "reason": health.reason, "checks": health.checks}
    return status, JSON, json.dumps(body).encode()


def health_routes(checks: HealthChecks) -> dict[str, Route]:
    """``/livez`` from ``check_liveness()`` (no I/O) and ``/readyz`` from
    ``await check_readiness()``."""
    async def livez() -> Response:
        return health_response(checks.check_liveness())

    async def readyz() -> Response:
        return health_response(await checks.check_readiness())

    return {"/livez": livez, "/readyz": readyz}


async def serve(host: str, port: int, routes: Mapping[str, Route]) -> asyncio.Server:
    """Listen on ``host``:``port`` (0: a free port; ``server.sockets[0].getsockname()`` tells
    which) and answer each request from ``routes`` (path -> route; the query string is
    ignored). Unknown path: 404; a method other than GET or HEAD: 405; request line and headers
    over ``MAX_REQUEST_BYTES``: 431; a malformed request: 400; a route that raises: 500.
    ``routes`` is read at each request, so a route added later is served. Raises ``OSError``
    when it cannot listen. Close it with ``server.close()`` and ``await server.wait_closed()``."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await _answer(reader, writer, routes)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass     # the client went away: nobody to answer
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port, limit=MAX_REQUEST_BYTES)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  routes: Mapping[str, Route]) -> None:
    head_only, (status, content_type, body), extra = await _respond(reader, routes)
    writer.write(
        f"HTTP/1.1 {status} {_phrase(status)}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\nConnection: close\r\n"
        f"{extra}\r\n".encode("latin-1") + (b"" if head_only else body))
    await writer.drain()


async def _respond(reader: asyncio.StreamReader, routes: Mapping[str, Route],
                   ) -> tuple[bool, Response, str]:
    """Whether the body is left out (HEAD), the response, and extra header lines."""
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT):
            head = await _read_head(reader)
    except TimeoutError:
        return False, (408, TEXT, b"request not sent in time\n"), ""
    if head is None:
        return False, (431, TEXT, f"request line and headers over {MAX_REQUEST_BYTES} "
                                  f"bytes\n".encode()), ""
    words = head[0].split(" ")
    if len(words) != 3 or not words[2].startswith("HTTP/1."):
        return False, (400, TEXT, b"not an HTTP/1.x request line\n"), ""
    method, target, _ = words
    head_only = method == "HEAD"
    route = routes.get(target.split("?", 1)[0])
    if route is None:
        return head_only, (404, TEXT, f"no such path: {target}\n".encode()), ""
    if method not in ("GET", "HEAD"):
        return False, (405, TEXT, b"GET or HEAD only\n"), "Allow: GET, HEAD\r\n"
    try:
        return head_only, await route(), ""
    except Exception as e:
        log.warning("probe.failed: %s: %s: %s", target, type(e).__name__, e,
                    extra={"event": "probe.failed"})
        return head_only, (500, TEXT, f"{type(e).__name__}: {e}\n".encode()), ""


async def _read_head(reader: asyncio.StreamReader) -> list[str] | None:
    """The request line and header lines, up to the empty line (CRLF or a bare LF); None
    when they run over ``MAX_REQUEST_BYTES``. ``IncompleteReadError`` when the client hangs up
    first."""
    lines: list[str] = []
    size = 0
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            return None
        size += len(line)
        if size > MAX_REQUEST_BYTES:
            return None
        text = line.rstrip(b"\r\n")
        if not text:
            if lines:
                return lines
            continue     # empty lines before the request line are allowed (RFC 9112 2.2)
        lines.append(text.decode("latin-1"))


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Status"     # a code http.HTTPStatus does not name: the phrase is optional
