"""An MCP server of Engram's tools (`engram mcp`, `python -m engram_episodic.mcp_server`).

It serves the tools of `engram_episodic.tools` and two resources (`RESOURCES`) over stdio or streamable
HTTP, talking to the query service only over HTTP with `AsyncEngram` (the namespace is the API key's).
Flags, environment, the error forms and the transports: docs/integrations.md, "MCP". Needs the `mcp`
extra; built on the low-level `mcp.server.Server`, since the tool schemas are given (the high-level
server derives them from Python signatures).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import click

from engram_episodic import __version__
from engram_episodic.cli_common import service_options
from engram_episodic.client import AsyncEngram
from engram_episodic.errors import EngramError
from engram_episodic.tools import TOOL_NAMES, Toolset, ToolSpec, UnknownTool, error_result
from engram_episodic.validation import is_loopback

try:
    import anyio
    import mcp.types as mt
    from mcp.server import Server
    from mcp.shared.exceptions import MCPError
    from mcp.shared.message import SessionMessage
    from pydantic import ValidationError
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
MAX_MESSAGE_DEPTH = 64
"""The deepest nesting of a JSON-RPC message the stdio server reads: the envelope takes 4 levels, a tool's
arguments at most 33 (`context` and `metadata` nest at most 32); deeper is an invalid request."""


MISSING_MCP = (
    "the MCP server needs the mcp package: pip install './client[mcp]' (engram-episodic's mcp extra, "
    "from an Engram checkout)"
)


def mcp_tool(spec: ToolSpec) -> mt.Tool:
    """The MCP form of one tool: the same name, description and input schema, with behaviour hints."""
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


def build_server(toolset: Toolset) -> Server:
    """The MCP server (mcp.server.Server) of `toolset`, whose client must be an AsyncEngram.

    tools/list gives `toolset.tools`; tools/call runs `toolset.adispatch` (any Engram error is a tool
    error result, `error_result`; an unknown tool is MCPError -32602); resources/list and
    resources/read serve RESOURCES. Raises ImportError without the mcp package.
    """
    if _MISSING is not None:
        raise ImportError(MISSING_MCP) from _MISSING
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
                mt.INVALID_PARAMS, str(exc), {"tool": exc.name, "available": list(exc.available)}
            ) from exc
        except EngramError as exc:
            result = error_result(exc)
            log.info("tool %r failed: %s", params.name, result.data.get("error"))
        return mt.CallToolResult(  # the text for the model, the JSON as structured content
            content=[mt.TextContent(type="text", text=result.text)],
            structured_content=result.data,
            is_error=result.is_error,
        )

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
                mt.INVALID_PARAMS,
                f"unknown resource {uri[:200]!r}; available: {', '.join(served)}",
                {"uri": uri},
            )
        try:
            result = await toolset.adispatch(served[uri][0], {})
        except EngramError as exc:
            raise MCPError(mt.INTERNAL_ERROR, error_result(exc).text, {"uri": uri}) from exc
        return mt.ReadResourceResult(
            contents=[
                mt.TextResourceContents(
                    uri=uri, mime_type="application/json", text=json.dumps(result.data, ensure_ascii=False)
                )
            ]
        )

    server = Server(
        SERVER_NAME,
        version=__version__,
        title="Engram episodic memory",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )
    server.middleware.append(explain_invalid_params)
    return server


async def explain_invalid_params(ctx: Any, call_next: Any) -> Any:
    """Server middleware: an INVALID_PARAMS (-32602) error says in its `data` what is wrong, where the
    library leaves it empty — params that fail the method's schema (each field and why, not the value
    sent) and a request before the initialize handshake. Other answers and errors pass unchanged."""
    try:
        return await call_next(ctx)
    except ValidationError as exc:
        reasons = [
            f"{'.'.join(map(str, e['loc'])) or 'params'}: "
            + ("must be an object" if e["type"] in ("dict_type", "model_type") else e["msg"])
            for e in exc.errors(include_url=False)
        ]
        raise MCPError(mt.INVALID_PARAMS, "Invalid request parameters", "; ".join(reasons[:5])) from None
    except MCPError as exc:
        if exc.error.code != mt.INVALID_PARAMS or exc.error.data or ctx.method == "initialize":
            raise
        # the one empty INVALID_PARAMS left is the library's gate on requests before the handshake
        raise MCPError(
            mt.INVALID_PARAMS,
            exc.error.message,
            f"initialize first: send the initialize request before {ctx.method}",
        ) from None


# --- the stdio transport ---------------------------------------------------------------------------------
def _message_depth(value: Any) -> int:
    """The nesting depth of a parsed JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest


class _NotJSON(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJSON(f"{name} is not JSON")


def read_message(line: bytes) -> SessionMessage | mt.JSONRPCError | None:
    """One line of the stdio wire as a message for the server, or the JSON-RPC error that answers it.

    None for a blank line. The error is -32700 (parse error: not UTF-8, not JSON, NaN or Infinity, an
    integer over 4,300 digits) or -32600 (invalid request: a batch array, which MCP does not take since
    protocol 2025-06-18; not an object; nested deeper than MAX_MESSAGE_DEPTH; an id that is not a string
    or an integer; not a JSON-RPC 2.0 request, notification or response), with the request's id when it
    has a valid one, else null; its `data` says why. A lone surrogate escape ("\\ud800") is JSON and
    passes: the tool that receives it names the argument.
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _wire_error(mt.PARSE_ERROR, f"not UTF-8 text (byte {exc.start})")
    if not text.strip():
        return None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        return _wire_error(mt.INVALID_REQUEST, f"nested deeper than {MAX_MESSAGE_DEPTH} levels")
    except (json.JSONDecodeError, _NotJSON) as exc:
        return _wire_error(mt.PARSE_ERROR, str(exc)[:200])
    except ValueError:  # Python converts at most sys.get_int_max_str_digits() digits to an int
        return _wire_error(mt.PARSE_ERROR, f"an integer longer than {sys.get_int_max_str_digits():,} digits")
    if isinstance(value, list):
        return _wire_error(mt.INVALID_REQUEST, "batch arrays are not supported: send one message per line")
    if not isinstance(value, dict):
        return _wire_error(mt.INVALID_REQUEST, "a message must be a JSON object")
    request_id = value.get("id")
    valid_id = isinstance(request_id, str) or (
        isinstance(request_id, int) and not isinstance(request_id, bool)
    )
    if "id" in value and not valid_id:
        return _wire_error(mt.INVALID_REQUEST, "id must be a string or an integer")
    if _message_depth(value) > MAX_MESSAGE_DEPTH:
        return _wire_error(mt.INVALID_REQUEST, f"nested deeper than {MAX_MESSAGE_DEPTH} levels", request_id)
    try:
        message = mt.jsonrpc_message_adapter.validate_python(value, by_name=False)
    except ValidationError as exc:
        return _wire_error(mt.INVALID_REQUEST, _invalid_message(value, exc), request_id)
    return SessionMessage(message)


def _invalid_message(value: dict[str, Any], exc: ValidationError) -> str:
    """Why `value` is not a JSON-RPC message, from the errors of the kind it looks like."""
    if not {"method", "result", "error"} & value.keys():
        return "needs a method (a request or notification), or a result or an error (a response)"
    if "method" in value:
        kind = "JSONRPCRequest" if "id" in value else "JSONRPCNotification"
    else:
        kind = "JSONRPCError" if "error" in value else "JSONRPCResponse"
    reasons = [
        f"{'.'.join(map(str, e['loc'][1:])) or 'message'}: {e['msg']}"
        for e in exc.errors(include_url=False)
        if e["loc"][:1] == (kind,)
    ]
    return f"not a JSON-RPC 2.0 {kind[7:].lower()}: " + "; ".join(reasons[:5])


def _wire_error(code: int, reason: str, request_id: str | int | None = None) -> mt.JSONRPCError:
    message = "Parse error" if code == mt.PARSE_ERROR else "Invalid Request"
    return mt.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=mt.ErrorData(code=code, message=message, data=reason)
    )


def _wire_line(message: mt.JSONRPCMessage) -> bytes:
    """`message` as one line of UTF-8 JSON. Text the server cannot encode (a lone surrogate an argument
    carried into an error's data) is written as a JSON escape instead of failing the transport."""
    try:
        return message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
    except ValueError:  # pydantic's serialisation error: a lone surrogate
        data = message.model_dump(by_alias=True, exclude_unset=True)
        return json.dumps(data, default=str, separators=(",", ":")).encode() + b"\n"


@contextlib.asynccontextmanager
async def stdio_streams() -> AsyncIterator[tuple[Any, Any]]:
    """The (read, write) streams of `Server.run` over the process's stdin / stdout, newline-delimited
    JSON in UTF-8 whatever the locale.

    Unlike the mcp package's stdio transport, every line that is not a valid message is answered at
    once with the JSON-RPC error of `read_message` (instead of being dropped, which leaves the caller
    waiting for an answer forever), and the server reads on. Ends when stdin closes.
    """
    stdin, stdout = anyio.wrap_file(sys.stdin.buffer), anyio.wrap_file(sys.stdout.buffer)
    to_server, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write, from_server = anyio.create_memory_object_stream[SessionMessage](0)

    async def reader() -> None:
        async with to_server:
            async for line in stdin:
                message = read_message(line)
                if isinstance(message, mt.JSONRPCError):
                    log.info("answered a bad message: %s", message.error.data)
                    await write.send(SessionMessage(message))
                elif message is not None:
                    await to_server.send(message)

    async def writer() -> None:
        async with from_server:
            async for item in from_server:
                await stdout.write(_wire_line(item.message))
                await stdout.flush()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        yield read, write  # the server's end closes `write`: the writer ends once it wrote the last answer


# --- running it ---------------------------------------------------------------------------------------
def _utf8(text: str) -> str:
    """`text` (an argument or an environment value) read as the UTF-8 it was given in, whatever the locale.

    Outside Python's UTF-8 mode (LC_ALL=C with PYTHONUTF8=0) the process decodes argv and the environment
    as ASCII and keeps each other byte as a lone surrogate: "Jürgen" would be refused as invalid Unicode.
    Text that is not UTF-8 is returned as it is, for validation to name.
    """
    try:
        return os.fsencode(text).decode("utf-8")
    except UnicodeError:
        return text


async def _serve(args: dict[str, Any], client: AsyncEngram, toolset: Toolset) -> None:
    async with client:  # toolset.client, typed as the AsyncEngram it is here
        server = build_server(toolset)
        scope = ", ".join(f"{k}={v}" for k, v in toolset.scope.items() if v) or "no default scope"
        http = args["transport"] != "stdio"
        where = f"http://{args['host']}:{args['port']}{args['path']}" if http else "stdio"
        log.info(
            "Engram MCP server on %s -> %s (%s; %d tools)", where, args["url"], scope, len(toolset.tools)
        )
        if not http:
            async with stdio_streams() as (read, write):
                await server.run(read, write, server.create_initialization_options())
            return
        import uvicorn

        app = server.streamable_http_app(streamable_http_path=args["path"], host=args["host"])
        config = uvicorn.Config(app, host=args["host"], port=args["port"], log_level="warning", lifespan="on")
        await uvicorn.Server(config).serve()


@click.command(
    help="Serve Engram's memory tools over MCP (stdio by default). Talks to the query service over HTTP "
    "with an API key."
)
@service_options
@click.option(
    "--agent-id",
    envvar="ENGRAM_AGENT_ID",
    help="Default agent_id when the model passes none (env ENGRAM_AGENT_ID).",
)
@click.option(
    "--user-id",
    envvar="ENGRAM_USER_ID",
    help="Default user_id when the model passes none (env ENGRAM_USER_ID).",
)
@click.option(
    "--session-id",
    envvar="ENGRAM_SESSION_ID",
    help="session_id stamped on recorded episodes (env ENGRAM_SESSION_ID).",
)
@click.option(
    "--tools", help=f"Comma-separated subset of the tools to serve (default: all of {', '.join(TOOL_NAMES)})."
)
@click.option(
    "--transport", type=click.Choice(["stdio", "streamable-http"]), default="stdio", show_default=True
)
@click.option("--host", default="127.0.0.1", show_default=True, help="streamable-http bind address.")
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_HTTP_PORT, show_default=True)
@click.option("--path", default="/mcp", show_default=True, help="streamable-http endpoint path.")
@click.option(
    "--allow-remote", is_flag=True, help="Allow a streamable-http bind address other than loopback."
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    help="Log level (stderr).",
)
def command(**args: Any) -> None:
    """The command line of `engram mcp` / `python -m engram_episodic.mcp_server` (see `main`)."""
    args = {k: _utf8(v) if isinstance(v, str) else v for k, v in args.items()}  # the environment's too
    if _MISSING is not None:
        raise click.UsageError(MISSING_MCP)
    if args["transport"] == "streamable-http" and not is_loopback(args["host"]) and not args["allow_remote"]:
        raise click.UsageError(
            f"--host {args['host']} is not loopback: anyone who reaches the endpoint uses the API key; "
            "pass --allow-remote to bind it anyway"
        )
    names = [n.strip() for n in args["tools"].split(",") if n.strip()] if args["tools"] else None
    scope = {k: args[k] for k in ("agent_id", "user_id", "session_id")}
    try:  # fail before serving: a bad URL, scope id or tool name
        client = AsyncEngram(args["url"], api_key=args["api_key"])
        toolset = Toolset(client, names=names, **scope)
    except (ValueError, UnknownTool) as exc:
        raise click.UsageError(str(exc)) from None
    level = args["log_level"]
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log.setLevel(level)
    if level != "DEBUG":
        for noisy in ("mcp", "httpx", "uvicorn"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(_serve, args, client, toolset)


def main(argv: Sequence[str] | None = None, *, prog: str = "engram mcp") -> int:
    """Run the MCP server until its client disconnects (stdio) or it is interrupted (streamable-http).

    `argv` are the arguments after the command (`["--transport", "streamable-http"]`); flags win over
    the environment (ENGRAM_URL, ENGRAM_API_KEY, ENGRAM_AGENT_ID, ...). Returns the exit status: 0, or 2
    for a usage error (printed to stderr: a bad flag, URL, scope id or tool name, a non-loopback host
    without --allow-remote, the mcp package missing).
    """
    if hasattr(sys.stderr, "reconfigure"):  # the log names ids as given, whatever the locale's encoding
        sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace")
    args = [_utf8(a) for a in (sys.argv[1:] if argv is None else argv)]
    try:
        return command.main(args, prog_name=prog, standalone_mode=False) or 0
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main(prog="python -m engram_episodic.mcp_server"))
