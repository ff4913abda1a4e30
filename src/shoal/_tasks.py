"""Small task helpers shared by the engine and the maintenance services: cancel a task and
wait for it (boundedly), tell a cancellation from outside from one user code raised, call a user
handler (sync or async) within a time limit, and report an error to the ``on_error`` handlers."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from shoal import _threads, _usercode
from shoal.clock import Clock

log = logging.getLogger("shoal")


def really_cancelled() -> bool:
    """Whether the current task is being cancelled from outside (not a CancelledError that
    user code raised)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


async def call_handler(fn: Callable[..., Any], clock: Clock, timeout: float,
                       *args: Any) -> None:
    """Call a user handler: a coroutine function on the loop, a plain one in a thread (so a
    blocking client never stalls renewals), for at most ``timeout`` seconds of ``clock`` (the
    app's: the claim the handler works under ends on it), then cancelled."""
    if inspect.iscoroutinefunction(fn):
        call: Awaitable[Any] = _usercode.awaited(fn(*args))
    else:
        # a daemon thread: a stuck handler never holds the process's exit
        call = _threads.run(_usercode.wrap(fn), *args)
    task = asyncio.ensure_future(call)
    timer = asyncio.ensure_future(clock.sleep(max(0.0, timeout)))
    try:
        await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        if not task.done():
            task.cancel()   # also when we are cancelled: no handler outlives its pass
    if not task.done():
        raise TimeoutError(f"the handler took longer than {timeout:.1f} s (its lease)")
    if task.cancelled():
        raise RuntimeError("the handler raised asyncio.CancelledError")
    result = task.result()
    if inspect.isawaitable(result):
        await result

async def cancel_and_wait(task: asyncio.Task[Any], grace: float = 1.0) -> None:
    """Cancel ``task`` and wait for it to end, at most ``grace`` real seconds: a task that
    swallows its cancellation (a library racing it with its own wait) is cancelled again
    until it ends or the grace is over, so a stop never hangs on it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=min(0.05, max(0.0, deadline - loop.time())))
        if loop.time() >= deadline:
            break
    if not task.done():
        log.warning("stop.stuck: task %s did not end within %.1f s of its cancellation",
                    task.get_name(), grace, extra={"event": "stop.stuck"})
        return
    if not task.cancelled() and task.exception() is not None:
        log.debug("task %s ended with %r", task.get_name(), task.exception())


async def report(handlers: Sequence[Callable[[BaseException], Any]], error: BaseException) -> None:
    """Call each ``app.on_error`` handler with ``error``; one that raises is logged."""
    for handler in list(handlers):
        try:
            result = handler(error)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("on_error handler %r raised", handler)


async def first_of(awaitable: Awaitable[Any], clock: Clock, seconds: float) -> bool:
    """Await ``awaitable`` for at most ``seconds`` on ``clock``; True if it finished first."""
    task = asyncio.ensure_future(awaitable)
    timer = asyncio.ensure_future(clock.sleep(max(0.0, seconds)))
    try:
        await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        pending = [t for t in (task, timer) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            # not gather under suppress: that would swallow a cancel of the caller itself
            await asyncio.wait(pending)
    if task.cancelled():
        return False
    task.result()
    return True
