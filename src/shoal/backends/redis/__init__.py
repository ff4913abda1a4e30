"""Redis: coordination and rate limits only (needs ``shoal[redis]``); Redlock over an odd number
of independent servers beside it. Each operation is one Lua script in ``lua/``."""

from shoal.backends.redis.redlock import Redlock
from shoal.backends.redis.store import RedisCoordStore

__all__ = ["RedisCoordStore", "Redlock"]
