"""The tool definitions come from one data file (engram_episodic/tools.json) and reach every provider
unchanged: tests/cases/tool_definitions.json holds the OpenAI (Chat Completions and Responses), Anthropic
and MCP forms of all 8 tools, and each form must equal it byte for byte (key order and number types
included, as a provider receives the JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engram_episodic.events import OUTCOMES
from engram_episodic.tools import FORMATS, RECORD, SUGGEST, TOOLS, tools
from engram_episodic.validation import MAX_ACTIONS, MAX_ID_CHARS, MAX_TAG_CHARS, MAX_TEXT_CHARS
from services.query.insights import STRATEGY_POOL
from services.query.models import MAX_QUERY_CHARS

DATA = json.loads(
    (Path(__file__).resolve().parents[2] / "client/engram_episodic/tools.json").read_text("utf-8")
)
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


def _strings(schema: dict, name: str = ""):
    """(argument name, string schema) for every string inside `schema`, through objects and lists."""
    if schema.get("type") == "string":
        yield name, schema
    for key, prop in schema.get("properties", {}).items():
        yield from _strings(prop, key)
    if "items" in schema:
        yield from _strings(schema["items"], name)


def test_the_data_file_states_the_validators_limits():
    """tools.json repeats limits of engram_episodic.validation as numbers; they must be the same."""
    tag_args = set(DATA["tag_arguments"])
    for tool in TOOLS:
        for name, schema in _strings(dict(tool.parameters)):
            if name == "outcome":
                assert schema["enum"] == list(OUTCOMES), tool.name
            elif "enum" in schema:  # recall modes, fact kinds: tests/unit/test_tools.py checks the service's
                continue
            elif name in tag_args:
                limit = MAX_ID_CHARS if name.endswith("_id") else MAX_TAG_CHARS
                assert schema["maxLength"] == limit, (tool.name, name)
            elif "format" not in schema:
                assert schema["maxLength"] in (MAX_TEXT_CHARS, MAX_QUERY_CHARS), (tool.name, name)
    assert RECORD.parameters["properties"]["actions"]["maxItems"] == MAX_ACTIONS
    for text in (RECORD.parameters["properties"]["strategy"]["description"], SUGGEST.description):
        assert ", ".join(STRATEGY_POOL) in text
