"""shoal's integrations go through public seams only: what ours do, one written outside shoal
could do too (``ctx.extension``, docs/integrations-api.md).

Every module under ``shoal.integrations`` is read (not imported: each needs its extra), and
each use of a private attribute of another object (``ctx._x``, ``Saver._for_run``,
``getattr(x, "_y")``) is a failure; an object's own (``self._x``, ``cls._x``) is not. The same
holds for a provider's calls: ``ProviderCall`` uses nothing private of its ``Provider``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path
from typing import Any

import shoal
import shoal.integrations
from shoal.coord import provider

OWN = {"self", "cls"}
REFLECTION = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object's own attributes."""
    if isinstance(node, ast.Name):
        return node.id in OWN
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "super")


def reach_throughs(source: str) -> list[str]:
    """Each place in ``source`` that uses a private attribute of another object, as
    ``line: code``."""
    found = [f"{node.lineno}: {ast.unparse(node)}" for node in ast.walk(ast.parse(source))
             if _attribute(node) or _reflected(node)]
    return sorted(found, key=lambda line: int(line.split(":")[0]))


def _attribute(node: ast.AST) -> bool:
    """``x._name`` of another object ``x``."""
    return isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value)


def _reflected(node: ast.AST) -> bool:
    """``getattr(x, "_name")`` (or setattr, hasattr, delattr) of another object ``x``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in REFLECTION and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            and _private(node.args[1].value) and not _own(node.args[0]))


def test_the_check_finds_a_private_attribute_of_another_object() -> None:
    source = textwrap.dedent("""
        def f(ctx, self):
            self._mine = ctx.run_id          # its own: allowed
            super()._setup()                 # its own: allowed
            ctx.__class__                    # a dunder: public
            x = ctx._x                       # another object's
            getattr(ctx, "_host")            # the same, by reflection
            return Saver._for_run(x)         # a class's private member
    """)
    assert reach_throughs(source) == [
        "6: ctx._x", "7: getattr(ctx, '_host')", "8: Saver._for_run"]


def test_no_integration_touches_a_private_attribute_of_another_object() -> None:
    root = Path(shoal.integrations.__file__).parent
    modules = sorted(root.rglob("*.py"))
    assert any(m.name == "graphs.py" for m in modules)   # the walk reaches the subpackages
    found = {str(m.relative_to(root)): reach_throughs(m.read_text(encoding="utf-8"))
             for m in modules}
    assert {m: f for m, f in found.items() if f} == {}, (
        "an integration uses private members of shoal objects: use the public seams "
        "(ctx.extension, docs/integrations-api.md) or add one")


def private_imports(source: str) -> list[str]:
    """Each import in ``source`` of a private module of shoal outside ``shoal.integrations``
    (``from shoal import _json``, ``import shoal._usercode``, ``from shoal._json import x``),
    as ``line: module``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            names = [f"{node.module}.{a.name}" for a in node.names]
            found += [f"{node.lineno}: {n}" for n in [node.module, *names] if _outside(n)]
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: {a.name}" for a in node.names if _outside(a.name)]
    return sorted(set(found), key=lambda line: (int(line.split(":")[0]), line))


def _outside(module: str) -> bool:
    """A private module of shoal that is not one of the integrations' own."""
    parts = module.split(".")
    return (parts[0] == "shoal" and parts[1:2] != ["integrations"]
            and any(_private(p) for p in parts[1:]))


def test_the_check_finds_an_import_of_a_private_module() -> None:
    source = textwrap.dedent("""
        import shoal
        from shoal import _json, errors                    # _json: private
        from shoal.integrations._commands import serve     # the integrations' own: allowed
        import shoal._usercode                             # private
        from shoal._json import checked                    # private
        from shoal.integrations.base import json_value     # public
    """)
    assert private_imports(source) == [
        "3: shoal._json", "5: shoal._usercode", "6: shoal._json", "6: shoal._json.checked"]


def test_no_integration_imports_a_private_module_of_shoal() -> None:
    root = Path(shoal.integrations.__file__).parent
    found = {str(m.relative_to(root)): private_imports(m.read_text(encoding="utf-8"))
             for m in sorted(root.rglob("*.py")) if m.name != "base.py"}
    assert {m: f for m, f in found.items() if f} == {}, (
        "an integration imports a private module of shoal: use shoal.integrations.base "
        "(json_value, add_user_code_hooks) or add a seam there")


def test_a_provider_call_uses_nothing_private_of_its_provider() -> None:
    source = textwrap.dedent(inspect.getsource(provider.ProviderCall))
    assert reach_throughs(source) == []


# -- what ctx.extension says of a run ----------------------------------------------------------

async def test_the_extension_names_the_run_its_claim_clock_and_store() -> None:
    from shoal.backends.memory import MemoryStore
    from shoal.integrations.base import RunExtension
    from shoal.ports import GraphCheckpoints
    from shoal.testing import VirtualClock

    clock = VirtualClock()
    store = MemoryStore()
    app = shoal.App("seams", store=store, clock=clock, instance_id="i1")
    seen: dict[str, Any] = {}

    @app.workflow
    async def wf(ctx: shoal.RunContext, input: None) -> None:
        ext = ctx.extension
        assert isinstance(ext, RunExtension) and ctx.extension is ext   # one per execution
        seen.update(namespace=ext.namespace, fence=ext.fence, run_id=ctx.run_id,
                    epoch=ctx.lease_epoch, clock=ext.clock, store=ext.store,
                    replaying=ext.replaying, graph=ext.recorded_graph_checkpoints)

    async with app:
        run = await app.dispatch(wf)
        await app.result(run.id, timeout=30)
    assert seen["namespace"] == "seams"
    fence = seen["fence"]
    assert (fence.run_id, fence.epoch) == (seen["run_id"], seen["epoch"])
    assert fence.owner.startswith("i1")
    assert seen["clock"] is clock
    assert isinstance(seen["store"], GraphCheckpoints)
    assert seen["replaying"] is False and seen["graph"] is None
