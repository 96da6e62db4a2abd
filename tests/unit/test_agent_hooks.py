"""The coding-agent hooks' pure parts: test-output counts, redaction, the payloads read, the settings
merge (install, uninstall, byte-identical files), and the episode a saved draft completes into."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from click.testing import CliRunner

from engram_episodic.cli import cli
from engram_episodic.hooks import settings, state
from engram_episodic.hooks.payloads import REDACTED, read_event, redact
from engram_episodic.hooks.runner import completed, last_answer, repo_identity
from engram_episodic.hooks.testruns import TestRun, parse_test_output, runs_tests


@pytest.mark.parametrize(
    ("output", "failed", "expected"),
    [
        ("..F\n1 failed, 2 passed in 0.04s", True, (2, 3)),
        ("===== 3 failed, 5 passed, 2 skipped, 1 error in 1.20s =====", True, (5, 9)),
        ("12 passed, 1 warning in 0.50s\n", False, (12, 12)),
        ("!!! Interrupted: 1 error during collection !!!\n1 error in 0.09s", True, (0, 1)),
        ("Tests:       1 failed, 4 passed, 5 total\nTime: 0.4 s", True, (4, 5)),
        ("Tests:       2 skipped, 6 passed, 8 total", False, (6, 6)),
        ("      Tests  1 failed | 9 passed (10)\n   Duration  1.2s", True, (9, 10)),
        ("  14 passing (30ms)\n  2 failing\n", True, (14, 16)),
        ("--- PASS: TestA (0.00s)\n--- FAIL: TestB (0.00s)\nFAIL\nFAIL\tex.com/p\t0.01s", True, (1, 2)),
        ("--- FAIL: TestB (0.00s)\nFAIL\nFAIL\tex.com/p\t0.01s\nok  \tex.com/q\t0.01s", True, (1, 2)),
        (
            "test result: ok. 3 passed; 0 failed; 0 ignored\ntest result: FAILED. 1 passed; 2 failed; 0 ignored",
            True,
            (4, 6),
        ),
        (
            "Tests run: 2, Failures: 0, Errors: 0, Skipped: 0\n[INFO] Results:\n"
            "[ERROR] Tests run: 7, Failures: 1, Errors: 1, Skipped: 1",
            True,
            (4, 6),
        ),
        ("error[E0425]: cannot find value `x`\nerror: could not compile `calc`", True, (0, 0)),
    ],
)
def test_each_runner_s_summary_gives_its_counts(output, failed, expected):
    run = parse_test_output(output, failed=failed)
    assert run is not None and (run.passed, run.total) == expected


def test_output_without_a_summary_is_no_test_run_unless_the_command_failed():
    assert parse_test_output("collected 0 items\n") is None
    assert parse_test_output("", failed=True) == TestRun(0, 0)
    assert TestRun(0, 0).summary() == "no test ran" and TestRun(0, 0).pass_rate == 0.0


def test_failing_tests_are_named_first_three():
    out = (
        "\n".join(f"FAILED tests/test_x.py::test_{i} - AssertionError" for i in range(5)) + "\n5 failed in 1s"
    )
    assert parse_test_output(out, failed=True).failures == tuple(
        f"FAILED tests/test_x.py::test_{i} - AssertionError" for i in range(3)
    )


@pytest.mark.parametrize(
    "command",
    [
        "pytest -q",
        "python -m pytest tests/unit -x",
        "uv run pytest",
        "npm test",
        "npm run test -- --watch=false",
        "pnpm test",
        "npx vitest run",
        "npx jest src",
        "go test ./...",
        "cargo test --all",
        "mvn -q test",
        "./mvnw test",
        "make test",
        "cd web && npm test",
    ],
)
def test_test_commands_are_recognised(command):
    assert runs_tests(command)


@pytest.mark.parametrize("command", ["ls tests", "cat go.mod", "pip install jest-cli", "vim pytest.ini"])
def test_other_commands_are_not(command):
    assert not runs_tests(command)


def test_configured_test_commands_count():
    assert not runs_tests("./scripts/check.sh")
    assert runs_tests("./scripts/check.sh --fast", ["scripts/check.sh"])


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("export GITHUB_TOKEN=ghp_R4nd0mT0k3nValue1234567890abcdEFGH", "ghp_R4nd0m"),
        ("curl -H 'Authorization: Bearer abc.def-ghi_jkl012345'", "abc.def-ghi"),
        ("git clone https://bob:s3cretpass@github.com/acme/calc.git", "s3cretpass"),
        ("OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz ./run", "sk-proj-abc"),
        ("aws configure set aws_secret_access_key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
        ("deploy --api-key k3y-v4lue-zz9", "k3y-v4lue"),
        ("psql --password=hunter2", "hunter2"),
        ('{"client_secret": "abcd1234"}', "abcd1234"),
        ("echo PLAIN_VALUE=opensesame42 >> .env", "opensesame42"),
        ("export AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
        (
            "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "eyJhbGci",
        ),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
            "MIIEowIBAAKCAQEA",
        ),
        ("use 9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c as the key", "9f8e7d6c5b4a3928"),
    ],
)
def test_secrets_are_redacted(text, secret):
    assert secret not in redact(text) and REDACTED in redact(text)


def test_redaction_keeps_ordinary_commands_and_paths():
    for text in (
        "pytest -q tests/test_dates.py",
        "file_path=src/calc/dates.py",
        "file_path=.env",
        "go test ./...",
    ):
        assert redact(text) == text


def payload(event, **fields):
    return {
        "session_id": "s",
        "transcript_path": "/t.jsonl",
        "cwd": "/repo",
        "hook_event_name": event,
        **fields,
    }


def test_claude_code_tool_payloads_keep_paths_and_commands_never_contents():
    edit = read_event(
        "claude-code",
        "PostToolUse",
        payload(
            "PostToolUse",
            tool_name="Write",
            tool_input={"file_path": "/repo/src/a.py", "content": "API_KEY = 'x'\n" * 1000},
            tool_response={"filePath": "/repo/src/a.py"},
        ),
    )
    assert edit.tool.summary == "file_path=src/a.py" and edit.tool.success and edit.tool.command is None
    failed = read_event(
        "claude-code",
        "PostToolUseFailure",
        payload(
            "PostToolUseFailure",
            tool_name="Bash",
            tool_input={"command": "pytest"},
            error="Exit code 1\nboom",
        ),
    )
    assert (failed.tool.success, failed.tool.error, failed.tool.command) == (False, "Exit code 1", "pytest")
    assert "boom" in failed.tool.output
    long = read_event(
        "claude-code",
        "PostToolUse",
        payload(
            "PostToolUse", tool_name="Bash", tool_input={"command": "echo " + "x" * 5000}, tool_response={}
        ),
    )
    assert len(long.tool.summary) == 500


def test_gemini_cli_payloads():
    shell = read_event(
        "gemini-cli",
        "AfterTool",
        payload(
            "AfterTool",
            tool_name="run_shell_command",
            tool_input={"command": "go test ./..."},
            tool_response={"llmContent": "Output: ok\nExit Code: 1", "returnDisplay": ""},
        ),
    )
    assert shell.kind == "tool" and not shell.tool.success and shell.tool.command == "go test ./..."
    missing = read_event(
        "gemini-cli",
        "AfterTool",
        payload(
            "AfterTool",
            tool_name="read_file",
            tool_input={"file_path": "a"},
            tool_response={"error": {"message": "nope"}},
        ),
    )
    assert (missing.tool.success, missing.tool.error) == (False, "nope")
    end = read_event("gemini-cli", "AfterAgent", payload("AfterAgent", prompt="p", prompt_response="done"))
    assert (end.kind, end.answer) == ("end", "done")
    assert read_event("gemini-cli", "BeforeModel", payload("BeforeModel")) is None
    assert read_event("gemini-cli", "AfterAgent", {"prompt": "no session id"}) is None


def saved(tests=None, runs=0):
    return {
        "episode": {
            "episode_id": "e1",
            "task": {"description": "fix it"},
            "agent_id": "/repo",
            "started_at": 1.0,
        },
        "actions": [
            {"action_type": "Bash", "input": "pytest", "success": False, "timestamp": 2.0, "action_id": "a1"}
        ],
        "tests": tests,
        "test_runs": runs,
    }


def test_the_outcome_is_the_last_test_run_s():
    run = {"passed": 3, "total": 3, "command": "pytest", "failures": []}
    ep = completed(saved(run, 2), "all green", ended_by="Stop")
    assert (ep["outcome"], ep["feedback"]["reward"], ep["iterations"], ep["solution"]) == (
        "success",
        1.0,
        2,
        "all green",
    )
    some = completed(saved({**run, "passed": 1}, 1), None, ended_by="Stop")
    assert (some["outcome"], some["feedback"]["reward"]) == ("partial", 1 / 3)
    errored = completed(saved({**run, "passed": 0, "total": 0}, 1), None, ended_by="Stop")
    assert (errored["outcome"], errored["feedback"]["reward"]) == ("failure", 0.0)
    assert "the tests errored before any ran" in errored["feedback"]["message"]
    none = completed(saved(), None, ended_by="SessionEnd: exit")
    assert none["outcome"] == "partial" and "feedback" not in none and none["iterations"] == 0
    assert none["outcome_details"] == "not measured: no test run in this task (SessionEnd: exit)"
    assert none["actions"][0]["action_id"] == "a1" and none["episode_id"] == "e1"


USER_SETTINGS = """{
    // not JSON with comments: Claude Code's file is plain JSON
    "model": "opus"
}"""


def test_settings_merge_keeps_the_user_s_entries():
    mine = {"matcher": "Bash", "hooks": [{"type": "command", "command": "./lint.sh"}]}
    data = {"permissions": {"allow": ["Bash(ls)"]}, "hooks": {"PostToolUse": [mine]}}
    entries = settings.hook_entries("claude-code", ["/usr/bin/engram"])
    merged = settings.with_hooks(data, entries)
    assert merged["hooks"]["PostToolUse"] == [mine, entries["PostToolUse"]]
    assert merged["hooks"]["Stop"] == [entries["Stop"]]
    assert entries["Stop"]["hooks"][0]["command"] == "/usr/bin/engram hook claude-code Stop"
    assert settings.with_hooks(merged, entries) == merged, "idempotent"
    assert settings.without_ours(merged) == data
    gemini = settings.hook_entries("gemini-cli", ["/opt/my env/python", "-m", "engram_episodic.cli"])
    assert gemini["AfterTool"]["hooks"][0] == {
        "type": "command",
        "command": "'/opt/my env/python' -m engram_episodic.cli hook gemini-cli AfterTool",
        "name": "engram-AfterTool",
        "timeout": 10000,
    }
    assert settings.without_ours(settings.with_hooks({}, gemini)) == {}


@pytest.mark.parametrize("cli_name", ["claude-code", "gemini-cli"])
def test_install_then_uninstall_leaves_the_files_byte_identical(tmp_path, monkeypatch, cli_name):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    project = tmp_path / "proj"
    where = settings.target(cli_name, "project", project, tmp_path / "home")
    where.hooks_file.parent.mkdir(parents=True)
    theirs = (
        b'{\n  "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "say done"}]}]},\n'
        b'  "mcpServers": {"github": {"command": "gh-mcp"}, "engram": {"command": "my-own-engram"}},\n'
        b'  "theme":   "dark"\n}\n'
    )
    where.hooks_file.write_bytes(theirs)
    run = CliRunner()
    args = [
        "hooks",
        "install",
        cli_name,
        "--dir",
        str(project),
        "--url",
        "http://127.0.0.1:9",
        "--api-key",
        "k-123",
    ]
    first = run.invoke(cli, args, catch_exceptions=False)
    assert first.exit_code == 0 and "no Engram service answers at http://127.0.0.1:9" in first.output
    assert "make run" in first.output
    installed = {p: p.read_bytes() for p in {where.hooks_file, where.mcp_file}}
    data = json.loads(installed[where.hooks_file])
    assert data["theme"] == "dark" and data["hooks"]["Stop"][0]["hooks"][0]["command"] == "say done"
    mcp = json.loads(where.mcp_file.read_bytes())["mcpServers"]["engram"]
    assert mcp["args"][-1] == "mcp" and mcp["env"] == {"ENGRAM_URL": "http://127.0.0.1:9"}, (
        "no key in a project"
    )
    assert run.invoke(cli, args).exit_code == 0
    assert {p: p.read_bytes() for p in installed} == installed, "a second install changes nothing"
    status = run.invoke(cli, ["hooks", "status", "--dir", str(project)])
    line = next(x for x in status.output.splitlines() if x.startswith(f"{cli_name:12} project"))
    assert "SessionStart" in line and "SessionEnd" in line and "MCP server yes" in line
    assert run.invoke(cli, ["hooks", "uninstall", cli_name, "--dir", str(project)]).exit_code == 0
    assert where.hooks_file.read_bytes() == theirs
    assert sorted(p.name for p in project.rglob("*") if p.is_file()) == [where.hooks_file.name]


def test_uninstall_after_the_user_edited_the_file_keeps_their_edit(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    where = settings.target("gemini-cli", "user", tmp_path / "proj", tmp_path / "home")
    run = CliRunner()
    assert (
        run.invoke(cli, ["hooks", "install", "gemini-cli", "--user", "--url", "http://127.0.0.1:9"]).exit_code
        == 0
    )
    data = json.loads(where.hooks_file.read_bytes())
    data["general"] = {"vimMode": True}
    where.hooks_file.write_text(json.dumps(data))
    assert run.invoke(cli, ["hooks", "uninstall", "gemini-cli", "--user"]).exit_code == 0
    assert json.loads(where.hooks_file.read_bytes()) == {"general": {"vimMode": True}}


def test_a_settings_file_that_is_not_json_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    where = settings.target("claude-code", "project", tmp_path, tmp_path / "home")
    where.hooks_file.parent.mkdir(parents=True)
    where.hooks_file.write_text(USER_SETTINGS)
    out = CliRunner().invoke(cli, ["hooks", "install", "claude-code", "--dir", str(tmp_path)])
    assert out.exit_code == 1 and "is not JSON" in out.output and "nothing was changed" in out.output
    assert where.hooks_file.read_text() == USER_SETTINGS and not where.mcp_file.exists()


def test_install_names_a_bad_url_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    out = CliRunner().invoke(
        cli, ["hooks", "install", "gemini-cli", "--dir", str(tmp_path), "--url", "localhost:8"]
    )
    assert out.exit_code == 2 and "'--url': must start with http:// or https://" in out.output
    assert list(tmp_path.iterdir()) == []


def test_state_files_are_the_user_s_only(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    path = state.save_config({"url": "http://h", "api_key": "k", "other": 1})
    assert path.stat().st_mode & 0o777 == 0o600 and state.load_config() == {"url": "http://h", "api_key": "k"}
    with state.session("claude-code", "s1") as saved:
        saved["episode"] = {"episode_id": "e"}
    with state.session("claude-code", "s1") as saved:
        assert saved == {"episode": {"episode_id": "e"}}
        saved.clear()
    assert os.listdir(tmp_path / "engram" / "sessions") == [".lock"]


def test_the_repository_is_its_remote_without_credentials_or_its_folder(tmp_path):
    assert repo_identity(str(tmp_path)) == str(tmp_path), "not a repository: the folder"
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "src").mkdir()
    assert repo_identity(str(tmp_path / "src")) == str(tmp_path), "the work tree's top"
    remote = [
        "git",
        "-C",
        str(tmp_path),
        "remote",
        "add",
        "origin",
        "https://bob:tok3n@github.com/acme/calc.git",
    ]
    subprocess.run(remote, check=True)
    assert repo_identity(str(tmp_path / "src")) == "https://github.com/acme/calc"
    hashed = repo_identity(str(tmp_path), hashed=True)
    assert hashed.startswith("repo:") and len(hashed) == 21 and "acme" not in hashed


def test_the_answer_is_the_transcript_s_last_assistant_text(tmp_path):
    lines = [
        {
            "type": "assistant",
            "message": {"role": "assistant", "content": [{"type": "text", "text": "first"}]},
        },
        {"type": "user", "message": {"role": "user", "content": "go on"}},
        {
            "type": "assistant",
            "message": {"role": "assistant", "content": [{"type": "text", "text": "last"}]},
        },
        {
            "type": "assistant",
            "message": {"role": "assistant", "content": [{"type": "tool_use", "name": "Bash"}]},
        },
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(map(json.dumps, lines)) + "\nnot json\n")
    assert last_answer(str(path)) == "last"
    assert last_answer(str(tmp_path / "missing.jsonl")) is None and last_answer(None) is None
