"""docs/ builds as a site: `mkdocs build --strict` with the repository's mkdocs.yml passes.

Strict mode fails on every warning, and mkdocs.yml turns into warnings a link to a page that does
not exist, a link to a heading that does not exist, a link outside docs/, and a page of docs/
missing from the navigation. The last tests show that each of these does fail a build of that
configuration, and that the navigation lists the pages in the order docs/index.md links them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mkdocs.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "mkdocs.yml"
TIMEOUT = 180.0   # a guard against a hung build; a build takes a few seconds
LINK = re.compile(r"\]\(([\w-]+\.md)(?:#[^)]*)?\)")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}   # Material's banner, not a build warning
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    proc = _build(CONFIG, tmp_path / "site")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "WARNING" not in log, f"mkdocs build --strict failed:\n{log}"
    assert (tmp_path / "site" / "quickstart" / "index.html").is_file()


def _pages(nav: Any) -> list[str]:
    """The Markdown files of a mkdocs navigation, in order."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in _pages(value)]
    return [p for item in nav for p in _pages(item)]


def test_the_navigation_mirrors_the_index() -> None:
    text = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    linked = list(dict.fromkeys(LINK.findall(text)))   # agents.md is linked twice
    nav = _pages(load_config(str(CONFIG))["nav"])
    assert nav == ["index.md", *linked], (
        "mkdocs.yml's nav lists docs/index.md, then the pages in the order docs/index.md links them"
    )


BROKEN = {
    "a link to a missing page": ("See [there](missing.md).\n", ["index.md", "other.md"]),
    "a link to a missing heading": ("See [there](other.md#no-such-heading).\n",
                                    ["index.md", "other.md"]),
    "a page missing from the navigation": ("See [there](other.md).\n", ["index.md"]),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_a_broken_page_fails_the_build(case: str, tmp_path: Path) -> None:
    index, nav = BROKEN[case]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(f"# Index\n\n{index}", encoding="utf-8")
    (docs / "other.md").write_text("# Other\n\n## A heading\n", encoding="utf-8")
    config = tmp_path / "mkdocs.yml"
    # the repository's configuration (its validation and Markdown settings), on these pages
    config.write_text(
        f"INHERIT: {CONFIG}\ndocs_dir: {docs}\nnav: {nav}\n", encoding="utf-8")
    proc = _build(config, tmp_path / "site")
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "WARNING" in log, f"{case} did not fail the build:\n{log}"
    # and the same pages without the fault build
    (docs / "index.md").write_text("# Index\n\nSee [there](other.md#a-heading).\n",
                                   encoding="utf-8")
    config.write_text(f"INHERIT: {CONFIG}\ndocs_dir: {docs}\nnav: [index.md, other.md]\n",
                      encoding="utf-8")
    proc = _build(config, tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
