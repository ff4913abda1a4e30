"""``--tenant`` on the commands that show or change one run or pause, and ``shoal ledger``, over a
real SQLite file: another tenant's id is reported exactly like an unknown one and nothing changes;
the ledger lists what ``ctx.spend`` / ``app.spend`` wrote, filtered by tenant and root."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import shoal
from shoal.cli import cli

UNKNOWN_RUN = "0000000000000000nosuchrun"
UNKNOWN_PAUSE = "0000000000000000nosuchpause"


def shoal_cli(url: str, *args: str) -> Result:
    """The CLI in-process, with a clean SHOAL_* environment."""
    env: dict[str, str | None] = {"SHOAL_STORE": None, "SHOAL_NAMESPACE": None,
                                  "SHOAL_COORDINATION": None}
    return CliRunner().invoke(cli, ["--store", url, *args], env=env, prog_name="shoal")


def assert_reads_as_unknown(foreign: Result, foreign_id: str, unknown: Result,
                            unknown_id: str) -> None:
    """The same exit code and the same one line on stderr (but for the id itself)."""
    assert foreign.exit_code == unknown.exit_code == 1, (foreign.output, unknown.output)
    assert isinstance(foreign.exception, SystemExit), foreign.exception
    assert foreign.stdout == unknown.stdout == ""
    assert foreign_id in foreign.stderr
    assert (foreign.stderr.replace(foreign_id, "<id>")
            == unknown.stderr.replace(unknown_id, "<id>")), (foreign.stderr, unknown.stderr)
    assert len(foreign.stderr.strip().splitlines()) == 1
    assert "Traceback" not in foreign.output


# -- one shop, runs and pauses of two tenants ----------------------------------------------------


def shop_app(url: str) -> shoal.App:
    app = shoal.App("shop", store=url, instance_id="seeder", lease=3.0)

    @app.workflow(name="pack")
    async def pack(ctx: shoal.RunContext, input: Any) -> Any:
        return {"go": await ctx.wait_for("go")}

    @app.workflow(name="refund")
    async def refund(ctx: shoal.RunContext, input: Any) -> Any:
        decision = await ctx.approval("refund", {"amount": input})
        return {"approved": decision.approved, "by": decision.by}

    return app


@dataclass(frozen=True)
class Shop:
    url: str
    waiting: str      # acme's run parked in ctx.wait_for("go")
    queued: str       # acme's run due in an hour
    asking: str       # acme's run waiting for the approval below
    pause: str        # acme's pending pause


async def _seed(url: str) -> Shop:
    app = shop_app(url)
    async with app:
        waiting = await app.dispatch("pack", None, tenant="acme")
        queued = await app.dispatch("pack", None, tenant="acme", delay=3600)
        asking = await app.dispatch("refund", 40, tenant="acme")
        for _ in range(300):
            pauses = await app.pending_pauses()
            if pauses and (await app.get_run(waiting.id)).status == shoal.RunStatus.WAITING:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the seeded runs never parked")
    return Shop(url, waiting.id, queued.id, asking.id, pauses[0].id)


@pytest.fixture
def shop(tmp_path: Path) -> Shop:
    return asyncio.run(_seed(f"sqlite:///{tmp_path / 'tenants.db'}"))


async def _read(url: str) -> tuple[dict[str, shoal.RunStatus], list[str]]:
    """Every run's status and the ids of the pending pauses."""
    app = shop_app(url)
    async with app.open():
        runs = await app.list_runs()
        return {r.id: r.status for r in runs}, [p.id for p in await app.pending_pauses()]


def state(shop: Shop) -> tuple[dict[str, shoal.RunStatus], list[str]]:
    return asyncio.run(_read(shop.url))


async def _finish(url: str, run_ids: list[str]) -> list[Any]:
    app = shop_app(url)
    async with app:
        return [await app.result(r, timeout=10) for r in run_ids]


@pytest.mark.parametrize("namespace", [[], ["-n", "shop"]], ids=["any-namespace", "namespace"])
def test_run_show_and_cancel_of_another_tenant_read_as_unknown(
    shop: Shop, namespace: list[str]
) -> None:
    before = state(shop)

    for command in (["run", "show"], ["run", "show", "--json"], ["run", "cancel"]):
        foreign = shoal_cli(shop.url, *namespace, *command, shop.queued, "--tenant", "globex")
        unknown = shoal_cli(shop.url, *namespace, *command, UNKNOWN_RUN, "--tenant", "globex")
        assert_reads_as_unknown(foreign, shop.queued, unknown, UNKNOWN_RUN)
    assert state(shop) == before      # nothing was cancelled

    shown = shoal_cli(shop.url, *namespace, "run", "show", shop.queued, "--tenant", "acme",
                      "--json")
    assert shown.exit_code == 0, shown.output
    assert (json.loads(shown.stdout)["id"], json.loads(shown.stdout)["tenant"]) == (
        shop.queued, "acme")
    cancelled = shoal_cli(shop.url, *namespace, "run", "cancel", shop.queued, "--tenant", "acme")
    assert cancelled.exit_code == 0, cancelled.output
    assert f"Cancelled run {shop.queued}" in cancelled.stdout
    runs, _ = state(shop)
    assert runs[shop.queued] == shoal.RunStatus.CANCELLED
    assert {k: v for k, v in runs.items() if k != shop.queued} == {
        k: v for k, v in before[0].items() if k != shop.queued}


@pytest.mark.parametrize("namespace", [[], ["-n", "shop"]], ids=["any-namespace", "namespace"])
def test_a_signal_to_another_tenants_run_reads_as_unknown_and_is_not_sent(
    shop: Shop, namespace: list[str]
) -> None:
    foreign = shoal_cli(shop.url, *namespace, "signal", shop.waiting, "go", '"wrong"',
                        "--tenant", "globex")
    unknown = shoal_cli(shop.url, *namespace, "signal", UNKNOWN_RUN, "go", '"wrong"',
                        "--tenant", "globex")
    assert_reads_as_unknown(foreign, shop.waiting, unknown, UNKNOWN_RUN)
    assert state(shop)[0][shop.waiting] == shoal.RunStatus.WAITING

    sent = shoal_cli(shop.url, *namespace, "signal", shop.waiting, "go", '"right"',
                     "--tenant", "acme")
    assert sent.exit_code == 0, sent.output
    assert "Sent signal 'go'" in sent.stdout
    # had the refused signal been kept, ctx.wait_for("go") would have taken it first
    assert asyncio.run(_finish(shop.url, [shop.waiting])) == [{"go": "right"}]


@pytest.mark.parametrize("namespace", [[], ["-n", "shop"]], ids=["any-namespace", "namespace"])
@pytest.mark.parametrize("verb", ["approve", "deny"])
def test_another_tenants_pause_reads_as_unknown_and_stays_pending(
    shop: Shop, namespace: list[str], verb: str
) -> None:
    before = state(shop)
    assert before[1] == [shop.pause]

    foreign = shoal_cli(shop.url, *namespace, verb, shop.pause, "--tenant", "globex",
                        "--by", "mallory")
    unknown = shoal_cli(shop.url, *namespace, verb, UNKNOWN_PAUSE, "--tenant", "globex",
                        "--by", "mallory")
    assert_reads_as_unknown(foreign, shop.pause, unknown, UNKNOWN_PAUSE)
    assert state(shop) == before      # still pending, its run still waiting

    answered = shoal_cli(shop.url, *namespace, verb, shop.pause, "--tenant", "acme",
                         "--by", "ana")
    assert answered.exit_code == 0, answered.output
    assert ("Approved" if verb == "approve" else "Denied") in answered.stdout
    assert state(shop)[1] == []
    assert asyncio.run(_finish(shop.url, [shop.asking])) == [
        {"approved": verb == "approve", "by": "ana"}]


def test_the_tenant_option_is_offered_where_it_applies(shop: Shop) -> None:
    for command in (["run", "show"], ["run", "cancel"], ["signal"], ["approve"], ["deny"],
                    ["runs"], ["pauses"], ["ledger"]):
        helped = shoal_cli(shop.url, *command, "--help")
        assert helped.exit_code == 0, helped.output
        assert "--tenant" in helped.stdout, command


# -- the cost ledger -------------------------------------------------------------------------------


def billing_app(url: str) -> shoal.App:
    app = shoal.App("billing", store=url, instance_id="biller", lease=3.0)

    @app.workflow(name="parent")
    async def parent(ctx: shoal.RunContext, input: Any) -> Any:
        async def pay() -> None:
            await ctx.spend(1.25)
        await ctx.step("pay", pay)
        child = await ctx.start_child("child", None)
        return await child.result()

    @app.workflow(name="child")
    async def child(ctx: shoal.RunContext, input: Any) -> Any:
        async def pay() -> None:
            await ctx.spend(0.5, currency="eur")
        await ctx.step("pay", pay)
        return "paid"

    return app


@dataclass(frozen=True)
class Books:
    url: str
    root: str         # acme's parent run: spent 1.25 usd, its child 0.5 eur


async def _spend(url: str) -> Books:
    app = billing_app(url)
    async with app:
        await app.spend(0.1, tenant="acme")
        await app.spend(3, tenant="globex", currency="eur")
        run = await app.dispatch("parent", None, tenant="acme")
        assert await app.result(run.id, timeout=10) == "paid"
        await app.spend(0.2, tenant="acme")
    # another namespace's spending never shows in billing's ledger
    other = shoal.App("other", store=url)
    async with other.open():
        await other.spend(99, tenant="acme")
    return Books(url, run.id)


@pytest.fixture
def books(tmp_path: Path) -> Books:
    return asyncio.run(_spend(f"sqlite:///{tmp_path / 'books.db'}"))


def ledger_rows(url: str, *args: str) -> list[dict[str, Any]]:
    result = shoal_cli(url, "ledger", "--json", *args)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_ledger_json_lists_rows_oldest_first_filtered_by_tenant_and_root(books: Books) -> None:
    rows = ledger_rows(books.url, "-n", "billing")
    assert [(r["tenant"], r["amount"], r["currency"]) for r in rows] == [
        ("acme", 0.1, "usd"), ("globex", 3.0, "eur"), ("acme", 1.25, "usd"),
        ("acme", 0.5, "eur"), ("acme", 0.2, "usd")]
    assert set(rows[0]) == {"namespace", "tenant", "run_id", "root_id", "amount", "currency",
                            "at", "id", "provider", "tokens"}
    assert {r["namespace"] for r in rows} == {"billing"}
    assert [r["id"] for r in rows] == sorted({r["id"] for r in rows})
    assert rows[0]["run_id"] is None and rows[0]["root_id"] is None
    assert rows[2]["run_id"] == rows[2]["root_id"] == books.root
    assert rows[3]["root_id"] == books.root and rows[3]["run_id"] not in (None, books.root)
    assert [r["at"] for r in rows] == sorted(r["at"] for r in rows)

    acme = ledger_rows(books.url, "-n", "billing", "--tenant", "acme")
    assert [r["amount"] for r in acme] == [0.1, 1.25, 0.5, 0.2]
    assert [r["amount"] for r in ledger_rows(books.url, "-n", "billing", "--tenant", "globex")
            ] == [3.0]
    assert ledger_rows(books.url, "-n", "billing", "--tenant", "initech") == []

    tree = ledger_rows(books.url, "-n", "billing", "--root", books.root)
    assert [(r["amount"], r["currency"]) for r in tree] == [(1.25, "usd"), (0.5, "eur")]
    # without a namespace the root run names it; its tenant's filter still applies
    assert ledger_rows(books.url, "--root", books.root) == tree
    assert ledger_rows(books.url, "--root", books.root, "--tenant", "acme") == tree
    # another tenant's root is refused like one no run has (a usage error), not an empty page
    foreign = shoal_cli(books.url, "-n", "billing", "ledger", "--root", books.root,
                        "--tenant", "globex")
    assert foreign.exit_code == 2 and foreign.stdout == ""
    assert "no run of tenant 'globex' has the id" in foreign.stderr

    assert [r["amount"] for r in ledger_rows(books.url, "-n", "billing", "--limit", "2")] == [
        0.1, 3.0]
    # pages: --after the last id shown
    paged, after = [], []
    while page := ledger_rows(books.url, "-n", "billing", "--limit", "2", *after):
        paged += page
        after = ["--after", str(page[-1]["id"])]
    assert paged == rows
    assert ledger_rows(books.url, "-n", "billing", "--tenant", "acme", "--after",
                       str(rows[2]["id"])) == [rows[3], rows[4]]
    # one run's spending; the run names the namespace
    assert ledger_rows(books.url, "--run", rows[3]["run_id"]) == [rows[3]]
    assert ledger_rows(books.url, "-n", "billing", "--run", books.root) == [rows[2]]
    assert [(r["tenant"], r["amount"]) for r in ledger_rows(books.url, "-n", "other")] == [
        ("acme", 99.0)]


def test_ledger_table_has_every_row_and_a_total_per_currency(books: Books) -> None:
    result = shoal_cli(books.url, "-n", "billing", "ledger")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for heading in ("id", "when", "tenant", "run", "root", "amount", "currency"):
        assert heading in out
    assert books.root in out and "globex" in out and "1.25" in out
    totals = [line for line in out.splitlines() if "total" in line]
    assert len(totals) == 2, out
    eur = next(line for line in totals if "eur" in line)
    usd = next(line for line in totals if "usd" in line)
    assert "3.5" in eur and "2 rows" in eur
    # 0.1 + 1.25 + 0.2 without float noise
    assert "1.55" in usd and "1.550000" not in usd and "3 rows" in usd

    globex = shoal_cli(books.url, "-n", "billing", "ledger", "--tenant", "globex")
    assert globex.exit_code == 0, globex.output
    assert "tenant 'globex'" in globex.stdout and "acme" not in globex.stdout
    totals = [line for line in globex.stdout.splitlines() if "total" in line]
    assert len(totals) == 1 and "1 row " in totals[0] and "eur" in totals[0], totals

    short = shoal_cli(books.url, "-n", "billing", "ledger", "--limit", "2")
    assert short.exit_code == 0
    ids = [r["id"] for r in ledger_rows(books.url, "-n", "billing")]
    assert "A page of 2 rows" in short.stdout and f"--after {ids[1]}" in short.stdout
    after = shoal_cli(books.url, "-n", "billing", "ledger", "--after", str(ids[1]))
    assert after.exit_code == 0 and f"after id {ids[1]}" in after.stdout
    assert "0.1" not in after.stdout and "1.25" in after.stdout

    empty = shoal_cli(books.url, "-n", "billing", "ledger", "--tenant", "initech")
    assert empty.exit_code == 0
    assert "No spending recorded" in empty.stdout


def test_ledger_without_a_namespace_and_bad_options(books: Books, tmp_path: Path) -> None:
    # without a namespace: every one where an instance registered workflows (billing here)
    assert [r["amount"] for r in ledger_rows(books.url)] == [0.1, 3.0, 1.25, 0.5, 0.2]
    assert [r["amount"] for r in ledger_rows(books.url, "--tenant", "acme")] == [
        0.1, 1.25, 0.5, 0.2]
    # "other" only spent, outside any run: named, it is a namespace the store has
    assert [(r["namespace"], r["amount"]) for r in ledger_rows(books.url, "-n", "other")] == [
        ("other", 99)]
    missing_run = "01a236f7-0000-7000-8000-000000000000"   # a run id no run has
    for args in (["--root", missing_run], ["--run", missing_run],
                 # another tenant's root reads exactly like an unknown one
                 ["--root", books.root, "--tenant", "globex"]):
        result = shoal_cli(books.url, "ledger", *args)
        assert result.exit_code == 2 and result.stdout == "", (args, result.output)
        assert f"Invalid value for '{args[0]}': no run" in result.stderr, result.stderr
    typo = shoal_cli(books.url, "-n", "biling", "ledger")
    assert typo.exit_code == 2 and typo.stdout == ""
    assert "no namespace 'biling'" in typo.stderr and "'billing'" in typo.stderr
    not_an_id = shoal_cli(books.url, "ledger", "--root", "nope")
    assert not_an_id.exit_code == 2 and "'nope' is not a run id" in not_an_id.stderr

    missing = shoal_cli(f"sqlite:///{tmp_path / 'nope.db'}", "-n", "billing", "ledger")
    assert missing.exit_code == 1 and "does not exist" in missing.stderr
    bad_limit = shoal_cli(books.url, "-n", "billing", "ledger", "--limit", "0")
    assert bad_limit.exit_code == 2
    bad_after = shoal_cli(books.url, "-n", "billing", "ledger", "--after", "-1")
    assert bad_after.exit_code == 2
    bad_coordination = shoal_cli(books.url, "-n", "billing", "ledger",
                                 "--coordination", "http://nowhere")
    assert bad_coordination.exit_code == 2
    assert "Invalid value for '--coordination'" in bad_coordination.stderr
    assert "redis://" in bad_coordination.stderr and "Traceback" not in bad_coordination.output
    # the hint names the option and the variable, not App(coordination=None)
    assert "coordination=" not in bad_coordination.stderr
