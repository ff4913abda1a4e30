"""Every store call timed for telemetry: :func:`measured` wraps a store (a run store, a
coordination store) in an object of the same shape whose async methods report each call to
:meth:`Telemetry.store_call` by operation name. The app makes one only when a sink implements
that hook, so an app without metrics calls its store directly and pays nothing.

The wrapper's class is made once per store class, with each method of the store defined on it
(timed if async, forwarded if not), so ``isinstance(wrapper, shoal.ports.CoordStore)`` and the
other protocol checks answer as they do for the store itself. Any other attribute is read from
the store.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from shoal.backends._parts import part
from shoal.telemetry import Telemetry

S = TypeVar("S")

# not reported: a wait for work (it blocks by design for up to its timeout), not a query
UNTIMED = frozenset({"wait_for_work"})


class Measured:
    """The base of the wrappers :func:`measured` makes."""

    def __init__(self, store: Any, telemetry: Telemetry) -> None:
        self.measured_store = store
        self._telemetry = telemetry

    def __getattr__(self, name: str) -> Any:
        # only called for what the wrapper's class lacks: the store's data attributes
        return getattr(self.__dict__["measured_store"], name)

    @property
    def url(self) -> str:
        return str(self.measured_store.url)

    def __repr__(self) -> str:
        return f"<measured {self.measured_store!r}>"


def _timed(name: str) -> Callable[..., Any]:
    async def call(self: Measured, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            result = await getattr(self.measured_store, name)(*args, **kwargs)
        except Exception as e:   # a cancel is no failure of the store: not reported
            self._telemetry.store_call(name, time.perf_counter() - began, e)
            raise
        self._telemetry.store_call(name, time.perf_counter() - began, None)
        return result

    call.__name__ = call.__qualname__ = name
    return call


def _forwarded(name: str, is_async: bool) -> Callable[..., Any]:
    if is_async:
        async def waits(self: Measured, *args: Any, **kwargs: Any) -> Any:
            return await getattr(self.measured_store, name)(*args, **kwargs)
        waits.__name__ = waits.__qualname__ = name
        return waits

    def call(self: Measured, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.measured_store, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


_classes: dict[type, type[Measured]] = {}


def _wrapper_class(cls: type) -> type[Measured]:
    made = _classes.get(cls)
    if made is not None:
        return made
    methods: dict[str, Any] = {}
    for name in dir(cls):
        if name.startswith("_") or name == "url":
            continue
        attr = inspect.getattr_static(cls, name)
        if isinstance(attr, part):
            attr = attr.method   # a front's method is its part's own
        if isinstance(attr, (staticmethod, classmethod)):
            attr = attr.__func__
        if not inspect.isfunction(attr):
            continue   # a property or a constant: read from the store by __getattr__
        is_async = inspect.iscoroutinefunction(attr)
        methods[name] = (_timed(name) if is_async and name not in UNTIMED
                         else _forwarded(name, is_async))
    made = type(f"Measured{cls.__name__}", (Measured,), methods)
    _classes[cls] = made
    return made


def measured(store: S, telemetry: Telemetry) -> S:
    """``store`` with every async method timed and reported to ``telemetry.store_call``
    (a store already wrapped is wrapped anew, around the store itself)."""
    inner: Any = store.measured_store if isinstance(store, Measured) else store
    # the same methods as the store's: it stands for one
    return cast(S, _wrapper_class(type(inner))(inner, telemetry))
