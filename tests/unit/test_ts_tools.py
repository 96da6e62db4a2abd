"""The TypeScript client's tool definitions (client-ts/src/tools.ts) are generated from the data file the
Python tools read (client/engram_episodic/tools.json): one source of names, descriptions and argument
rules for both."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from engram_episodic.tools import ToolArgumentError, check_arguments, get_tool

SCRIPT = Path(__file__).resolve().parents[2] / "client-ts" / "scripts" / "gen_tools.py"


def test_typescript_tool_definitions_are_current():
    spec = importlib.util.spec_from_file_location("gen_tools", SCRIPT)
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.TARGET.read_text(encoding="utf-8") == gen.render(), (
        "client-ts/src/tools.ts is stale: run `.venv/bin/python client-ts/scripts/gen_tools.py`"
    )


CASES = json.loads((Path(__file__).resolve().parents[1] / "cases" / "tool_arguments.json").read_text("utf-8"))


@pytest.mark.parametrize("case", CASES["cases"], ids=lambda c: f"{c['tool']}:{sorted(c['arguments'])}")
def test_tool_argument_case_with_the_python_tools(case):
    """The Python half of tests/cases/tool_arguments.json (client-ts/test/tools.test.ts runs the same)."""
    spec = get_tool(case["tool"])
    try:
        check_arguments(spec, case["arguments"])
    except ToolArgumentError as exc:
        assert sorted({field for field, _ in exc.errors}) == sorted(case["fields"]), exc.errors
    else:
        assert case["fields"] == [], "accepted"
