"""Store backends behind one protocol; ``open_store`` picks one from a URL."""

from __future__ import annotations

from shoal.errors import ConfigurationError
from shoal.stores.base import Store


def open_store(url: str) -> Store:
    """Build (not yet open) the store a URL names: ``memory://``, ``sqlite:///path`` or
    ``postgresql://user:password@host:port/database?schema=shoal``."""
    if url == "memory://" or url.startswith("memory:"):
        from shoal.stores.memory import MemoryStore

        return MemoryStore()
    if url.startswith("sqlite:"):
        from shoal.stores.sqlite import SQLiteStore

        return SQLiteStore.from_url(url)
    if url.startswith(("postgresql:", "postgres:")):
        try:
            from shoal.stores.postgres import PostgresStore
        except ImportError as e:
            raise ConfigurationError(
                f"The PostgreSQL store needs psycopg 3 ({e}): pip install 'shoal[postgres]'."
            ) from None
        return PostgresStore.from_url(url)
    raise ConfigurationError(
        f"Unknown store URL {mask_url(url)!r}: use 'memory://', 'sqlite:///path/to/file.db' or "
        f"'postgresql://user:password@host:5432/database'."
    )


def mask_url(url: str) -> str:
    """The URL with any password (``user:password@`` or ``?password=``) replaced by ``***``."""
    import re
    from urllib.parse import urlsplit, urlunsplit

    url = re.sub(r"([?&]password=)[^&#]*", r"\1***", url)
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


__all__ = ["Store", "mask_url", "open_store"]
