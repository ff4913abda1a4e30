"""Typing regressions fail here: ``mypy --strict`` over tests/typing. Every file of
tests/typing/ok must check clean (its ``assert_type`` lines pin what a type checker infers), and
every line of tests/typing/bad marked ``# E: code`` must get an error with that code, and no
unmarked line any: a misuse that mypy stopped refusing is as much a regression as a false
alarm."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TYPING = ROOT / "tests" / "typing"
EXPECT = re.compile(r"#\s*E:\s*([\w-]+)\s*$")
ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*?\s+\[(?P<code>[\w-]+)\]$")


def _expected(path: Path) -> dict[int, str]:
    return {i: m.group(1) for i, line in enumerate(path.read_text().splitlines(), 1)
            if (m := EXPECT.search(line))}


@pytest.fixture(scope="module")
def errors() -> dict[tuple[str, int], list[str]]:
    """mypy's errors over tests/typing, by (file name, line): their codes."""
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--hide-error-context",
         "--show-error-codes", "--no-pretty", str(TYPING / "ok"), *sorted(
             str(p) for p in (TYPING / "bad").glob("*.py"))],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    if proc.returncode not in (0, 1) or proc.stderr.strip():
        pytest.fail(f"mypy did not run: exit {proc.returncode}\n{proc.stderr}{proc.stdout}")
    found: dict[tuple[str, int], list[str]] = {}
    for line in proc.stdout.splitlines():
        m = ERROR.match(line)
        if m is not None:
            key = (str(Path(m["path"]).resolve().relative_to(TYPING)), int(m["line"]))
            found.setdefault(key, []).append(m["code"])
    return found


def test_the_ok_files_check_clean(errors: dict[tuple[str, int], list[str]]) -> None:
    wrong = {k: v for k, v in errors.items() if k[0].startswith("ok/")}
    assert not wrong, f"mypy --strict refuses typed code it should accept: {wrong}"


@pytest.mark.parametrize("name", sorted(p.name for p in (TYPING / "bad").glob("*.py")))
def test_each_misuse_is_an_error(name: str, errors: dict[tuple[str, int], list[str]]) -> None:
    path = TYPING / "bad" / name
    expected = _expected(path)
    assert expected, f"tests/typing/bad/{name} marks no line '# E: code'"
    got = {line: codes for (file, line), codes in errors.items() if file == f"bad/{name}"}
    missed = {line: code for line, code in expected.items() if code not in got.get(line, [])}
    extra = {line: codes for line, codes in got.items() if line not in expected}
    assert not missed, f"{name}: these misuses are no longer errors (line: code): {missed}; " \
                       f"mypy said {got}"
    assert not extra, f"{name}: errors on lines not marked '# E: code': {extra}"
