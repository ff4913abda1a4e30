"""The SQLite store (several processes on one machine)."""

from shoal.backends.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
