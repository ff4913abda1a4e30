"""Helpers for testing code built on shoal: a virtual clock, several instances in one test, and
the replay of a recorded run's history against new code (the store contracts a backend must
pass are :mod:`shoal.testing.contract`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from shoal.app import App
from shoal.app.history import History, ReplayResult, replay
from shoal.backends.memory import MemoryStore
from shoal.clock import Clock
from shoal.ports import Store
from shoal.testing.clock import VirtualClock, settle


@asynccontextmanager
async def cluster(
    make_app: Callable[[Store, Clock, str], App],
    instances: int = 2,
    clock: Clock | None = None,
    store: Store | None = None,
) -> AsyncIterator[list[App]]:
    """Start ``instances`` apps built by ``make_app(store, clock, instance_id)`` over one store
    (a fresh MemoryStore unless given) and one clock; close them all on exit."""
    shared_store = store if store is not None else MemoryStore()
    shared_clock = clock if clock is not None else VirtualClock()
    apps = [make_app(shared_store, shared_clock, f"instance-{i}") for i in range(instances)]
    started: list[App] = []
    try:
        for app in apps:
            await app.start()
            started.append(app)
        yield apps
    finally:
        for app in reversed(started):
            await app.close(timeout=0)


__all__ = ["History", "ReplayResult", "VirtualClock", "cluster", "replay", "settle"]
