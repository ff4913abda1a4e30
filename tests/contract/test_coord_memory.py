"""The coordination contract on the in-memory store (the reference)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from handoffs import LockManagerHandOffs

from shoal.backends.memory import MemoryStore
from shoal.testing.contract import CoordContract


class TestMemoryCoordination(CoordContract, LockManagerHandOffs):
    @pytest.fixture
    async def coord(self) -> AsyncIterator[MemoryStore]:
        s = MemoryStore()
        await s.open()
        yield s
        await s.close()

    @pytest.fixture
    async def other(self, coord: MemoryStore) -> MemoryStore:
        return coord
