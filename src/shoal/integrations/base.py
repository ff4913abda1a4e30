"""The extension API for integration authors (docs/integrations-api.md).

An integration of another framework runs that framework's work inside a shoal run through the
workflow's :class:`shoal.RunContext` (``ctx.step``, ``ctx.approval``, ``ctx.spend``, …) and, for
what those calls do not cover, through ``ctx.extension``, a :class:`RunExtension`: the run's
namespace, claim (``fence``), clock and store, ``lease_lost()`` for a fenced write the store
refused, and the hooks of a replay. Two functions complete it: :func:`json_value` checks a value
the framework hands over as shoal checks a step's result, and :func:`add_user_code_hooks` runs a
framework's cleanup around every call of user code, as a web framework runs its hooks around a
request. shoal's own integrations (LangGraph, the OpenAI Agents SDK, Django) use nothing else of
shoal's insides, so one written outside shoal can do what they do. Importing this module imports
no framework.
"""

from __future__ import annotations

from shoal import _json, _usercode
from shoal._usercode import AsyncHook, ThreadHook
from shoal.engine.context import RunExtension
from shoal.types import JSON

__all__ = ["RunExtension", "add_user_code_hooks", "json_value", "remove_user_code_hooks"]


def json_value(value: object, what: str) -> JSON:
    """``value`` as every store gives it back (a JSON round trip: a tuple becomes a list).
    Raises ``TypeError`` naming the first place in it that is not JSON (``what``, then the
    keys and indexes down to it: ``the request['items'][2] is a set ...``), or saying that it
    nests deeper than JSON values in shoal may."""
    return _json.checked(value, what)


def add_user_code_hooks(threaded: ThreadHook, awaited: AsyncHook | None = None) -> None:
    """Call ``threaded()`` in the thread of each plain-function call of user code (a step's
    function, an outbox or pause handler, ``app.locked``'s function), before and after it, and
    await ``awaited()`` before and after each coroutine-function call. A hook that raises
    before the call raises instead of it; one that raises after it is logged
    (``usercode.hook_failed``) and the call's outcome stands. Adding the same hook again
    changes nothing. The Django integration adds ``close_old_connections`` this way."""
    _usercode.add_hooks(threaded, awaited)


def remove_user_code_hooks(threaded: ThreadHook, awaited: AsyncHook | None = None) -> None:
    """Undo :func:`add_user_code_hooks` (hooks not added are ignored)."""
    _usercode.remove_hooks(threaded, awaited)
