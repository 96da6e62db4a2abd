"""The tool definitions come from one data file (engram_episodic/tools.json) and reach every provider
unchanged: tests/cases/tool_definitions.json holds the OpenAI (Chat Completions and Responses), Anthropic
and MCP forms of all 8 tools, and each form must equal it byte for byte (key order and number types
included, as a provider receives the JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engram_episodic.tools import FORMATS, TOOLS, tools

EXPECTED = json.loads(
    (Path(__file__).resolve().parents[1] / "cases" / "tool_definitions.json").read_text("utf-8")
)


def _text(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


@pytest.mark.parametrize("format", FORMATS)
def test_provider_definitions_are_unchanged(format):
    assert _text(tools(format)) == _text(EXPECTED[format])


def test_mcp_definitions_are_unchanged():
    pytest.importorskip("mcp")
    from engram_episodic.mcp_server import mcp_tool

    listed = [mcp_tool(t).model_dump(mode="json", by_alias=True, exclude_none=True) for t in TOOLS]
    assert _text(listed) == _text(EXPECTED["mcp"])
