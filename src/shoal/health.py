"""Health probes of an instance: liveness without I/O, readiness with a ping of each store."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field


class HealthStatus(enum.StrEnum):
    """``healthy``; ``degraded`` (serves, something it leans on is impaired); ``unhealthy``."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True)
class Health:
    """What a probe found: a status, and per check a short reason (``"ok"`` when it passed)."""

    status: HealthStatus
    reason: str = "ok"
    checks: dict[str, str] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return self.status == HealthStatus.HEALTHY


PING_TIMEOUT = 2.0


async def ping_within(ping: asyncio.Future[None] | asyncio.Task[None], timeout: float) -> str:
    """``"ok"``, or why the ping failed or did not answer within ``timeout`` real seconds."""
    done, _ = await asyncio.wait({ping}, timeout=timeout)
    if not done:
        ping.cancel()
        return f"no answer within {timeout:g} s"
    error = ping.exception()
    return "ok" if error is None else f"{type(error).__name__}: {error}"
