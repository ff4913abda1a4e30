"""The FastAPI examples (examples/fastapi_app) through FastAPI's own TestClient, which runs the
ASGI lifespan: a service whose App starts with the lifespan and executes its runs, and a
service that only submits through an AsyncClient while ``shoal worker`` (a real process)
executes them; both report run status and mount the console under /shoal."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient

import shoal

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app"
SRC = Path(shoal.__file__).resolve().parents[1]   # the processes run the shoal under test
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"   # the trace of the request that places an order
TRACEPARENT = {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}
pytestmark = pytest.mark.timeout(120)


def fresh(name: str, store: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The example module ``name`` imported anew on ``store``."""
    monkeypatch.setenv("SHOP_STORE", store)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    for module in ("workflows", "web_and_worker", "submit_only"):
        sys.modules.pop(module, None)
    return importlib.import_module(name)


def finished(web: TestClient, run_id: str) -> dict[str, object]:
    for _ in range(600):
        status = web.get(f"/runs/{run_id}").json()
        if status["status"] == "succeeded":
            return status
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not finish: {status}")


def traced(app: object, run_id: str) -> str:
    """The trace context stored with the run (read with the app's own store)."""
    import shoal
    assert isinstance(app, shoal.App)
    with shoal.Client(app.store.url, namespace=app.namespace) as client:
        return client.get_run(run_id).trace_context or ""


def test_web_process_that_also_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = fresh("web_and_worker", f"sqlite:///{tmp_path / 'shop.db'}", monkeypatch)
    with TestClient(module.api) as web:
        placed = web.post("/orders/7", headers=TRACEPARENT)
        assert placed.status_code == 201, placed.text
        run_id = placed.json()["run"]
        assert TRACE in traced(module.app, run_id)   # the run continues the request's trace
        assert web.post("/orders/7").json()["run"] == run_id   # the idempotency key
        assert finished(web, run_id)["output"] == {"order": 7, "parcel": "parcel-7"}
        assert web.get("/runs/nope").status_code == 404
        console = web.get("/shoal/api/runs")
        assert console.status_code == 200, console.text
        assert run_id in console.text
        assert web.get("/shoal/").status_code == 200


def test_the_examples_run_with_shoal_fastapi_alone(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """pip install 'shoal[fastapi]' brings neither OpenTelemetry nor its FastAPI
    instrumentation: both shapes run without them, untraced (docs/fastapi.md)."""
    for name in [m for m in sys.modules if m.split(".")[0] == "opentelemetry"] + [
            "opentelemetry", "opentelemetry.instrumentation.fastapi"]:
        monkeypatch.setitem(sys.modules, name, None)   # not installed: importing it fails
    submit = fresh("submit_only", f"sqlite:///{tmp_path / 'submit.db'}", monkeypatch)
    assert submit.client.app.tracing is None
    module = fresh("web_and_worker", f"sqlite:///{tmp_path / 'shop.db'}", monkeypatch)
    assert module.app.tracing is None
    with TestClient(module.api) as web:
        placed = web.post("/orders/7", headers=TRACEPARENT)
        assert placed.status_code == 201, placed.text
        run_id = placed.json()["run"]
        assert finished(web, run_id)["output"] == {"order": 7, "parcel": "parcel-7"}
        assert traced(module.app, run_id) == ""


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[str]:
    store = f"sqlite:///{tmp_path / 'shop.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHOAL_", "SHOP_"))}
    env.update(SHOP_STORE=store, PYTHONPATH=os.pathsep.join([str(EXAMPLE), str(SRC)]))
    proc = subprocess.Popen([sys.executable, "-m", "shoal.cli", "worker", "workflows:app"],
                            cwd=EXAMPLE, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        yield store
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_web_process_that_only_submits(worker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = fresh("submit_only", worker, monkeypatch)
    assert "workflows" not in sys.modules   # no workflow code in this process
    # an order placed before the worker started fails (UnknownWorkflowError): answered 500
    with TestClient(module.api, raise_server_exceptions=False) as web:
        for _ in range(600):   # until the worker has started (registered its workflows)
            placed = web.post("/orders/8", headers=TRACEPARENT)
            if placed.status_code == 201:
                break
            time.sleep(0.05)
        assert placed.status_code == 201, placed.text
        run_id = placed.json()["run"]
        assert finished(web, run_id)["output"] == {"order": 8, "parcel": "parcel-8"}
        assert TRACE in traced(module.client.app, run_id)
        assert run_id in web.get("/shoal/api/runs").text
