"""The Flask integration (``shoal.integrations.flask``) on the example app (examples/flask_app):
the extension in an app factory, views driven by Flask's test client (an order and its run
written in one sqlite3 transaction of the view's thread: both or neither), ``flask shoal
migrate`` through Flask's CLI runner, and ``flask shoal worker`` as a real process stopped by
SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask

import shoal
from shoal.integrations.flask import Shoal

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flask_app"
SRC = Path(shoal.__file__).resolve().parents[1]   # the processes run the shoal under test
sys.path.insert(0, str(EXAMPLE))
from shop import create_app, shoal_ext  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[Flask]:
    app = create_app({"DATABASE": str(tmp_path / "shop.db"),
                      "SHOAL_STORE": f"sqlite:///{tmp_path / 'shop.db'}"})
    yield app
    app.extensions["shoal"].client.close()


@pytest.fixture
def worker(shop: Flask) -> Iterator[subprocess.Popen[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHOAL_", "SHOP_"))}
    env.update(SHOP_DATABASE=shop.config["DATABASE"],
               PYTHONPATH=os.pathsep.join([str(EXAMPLE), str(SRC)]))
    # the store first, as a deploy would: the view's first dispatch then needs no write lock
    # of its own inside its transaction
    assert shop.test_cli_runner().invoke(args=["shoal", "migrate"]).exit_code == 0
    proc = subprocess.Popen([sys.executable, "-m", "flask", "--app", "shop", "shoal", "worker",
                             "--concurrency", "2"], cwd=EXAMPLE, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with shop.app_context():   # wait until it has started (registered its workflows)
        for _ in range(600):
            try:
                shoal_ext.client.dispatch("fulfil", {"order": 0}, delay=3600)
                break
            except shoal.UnknownWorkflowError:
                assert proc.poll() is None, proc.communicate()[1]
                time.sleep(0.05)
    yield proc
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "serving <shoal.App 'shop'" in err, err
    assert "gc=tuned" in err, err   # a worker process of its own, as shoal worker


def test_migrate_command(shop: Flask) -> None:
    result = shop.test_cli_runner().invoke(args=["shoal", "migrate"])
    assert result.exit_code == 0, result.output
    assert "is at schema version" in result.output


def test_views_dispatch_in_the_request_transaction(shop: Flask,
                                                   worker: subprocess.Popen[str]) -> None:
    web = shop.test_client()
    placed = web.post("/orders", json={"item": "kettle"})
    assert placed.status_code == 201, placed.text
    order, run_id = placed.json["order"], placed.json["run"]
    with shop.app_context():
        output = shoal_ext.client.result(run_id, timeout=30)
    assert output == {"order": order, "parcel": f"parcel-{order}"}
    status = web.get(f"/runs/{run_id}").json
    assert status == {"run": run_id, "status": "succeeded", "output": output}
    assert web.get("/runs/nope").status_code == 404

    shop.testing = False   # a failing view answers 500 instead of raising here
    assert web.post("/orders", json={"item": "out of stock"}).status_code == 500
    with shop.app_context():
        runs = shoal_ext.client.list_runs(workflow="fulfil")
    # the failed view's run rolled back with it (the first run is the fixture's)
    assert [r.id for r in runs][1:] == [run_id]


def test_worker_command_needs_an_app(tmp_path: Path) -> None:
    app = Flask("bare")
    app.config["SHOAL_STORE"] = f"sqlite:///{tmp_path / 'x.db'}"
    ext = Shoal(app)
    result = app.test_cli_runner().invoke(args=["shoal", "worker"])
    assert result.exit_code != 0 and "SHOAL_WORKER_APP" in result.output, result.output
    result = app.test_cli_runner().invoke(args=["shoal", "worker", "shop:create_app"])
    assert result.exit_code != 0 and "not a shoal.App" in result.output, result.output
    with app.app_context():
        assert ext.client.namespace == "default"
        ext.client.close()


def test_configuration_is_checked() -> None:
    with pytest.raises(shoal.ConfigurationError, match="SHOAL_STORE"):
        Shoal(Flask("nostore"))
    with pytest.raises(shoal.ConfigurationError, match="no shoal extension"), \
            Flask("other").app_context():
        Shoal().client  # noqa: B018
    app = Flask("defaults")
    ext = Shoal(app, store="memory://", namespace="n", max_queued=5)
    with app.app_context():
        assert ext.client.namespace == "n"
        ext.client.close()


def test_a_misspelt_option_is_named(tmp_path: Path) -> None:
    app = Flask("typo")
    app.config.update(SHOAL_STORE="memory://", SHOAL_OPTIONS={"max_queue": 5})
    with pytest.raises(shoal.ConfigurationError,
                       match=r"SHOAL_OPTIONS'\] has unknown option 'max_queue'; shoal.Client "
                             r"takes max_queued, admission, .*tracing"):
        Shoal(app)
    with pytest.raises(shoal.ConfigurationError, match=r"Shoal\(...\) has unknown option 'lease'"):
        Shoal(store="memory://", lease=3)
    app = Flask("every")   # every option of the Client (docs/clients.md)
    app.config.update(SHOAL_STORE="memory://", SHOAL_OPTIONS={
        "max_queued": 10, "admission": "park", "version": "v1", "max_payload_bytes": 1 << 20,
        "migrate": False, "clock": shoal.SystemClock(), "tracing": True, "close_timeout": 3.0})
    ext = Shoal(app)
    with app.app_context():
        assert ext.client.close_timeout == 3.0
        ext.client.close()


UNREACHABLE_APP = '''
import shoal
from flask import Flask
from shoal.integrations.flask import Shoal

STORE = "postgresql://postgres@127.0.0.1:1/test?connect_timeout=5"
worker = shoal.App("shop", store=STORE)


def create_app() -> Flask:
    app = Flask(__name__)
    app.config.update(SHOAL_STORE=STORE, SHOAL_WORKER_APP="unreachable:worker")
    Shoal(app)
    return app
'''


@pytest.mark.parametrize("command", ["worker", "migrate"])
def test_commands_say_in_one_line_that_the_store_is_unreachable(tmp_path: Path,
                                                                 command: str) -> None:
    (tmp_path / "unreachable.py").write_text(UNREACHABLE_APP)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHOAL_", "SHOP_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path), str(SRC)]))
    done = subprocess.run([sys.executable, "-m", "flask", "--app", "unreachable", "shoal",
                           command], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: Cannot connect to the PostgreSQL "
                                                   "store"), done.stderr
    assert "serving" not in done.stdout + done.stderr   # it never served
