"""docs/architecture.md's Layout block names every module of the tree (a new module must be placed)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("client/engram_episodic", "services", "shared", "deploy", "bench")


def _layout() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = text.index("client/                 the `engram-episodic` distribution")
    return text[start : text.index("```", start)]


def test_the_layout_names_every_module():
    named = set(re.findall(r"[\w.]+\.(?:py|yml|conf)|Dockerfile", _layout()))
    files = {
        p.name
        for top in TOPS
        for p in (ROOT / top).rglob("*")
        if p.is_file()
        and (p.suffix in {".py", ".yml", ".conf"} or p.name == "Dockerfile")
        and p.name != "__init__.py"
        and "build" not in p.parts
        and "__pycache__" not in p.parts
    }
    missing = sorted(files - named)
    assert not missing, f"docs/architecture.md, Layout: not named: {missing}"
