"""The rate-limit contract on the in-memory store (the reference)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shoal.backends.memory import MemoryStore
from shoal.testing.contract import RateContract


class TestMemoryRateLimits(RateContract):
    @pytest.fixture
    async def rates(self) -> AsyncIterator[MemoryStore]:
        s = MemoryStore()
        await s.open()
        yield s
        await s.close()

    @pytest.fixture
    async def other(self, rates: MemoryStore) -> MemoryStore:
        return rates
