"""The read commands of the ``shoal`` command line over a real SQLite file with two namespaces:
each covers every namespace when none is given; an option value the store cannot answer (an
``--after`` that is not a run id, a namespace or a workflow it has never seen) is a usage error
naming the option (exit code 2, nothing on stdout), never an empty result; the hints a CLI user
reads speak the flags, not the Python API; and a bad value or a store that is wrong or down is
one line on stderr, never a traceback."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import shoal
from shoal.cli import cli


@dataclass(frozen=True)
class Store:
    url: str
    pending: str      # a run of "shop" waiting for its approval "ok"
    audited: str      # a finished run of "audit" that spent 2 usd
    later: str        # a run of "later", a namespace where no instance registered workflows


def shop_app(url: str) -> shoal.App:
    app = shoal.App("shop", store=url, instance_id="shop-1", lease=3.0)

    @app.workflow(name="pack")
    async def pack(ctx: shoal.RunContext, order: str) -> bool:
        await ctx.spend(0.5)
        return (await ctx.approval("ok", {"order": order})).approved

    return app


def audit_app(url: str) -> shoal.App:
    app = shoal.App("audit", store=url, instance_id="audit-1", lease=3.0)

    @app.workflow(name="check")
    async def check(ctx: shoal.RunContext, input: Any) -> str:
        await ctx.spend(2)
        return "checked"

    return app


async def _seed(url: str) -> Store:
    shop, audit = shop_app(url), audit_app(url)
    async with shop, audit:
        pending = await shop.dispatch("pack", "o-1")
        audited = await audit.dispatch("check", None)
        assert await audit.result(audited.id, timeout=10) == "checked"
        for _ in range(500):
            if await shop.pending_pauses():
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the run of shop never paused")
    later = shoal.App("later", store=url)
    async with later.open():
        queued = await later.dispatch("someday", 1, allow_unregistered=True)
    return Store(url, pending.id, audited.id, queued.id)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    path = tmp_path_factory.mktemp("reads") / "reads.db"
    return asyncio.run(_seed(f"sqlite:///{path}"))


def shoal_cli(*args: str, env: dict[str, str] | None = None) -> Result:
    """The CLI in-process with a clean SHOAL_* environment (and ``env``)."""
    environment: dict[str, str | None] = {"SHOAL_STORE": None, "SHOAL_NAMESPACE": None,
                                          "SHOAL_COORDINATION": None}
    environment.update(env or {})
    return CliRunner().invoke(cli, list(args), env=environment, prog_name="shoal")


def json_lines(result: Result) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def assert_usage_error(result: Result, *fragments: str) -> None:
    """Exit code 2, nothing on stdout (no result), the error naming the option; no
    traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.stdout == "" and "Traceback" not in result.output, result.output
    [error] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    for fragment in fragments:
        assert fragment in error, error


def assert_one_line(result: Result, *fragments: str) -> None:
    """Exit code 1, one line on stderr naming what went wrong; no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# -- every namespace when none is given -----------------------------------------------------------


def test_pauses_cover_every_namespace_when_none_is_given(store: Store) -> None:
    [pause] = json_lines(shoal_cli("--store", store.url, "pauses", "--json"))
    assert (pause["namespace"], pause["run_id"], pause["request"]) == (
        "shop", store.pending, {"order": "o-1"})
    table = shoal_cli("--store", store.url, "pauses")
    assert table.exit_code == 0, table.output
    assert "every namespace" in table.stdout and store.pending in table.stdout
    assert "namespace" in table.stdout and "shop" in table.stdout
    assert json_lines(shoal_cli("--store", store.url, "-n", "shop", "pauses", "--json")) == [
        pause]
    none = shoal_cli("--store", store.url, "-n", "audit", "pauses")
    assert none.exit_code == 0 and "No pending pauses in namespace 'audit'" in none.stdout


def test_ledger_covers_every_namespace_each_on_its_own(store: Store) -> None:
    rows = json_lines(shoal_cli("--store", store.url, "ledger", "--json"))
    assert sorted((r["namespace"], r["amount"]) for r in rows) == [("audit", 2), ("shop", 0.5)]
    table = shoal_cli("--store", store.url, "ledger")
    assert table.exit_code == 0, table.output
    assert "cost ledger of namespace 'audit'" in table.stdout
    assert "cost ledger of namespace 'shop'" in table.stdout
    # a full page says how to get the next one, with the namespace the ids count in
    paged = shoal_cli("--store", store.url, "ledger", "--limit", "1")
    assert "-n audit --after" in paged.stdout and "-n shop --after" in paged.stdout
    # ids count within a namespace: --after over two is refused, not guessed
    assert_usage_error(shoal_cli("--store", store.url, "ledger", "--after", "0"),
                       "'--after'", "'audit', 'shop'", "--namespace")
    [shop] = json_lines(shoal_cli("--store", store.url, "-n", "shop", "ledger", "--json",
                                  "--after", "0"))
    assert shop["run_id"] == store.pending


def test_outbox_dead_and_stats_cover_every_namespace(store: Store) -> None:
    dead = shoal_cli("--store", store.url, "outbox", "dead")
    assert dead.exit_code == 0, dead.output
    assert "No dead-lettered outbox entries in any namespace" in dead.stdout
    every = json_lines(shoal_cli("--store", store.url, "stats", "--json"))
    assert [s["namespace"] for s in every] == ["audit", "shop"]


# -- option values the store cannot answer --------------------------------------------------------


def test_runs_after_takes_a_run_id(store: Store) -> None:
    assert_usage_error(shoal_cli("--store", store.url, "runs", "--after", "nope"),
                       "Invalid value for '--after'", "'nope' is not a run id")
    assert_usage_error(shoal_cli("--store", store.url, "runs", "--watch", "--after", "nope"),
                       "'--after'")
    # a run id pages, in any case
    newer = json_lines(shoal_cli("--store", store.url, "runs", "--json", "--after",
                                 store.pending.upper()))
    assert store.pending not in [r["id"] for r in newer] and newer


@pytest.mark.parametrize("command", [
    ["runs"], ["runs", "--json"], ["stats"], ["stats", "--json"], ["workflows"], ["pauses"],
    ["ledger"], ["outbox", "dead"], ["runs", "--watch"]])
def test_a_namespace_the_store_never_saw_is_a_usage_error(store: Store,
                                                          command: list[str]) -> None:
    assert_usage_error(shoal_cli("--store", store.url, "-n", "shopp", *command),
                       "Invalid value for '--namespace' / '-n'", "no namespace 'shopp'",
                       "'audit', 'shop'")
    # from the environment, the error names the variable
    assert_usage_error(shoal_cli("--store", store.url, *command,
                                 env={"SHOAL_NAMESPACE": "shopp"}),
                       "SHOAL_NAMESPACE", "no namespace 'shopp'")


def test_a_namespace_with_runs_only_is_one_the_store_has(store: Store) -> None:
    [run] = json_lines(shoal_cli("--store", store.url, "-n", "later", "runs", "--json"))
    assert (run["id"], run["workflow"]) == (store.later, "someday")
    assert json_lines(shoal_cli("--store", store.url, "-n", "later", "pauses", "--json")) == []
    [stats] = json_lines(shoal_cli("--store", store.url, "-n", "later", "stats", "--json"))
    assert stats["by_status"]["queued"] == 1


def test_a_workflow_no_one_registered_and_no_run_has_is_a_usage_error(store: Store) -> None:
    for namespace in ([], ["-n", "shop"]):
        assert_usage_error(shoal_cli("--store", store.url, *namespace, "runs", "-w", "pak"),
                           "Invalid value for '--workflow' / '-w'", "'pak'", "'pack'")
    # a workflow with runs is one, registered or not; no run matching is an empty result
    assert [r["id"] for r in json_lines(shoal_cli("--store", store.url, "runs", "--json",
                                                  "-w", "someday"))] == [store.later]
    empty = shoal_cli("--store", store.url, "runs", "-w", "pack", "--status", "failed")
    assert empty.exit_code == 0 and "No runs" in empty.stdout


def test_a_root_or_run_no_run_has_is_a_usage_error(store: Store) -> None:
    missing = "01a236f7-0000-7000-8000-000000000000"
    for option in ("--root", "--run"):
        assert_usage_error(shoal_cli("--store", store.url, "ledger", option, missing),
                           f"Invalid value for '{option}'", "no run")
        assert_usage_error(shoal_cli("--store", store.url, "ledger", option, "x"),
                           "is not a run id")
    [row] = json_lines(shoal_cli("--store", store.url, "ledger", "--json", "--run",
                                 store.audited))
    assert (row["namespace"], row["amount"]) == ("audit", 2)


@pytest.mark.parametrize("command", [
    ["dispatch", "pack", '"o"', "--tenant", ""],
    ["dispatch", "pack", '"o"', "--priority", str(2**31)],
    ["signal", "01a236f7-0000-7000-8000-000000000000", ""],
    ["outbox", "redrive", ""],
    ["runs", "--tenant", ""],
    ["pauses", "--tenant", ""],
    ["run", "show", "01a236f7-0000-7000-8000-000000000000", "--tenant", ""],
    ["ledger", "--coordination", "http://nowhere"],
    ["ledger", "--coordination", "redis://a,redis://b"],
], ids=lambda c: " ".join(c) or "-")
def test_bad_values_are_usage_errors_not_the_apps_tracebacks(store: Store,
                                                            command: list[str]) -> None:
    result = shoal_cli("--store", store.url, "-n", "shop", *command)
    assert_usage_error(result, "Invalid value for")
    # what the App would have said speaks its Python API: never shown here
    for python in ("app.", "App(", "coordination=", "(tenant)", "(name)"):
        assert python not in result.stderr, result.stderr


@pytest.mark.parametrize("payload", ["NaN", "[" * 300 + "]" * 300, "[" * 5000 + "]" * 5000],
                         ids=["nan", "deep", "deeper-than-python"])
def test_json_a_run_cannot_keep_is_one_line(store: Store, payload: str) -> None:
    for command in (["dispatch", "pack", payload],
                    ["signal", store.pending, "go", payload],
                    ["approve", "01a236f7-0000-7000-8000-000000000000", "--data", payload]):
        assert_one_line(shoal_cli("--store", store.url, "-n", "shop", *command))


def test_hints_speak_the_flags(store: Store) -> None:
    unregistered = shoal_cli("--store", store.url, "-n", "audit", "dispatch", "pack", '"o"')
    assert_one_line(unregistered, "No workflow named 'pack' in namespace 'audit'",
                    "registered in namespace 'shop'", "--allow-unregistered")
    assert "allow_unregistered" not in unregistered.stderr


def test_worker_health_port_taken_names_the_flag(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "probed.py").write_text(
        "import shoal\n"
        f"app = shoal.App('probed', store='sqlite:///{tmp_path / 'w.db'}')\n")
    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = shoal_cli("worker", "probed:app", "--health-port", str(port),
                           "--health-host", "127.0.0.1", "--shutdown-timeout", "1")
    assert result.exit_code == 1, result.output
    [error] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert f"--health-port: cannot listen on 127.0.0.1:{port}" in error, error
    assert "leave --health-port out" in error and "App(" not in error
    assert "health_port=None" not in error


# -- a store that is wrong or down ----------------------------------------------------------------


READS = [["runs"], ["stats"], ["workflows"], ["pauses"], ["ledger"], ["outbox", "dead"],
         ["run", "show", "01a236f7-0000-7000-8000-000000000000"], ["dispatch", "pack"],
         ["export", "01a236f7-0000-7000-8000-000000000000"], ["migrate"], ["web"]]


@pytest.mark.parametrize("command", READS, ids=lambda c: " ".join(c))
@pytest.mark.parametrize("url, fragment", [
    ("postgresql://postgres@127.0.0.1:1/test", "Cannot connect to the PostgreSQL store"),
    ("mysql://x/y", "Unknown store URL"),
    ("sqlite://relative.db", "Bad SQLite URL"),
], ids=["down", "scheme", "sqlite-url"])
def test_a_store_wrong_or_down_is_one_line(command: list[str], url: str,
                                           fragment: str) -> None:
    assert_one_line(shoal_cli("--store", url, *command), fragment)


@pytest.mark.parametrize("command", READS, ids=lambda c: " ".join(c))
def test_a_file_that_is_not_a_store_is_one_line(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "notes.db").write_text("not a database\n")
    assert_one_line(shoal_cli("--store", f"sqlite:///{tmp_path / 'notes.db'}", *command),
                    "notes.db")
