"""Engram's tool set as OpenAI Agents SDK function tools (`agents.FunctionTool`): one per entry of
`engram_episodic.tools.TOOLS`, run by `adispatch`. Usage and why `strict_schema` makes the optional
arguments nullable: docs/integrations.md, "OpenAI Agents SDK".
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Literal

try:
    from agents import FunctionTool
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "engram_episodic.adapters.openai_agents needs the OpenAI Agents SDK: "
        "pip install './client[openai-agents]' (engram-episodic's openai-agents extra, from an Engram checkout)"
    ) from exc

from engram_episodic.adapters._common import Clients, tool_clients
from engram_episodic.client import AsyncEngram, Engram
from engram_episodic.tools import ToolSpec

__all__ = ["engram_function_tools", "strict_schema"]

# What OpenAI's strict mode accepts in a schema node (Structured Outputs, "supported schemas"); any
# other keyword is dropped by strict_schema. Formats outside STRICT_FORMATS are dropped too.
STRICT_KEYWORDS = frozenset(
    {
        "type",
        "description",
        "title",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "anyOf",
        "$ref",
        "$defs",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
    }
)
STRICT_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if isinstance(kind, str) and "enum" not in schema and "const" not in schema:
        return {**schema, "type": [kind, "null"]}
    if isinstance(kind, list) and "enum" not in schema:
        return schema if "null" in kind else {**schema, "type": [*kind, "null"]}
    outer: dict[str, Any] = {k: schema[k] for k in ("description", "title") if k in schema}
    inner = {k: v for k, v in schema.items() if k not in outer}
    return {**outer, "anyOf": [inner, {"type": "null"}]}


def _strict(schema: Mapping[str, Any], path: str) -> dict[str, Any]:
    out = {k: copy.deepcopy(v) for k, v in schema.items() if k in STRICT_KEYWORDS}
    if "format" in out and out["format"] not in STRICT_FORMATS:
        del out["format"]
    kind = out.get("type")
    if kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in out:
        if out.get("additionalProperties", False) is not False:
            raise ValueError(f"{path or 'the root'}: an object open to any property has no strict form")
        properties = out.get("properties") or {}
        required = set(out.get("required") or ())
        out["properties"] = {
            name: (
                _strict(prop, f"{path}.{name}".lstrip("."))
                if name in required
                else _nullable(_strict(prop, f"{path}.{name}".lstrip(".")))
            )
            for name, prop in properties.items()
        }
        out["required"] = list(properties)
        out["additionalProperties"] = False
    if isinstance(out.get("items"), Mapping):
        out["items"] = _strict(out["items"], f"{path}[]")
    if isinstance(out.get("anyOf"), list):
        out["anyOf"] = [_strict(s, path) for s in out["anyOf"]]
    return out


def strict_schema(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A tool's JSON Schema in the form OpenAI's strict mode accepts, meaning the same calls.

    Every object's properties are all required and the ones that were optional become nullable
    (`{"type": ["integer", "null"]}`, or `anyOf [..., {"type": "null"}]` for enums); unsupported keywords
    are dropped (`STRICT_KEYWORDS`). Raises ValueError for an object that allows undeclared
    properties (strict mode cannot express it). Pure; the input is not modified.
    """
    return _strict(parameters, "")


def _function_tool(
    spec: ToolSpec, clients: Clients, strict: bool, errors: Literal["result", "raise"]
) -> FunctionTool:
    async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> str:
        return (await clients.adispatch(spec.name, arguments, errors)).text

    params = strict_schema(spec.parameters) if strict else copy.deepcopy(dict(spec.parameters))
    return FunctionTool(
        name=spec.name,
        description=spec.description,
        params_json_schema=params,
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=strict,
    )


def engram_function_tools(
    client: Engram | AsyncEngram,
    *,
    async_client: AsyncEngram | None = None,
    names: Iterable[str] | None = None,
    strict: bool = True,
    errors: Literal["result", "raise"] = "result",
    **default_scope: str,
) -> list[FunctionTool]:
    """OpenAI Agents SDK function tools for Engram's tool set (all of `engram_episodic.tools.TOOLS`, or `names`).

    `client` is an `AsyncEngram` (native) or an `Engram` (run in a worker thread; `async_client` adds an
    AsyncEngram to an Engram). `default_scope` binds `agent_id`, `user_id` and `session_id` as
    `engram_episodic.tools.Toolset` does: used whenever the model passes none (a bound `session_id`
    only stamps recorded episodes). `strict` selects the strict schemas of `strict_schema` (default) or
    the tools' own with `strict_json_schema=False`. With `errors="result"` (default) an Engram error
    (bad arguments, service refused or unreachable) is returned to the model as text saying what to
    do; `errors="raise"` raises it, which fails the run. Raises TypeError for a bad client or scope key,
    ValueError for a bad scope id, `UnknownTool` for a name that is not a tool.
    """
    clients, specs = tool_clients(client, async_client, names, errors, default_scope, "engram_function_tools")
    return [_function_tool(spec, clients, strict, errors) for spec in specs]
