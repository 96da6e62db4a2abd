"""The repository speaks of the product, never of how its work was organised (pure: reads tracked files).

Code, tests, test names, docs and the CHANGELOG say what Engram does and why. Who found a fault, in
which round of work or under which tracker number is the commit history's business, not the tree's.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORDS = re.compile(
    r"helper-\d+|\btrials?\b|\bnew[- ]user\b|\bfresh user\b|\bissue[ -]?#?\d+|\bother engineers\b"
    r"|\bbefore-stop\b|\bwork session|\bsession \d+\b|\bround \d+ of (?:the )?work",
    re.IGNORECASE,
)
SKIPPED = {"tests/unit/test_record_words.py"}  # this file names the words it looks for
TEXT = {".py", ".md", ".yml", ".yaml", ".toml", ".txt", ".cfg", ".conf", ".sh", ".json", ""}


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines() if line and line not in SKIPPED]


def test_no_file_speaks_of_how_the_work_was_organised():
    found = []
    for path in _tracked():
        if path.suffix not in TEXT or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if WORDS.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not found, f"{len(found)} line(s):\n" + "\n".join(found[:60])


def test_no_test_is_named_after_a_tracker_or_round_of_work():
    names = re.compile(r"def (test_c\d\d_\w+|test_\w*trial\w*)|(\w*trials?\w*\.py)")
    found = [
        f"{p.relative_to(ROOT)}: {m.group(0)}"
        for p in _tracked()
        if p.suffix == ".py" and p.parts[len(ROOT.parts)] == "tests"
        for m in names.finditer(p.name + "\n" + p.read_text(encoding="utf-8"))
    ]
    assert not found, "\n".join(found)
