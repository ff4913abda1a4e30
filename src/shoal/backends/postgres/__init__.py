"""The PostgreSQL store (needs ``shoal[postgres]``)."""

from shoal.backends.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
