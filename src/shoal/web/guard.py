"""Who may use the console and how: the token (a bearer header for the API, a session cookie
set by the login form for the pages), CSRF protection on every POST, and read-only mode.

- **Token.** Without a token every request is let in (``shoal web`` then binds to loopback
  only, and checks the Host header against DNS rebinding). With one, a request needs
  ``Authorization: Bearer TOKEN`` or the session cookie (``shoal_session``: an HMAC of the
  token, HttpOnly, SameSite=Strict) that ``POST /login`` sets; pages without it are sent to
  ``/login``, API calls and ``/metrics`` (a Prometheus scrape: give it
  ``authorization: {type: Bearer, credentials: TOKEN}``) get 401.
- **CSRF.** A POST needs the header ``X-CSRF-Token`` (the login and logout forms: the field
  ``csrf_token``) equal to the ``shoal_csrf`` cookie that every response sets when missing
  (double submit; ``GET /api/config`` also returns it), and an ``Origin`` header, when sent,
  of the console's own host. A POST carrying a valid bearer token is exempt: a browser never
  adds an Authorization header by itself, and the console answers no CORS preflight, so a page
  of another site cannot make one carry it.
- **Read-only.** Every POST but login and logout is refused with 403.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SESSION_COOKIE = "shoal_session"
CSRF_COOKIE = "shoal_csrf"
CSRF_HEADER = "x-csrf-token"
# reachable without a token: the login form and the static files the pages need
OPEN_PATHS = ("/login", "/static/")
METRICS_PATH = "/metrics"   # Prometheus' scrape: a bearer token, as the API
# POSTs that read-only mode allows and that check CSRF from their form themselves
FORM_POSTS = ("/login", "/logout")


def session_value(token: str) -> str:
    """The session cookie's value for ``token``: an HMAC, so the cookie never holds the token
    and a new token ends every session."""
    return hmac.new(token.encode(), b"shoal console session", hashlib.sha256).hexdigest()


def same(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and hmac.compare_digest(a.encode(), b.encode())


def cookie_path(scope: Scope) -> str:
    """The console's own path (a console mounted at /ops sets its cookies for /ops)."""
    return str(scope.get("root_path") or "") or "/"


class Guard:
    """ASGI middleware applying the rules of the module doc in front of every route."""

    def __init__(self, app: ASGIApp, token: str | None, read_only: bool) -> None:
        self.app = app
        self.token = token
        self.read_only = read_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        csrf = request.cookies.get(CSRF_COOKIE)
        fresh = None if csrf else secrets.token_urlsafe(24)
        scope.setdefault("state", {})["csrf_token"] = csrf or fresh
        refusal = self.refusal(request)
        send = _with_headers(send, scope, fresh)
        if refusal is not None:
            await refusal(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def path(self, request: Request) -> str:
        root = str(request.scope.get("root_path") or "")
        path = request.url.path
        return path[len(root):] if root and path.startswith(root) else path

    def authenticated(self, request: Request) -> tuple[bool, bool]:
        """(let in, by a bearer header)."""
        if self.token is None:
            return True, False
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer ") and same(header[7:].strip(), self.token):
            return True, True
        return same(request.cookies.get(SESSION_COOKIE), session_value(self.token)), False

    def refusal(self, request: Request) -> Response | None:
        path = self.path(request)
        # answered 401, not sent to the login form: a program asks (a scraper: /metrics)
        api = path.startswith("/api/") or path == METRICS_PATH
        let_in, bearer = self.authenticated(request)
        if not let_in and not path.startswith(OPEN_PATHS):
            if api:
                return JSONResponse({"error": "This console needs its token: send "
                                              "'Authorization: Bearer TOKEN' or log in."},
                                    401, headers={"WWW-Authenticate": "Bearer"})
            root = str(request.scope.get("root_path") or "")
            target = path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"{root}/login?{_next(target)}", 303)
        if request.method != "POST":
            return None
        if not _same_origin(request):
            return JSONResponse({"error": "Refused: the request comes from another site "
                                          "(its Origin header is not this console's)."}, 403)
        if path in FORM_POSTS:
            return None                 # the form's csrf_token field is checked by its route
        if self.read_only:
            return JSONResponse({"error": "This console is read-only (--read-only): no action "
                                          "is taken."}, 403)
        if not bearer and not same(request.headers.get(CSRF_HEADER),
                                   request.cookies.get(CSRF_COOKIE)):
            return JSONResponse({"error": "Refused: a POST needs the X-CSRF-Token header equal "
                                          "to the shoal_csrf cookie (GET /api/config gives "
                                          "it)."}, 403)
        return None


def _next(target: str) -> str:
    from urllib.parse import urlencode
    return urlencode({"next": target})


def _same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    if origin is None:
        return True       # not a browser's cross-site request (browsers send it on POST)
    host = request.headers.get("host", "")
    return origin != "null" and urlsplit(origin).netloc == host


def _with_headers(send: Send, scope: Scope, csrf: str | None) -> Send:
    """``send`` that adds ``nosniff`` and, when the request had no CSRF cookie, sets one."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            headers.setdefault("x-content-type-options", "nosniff")
            headers.setdefault("referrer-policy", "same-origin")
            if csrf is not None:
                headers.append("set-cookie", _cookie(CSRF_COOKIE, csrf, scope, httponly=False))
        await send(message)

    return wrapped


def _cookie(name: str, value: str, scope: Scope, *, httponly: bool,
            max_age: int | None = None) -> str:
    cookie: SimpleCookie = SimpleCookie()
    cookie[name] = value
    morsel: Any = cookie[name]
    morsel["path"] = cookie_path(scope)
    morsel["samesite"] = "Strict"
    if httponly:
        morsel["httponly"] = True
    if scope.get("scheme") == "https":
        morsel["secure"] = True
    if max_age is not None:
        morsel["max-age"] = max_age
    return str(morsel.OutputString())


def set_session(response: Response, scope: Scope, token: str | None) -> None:
    """Log in (``token`` given) or out (None): the session cookie, HttpOnly, SameSite=Strict."""
    value = session_value(token) if token is not None else ""
    response.headers.append("set-cookie", _cookie(
        SESSION_COOKIE, value, scope, httponly=True, max_age=None if token else 0))
