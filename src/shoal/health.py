"""Health probes of an instance: liveness without I/O, readiness with a ping of each store."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Mapping
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


Ping = Callable[[], Awaitable[None]]


async def readiness(live: Health, store: Ping, coordination: Ping | None,
                    breakers: Mapping[str, Callable[[], Awaitable[float | None]]]) -> Health:
    """Readiness from liveness ``live`` and pings, each under ``PING_TIMEOUT`` real seconds:
    unhealthy without the run ``store``; degraded without a separate ``coordination`` store
    (runs go on; locks wait, slots answer None, meters raise) or while a provider's circuit is
    open (``breakers``: each provider's ``open_until``; it still serves, failing fast)."""
    if not live.healthy and live.reason != "not started":
        return Health(live.status, live.reason, {"liveness": live.reason})
    checks = {"liveness": live.reason}
    try:
        checks["store"] = await ping_within(asyncio.ensure_future(store()), PING_TIMEOUT)
    except Exception as e:
        checks["store"] = f"{type(e).__name__}: {e}"
    if checks["store"] != "ok":
        return Health(HealthStatus.UNHEALTHY, f"store: {checks['store']}", checks)
    if coordination is not None:
        try:
            checks["coordination"] = await ping_within(asyncio.ensure_future(coordination()),
                                                       PING_TIMEOUT)
        except Exception as e:
            checks["coordination"] = f"{type(e).__name__}: {e}"
        if checks["coordination"] != "ok":
            return Health(HealthStatus.DEGRADED, f"coordination: {checks['coordination']}",
                          checks)
    open_circuits = []
    for name, open_until in breakers.items():
        try:
            until = await asyncio.wait_for(open_until(), PING_TIMEOUT)
        except Exception as e:
            checks[f"provider:{name}"] = f"{type(e).__name__}: {e}"
            continue
        checks[f"provider:{name}"] = "ok" if until is None else "circuit open"
        if until is not None:
            open_circuits.append(name)
    if open_circuits:
        return Health(HealthStatus.DEGRADED, f"circuit open: {', '.join(open_circuits)}",
                      checks)
    return Health(HealthStatus.HEALTHY, "ok", checks)
