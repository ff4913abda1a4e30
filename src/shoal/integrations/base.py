"""The extension API for integration authors (docs/integrations-api.md).

An integration of another framework runs that framework's work inside a shoal run through the
workflow's :class:`shoal.RunContext` (``ctx.step``, ``ctx.approval``, ``ctx.spend``, …) and, for
what those calls do not cover, through ``ctx.extension``, a :class:`RunExtension`: the run's
namespace, claim (``fence``), clock and store, ``lease_lost()`` for a fenced write the store
refused, and the hooks of a replay. shoal's own integrations (LangGraph, the OpenAI Agents SDK)
use nothing else of a run, so one written outside shoal can do what they do. Importing this
module imports no framework.
"""

from __future__ import annotations

from shoal.engine.context import RunExtension

__all__ = ["RunExtension"]
