"""The worker side of ``test_provider_processes.py``: one shoal App per process over a shared
store (a SQLite file, a PostgreSQL schema, or a Redis prefix), each with the same provider
``app.provider("fake", max_concurrent=3, requests_per_minute=PROV_RPM, breaker=Breaker(…))``,
making calls from several asyncio tasks through ``async with provider.call(…)`` to a fake model
provider. The fake provider is the shared log itself: one JSON line per event, appended with one
``os.write`` (O_APPEND), every time ``time.time()`` (one clock for every process on the machine).

A call logs ``start`` right after ``provider.call`` let it in (the concurrency slot is held), with
``asked``: the time just before it entered ``provider.call``; and ``end`` (answered), ``429``
(answered 429: ``call.rate_limited(retry_after=PROV_RETRY_AFTER)`` follows) or ``fail`` (the
provider raised) just before its ``async with`` block is left (the slot is still held). After
the block, the caller logs ``paused`` (a 429's ``async with`` has returned: the pause is in the
store) or ``failed`` (a failure's ``async with`` has returned: the failure is counted, and the
circuit opened if it was the last straw); a call that never went logs ``timeout``
(RateLimitTimeoutError, with what it waited for) or ``open`` (CircuitOpenError, with its
``until``), both with ``asked`` too.

``python provider_app.py worker`` waits for the file ``PROV_GO`` (its text: the wall time at which
to stop making calls), then runs ``PROV_MODE``:

``limits``   ``PROV_TASKS`` tasks call in a loop with ``timeout=PROV_TIMEOUT``; a call holds the
           provider 50..120 ms; the 2nd and 6th call of each process answer 429
``breaker``  every call fails (the fake provider raises). ``PROV_ROLE=caller`` calls from the
           start; ``PROV_ROLE=watcher`` logs ``check_readiness()`` first, waits until the log
           shows ``PROV_FAILURES`` failures of the callers, logs ``check_readiness()`` again,
           then calls too

Configured by environment variables: ``PROV_STORE`` (the run store URL), ``PROV_REDIS`` and
``PROV_REDIS_PREFIX`` (when set, coordination goes through ``RedisCoordStore(url, prefix=…)``),
``PROV_LOG``, ``PROV_INSTANCE``, ``PROV_RPM``, ``PROV_FAILURES``, ``PROV_WINDOW``,
``PROV_COOLDOWN``, ``PROV_RETRY_AFTER``, ``PROV_TIMEOUT``, ``PROV_TASKS``, ``PROV_SEED``,
``PROV_MAX_LIFE`` (the guard's limit, seconds).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import harness

import shoal
from shoal.coord.provider import ProviderCall

NAMESPACE = "provproc"
PROVIDER = "fake"
MAX_CONCURRENT = 3
RATE_LIMITED_CALLS = (2, 6)    # limits mode: these calls of each process answer 429
emit = harness.LineLog("PROV_LOG")


class Outage(Exception):
    """The fake provider is down (breaker mode)."""


def make_app(env: dict[str, str] | None = None, instance_id: str | None = None) -> shoal.App:
    """The app of every process (and of the test itself), on the store named by ``env``
    (default: the environment)."""
    env = dict(os.environ) if env is None else env
    coordination = None
    if env.get("PROV_REDIS"):
        from shoal.backends.redis import RedisCoordStore

        coordination = RedisCoordStore(env["PROV_REDIS"], prefix=env["PROV_REDIS_PREFIX"])
    return shoal.App(NAMESPACE, store=env["PROV_STORE"], coordination=coordination,
                     instance_id=instance_id or env.get("PROV_INSTANCE"))


def make_provider(app: shoal.App, env: dict[str, str] | None = None) -> shoal.Provider:
    env = dict(os.environ) if env is None else env
    return app.provider(
        PROVIDER, max_concurrent=MAX_CONCURRENT, requests_per_minute=int(env["PROV_RPM"]),
        breaker=shoal.Breaker(failures=int(env["PROV_FAILURES"]),
                              window=float(env["PROV_WINDOW"]),
                              cooldown=float(env["PROV_COOLDOWN"])))


def _base() -> dict[str, Any]:
    return {"instance": os.environ.get("PROV_INSTANCE"), "pid": os.getpid()}


class Worker:
    def __init__(self) -> None:
        self.app = make_app()
        self.provider = make_provider(self.app)
        self.mode = os.environ["PROV_MODE"]
        self.role = os.environ.get("PROV_ROLE", "caller")
        self.timeout = float(os.environ.get("PROV_TIMEOUT", "2.0"))
        self.retry_after = float(os.environ.get("PROV_RETRY_AFTER", "0.5"))
        self.rng = random.Random(int(os.environ.get("PROV_SEED", "0")))
        self.numbers = itertools.count(1)   # this process's calls, in the order they went
        self.until = 0.0

    async def fake_provider(self, call: ProviderCall, n: int, asked: float) -> None:
        """The model provider: answers after a moment, 429 for some calls, or fails."""
        emit({**_base(), "ev": "start", "n": n, "t": time.time(), "asked": asked})
        await asyncio.sleep(self.rng.uniform(0.05, 0.12))
        if self.mode == "breaker":
            emit({**_base(), "ev": "fail", "n": n, "t": time.time()})
            raise Outage(f"call {n}")
        if n in RATE_LIMITED_CALLS:
            emit({**_base(), "ev": "429", "n": n, "t": time.time(),
                  "retry_after": self.retry_after})
            call.rate_limited(retry_after=self.retry_after)
        else:
            emit({**_base(), "ev": "end", "n": n, "t": time.time()})

    async def one_call(self) -> None:
        asked = time.time()   # before provider.call looks at anything in the store
        try:
            async with self.provider.call(tokens=100, timeout=self.timeout) as call:
                n = next(self.numbers)
                await self.fake_provider(call, n, asked)
            if n in RATE_LIMITED_CALLS and self.mode == "limits":
                emit({**_base(), "ev": "paused", "n": n, "t": time.time()})
        except Outage:
            emit({**_base(), "ev": "failed", "n": n, "t": time.time()})
        except shoal.RateLimitTimeoutError as e:
            emit({**_base(), "ev": "timeout", "limit": e.limit, "t": time.time(),
                  "asked": asked})
        except shoal.CircuitOpenError as e:
            emit({**_base(), "ev": "open", "until": e.until, "t": time.time(),
                  "asked": asked})
            await asyncio.sleep(0.05)   # it fails fast: do not spin on the store

    async def calls(self) -> None:
        while time.time() < self.until:
            await self.one_call()
            await asyncio.sleep(self.rng.uniform(0.0, 0.02))

    async def readiness(self, when: str) -> None:
        health = await self.app.check_readiness()
        emit({**_base(), "ev": "readiness", "when": when, "status": health.status.value,
              "reason": health.reason, "t": time.time()})

    async def wait_for_failures(self, count: int) -> None:
        path = os.environ["PROV_LOG"]
        while time.time() < self.until:
            failed = sum(1 for r in harness.read_log(Path(path))
                         if r.get("ev") == "failed")
            if failed >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"never saw {count} failures in the log")

    async def run(self) -> None:
        async with self.app.open():
            await self.provider.open_until()   # connected (and migrated) before the start
            if self.role == "watcher":
                await self.readiness("before")
            emit({**_base(), "ev": "ready", "t": time.time()})
            go = os.environ["PROV_GO"]
            while not os.path.exists(go):   # noqa: ASYNC110 (another process writes it)
                await asyncio.sleep(0.005)
            self.until = float(Path(go).read_text())
            if self.role == "watcher":
                await self.wait_for_failures(int(os.environ["PROV_FAILURES"]))
                await self.readiness("after")
            tasks = int(os.environ.get("PROV_TASKS", "4"))
            await asyncio.gather(*(self.calls() for _ in range(tasks)))
        emit({**_base(), "ev": "exit", "t": time.time()})


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(levelname)s %(message)s")
    harness.start_guard("PROV")
    asyncio.run(Worker().run())


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"] and os.environ.get("PROV_MODE") in ("limits", "breaker"):
        main()
    else:
        sys.exit(f"usage: PROV_MODE=limits|breaker {sys.argv[0]} worker")
