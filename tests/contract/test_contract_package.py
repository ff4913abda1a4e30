"""``shoal.testing.contract`` holds a backend to the ports alone: its modules import the records,
the ports, the errors and the id helpers (the differential suites also the memory backend, their
reference), never an app, the engine, the coordination layer or the command line, nor
``shoal.testing`` itself (which builds apps for ``cluster``). Read from the source, since
importing any ``shoal`` module runs ``shoal/__init__.py``, which imports the app."""

from __future__ import annotations

import ast
from pathlib import Path

import shoal.testing.contract

PACKAGE = Path(shoal.testing.contract.__file__).parent
ALLOWED = {"shoal.types", "shoal.ports", "shoal.errors", "shoal._ids", "shoal._json",
           "shoal.testing.clock"}
REFERENCE = "shoal.backends.memory"


def shoal_imports(path: Path) -> set[str]:
    """The ``shoal`` modules a source file imports (``from shoal import _ids`` counts as
    ``shoal._ids``), at any depth of the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            if node.module == "shoal":
                found.update(f"shoal.{alias.name}" for alias in node.names)
            else:
                found.add(node.module)
    return {name for name in found if name == "shoal" or name.startswith("shoal.")}


def test_the_contract_imports_only_the_ports_and_records() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert {m.name for m in modules} >= {"__init__.py", "support.py", "runs.py", "pauses.py",
                                         "trees.py", "outbox.py", "coordination.py", "rates.py",
                                         "differential.py"}
    for module in modules:
        allowed = ALLOWED | {REFERENCE} if module.name == "differential.py" else ALLOWED
        wrong = {name for name in shoal_imports(module)
                 if name not in allowed and not name.startswith("shoal.testing.contract.")}
        assert not wrong, f"{module.name} imports {sorted(wrong)}"


def test_the_old_module_paths_still_name_the_suites() -> None:
    from shoal.testing.coord_contract import CoordContract
    from shoal.testing.rate_contract import RateContract

    assert CoordContract is shoal.testing.contract.CoordContract
    assert RateContract is shoal.testing.contract.RateContract
    store = shoal.testing.contract.StoreContract
    for suite in ("RunContract", "PauseContract", "TreeContract", "OutboxContract"):
        assert issubclass(store, getattr(shoal.testing.contract, suite)), suite
