"""``AbortSignal``: how shoal tells running code to stop, for runs and for locks alike."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class AbortSignal:
    """Set once, when the work it guards must stop: a run's lease was lost, the run was
    cancelled or the instance is stopping; a lock was lost. Long work may poll ``aborted``, call
    ``raise_if_aborted()`` before a step that must not overlap, or ``await wait()``.

    A run's signal also reads as set, from any thread, once its lease has ended (less the drift
    margin) without a renewal, before the event loop has set it: a step's thread in a process
    thawed after a freeze (SIGSTOP, a VM paused) sees it at its next look, where it would
    otherwise go on until the loop's first turn. (``wait()`` returns when the loop sets it.)"""

    def __init__(self) -> None:
        self._reason: BaseException | None = None
        self._event: asyncio.Event | None = None   # made by the first wait(): most never wait
        # a run's: the reason its lease has ended by now, or None (see RunContext)
        self._expiry: Callable[[], BaseException | None] | None = None

    def _current(self) -> BaseException | None:
        reason = self._reason
        if reason is None and (expiry := self._expiry) is not None:
            return expiry()
        return reason

    @property
    def aborted(self) -> bool:
        return self._current() is not None

    @property
    def reason(self) -> BaseException | None:
        """Why: a ``LeaseLostError`` (a run's lease), ``asyncio.CancelledError`` (a cancel or a
        stop), or a ``LockLostError`` (a lock)."""
        return self._current()

    def raise_if_aborted(self) -> None:
        """Raise the reason if the signal is set."""
        reason = self._current()
        if reason is not None:
            raise reason

    async def wait(self) -> None:
        """Return once the signal is set."""
        if self._reason is not None:
            return
        if self._event is None:
            self._event = asyncio.Event()
        await self._event.wait()

    def _abort(self, reason: BaseException) -> None:
        if self._reason is None:
            self._reason = reason
            if self._event is not None:
                self._event.set()


# Setting a signal is shoal's own doing (the engine for a run's, a lock for its own): these are
# the package's calls for it, not methods of AbortSignal, which user code only reads.

def set_aborted(signal: AbortSignal, reason: BaseException) -> None:
    """Set ``signal`` with ``reason``; a signal set already keeps its first reason."""
    signal._abort(reason)


def set_expiry(signal: AbortSignal, expiry: Callable[[], BaseException | None] | None) -> None:
    """Have ``signal`` also read as set while ``expiry()`` gives a reason (a run's lease
    ended), or no longer (None)."""
    signal._expiry = expiry
