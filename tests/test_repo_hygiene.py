"""The tree holds no leftovers of a merge: no conflict markers in any tracked text file."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKERS = ("<<<<<<< ", ">>>>>>> ", "||||||| ")


def test_no_tracked_file_holds_a_merge_conflict_marker() -> None:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    found = []
    for name in filter(None, listed):
        path = ROOT / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue   # binary (images)
        for number, line in enumerate(text.splitlines(), 1):
            if line.startswith(MARKERS):
                found.append(f"{name}:{number}: {line[:40]}")
    assert not found, "merge conflict markers left in:\n" + "\n".join(found)
