"""Every libpq URL form works as psycopg takes it; shoal takes out only its own options.

The server is ``test_postgres.py``'s (``SHOAL_TEST_POSTGRES``); the Unix-socket forms use its
default socket directory, ``/var/run/postgresql`` (skipped with a message without that socket,
except under ``CI``, where they fail). Each test uses a schema of its own, dropped afterwards.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from test_postgres import URL, _require_postgres

from shoal.backends.postgres import PostgresStore
from shoal.errors import ConfigurationError, StoreUnavailableError
from shoal.stores import mask_url, open_store
from shoal.testing.contract import add

SOCKET_DIR = "/var/run/postgresql"
_SERVER = conninfo_to_dict(URL)
USER, DB = _SERVER.get("user", "postgres"), _SERVER.get("dbname", "test")
HOST, PORT = _SERVER.get("host", "127.0.0.1"), _SERVER.get("port", "5432")


def _require_socket() -> None:
    path = Path(SOCKET_DIR) / f".s.PGSQL.{PORT}"
    if path.exists():
        return
    message = f"no PostgreSQL Unix socket at {path}: the server listens on TCP only"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
async def opened() -> AsyncIterator[list[PostgresStore]]:
    """Stores a test opened, closed afterwards."""
    stores: list[PostgresStore] = []
    yield stores
    for s in stores:
        await s.close()


async def _open(url: str, stores: list[PostgresStore]) -> PostgresStore:
    s = open_store(url)
    assert isinstance(s, PostgresStore)
    stores.append(s)
    await s.open()
    return s


@pytest.mark.parametrize("form", [
    f"postgresql:///{DB}?user={USER}&schema={{schema}}",
    f"postgres:///{DB}?host={SOCKET_DIR}&user={USER}&schema={{schema}}",
    f"postgresql:///{DB}?host=%2Fvar%2Frun%2Fpostgresql&schema={{schema}}&user={USER}",
])
async def test_a_unix_socket_url_connects_through_the_socket(
    form: str, schema: str, opened: list[PostgresStore]
) -> None:
    _require_socket()
    s = await _open(form.format(schema=schema), opened)
    assert "schema" not in s.conninfo and s.schema == schema
    run = await add(s)
    assert (await s.get_run(run.id)) == run
    [row] = await s.db.all("SELECT inet_server_addr() AS addr", {})
    assert row["addr"] is None                      # a Unix socket has no address


async def test_a_host_list_tries_each_host_in_turn(
    schema: str, opened: list[PostgresStore]
) -> None:
    """The first host refuses connections; libpq goes on to the second."""
    s = await _open(f"postgresql://{USER}@127.0.0.1:1,{HOST}:{PORT}/{DB}?schema={schema}"
                    f"&pool_max_size=2", opened)
    assert s.pool_max_size == 2
    run = await add(s)
    assert (await s.get_run(run.id)) == run


async def test_libpq_parameters_reach_the_server_as_written(
    schema: str, opened: list[PostgresStore]
) -> None:
    s = await _open(f"postgres://{USER}@{HOST}:{PORT}/{DB}?sslmode=disable&schema={schema}"
                    f"&application_name=urls%20test&options=-c%20statement_timeout%3D4321"
                    f"&connect_timeout=5", opened)
    [row] = await s.db.all("SELECT current_setting('application_name') AS name, "
                         "current_setting('statement_timeout') AS timeout", {})
    assert row == {"name": "urls test", "timeout": "4321ms"}


async def test_an_sslmode_the_server_cannot_meet_fails_with_libpq_s_reason() -> None:
    _require_postgres()
    s = PostgresStore.from_url(f"postgresql://{USER}@{HOST}:{PORT}/{DB}?sslmode=verify-full"
                               f"&sslrootcert=/nonexistent/root.crt&open_timeout=5")
    with pytest.raises(StoreUnavailableError) as e:
        await s.open()
    assert "ssl" in str(e.value).lower() and "within" not in str(e.value)
    await s.close()


@pytest.mark.parametrize(("query", "named"), [
    ("shema=shoal", "'shema'"),
    ("pool_size=4", "'pool_size'"),
    ("sslmode=require&foo=1", "'foo'"),
    ("pool_max_size=abc", "pool_max_size='abc'"),
    ("pool_min_size=1.5", "pool_min_size='1.5'"),
    ("pool_min_size=0", "pool_min_size=0"),
    ("pool_min_size=3&pool_max_size=2", "pool_max_size=2"),
    ("open_timeout=soon", "open_timeout='soon'"),
    ("pool_timeout=0", "pool_timeout=0"),
    ("reconnect_timeout=-1", "reconnect_timeout=-1"),
    ("command_timeout=0", "command_timeout=0"),
    ("open_timeout=nan", "open_timeout=nan"),
    ("schema=a;drop", "'a;drop'"),
])
async def test_a_bad_option_is_a_configuration_error_naming_it(query: str, named: str) -> None:
    """Said by from_url, before any connection (the host does not exist)."""
    with pytest.raises(ConfigurationError) as e:
        PostgresStore.from_url(f"postgresql://u:hunter2@nowhere.invalid/db?{query}")
    assert named in str(e.value)
    assert "hunter2" not in str(e.value)


def test_shoal_options_are_taken_out_and_the_rest_kept_as_written() -> None:
    s = PostgresStore.from_url("postgresql:///db?host=%2Ftmp&schema=s1&sslmode=prefer"
                               "&pool_timeout=0.5&password=hunter2")
    assert s.conninfo == "postgresql:///db?host=%2Ftmp&sslmode=prefer&password=hunter2"
    assert s.schema == "s1" and s.pool_timeout == 0.5
    assert mask_url(s.url) == "postgresql:///db?host=%2Ftmp&sslmode=prefer&password=***&schema=s1"
    assert PostgresStore.from_url("postgresql://h1:5433,h2/db").conninfo == \
        "postgresql://h1:5433,h2/db"


async def test_a_quick_failure_is_not_called_a_timeout() -> None:
    started = time.monotonic()
    s = PostgresStore.from_url("postgresql://u@127.0.0.1:1/db?open_timeout=30")
    with pytest.raises(StoreUnavailableError) as e:
        await s.open()
    assert time.monotonic() - started < 10
    assert "within" not in str(e.value) and "refused" in str(e.value)


async def test_a_server_that_never_answers_is_a_timeout_after_open_timeout() -> None:
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    try:
        s = PostgresStore.from_url(f"postgresql://u@127.0.0.1:{port}/db?open_timeout=0.5")
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as e:
            await s.open()
        assert time.monotonic() - started >= 0.5
        assert "no answer within open_timeout=0.5 s" in str(e.value)
    finally:
        silent.close()


async def test_a_statement_left_unanswered_fails_after_command_timeout(
    schema: str, opened: list[PostgresStore]
) -> None:
    """A statement that gets no answer (here the server holds it behind another session's
    lock; across a network, a partition that holds the bytes would) fails after
    command_timeout with StoreUnavailableError, and its connection is not used again: the
    store goes on with another."""
    s = await _open(f"postgresql://{USER}@{HOST}:{PORT}/{DB}?schema={schema}"
                    f"&command_timeout=0.5&pool_max_size=1", opened)
    run = await add(s)
    [before] = await s.db.all("SELECT pg_backend_pid() AS pid", {})
    async with await psycopg.AsyncConnection.connect(URL) as other:
        await other.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
            sql.Identifier(schema, "runs")))
        with pytest.raises(StoreUnavailableError) as e:
            await s.get_run(run.id)
        assert "did not answer within command_timeout=0.5 s" in str(e.value)
        await other.rollback()
    assert await s.get_run(run.id) == run
    [after] = await s.db.all("SELECT pg_backend_pid() AS pid", {})
    assert after["pid"] != before["pid"]
