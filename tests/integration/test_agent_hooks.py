"""`engram hook <cli> <event>`: the documented payloads of Claude Code and Gemini CLI (fixtures in
tests/fixtures/agent_hooks) replayed through the CLI against a real query service and Redis.

Each hook runs as the CLIs run it: `engram hook ...` with the payload on stdin (CliRunner in a worker
thread); the consolidator is driven in-process (`drain`); the hooks' state lives in a temporary
XDG_STATE_HOME.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.coding_session_demo import context_of, load, replay
from engram_episodic.cli import cli
from engram_episodic.hooks import state
from shared import streams
from shared.codec import decode
from shared.keys import Keys
from tests.integration.test_query_e2e import drain
from tests.integration.test_query_support import KEY_A, auth

pytest_plugins = ["tests.integration.test_query_support"]


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ENGRAM_USER_ID", "dev")
    for name in ("calc", "other", "web"):
        (tmp_path / name).mkdir()
    return tmp_path


def invoker(url: str, key: str | None = KEY_A):
    """`engram hook` with a payload on stdin, as a CLI runs it; asserts exit status 0."""

    def invoke(cli_name: str, event: str, stdin: str) -> str:
        args = ["--url", url, *(["--api-key", key] if key else []), "hook", cli_name, event]
        result = CliRunner().invoke(cli, args, input=stdin, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    return invoke


def url_of(server) -> str:
    return str(server.make_url("")).rstrip("/")


async def play(server, name: str, repo: Path, session: str, url: str | None = None) -> list[str]:
    invoke = invoker(url or url_of(server))
    return await asyncio.to_thread(
        replay, invoke, load(name), repo=repo, session=session, workdir=repo.parent
    )


async def episode_of(server, session: str) -> dict:
    answer = await server.get("/v1/episodes", params={"session_id": session}, headers=auth(KEY_A))
    episodes = (await answer.json())["results"]
    assert len(episodes) == 1, episodes
    return episodes[0]


async def test_claude_code_sessions_record_test_scored_episodes_and_bring_them_back(
    tenants, settings, redis, workdir
):
    calc, invoke = workdir / "calc", invoker(url_of(tenants))
    out = await play(tenants, "claude_code_tests_still_failing.json", calc, "c1")
    assert out == [""] * len(out), "a first session in a repository gets no context"
    assert state.spooled() == [], "the service took it: it left the spool"
    await drain(settings, redis)
    first = await episode_of(tenants, "c1")
    assert first["task"]["description"] == "Fix the failing test for parse_date in the calc package"
    assert (first["agent_id"], first["user_id"], first["session_id"]) == (str(calc), "dev", "c1")
    assert first["outcome"] == "failure" and first["iterations"] == 2
    assert first["feedback"] == {
        "reward": 0.0,
        "pass_rate": 0.0,
        "tests_passed": 0,
        "tests_total": 1,
        "message": "`pytest -q`: 0/1 tests passed; ERROR tests/test_dates.py - NameError: name 'datetime' is "
        "not defined; failing earlier: FAILED tests/test_dates.py::test_iso - AssertionError: assert "
        "['2024-03-01'] == datetime.date(2024, 3, 1)",
    }
    assert [(a["action_type"], a.get("input"), a.get("output"), a["success"]) for a in first["actions"]] == [
        ("Read", "file_path=src/calc/dates.py", None, True),
        ("Bash", "pytest -q", "2/3 tests passed", False),
        ("Edit", "file_path=src/calc/dates.py", None, True),
        ("Bash", "pytest -q", "0/1 tests passed", False),
    ]
    assert first["actions"][1]["error"].startswith("Exit code 1\nE AssertionError: assert ['2024-03-01']")
    assert first["solution"].startswith("I replaced the split with datetime.strptime"), (
        "read from the transcript"
    )
    assert "(Stop)" in first["outcome_details"]

    # a similar task in the same repository: the first one's outcome and failing approach come with it
    out = await play(tenants, "claude_code_fail_then_pass.json", calc, "c2")
    context = context_of(out[1])
    assert json.loads(out[1])["hookSpecificOutput"]["hookEventName"] == "UserPromptSubmit"
    assert 'tried before: "Fix the failing test for parse_date in the calc package" — failure, 0/1' in context
    assert "tests said: `pytest -q`: 0/1 tests passed; ERROR tests/test_dates.py" in context
    assert "approach: Read file_path=src/calc/dates.py; Bash pytest -q → 2/3 tests passed; Edit" in context
    assert len(context) <= 2000 and [o for i, o in enumerate(out) if i != 1] == [""] * (len(out) - 1)
    await drain(settings, redis)
    second = await episode_of(tenants, "c2")
    assert second["outcome"] == "success" and second["iterations"] == 2, (
        "one episode across compaction, resume"
    )
    assert second["feedback"]["reward"] == 1.0 and second["feedback"]["pass_rate"] == 1.0
    assert (second["feedback"]["tests_passed"], second["feedback"]["tests_total"]) == (3, 3)
    assert "failing earlier: FAILED tests/test_dates.py::test_iso" in second["feedback"]["message"]
    assert [a["action_type"] for a in second["actions"]] == ["Bash", "Edit", "Bash"]
    assert second["solution"].startswith("Fixed: src/calc/dates.py imports datetime")

    # the third time, the fix is there too; another repository gets nothing of calc's
    out = await play(tenants, "claude_code_fail_then_pass.json", calc, "c3")
    assert "— success, 3/3 tests passed" in context_of(out[1]) and "what worked: Fixed:" in context_of(out[1])
    assert "Advice (medium confidence): 2 similar tasks, 1 succeeded, 1 failed; strategies that worked: " in (
        context_of(out[1])
    )
    assert second["strategy_used"] == "pytest + Edit" and "strategies that worked: pytest + Edit" in (
        context_of(out[1])
    )
    out = await play(tenants, "claude_code_fail_then_pass.json", workdir / "other", "o1")
    assert out[1] == "", "a session of another repository is given nothing"
    assert os.listdir(workdir / "state" / "engram" / "sessions") == [".lock"], "no draft left open"
    unrelated = {"session_id": "c4", "cwd": str(calc), "prompt": "Write the release notes for version 2"}
    out = await asyncio.to_thread(invoke, "claude-code", "UserPromptSubmit", json.dumps(unrelated))
    assert out == "", "below the relevance floor: nothing, not the top 3 anyway"


async def test_a_task_without_tests_says_so_and_secrets_never_reach_the_stream(
    tenants, settings, redis, prefix, workdir
):
    await play(tenants, "claude_code_no_tests_with_secrets.json", workdir / "calc", "s1")
    await drain(settings, redis)
    ep = await episode_of(tenants, "s1")
    assert ep["outcome"] == "partial" and "feedback" not in ep and ep["iterations"] == 0
    assert ep["outcome_details"] == "not measured: no test run in this task (Stop)"
    assert [a["action_type"] for a in ep["actions"]] == ["Bash", "Bash", "Write", "Bash"]
    assert ep["actions"][2]["input"] == "file_path=.env", "a file's path, never its contents"
    assert ep["actions"][3]["input"] == "./deploy --api-key [REDACTED] --region eu"
    events = [decode(e.payload) for e in await streams.read_range(redis, Keys(prefix).stream)]
    recorded = repr(events) + repr(ep)
    for secret in (
        "ghp_R4nd0mT0k3nValue",
        "sk-ant-api03",
        "hunter2pass",
        "opensesame42",
        "rk_live",
        "k3y-v4lue",
    ):
        assert secret not in recorded, secret
    assert "GITHUB_TOKEN=[REDACTED]" in ep["actions"][0]["input"]


async def test_gemini_cli_sessions(tenants, settings, redis, workdir):
    web = workdir / "web"
    out = await play(tenants, "gemini_cli_fail_then_pass.json", web, "g1")
    assert out == ["{}\n"] * len(out), "Gemini CLI reads stdout as JSON: an empty object, not nothing"
    await drain(settings, redis)
    ep = await episode_of(tenants, "g1")
    assert ep["outcome"] == "success" and ep["iterations"] == 2 and ep["agent_id"] == str(web)
    assert (ep["feedback"]["tests_passed"], ep["feedback"]["tests_total"], ep["feedback"]["reward"]) == (
        5,
        5,
        1.0,
    )
    assert ep["feedback"]["message"] == (
        "`npm test`: 5/5 tests passed; failing earlier: ✕ replaces spaces with dashes (3 ms); "
        "● slugify › replaces spaces with dashes"
    )
    assert [(a["action_type"], a.get("input"), a["success"]) for a in ep["actions"]] == [
        ("read_file", "file_path=src/slugify.js", True),
        ("run_shell_command", "npm test", False),
        ("replace", "file_path=src/slugify.js", True),
        ("run_shell_command", "npm test", True),
    ]
    assert ep["solution"].startswith("slugify now trims")

    # a tool error, go test, and a session that ends without AfterAgent: SessionEnd completes the task
    out = await play(tenants, "gemini_cli_tool_error_session_end.json", web, "g2")
    assert out[1] == "{}\n", "another task of the repository: nothing relevant, nothing given"
    await drain(settings, redis)
    ep = await episode_of(tenants, "g2")
    assert ep["outcome"] == "partial" and ep["feedback"]["reward"] == 0.5 and ep["iterations"] == 1
    assert ep["actions"][0]["error"] == "File not found: cache/evict.go" and not ep["actions"][0]["success"]
    assert ep["outcome_details"] == "last of 1 test runs: 1/2 tests passed (SessionEnd: exit)"

    out = await play(tenants, "gemini_cli_fail_then_pass.json", web, "g3")
    hook_out = json.loads(out[1])["hookSpecificOutput"]
    assert hook_out["hookEventName"] == "BeforeAgent"
    assert '"Make the slugify test pass in the web package" — success, 5/5' in hook_out["additionalContext"]


async def test_with_the_service_down_the_hook_exits_0_in_time_and_the_spool_is_sent_once(
    tenants, settings, redis, workdir
):
    from deploy.embedded_redis import free_port

    down = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    out = await play(tenants, "claude_code_fail_then_pass.json", workdir / "calc", "d1", url=down)
    took = time.monotonic() - started
    assert out == [""] * len(out) and took < 10, took  # 9 hooks, each well within its bound
    with socket.create_server(("127.0.0.1", 0), backlog=8) as silent:  # connects, never answers
        silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        prompt = {"session_id": "d0", "cwd": str(workdir / "calc"), "prompt": "Fix the parse_date test"}
        started = time.monotonic()
        out = await asyncio.to_thread(
            invoker(silent_url), "claude-code", "UserPromptSubmit", json.dumps(prompt)
        )
        assert out == "" and time.monotonic() - started < 3.0, "recall is bounded (RECALL_SECONDS)"
    spooled = state.spooled()
    assert len(spooled) == 1
    kept = spooled[0].read_bytes()

    # the service is back: the next hook (a session starting) sends the spool
    up = invoker(str(tenants.make_url("")).rstrip("/"))
    start = json.dumps({"session_id": "d2", "cwd": str(workdir / "calc"), "hook_event_name": "SessionStart"})
    await asyncio.to_thread(up, "claude-code", "SessionStart", start)
    assert state.spooled() == []
    spooled[0].write_bytes(kept)  # its answer lost: sent again
    await asyncio.to_thread(up, "claude-code", "SessionStart", start)
    await drain(settings, redis)
    ep = await episode_of(tenants, "d1")  # one episode, not two
    assert ep["outcome"] == "success" and ep["iterations"] == 2
    log = (workdir / "state" / "engram" / "hooks.log").read_text()
    assert "spooled" in log and "published episode" in log


async def test_a_bad_payload_is_logged_and_never_fails_the_cli(tenants, workdir):
    invoke = invoker(str(tenants.make_url("")).rstrip("/"))
    for cli_name, event, stdin in (
        ("claude-code", "UserPromptSubmit", "not json"),
        ("claude-code", "Notification", "{}"),
        ("gemini-cli", "AfterTool", "[]"),
        ("claude-code", "PostToolUse", json.dumps({"session_id": "nobody", "tool_name": "Bash"})),
    ):
        out = await asyncio.to_thread(invoke, cli_name, event, stdin)
        assert out == ("{}\n" if cli_name == "gemini-cli" else ""), (event, out)
    log = (workdir / "state" / "engram" / "hooks.log").read_text()
    assert "UserPromptSubmit failed" in log and "no open task in this session" in log


async def test_status_says_the_service_answers(tenants, workdir):
    url = url_of(tenants)
    args = ["--url", url, "--api-key", KEY_A, "hooks", "status", "--dir", str(workdir / "calc")]
    out = await asyncio.to_thread(CliRunner().invoke, cli, args, catch_exceptions=False)
    assert out.exit_code == 0 and f"service: {url} answers" in out.output, out.output
    assert f"is recorded as agent_id {str(workdir / 'calc')!r}" in out.output


async def test_a_task_its_cli_never_ended_is_completed_by_a_later_session(tenants, settings, redis, workdir):
    invoke = invoker(url_of(tenants))
    steps = load("claude_code_fail_then_pass.json")["steps"][:3]  # a prompt, a failing test run, then nothing
    await asyncio.to_thread(
        replay,
        invoke,
        {"cli": "claude-code", "transcript": [], "steps": steps},
        repo=workdir / "calc",
        session="lost",
        workdir=workdir,
    )
    (draft,) = (workdir / "state" / "engram" / "sessions").glob("*.json")
    start = json.dumps({"session_id": "next", "cwd": str(workdir / "calc"), "source": "startup"})
    await asyncio.to_thread(invoke, "claude-code", "SessionStart", start)
    assert draft.exists(), "a task idle for less than a day stays open"
    os.utime(draft, (time.time() - 2 * 86400,) * 2)
    await asyncio.to_thread(invoke, "claude-code", "SessionStart", start)
    assert not draft.exists()
    await drain(settings, redis)
    ep = await episode_of(tenants, "lost")
    assert (ep["outcome"], ep["feedback"]["reward"], ep["iterations"]) == ("partial", 2 / 3, 1)
    assert ep["outcome_details"] == "last of 1 test runs: 2/3 tests passed (no end event in 24 h)"
