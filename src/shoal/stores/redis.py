"""The Redis coordination store (needs ``shoal[redis]``).
Its code is in :mod:`shoal.backends.redis`."""

from shoal.backends.redis import RedisCoordStore

__all__ = ["RedisCoordStore"]
