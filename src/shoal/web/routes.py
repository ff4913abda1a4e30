"""The console's routes: the JSON API under ``/api/`` (the table is :data:`API`), the login
form, and the hook the pages use (:func:`render`).

Every API route answers JSON. A refusal is ``{"error": why, "field"?: the bad parameter,
"current"?: the run's or pause's status now}`` with 400 (bad input), 401 (no token), 403
(read-only, CSRF, another site), 404 (unknown) or 409 (the run or pause moved on meanwhile).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from shoal.web.data import Console, Refused
from shoal.web.guard import CSRF_COOKIE, same, set_session

HERE = Path(__file__).parent
# The login form: the pages build it; it gets ``error`` (a message or None), ``next`` (where
# to go after) and ``csrf_token`` (post it back as the field ``csrf_token``, with ``token``).
LOGIN_TEMPLATE = "login.html"

Endpoint = Callable[[Request], Awaitable[Response]]


def console(request: Request) -> Console:
    """The request's console; 503 while a console opened on a URL has not opened its App (its
    ASGI lifespan has not run: mounted in another app, give it an App instead)."""
    found: Console | None = request.app.state.console
    if found is None:
        raise Refused(503, "The console is not open: its ASGI lifespan has not run. Mounted "
                           "in another app, pass shoal.web.asgi an App that your service opens "
                           "(see docs/console.md).")
    return found


def render(request: Request, name: str, context: dict[str, Any] | None = None,
           status_code: int = 200) -> Response:
    """Render template ``name`` (of ``web/templates``) with ``context`` and what every page
    needs: ``console`` (the /api/config dict: namespace, masked store URL, read_only, ...),
    ``csrf_token`` (send it as the X-CSRF-Token header of each POST), ``root`` (the path the
    console is mounted at, "" at the root) and ``auth`` (whether a token is set: show logout)."""
    templates: Jinja2Templates = request.app.state.templates
    base = {"console": console(request).config(), "csrf_token": request.state.csrf_token,
            "root": str(request.scope.get("root_path") or ""),
            "auth": request.app.state.token is not None}
    return templates.TemplateResponse(request, name, base | (context or {}),
                                      status_code=status_code)


def api(read: Callable[[Console, Request], Awaitable[dict[str, Any]]]) -> Endpoint:
    """A JSON endpoint: the dict ``read`` returns, or its :class:`Refused` as an error."""

    async def endpoint(request: Request) -> Response:
        try:
            return JSONResponse(await read(console(request), request))
        except Refused as e:
            return JSONResponse(e.body(), e.status)

    return endpoint


async def body(request: Request) -> Any:
    """The request's JSON body (an empty body is ``{}``); 400 when it is not JSON."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise Refused(400, f"The request body is not JSON: {e}.", "body") from None


async def _config(c: Console, r: Request) -> dict[str, Any]:
    return c.config() | {"csrf_token": r.state.csrf_token,
                         "auth": r.app.state.token is not None}


async def _answer(c: Console, r: Request, approved: bool) -> dict[str, Any]:
    return await c.answer(r.path_params["pause_id"], approved, await body(r))


# (method, path, what it answers): the API, documented in docs/console.md
API: list[tuple[str, str, Callable[[Console, Request], Awaitable[dict[str, Any]]]]] = [
    ("GET", "/api/config", _config),
    ("GET", "/api/overview", lambda c, r: c.overview()),
    ("GET", "/api/runs", lambda c, r: c.runs(r.query_params)),
    ("GET", "/api/runs/{run_id}", lambda c, r: c.run(r.path_params["run_id"])),
    ("POST", "/api/runs/{run_id}/cancel", lambda c, r: c.cancel(r.path_params["run_id"])),
    ("POST", "/api/runs/{run_id}/retry", lambda c, r: c.retry(r.path_params["run_id"])),
    ("POST", "/api/runs/{run_id}/signal",
     lambda c, r: _signal(c, r)),
    ("GET", "/api/approvals", lambda c, r: c.approvals()),
    ("POST", "/api/approvals/{pause_id}/approve", lambda c, r: _answer(c, r, True)),
    ("POST", "/api/approvals/{pause_id}/deny", lambda c, r: _answer(c, r, False)),
    ("GET", "/api/dead-letters", lambda c, r: c.dead_letters()),
    ("POST", "/api/dead-letters/{entry_id}/redrive",
     lambda c, r: c.redrive(r.path_params["entry_id"])),
    ("GET", "/api/replicas", lambda c, r: c.replicas()),
    ("GET", "/api/providers", lambda c, r: c.providers()),
    ("GET", "/api/budgets", lambda c, r: c.budgets()),
    ("GET", "/api/cron", lambda c, r: c.cron()),
    ("GET", "/api/ledger", lambda c, r: c.ledger(r.query_params)),
]


async def _signal(c: Console, r: Request) -> dict[str, Any]:
    return await c.signal(r.path_params["run_id"], await body(r))


async def login(request: Request) -> Response:
    """GET: the form. POST (form fields ``token``, ``csrf_token``, ``next``): with the right
    token, set the session cookie and go to ``next``; else the form again, 401."""
    token: str | None = request.app.state.token
    if request.method == "GET":
        return render(request, LOGIN_TEMPLATE, {"error": None,
                                                "next": _safe_next(request.query_params)})
    form = {k: v[0] for k, v in parse_qs((await request.body()).decode(errors="replace"),
                                         max_num_fields=10).items()}
    nxt = _safe_next(form)
    if not same(form.get("csrf_token"), request.cookies.get(CSRF_COOKIE)):
        return render(request, LOGIN_TEMPLATE, {"error": "The form expired: try again.",
                                                "next": nxt}, 403)
    if token is not None and not same(form.get("token", ""), token):
        return render(request, LOGIN_TEMPLATE, {"error": "Wrong token.", "next": nxt}, 401)
    response = RedirectResponse(str(request.scope.get("root_path") or "") + nxt, 303)
    if token is not None:
        set_session(response, request.scope, token)
    return response


async def logout(request: Request) -> Response:
    """POST (form field ``csrf_token``): end the session, back to the login form."""
    form = {k: v[0] for k, v in parse_qs((await request.body()).decode(errors="replace"),
                                         max_num_fields=10).items()}
    root = str(request.scope.get("root_path") or "")
    if not same(form.get("csrf_token") or request.headers.get("x-csrf-token"),
                request.cookies.get(CSRF_COOKIE)):
        return JSONResponse({"error": "Refused: the logout form needs its csrf_token."}, 403)
    response = RedirectResponse(f"{root}/login", 303)
    set_session(response, request.scope, None)
    return response


def _safe_next(values: Any) -> str:
    """Only a path of this console: never another site (``//evil`` or ``https://…``)."""
    target = str(values.get("next") or "/")
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


async def metrics(request: Request) -> Response:
    """GET ``/metrics``: the Prometheus metrics of the console's App (``App(metrics=True)``),
    in the text format; 404 when it has none (a console opened on a store URL has its own
    App, which executes nothing: scrape the workers instead)."""
    try:
        sink = console(request).app.metrics
    except Refused as e:
        return JSONResponse(e.body(), e.status)
    if sink is None:
        return JSONResponse({"error": "This console's App has no metrics: mount "
                                      "shoal.web.asgi(app) with an App made with "
                                      "App(metrics=True), or scrape the workers' "
                                      "'shoal worker --metrics-port'."}, 404)
    return Response(sink.exposition(), media_type=sink.content_type)


def routes() -> list[BaseRoute]:
    """The API, ``/metrics``, the login form and the static files. The pages add their own
    routes."""
    table: list[BaseRoute] = [Route(path, api(read), methods=[method])
                              for method, path, read in API]
    table += [Route("/metrics", metrics, methods=["GET"]),
              Route("/login", login, methods=["GET", "POST"]),
              Route("/logout", logout, methods=["POST"])]
    static = HERE / "static"
    if static.is_dir():
        table.append(Mount("/static", StaticFiles(directory=static), name="static"))
    return table
