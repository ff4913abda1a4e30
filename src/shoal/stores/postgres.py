"""The PostgreSQL store (needs ``shoal[postgres]``).
Its code is in :mod:`shoal.backends.postgres`."""

from shoal.backends.postgres import PostgresStore

__all__ = ["PostgresStore"]
