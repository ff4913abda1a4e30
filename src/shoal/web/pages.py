"""The console's pages: HTML rendered on the server (Jinja2, every value escaped) from the same
read model as the JSON API (:class:`shoal.web.data.Console`). The pages' script polls
``/api/overview`` and posts actions to the API; these routes only read.

Pages: ``/`` overview, ``/runs`` (filters, search, keyset pages), ``/runs/{id}``, ``/approvals``,
``/dead-letters``, ``/replicas``, ``/ledger``. The login form's route is
:mod:`shoal.web.routes`'s; its template is with the pages'. The helpers below (``timeline``,
``tree``, ``chart``, ...) shape the read model's dicts into what the templates draw, and are
plain functions so that tests can check them alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.templating import Jinja2Templates

from shoal.types import RunStatus
from shoal.web.data import Console, Refused
from shoal.web.routes import console, render

HERE = Path(__file__).parent
STATUSES = [s.value for s in RunStatus]
# the runs page's "created within" choices: (query value, label, seconds)
WITHIN = [("15m", "last 15 minutes", 900), ("1h", "last hour", 3600),
          ("24h", "last 24 hours", 86400), ("7d", "last 7 days", 7 * 86400)]
# the overview polls /api/overview this often (seconds)
REFRESH = 2.0


# -- formatting (Jinja filters) ----------------------------------------------------------------


def utc(ts: float | None) -> str:
    """``2024-05-01 12:00:00 UTC``; the page's script rewrites it in the browser's zone."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration(seconds: float | None) -> str:
    """A span of time the way a person reads it: ``850 ms``, ``4.2 s``, ``3 min 5 s``,
    ``2 h 10 min``, ``3 d 4 h``; negative spans get a minus sign."""
    if seconds is None or not math.isfinite(seconds):
        return ""
    sign, s = ("-" if seconds < 0 else ""), abs(seconds)
    if s < 1:
        return f"{sign}{s * 1000:.0f} ms"
    if s < 60:
        return f"{sign}{s:.1f} s" if s < 10 else f"{sign}{s:.0f} s"
    minutes, secs = divmod(int(s), 60)
    if minutes < 60:
        return f"{sign}{minutes} min {secs} s" if secs else f"{sign}{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{sign}{hours} h {minutes} min" if minutes else f"{sign}{hours} h"
    days, hours = divmod(hours, 24)
    return f"{sign}{days} d {hours} h" if hours else f"{sign}{days} d"


def pretty(value: Any) -> str:
    """A JSON value as indented JSON text (the template escapes it)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def compact(value: Any) -> str:
    """A JSON value on one line (the template escapes it)."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def num(value: float | int | None) -> str:
    """A number for people: thousands separated, whole floats without ``.0``, others to four
    significant digits."""
    if value is None:
        return ""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4g}"
    return f"{int(value):,}"


def short(run_id: str | None) -> str:
    """A long id shortened to its last 12 characters: ids are time-ordered, so their starts
    are alike and their ends tell them apart (the full id goes in the title)."""
    if not run_id:
        return ""
    return run_id if len(run_id) <= 14 else "…" + run_id[-12:]


def templates() -> Jinja2Templates:
    """The pages' templates: autoescaped (every value is text, never markup), with the filters
    above."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True,
    )
    env.filters.update(utc=utc, iso=iso, duration=duration, pretty=pretty,
                       compact=compact, short=short, num=num)
    env.globals.update(STATUSES=STATUSES, REFRESH=REFRESH)
    return Jinja2Templates(env=env)


# -- shaping the read model for the templates --------------------------------------------------


def chart(counts: Sequence[int], width: int = 600, height: int = 100) -> dict[str, Any]:
    """The bars of the finished-per-minute chart in a ``width`` x ``height`` SVG box, oldest
    first: ``{"bars": [{"x", "y", "w", "h", "n", "ago"}], "max", "total"}`` (``ago``: minutes
    before the one under way)."""
    top = max(counts, default=0)
    slot = width / max(len(counts), 1)
    bars = []
    for i, n in enumerate(counts):
        h = 0.0 if top == 0 else round(n / top * (height - 4), 2)
        bars.append({"x": round(i * slot + 1, 2), "w": round(max(slot - 2, 1), 2),
                     "y": round(height - h, 2), "h": h, "n": n, "ago": len(counts) - 1 - i})
    return {"bars": bars, "max": top, "total": sum(counts), "width": width, "height": height}


def stack(by_status: Mapping[str, int]) -> list[dict[str, Any]]:
    """Each status with its count and its share of all runs in percent (0 when none)."""
    total = sum(by_status.values())
    return [{"status": s, "n": by_status.get(s, 0),
             "pct": 0.0 if total == 0 else round(100 * by_status.get(s, 0) / total, 3)}
            for s in STATUSES]


@dataclass
class Bar:
    """One step of the timeline: where its bar starts and how wide it is, in percent of the
    axis; ``took`` (seconds) None while it is in progress; ``target`` the time a sleep or a
    wait in progress is due; ``estimated`` when the step's start is not stored (older steps)
    and its bar starts where the step before it ended."""

    step: Mapping[str, Any]
    start: float
    end: float | None
    target: float | None
    estimated: bool = False
    left: float = 0.0
    width: float = 0.0

    @property
    def open(self) -> bool:
        return self.end is None

    @property
    def took(self) -> float | None:
        return None if self.end is None else max(0.0, self.end - self.start)


def timeline(run: Mapping[str, Any], steps: Sequence[Mapping[str, Any]],
             now: float) -> dict[str, Any]:
    """The step timeline: each step as a :class:`Bar` on one time axis from the run's start
    to its end (or ``now``): ``{"rows", "start", "end", "span", "estimated"}``. A bar runs
    from the step's ``started_at`` to its end; a step without a stored start (written by
    older code) starts where the step before it ended (``since_previous``), and
    ``estimated`` says some bar does. A step in progress (a sleep or a wait) runs to ``now``."""
    first: float = run.get("started_at") or run.get("created_at") or now
    rows: list[Bar] = []
    previous = first
    for s in steps:
        end: float | None = s.get("finished_at")
        began: float | None = s.get("started_at")
        since: float | None = s.get("since_previous")
        output = s.get("output")
        target = None
        if not s.get("finished") and isinstance(output, dict):
            target = output.get("until") or output.get("deadline")
        if began is not None:
            rows.append(Bar(s, began, end, target))
        else:
            rows.append(Bar(s, previous if end is None or since is None else end - since, end,
                            target, estimated=True))
        if end is not None:
            previous = end
    first = min([first] + [r.start for r in rows])
    last: float = run.get("finished_at") or max(
        [now] + [r.end for r in rows if r.end is not None])
    span = max(last - first, 1e-6)
    for r in rows:
        stop = r.end if r.end is not None else min(now, last)
        left = min(max((r.start - first) / span, 0.0), 1.0)
        right = min(max((stop - first) / span, left), 1.0)
        r.left, r.width = round(100 * left, 3), round(100 * (right - left), 3)
    return {"rows": rows, "start": first, "end": last, "span": last - first,
            "estimated": any(r.estimated for r in rows)}


def tree(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The runs of one tree nested by ``parent_id``: ``[{"run", "children": [...]}]``, roots
    first. A run whose parent is not among ``rows`` (the tree was cut at its limit) is shown
    at the top."""
    nodes: dict[str, dict[str, Any]] = {r["id"]: {"run": r, "children": []} for r in rows}
    top: list[dict[str, Any]] = []
    for r in rows:
        parent = nodes.get(r.get("parent_id") or "")
        (parent["children"] if parent is not None else top).append(nodes[r["id"]])
    return top


def runs_query(params: Mapping[str, str], now: float) -> dict[str, str]:
    """The runs page's query as the read model takes it: ``within`` (a preset of
    :data:`WITHIN`) becomes ``created_from``; empty fields are dropped."""
    query = {k: v for k, v in params.items() if v != "" and k != "within"}
    within = params.get("within")
    if within:
        seconds = dict((k, s) for k, _, s in WITHIN).get(within)
        if seconds is None:
            raise Refused(400, f"Unknown time range {within!r}: one of "
                               f"{', '.join(k for k, _, _ in WITHIN)}.", "within")
        query["created_from"] = str(now - seconds)
    return query


def page_link(params: Mapping[str, str], **changes: str | None) -> str:
    """The runs page's query string with ``changes`` applied (None removes a key)."""
    query = {k: v for k, v in params.items() if v != ""}
    for k, v in changes.items():
        if v is None:
            query.pop(k, None)
        else:
            query[k] = v
    return "?" + urlencode(query) if query else ""


# -- the routes --------------------------------------------------------------------------------

# a page: the template to render and its context, from the console and the request
View = Callable[[Console, Request], Awaitable[tuple[str, dict[str, Any]]]]


def page(view: View) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint rendering what ``view`` returns; a :class:`Refused` (unknown run, bad
    filter) becomes a page saying why, with its status."""

    async def endpoint(request: Request) -> Response:
        try:
            name, context = await view(console(request), request)
        except Refused as e:
            if e.status == 503:    # no console to draw a page with: say why in plain text
                return PlainTextResponse(e.message, 503)
            return render(request, "error.html", {"page": "error", "status": e.status,
                                                  "message": e.message}, e.status)
        return render(request, name, {"page": name.removesuffix(".html")} | context)

    return endpoint


async def overview_page(c: Console, request: Request) -> tuple[str, dict[str, Any]]:
    data = await c.overview()
    stats = data["stats"]
    return "overview.html", {
        "o": data, "stack": stack(stats["by_status"]),
        "chart": chart(data["finished_per_minute"]["counts"]),
        "due": sum(q["due"] for q in stats["queued"].values()),
    }


async def runs_page(c: Console, request: Request) -> tuple[str, dict[str, Any]]:
    params = dict(request.query_params)
    data = await c.runs(runs_query(params, c.app.clock.now()))
    cursor = data["next_cursor"]
    return "runs.html", {
        "runs": data["runs"], "params": params, "within": WITHIN,
        "next": page_link(params, cursor=cursor) if cursor else None,
        # from a later page, back to the first with the same filters
        "first": (page_link(params, cursor=None) or "?") if params.get("cursor") else None,
    }


async def run_page(c: Console, request: Request) -> tuple[str, dict[str, Any]]:
    data = await c.run(request.path_params["run_id"])
    now = c.app.clock.now()
    return "run.html", {
        "d": data, "r": data["run"], "now": now,
        "timeline": timeline(data["run"], data["steps"], now), "tree": tree(data["tree"]),
    }


async def approvals_page(c: Console, request: Request) -> tuple[str, dict[str, Any]]:
    return "approvals.html", {"approvals": (await c.approvals())["approvals"]}


async def dead_letters_page(c: Console, request: Request) -> tuple[str, dict[str, Any]]:
    return "dead_letters.html", {"entries": (await c.dead_letters())["dead_letters"]}


async def ledger_page(c: Console, request: Request) -> tuple[str, dict[str, Any]]:
    """The cost ledger, a page at a time (``after`` the last id shown), filtered by tenant, run
    or root as the API's ``/api/ledger`` is."""
    filters = {k: request.query_params.get(k) or None for k in ("tenant", "run_id", "root_id")}
    ledger = await c.ledger(request.query_params)
    next_url = None
    if ledger["next_after"] is not None:
        query = {k: v for k, v in filters.items() if v} | {"after": str(ledger["next_after"])}
        if request.query_params.get("limit"):
            query["limit"] = request.query_params["limit"]
        next_url = f"{request.scope.get('root_path', '')}/ledger?{urlencode(query)}"
    return "ledger.html", {"ledger": ledger, "filters": filters, "next_url": next_url}


async def replicas_page(c: Console, request: Request) -> tuple[str, dict[str, Any]]:
    return "replicas.html", {"rep": await c.replicas(), "prov": await c.providers(),
                             "budgets": await c.budgets(), "cron": await c.cron(),
                             "now": c.app.clock.now()}


def routes() -> list[BaseRoute]:
    """The pages; mount them before the API's routes."""
    return [
        Route("/", page(overview_page), name="overview"),
        Route("/runs", page(runs_page), name="runs"),
        Route("/runs/{run_id}", page(run_page), name="run"),
        Route("/approvals", page(approvals_page), name="approvals"),
        Route("/dead-letters", page(dead_letters_page), name="dead_letters"),
        Route("/replicas", page(replicas_page), name="replicas"),
        Route("/ledger", page(ledger_page), name="ledger"),
    ]
