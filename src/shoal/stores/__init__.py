"""The stores as users name them: ``open_store`` picks a backend from a URL, and
``shoal.stores.memory``, ``.sqlite``, ``.postgres`` and ``.redis`` name each backend's store
class. The code lives in :mod:`shoal.backends`, one package per backend."""

from __future__ import annotations

import os

from shoal.backends._urls import mask_url
from shoal.errors import ConfigurationError
from shoal.ports import CoordStore, Store


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


def open_coordination(coordination: str | list[str] | CoordStore | None) -> CoordStore | None:
    """Build (not yet open) the coordination store ``App(coordination=…)`` names: None (the run
    store coordinates), a store object, one ``redis://`` address, or an odd number of them
    (a Redlock quorum). ``SHOAL_REDIS_PASSWORD`` is the password when set."""
    if coordination is None:
        return None
    if isinstance(coordination, CoordStore):
        return coordination
    addresses = [coordination] if isinstance(coordination, str) else coordination
    if not isinstance(addresses, list) or not addresses or not all(
            isinstance(a, str) for a in addresses):
        raise ConfigurationError(
            f"coordination must be None, a redis:// address or a list of them, not "
            f"{coordination!r}.")
    if len(addresses) % 2 == 0:
        raise ConfigurationError(
            f"Atomicity takes an odd number of addresses, {len(addresses)} given.")
    for address in addresses:
        if not address.startswith(("redis://", "rediss://")):
            raise ConfigurationError(
                f"A coordination address is a redis:// or rediss:// URL, not "
                f"{mask_url(address)!r} (leave coordination=None to coordinate through the "
                f"store).")
    try:
        from shoal.backends.redis import RedisCoordStore
    except ImportError as e:
        raise ConfigurationError(
            "coordination='redis://…' needs the redis client: pip install 'shoal[redis]'."
        ) from e
    password = os.environ.get("SHOAL_REDIS_PASSWORD") or None
    stores = [RedisCoordStore(a, password=password) for a in addresses]
    if len(stores) == 1:
        return stores[0]
    from shoal.backends.redis import Redlock
    return Redlock(stores)


__all__ = ["Store", "mask_url", "open_coordination", "open_store"]
