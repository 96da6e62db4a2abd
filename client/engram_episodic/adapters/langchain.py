"""Engram's tool set as LangChain tools (`StructuredTool`), sync and async: one per entry of
`engram_episodic.tools.TOOLS`, its JSON Schema as `args_schema`, run by `dispatch` / `adispatch` with
`response_format="content_and_artifact"` (compact text as `content`, full JSON as `artifact`). Usage:
docs/integrations.md, "LangChain tools".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

try:
    from langchain_core.tools import BaseTool, StructuredTool, ToolException
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "engram_episodic.adapters.langchain needs langchain-core: "
        "pip install './client[langchain]' (engram-episodic's langchain extra, from an Engram checkout)"
    ) from exc

from engram_episodic.adapters._common import Clients, tool_clients
from engram_episodic.client import AsyncEngram, Engram
from engram_episodic.tools import ToolResult, ToolSpec

__all__ = ["engram_tools"]


def _tool(spec: ToolSpec, clients: Clients, errors: Literal["result", "raise"]) -> StructuredTool:
    def answer(result: ToolResult) -> tuple[str, dict[str, Any]]:
        if result.is_error:  # handle_tool_error=True makes it the tool's output (status="error")
            raise ToolException(result.text)
        return result.text, result.data

    def run(**arguments: Any) -> tuple[str, dict[str, Any]]:
        return answer(clients.dispatch(spec.name, arguments, errors))

    async def arun(**arguments: Any) -> tuple[str, dict[str, Any]]:
        return answer(await clients.adispatch(spec.name, arguments, errors))

    return StructuredTool(
        name=spec.name,
        description=spec.description,
        args_schema=dict(spec.parameters),
        func=run,
        coroutine=arun,
        response_format="content_and_artifact",
        handle_tool_error=errors == "result",
        metadata={
            "engram": True,
            "read_only": spec.read_only,
            "destructive": spec.destructive,
            "idempotent": spec.idempotent,
        },
    )


def engram_tools(
    client: Engram | AsyncEngram,
    *,
    async_client: AsyncEngram | None = None,
    names: Iterable[str] | None = None,
    errors: Literal["result", "raise"] = "result",
    **default_scope: str,
) -> list[BaseTool]:
    """LangChain tools for Engram's tool set (all of `engram_episodic.tools.TOOLS`, or `names`).

    `client` is an `Engram` (sync `invoke`; `ainvoke` runs it in a worker thread) or an `AsyncEngram`
    (`ainvoke` only); pass both as `client=Engram(...)`, `async_client=AsyncEngram(...)` for native
    sync and async. `default_scope` binds `agent_id`, `user_id` and `session_id` as `Toolset` does:
    used whenever the model passes none (a bound `session_id` only stamps recorded episodes).

    Each tool returns `(text, data)` (`response_format="content_and_artifact"`): invoked with a model's
    tool call it gives a `ToolMessage` whose `content` is the text and `artifact` the JSON; invoked
    with a plain dict it gives the text. With `errors="result"` (default) an Engram error (bad
    arguments, service refused or unreachable) becomes the tool's output, a `ToolMessage` with
    `status="error"` telling the model what to fix; `errors="raise"` raises it instead
    (`engram_episodic.tools.ToolArgumentError`, `ConnectionFailed`, ...). Raises TypeError for a bad
    client or scope key, ValueError for a bad scope id, `UnknownTool` for a name that is not a tool.
    """
    clients, specs = tool_clients(client, async_client, names, errors, default_scope, "engram_tools")
    return [_tool(spec, clients, errors) for spec in specs]
