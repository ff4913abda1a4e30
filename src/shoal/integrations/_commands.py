"""What the web frameworks' worker and migrate commands share with ``shoal worker``: an error of
shoal's own (a bad URL, an unreachable store, a schema too new) ends them with one line, never a
traceback, and a worker says it serves only once it has connected."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable

from shoal.app import App
from shoal.errors import ShoalError


def one_line(error: BaseException) -> str | None:
    """The line a command prints for ``error``, as ``shoal worker`` words it; None for an
    error that is not shoal's or the store's (a bug, which keeps its traceback)."""
    if isinstance(error, ShoalError):
        return str(error)
    if isinstance(error, sqlite3.Error):
        return f"The SQLite store failed: {error}"
    return None


def serve(app: App, timeout: float, announce: Callable[[], None]) -> None:
    """``app.run_forever(timeout=timeout)``, calling ``announce()`` once the app has started
    (connected, migrated, recorded its workflows), not before: a store that cannot be reached
    fails the command before it claims to serve."""
    app.run_forever(timeout=timeout, on_started=announce)


def migrate(namespace: str, store: str) -> int:
    """Create the store at ``store`` or bring its schema up to date; its schema version."""

    async def go() -> int:
        app = App(namespace, store=store)
        async with app.open():   # opening migrates
            return await app.store.migrate()

    return asyncio.run(go())
