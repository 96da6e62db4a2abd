"""An MCP server of Engram's tools: any MCP client (Claude Desktop, an IDE, an agent framework) gets memory.

    engram mcp                                   # stdio (what desktop clients launch)
    python -m engram_episodic.mcp_server         # the same
    engram mcp --transport streamable-http --port 8765   # http://127.0.0.1:8765/mcp

It serves the tools of `engram_episodic.tools` with the same names, descriptions and input schemas;
a result is its compact text (a text content block) plus the full JSON answer (structured content).
Two resources hold the same JSON as the tools: `engram://skills` (skill profiles per category) and
`engram://learning-curve`. Bad arguments come back as a tool error (`isError: true`) whose text and
structured content name every bad field (`{"error": "invalid_arguments", "errors": [{"field",
"reason"}]}`): the form the MCP specification prescribes for input errors, so the model sees them and
corrects its call. An unknown tool or resource is a JSON-RPC error (-32602, invalid params).

The server talks to the query service only over HTTP with `AsyncEngram` and an API key; it never
opens Redis, and the namespace is the key's. Configuration (flags win over the environment):
`--url` / ENGRAM_URL (default http://127.0.0.1:$ENGRAM_PORT, port 8080), `--api-key` / ENGRAM_API_KEY, and the default
scope `--agent-id` / ENGRAM_AGENT_ID, `--user-id` / ENGRAM_USER_ID, `--session-id` / ENGRAM_SESSION_ID
(used when the model passes none; see `engram_episodic.tools`), `--tools` (a comma-separated subset).
The streamable-http transport binds 127.0.0.1 (`--host`, `--port` 8765, `--path` /mcp) and refuses any
other address without `--allow-remote`: whoever reaches the endpoint uses the API key.

Needs the `mcp` package (`pip install './client[mcp]' (engram-episodic's mcp extra, from an Engram checkout)`); it is built on its low-level
`mcp.server.Server`, since the tool schemas are given (the high-level MCPServer derives them from
Python signatures).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from engram_episodic import __version__
from engram_episodic.client import AsyncEngram
from engram_episodic.errors import EngramError
from engram_episodic.tools import TOOL_NAMES, ToolResult, Toolset, ToolSpec, UnknownTool, error_result

try:
    import anyio
    import mcp.types as mt
    from mcp.server import Server
    from mcp.server.stdio import stdio_server
    from mcp.shared.exceptions import MCPError
except ImportError as exc:  # the `mcp` extra is not installed
    _MISSING: ImportError | None = exc
else:
    _MISSING = None

log = logging.getLogger("engram_episodic.mcp_server")

SERVER_NAME = "engram"
DEFAULT_HTTP_PORT = 8765
INSTRUCTIONS = (
    "Engram is your long-term episodic memory: past task attempts with their outcome, reward, strategy, "
    "solution and errors, shared by the agents of your team. At the start of a non-trivial task call "
    "get_context (a briefing) or suggest_approach (confidence, strategy, failures to avoid), or "
    "recall_experiences for a ranked list of past episodes. When a task ends, successful or not, call "
    "record_episode once with the outcome, a reward from 0 to 1, the solution or the error, and the main "
    "actions. search_facts gives lessons distilled from many episodes; get_skills and get_learning_curve "
    "show the track record."
)
# uri → (tool whose answer it serves, name, description)
RESOURCES: dict[str, tuple[str, str, str]] = {
    "engram://skills": (
        "get_skills",
        "skills",
        "Skill profile per task category (episodes, success rate, "
        "average reward and iterations) and the weak categories, as JSON.",
    ),
    "engram://learning-curve": (
        "get_learning_curve",
        "learning-curve",
        "Rolling success rate and average reward per completed episode, oldest first, as JSON.",
    ),
}
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


def _need_mcp() -> None:
    if _MISSING is not None:
        raise ImportError(
            "the Engram MCP server needs the mcp package: pip install './client[mcp]' (engram-episodic's mcp extra, from an Engram checkout) "
            f"({_MISSING})"
        ) from _MISSING


def mcp_tool(spec: ToolSpec) -> mt.Tool:
    """The MCP form of one tool: the same name, description and input schema, with behaviour hints."""
    _need_mcp()
    return mt.Tool(
        name=spec.name,
        title=spec.name.replace("_", " ").capitalize(),
        description=spec.description,
        input_schema=json.loads(json.dumps(spec.parameters)),
        annotations=mt.ToolAnnotations(
            read_only_hint=spec.read_only,
            destructive_hint=spec.destructive,
            idempotent_hint=spec.idempotent,
            open_world_hint=False,
        ),
    )


def call_result(result: ToolResult) -> mt.CallToolResult:
    """A ToolResult as an MCP tool result: its text as text content, its data as structured content."""
    _need_mcp()
    return mt.CallToolResult(
        content=[mt.TextContent(type="text", text=result.text)],
        structured_content=result.data,
        is_error=result.is_error,
    )


def build_server(toolset: Toolset) -> Server:
    """The MCP server (mcp.server.Server) of `toolset`, whose client must be an AsyncEngram.

    tools/list gives `toolset.tools`; tools/call runs `toolset.adispatch` (any Engram error is a tool
    error result, see the module docstring; an unknown tool is MCPError -32602); resources/list and
    resources/read serve RESOURCES. Raises ImportError without the mcp package.
    """
    _need_mcp()
    if not isinstance(toolset.client, AsyncEngram):
        raise TypeError("build_server needs a Toolset over an AsyncEngram client")
    listed = [mcp_tool(t) for t in toolset.tools]

    async def list_tools(ctx: Any, params: Any) -> mt.ListToolsResult:
        return mt.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: mt.CallToolRequestParams) -> mt.CallToolResult:
        try:
            result = await toolset.adispatch(params.name, params.arguments or {})
        except UnknownTool as exc:
            raise MCPError(
                INVALID_PARAMS, str(exc), {"tool": exc.name, "available": list(exc.available)}
            ) from exc
        except EngramError as exc:
            result = error_result(exc)
            log.info("tool %r failed: %s", params.name, result.data.get("error"))
        return call_result(result)

    served = {uri: v for uri, v in RESOURCES.items() if v[0] in toolset.names}

    async def list_resources(ctx: Any, params: Any) -> mt.ListResourcesResult:
        return mt.ListResourcesResult(
            resources=[
                mt.Resource(uri=uri, name=name, description=text, mime_type="application/json")
                for uri, (_, name, text) in served.items()
            ]
        )

    async def read_resource(ctx: Any, params: mt.ReadResourceRequestParams) -> mt.ReadResourceResult:
        uri = str(params.uri)
        if uri not in served:
            raise MCPError(
                INVALID_PARAMS,
                f"unknown resource {uri[:200]!r}; available: {', '.join(served)}",
                {"uri": uri},
            )
        try:
            result = await toolset.adispatch(served[uri][0], {})
        except EngramError as exc:
            raise MCPError(INTERNAL_ERROR, error_result(exc).text, {"uri": uri}) from exc
        return mt.ReadResourceResult(
            contents=[
                mt.TextResourceContents(
                    uri=uri, mime_type="application/json", text=json.dumps(result.data, ensure_ascii=False)
                )
            ]
        )

    return Server(
        SERVER_NAME,
        version=__version__,
        title="Engram episodic memory",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )


# --- running it ---------------------------------------------------------------------------------------
def parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command line of `engram mcp` / `python -m engram_episodic.mcp_server`."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Serve Engram's memory tools over MCP (stdio by "
        "default). Talks to the query service over HTTP with an API key.",
    )
    p.add_argument(
        "--url", help="query service URL (ENGRAM_URL; default http://127.0.0.1:$ENGRAM_PORT, port 8080)"
    )
    p.add_argument("--api-key", help="API key of the query service (ENGRAM_API_KEY)")
    p.add_argument("--agent-id", help="default agent_id when the model passes none (ENGRAM_AGENT_ID)")
    p.add_argument("--user-id", help="default user_id when the model passes none (ENGRAM_USER_ID)")
    p.add_argument("--session-id", help="session_id stamped on recorded episodes (ENGRAM_SESSION_ID)")
    p.add_argument(
        "--tools",
        help="comma-separated subset of the tools to serve (default: all of " + ", ".join(TOOL_NAMES) + ")",
    )
    p.add_argument("--transport", choices=("stdio", "streamable-http"), default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="streamable-http bind address (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_HTTP_PORT,
        help=f"streamable-http port (default {DEFAULT_HTTP_PORT})",
    )
    p.add_argument("--path", default="/mcp", help="streamable-http endpoint path (default /mcp)")
    p.add_argument(
        "--allow-remote", action="store_true", help="allow a streamable-http bind address other than loopback"
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="log level (stderr; default INFO)",
    )
    return p


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _settings(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    def pick(flag: str | None, var: str) -> str | None:
        return flag if flag is not None else (env.get(var) or None)

    names = [n.strip() for n in args.tools.split(",") if n.strip()] if args.tools else None
    return {
        # as the client and the CLI: a stack started with ENGRAM_PORT is found without ENGRAM_URL
        "url": pick(args.url, "ENGRAM_URL") or f"http://127.0.0.1:{env.get('ENGRAM_PORT') or '8080'}",
        "api_key": pick(args.api_key, "ENGRAM_API_KEY"),
        "scope": {
            "agent_id": pick(args.agent_id, "ENGRAM_AGENT_ID"),
            "user_id": pick(args.user_id, "ENGRAM_USER_ID"),
            "session_id": pick(args.session_id, "ENGRAM_SESSION_ID"),
        },
        "names": names,
    }


async def _serve(args: argparse.Namespace, client: AsyncEngram, toolset: Toolset, url: str) -> None:
    async with client:  # toolset.client, typed as the AsyncEngram it is here
        server = build_server(toolset)
        scope = ", ".join(f"{k}={v}" for k, v in toolset.scope.items() if v) or "no default scope"
        if args.transport == "stdio":
            log.info("Engram MCP server on stdio -> %s (%s; %d tools)", url, scope, len(toolset.tools))
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
            return
        import uvicorn

        app = server.streamable_http_app(streamable_http_path=args.path, host=args.host)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", lifespan="on")
        log.info(
            "Engram MCP server on http://%s:%d%s -> %s (%s; %d tools)",
            args.host,
            args.port,
            args.path,
            url,
            scope,
            len(toolset.tools),
        )
        await uvicorn.Server(config).serve()


def main(
    argv: Sequence[str] | None = None,
    *,
    prog: str | None = "engram mcp",
    env: Mapping[str, str] | None = None,
) -> int:
    """Run the MCP server until its client disconnects (stdio) or it is interrupted (streamable-http).

    `argv` are the arguments after the command (`["--transport", "streamable-http"]`); `env` defaults
    to os.environ. Returns the exit status: 0, or 2 for a usage error (printed to stderr: a bad URL,
    scope id or tool name, a non-loopback host without --allow-remote, the mcp package missing).
    """
    cli = parser(prog)
    args = cli.parse_args(argv)
    if _MISSING is not None:
        print(
            f"{cli.prog}: the MCP server needs the mcp package: pip install './client[mcp]' (engram-episodic's mcp extra, from an Engram checkout)",
            file=sys.stderr,
        )
        return 2
    settings = _settings(args, os.environ if env is None else env)
    if args.transport == "streamable-http":
        if not _is_loopback(args.host) and not args.allow_remote:
            cli.print_usage(sys.stderr)
            print(
                f"{cli.prog}: --host {args.host} is not loopback: anyone who reaches the endpoint uses the "
                "API key; pass --allow-remote to bind it anyway",
                file=sys.stderr,
            )
            return 2
        if not 0 < args.port < 65536:
            print(f"{cli.prog}: --port must be 1..65535, not {args.port}", file=sys.stderr)
            return 2
    try:  # fail before serving: a bad URL, scope id or tool name
        client = AsyncEngram(settings["url"], api_key=settings["api_key"])
        toolset = Toolset(client, names=settings["names"], **settings["scope"])
    except (ValueError, UnknownTool) as exc:
        print(f"{cli.prog}: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log.setLevel(args.log_level)
    if args.log_level != "DEBUG":
        for noisy in ("mcp", "httpx", "uvicorn"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(_serve, args, client, toolset, settings["url"])
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m engram_episodic.mcp_server"))
