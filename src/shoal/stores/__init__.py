"""The stores as users name them: ``open_store`` picks a backend from a URL, and
``shoal.stores.memory``, ``.sqlite``, ``.postgres`` and ``.redis`` name each backend's store
class. The code lives in :mod:`shoal.backends`, one package per backend."""

from __future__ import annotations

from shoal.backends._urls import mask_url
from shoal.errors import ConfigurationError
from shoal.ports import Store


def open_store(url: str) -> Store:
    """Build (not yet open) the store a URL names: ``memory://``, ``sqlite:///path`` or
    ``postgresql://user:password@host:port/database?schema=shoal``."""
    if url == "memory://" or url.startswith("memory:"):
        from shoal.backends.memory import MemoryStore

        return MemoryStore()
    if url.startswith("sqlite:"):
        from shoal.backends.sqlite import SQLiteStore

        return SQLiteStore.from_url(url)
    if url.startswith(("postgresql:", "postgres:")):
        try:
            from shoal.backends.postgres import PostgresStore
        except ImportError as e:
            raise ConfigurationError(
                f"The PostgreSQL store needs psycopg 3 ({e}): pip install 'shoal[postgres]'."
            ) from None
        return PostgresStore.from_url(url)
    raise ConfigurationError(
        f"Unknown store URL {mask_url(url)!r}: use 'memory://', 'sqlite:///path/to/file.db' or "
        f"'postgresql://user:password@host:5432/database'."
    )


__all__ = ["Store", "mask_url", "open_store"]
