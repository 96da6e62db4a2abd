"""The MCP server (engram_episodic.mcp_server) as MCP clients use it: a subprocess driven by the official
`mcp` client library over stdio and over streamable HTTP, in front of a real query service and Redis.

The query service runs in the test's loop on a real port with API keys; the MCP server reaches it over
HTTP with ENGRAM_URL / ENGRAM_API_KEY (it never opens Redis); the consolidator is driven in-process
(`drain`). Nothing sleeps: readiness is polled with wait_until.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from mcp import ClientSession, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from engram_episodic import AsyncEngram, ResourceNotFound
from engram_episodic.mcp_server import main
from engram_episodic.tools import TOOL_NAMES, TOOLS
from tests.helpers import wait_until
from tests.integration.test_query_e2e import drain
from tests.integration.test_query_support import KEY_A
from tests.integration.test_reliability import running_worker

pytestmark = pytest.mark.slow  # each test runs the MCP server as a process (stdio or HTTP)

pytest_plugins = ["tests.integration.test_query_support"]


def url(server) -> str:
    return str(server.make_url("")).rstrip("/")


DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
ENGRAM_SCRIPT = str(Path(sys.executable).with_name("engram"))  # the engram script of this environment


def doc_blocks(heading: str, lang: str) -> list[str]:
    """The ```lang blocks of the docs/integrations.md section whose heading starts with `heading`."""
    text = DOC.read_text()
    start = text.index("\n" + heading)
    end = text.find("\n## ", start + 1)
    return re.findall(rf"```{lang}\n(.*?)```", text[start : end if end > 0 else None], re.S)


@asynccontextmanager
async def stdio_session(env: dict[str, str], *args: str, log: Path, command: list[str] | None = None):
    """An initialised MCP client session with `python -m engram_episodic.mcp_server ARGS` (or `command`
    ARGS) over stdio."""
    command = command or [sys.executable, "-m", "engram_episodic.mcp_server"]
    params = StdioServerParameters(command=command[0], args=[*command[1:], *args], env=env)
    with log.open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            yield session, await session.initialize()


def text(result) -> str:
    return "\n".join(block.text for block in result.content)


async def test_stdio_server_records_recalls_and_forgets_through_the_mcp_client(
    tenants, settings, redis, tmp_path
):
    env = {"ENGRAM_URL": url(tenants), "ENGRAM_API_KEY": KEY_A, "ENGRAM_USER_ID": "ann"}
    async with stdio_session(env, "--agent-id", "desktop", log=tmp_path / "mcp.log") as (session, init):
        assert init.server_info.name == "engram" and "record_episode" in init.instructions
        listed = await session.list_tools()
        assert [t.name for t in listed.tools] == list(TOOL_NAMES)
        for tool, spec in zip(listed.tools, TOOLS, strict=True):  # the same definition as tools.py
            assert tool.description == spec.description and tool.input_schema == spec.parameters
            assert tool.annotations.read_only_hint is spec.read_only
        assert listed.tools[TOOL_NAMES.index("forget_episode")].annotations.destructive_hint is True

        recorded = await session.call_tool(
            "record_episode",
            {
                "task": "fix the flaky login test",
                "outcome": "success",
                "reward": 1.0,
                "strategy": "iterative",
                "solution": "freeze the clock with a fixture",
                "category": "debugging",
                "actions": [
                    {
                        "action_type": "run_tests",
                        "input": "pytest tests/test_login.py",
                        "success": False,
                        "error": "AssertionError: 401 != 200",
                    }
                ],
            },
        )
        assert not recorded.is_error, text(recorded)
        episode_id = recorded.structured_content["episode_id"]
        assert episode_id in text(recorded)

        await drain(settings, redis)
        async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
            stored = await memory.wait_until_recallable(episode_id, timeout=10)
            assert (stored.episode.agent_id, stored.episode.user_id) == ("desktop", "ann")  # the bound scope

            recall = await session.call_tool(
                "recall_experiences", {"query": "the login test fails at random", "top_k": 3}
            )
            assert not recall.is_error, text(recall)
            assert [r["episode"]["episode_id"] for r in recall.structured_content["results"]] == [episode_id]
            assert "freeze the clock with a fixture" in text(recall) and "success | reward 1.00" in text(
                recall
            )

            bad = await session.call_tool(
                "record_episode", {"task": "t", "outcome": "won", "importance": 11, "colour": "red"}
            )
            assert bad.is_error and bad.structured_content["error"] == "invalid_arguments"
            fields = {e["field"] for e in bad.structured_content["errors"]}
            assert fields == {"outcome", "importance", "colour"}
            assert all(f in text(bad) for f in fields) and "must be one of success" in text(bad)
            blank = await session.call_tool("recall_experiences", {"query": "  "})  # refused by the service
            assert blank.is_error and blank.structured_content["errors"] == [
                {"field": "query", "reason": "must not be empty or blank"}
            ]
            with pytest.raises(MCPError) as unknown:
                await session.call_tool("drop_database", {})
            assert unknown.value.code == -32602 and "drop_database" in unknown.value.message

            resources = await session.list_resources()
            assert {str(r.uri) for r in resources.resources} == {"engram://skills", "engram://learning-curve"}
            skills = await session.read_resource("engram://skills")
            profile = json.loads(skills.contents[0].text)
            assert [(p["category"], p["episodes"]) for p in profile["results"]] == [("debugging", 1)]

            async with running_worker(settings, "mcp-forgetter"):  # the tool waits for the erase
                forgot = await session.call_tool("forget_episode", {"episode_id": episode_id})
            assert not forgot.is_error and forgot.structured_content["episode_id"] == episode_id
            assert forgot.structured_content["status"] == "erased" and "is erased" in text(forgot)
            with pytest.raises(ResourceNotFound):  # at once: erased before the tool answered
                await memory.get_episode(episode_id)
            again = await session.call_tool("recall_experiences", {"query": "the login test fails at random"})
            assert again.structured_content["results"] == [] and "No past episodes" in text(again)
            gone = await session.call_tool(
                "forget_episode", {"episode_id": episode_id}
            )  # forgetting is idempotent
            assert not gone.is_error and gone.structured_content["status"] == "already_forgotten"
            unknown = await session.call_tool("forget_episode", {"episode_id": "never-recorded"})
            assert unknown.is_error and unknown.structured_content["errors"][0]["field"] == "episode_id"


async def test_a_wrong_api_key_is_a_tool_error_not_a_crash(tenants, tmp_path):
    env = {"ENGRAM_URL": url(tenants), "ENGRAM_API_KEY": "not-a-key"}
    async with stdio_session(env, "--tools", "get_skills,recall_experiences", log=tmp_path / "mcp.log") as (
        session,
        _,
    ):
        assert [t.name for t in (await session.list_tools()).tools] == ["get_skills", "recall_experiences"]
        denied = await session.call_tool("get_skills", {})
        assert denied.is_error and denied.structured_content == {"error": "unauthorized", "status": 401}
        assert [str(r.uri) for r in (await session.list_resources()).resources] == ["engram://skills"]
        with pytest.raises(MCPError):
            await session.call_tool("forget_episode", {"episode_id": "x"})  # not served by this subset


async def test_streamable_http_transport(tenants, unused_tcp_port, tmp_path):
    """The documented command line (`engram mcp --transport streamable-http --port N`) on another port."""
    documented = next(
        line.split("#")[0].split()
        for line in doc_blocks("## MCP", "bash")[0].splitlines()
        if "streamable-http" in line
    )
    assert documented == ["engram", "mcp", "--transport", "streamable-http", "--port", "8765"]
    log = (tmp_path / "mcp.log").open("w")
    proc = await asyncio.create_subprocess_exec(
        ENGRAM_SCRIPT,
        *documented[1:-1],
        str(unused_tcp_port),
        stdout=log,
        stderr=log,
        env={**os.environ, "ENGRAM_URL": url(tenants), "ENGRAM_API_KEY": KEY_A},
    )

    async def listening() -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", unused_tcp_port)
        except OSError:
            assert proc.returncode is None, (tmp_path / "mcp.log").read_text()
            return False
        writer.close()
        await writer.wait_closed()
        return True

    try:
        await wait_until(listening, timeout=30, message="the MCP server's port")
        async with (
            streamable_http_client(f"http://127.0.0.1:{unused_tcp_port}/mcp") as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            assert [t.name for t in (await session.list_tools()).tools] == list(TOOL_NAMES)
            skills = await session.call_tool("get_skills", {"threshold": 0.5})
            assert not skills.is_error and skills.structured_content["results"] == []
            assert "No completed episodes yet" in text(skills)
            bad = await session.call_tool("get_learning_curve", {"window": 0})
            assert bad.is_error and bad.structured_content["errors"][0]["field"] == "window"
    finally:
        proc.terminate()
        await proc.wait()
        log.close()


def test_usage_errors_exit_2_before_serving(capsys):
    assert main(["--transport", "streamable-http", "--host", "0.0.0.0"]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["--tools", "recall_experiences,drop_database"]) == 2
    assert "unknown tool 'drop_database'" in capsys.readouterr().err
    assert main(["--url", "localhost:8080"]) == 2
    assert "http://" in capsys.readouterr().err
    assert main(["--agent-id", " padded"]) == 2
    assert "agent_id" in capsys.readouterr().err


async def test_the_documented_desktop_configs_start_a_working_server(tenants, settings, redis, tmp_path):
    """Each JSON config of docs/integrations.md, as a desktop client would launch it (its service URL and
    key pointed at the test's service), serves the tools and records with the configured scope."""
    configs = [json.loads(block) for block in doc_blocks("## MCP (Claude Desktop", "json")]
    assert len(configs) == 2
    commands = {"engram": ENGRAM_SCRIPT, "/path/to/venv/bin/python": sys.executable}
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        for i, config in enumerate(configs):
            entry = config["mcpServers"]["engram"]
            assert set(entry) == {"command", "args", "env"} and {"ENGRAM_URL", "ENGRAM_API_KEY"} <= set(
                entry["env"]
            )
            assert set(entry["env"]) <= {
                "ENGRAM_URL",
                "ENGRAM_API_KEY",
                "ENGRAM_AGENT_ID",
                "ENGRAM_USER_ID",
                "ENGRAM_SESSION_ID",
            }
            env = {**entry["env"], "ENGRAM_URL": url(tenants), "ENGRAM_API_KEY": KEY_A}
            command = [commands[entry["command"]], *entry["args"]]
            async with stdio_session(env, log=tmp_path / f"mcp{i}.log", command=command) as (session, init):
                assert init.server_info.name == "engram"
                assert [t.name for t in (await session.list_tools()).tools] == list(TOOL_NAMES)
                recorded = await session.call_tool(
                    "record_episode", {"task": f"config {i}", "outcome": "success"}
                )
                assert not recorded.is_error, text(recorded)
            await drain(settings, redis)
            stored = await memory.wait_until_recallable(recorded.structured_content["episode_id"], timeout=10)
            assert stored.episode.agent_id == entry["env"].get("ENGRAM_AGENT_ID")
            assert stored.episode.user_id == entry["env"].get("ENGRAM_USER_ID")


async def test_the_documented_python_client_lists_the_tools_and_recalls(tenants, settings, redis, tmp_path):
    """docs/integrations.md's Python MCP client, run as written (the service's URL and key, and the
    engram script of this environment, put in) on an empty memory: it records an episode for the agent
    the server is bound to, then prints the tools and what the model would read, which holds it."""
    code = doc_blocks("## MCP (Claude Desktop", "python")[0]
    assert '"--agent-id", "my-agent"' in code
    for documented, actual in (
        ('"http://127.0.0.1:8080"', repr(url(tenants))),
        ('"dev-key"', repr(KEY_A)),
        ('command="engram"', f"command={ENGRAM_SCRIPT!r}"),
    ):
        assert documented in code, documented
        code = code.replace(documented, actual)
    script = tmp_path / "mcp_client.py"
    script.write_text(code)
    async with running_worker(settings, "mcp-doc"):  # the example's record(wait=10) returns once projected
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(script), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    tools_line, *rest = out.decode().splitlines()
    assert eval(tools_line) == list(TOOL_NAMES)  # noqa: S307  (a printed list of names)
    assert "freeze the clock with a fixture" in "\n".join(rest)


async def test_the_documented_module_command_prints_its_options():
    line = next(
        line.split("#")[0].split()
        for line in doc_blocks("## MCP", "bash")[0].splitlines()
        if "engram_episodic.mcp_server" in line
    )
    assert line == ["python", "-m", "engram_episodic.mcp_server", "--help"]
    proc = await asyncio.create_subprocess_exec(sys.executable, *line[1:], stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    for flag in (
        "--url",
        "--api-key",
        "--agent-id",
        "--user-id",
        "--session-id",
        "--tools",
        "--transport",
        "--host",
        "--port",
        "--path",
        "--allow-remote",
    ):
        assert flag in out.decode()


INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
RECALL = (
    b'{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"recall_experiences","arguments":%s}}'
)
# (what is sent, the JSON-RPC error code of its answer, the id the answer carries)
BAD_MESSAGES = [
    (b'{"jsonrpc": "2.0", "id": 1, "method": ', -32700, None),  # not JSON
    (
        RECALL % (b"2", b'{"query": "x", "top_k": ' + b"9" * 5000 + b"}"),
        -32700,
        None,
    ),  # a 5,000-digit integer
    (RECALL % (b"3", b'{"query": "x", "top_k": NaN}'), -32700, None),  # NaN is not JSON
    (RECALL % (b"4", b'{"query": "caf\xe9"}'), -32700, None),  # Latin-1, not UTF-8
    (RECALL % (b"5", b'{"query": "x", "filters": ' + b"[" * 200 + b"]" * 200 + b"}"), -32600, 5),
    (RECALL % (b"6", b'{"query": "x", "filters": ' + b"[" * 5000 + b"]" * 5000 + b"}"), -32600, None),
    (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"}', -32600, None),  # an object as id
    (b'{"jsonrpc": "2.0", "id": true, "method": "tools/list"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}', -32600, None),
    (b'[{"jsonrpc": "2.0", "id": 7, "method": "tools/list"}]', -32600, None),  # a batch
    (b"[]", -32600, None),
    (b'"tools/list"', -32600, None),
    (b'{"jsonrpc": "2.0", "id": 8}', -32600, 8),
    (b'{"jsonrpc": "1.0", "id": 9, "method": "tools/list"}', -32600, 9),
    (b'{"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": [1]}', -32600, 10),
    (
        b'{"jsonrpc": "2.0", "id": "\\ud800", "method": "tools/call", "params": {"name": "\\ud800"}}',
        -32602,
        "\ud800",
    ),
]


async def test_every_malformed_message_is_answered_and_the_server_reads_on(
    tenants, settings, redis, tmp_path
):
    """`engram mcp` as an agent's process runs it, fed raw lines: each message that is not a valid JSON-RPC
    request gets its JSON-RPC error (none is dropped, which would leave the caller waiting forever), then
    a valid call works. The locale is C without UTF-8 mode: the non-ASCII --user-id is still read as
    UTF-8, and so are the messages."""
    env = {
        **os.environ,
        "ENGRAM_URL": url(tenants),
        "ENGRAM_API_KEY": KEY_A,
        "LC_ALL": "C",
        "PYTHONUTF8": "0",
        "PYTHONCOERCECLOCALE": "0",
    }
    with (tmp_path / "mcp.log").open("w") as log:
        proc = await asyncio.create_subprocess_exec(
            ENGRAM_SCRIPT,
            "mcp",
            "--user-id",
            "Jürgen",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env=env,
            limit=1 << 20,
        )
    assert proc.stdin is not None and proc.stdout is not None

    async def ask(line: bytes) -> dict:
        proc.stdin.write(line + b"\n")
        await proc.stdin.drain()
        answer = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert answer, (tmp_path / "mcp.log").read_text()
        return json.loads(answer)

    try:
        assert (await ask(json.dumps(INIT).encode()))["result"]["serverInfo"]["name"] == "engram"
        proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        for line, code, request_id in BAD_MESSAGES:
            answer = await ask(line)
            assert answer["error"]["code"] == code and answer["id"] == request_id, (line[:80], answer)
            assert answer["error"]["data"], answer
            if b"9" * 5000 in line:
                assert answer["error"]["data"] == "an integer longer than 4,300 digits"
        assert "batch" in (await ask(b"[]"))["error"]["data"]
        lone = await ask(RECALL % (b"12", b'{"query": "x\\ud800"}'))  # JSON, but no request can carry it
        assert lone["result"]["isError"] and lone["result"]["structuredContent"]["errors"] == [
            {"field": "query", "reason": "must be valid Unicode text (a lone surrogate at character 1)"}
        ]
        recorded = await ask(
            b'{"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": "record_episode",'
            b' "arguments": {"task": "caf\xc3\xa9 au lait", "outcome": "success"}}}'
        )
        assert recorded["id"] == 11 and not recorded["result"]["isError"], recorded
        episode_id = recorded["result"]["structuredContent"]["episode_id"]
        await drain(settings, redis)
        async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
            stored = await memory.wait_until_recallable(episode_id, timeout=10)
        assert (stored.episode.user_id, stored.episode.task.description) == ("Jürgen", "café au lait")
    finally:
        proc.stdin.close()
        assert await asyncio.wait_for(proc.wait(), 20) == 0


async def test_invalid_params_say_what_is_wrong(tmp_path):
    """A request before `initialize` and a tools/call whose `arguments` is an array were both answered
    -32602 "Invalid request parameters" with `"data": ""`: nothing said which was wrong. The service is
    never reached, so the URL points nowhere."""
    env = {**os.environ, "ENGRAM_URL": "http://127.0.0.1:9"}
    with (tmp_path / "mcp.log").open("w") as log:
        proc = await asyncio.create_subprocess_exec(
            ENGRAM_SCRIPT,
            "mcp",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env=env,
        )
    assert proc.stdin is not None and proc.stdout is not None

    async def ask(message: dict) -> dict:
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        await proc.stdin.drain()
        answer = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert answer, (tmp_path / "mcp.log").read_text()
        return json.loads(answer)

    try:
        early = await ask({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert early["error"]["code"] == -32602 and early["id"] == 1, early
        assert early["error"]["data"] == "initialize first: send the initialize request before tools/list"
        assert "result" in await ask(INIT)
        call = {"name": "recall_experiences", "arguments": ["the query"]}
        listed = await ask({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
        assert listed["error"]["code"] == -32602 and listed["id"] == 2, listed
        assert listed["error"]["data"] == "params.arguments: must be an object", listed
        assert "the query" not in json.dumps(listed), "the answer does not echo what was sent"
        assert len((await ask({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}))["result"]["tools"]) > 0
    finally:
        proc.stdin.close()
        assert await asyncio.wait_for(proc.wait(), 20) == 0
