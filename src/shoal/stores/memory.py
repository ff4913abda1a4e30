"""The memory store (one process; the reference).
Its code is in :mod:`shoal.backends.memory`."""

from shoal.backends.memory import MemoryStore

__all__ = ["MemoryStore"]
