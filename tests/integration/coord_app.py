"""The worker side of ``test_coord_processes.py``: one shoal App per process over a shared
coordination store (a SQLite file, a PostgreSQL schema, or a Redis prefix), exercising ``app.lock``,
``app.slots``/``app.on_assigned`` or ``app.meter`` and appending what it saw to a shared log (one
``os.write`` per JSON line, O_APPEND). Every time in the log is ``time.time()``: one clock for every
process on the machine.

``python coord_app.py worker`` runs the mode ``COORD_MODE`` names:

``lock``    until ``COORD_UNTIL``: ask for the lock ``COORD_KEY``, hold it a
          moment, release it; log ``asking``, ``acquired`` (token, ``held_until``),
          ``renewed`` (each new ``held_until``) and ``released`` (``lost``: the lease was not
          confirmed up to then)
``slots``   start the app, log every change the ``on_assigned`` listener hears and
          ``app.slots(COORD_TOTAL)`` every interval/10, until SIGTERM (then ``app.close()``)
``meter``   once the file ``COORD_GO`` exists, charge the meters ``COORD_CALLS`` times (two tasks)
          with a frozen clock, logging ``halfway`` after half of them, then on while fewer
          than ``COORD_PEERS`` workers have logged ``halfway`` (20 s at most); write every call
          and its answer to ``COORD_OUT`` (JSON)

Configured by environment variables: ``COORD_STORE`` (the run store URL: ``sqlite:///…``,
``postgresql://…?schema=…``, ``memory://``), ``COORD_REDIS`` and ``COORD_REDIS_PREFIX`` (when set,
coordination goes through ``RedisCoordStore(url, prefix=…)`` instead of the run store),
``COORD_LOG``, ``COORD_INSTANCE``, ``COORD_LEASE``, ``COORD_INTERVAL`` (membership interval),
``COORD_MAX_LIFE`` (the guard's limit, seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import harness

import shoal

NAMESPACE = "coordproc"
FROZEN_AT = 1_800_000_000.0   # the meter workers' clock never moves: no debt drains
emit = harness.LineLog("COORD_LOG")


class FrozenClock:
    """A shoal Clock whose ``now()`` never changes; ``sleep`` still waits (asyncio)."""

    def __init__(self, at: float = FROZEN_AT) -> None:
        self.at = at

    def now(self) -> float:
        return self.at

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


def make_app(env: dict[str, str] | None = None, clock: Any = None,
             instance_id: str | None = None) -> shoal.App:
    """The app of every process (and of the test itself): the store, coordination, lease and
    membership interval named by ``env`` (default: the environment)."""
    env = dict(os.environ) if env is None else env
    coordination = None
    if env.get("COORD_REDIS"):
        from shoal.backends.redis import RedisCoordStore

        coordination = RedisCoordStore(env["COORD_REDIS"], prefix=env["COORD_REDIS_PREFIX"])
    return shoal.App(NAMESPACE, store=env["COORD_STORE"], coordination=coordination,
                     instance_id=instance_id or env.get("COORD_INSTANCE"),
                     lease=float(env.get("COORD_LEASE", "1.0")),
                     membership_interval=float(env.get("COORD_INTERVAL", "0.4")),
                     clock=clock)


def _base() -> dict[str, Any]:
    return {"instance": os.environ.get("COORD_INSTANCE"), "pid": os.getpid()}


# -- lock -----------------------------------------------------------------------------------------


async def lock_worker() -> None:
    """Contend for one key until ``COORD_UNTIL`` (a wall time). The critical section is from the
    ``acquired`` line (written after the grant) to the ``released`` line (written before the
    release): two of them must never overlap while the lease is confirmed."""
    app = make_app()
    key = os.environ.get("COORD_KEY", "the-lock")
    until = float(os.environ["COORD_UNTIL"])
    rng = random.Random()
    async with app.open():
        emit({**_base(), "ev": "ready", "t": time.time()})
        while (left := until - time.time()) > 0:
            request = app.lock(key)
            emit({**_base(), "ev": "asking", "t": time.time()})
            try:
                # a wait cut short at the end cancels the request: it leaves the queue
                lock = await asyncio.wait_for(request.__aenter__(), left)
            except TimeoutError:
                emit({**_base(), "ev": "gave_up", "t": time.time()})
                break
            try:
                t = time.time()
                emit({**_base(), "ev": "acquired", "token": lock.token, "t": t,
                      "held_until": lock.held_until})
                seen = lock.held_until
                # mostly short holds; two in five long enough for renewals (every lease/3)
                long = rng.random() < 0.4
                end = t + (rng.uniform(0.7, 1.5) * app.lease if long else rng.uniform(0.05, 0.3))
                while time.time() < end and not lock.signal.aborted:
                    await asyncio.sleep(0.02)
                    if lock.held_until != seen:
                        seen = lock.held_until
                        emit({**_base(), "ev": "renewed", "token": lock.token,
                              "t": time.time(), "held_until": seen})
                now = time.time()
                # lost: the store had not confirmed the lease up to now, so another holder may
                # legitimately have it already (the body is not interrupted by a lost lock)
                lost = lock.signal.aborted or now >= lock.held_until
                emit({**_base(), "ev": "released", "token": lock.token, "t": now, "lost": lost,
                      "held_until": lock.held_until})
            finally:
                await request.__aexit__(None, None, None)
            await asyncio.sleep(rng.uniform(0.0, 0.05))
    emit({**_base(), "ev": "exit", "t": time.time()})


# -- slots ----------------------------------------------------------------------------------------


async def slots_worker() -> None:
    """Start the app, then log what this replica owns: on every change the listener hears and
    every interval/10, until SIGTERM; then close (let go, leave) and log ``exit``."""
    app = make_app()
    total = int(os.environ.get("COORD_TOTAL", "16"))
    sample = app.membership_interval / 10
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def observe(how: str, extra: dict[str, Any] | None = None) -> None:
        owned = app.slots(total) or []
        emit({**_base(), "ev": how, "slots": owned, "t": time.time(), **(extra or {})})

    def listener(assignment: shoal.Assignment | None) -> None:
        heard = None if assignment is None else [assignment.i, assignment.n]
        observe("assigned", {"assignment": heard})

    class Starved(logging.Handler):
        """Logs when this replica let go because its heartbeats went unconfirmed (a machine too
        loaded to run it on time): the test excuses what moves after it, not an overlap."""

        def emit(self, record: logging.LogRecord) -> None:
            event = getattr(record, "event", None)
            if event in ("membership.expired", "membership.unavailable"):
                emit({**_base(), "ev": "starved", "event": event, "t": time.time()})

    logging.getLogger("shoal").addHandler(Starved())
    await app.start()
    emit({**_base(), "ev": "started", "t": time.time()})
    app.on_assigned(listener)
    try:
        while not stop.is_set():
            observe("sample")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), sample)
        emit({**_base(), "ev": "stopping", "t": time.time()})
    finally:
        await app.close(timeout=5.0)
    observe("closed")
    emit({**_base(), "ev": "exit", "t": time.time()})


# -- meter ----------------------------------------------------------------------------------------


def meter_plan(index: int, calls: int) -> list[tuple[list[str], list[float]]]:
    """The calls of worker ``index``: one key, or three positions over two keys (one named
    twice), with deltas of 1..7 ms."""
    plan: list[tuple[list[str], list[float]]] = []
    for c in range(calls):
        d = float(1 + (c * 3 + index) % 7)
        if c % 3 == 2:
            plan.append((["m:a", "m:b", "m:a"], [d, 8.0 - d, 1.0]))
        else:
            plan.append((["m:one"], [d]))
    return plan


def _all_halfway(peers: int) -> bool:
    return sum(1 for r in harness.read_log(Path(os.environ["COORD_LOG"]))
               if r.get("ev") == "halfway") >= peers


async def meter_worker() -> dict[str, Any]:
    app = make_app(clock=FrozenClock())
    index = int(os.environ["COORD_INDEX"])
    calls = int(os.environ.get("COORD_CALLS", "200"))
    peers = int(os.environ.get("COORD_PEERS", "1"))
    # the first ``calls`` of this plan always, then more while a peer is not halfway yet
    plan = meter_plan(index, calls * 20)
    answers: list[list[float] | None] = [None] * len(plan)
    async with app.open():
        await app.meter(["m:warm"], [0])   # connected before the start
        emit({**_base(), "ev": "ready", "t": time.time()})
        while not os.path.exists(os.environ["COORD_GO"]):   # noqa: ASYNC110 (another process)
            await asyncio.sleep(0.005)
        began = time.time()
        numbers = itertools.count()
        used = len(plan)

        async def charge() -> None:
            nonlocal used
            # the draws are in order and, once one stops, every later one does: the calls
            # made are plan[:used]
            while (n := next(numbers)) < used:
                if n >= calls and (_all_halfway(peers) or time.time() > began + 20.0):
                    used = min(used, n)
                    return
                keys, deltas = plan[n]
                answers[n] = await app.meter(keys, deltas)
                if n == calls // 2:
                    emit({**_base(), "ev": "halfway", "t": time.time()})

        await asyncio.gather(charge(), charge())
        ended = time.time()
    return {"index": index, "plan": plan[:used], "answers": answers[:used], "began": began,
            "ended": ended}


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(levelname)s %(message)s")
    harness.start_guard("COORD")
    mode = os.environ["COORD_MODE"]
    if mode == "meter":
        out = os.environ["COORD_OUT"]
        with open(out + ".tmp", "w") as f:
            json.dump(asyncio.run(meter_worker()), f)
        os.replace(out + ".tmp", out)
    else:
        asyncio.run(lock_worker() if mode == "lock" else slots_worker())


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"] and os.environ.get("COORD_MODE") in ("lock", "slots", "meter"):
        main()
    else:
        sys.exit(f"usage: COORD_MODE=lock|slots|meter {sys.argv[0]} worker")
