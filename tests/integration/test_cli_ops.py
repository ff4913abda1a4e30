"""The operations of the ``shoal`` command line: ``dispatch`` (by name, with ``--wait``),
``workflows``, ``run retry``, and ``--json`` on every command that prints data. The store is a
real SQLite file; the worker that executes runs is a real ``shoal worker`` process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import shoal
import shoal.testing
from shoal.cli import cli

CLI = [sys.executable, "-m", "shoal.cli"]

SHOP = '''
import shoal
app = shoal.App.from_env("shop", lease=3.0)

@app.workflow
async def greet(ctx, name):
    return await ctx.step("greet", lambda: {"hello": name})

@app.workflow(max_attempts=1)
async def ship(ctx, order):
    import os
    await ctx.step("charge", lambda: open(os.environ["CHARGES"], "a").write("x"))
    if not os.path.exists(os.environ["CARRIER"]):
        raise RuntimeError("the carrier is down")
    return {"shipped": order}
'''


def shoal_cli(url: str, *args: str) -> Result:
    """The CLI in-process with a clean SHOAL_* environment."""
    env: dict[str, str | None] = {"SHOAL_STORE": None, "SHOAL_NAMESPACE": None}
    return CliRunner().invoke(cli, ["--store", url, *args], env=env, prog_name="shoal")


def assert_fails(result: Result, *fragments: str) -> None:
    """Exit code 1, no traceback, the error on one line of stderr."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


async def _register(url: str, namespace: str, instance: str, *names: str) -> None:
    """Start an instance serving workflows ``names`` (which do nothing), then stop it."""
    app = shoal.App(namespace, store=url, instance_id=instance, lease=3.0)
    for name in names:
        async def noop(ctx: shoal.RunContext, input: Any) -> Any:
            return input
        app.workflow(name=name, max_attempts=2)(noop)
    async with app:
        pass


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ops.db'}"


def test_workflows_lists_what_instances_registered(url: str) -> None:
    asyncio.run(_register(url, "shop", "web-1", "greet", "ship"))
    asyncio.run(_register(url, "shop", "web-2", "greet"))
    asyncio.run(_register(url, "audit", "aud-1", "check"))
    rows = [json.loads(line) for line in shoal_cli(url, "workflows", "--json").stdout.splitlines()]
    assert [(r["namespace"], r["name"], [i["instance"] for i in r["instances"]])
            for r in rows] == [("audit", "check", ["aud-1"]),
                               ("shop", "greet", ["web-2", "web-1"]),
                               ("shop", "ship", ["web-1"])]
    assert rows[1]["options"]["max_attempts"] == 2
    assert rows[1]["instances"][0]["registered_at"] >= rows[1]["instances"][1]["registered_at"]

    table = shoal_cli(url, "-n", "shop", "workflows")
    assert table.exit_code == 0, table.output
    for text in ("greet", "ship", "web-1", "web-2"):
        assert text in table.stdout
    assert "audit" not in table.stdout
    # a namespace the store has never seen is a usage error naming the ones it has
    typo = shoal_cli(url, "-n", "none", "workflows")
    assert typo.exit_code == 2 and typo.stdout == "", typo.output
    assert "no namespace 'none'" in typo.stderr and "'audit', 'shop'" in typo.stderr


def test_dispatch_by_name_prints_the_run_id(url: str) -> None:
    asyncio.run(_register(url, "shop", "web-1", "greet"))
    asyncio.run(_register(url, "audit", "aud-1", "greet", "check"))
    first = shoal_cli(url, "-n", "shop", "dispatch", "greet", '{"n": 1}',
                      "--idempotency-key", "k-1", "--tenant", "acme", "--priority", "5")
    assert first.exit_code == 0, first.output
    run_id = first.stdout.strip()
    shown = json.loads(shoal_cli(url, "run", "show", run_id, "--json").stdout)
    assert (shown["namespace"], shown["workflow"], shown["input"], shown["tenant"],
            shown["priority"], shown["max_attempts"], shown["status"]) == (
        "shop", "greet", {"n": 1}, "acme", 5, 2, "queued")
    # the same idempotency key: the same run
    again = shoal_cli(url, "-n", "shop", "dispatch", "greet", '{"n": 2}', "--idempotency-key",
                      "k-1", "--tenant", "acme", "--json")
    assert json.loads(again.stdout)["id"] == run_id
    # without a namespace: the only one that has the workflow
    check = json.loads(shoal_cli(url, "dispatch", "check", "--json").stdout)
    assert check["namespace"] == "audit" and check["input"] is None


def test_dispatch_refuses_what_it_cannot_start(url: str) -> None:
    asyncio.run(_register(url, "shop", "web-1", "greet"))
    asyncio.run(_register(url, "audit", "aud-1", "greet"))
    assert_fails(shoal_cli(url, "dispatch", "nope"), "No instance registered a workflow named "
                 "'nope'", "shoal workflows")
    assert_fails(shoal_cli(url, "-n", "shop", "dispatch", "nope"),
                 "No workflow named 'nope' in namespace 'shop'")
    assert_fails(shoal_cli(url, "dispatch", "greet"), "several namespaces (audit, shop)",
                 "--namespace")
    assert_fails(shoal_cli(url, "-n", "shop", "dispatch", "greet", "{oops"), "not JSON")
    assert shoal_cli(url, "runs", "--json").stdout == ""



def test_dispatch_allow_unregistered_queues_a_run_for_a_worker_to_come(url: str) -> None:
    assert shoal_cli(url, "migrate").exit_code == 0
    assert_fails(shoal_cli(url, "dispatch", "later", "--allow-unregistered"),
                 "--allow-unregistered needs --namespace")
    # the hint is the flag, not the Python API's allow_unregistered=True
    unregistered = shoal_cli(url, "-n", "shop", "dispatch", "later")
    assert_fails(unregistered, "No workflow named 'later' in namespace 'shop'",
                 "--allow-unregistered")
    assert "allow_unregistered" not in unregistered.stderr
    run_id = shoal_cli(url, "-n", "shop", "dispatch", "later", "7",
                       "--allow-unregistered").stdout.strip()
    [run] = [json.loads(line) for line in shoal_cli(url, "runs", "--json").stdout.splitlines()]
    assert (run["id"], run["workflow"], run["status"], run["input"]) == (
        run_id, "later", "queued", 7)


def test_retry_refuses_live_and_unknown_runs(url: str) -> None:
    asyncio.run(_register(url, "shop", "web-1", "greet"))
    run_id = shoal_cli(url, "-n", "shop", "dispatch", "greet").stdout.strip()
    assert_fails(shoal_cli(url, "run", "retry", run_id), f"Run {run_id} is queued",
                 "cancel it first")
    assert_fails(shoal_cli(url, "run", "retry", "nope"), "No run with id 'nope'")
    cancelled = json.loads(shoal_cli(url, "run", "cancel", run_id, "--json").stdout)
    assert cancelled["status"] == "cancelled"
    # another tenant's run reads as unknown and stays as it is
    assert_fails(shoal_cli(url, "run", "retry", run_id, "--tenant", "other"), "No run with id")
    retried = json.loads(shoal_cli(url, "run", "retry", run_id, "--json").stdout)
    assert (retried["id"], retried["status"], retried["attempts"]) == (run_id, "queued", 0)


def test_json_on_the_other_commands_that_print_data(url: str, tmp_path: Path) -> None:
    migrated = json.loads(shoal_cli(url, "migrate", "--json").stdout)
    assert migrated["store"] == url and migrated["version"] >= 12
    asyncio.run(_register(url, "shop", "web-1", "greet"))
    run_id = shoal_cli(url, "-n", "shop", "dispatch", "greet").stdout.strip()
    sent = json.loads(shoal_cli(url, "signal", run_id, "go", "1", "--json").stdout)
    assert sent["id"] == run_id and sent["status"] == "queued"


async def _finish(url: str, namespace: str, workflow: str) -> None:
    """Run one run of ``workflow`` (which does nothing) to its end in ``namespace``."""
    app = shoal.App(namespace, store=url, lease=3.0)

    async def noop(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    wf = app.workflow(name=workflow)(noop)
    async with app:
        run = await app.dispatch(wf, 1)
        await app.result(run.id, timeout=30)


def test_stats_of_a_namespace_or_of_every_one(url: str, tmp_path: Path) -> None:
    assert shoal_cli(url, "migrate").exit_code == 0
    assert "No namespace has registered workflows" in shoal_cli(url, "stats").stdout
    asyncio.run(_register(url, "shop", "web-1", "greet"))
    for tenant in ("acme", "acme", "beta"):
        dispatched = shoal_cli(url, "-n", "shop", "dispatch", "greet", "--tenant", tenant)
        assert dispatched.exit_code == 0, dispatched.output
    asyncio.run(_finish(url, "audit", "check"))

    one = json.loads(shoal_cli(url, "-n", "shop", "stats", "--json").stdout)
    assert (one["namespace"], one["live"], one["executing"], one["finished"]) == (
        "shop", 3, 0, 0)
    assert one["by_workflow"] == {"greet": {"queued": 3}}
    assert one["queued"] == {"acme": {"due": 2, "delayed": 0, "held": 0},
                             "beta": {"due": 1, "delayed": 0, "held": 0}}
    assert one["oldest_due_age"] >= 0 and one["pending_pauses"] == 0
    every = [json.loads(line) for line in shoal_cli(url, "stats", "--json").stdout.splitlines()]
    assert [s["namespace"] for s in every] == ["audit", "shop"]
    assert every[0]["by_status"]["succeeded"] == 1 and every[0]["live"] == 0
    assert every[0]["finished_last_minute"] == {"succeeded": 1, "failed": 0, "cancelled": 0}

    table = shoal_cli(url, "-n", "shop", "stats")
    assert table.exit_code == 0, table.output
    for text in ("greet", "acme", "beta", "3 live, 0 executing", "Oldest due run: due for"):
        assert text in table.stdout, table.stdout
    assert "audit" not in table.stdout
    assert_fails(shoal_cli(f"sqlite:///{tmp_path / 'nope.db'}", "stats"), "No shoal store")


async def _paused(url: str) -> str:
    """A run of namespace "desk" waiting for an approval; the id of its pause."""
    app = shoal.App("desk", store=url, lease=3.0)

    @app.workflow
    async def refund(ctx: shoal.RunContext, input: Any) -> bool:
        return (await ctx.approval("refund", {"amount": 5})).approved

    async with app:
        run = await app.dispatch(refund)
        for _ in range(200):
            if found := await app.pending_pauses():
                return found[0].id
            await asyncio.sleep(0.02)
    raise AssertionError(f"run {run.id} never asked for its approval")


def test_json_of_an_answered_pause(url: str) -> None:
    pause_id = asyncio.run(_paused(url))
    listed = [json.loads(line) for line in shoal_cli(url, "-n", "desk", "pauses",
                                                     "--json").stdout.splitlines()]
    assert [p["id"] for p in listed] == [pause_id]
    answered = json.loads(shoal_cli(url, "approve", pause_id, "--by", "ana", "--json").stdout)
    assert answered["id"] == pause_id and answered["status"] == "resolved"
    assert answered["decision"]["approved"] is True and answered["decision"]["by"] == "ana"


# -- with a real worker process ------------------------------------------------------------------


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A ``shoal worker`` serving SHOP over a SQLite file; stopped at the end of the test."""
    (tmp_path / "shop.py").write_text(SHOP)
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    env = {**os.environ, "SHOAL_STORE": url, "SHOAL_INSTANCE_ID": "w-1",
           "CHARGES": str(tmp_path / "charges"), "CARRIER": str(tmp_path / "carrier")}
    env.pop("SHOAL_NAMESPACE", None)
    process = subprocess.Popen([*CLI, "worker", "shop:app"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while b"w-1" not in _run(env, "workflows").stdout:
            assert process.poll() is None, process.communicate()[0].decode()
            assert time.monotonic() < deadline, "the worker never registered its workflows"
            time.sleep(0.1)
        yield url, env
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, timeout=60)


def test_dispatch_wait_prints_the_result_or_fails_then_retry_finishes_the_run(
    worker: tuple[str, dict[str, str]], tmp_path: Path,
) -> None:
    _, env = worker
    ok = _run(env, "dispatch", "greet", '"ann"', "--wait", "--timeout", "30")
    assert ok.returncode == 0, ok.stderr.decode()
    assert json.loads(ok.stdout) == {"hello": "ann"}

    failed = _run(env, "dispatch", "ship", '"o-7"', "--wait", "--timeout", "30", "--json")
    assert failed.returncode == 1
    assert "the carrier is down" in failed.stderr.decode()
    run = json.loads(failed.stdout)
    assert run["status"] == "failed" and run["attempts"] == 1

    (tmp_path / "carrier").write_text("up")
    retried = _run(env, "run", "retry", run["id"])
    assert retried.returncode == 0, retried.stderr.decode()
    assert f"Retried run {run['id']} (it was failed)" in retried.stdout.decode()
    deadline = time.monotonic() + 30
    while (shown := json.loads(_run(env, "run", "show", run["id"], "--json").stdout))[
            "status"] != "succeeded":
        assert shown["status"] != "failed", shown
        assert time.monotonic() < deadline, shown
        time.sleep(0.1)
    assert shown["output"] == {"shipped": "o-7"}
    # the finished step was not repeated
    assert (tmp_path / "charges").read_text() == "x"


async def _dead_letter(url: str, clock: shoal.testing.VirtualClock) -> tuple[str, str]:
    """A run whose one outbox entry failed its only delivery: (run id, entry id)."""
    app = shoal.App("shop", store=url, instance_id="web-1", clock=clock)

    @app.workflow
    async def notify(ctx: shoal.RunContext, input: Any) -> Any:
        def send() -> int:
            ctx.outbox.send("email", {"to": "a@example.com"})
            return 1

        return await ctx.step("sent", send)

    @app.outbox_handler("email", max_deliveries=1)
    async def email(payload: Any, key: str) -> None:
        raise ConnectionError("smtp down")

    async with app:
        run = await app.dispatch(notify, None)
        for _ in range(50):
            await shoal.testing.settle()
            if await app.dead_letters():
                break
            await clock.advance(1)
            await app.poll()
        [entry] = await app.dead_letters()
    return run.id, entry.id


async def _deliver(url: str, clock: shoal.testing.VirtualClock) -> list[Any]:
    """An instance whose handler works: what it delivers in a few polls."""
    delivered: list[Any] = []
    app = shoal.App("shop", store=url, instance_id="web-2", clock=clock)

    @app.outbox_handler("email")
    async def email(payload: Any, key: str) -> None:
        delivered.append((payload, key))

    async with app:
        for _ in range(20):
            await shoal.testing.settle()
            if delivered:
                break
            await clock.advance(1)
            await app.poll()
    return delivered


def test_outbox_redrive_makes_a_dead_letter_deliverable_once(url: str) -> None:
    clock = shoal.testing.VirtualClock(time.time())
    run_id, entry_id = asyncio.run(_dead_letter(url, clock))
    dead = [json.loads(line) for line in
            shoal_cli(url, "outbox", "dead", "--json").stdout.splitlines()]
    assert [(e["id"], e["run_id"], e["topic"], e["dead"], e["attempts"]) for e in dead] == [
        (entry_id, run_id, "email", True, 1)]
    assert "smtp down" in dead[0]["error"]
    table = shoal_cli(url, "outbox", "dead")
    assert table.exit_code == 0 and entry_id in table.stdout, table.output

    redriven = shoal_cli(url, "outbox", "redrive", entry_id, "--json")
    assert redriven.exit_code == 0, redriven.output
    entry = json.loads(redriven.stdout)
    assert (entry["id"], entry["dead"], entry["attempts"], entry["delivered_at"]) == (
        entry_id, False, 0, None)
    assert "smtp down" in entry["error"], "the last error is kept until the next attempt"
    assert shoal_cli(url, "outbox", "dead", "--json").stdout == ""
    assert "No dead-lettered" in shoal_cli(url, "outbox", "dead").stdout
    # a second redrive finds it not dead: refused, nothing changed
    assert_fails(shoal_cli(url, "outbox", "redrive", entry_id),
                 f"Outbox entry {entry_id}", "is not dead-lettered", "Nothing was changed")
    assert_fails(shoal_cli(url, "outbox", "redrive", "nope"), "No outbox entry with id 'nope'",
                 "shoal outbox dead")
    assert_fails(shoal_cli(url, "-n", "other", "outbox", "redrive", entry_id),
                 "No outbox entry", "namespace 'other'")

    [(payload, key)] = asyncio.run(_deliver(url, clock))
    assert payload == {"to": "a@example.com"}
    assert key == f"{run_id}:{entry['seq']}:{entry['index']}", "the entry's stable key"
    shown = json.loads(shoal_cli(url, "run", "show", run_id, "--json").stdout)
    assert shown["status"] == "succeeded"
    assert_fails(shoal_cli(url, "outbox", "redrive", entry_id), "it is delivered")
