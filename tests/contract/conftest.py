"""What the contract test files here share through pytest itself: ``schema``, a PostgreSQL schema
of the test's own (helpers in ``test_postgres.py``, imported lazily), the Redis fixtures of
``test_coord_redis.py`` and ``test_rate_redis.py`` (their helpers are ``redis_support.py``,
imported lazily so that no other test here needs the redis client), and assert rewriting for
``sql_support.py``, ``handoffs.py`` and the contract suites of ``shoal.testing.contract`` (their
failures show their values, as in a test file; pytest must be told before a module is
imported)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from redis_support import Server

pytest.register_assert_rewrite("sql_support", "handoffs", "shoal.testing.contract")


@pytest.fixture
def schema() -> Iterator[str]:
    """The name of a schema of the test's own on the test server (skipped without one, failed
    under ``CI``), dropped afterwards."""
    import secrets

    from test_postgres import _drop, _require_postgres

    _require_postgres()
    name = f"shoal_t_{secrets.token_hex(6)}"
    yield name
    _drop(name)


@pytest.fixture
def prefix() -> Iterator[str]:
    """A key prefix of the test's own on the test server (skipped without one, failed under
    ``CI``); every key under it deleted afterwards."""
    from redis_support import server_prefix

    with server_prefix() as name:
        yield name


@pytest.fixture(scope="module")
def trio() -> Iterator[list[Server]]:
    """Three ``redis-server`` processes for the test module, killed after its last test."""
    from redis_support import running_servers

    with running_servers(3) as servers:
        yield servers


@pytest.fixture
def rl_prefix(trio: list[Server]) -> Iterator[str]:
    """A key prefix of the test's own on ``trio``; every key under it deleted afterwards."""
    from redis_support import own_prefix

    with own_prefix([server.url for server in trio]) as name:
        yield name
