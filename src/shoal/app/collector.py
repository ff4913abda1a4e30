"""Python's cyclic garbage collector in a process that is a shoal worker and nothing else.

With Python's defaults (a collection of the youngest generation every 700 allocations of tracked
objects), a worker busy with short runs collects every few runs: each collection walks the objects
of the runs in flight, moves them to older generations although they die milliseconds later, and
so brings on collections of the whole heap. Measured at 100 slots on PostgreSQL (bench/postgres.py,
2 workers, no-op runs): about 10 µs of a worker's CPU per run, a fifth of it. shoal's own objects
do not need the collector (the engine breaks its reference cycles when a run ends), so a
dedicated worker collects rarely instead.

``shoal worker`` calls :func:`tune_for_worker` unless told ``--gc default`` (or
``SHOAL_WORKER_GC=default``); so do Django's ``manage.py shoal_worker`` and ``flask shoal
worker`` (:func:`tune_from_env`: the variable alone). An App embedded in another program (a web
server) leaves the collector as that program set it; such a program may call it itself.
"""

from __future__ import annotations

import gc
import os

# Collect the youngest generation every 20,000 allocations of tracked objects (Python: 700); the
# two older ones as Python does, each after 10 collections of the one before.
WORKER_THRESHOLDS = (20_000, 10, 10)
GC_ENV = "SHOAL_WORKER_GC"


def tune_for_worker() -> None:
    """Set the collector for a dedicated worker process: the youngest generation collected every
    20,000 allocations (:data:`WORKER_THRESHOLDS`) and the objects alive now (modules, the app,
    its workflows) moved out of every later collection (``gc.freeze()``). Garbage in reference
    cycles is still collected, only later."""
    gc.set_threshold(*WORKER_THRESHOLDS)
    gc.freeze()


def tune_from_env() -> bool:
    """:func:`tune_for_worker`, unless ``SHOAL_WORKER_GC`` says ``default``; whether it tuned.
    Unset, empty or ``tuned`` tunes; any other value is a ValueError naming the variable."""
    value = os.environ.get(GC_ENV, "")
    setting = value.strip().lower() or "tuned"
    if setting not in ("tuned", "default"):
        raise ValueError(f"{GC_ENV}={value!r}: expected 'tuned' (the default) or 'default' "
                         f"(Python's own garbage-collector settings).")
    if setting == "default":
        return False
    tune_for_worker()
    return True
