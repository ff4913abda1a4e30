"""The Django integration (``shoal.integrations.django``) on the example project
(examples/django_project), on SQLite and on PostgreSQL (a schema per test for Django's tables and
one for the store): ``manage.py migrate`` and ``shoal_migrate``, ``shoal_worker`` as a real
process stopped by SIGTERM, and ``django_scenario.py`` driving the views with Django's test
client (a run dispatched inside ``transaction.atomic()`` exists iff the transaction commits)."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import shoal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from backends import PG_URL, drop_schema, postgres_schema

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "django_project"
SCENARIO = Path(__file__).resolve().parent / "django_scenario.py"
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SHOAL_", "SHOP_"))}
    base.update(DJANGO_SETTINGS_MODULE="shop.settings", PYTHONPATH=str(PROJECT))
    if request.param == "sqlite":
        yield {**base, "SHOP_DATABASE": str(tmp_path / "shop.db"),
               "STORE": f"sqlite:///{tmp_path / 'shop.db'}"}
        return
    import psycopg
    from psycopg import sql

    with postgres_schema("shoal_dj_") as store_url:
        store_schema = store_url.rsplit("schema=", 1)[1]
        tables = f"shoal_djapp_{secrets.token_hex(6)}"
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(tables)))
        try:
            yield {**base, "SHOP_DATABASE": PG_URL, "SHOP_SCHEMA": tables,
                   "SHOP_SHOAL_SCHEMA": store_schema, "STORE": store_url}
        finally:
            drop_schema(tables)


def registered(store: str, worker: subprocess.Popen[str]) -> None:
    """Wait until the worker has recorded its workflows in the store (it has started)."""

    async def wait() -> None:
        app = shoal.App("shop", store=store)
        async with app.open():
            for _ in range(600):
                if await app.store.get_workflow("shop", "fulfil") is not None:
                    return
                assert worker.poll() is None, worker.communicate()[1]
                await asyncio.sleep(0.05)
        raise AssertionError("the worker did not start in 30 s")

    asyncio.run(wait())


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_project_with_a_worker(env: dict[str, str]) -> None:
    done = manage(env, "migrate", "--noinput")
    assert done.returncode == 0, done.stderr
    done = manage(env, "shoal_migrate")
    assert done.returncode == 0 and "is at schema version" in done.stdout, done.stderr
    worker = subprocess.Popen([sys.executable, "manage.py", "shoal_worker", "--concurrency", "2"],
                              cwd=PROJECT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        registered(env["STORE"], worker)
        scenario = subprocess.run([sys.executable, str(SCENARIO)], cwd=PROJECT, env=env,
                                  capture_output=True, text=True, timeout=120)
        assert scenario.returncode == 0, scenario.stdout + scenario.stderr
        assert "scenario ok" in scenario.stdout
        assert "Task was destroyed" not in scenario.stderr, scenario.stderr
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert "serving <shoal.App 'shop'" in err, err
    assert "gc=tuned" in err, err   # a worker process of its own, as shoal worker


def test_worker_command_names_what_is_missing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHOAL_", "SHOP_"))}
    env.update(DJANGO_SETTINGS_MODULE="shop.settings", PYTHONPATH=str(PROJECT),
               SHOP_DATABASE=str(tmp_path / "shop.db"))
    done = manage(env, "shoal_worker", "orders.nothing:app")
    assert done.returncode != 0
    assert "cannot import 'orders.nothing'" in done.stderr, done.stderr
    done = manage(env, "shoal_worker", "orders.models:Order")
    assert "not a shoal.App" in done.stderr, done.stderr
