"""The columns of the runs table a :class:`~shoal.types.Run` is made of, in one place.

Every SQL backend keeps a run in a ``runs`` table with these columns (:data:`COLUMNS`): each
names the Run field it fills and the kind of value it holds, and a backend reads them with a
:class:`RunRows` made of its own decoders, one per kind its driver does not hand over as Python
values already (JSON text, a status's text; for SQLite, 0/1 as bools and times kept as whole
numbers). A new column of Run is added here once; the check below fails at import until it is,
and ``tests/contract/test_run_columns.py`` fails until a backend's table has it.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from shoal.types import Progress, Run, RunStatus


@dataclasses.dataclass(frozen=True)
class Column:
    """A column of runs: the Run field it fills (its own name) and the kind of its values:
    ``text``, ``int``, ``real``, ``bool``, ``json`` (JSON text), ``status`` (a RunStatus's
    value), ``progress`` (JSON text, made a Progress with the ``progress_at`` column)."""

    name: str
    kind: str


# In the order a RunRows reads them; progress_at, which goes into the progress field, last.
COLUMNS: tuple[Column, ...] = (
    Column("id", "text"), Column("namespace", "text"), Column("tenant", "text"),
    Column("workflow", "text"), Column("input", "json"), Column("output", "json"),
    Column("error", "text"), Column("status", "status"), Column("priority", "int"),
    Column("created_at", "real"), Column("run_at", "real"), Column("attempts", "int"),
    Column("max_attempts", "int"), Column("concurrency_key", "text"),
    Column("idempotency_key", "text"), Column("owner", "text"),
    Column("lease_expires_at", "real"), Column("lease_epoch", "int"),
    Column("cancel_requested", "bool"), Column("version", "text"), Column("parent_id", "text"),
    Column("root_id", "text"), Column("wait_for", "text"), Column("held", "bool"),
    Column("started_at", "real"), Column("finished_at", "real"),
    Column("resume_reason", "text"), Column("traceback", "text"),
    Column("progress", "progress"), Column("trace_context", "text"),
    Column("progress_at", "real"),
)
NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)
# the Run fields the columns fill, in their order (but progress_at's: it is part of progress)
FIELDS: tuple[str, ...] = NAMES[:-1]
# columns of a runs table that no Run field reads (bookkeeping of the store's own statements)
NOT_OF_A_RUN = frozenset({"has_tree_keys", "key_slot", "rate_key"})

_KINDS = frozenset({"text", "int", "real", "bool", "json", "status", "progress"})
assert NAMES[-1] == "progress_at" and all(c.kind in _KINDS for c in COLUMNS)
assert len(set(NAMES)) == len(NAMES), "a column of runs is named twice"
_MISMATCH = set(FIELDS) ^ {f.name for f in dataclasses.fields(Run)}
if _MISMATCH:
    raise TypeError(f"shoal.backends._runs.COLUMNS must name every field of Run and no other "
                    f"(a column for each field, named after it): {sorted(_MISMATCH)}")
# RunRows fills vars(run) itself: a default made by a factory would have to be made per run
assert all(f.default_factory is dataclasses.MISSING for f in dataclasses.fields(Run))
# every field first (in Run's order, so that the instance's dict is made at its size at once)
_DEFAULTS: dict[str, object] = dict.fromkeys(f.name for f in dataclasses.fields(Run))

STATUSES: dict[str, RunStatus] = {status.value: status for status in RunStatus}


class Keyed(Protocol):
    """A row whose values are read by column name: a dict row, a ``sqlite3.Row``."""

    def __getitem__(self, name: str, /) -> Any: ...


class RunRows:
    """How one backend's rows of runs become Runs. ``decoders`` maps a kind (see
    :class:`Column`) to what makes a field's value of a column's; a kind without one is taken
    as the driver gives it. ``progress`` makes the progress field of the ``progress`` and
    ``progress_at`` values."""

    def __init__(self, decoders: Mapping[str, Callable[[Any], Any]],
                 progress: Callable[[Any, Any], Progress | None]) -> None:
        decoded = [(c.name, decoders[c.kind]) for c in COLUMNS[:-1] if c.kind in decoders]
        self.run: Callable[[Sequence[Any]], Run] = _compile(decoded, progress)
        """The Run of the values of :data:`COLUMNS`, in their order."""
        self.by_name = operator.itemgetter(*NAMES)

    def of_mapping(self, row: Keyed) -> Run:
        """The Run of a row read by column name (a dict row, a ``sqlite3.Row``)."""
        return self.run(self.by_name(row))

    def of_tuples(self, names: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[Run]:
        """The Runs of rows read as tuples whose columns are ``names``, in their order."""
        at = operator.itemgetter(*(list(names).index(c) for c in NAMES))
        run = self.run
        return [run(at(row)) for row in rows]


def _compile(decoded: Sequence[tuple[str, Callable[[Any], Any]]],
             progress: Callable[[Any, Any], Progress | None]) -> Callable[[Sequence[Any]], Run]:
    """The function making a Run of the values of COLUMNS, written out for ``decoded`` (the
    fields, each with its decoder) as dataclasses writes a class's __init__: a claim makes a Run
    of every row it takes, and a loop over the decoders cost a run a tenth more. It does what
    Run's generated __init__ does, without its object.__setattr__ per field (the class is
    frozen), as _batches.queued_run does for new runs."""
    env: dict[str, Any] = {"new": object.__new__, "Run": Run, "DEFAULTS": _DEFAULTS,
                           "FIELDS": FIELDS, "progress": progress}
    lines = ["def run(values):",
             "    run = new(Run)",
             "    fields = vars(run)",
             "    fields.update(DEFAULTS)",
             "    fields.update(zip(FIELDS, values, strict=False))"]   # but the last: progress_at
    for i, (name, decode) in enumerate(decoded):
        env[f"decode_{i}"] = decode
        lines.append(f"    fields[{name!r}] = decode_{i}(fields[{name!r}])")
    lines += ["    fields['progress'] = progress(fields['progress'], values[-1])",
              "    return run"]
    exec(compile("\n".join(lines), "<shoal.backends._runs>", "exec"), env)
    made: Callable[[Sequence[Any]], Run] = env["run"]
    return made
