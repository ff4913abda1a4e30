"""Log records as JSON lines, and the fields that tie a record to an instance and a run.

shoal logs through the standard ``logging`` module under the ``shoal`` logger. A record of an
event carries ``extra`` keys among ``event``, ``run_id``, ``workflow``, ``tenant`` and
``instance``, where the code that logs it knows them. :class:`ContextFilter` fills the ones it
left out from the task that logs it: the App whose task it is (:func:`instance_scope`), and the
run being executed (:data:`shoal.scope.current_run`). :class:`JsonFormatter` writes a record as
one JSON object per line; :func:`configure` sets both up on the root logger, for shoal's records
and the application's own.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import IO, Any

from shoal.scope import current_run

FORMAT_ENV = "SHOAL_LOG_FORMAT"
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"   # `shoal worker`'s lines

# The fields JsonFormatter writes first, in this order, when a record has them.
CONTEXT_FIELDS = ("event", "run_id", "workflow", "tenant", "instance")

current_instance: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "shoal_current_instance", default=None)

# The attributes every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


@contextlib.contextmanager
def instance_scope(instance_id: str) -> Iterator[None]:
    """Within the block, and in every task (and step thread) started in it, records are of
    ``instance_id``. The App wraps its ``start``, ``close`` and ``poll`` in it, so the tasks it
    starts carry its id however many Apps share the process; after the block the caller's
    value is back."""
    token = current_instance.set(instance_id)
    try:
        yield
    finally:
        current_instance.reset(token)


class ContextFilter(logging.Filter):
    """Sets ``instance``, and ``run_id``, ``workflow`` and ``tenant`` inside a run's task, on
    each record that lacks them, from the context the record is logged in. Never drops a
    record. On a handler it stamps every record the handler emits (the application's too); on
    a logger, only the records logged on that very logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "instance", None) is None:
            instance = current_instance.get()
            if instance is not None:
                record.instance = instance
        run = current_run.get()
        # a record about another run (a child, say) keeps its own fields
        if run is not None and getattr(record, "run_id", None) in (None, run.run_id):
            for name in ("run_id", "workflow", "tenant"):
                if getattr(record, name, None) is None:
                    value = getattr(run, name, None)
                    if value is not None:
                        setattr(record, name, value)
        return True


def install_filter() -> None:
    """Put a :class:`ContextFilter` on the ``shoal`` logger and its children created so far,
    once: shoal's records then carry ``instance`` (and the run's fields) whatever handler and
    formatter the process has. The App calls it when it starts."""
    manager = logging.Logger.manager
    names = ["shoal", *(n for n in list(manager.loggerDict) if n.startswith("shoal."))]
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ContextFilter) for f in logger.filters):
            logger.addFilter(ContextFilter())


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time`` (ISO 8601, UTC, milliseconds, ``Z``),
    ``level`` (lower case), ``logger``, then those of ``event``, ``run_id``, ``workflow``,
    ``tenant`` and ``instance`` the record has, ``message``, the traceback under ``error``
    when it has ``exc_info`` (``stack`` for ``stack_info``), and any other ``extra=`` key. A
    field that is unknown (absent, or None) is left out, never written as null. A value that
    is not JSON is written as its ``str()``."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        line["message"] = record.getMessage()
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["error"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        for name, value in vars(record).items():
            if (name not in _STANDARD and name not in line and not name.startswith("_")
                    and value is not None):
                line[name] = value
        try:
            return json.dumps(line, ensure_ascii=False, default=str, allow_nan=False,
                              separators=(",", ":"))
        except (TypeError, ValueError):   # a NaN, or a dict with keys that are not str
            return json.dumps({k: v if isinstance(v, str) else str(v) for k, v in line.items()},
                              ensure_ascii=False, separators=(",", ":"))


def log_format(format: str | None = None) -> str:
    """``format``, else ``SHOAL_LOG_FORMAT``, else ``"text"``; ``ValueError`` naming the one
    given for anything but ``text`` or ``json``."""
    given = format if format is not None else os.environ.get(FORMAT_ENV, "").strip() or "text"
    if not isinstance(given, str) or given.lower() not in FORMATS:
        where = "format" if format is not None else FORMAT_ENV
        raise ValueError(f"The log format ({where}) is 'text' or 'json', not {given!r}.")
    return given.lower()


class _Handler(logging.StreamHandler[IO[str]]):
    """The handler :func:`configure` installs (found again by its type to be replaced)."""


def configure(format: str | None = None, level: str | int = "INFO",
              stream: IO[str] | None = None) -> logging.Handler:
    """Send every logger's records (shoal's and the application's) to ``stream`` (stderr by
    default) at ``level`` and above, as JSON lines (``format="json"``) or as text lines
    (``"text"``); ``format=None`` takes ``SHOAL_LOG_FORMAT``, else text. Each record gets the
    context fields of :class:`ContextFilter`. Installs one handler on the root logger and sets
    its level; called again, it replaces the handler it installed before and leaves other
    handlers alone. Returns the handler. Raises ``ValueError`` for an unknown format or
    level."""
    chosen = log_format(format)
    if isinstance(level, str):
        number = logging.getLevelName(level.upper())
        if not isinstance(number, int):
            raise ValueError(f"The log level is one of debug, info, warning, error, critical "
                             f"(or a number), not {level!r}.")
        level = number
    handler = _Handler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if chosen == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(ContextFilter())
    handler.setLevel(level)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
