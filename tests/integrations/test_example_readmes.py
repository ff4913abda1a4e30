"""The examples' READMEs, followed literally: the shoal commands they give (``shoal dispatch``,
``pauses``, ``ledger``…) reach the store and the namespace of the app the README serves, through
the ``SHOAL_STORE`` and ``SHOAL_NAMESPACE`` it exports (the CLI's own default, ``shoal.db``, is a
store no worker of the example reads)."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(("example", "module"), [("openai_agent", "support_agent"),
                                                 ("langgraph_agent", "agent")])
def test_the_readme_points_its_commands_at_the_apps_store(
        example: str, module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (EXAMPLES / example / "README.md").read_text(encoding="utf-8")
    assert re.search(r"^shoal (dispatch|pauses|approve)", readme, re.M), "no shoal command"
    exported = dict(re.findall(r"^export (SHOAL_STORE|SHOAL_NAMESPACE)=(\S+)", readme, re.M))
    for name in ("SHOAL_STORE", "SHOAL_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)   # the app as a fresh shell builds it
    monkeypatch.syspath_prepend(str(EXAMPLES / example))
    monkeypatch.delitem(sys.modules, module, raising=False)
    app = importlib.import_module(module).app
    sys.modules.pop(module, None)
    assert exported.get("SHOAL_STORE") == app.store.url, exported
    assert exported.get("SHOAL_NAMESPACE") == app.namespace, exported
