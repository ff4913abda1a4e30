"""``AbortSignal``: how shoal tells running code to stop, for runs and for locks alike."""

from __future__ import annotations

import asyncio


class AbortSignal:
    """Set once, when the work it guards must stop: a run's lease was lost, the run was
    cancelled or the instance is stopping; a lock was lost. Long work may poll ``aborted``, call
    ``raise_if_aborted()`` before a step that must not overlap, or ``await wait()``."""

    def __init__(self) -> None:
        self._reason: BaseException | None = None
        self._event: asyncio.Event | None = None   # made by the first wait(): most never wait

    @property
    def aborted(self) -> bool:
        return self._reason is not None

    @property
    def reason(self) -> BaseException | None:
        """Why: a ``LeaseLostError`` (a run's lease), ``asyncio.CancelledError`` (a cancel or a
        stop), or a ``LockLostError`` (a lock)."""
        return self._reason

    def raise_if_aborted(self) -> None:
        """Raise the reason if the signal is set."""
        if self._reason is not None:
            raise self._reason

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
