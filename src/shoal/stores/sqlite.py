"""The SQLite store (several processes on one machine).
Its code is in :mod:`shoal.backends.sqlite`."""

from shoal.backends.sqlite import SQLiteStore

__all__ = ["SQLiteStore"]
