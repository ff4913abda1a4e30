"""A store as a thin front over its parts.

A backend is one object that owns the connections (turns, the kept connection, transactions,
retries, error translation) and parts that each hold one concern (runs, coordination, rates,
graph checkpoints), each handed that object. The store the engine sees implements the ports
(:mod:`shoal.ports`) by naming, for each method, the part that answers it::

    class PostgresStore:
        lock_acquire = part("coord", PostgresCoordination.lock_acquire)

The front's method is the part's own, bound to the part: mypy checks it against the port with
the part's signature, and a call costs what a call of the part's method costs (the bound method
is kept on the store after its first use).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

_P = ParamSpec("_P")
_R = TypeVar("_R")


class part(Generic[_P, _R]):
    """The method ``method`` of the part held in the store's attribute ``attribute``."""

    def __init__(self, attribute: str, method: Callable[Concatenate[Any, _P], _R]) -> None:
        self.attribute = attribute
        self.method = method
        self.name = method.__name__
        self.__doc__ = method.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.name:
            raise TypeError(
                f"{owner.__name__}.{name} names the part method {self.name}: a front's method "
                f"keeps its part's name")

    @overload
    def __get__(self, store: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, store: object, owner: type | None = None) -> Callable[_P, _R]: ...

    def __get__(self, store: object | None, owner: type | None = None) -> Any:
        if store is None:
            return self
        bound = getattr(getattr(store, self.attribute), self.name)
        if getattr(type(store), self.name) is self:
            # the next call finds it on the store itself (unless a subclass overrides the
            # method and reached this one through super(): its own must stay in front)
            vars(store)[self.name] = bound
        return bound
