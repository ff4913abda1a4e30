"""Lock watches shared by the backends: an event per waiting holder, and a registry that a
release in this process, a NOTIFY or a pub/sub message wakes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar


class EventWatch:
    """The usual :class:`LockWatch`: an event that whoever learns the holder may be granted sets
    (a release in this process, a NOTIFY, a pub/sub message; a reconnection or an error sets
    every watch, a spurious wake-up rather than a lost one); ``wait`` consumes it."""

    def __init__(self, namespace: str, keys: Sequence[str], holder: str) -> None:
        self.namespace = namespace
        self.keys = tuple(keys)
        self.holder = holder
        self.event = asyncio.Event()

    async def wait(self) -> None:
        await self.event.wait()
        self.event.clear()


W = TypeVar("W", bound=EventWatch)


class WatchRegistry(Generic[W]):
    """A store object's lock watches by (namespace, holder): what a release in this process wakes
    at once, and what a notification from elsewhere (NOTIFY, pub/sub, a poll) is dispatched to."""

    def __init__(self) -> None:
        self._by_holder: dict[tuple[str, str], set[W]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_holder)

    def add(self, watch: W) -> None:
        self._by_holder.setdefault((watch.namespace, watch.holder), set()).add(watch)

    def remove(self, watch: W) -> None:
        watches = self._by_holder.get((watch.namespace, watch.holder))
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._by_holder[(watch.namespace, watch.holder)]

    def every(self) -> set[W]:
        return {w for watches in self._by_holder.values() for w in watches}

    def wake(self, namespace: str, holders: Iterable[str]) -> None:
        """Wake the watches of these holders (the waiters a release named)."""
        for holder in holders:
            for watch in self._by_holder.get((namespace, holder), ()):
                watch.event.set()

    def wake_keys(self, namespace: str, keys: Sequence[str]) -> None:
        """Wake every watch of these keys: when who is next cannot be known (a release whose
        answer was lost)."""
        wanted = set(keys)
        for watch in self.every():
            if watch.namespace == namespace and wanted.intersection(watch.keys):
                watch.event.set()

    def wake_every(self) -> None:
        for watch in self.every():
            watch.event.set()
