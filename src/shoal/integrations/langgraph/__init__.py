"""LangGraph on shoal (``pip install 'shoal[langgraph]'``).

- :class:`ShoalCheckpointer`: a LangGraph checkpointer on a shoal store (SQLite, PostgreSQL,
  memory), in the runs' own file or schema, scoped by namespace and tenant.
- :func:`run_graph`: a compiled graph run durably inside a shoal run: a crash continues from the
  last super-step on another replica, and each ``interrupt(...)`` is a shoal pause.
- :func:`metered`: a chat model whose calls go through ``app.provider(...)``: shared limits,
  budgets, and a ledger row per call.
"""

from __future__ import annotations

try:
    import langgraph.checkpoint.base
    import langgraph.types  # noqa: F401
except ImportError as e:   # pragma: no cover - the extra is installed in development
    raise ImportError(
        f"shoal.integrations.langgraph needs LangGraph ({e}): pip install 'shoal[langgraph]'."
    ) from e

from shoal.integrations.langgraph.graphs import run_graph
from shoal.integrations.langgraph.models import MeteredModel, metered
from shoal.integrations.langgraph.saver import ShoalCheckpointer

__all__ = ["MeteredModel", "ShoalCheckpointer", "metered", "run_graph"]
