"""The metric reference of docs/observability.md against a real scrape, both ways (every metric
an App exports is in the table with its type and labels, and every row is exported), and the
Grafana dashboard docs/grafana/shoal.json: each PromQL expression parses and names only metrics
of the table that a scrape has."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import status_is, until
from prometheus_client.parser import text_string_to_metric_families

import shoal
from shoal.backends.memory import MemoryStore
from shoal.telemetry.metrics import PrometheusMetrics
from shoal.testing import VirtualClock, settle

DOCS = Path(__file__).resolve().parents[2] / "docs"
ROW = re.compile(r"^\| `(shoal_[a-z_]+)` \| ([a-z]+)(?: \(store\))? \|([^|]*)\|")
SUFFIXES = {"counter": ("_total",), "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count")}


def reference() -> dict[str, tuple[str, set[str]]]:
    """name -> (type, labels) of each row of the metrics table."""
    rows: dict[str, tuple[str, set[str]]] = {}
    for line in (DOCS / "observability.md").read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m:
            name, kind, labels = m.groups()
            assert name not in rows, f"{name} listed twice"
            rows[name] = (kind, set(re.findall(r"`([a-z_]+)`", labels)))
    assert len(rows) > 30
    return rows


async def scrape() -> str:
    """The exposition of an App that did a bit of everything, sampled as the store's sampler
    (a queued run is due behind a concurrency key, so the oldest due age is there too)."""
    clock = VirtualClock()
    app = shoal.App("ref", store=MemoryStore(), clock=clock, lease=30.0,
                    membership_interval=1.0, metrics=PrometheusMetrics(stats_interval=2.0))

    @app.outbox_handler("email")
    async def email(payload: Any, key: str) -> None:
        return None

    @app.on_pause_notify
    async def announce(pause: shoal.Pause) -> None:
        return None

    @app.workflow(concurrency_key="one")
    async def ask(ctx: shoal.RunContext, input: Any) -> bool:
        def send() -> int:
            ctx.outbox.send("email", {})
            return 1
        await ctx.step.with_options(retries=1)("send", send)
        return (await ctx.approval("go", {})).approved

    gate = asyncio.Event()

    @app.workflow
    async def long(ctx: shoal.RunContext, input: Any) -> None:
        ctx.progress(0.5, "half way")              # executing at the scrape
        await gate.wait()

    llm = app.provider("llm", breaker=shoal.Breaker(failures=5, window=60, cooldown=30))
    async with app:
        running = await app.dispatch(long)
        await until(status_is(app, running.id, "running"))
        waiting = await app.dispatch(ask)
        await until(status_is(app, waiting.id, "waiting"))
        await app.dispatch(ask)                       # due, blocked by the key
        async with app.lock("orders:1"):
            pass
        waiter = asyncio.ensure_future(app.locked("orders:2", lambda s: None))
        async with app.lock("orders:2"):
            await settle()
        await waiter
        await app.meter(["calls:acme"], [1])
        async with llm.call(tenant="acme") as call:
            call.used(cost=0.5)
        await app.spend(1.0, tenant="acme")

        def sampled() -> bool:
            assert app.metrics is not None
            return app.metrics.registry.get_sample_value("shoal_pending_approvals") == 1
        for _ in range(60):
            if sampled():
                break
            await clock.advance(1)
        assert sampled()
        assert app.metrics is not None
        exposition = app.metrics.exposition().decode()
        gate.set()
        await until(status_is(app, running.id, "succeeded"))
        return exposition


@pytest.fixture(scope="module")
def exposition() -> str:
    return asyncio.run(scrape())


def families(text: str) -> dict[str, tuple[str, list[Any]]]:
    """The exported metrics by their name in the table: a counter with ``_total``."""
    out: dict[str, tuple[str, list[Any]]] = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        out[name] = (family.type, family.samples)
    return out


def test_the_reference_lists_every_metric_with_its_type_and_labels(exposition: str) -> None:
    rows = reference()
    exported = families(exposition)
    assert set(exported) == set(rows), (
        f"exported, not in docs/observability.md: {sorted(set(exported) - set(rows))}; "
        f"in the table, not exported: {sorted(set(rows) - set(exported))}")
    for name, (kind, samples) in exported.items():
        assert rows[name][0] == kind, f"{name} is a {kind}, the table says {rows[name][0]}"
        label_sets = {frozenset(s.labels) - {"le"} for s in samples}
        for labels in label_sets:
            assert labels == rows[name][1], f"{name} has labels {set(labels)}"


# -- PromQL, the subset a dashboard uses ----------------------------------------------------------

FUNCTIONS = {"rate", "irate", "increase", "delta", "histogram_quantile", "abs", "clamp_min",
             "clamp_max", "time", "vector", "absent", "max_over_time", "avg_over_time"}
AGGREGATIONS = {"sum", "max", "min", "avg", "count", "topk", "bottomk", "quantile"}
TOKEN = re.compile(r"""\s*(?:(?P<number>\d+(?:\.\d+)?)|(?P<string>"(?:[^"\\]|\\.)*")
                   |(?P<range>\[[^\]]+\])|(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
                   |(?P<op>=~|!~|!=|==|>=|<=|[-+*/=<>(){},]))""", re.X)


class PromQL:
    """A recursive-descent reader of one expression; ``metrics`` collects the metric names."""

    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text.rstrip()):
            m = TOKEN.match(text, pos)
            assert m is not None and m.end() > pos, f"cannot read {text[pos:]!r} in {text!r}"
            kind = m.lastgroup
            assert kind is not None
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0
        self.metrics: set[str] = set()
        self.expr()
        assert self.i == len(self.tokens), f"trailing {self.tokens[self.i:]} in {text!r}"

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.i] if self.i < len(self.tokens) else ("end", "")

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        got = self.peek()
        assert (value is None or got[1] == value) and (kind is None or got[0] == kind), (
            f"expected {value or kind}, got {got}")
        self.i += 1
        return got[1]

    def expr(self) -> None:
        self.term()
        while self.peek()[1] in ("+", "-", "*", "/", ">", "<", "==", "!=", ">=", "<="):
            self.take()
            self.term()

    def labels(self) -> None:
        self.take("(")
        while self.peek()[1] != ")":
            self.take(kind="ident")
            if self.peek()[1] == ",":
                self.take(",")
        self.take(")")

    def term(self) -> None:
        kind, value = self.peek()
        if kind in ("number", "string"):
            self.take()
        elif value == "(":
            self.take("(")
            self.expr()
            self.take(")")
        elif kind == "ident" and value in AGGREGATIONS:
            self.take()
            if self.peek()[1] in ("by", "without"):
                self.take()
                self.labels()
            self.call()
            if self.peek()[1] in ("by", "without"):
                self.take()
                self.labels()
        elif kind == "ident" and value in FUNCTIONS:
            self.take()
            self.call()
        elif kind == "ident":
            assert value.startswith("shoal_"), f"{value!r}: not a function nor a shoal metric"
            self.metrics.add(self.take())
            if self.peek()[1] == "{":
                self.matchers()
            if self.peek()[0] == "range":
                self.take(kind="range")
        else:
            raise AssertionError(f"unexpected {value!r}")

    def call(self) -> None:
        self.take("(")
        self.expr()
        while self.peek()[1] == ",":
            self.take(",")
            self.expr()
        self.take(")")

    def matchers(self) -> None:
        self.take("{")
        while self.peek()[1] != "}":
            self.take(kind="ident")
            assert self.peek()[1] in ("=", "!=", "=~", "!~"), self.peek()
            self.take()
            self.take(kind="string")
            if self.peek()[1] == ",":
                self.take(",")
        self.take("}")


def test_promql_reader_refuses_what_is_not_promql() -> None:
    assert PromQL('sum by (a) (rate(shoal_x_total{a="b"}[5m]))').metrics == {"shoal_x_total"}
    for bad in ("sum(rate(shoal_x_total[5m])", "frobnicate(shoal_x)", "shoal_x{a=b}",
                "rate(shoal_x[5m]) )"):
        with pytest.raises(AssertionError):
            PromQL(bad)


def test_every_dashboard_expression_parses_and_uses_only_documented_metrics(
        exposition: str) -> None:
    dashboard = json.loads((DOCS / "grafana" / "shoal.json").read_text(encoding="utf-8"))
    rows = reference()
    scraped = {s.name for family in text_string_to_metric_families(exposition)
               for s in family.samples} | set(families(exposition))
    expressions = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(expressions) > 30
    used: set[str] = set()
    for expr in expressions:
        for name in PromQL(expr).metrics:
            base = next((name.removesuffix(s) for s in ("_bucket", "_sum", "_count")
                         if name.endswith(s) and name.removesuffix(s) in rows), name)
            assert base in rows, f"{expr}: {name} is not in docs/observability.md"
            kind = rows[base][0]
            assert name in {base + s for s in SUFFIXES[kind]} or (
                kind == "counter" and name == base), f"{expr}: {name} is not a series of {base}"
            assert name in scraped, f"{expr}: {name} is in no scrape"
            used.add(base)
    # the dashboard shows every family but the membership size
    assert set(rows) - used <= {"shoal_membership_members"}, sorted(set(rows) - used)
