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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import shoal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from backends import PG_URL, drop_schema, postgres_schema

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "django_project"
SCENARIO = Path(__file__).resolve().parent / "django_scenario.py"
# the processes run this tree's shoal (the one under test), not whichever is installed
SRC = Path(shoal.__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(180)


def base_env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SHOAL_", "SHOP_"))}
    base.update(DJANGO_SETTINGS_MODULE="shop.settings",
                PYTHONPATH=os.pathsep.join([str(PROJECT), str(SRC)]))
    return base


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    if request.param == "sqlite":
        yield {**base_env(), "SHOP_DATABASE": str(tmp_path / "shop.db"),
               "STORE": f"sqlite:///{tmp_path / 'shop.db'}"}
        return
    with postgres_env() as found:
        yield found


@contextmanager
def postgres_env() -> Iterator[dict[str, str]]:
    """The example project on PostgreSQL: Django's tables in a schema of their own
    (``SHOP_SCHEMA``), the store in another (``STORE``)."""
    import psycopg
    from psycopg import sql

    base = base_env()
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


def registered(store: str, worker: subprocess.Popen[str], workflow: str = "fulfil") -> None:
    """Wait until the worker has recorded its workflows in the store (it has started)."""

    async def wait() -> None:
        app = shoal.App("shop", store=store)
        async with app.open():
            for _ in range(600):
                if await app.store.get_workflow("shop", workflow) is not None:
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
    env.update(DJANGO_SETTINGS_MODULE="shop.settings",
               PYTHONPATH=os.pathsep.join([str(PROJECT), str(SRC)]),
               SHOP_DATABASE=str(tmp_path / "shop.db"))
    done = manage(env, "shoal_worker", "orders.nothing:app")
    assert done.returncode != 0
    assert "cannot import 'orders.nothing'" in done.stderr, done.stderr
    done = manage(env, "shoal_worker", "orders.models:Order")
    assert "not a shoal.App" in done.stderr, done.stderr


# The ORM in each kind of user code a worker runs: a sync step (which sends an outbox entry), a
# sync outbox handler, an async step through sync_to_async. The worker serves this module.
ORM_WORKFLOWS = '''
from asgiref.sync import sync_to_async

import shoal
from shoal.integrations.django import make_app

from orders.models import Order

app = make_app(max_concurrent_runs=1)


@app.workflow
async def ship(ctx: shoal.RunContext, order: int) -> int:
    def mark() -> int:
        ctx.outbox.send("noted", order)
        return Order.objects.filter(id=order).update(status="shipped")

    return await ctx.step("mark", mark)


@app.outbox_handler("noted")
def note(order: int, key: str) -> None:
    Order.objects.filter(id=order, status="shipped").update(status="noted")


@app.workflow
async def count(ctx: shoal.RunContext, order: int) -> int:
    async def read() -> int:
        return await sync_to_async(Order.objects.filter(id=order).count)()

    return await ctx.step("read", read)
'''


@pytest.mark.parametrize("conn_max_age", ["0", "600"])
def test_a_connection_the_server_dropped_poisons_no_later_run(tmp_path: Path,
                                                              conn_max_age: str) -> None:
    """The worker's ORM connections terminated by the server (pg_terminate_backend, as a
    database restart does) between runs: every later run succeeds at its first attempt, its
    steps and its outbox handler connecting afresh (CONN_MAX_AGE=0), or checking the kept
    connection first (CONN_MAX_AGE=600 with CONN_HEALTH_CHECKS)."""
    import psycopg
    from psycopg import sql

    (tmp_path / "orm_workflows.py").write_text(ORM_WORKFLOWS)
    with postgres_env() as env:
        app_name = f"shoal-test-orm-{secrets.token_hex(4)}"
        env.update(PYTHONPATH=os.pathsep.join([str(PROJECT), str(tmp_path), str(SRC)]),
                   SHOP_CONN_MAX_AGE=conn_max_age,
                   PGAPPNAME=app_name)   # libpq's: names the worker's ORM connections
        for command in (("migrate", "--noinput"), ("shoal_migrate",)):
            done = manage(env, *command)
            assert done.returncode == 0, done.stderr
        orders = sql.Identifier(env["SHOP_SCHEMA"], "orders_order")
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            ids = [conn.execute(sql.SQL("INSERT INTO {} (item, status) VALUES ('kettle', "
                                        "'placed') RETURNING id").format(orders)).fetchone()[0]
                   for _ in range(4)]
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "shoal_worker", "orm_workflows:app"], cwd=PROJECT,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            registered(env["STORE"], worker, "count")
            with shoal.Client(env["STORE"], namespace="shop") as client:

                def succeeds(workflow: str, order: int) -> None:
                    run = client.dispatch(workflow, order)
                    assert client.result(run.id, timeout=20) == 1
                    assert client.get_run(run.id).attempts == 1

                def noted(order: int) -> None:
                    with psycopg.connect(PG_URL, autocommit=True) as conn:
                        for _ in range(400):
                            if conn.execute(sql.SQL("SELECT status FROM {} WHERE id = %s")
                                            .format(orders), [order]).fetchone() == ("noted",):
                                return
                            time.sleep(0.05)
                    raise AssertionError(f"order {order}'s outbox entry was not handled")

                succeeds("ship", ids[0])
                noted(ids[0])
                succeeds("count", ids[0])
                with psycopg.connect(PG_URL, autocommit=True) as conn:
                    ended = conn.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                        "application_name = %s AND pid <> pg_backend_pid()",
                        [app_name]).fetchone()[0]
                if conn_max_age != "0":
                    assert ended >= 1, "no kept connection to drop: the test tests nothing"
                for order in ids[1:]:
                    succeeds("ship", order)
                    noted(order)
                    succeeds("count", order)
        finally:
            worker.send_signal(signal.SIGTERM)
            _, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        assert "OperationalError" not in err, err


UNREACHABLE = "postgresql://postgres@127.0.0.1:1/test?connect_timeout=5"


def elsewhere(tmp_path: Path, store: str) -> dict[str, str]:
    """The example project with settings.SHOAL['STORE'] = ``store``."""
    (tmp_path / "elsewhere.py").write_text(
        "from shop.settings import *  # noqa: F403\n"
        f"SHOAL = {{**SHOAL, 'STORE': {store!r}, 'JOIN_ATOMIC': False}}  # noqa: F405\n")
    env = base_env()
    env.update(DJANGO_SETTINGS_MODULE="elsewhere", SHOP_DATABASE=str(tmp_path / "shop.db"),
               PYTHONPATH=os.pathsep.join([str(PROJECT), str(tmp_path), str(SRC)]))
    return env


@pytest.mark.parametrize("command", ["shoal_worker", "shoal_migrate"])
def test_commands_say_in_one_line_that_the_store_is_unreachable(tmp_path: Path,
                                                                 command: str) -> None:
    done = manage(elsewhere(tmp_path, UNREACHABLE), command)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("CommandError: Cannot connect to the "
                                                   "PostgreSQL store"), done.stderr
    assert "serving" not in done.stderr   # it never served


@pytest.mark.parametrize("command", [("check",), ("shoal_worker",), ("shoal_migrate",)])
def test_a_store_url_shoal_has_no_store_for_is_refused_at_startup(tmp_path: Path,
                                                                  command: tuple[str]) -> None:
    done = manage(elsewhere(tmp_path, "mysql://x"), *command)
    assert done.returncode != 0
    assert "(shoal.E001) settings.SHOAL['STORE']: Unknown store URL 'mysql://x'" in done.stderr, \
        done.stderr
    assert "Traceback" not in done.stderr, done.stderr
