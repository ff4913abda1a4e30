"""The public face: :class:`App` wires a store, a clock, the engine, the maintenance services and
coordination together, and holds what the user registered (``core``); ``options`` validates
what it is given, ``host`` is what the engine asks of it; ``client`` is the submit-only face
(:class:`AsyncClient`, and :class:`Client` for synchronous code)."""

from shoal.app.client import AsyncClient, Client
from shoal.app.core import App, Workflow
from shoal.app.options import DispatchItem

__all__ = ["App", "AsyncClient", "Client", "DispatchItem", "Workflow"]
