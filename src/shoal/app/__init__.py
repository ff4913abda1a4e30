"""The public face: :class:`App` wires a store, a clock, the engine, the maintenance services and
coordination together, and holds what the user registered (``core``); ``options`` validates
what it is given, ``host`` is what the engine asks of it."""

from shoal.app.core import App, Workflow
from shoal.app.options import DispatchItem

__all__ = ["App", "DispatchItem", "Workflow"]
