"""``shoal.Client`` and ``shoal.AsyncClient`` against a worker that runs in its own thread (its own
event loop, as another process's would be), on SQLite and PostgreSQL: every verb by workflow
name; many threads sharing one Client; the caller's own transaction (a ``sqlite3`` connection
made in the calling thread, a sync psycopg ``Connection``); ``allow_unregistered`` and a worker
that starts later; a forked child (gunicorn's ``--preload``) starting afresh; a process that
exits without ``close()`` printing no "Task was destroyed"; an AsyncClient refusing a second
event loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from backends import PG_URL, postgres_schema

import shoal

TIMEOUT = 20.0
pytestmark = pytest.mark.timeout(120)


def make_worker(url: str, *, name: str = "default") -> shoal.App:
    app = shoal.App(name, store=url, lease=5.0)

    @app.workflow
    async def double(ctx: shoal.RunContext, x: int) -> int:
        return x * 2

    @app.workflow(max_attempts=1)
    async def approve(ctx: shoal.RunContext, x: int) -> dict[str, object]:
        decision = await ctx.approval("ok")
        got = await ctx.wait_for("nudge")
        return {"approved": decision.approved, "nudge": got}

    @app.workflow(max_attempts=1)
    async def fails(ctx: shoal.RunContext, x: int) -> int:
        raise ValueError("no")

    return app


@contextmanager
def serving(app: shoal.App) -> Iterator[shoal.App]:
    """``app`` started in a thread of its own (its own event loop) for the ``with`` block."""
    started, stop = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def serve() -> None:
        async def main() -> None:
            async with app:
                started.set()
                await asyncio.to_thread(stop.wait)

        try:
            asyncio.run(main())
        except BaseException as e:
            failed.append(e)
            started.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(TIMEOUT)
    if failed:
        raise failed[0]
    try:
        yield app
    finally:
        stop.set()
        thread.join(TIMEOUT)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shoal.db'}"
    else:
        with postgres_schema("shoal_client_") as found:
            yield found


def test_every_verb_by_name(url: str) -> None:
    with serving(make_worker(url)), shoal.Client(url) as client:
        run = client.dispatch("double", 21, idempotency_key="k1")
        assert client.dispatch("double", 99, idempotency_key="k1").id == run.id
        assert client.result(run.id, timeout=TIMEOUT) == 42
        assert client.get_run(run.id).status == shoal.RunStatus.SUCCEEDED
        batch = client.dispatch_many("double", (i for i in range(3)))
        assert [client.result(r.id, timeout=TIMEOUT) for r in batch] == [0, 2, 4]
        assert {r.id for r in client.list_runs(workflow="double")} == {
            run.id, *(r.id for r in batch)}

        waiting = client.dispatch("approve", 1)
        pauses: list[shoal.Pause] = []
        for _ in range(2000):
            pauses = client.pending_pauses()
            if pauses:
                break
            time.sleep(0.01)
        client.resume(pauses[0].id, approved=True, by="ann")
        client.signal(waiting.id, "nudge", {"n": 1})
        assert client.result(waiting.id, timeout=TIMEOUT) == {"approved": True,
                                                               "nudge": {"n": 1}}

        failing = client.dispatch("fails", 0)
        with pytest.raises(shoal.RunFailedError):
            client.result(failing.id, timeout=TIMEOUT)
        assert client.retry(failing.id).status == shoal.RunStatus.QUEUED
        with pytest.raises(shoal.RunFailedError):
            client.result(failing.id, timeout=TIMEOUT)

        later = client.dispatch("double", 1, delay=3600)
        assert client.cancel(later.id).status == shoal.RunStatus.CANCELLED
        with pytest.raises(shoal.RunCancelledError):
            client.result(later.id, timeout=TIMEOUT)
        stats = client.stats()
        assert stats.by_workflow["double"]["succeeded"] == 4
        with pytest.raises(TimeoutError):
            client.result(client.dispatch("approve", 2).id, timeout=0.2)
        with pytest.raises(shoal.UnknownRunError):
            client.get_run("no-such-run")


def test_a_client_pauses_and_resumes_a_workflow(url: str) -> None:
    with serving(make_worker(url)), shoal.Client(url) as client:
        assert client.pause_workflow("double")
        assert [(p.workflow, p.tenant) for p in client.paused_workflows()] == [("double", None)]
        held = client.dispatch("double", 1)
        failing = client.dispatch("fails", 0)    # dispatched after it, and it runs
        with pytest.raises(shoal.RunFailedError):
            client.result(failing.id, timeout=TIMEOUT)
        assert client.get_run(held.id).status == shoal.RunStatus.QUEUED
        assert client.resume_workflow("double")
        assert client.result(held.id, timeout=TIMEOUT) == 2
        assert client.paused_workflows() == []
        with pytest.raises(shoal.UnknownWorkflowError):
            client.pause_workflow("no-such-workflow")


def test_a_client_sets_tenant_weights(url: str) -> None:
    with shoal.Client(url) as client:
        client.set_tenant_weight("acme", 2)
        assert client.tenant_weights() == {"acme": 2.0}
        with pytest.raises(ValueError, match="weight"):
            client.set_tenant_weight("acme", 0)


def test_threads_share_one_client(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shoal.db'}"
    client = shoal.Client(url)
    ids: list[str] = []
    errors: list[BaseException] = []

    def submit(n: int) -> None:
        try:
            for i in range(10):
                ids.append(client.dispatch("double", n * 100 + i).id)
        except BaseException as e:
            errors.append(e)

    with serving(make_worker(url)):
        threads = [threading.Thread(target=submit, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert not errors
        assert len(set(ids)) == 80
        assert sorted(client.result(i, timeout=TIMEOUT) for i in ids) == sorted(
            2 * (n * 100 + i) for n in range(8) for i in range(10))
    client.close()
    client.close()   # idempotent
    with pytest.raises(shoal.ShoalError, match="closed"):
        client.get_run(ids[0])


def test_unregistered_workflow_waits_for_a_worker_that_serves_it(url: str) -> None:
    with shoal.Client(url) as client:
        with pytest.raises(shoal.UnknownWorkflowError, match="allow_unregistered"):
            client.dispatch("double", 1)
        with pytest.raises(shoal.UnknownWorkflowError):
            client.dispatch_many("double", [1, 2])
        with pytest.raises(TypeError, match="allow_unregistered"):
            client.dispatch("double", 1, allow_unregistered="yes")  # type: ignore[arg-type]
        assert client.list_runs() == []
        run = client.dispatch("double", 4, allow_unregistered=True, priority=3)
        [first, second] = client.dispatch_many("double", [5, 6], allow_unregistered=True)
        assert (run.status, run.priority, run.max_attempts) == (shoal.RunStatus.QUEUED, 3, 3)
        with serving(make_worker(url)):
            assert client.result(run.id, timeout=TIMEOUT) == 8
            assert client.result(second.id, timeout=TIMEOUT) == 12
            assert client.result(first.id, timeout=TIMEOUT) == 10
        # registered now: no flag needed
        assert client.dispatch("double", 1).status == shoal.RunStatus.QUEUED


def test_a_client_dispatch_continues_the_callers_trace(tmp_path: Path) -> None:
    """The sync Client's call runs on its own loop, in a copy of the calling thread's context:
    the span current in the caller (a web request's) is the one the run continues."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    url = f"sqlite:///{tmp_path / 'shoal.db'}"
    request = SpanContext(trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
                          span_id=0x00F067AA0BA902B7, is_remote=True,
                          trace_flags=TraceFlags(TraceFlags.SAMPLED))
    with shoal.Client(url, tracing=True) as client, \
            shoal.Client(url) as untraced:
        with trace.use_span(NonRecordingSpan(request)):
            run = client.dispatch("double", 1, allow_unregistered=True)
            plain = untraced.dispatch("double", 2, allow_unregistered=True)
        outside = client.dispatch("double", 3, allow_unregistered=True)
        stored = client.get_run(run.id).trace_context or ""
        assert "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7" in stored
        assert client.get_run(plain.id).trace_context is None      # tracing not asked for
        assert client.get_run(outside.id).trace_context is None    # no span current


async def test_app_dispatch_allow_unregistered(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shoal.db'}"
    submitter = shoal.App("default", store=url)
    async with submitter.open():
        with pytest.raises(shoal.UnknownWorkflowError):
            await submitter.dispatch("double", 1)
        run = await submitter.dispatch("double", 7, allow_unregistered=True)
        worker = make_worker(url)
        async with worker:
            assert await worker.result(run.id, timeout=TIMEOUT) == 14


def test_sqlite_transaction_of_the_calling_thread(tmp_path: Path) -> None:
    path = tmp_path / "shoal.db"
    url = f"sqlite:///{path}"
    with serving(make_worker(url)), shoal.Client(url) as client:
        client.dispatch("double", 0)   # the file exists, migrated
        conn = sqlite3.connect(path)   # check_same_thread: this thread only
        conn.execute("CREATE TABLE orders (name TEXT)")
        conn.commit()
        conn.execute("INSERT INTO orders VALUES ('gone')")
        gone = client.dispatch("double", 1, connection=conn)
        conn.rollback()
        with pytest.raises(shoal.UnknownRunError):
            client.get_run(gone.id)
        conn.execute("INSERT INTO orders VALUES ('kept')")
        kept = client.dispatch("double", 2, connection=conn)
        batch = client.dispatch_many("double", [3, 4], connection=conn)
        conn.commit()
        assert client.result(kept.id, timeout=TIMEOUT) == 4
        assert [client.result(r.id, timeout=TIMEOUT) for r in batch] == [6, 8]
        assert conn.execute("SELECT name FROM orders").fetchall() == [("kept",)]
        with pytest.raises(shoal.ConfigurationError, match="autocommit"):
            client.dispatch("double", 5, connection=sqlite3.connect(path, isolation_level=None))
        conn.close()


def test_postgres_transaction_of_a_sync_connection() -> None:
    with postgres_schema("shoal_client_") as url, serving(make_worker(url)), \
            shoal.Client(url) as client:
        client.dispatch("double", 0)
        with psycopg.connect(PG_URL) as conn:
            gone = client.dispatch("double", 1, connection=conn)
            conn.rollback()
            kept = client.dispatch("double", 2, connection=conn)
            conn.commit()
        with pytest.raises(shoal.UnknownRunError):
            client.get_run(gone.id)
        assert client.result(kept.id, timeout=TIMEOUT) == 4


def test_forked_child_starts_afresh(tmp_path: Path) -> None:
    # No worker thread in this process while it forks: a thread inside SQLite at the fork would
    # leave its mutex locked in the child (the hazard of any fork with busy threads; a gunicorn
    # master whose client is idle has none). The worker starts after the child has exited.
    url = f"sqlite:///{tmp_path / 'shoal.db'}"
    with shoal.Client(url) as client:
        before = client.dispatch("double", 1, allow_unregistered=True)   # connected here
        pid = os.fork()
        if pid == 0:   # the child: exits with 0 only if the client works here
            code = 1
            try:
                signal.alarm(30)   # never outlive the test
                run = client.dispatch("double", 2, allow_unregistered=True)
                code = 0 if client.get_run(run.id).status == shoal.RunStatus.QUEUED else 3
                print(run.id, file=(tmp_path / "child").open("w"))
                client.close()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        child = (tmp_path / "child").read_text().strip()
        with serving(make_worker(url)):
            # the parent's client is untouched by the child's
            assert client.result(before.id, timeout=TIMEOUT) == 2
            assert client.result(child, timeout=TIMEOUT) == 4
            assert client.result(client.dispatch("double", 3).id, timeout=TIMEOUT) == 6


PRELOADED = """
import os, sys, warnings
import shoal
warnings.simplefilter("error")
client = shoal.Client(sys.argv[1])            # made at import, as a preloaded Django/Flask app
client.dispatch("double", 0, allow_unregistered=True)      # used in the master
children = []
for n in range(2):                            # the workers
    pid = os.fork()
    if pid == 0:
        try:
            run = client.dispatch("double", n + 1, allow_unregistered=True)
            os.write(1, f"{run.id}\\n".encode())   # one write: the children share the pipe
        finally:
            os._exit(0)
    children.append(pid)
for pid in children:
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
print(client.dispatch("double", 9, allow_unregistered=True).id, flush=True)
# no close(): the interpreter's exit closes it
"""


def _script(tmp_path: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code), encoding="utf-8")
    return subprocess.run([sys.executable, "-X", "dev", str(script), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def test_preforked_workers_and_exit_without_close(url: str, tmp_path: Path) -> None:
    proc = _script(tmp_path, PRELOADED, url)
    assert proc.returncode == 0, proc.stderr
    # -X dev shows ResourceWarnings and asyncio's debug complaints; none may be there
    for complaint in ("Task was destroyed", "Event loop is closed", "Warning", "Traceback",
                      "never awaited"):
        assert complaint not in proc.stderr, proc.stderr
    ids = proc.stdout.split()
    assert len(set(ids)) == 3

    async def count() -> int:
        client = shoal.AsyncClient(url)
        async with client:
            return len(await client.list_runs())

    assert asyncio.run(count()) == 4


def test_async_client_follows_the_event_loop(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shoal.db'}"
    client = shoal.AsyncClient(url)

    async def first() -> str:
        return (await client.dispatch("double", 1, allow_unregistered=True)).id

    run_id = asyncio.run(first())
    assert _connections(url) == 0, "closed as its loop ended"

    async def second() -> None:   # another loop: connects there
        assert (await client.get_run(run_id)).workflow == "double"

    asyncio.run(second())

    async def closed_then_reopened() -> None:
        other = shoal.AsyncClient(url)
        async with other:
            assert (await other.get_run(run_id)).workflow == "double"
        # closed: the next call opens it again, in this loop
        assert (await other.get_run(run_id)).id == run_id
        await other.close()

    asyncio.run(closed_then_reopened())


def test_an_async_client_on_a_store_object_refuses_a_second_live_loop() -> None:
    worker = make_worker("memory://")
    client = shoal.AsyncClient(worker.store)
    entered, leave = threading.Event(), threading.Event()

    async def hold() -> None:
        async with worker, client:
            await client.stats()
            entered.set()
            await asyncio.to_thread(leave.wait)

    thread = threading.Thread(target=lambda: asyncio.run(hold()))
    thread.start()
    try:
        assert entered.wait(TIMEOUT)

        async def elsewhere() -> None:
            await client.stats()

        with pytest.raises(RuntimeError, match="Store object"):
            asyncio.run(elsewhere())
    finally:
        leave.set()
        thread.join(TIMEOUT)


async def test_async_client_shares_a_store_object_with_a_worker() -> None:
    worker = make_worker("memory://")
    client = shoal.AsyncClient(worker.store)
    async with worker, client:
        run = await client.dispatch("double", 5)
        assert await client.result(run.id, timeout=TIMEOUT) == 10
    assert "memory" in repr(client)


def test_bad_options_are_refused_at_once() -> None:
    with pytest.raises(TypeError, match="store URL"):
        shoal.Client(object())  # type: ignore[arg-type]
    with pytest.raises(shoal.ConfigurationError):
        shoal.Client("nosuch://x")
    with pytest.raises(shoal.ConfigurationError, match="max_payload_bytes"):
        shoal.AsyncClient("memory://", max_payload_bytes=-1)
    client = shoal.Client("memory://")
    with pytest.raises(TypeError, match="name"):
        client.dispatch(len)  # type: ignore[arg-type]
    client.close()


def test_a_client_called_from_its_own_loop_refuses(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shoal.db'}"
    with shoal.Client(url) as client:
        run = client.dispatch("double", 1, allow_unregistered=True)
        seen: list[BaseException] = []

        async def inside(c: shoal.AsyncClient) -> None:
            try:
                client.get_run(run.id)
            except RuntimeError as e:
                seen.append(e)

        call: Callable[[shoal.AsyncClient], object] = inside
        client._call(call)   # type: ignore[arg-type]
        assert seen and "its own event loop" in str(seen[0])


# -- a store not migrated yet (issue 30, point 8) ----------------------------------------------


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_a_first_dispatch_in_the_callers_sqlite_transaction_names_the_missing_migration(
    tmp_path: Path, journal: str
) -> None:
    """The Flask and Django examples started before 'migrate': the view's transaction holds the
    write lock, so the client cannot create the store; it says so at once (it waited
    busy_timeout for its own transaction, then blamed 'another writer')."""
    path = tmp_path / "shop.db"
    url = f"sqlite:///{path}"
    db = sqlite3.connect(path, isolation_level="IMMEDIATE")   # Django's transaction_mode
    db.execute(f"PRAGMA journal_mode = {journal}")
    db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
    with shoal.Client(url, namespace="shop") as client:
        started = time.monotonic()
        with pytest.raises(shoal.SchemaVersionError) as e, db:
            db.execute("INSERT INTO orders (item) VALUES ('kettle')")
            client.dispatch("fulfil", {}, connection=db, allow_unregistered=True)
        assert time.monotonic() - started < 2.0, "at once, not after busy_timeout"
        assert e.value.found == 0
        text = str(e.value)
        for command in ("shoal migrate", "manage.py shoal_migrate", "flask shoal migrate"):
            assert command in text, text
        assert "transaction" in text and "locked by another writer" not in text
        assert db.execute("SELECT count(*) FROM orders").fetchone() == (0,)

        async def migrate() -> None:   # what 'shoal migrate' does
            async with shoal.App("shop", store=url).open():
                pass

        asyncio.run(migrate())
        with db:   # the same client, the same kind of transaction: served now
            db.execute("INSERT INTO orders (item) VALUES ('kettle')")
            run = client.dispatch("fulfil", {}, connection=db, allow_unregistered=True)
        assert client.get_run(run.id).status == shoal.RunStatus.QUEUED
    db.close()


def test_a_client_outside_a_transaction_still_migrates(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    with shoal.Client(url) as client:
        assert client.dispatch("x", allow_unregistered=True).status == shoal.RunStatus.QUEUED


def test_postgres_names_an_unmigrated_schema_at_once() -> None:
    with postgres_schema("shoal_client_") as url:
        with shoal.Client(url, migrate=False) as client, psycopg.connect(PG_URL) as conn:
            started = time.monotonic()
            with pytest.raises(shoal.SchemaVersionError) as e:
                client.dispatch("fulfil", {}, connection=conn, allow_unregistered=True)
            assert time.monotonic() - started < 2.0
            assert e.value.found == 0
            for command in ("shoal migrate", "manage.py shoal_migrate", "flask shoal migrate"):
                assert command in str(e.value), str(e.value)
        # migrating on: PostgreSQL creates the schema on a connection of the client's own,
        # which the caller's open transaction does not block
        with shoal.Client(url) as client, psycopg.connect(PG_URL) as conn:
            run = client.dispatch("fulfil", {}, connection=conn, allow_unregistered=True)
            conn.commit()
            assert client.get_run(run.id).status == shoal.RunStatus.QUEUED


# -- closing, and event loops (issue 30, point 9) -------------------------------------------------


def _connections(url: str) -> int:
    """How many connections to the store this process (SQLite: open files) or anyone (the
    PostgreSQL schema's shoal connections) holds."""
    if url.startswith("sqlite"):
        path = os.path.realpath(url.removeprefix("sqlite:///"))
        fds = Path("/proc/self/fd")
        found = 0
        for fd in fds.iterdir():
            with contextlib.suppress(OSError):
                found += os.readlink(fd) == path
        return found
    schema = url.rsplit("schema=", 1)[1]
    with psycopg.connect(PG_URL) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                           "%s", (f"shoal {schema}",)).fetchone()
    assert row is not None
    return int(row[0])


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


def _blocked(thread: threading.Thread) -> bool:
    """Whether ``thread`` waits for a future's result (a Client call in flight)."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == "result" and "concurrent" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


async def _started(task: asyncio.Task[object]) -> None:
    """Let ``task`` run to where it waits (it polls the store every 50 ms meanwhile)."""
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done()


def test_close_ends_a_thread_waiting_in_result_with_client_closed(url: str) -> None:
    client = shoal.Client(url)
    run = client.dispatch("double", 1, allow_unregistered=True)   # no worker: it stays queued
    seen: list[BaseException] = []

    def wait() -> None:
        try:
            client.result(run.id)
        except BaseException as e:
            seen.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    _until(lambda: _blocked(waiter))
    client.close()
    waiter.join(TIMEOUT)
    assert not waiter.is_alive()
    assert len(seen) == 1 and isinstance(seen[0], shoal.ClientClosedError), seen
    assert seen[0].in_flight and "was closed while this call was in flight" in str(seen[0])
    with pytest.raises(shoal.ClientClosedError, match="is closed"):
        client.get_run(run.id)
    assert _connections(url) == 0


def test_async_close_ends_a_waiting_task_and_opens_nothing_again(url: str) -> None:
    async def main() -> None:
        client = shoal.AsyncClient(url)
        run = await client.dispatch("double", 1, allow_unregistered=True)
        waiting = asyncio.create_task(client.result(run.id))
        await _started(waiting)
        await client.close()
        with pytest.raises(shoal.ClientClosedError) as e:
            await asyncio.wait_for(waiting, TIMEOUT)
        assert e.value.in_flight
        assert _connections(url) == 0, "the waiting call opened the store again"
        assert (await client.get_run(run.id)).id == run.id   # a closed client opens again
        await client.close()

    asyncio.run(main())


def test_an_async_client_serves_a_new_event_loop_per_request_without_leaking(url: str) -> None:
    """Django's async views under WSGI: every request runs in an event loop of its own
    (asgiref's async_to_sync), several at once in a threaded server; one module-level
    AsyncClient serves them all and keeps no connection of an ended loop."""
    from asgiref.sync import async_to_sync

    client = shoal.AsyncClient(url)

    async def view(n: int) -> str:
        run = await client.dispatch("double", n, allow_unregistered=True)
        assert (await client.get_run(run.id)).input == n
        return run.id

    ids = [asyncio.run(view(0)), async_to_sync(view)(1)]
    assert _connections(url) == 0
    done: list[str] = []
    threads = [threading.Thread(target=lambda n=n: done.append(async_to_sync(view)(n)))
               for n in range(2, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert len(done) == 4 and _connections(url) == 0

    async def listed() -> set[str]:
        async with client:
            return {r.id for r in await client.list_runs()}

    assert asyncio.run(listed()) == {*ids, *done}
    assert _connections(url) == 0


def test_an_async_client_is_closed_from_another_loop(url: str) -> None:
    """close() from a loop other than the one a call is waiting in: the waiting call ends
    with ClientClosedError there, and the connections of that loop are closed."""
    client = shoal.AsyncClient(url)
    seen: list[BaseException] = []
    waiting = threading.Event()

    async def serve() -> None:
        run = await client.dispatch("double", 1, allow_unregistered=True)
        task = asyncio.create_task(client.result(run.id))
        await _started(task)
        waiting.set()
        try:
            await asyncio.wait_for(task, TIMEOUT)
        except BaseException as e:
            seen.append(e)

    thread = threading.Thread(target=lambda: asyncio.run(serve()))
    thread.start()
    assert waiting.wait(TIMEOUT)
    assert _connections(url) >= 1
    asyncio.run(client.close())
    thread.join(TIMEOUT)
    assert len(seen) == 1 and isinstance(seen[0], shoal.ClientClosedError), seen
    assert _connections(url) == 0
