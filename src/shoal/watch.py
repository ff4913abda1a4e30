"""What the command line draws of runs, once or live: a run's progress as a bar, the table of
runs (``shoal runs``, ``shoal runs --watch``), one run as it goes (``shoal run show --follow``),
and the loops that poll the store and redraw with rich's ``Live`` until the run ends or Ctrl-C.

Every value that comes from a run (names, messages, keys) is escaped before it reaches rich's
markup. The loops poll at a fixed interval of real time: a view never writes anything.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from shoal.types import Progress, Run, RunStatus, Step

STATUS_STYLE = {
    "queued": "cyan", "running": "bold yellow", "sleeping": "blue", "waiting": "magenta",
    "interrupted": "yellow", "succeeded": "green", "failed": "bold red", "cancelled": "dim",
}
BAR_WIDTH = 20


def when(t: float | None) -> str:
    """A time of the app's clock as local date and time ('' for None)."""
    if t is None:
        return ""
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def status(value: RunStatus | str) -> str:
    """A status in its colour (markup)."""
    text = str(value)
    return f"[{STATUS_STYLE.get(text, '')}]{text}[/]"


def json_text(value: Any, limit: int | None = None) -> str:
    """``value`` as one line of JSON, cut to ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """``fraction`` as a bar of ``width`` cells and a percentage (markup), readable without
    colour: full cells ``█``, empty ones ``░``."""
    full = min(width, max(0, round(fraction * width)))
    return (f"[green]{'█' * full}[/][dim]{'░' * (width - full)}[/] "
            f"{fraction * 100:3.0f}%")


def progress_cell(progress: Progress | None, *, width: int = BAR_WIDTH,
                  message_limit: int = 60) -> str:
    """A run's progress in a cell (markup): its bar when it gave a fraction, then its message;
    '' when it reported none."""
    if progress is None:
        return ""
    parts = []
    if progress.fraction is not None:
        parts.append(bar(progress.fraction, width))
    if progress.message:
        message = progress.message.strip().split("\n", 1)[0]
        if len(message) > message_limit:
            message = message[: message_limit - 1] + "…"
        parts.append(escape(message))
    return " ".join(parts) or "[dim]reported[/]"


def runs_table(runs: Sequence[Run], title: str, *, namespaces: bool) -> Table:
    """The runs as ``shoal runs`` prints them; a progress column when one of them reported
    progress, a namespace column with ``namespaces``."""
    table = Table(title=title, title_justify="left")
    table.add_column("id", no_wrap=True)
    if namespaces:
        table.add_column("namespace")
    progress = any(r.progress is not None for r in runs)
    columns = ["workflow", "status", *(["progress"] if progress else []), "attempts", "owner",
               "created"]
    for column in columns:
        table.add_column(column, no_wrap=column in ("status", "created"))
    for run in runs:
        cells = [run.id]
        if namespaces:
            cells.append(escape(run.namespace))
        cells += [escape(run.workflow), status(run.status)]
        if progress:
            cells.append(progress_cell(run.progress, width=10, message_limit=30))
        cells += [f"{run.attempts}/{run.max_attempts}", escape(run.owner or ""),
                  when(run.created_at)]
        table.add_row(*cells)
    return table


def run_view(run: Run, steps: Sequence[Step], now: float, footer: str | None = None
             ) -> RenderableType:
    """One run as ``shoal run show --follow`` draws it: its status line, its progress (bar,
    message, data, how long ago), its steps, and ``footer``."""
    head = (f"[bold]run {run.id}[/] {escape(run.workflow)} [dim]({escape(run.namespace)})[/]  "
            f"{status(run.status)}  attempt {run.attempts}/{run.max_attempts}")
    if run.owner:
        head += f" on {escape(run.owner)}"
    if run.wait_for and run.status == RunStatus.WAITING:
        head += f"  [dim]waits for {escape(run.wait_for)}[/]"
    parts: list[RenderableType] = [head]
    p = run.progress
    if p is None:
        parts.append("[dim]progress: none reported[/]")
    else:
        line = "progress: " + progress_cell(p, width=40, message_limit=100)
        if p.data:
            line += f"  [dim]{escape(json_text(p.data, 120))}[/]"
        parts.append(line + f"  [dim]({max(0.0, now - p.at):.0f} s ago)[/]")
    if run.error and run.error.strip():
        parts.append(f"[red]{escape(run.error.strip().splitlines()[0])}[/]")
    if steps:
        table = Table(title="steps", title_justify="left")
        for column in ("seq", "name", "state", "attempt", "output"):
            table.add_column(column, overflow="fold")
        for step in steps:
            table.add_row(str(step.seq), escape(step.name),
                          "done" if step.finished else "[magenta]in progress[/]",
                          "" if step.attempt is None else str(step.attempt),
                          escape(json_text(step.output, 80)))
        parts.append(table)
    else:
        parts.append("[dim]No steps checkpointed yet.[/]")
    if footer:
        parts.append(f"[dim]{footer}[/]")
    return Group(*parts)


def _state(run: Run, steps: Sequence[Step]) -> tuple[Any, ...]:
    """What a follower reports a change of: status, attempt, owner, progress, steps."""
    return (run.status, run.attempts, run.owner, run.progress, run.error,
            tuple((s.seq, s.finished) for s in steps))


async def follow_run(read: Callable[[], Awaitable[tuple[Run, list[Step]]]], console: Console,
                     interval: float, emit: Callable[[Run, list[Step]], None] | None = None
                     ) -> Run:
    """Poll ``read()`` every ``interval`` seconds and redraw the run (or, with ``emit``, call
    it on each change instead) until the run is in a final status; return it."""
    run, steps = await read()
    footer = f"every {interval:g} s; Ctrl-C stops following (the run goes on)"
    if emit is not None:
        seen = _state(run, steps)
        emit(run, steps)
        while not run.status.final:
            await asyncio.sleep(interval)
            run, steps = await read()
            if (state := _state(run, steps)) != seen:
                seen = state
                emit(run, steps)
        return run
    try:
        with Live(run_view(run, steps, time.time(), None if run.status.final else footer),
                  console=console, auto_refresh=False) as live:
            while not run.status.final:
                await asyncio.sleep(interval)
                run, steps = await read()
                live.update(run_view(run, steps, time.time(),
                                     None if run.status.final else footer), refresh=True)
    finally:
        _end_line(console)
    return run


def _end_line(console: Console) -> None:
    """End the last line of a view: off a terminal, ``Live`` leaves its last frame without
    the newline it writes on one."""
    if not console.is_terminal:
        console.line()


async def watch_runs(read: Callable[[], Awaitable[RenderableType]], console: Console,
                     interval: float) -> None:
    """Redraw what ``read()`` returns every ``interval`` seconds, until cancelled (Ctrl-C)."""
    try:
        with Live(await read(), console=console, auto_refresh=False) as live:
            while True:
                await asyncio.sleep(interval)
                live.update(await read(), refresh=True)
    finally:
        _end_line(console)
