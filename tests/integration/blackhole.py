"""A TCP proxy that can cut a partition between its clients and a server: the bytes stop, but
every connection stays open and nothing is refused or reset (what a network partition looks like
from both ends, unlike a stopped server). Runs in a thread of the test process, with an event
loop of its own, so it forwards whatever the test's own loop is doing.

``hold()`` stops forwarding: the bytes already read wait in the proxy, the rest in the sockets'
buffers (acknowledged by this machine's TCP, so neither end's keepalives or retransmission
timers notice anything), and new connections are accepted but not forwarded either. The
partition then ends one of three ways:

- ``heal()``: everything held is forwarded, and forwarding goes on (the network came back and
  TCP delivered what it had been retransmitting);
- ``drop()``: every connection is reset, and new ones are forwarded (a middlebox that lost its
  state and says so);
- ``forget()``: the connections of before stay held for ever, and new ones are forwarded (a
  middlebox that lost their state and drops their packets: the peers' TCP would retransmit for
  a quarter of an hour before giving up).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any


class Blackhole:
    """A proxy from ``127.0.0.1:port`` (chosen by the system, see :attr:`port`) to
    ``host:port``; a context manager that starts and stops its thread."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.connections = 0   # accepted so far
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="blackhole")
        self._server: asyncio.Server | None = None
        self._gate: asyncio.Event | None = None      # set while this generation forwards
        self._links: list[tuple[asyncio.Event, list[asyncio.StreamWriter]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def __enter__(self) -> Blackhole:
        self._thread.start()
        self._call(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _start(self) -> None:
        self._gate = asyncio.Event()
        self._gate.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for gate, writers in self._links:
            gate.set()
            for w in writers:
                w.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- what the test does ------------------------------------------------------------------

    def hold(self) -> None:
        """Stop forwarding, on every connection and on those accepted from now on."""
        async def hold() -> None:
            assert self._gate is not None
            self._gate.clear()
        self._call(hold())

    def heal(self) -> None:
        """Forward again: first what was held, then everything."""
        async def heal() -> None:
            assert self._gate is not None
            self._gate.set()
        self._call(heal())

    def drop(self) -> None:
        """Reset every connection (held or not); those accepted from now on are forwarded."""
        async def drop() -> None:
            old, self._links = self._links, []
            self._gate = asyncio.Event()
            self._gate.set()
            for _, writers in old:
                for w in writers:
                    w.transport.abort()
        self._call(drop())

    def forget(self) -> None:
        """Keep every connection of before held for ever; forward those accepted from now on."""
        async def forget() -> None:
            self._gate = asyncio.Event()
            self._gate.set()
        self._call(forget())

    # -- forwarding --------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        gate = self._gate
        assert gate is not None
        writers = [writer]
        self._links.append((gate, writers))
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await gate.wait()    # a connection made during a partition is held too
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            writers.append(up_writer)
            await asyncio.gather(self._pump(reader, up_writer, gate),
                                 self._pump(up_reader, writer, gate))
        except (Exception, asyncio.CancelledError):   # reset by drop(), or the proxy stops
            pass
        finally:
            self._tasks.discard(task)
            for w in writers:
                w.transport.abort()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    gate: asyncio.Event) -> None:
        while data := await reader.read(65536):
            await gate.wait()
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(Exception):
            writer.write_eof()
