"""The backends the multi-process tests run over, one per test: a SQLite file, a PostgreSQL schema
of the test's own, a Redis prefix of the test's own (shared by ``test_coord_processes.py`` and
``test_provider_processes.py``; pytest puts this directory on sys.path, as for ``harness``).

Servers: PostgreSQL ``SHOAL_TEST_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/test``),
a schema per test, dropped afterwards (a guard process drops it should the test process die);
Redis ``SHOAL_TEST_REDIS`` (default ``redis://127.0.0.1:6379``), a key prefix per test, deleted
afterwards. Without a server those tests skip with a message, except under ``CI``, where they
fail.

PgBouncer (``PgBouncer``, for ``test_pgbouncer.py``): a ``pgbouncer`` process of the test's own
(Debian's package; ``.ci/run`` installs it) on a free port in front of that server, with a
temporary configuration (``auth_type = trust``, the server's user in its ``auth_file``), killed
afterwards. Without the binary those tests skip with a message, except under ``CI``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

PG_URL = os.environ.get("SHOAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("SHOAL_TEST_REDIS", "redis://127.0.0.1:6379")
KINDS = ["sqlite", "postgres", "redis"]


def skip_or_fail(message: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class Backend:
    name: str
    env: dict[str, str]   # <APP>_STORE, and <APP>_REDIS/<APP>_REDIS_PREFIX for Redis


@functools.cache
def postgres_unreachable() -> str | None:
    try:
        import psycopg
    except ImportError as e:
        return f"psycopg is not installed: {e}"
    try:
        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as e:
        return " ".join(str(e).split()) or type(e).__name__
    return None


@functools.cache
def redis_unreachable() -> str | None:
    try:
        import redis
    except ImportError as e:
        return f"the redis client is not installed: {e}"
    try:
        with redis.Redis.from_url(REDIS_URL, socket_timeout=3, socket_connect_timeout=3) as r:
            r.ping()
    except redis.RedisError as e:
        return str(e).strip() or type(e).__name__
    return None


_SCHEMA_GUARD = """
import os, sys, time
import psycopg
from psycopg import sql
parent, url, name = int(sys.argv[1]), sys.argv[2], sys.argv[3]
while os.getppid() == parent:
    time.sleep(0.5)
with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
"""


def drop_schema(name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def drop_prefix(prefix: str) -> None:
    import redis

    with redis.Redis.from_url(REDIS_URL, socket_timeout=5, socket_connect_timeout=5) as r:
        names = list(r.scan_iter(match=f"{prefix}:*", count=500))
        if names:
            r.delete(*names)


@contextlib.contextmanager
def postgres_schema(tag: str) -> Iterator[str]:
    """A store URL on the shared server with a schema of its own (``<tag><random>``), dropped
    after the ``with`` block, or by a guard process should the test process be killed."""
    from shoal.stores import mask_url

    reason = postgres_unreachable()
    if reason is not None:
        skip_or_fail(f"PostgreSQL at {mask_url(PG_URL)} is not reachable ({reason}); set "
                     f"SHOAL_TEST_POSTGRES to a server where the tests may create schemas")
    name = f"{tag}{secrets.token_hex(6)}"
    guard = subprocess.Popen([sys.executable, "-c", _SCHEMA_GUARD, str(os.getpid()), PG_URL,
                              name], start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = urlsplit(PG_URL)
    url = urlunsplit(parts._replace(
        query=urlencode([*parse_qsl(parts.query), ("schema", name)])))
    try:
        yield url
    finally:
        try:
            drop_schema(name)
        finally:
            guard.kill()
            guard.wait(timeout=10)


@contextlib.contextmanager
def backend(kind: str, db: Path, app: str, tag: str) -> Iterator[Backend]:
    """The backend ``kind`` (one of ``KINDS``) for the worker apps, as environment variables
    named ``<app>_…``: the SQLite file ``db``, or a schema / key prefix named ``<tag><random>``
    that lives as long as the ``with`` block."""
    from shoal.stores import mask_url

    if kind == "sqlite":
        # four processes writing as fast as they can on a loaded machine: SQLite's write lock is
        # not fair, and one of them may wait its turn for more than the default 5 s
        yield Backend("sqlite", {f"{app}_STORE": f"sqlite:///{db}?busy_timeout=30"})
    elif kind == "postgres":
        with postgres_schema(tag) as url:
            yield Backend("postgres", {f"{app}_STORE": url})
    else:
        reason = redis_unreachable()
        if reason is not None:
            skip_or_fail(f"Redis at {mask_url(REDIS_URL)} is not reachable ({reason}); set "
                         f"SHOAL_TEST_REDIS to a server where the tests may write keys")
        prefix = f"{tag}{secrets.token_hex(6)}"
        try:
            yield Backend("redis", {f"{app}_STORE": "memory://", f"{app}_REDIS": REDIS_URL,
                                    f"{app}_REDIS_PREFIX": prefix})
        finally:
            drop_prefix(prefix)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """A ``pgbouncer`` of the test's own in front of the shared server (``PG_URL``), in
    ``pool_mode`` (``transaction`` or ``session``), on a free port; ``url(schema, **options)``
    is a store URL through it. Started by :meth:`start` (skipped without the binary, failed under
    ``CI``), killed by :meth:`stop`. As root it runs as the ``postgres`` user (PgBouncer refuses
    to run as root)."""

    def __init__(self, pool_mode: str = "transaction", pool_size: int = 20) -> None:
        from psycopg.conninfo import conninfo_to_dict

        self.pool_mode = pool_mode
        self.port = free_port()
        server = conninfo_to_dict(PG_URL)
        self.user = str(server.get("user") or "postgres")
        self.dbname = str(server.get("dbname") or self.user)
        self.dir = tempfile.mkdtemp(prefix="shoal-pgbouncer-")
        os.chmod(self.dir, 0o755)   # readable by the user it runs as
        with open(os.path.join(self.dir, "users.txt"), "w") as f:
            password = str(server.get("password") or "").replace('"', '""')
            f.write(f'"{self.user}" "{password}"\n')
        self.ini = os.path.join(self.dir, "pgbouncer.ini")
        with open(self.ini, "w") as f:
            f.write(
                "[databases]\n"
                f"* = host={server.get('host') or '127.0.0.1'} "
                f"port={server.get('port') or 5432}\n"
                "[pgbouncer]\n"
                f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
                f"auth_type = trust\nauth_file = {self.dir}/users.txt\n"
                f"pool_mode = {pool_mode}\ndefault_pool_size = {pool_size}\n"
                "max_client_conn = 500\n")
        self.log = os.path.join(self.dir, "pgbouncer.log")
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, schema: str, **options: str) -> str:
        query = urlencode([("schema", schema), *options.items()])
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.dbname}?{query}"

    def start(self) -> None:
        import psycopg

        binary = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
        if binary is None:
            skip_or_fail("pgbouncer is not installed (Debian: apt-get install pgbouncer; "
                         ".ci/run installs it)")
        reason = postgres_unreachable()
        if reason is not None:
            skip_or_fail(f"PostgreSQL is not reachable behind PgBouncer ({reason}); set "
                         f"SHOAL_TEST_POSTGRES to a server where the tests may create schemas")
        as_user = ["-u", "postgres"] if os.geteuid() == 0 else []
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([binary, *as_user, self.ini], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log)
        deadline = time.monotonic() + 15
        while True:
            try:
                with psycopg.connect(self.url("public").partition("?")[0], connect_timeout=2,
                                     prepare_threshold=None) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.Error:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    with open(self.log, errors="replace") as f:
                        raise RuntimeError(f"pgbouncer did not start: {f.read()[-2000:]}"
                                           ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running_pgbouncer(pool_mode: str = "transaction", pool_size: int = 20
                      ) -> Iterator[PgBouncer]:
    """A started :class:`PgBouncer`, killed and its directory removed afterwards."""
    bouncer = PgBouncer(pool_mode, pool_size)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.cleanup()
