"""Every ```python block of docs/*.md is a complete program: each one runs in a fresh process.

Blocks fenced ```python-norun (a worker that serves forever, a fragment) and ```bash are shown, not
run. A block runs with the test's interpreter in an empty temporary directory, without the caller's
SHOAL_* variables, and must exit 0.

A block that reads DATABASE_URL needs PostgreSQL: it gets SHOAL_TEST_POSTGRES (default
postgresql://postgres@127.0.0.1:5432/test) there, and makes and drops a schema of its own. Without
a reachable server it is skipped, except under CI, where it fails.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from shoal.stores import mask_url

DOCS = Path(__file__).resolve().parent.parent / "docs"
# a guard against a hung example, not a speed check: the longest are cron.md's two virtual
# days on SQLite and testing.md's first example (two days and an hour), 8-9 s each on a
# loaded 2-core machine: an app's loops wake ~70,000 times a virtual day, each wake-up a
# pass over the store (VirtualClock.advance settles only while something runs; at 50 turns a
# wake-up they took 22-30 s: bench/clock.py)
TIMEOUT = 120.0
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)\s*$")
LANGUAGES = {"python", "python-norun", "bash", "text"}
POSTGRES = os.environ.get("SHOAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

# Examples that fail because of a known bug in shoal: (page, a line of the block, reason). Matched
# by content, not by line number, so that editing a page does not move the mark.
KNOWN_BUGS: list[tuple[str, str, str]] = []


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, with the line of their opening fence."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence, lang = m.groups()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not (
            lines[i].strip().startswith(fence[0] * len(fence))
            and lines[i].strip().strip(fence[0]) == ""
        ):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        found.append(Block(path.name, start, lang, "\n".join(body) + "\n"))
        i += 1
    return found


PAGES = sorted(DOCS.glob("*.md"))
RUNNABLE = [b for page in PAGES for b in blocks(page) if b.lang == "python"]


def test_docs_exist() -> None:
    names = {p.name for p in PAGES}
    for name in ("index.md", "quickstart.md", "workflows.md", "leases.md", "sqlite.md"):
        assert name in names, f"docs/{name} is missing"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_has_a_runnable_example(page: Path) -> None:
    assert any(b.lang == "python" for b in blocks(page)), (
        f"docs/{page.name} has no ```python block: each page shows at least one example that runs"
    )


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_blocks_are_marked(page: Path) -> None:
    for b in blocks(page):
        assert b.lang in LANGUAGES, (
            f"docs/{b.id}: fence language {b.lang!r}; use python (run by this test), "
            f"python-norun, bash or text"
        )
        if b.lang == "python":
            assert "asyncio.run(" in b.code and "assert " in b.code, (
                f"docs/{b.id}: a python block is a complete program that checks what it shows"
            )


def test_known_bugs_match_a_block() -> None:
    for page, line, _ in KNOWN_BUGS:
        assert any(b.page == page and line in b.code for b in RUNNABLE), (page, line)


def _params() -> list[object]:
    out: list[object] = []
    for b in RUNNABLE:
        reasons = [r for page, line, r in KNOWN_BUGS if page == b.page and line in b.code]
        marks = [pytest.mark.xfail(reason=r, strict=True) for r in reasons]
        out.append(pytest.param(b, id=b.id, marks=marks))
    return out


@functools.cache
def _postgres_unreachable() -> str | None:
    """Why the PostgreSQL server for the examples cannot be used, or None when it can."""
    try:
        import psycopg

        with psycopg.connect(POSTGRES, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as e:
        return " ".join(str(e).split()) or type(e).__name__
    return None


@pytest.mark.parametrize("block", _params())
def test_example_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env.pop("DATABASE_URL", None)
    if "DATABASE_URL" in block.code:
        reason = _postgres_unreachable()
        if reason is not None:
            message = (f"docs/{block.id} needs PostgreSQL at {mask_url(POSTGRES)} ({reason}); "
                       f"set SHOAL_TEST_POSTGRES to a server where it may create a schema")
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        env["DATABASE_URL"] = POSTGRES
    try:
        proc = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
            text=True, timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"docs/{block.id} did not finish in {TIMEOUT:.0f}s\n{e.stderr or ''}")
    assert proc.returncode == 0, (
        f"docs/{block.id} exited {proc.returncode}\n--- stdout\n{proc.stdout}"
        f"\n--- stderr\n{proc.stderr}"
    )
