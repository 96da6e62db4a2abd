"""The TypeScript client's tool definitions (client-ts/src/tools.ts) are generated from the Python ones
(`engram_episodic.tools.TOOLS`): one source of names, descriptions and argument rules for both."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "client-ts" / "scripts" / "gen_tools.py"


def test_typescript_tool_definitions_are_current():
    spec = importlib.util.spec_from_file_location("gen_tools", SCRIPT)
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.TARGET.read_text(encoding="utf-8") == gen.render(), (
        "client-ts/src/tools.ts is stale: run `PYTHONPATH=client .venv/bin/python client-ts/scripts/gen_tools.py`"
    )
