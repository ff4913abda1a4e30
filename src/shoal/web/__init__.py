"""The console: a web page and a JSON API to see and steer runs, approvals and replicas
(``shoal web``, or :func:`asgi` mounted in your own Starlette or FastAPI service). Needs the
``web`` extra: ``pip install 'shoal[web]'``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

try:
    import jinja2  # noqa: F401  (the pages: shoal.web.pages)
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError(f"The shoal console needs the web extra ({e}): "
                      f"pip install 'shoal[web]'.") from None

from shoal.app import App
from shoal.errors import ConfigurationError
from shoal.ports import CoordStore, Store
from shoal.stores import mask_url, open_store
from shoal.web import pages
from shoal.web.data import Console
from shoal.web.guard import Guard
from shoal.web.routes import render, routes

__all__ = ["Console", "asgi", "render"]

Lifespan = Callable[[Starlette], AbstractAsyncContextManager[None]]


def asgi(app_or_url: App | str, token: str | None = None, read_only: bool = False, *,
         namespace: str | None = None,
         coordination: str | list[str] | CoordStore | None = None) -> Starlette:
    """The console as an ASGI app (Starlette).

    Given an :class:`~shoal.App`, it reads and acts through it and never opens or closes it:
    the caller does (mounted in a service, the App the service already runs; its providers,
    budgets and cron schedules are shown too). Given a store URL, it opens its own App on that
    store when the ASGI lifespan starts (connect only: it claims no run, runs no maintenance)
    and closes it when the lifespan ends; ``namespace`` names the App's namespace (default: the
    one namespace whose instances registered workflows in the store, else ``"default"``), and
    ``coordination`` the workers' ``App(coordination=…)`` (their Redis addresses, or a store:
    the replicas page reads the membership, locks and meters there; None: the run store's).

    ``token``: required of every request (see :mod:`shoal.web.guard`); ``read_only`` refuses
    every action with 403 and tells the pages to hide them."""
    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise ConfigurationError("The console's token must be a non-empty string (or None).")
    if isinstance(app_or_url, App):
        lifespan = None
    elif isinstance(app_or_url, str):
        lifespan = _own_app(open_store(app_or_url), namespace, read_only, coordination)
    else:
        raise TypeError(f"shoal.web.asgi takes an App or a store URL, not {app_or_url!r:.80}.")
    web = Starlette(routes=pages.routes() + routes(), lifespan=lifespan,
                    middleware=[Middleware(Guard, token=token, read_only=read_only)])
    # None until the lifespan has opened the console's own App (the API answers 503 meanwhile)
    web.state.console = (Console(app_or_url, read_only=read_only)
                         if isinstance(app_or_url, App) else None)
    web.state.token = token
    web.state.templates = pages.templates()
    return web


def _own_app(store: Store, namespace: str | None, read_only: bool,
             coordination: str | list[str] | CoordStore | None) -> Lifespan:
    """Open the store and an App on it, connected only (no worker), for the lifespan."""

    @asynccontextmanager
    async def lifespan(web: Starlette) -> AsyncIterator[None]:
        await store.open()
        try:
            app = App(namespace or await _namespace(store), store=store,
                      coordination=coordination)
            async with app.open():
                web.state.console = Console(app, read_only=read_only, in_process=False)
                yield
        finally:
            web.state.console = None
            await store.close()

    return lifespan


async def _namespace(store: Store) -> str:
    """The one namespace whose instances registered workflows; ``default`` when none did."""
    names = sorted({w.namespace for w in await store.list_workflows(None)})
    if len(names) > 1:
        raise ConfigurationError(
            f"The store {mask_url(store.url)!r} holds several namespaces ({', '.join(names)}): "
            f"name one (shoal web --namespace NAME, or asgi(..., namespace=NAME)).")
    return names[0] if names else "default"
