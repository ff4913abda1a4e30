"""Importing shoal (the App, the clients, the console) imports no web framework: each
integration's framework is imported with its module only."""

from __future__ import annotations

import subprocess
import sys

FRAMEWORKS = ("django", "flask", "fastapi")


def _imported(code: str) -> set[str]:
    probe = (f"import sys\n{code}\n"
             f"print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}} & "
             f"{set(FRAMEWORKS)!r})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_core_imports_no_framework() -> None:
    assert _imported("import shoal, shoal.app.client, shoal.web, shoal.integrations") == set()


def test_each_integration_imports_its_own() -> None:
    assert _imported("import shoal.integrations.flask") == {"flask"}
    assert _imported("import shoal.integrations.django") == {"django"}
