"""The ``shoal`` command line over a real SQLite file: reads, cancel, signal, migrate, the bad-input
cases (one line on stderr, exit code 1, no traceback), a real ``shoal worker`` process, and the
guided tour end to end as a subprocess."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import backends
import pytest
from click.testing import CliRunner, Result

import shoal
from shoal.cli import cli

CLI = [sys.executable, "-m", "shoal.cli"]


@dataclass(frozen=True)
class Seeded:
    url: str
    waiting: str      # a run of namespace "shop" parked in ctx.wait_for("go"), one step done
    queued: str       # a run of namespace "shop" due in an hour
    other: str        # a queued run of namespace "other"


def shop_app(url: str) -> shoal.App:
    app = shoal.App("shop", store=url, instance_id="seeder", lease=3.0)

    @app.workflow(name="pack")
    async def pack(ctx: shoal.RunContext, input: dict[str, Any]) -> dict[str, Any]:
        box = await ctx.step("pick", lambda: {"items": input["items"]})
        got = await ctx.wait_for("go")
        return {"box": box, "go": got}

    return app


async def _seed(url: str) -> Seeded:
    app = shop_app(url)
    async with app:
        waiting = await app.dispatch("pack", {"items": 2})
        queued = await app.dispatch("pack", {"items": 5}, delay=3600)
        for _ in range(200):
            if (await app.get_run(waiting.id)).status == shoal.RunStatus.WAITING:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the seeded run never reached ctx.wait_for")
    other = shoal.App("other", store=url)

    @other.workflow(name="audit")
    async def audit(ctx: shoal.RunContext, input: Any) -> None:
        return None

    async with other.open():
        queued_other = await other.dispatch(audit, {"n": 1})
    return Seeded(url, waiting.id, queued.id, queued_other.id)


@pytest.fixture
def seeded(tmp_path: Path) -> Seeded:
    return asyncio.run(_seed(f"sqlite:///{tmp_path / 'cli.db'}"))


def shoal_cli(*args: str, store: str | None = None, env: dict[str, str] | None = None) -> Result:
    """Run the CLI in-process with a clean SHOAL_* environment."""
    environment: dict[str, str | None] = {"SHOAL_STORE": None, "SHOAL_NAMESPACE": None,
                                          "SHOAL_MAX_CONCURRENT_RUNS": None,
                                          "SHOAL_WORKER_GC": None}
    environment.update(env or {})
    argv = (["--store", store] if store else []) + list(args)
    return CliRunner().invoke(cli, argv, env=environment, prog_name="shoal")


def assert_fails(result: Result, *fragments: str) -> None:
    """Exit code 1 and one line on stderr naming what went wrong; no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# -- reads --------------------------------------------------------------------------------------


def test_runs_lists_every_namespace_unless_one_is_given(seeded: Seeded) -> None:
    result = shoal_cli("runs", store=seeded.url)
    assert result.exit_code == 0, result.output
    for run_id in (seeded.waiting, seeded.queued, seeded.other):
        assert run_id in result.stdout
    assert "namespace" in result.stdout and "waiting" in result.stdout

    only_shop = shoal_cli("-n", "shop", "runs", store=seeded.url)
    assert only_shop.exit_code == 0
    assert seeded.waiting in only_shop.stdout and seeded.other not in only_shop.stdout

    # SHOAL_STORE and SHOAL_NAMESPACE are read from the environment; options after the command
    # work too.
    waiting = shoal_cli("runs", "--status", "waiting", "--json",
                        env={"SHOAL_STORE": seeded.url, "SHOAL_NAMESPACE": "shop"})
    rows = [json.loads(line) for line in waiting.stdout.splitlines()]
    assert [(r["id"], r["status"], r["workflow"]) for r in rows] == [
        (seeded.waiting, "waiting", "pack")]

    page = shoal_cli("runs", "--limit", "1", "--store", seeded.url)
    assert page.exit_code == 0
    assert f"--after {seeded.waiting}" in page.stdout


def test_run_show_prints_the_fields_and_the_steps(seeded: Seeded) -> None:
    result = shoal_cli("run", "show", seeded.waiting, store=seeded.url)
    assert result.exit_code == 0, result.output
    for text in (seeded.waiting, "namespace", "shop", "waiting", "wait_for", '"items": 2',
                 "steps", "pick", "shoal.wait_for:go"):
        assert text in result.stdout, text

    as_json = json.loads(shoal_cli("run", "show", seeded.waiting, "--json",
                                   store=seeded.url).stdout)
    assert as_json["status"] == "waiting"
    assert [(s["seq"], s["name"], s["finished"]) for s in as_json["steps"]] == [
        (1, "pick", True), (2, "shoal.wait_for:go", False)]
    assert as_json["steps"][0]["output"] == {"items": 2}


def test_run_show_prints_the_traceback_of_a_failed_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    app = shoal.App("shop", store=url, instance_id="seeder", lease=3.0)

    def check_cart(cart: dict[str, Any]) -> None:
        if not cart["items"]:
            raise ValueError("the cart is empty")

    @app.workflow(name="checkout", max_attempts=1)
    async def checkout(ctx: shoal.RunContext, cart: dict[str, Any]) -> None:
        check_cart(cart)

    async def fail() -> str:
        async with app:
            run = await app.dispatch(checkout, {"items": []})
            with pytest.raises(shoal.RunFailedError):
                await app.result(run.id, timeout=10)
            return run.id

    run_id = asyncio.run(fail())
    result = shoal_cli("run", "show", run_id, store=url)
    assert result.exit_code == 0, result.output
    shown = result.stdout[result.stdout.index("traceback of the last failed attempt"):]
    assert "Traceback (most recent call last):" in shown
    assert re.search(r'File ".*test_cli.py", line \d+, in check_cart', shown), shown
    assert shown.rstrip().endswith("ValueError: the cart is empty")

    as_json = json.loads(shoal_cli("run", "show", run_id, "--json", store=url).stdout)
    assert as_json["error"] == "ValueError: the cart is empty"
    assert as_json["traceback"].startswith("Traceback (most recent call last):")
    assert as_json["traceback"].endswith("ValueError: the cart is empty\n")


def test_cancel_a_queued_run(seeded: Seeded) -> None:
    result = shoal_cli("run", "cancel", seeded.queued, store=seeded.url)
    assert result.exit_code == 0, result.output
    assert "Cancelled run" in result.stdout and "queued" in result.stdout
    shown = json.loads(shoal_cli("run", "show", seeded.queued, "--json",
                                 store=seeded.url).stdout)
    assert shown["status"] == "cancelled"

    again = shoal_cli("run", "cancel", seeded.queued, store=seeded.url)
    assert again.exit_code == 0
    assert "already ended (cancelled)" in again.stdout


def test_signal_reaches_the_waiting_run(seeded: Seeded) -> None:
    result = shoal_cli("signal", seeded.waiting, "go", '{"approved": true}', store=seeded.url)
    assert result.exit_code == 0, result.output
    assert "Sent signal 'go'" in result.stdout

    async def finish() -> Any:
        async with shop_app(seeded.url) as app:
            return await app.result(seeded.waiting, timeout=10)

    assert asyncio.run(finish()) == {"box": {"items": 2}, "go": {"approved": True}}


def test_migrate_creates_a_store_and_prints_its_version(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    result = shoal_cli("migrate", store=f"sqlite:///{db}")
    assert result.exit_code == 0, result.output
    assert re.search(r"is at schema version [1-9]\d*\.", result.stdout)
    assert db.exists()
    assert shoal_cli("migrate", store=f"sqlite:///{db}").stdout == result.stdout


# -- bad input: one line, exit code 1 ------------------------------------------------------------


def test_unknown_run_id(seeded: Seeded) -> None:
    for args in (["run", "show", "nope"], ["run", "cancel", "nope"],
                 ["signal", "nope", "go", "1"]):
        assert_fails(shoal_cli(*args, store=seeded.url), "No run with id 'nope'")
    # A run of another namespace is unknown in this one.
    assert_fails(shoal_cli("-n", "shop", "run", "show", seeded.other, store=seeded.url),
                 "No run with id")


def test_signal_payload_must_be_json(seeded: Seeded) -> None:
    assert_fails(shoal_cli("signal", seeded.waiting, "go", "{approved: yes}", store=seeded.url),
                 "not JSON", "{approved: yes}")
    shown = json.loads(shoal_cli("run", "show", seeded.waiting, "--json",
                                 store=seeded.url).stdout)
    assert shown["status"] == "waiting"


def test_stores_that_cannot_be_opened(tmp_path: Path) -> None:
    assert_fails(shoal_cli("migrate", store=f"sqlite:///{tmp_path / 'no' / 'such' / 'x.db'}"),
                 "does not exist")
    # A read never creates a store: a wrong path is an error, not an empty list.
    assert_fails(shoal_cli("runs", store=f"sqlite:///{tmp_path / 'missing.db'}"),
                 "No shoal store", "does not exist")
    assert not (tmp_path / "missing.db").exists()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    assert_fails(shoal_cli("runs", store=f"sqlite:///{garbage}"), "not a database")
    assert_fails(shoal_cli("runs", store="sqlite://host/x.db"), "Bad SQLite URL")
    leaky = shoal_cli("runs", store="redis://admin:s3cret@cache:6379/0")
    assert_fails(leaky, "Unknown store URL", "admin:***@cache")
    assert "s3cret" not in leaky.output


def test_a_read_never_creates_a_postgres_schema() -> None:
    import psycopg

    with backends.postgres_schema("shoal_cli_") as url:
        schema = dict(parse_qsl(urlsplit(url).query))["schema"]
        # the schema named does not exist yet: a mistyped name is an error, not an empty list
        for args in (["-n", "shop", "runs"], ["-n", "shop", "pauses"], ["run", "show", "x"],
                     ["-n", "shop", "ledger"]):
            assert_fails(shoal_cli(*args, store=url), "No shoal store",
                         f"the schema {schema!r} holds no shoal store")
        with psycopg.connect(backends.PG_URL) as conn:
            found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                                 (schema,)).fetchone()
        assert found is None
        assert shoal_cli("migrate", store=url).exit_code == 0
        listed = shoal_cli("runs", store=url)
        assert listed.exit_code == 0, listed.output
        assert "No runs in any namespace" in listed.stdout
        # a store that exists, and a namespace it has never seen: a usage error, not "no runs"
        typo = shoal_cli("-n", "shop", "runs", store=url)
        assert typo.exit_code == 2 and "no namespace 'shop'" in typo.stderr, typo.output


def test_worker_refuses_what_is_not_an_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert_fails(shoal_cli("worker", "no_such_module:app"), "Cannot import 'no_such_module'")
    assert_fails(shoal_cli("worker", "json:loads"), "not a shoal.App")
    assert_fails(shoal_cli("worker", "json:nothing"), "has no attribute 'nothing'")


def test_worker_refuses_a_bad_concurrency(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for bad in ("0", "-1", "many", "1.5"):
        assert_fails(shoal_cli("worker", "--concurrency", bad, "json:loads"),
                     "--concurrency must be a whole number >= 1", repr(bad))
        assert_fails(shoal_cli("worker", "json:loads", env={"SHOAL_MAX_CONCURRENT_RUNS": bad}),
                     "SHOAL_MAX_CONCURRENT_RUNS must be a whole number >= 1", repr(bad))
    # a good value goes on to load the app (which this is not)
    assert_fails(shoal_cli("worker", "--concurrency", "7", "json:loads"), "not a shoal.App")


def test_demo_refuses_an_existing_database(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    db.write_bytes(b"x" * 10)
    assert_fails(shoal_cli("demo", "--db", str(db)), "needs a fresh SQLite file")


# -- real processes ------------------------------------------------------------------------------



async def _dispatch_once_served(client: shoal.App, workflow: str, input: Any) -> shoal.Run:
    """Dispatch ``workflow`` once a worker process that serves it has started: its name is known
    from then on (the store may not even exist before)."""
    for _ in range(200):
        try:
            return await client.dispatch(workflow, input)
        except (shoal.UnknownWorkflowError, shoal.StoreUnavailableError):
            await asyncio.sleep(0.05)
    raise AssertionError(f"the worker never registered {workflow!r}")


def test_worker_serves_an_app_until_sigterm(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    (tmp_path / "greeter.py").write_text(
        "import shoal\n"
        "app = shoal.App.from_env('greet', lease=3.0)\n"
        "@app.workflow\n"
        "async def hello(ctx, name):\n"
        "    return await ctx.step('greet', lambda: f'hello {name}')\n"
    )
    url = f"sqlite:///{tmp_path / 'w.db'}"
    env = {**os.environ, "SHOAL_STORE": url, "SHOAL_INSTANCE_ID": "w-1"}
    worker = subprocess.Popen([*CLI, "worker", "greeter:app"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    processes.append(worker)

    async def greet() -> Any:
        client = shoal.App("greet", store=url)
        async with client.open():
            run = await _dispatch_once_served(client, "hello", "shoal")
            return await client.result(run.id, timeout=10)

    assert asyncio.run(greet()) == "hello shoal"
    worker.send_signal(signal.SIGTERM)
    out, _ = worker.communicate(timeout=15)
    assert worker.returncode == 0, out.decode()
    assert b"app.started" in out and b"app.stopping" in out


def test_worker_concurrency_overrides_the_apps_max_concurrent_runs(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    # The app executes one run at a time; each run ends only once three are executing at once,
    # so the three runs complete only if the worker executes three at once.
    (tmp_path / "meeting.py").write_text(
        "import asyncio, os\n"
        "import shoal\n"
        "app = shoal.App('meet', store=os.environ['SHOAL_STORE'], lease=3.0,\n"
        "                max_concurrent_runs=1)\n"
        "inside = 0\n"
        "everyone = asyncio.Event()\n"
        "@app.workflow(max_attempts=1)\n"
        "async def meet(ctx, n):\n"
        "    global inside\n"
        "    inside += 1\n"
        "    if inside >= n:\n"
        "        everyone.set()\n"
        "    await asyncio.wait_for(everyone.wait(), 20)\n"
        "    return inside\n"
    )
    url = f"sqlite:///{tmp_path / 'm.db'}"
    env = {**os.environ, "SHOAL_STORE": url, "SHOAL_INSTANCE_ID": "m-1"}
    env.pop("SHOAL_MAX_CONCURRENT_RUNS", None)
    worker = subprocess.Popen([*CLI, "worker", "--concurrency", "3", "meeting:app"], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    processes.append(worker)

    async def meet() -> list[Any]:
        client = shoal.App("meet", store=url)
        async with client.open():
            runs = [await _dispatch_once_served(client, "meet", 3)]
            runs += [await client.dispatch("meet", 3) for _ in range(2)]
            return [await client.result(run.id, timeout=30) for run in runs]

    assert asyncio.run(meet()) == [3, 3, 3]
    worker.send_signal(signal.SIGTERM)
    out, _ = worker.communicate(timeout=15)
    assert worker.returncode == 0, out.decode()
    assert b"max_concurrent_runs=3" in out


@pytest.mark.parametrize(("args", "env", "expected"), [
    ((), {}, [20_000, 10, 10]),                                   # tuned unless told otherwise
    (("--gc", "default"), {}, list(gc.get_threshold())),          # Python's own, as it was
    ((), {"SHOAL_WORKER_GC": "default"}, list(gc.get_threshold())),
    (("--gc", "tuned"), {"SHOAL_WORKER_GC": "default"}, [20_000, 10, 10]),  # the flag wins
])
def test_worker_tunes_the_garbage_collector_unless_told_not_to(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]], args: tuple[str, ...],
    env: dict[str, str], expected: list[int],
) -> None:
    (tmp_path / "collector.py").write_text(
        "import gc, os\n"
        "import shoal\n"
        "app = shoal.App('gc', store=os.environ['SHOAL_STORE'], lease=3.0)\n"
        "@app.workflow\n"
        "async def thresholds(ctx, _):\n"
        "    return [list(gc.get_threshold()), gc.get_freeze_count() > 0]\n"
    )
    url = f"sqlite:///{tmp_path / 'gc.db'}"
    environment = {**os.environ, "SHOAL_STORE": url, "SHOAL_INSTANCE_ID": "gc-1", **env}
    if not env:
        environment.pop("SHOAL_WORKER_GC", None)
    worker = subprocess.Popen([*CLI, "worker", *args, "collector:app"], cwd=tmp_path,
                              env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    processes.append(worker)

    async def ask() -> Any:
        client = shoal.App("gc", store=url)
        async with client.open():
            run = await _dispatch_once_served(client, "thresholds", None)
            return await client.result(run.id, timeout=10)

    tuned = expected == [20_000, 10, 10]
    assert asyncio.run(ask()) == [expected, tuned]
    worker.send_signal(signal.SIGTERM)
    out, _ = worker.communicate(timeout=15)
    assert worker.returncode == 0, out.decode()
    assert f"gc={'tuned' if tuned else 'default'}".encode() in out


def test_worker_refuses_a_bad_gc_setting() -> None:
    for result, bad in ((shoal_cli("worker", "--gc", "off", "json:loads"), "'off'"),
                        (shoal_cli("worker", "json:loads", env={"SHOAL_WORKER_GC": "sometimes"}),
                         "'sometimes'")):
        assert result.exit_code == 2, (result.exit_code, result.output)   # a usage error
        assert "Invalid value for '--gc'" in result.output and bad in result.output
        assert "'tuned'" in result.output and "'default'" in result.output
        assert "Traceback" not in result.output


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if not _gone(pid)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def _demo_env(tmp_path: Path) -> dict[str, str]:
    """The tour's temporary folder (kept when it fails) goes under the test's own."""
    return {**os.environ, "TMPDIR": str(tmp_path)}


def _replica_pids(output: str) -> list[int]:
    return sorted({int(pid) for pid in re.findall(r"replica-\d+ \(pid (\d+)\)", output)})


@pytest.mark.slow
def test_demo_end_to_end(tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    started = time.monotonic()
    demo = subprocess.Popen([*CLI, "demo"], cwd=tmp_path, env=_demo_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    processes.append(demo)
    out, err = demo.communicate(timeout=80)
    took = time.monotonic() - started
    text = out.decode()
    assert demo.returncode == 0, text + err.decode()
    assert took < 60, took
    assert "VERDICT: PASS" in text
    assert "with SIGKILL" in text and "continued by" in text
    pids = _replica_pids(text)
    assert len(pids) == 3
    assert _wait_gone(pids) == []


@pytest.mark.slow
def test_demo_interrupted_leaves_no_process_behind(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    demo = subprocess.Popen([*CLI, "demo"], cwd=tmp_path, env=_demo_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    processes.append(demo)
    assert demo.stdout is not None
    seen = b""
    deadline = time.monotonic() + 30
    while b"dispatched" not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([demo.stdout], [], [], 0.5)
        if ready:
            chunk = os.read(demo.stdout.fileno(), 65536)
            if not chunk:
                break
            seen += chunk
    assert b"dispatched" in seen, seen.decode()
    pids = _replica_pids(seen.decode())
    assert len(pids) == 3
    demo.send_signal(signal.SIGINT)
    rest, _ = demo.communicate(timeout=30)
    assert demo.returncode == 130, (seen + rest).decode()
    assert b"Interrupted" in rest
    assert _wait_gone(pids) == []


def test_worker_says_it_serves_only_once_it_reached_its_store(tmp_path: Path) -> None:
    """A store that cannot be reached fails the worker with one line, and the worker never
    claimed to serve (it said so before it had connected)."""
    (tmp_path / "greeter.py").write_text(
        "import shoal\n"
        "app = shoal.App.from_env('greet')\n"
        "@app.workflow\n"
        "async def hello(ctx, name):\n"
        "    return name\n"
    )
    env = {**os.environ, "SHOAL_STORE": "postgresql://postgres@127.0.0.1:1/x"}
    worker = subprocess.run([*CLI, "worker", "greeter:app"], cwd=tmp_path, env=env,
                            capture_output=True, timeout=60)
    err = worker.stderr.decode()
    assert worker.returncode == 1, err
    assert "serving" not in err and "Cannot connect to the PostgreSQL store" in err, err
    assert len(err.strip().splitlines()) == 1, err
