"""What runs around each call of user code that the engine makes (a step's function, an outbox
or pause handler, ``app.locked``'s function), as a web framework runs its hooks around each
request: an integration registers hooks here. The Django integration registers
``close_old_connections``, so that a step never reuses a database connection the server dropped
(a view gets that before and after each request; a step must get it too). Without hooks a call
costs what the bare function or coroutine costs. A leaf module: it imports nothing of
shoal."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

log = logging.getLogger("shoal")
T = TypeVar("T")

ThreadHook = Callable[[], None]
AsyncHook = Callable[[], Awaitable[None]]

# called in the thread of a plain function, before and after it (the thread its code runs in)
_threaded: list[ThreadHook] = []
# awaited before and after a coroutine function (which reaches a thread of its own choosing,
# e.g. Django's sync_to_async: the hook goes there too)
_awaited: list[AsyncHook] = []


def add_hooks(threaded: ThreadHook, awaited: AsyncHook | None = None) -> None:
    """Run ``threaded()`` in the thread of each plain-function call of user code, before and
    after it, and await ``awaited()`` before and after each coroutine-function call. Adding
    the same hook again changes nothing."""
    if threaded not in _threaded:
        _threaded.append(threaded)
    if awaited is not None and awaited not in _awaited:
        _awaited.append(awaited)


def remove_hooks(threaded: ThreadHook, awaited: AsyncHook | None = None) -> None:
    """Undo :func:`add_hooks` (hooks not added are ignored)."""
    if threaded in _threaded:
        _threaded.remove(threaded)
    if awaited is not None and awaited in _awaited:
        _awaited.remove(awaited)


def wrap(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn``, calling the thread hooks before and after it in the thread that calls it (for
    any way of running it in a thread); ``fn`` itself when there are none. A hook that raises
    before ``fn`` raises instead of it (``fn`` is not called); one that raises after it is
    logged (``usercode.hook_failed``), and ``fn``'s outcome stands: a step that did its work is
    not failed, and retried, by the cleanup after it."""
    if not _threaded:
        return fn
    return functools.partial(_hooked, tuple(_threaded), fn)


def awaited(call: Awaitable[T]) -> Awaitable[T]:
    """``call`` (a coroutine of user code, not yet started), with the async hooks awaited
    before and after it; the same rules as :func:`wrap` for a hook that raises."""
    if not _awaited:
        return call
    return _hooked_async(tuple(_awaited), call)


def _hooked(hooks: tuple[ThreadHook, ...], fn: Callable[..., T], /, *args: Any,
            **kwargs: Any) -> T:
    for hook in hooks:
        hook()
    try:
        return fn(*args, **kwargs)
    finally:
        for hook in hooks:
            try:
                hook()
            except Exception:
                log.warning("usercode.hook_failed: %r after %r", hook, fn, exc_info=True,
                            extra={"event": "usercode.hook_failed"})


async def _hooked_async(hooks: tuple[AsyncHook, ...], call: Awaitable[T]) -> T:
    try:
        for hook in hooks:
            await hook()
    except BaseException:
        _close(call)
        raise
    try:
        return await call
    finally:
        for hook in hooks:
            try:
                await hook()
            except Exception:
                log.warning("usercode.hook_failed: %r after %r", hook, call, exc_info=True,
                            extra={"event": "usercode.hook_failed"})


def _close(call: object) -> None:
    """A coroutine that will never be awaited, closed (no 'never awaited' warning)."""
    close = getattr(call, "close", None)
    if asyncio.iscoroutine(call) and close is not None:
        close()
