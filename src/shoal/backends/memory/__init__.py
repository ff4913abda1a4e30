"""The memory store (one process; the reference)."""

from shoal.backends.memory.store import MemoryStore

__all__ = ["MemoryStore"]
