"""The store contract suite, run against every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shoal.stores.base import Store
from shoal.stores.memory import MemoryStore
from shoal.stores.sqlite import SQLiteStore
from shoal.testing.contract import StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    async def store(self) -> AsyncIterator[Store]:
        s = MemoryStore()
        await s.open()
        yield s
        await s.close()

    @pytest.fixture
    async def other(self, store: Store) -> Store:
        return store


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        s = SQLiteStore(str(tmp_path / "shoal.db"))
        await s.open()
        yield s
        await s.close()

    @pytest.fixture
    async def other(self, store: SQLiteStore) -> AsyncIterator[Store]:
        s = SQLiteStore(store.path)
        await s.open()
        yield s
        await s.close()
