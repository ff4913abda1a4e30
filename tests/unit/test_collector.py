"""shoal.app.collector: the garbage collector of a dedicated worker process, set from
SHOAL_WORKER_GC. Each case runs in a fresh interpreter, so this process's collector is never
touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import gc, json
from shoal.app.collector import tune_from_env
before = list(gc.get_threshold())
try:
    tuned = tune_from_env()
except ValueError as e:
    print(json.dumps({"error": str(e), "threshold": list(gc.get_threshold())}))
else:
    print(json.dumps({"tuned": tuned, "before": before, "threshold": list(gc.get_threshold()),
                      "frozen": gc.get_freeze_count() > 0}))
"""


def _probe(value: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_WORKER_GC"}
    if value is not None:
        env["SHOAL_WORKER_GC"] = value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    result: dict[str, object] = json.loads(out)
    return result


@pytest.mark.parametrize("value", [None, "", "tuned", " TUNED "])
def test_a_worker_collects_rarely_and_freezes_its_start(value: str | None) -> None:
    got = _probe(value)
    assert got["tuned"] is True and got["frozen"] is True
    assert got["threshold"] == [20_000, 10, 10]
    assert got["before"] != got["threshold"]   # Python's own were there before


@pytest.mark.parametrize("value", ["default", "Default"])
def test_default_keeps_pythons_settings(value: str) -> None:
    got = _probe(value)
    assert got["tuned"] is False and got["frozen"] is False
    assert got["threshold"] == got["before"]


def test_an_unknown_setting_is_refused_and_changes_nothing() -> None:
    got = _probe("off")
    assert "SHOAL_WORKER_GC='off'" in str(got["error"]) and "'default'" in str(got["error"])
    assert got["threshold"] != [20_000, 10, 10]
