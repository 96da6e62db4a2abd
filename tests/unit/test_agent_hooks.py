"""The coding-agent hooks' pure parts: test-output counts, redaction, the payloads read, the settings
merge (install, uninstall, byte-identical files), and the episode a saved draft completes into."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from click.testing import CliRunner

import engram_episodic
from engram_episodic.cli import cli
from engram_episodic.hooks import settings, state
from engram_episodic.hooks.payloads import REDACTED, read_event, redact
from engram_episodic.hooks.runner import _advice, _line, completed, last_answer, main, repo_identity
from engram_episodic.hooks.testruns import TestRun, parse_test_output, runs_tests
from engram_episodic.types import Suggestion


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
    assert TestRun(0, 0).summary() == "no test ran"


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
        "mkdir -p build/out && pytest -p no:cacheprovider -q",
        "mysql -u root -p shop < dump.sql",
        "fix the password reset flow: the token is expired after 5 minutes",
        "pwd && ls -la",
        "kubectl get secret my-secret-2 -o yaml; check the password hash_password() uses",
    ):
        assert redact(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mysql -u root -pTopSecret123 prod", "mysql -u root -p[REDACTED] prod"),
        ("mariadb-dump -h db -p'Top Secret' shop > s.sql", "mariadb-dump -h db -p[REDACTED] shop > s.sql"),
        ("sshpass -p hunter2pass ssh deploy@web", "sshpass -p [REDACTED] ssh deploy@web"),
        ("psql --password hunter2pass -d app", "psql --password [REDACTED] -d app"),
        ("PGPASSWORD=hunter2pass psql app", "PGPASSWORD=[REDACTED] psql app"),
        ("the db password hunter2pass stopped working", "the db password [REDACTED] stopped working"),
        ("its password: x", "its password: [REDACTED]"),
        ("my token is Xy7pQ2vL9k.", "my token is [REDACTED]."),
        (
            "git push https://oauth2:glpat-abcdefghij0123456789@gitlab.com/acme/calc.git main",
            "git push https://oauth2:[REDACTED]@gitlab.com/acme/calc.git main",
        ),
    ],
)
def test_secrets_are_redacted_and_nothing_around_them(text, expected):
    assert redact(text) == expected


def test_a_secret_is_redacted_wherever_the_same_hook_input_repeats_it():
    event = read_event(
        "claude-code",
        "PostToolUseFailure",
        payload(
            "PostToolUseFailure",
            tool_name="Bash",
            tool_input={"command": "mysql -u root -pTopSecret123 prod -e 'select 1'"},
            error="Exit code 1\nERROR 1045 (28000): TopSecret123 rejected for 'root'@'localhost'",
        ),
    )
    assert event.tool.summary == "mysql -u root -p[REDACTED] prod -e 'select 1'"
    assert event.tool.error == "Exit code 1\nERROR 1045 (28000): [REDACTED] rejected for 'root'@'localhost'"
    assert (
        redact("mysql: TopSecret123 refused", "PGPASSWORD=TopSecret123 mysql") == "mysql: [REDACTED] refused"
    )


def test_an_error_keeps_its_telling_lines_not_only_the_exit_code():
    error = (
        "Exit code 1\n..F    [100%]\n======= FAILURES =======\n___ test_iso ___\n\n    def test_iso():\n"
        ">       assert parse('x') == 1\nE       ValueError: bad date 'x'\n\nsrc/calc/dates.py:3: ValueError\n"
        "FAILED tests/test_dates.py::test_iso - ValueError: bad date 'x'\n1 failed, 2 passed in 0.04s\n"
    )
    event = read_event(
        "claude-code",
        "PostToolUseFailure",
        payload("PostToolUseFailure", tool_name="Bash", tool_input={"command": "pytest"}, error=error),
    )
    assert event.tool.error == (
        "Exit code 1\nE ValueError: bad date 'x'\nsrc/calc/dates.py:3: ValueError\n"
        "FAILED tests/test_dates.py::test_iso - ValueError: bad date 'x'"
    )


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
    assert (failed.tool.success, failed.tool.error, failed.tool.command) == (
        False,
        "Exit code 1\nboom",
        "pytest",
    )
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


def test_the_context_names_each_step_and_the_commands_that_worked():
    shell = {"action_type": "Bash", "success": False, "timestamp": 2.0}
    actions = [
        {"action_type": "Read", "input": "file_path=src/a.py", "success": True, "timestamp": 1.0},
        {**shell, "input": "cd src && python -m pytest tests -x", "output": "2/3 tests passed"},
        {"action_type": "Edit", "input": "file_path=src/a.py", "success": True, "timestamp": 3.0},
        {**shell, "input": "cd src && python -m pytest tests -x", "output": "2/3 tests passed"},
        {"action_type": "prompt", "input": "go on", "timestamp": 4.0},
        {**shell, "input": "FORCE=1 npm run test -- --ci", "success": True, "timestamp": 5.0},
    ]
    ep = completed({**saved(), "actions": actions}, None, ended_by="Stop")
    assert ep["strategy_used"] == "Read + python -m pytest + Edit + npm run test"
    approach = next(x for x in _line(ep).splitlines() if x.startswith("  approach: "))
    assert approach.count("python -m pytest tests -x → 2/3 tests passed") == 2, "both runs"
    verdict = {"confidence": "medium", "similar": 2, "successes": 1, "failures": 1}
    advice = Suggestion.from_json({**verdict, "successful_strategies": [{"strategy": "Bash", "count": 2}]})
    assert _advice(advice) is None, "a tool's name alone says nothing"
    strategies = [{"strategy": "Read + Bash", "count": 2}, {"strategy": ep["strategy_used"], "count": 1}]
    advice = Suggestion.from_json({**verdict, "successful_strategies": strategies})
    assert _advice(advice).endswith("strategies that worked: Read + python -m pytest + Edit + npm run test")


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


@pytest.mark.parametrize("beside_python", [True, False], ids=["engram-script", "python-P"])
def test_the_installed_command_runs_this_installation_whatever_the_project_holds(
    tmp_path, monkeypatch, beside_python
):
    """The CLIs run the hooks in the project's folder: its own `uuid.py`, `random.py`, `logging.py` or
    `httpx/` must not be imported instead of the real ones, nor another `engram` first on PATH run."""
    python = sys.executable
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "engram").write_text("#!/bin/sh\necho another engram\n")
    (elsewhere / "engram").chmod(0o755)
    monkeypatch.setenv("PATH", f"{elsewhere}{os.pathsep}{os.environ.get('PATH', '')}")
    if not beside_python:  # an installation without the script: this Python, with the module
        monkeypatch.setattr(sys, "executable", str(tmp_path / "nowhere" / "python"))
    project = tmp_path / "proj"
    (project / "httpx").mkdir(parents=True)
    hostile = "print('hostile module ran')\nraise RuntimeError('hostile module')\n"
    for module in ("uuid.py", "random.py", "logging.py", "httpx/__init__.py"):
        (project / module).write_text(hostile)
    args = ["hooks", "install", "gemini-cli", "--dir", str(project), "--url", "http://127.0.0.1:9"]
    assert CliRunner().invoke(cli, args, catch_exceptions=False).exit_code == 0
    data = json.loads((project / ".gemini" / "settings.json").read_text())
    command = data["hooks"]["AfterTool"][0]["hooks"][0]["command"]
    mcp = data["mcpServers"]["engram"]
    assert shlex.join([mcp["command"], *mcp["args"]]) == command.replace(" hook gemini-cli AfterTool", " mcp")
    command = command.replace(sys.executable, python)  # the Python that does exist
    done = subprocess.run(
        command,
        shell=True,
        cwd=project,
        input=json.dumps(payload("AfterTool", cwd=str(project), tool_name="ls")),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(engram_episodic.__file__))},
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, "{}\n"), done.stderr


def test_install_keeps_the_url_and_key_it_found_in_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    run = CliRunner()
    env = {"ENGRAM_URL": "http://127.0.0.1:9", "ENGRAM_API_KEY": "k-env"}
    out = run.invoke(cli, ["hooks", "install", "claude-code", "--dir", str(tmp_path)], env=env)
    assert out.exit_code == 0 and "no Engram service answers at http://127.0.0.1:9" in out.output
    assert state.load_config() == {"url": "http://127.0.0.1:9", "api_key": "k-env"}
    mcp = json.loads((tmp_path / ".mcp.json").read_text())["mcpServers"]["engram"]
    assert mcp["env"] == {"ENGRAM_URL": "http://127.0.0.1:9"}
    status = run.invoke(cli, ["hooks", "status", "--dir", str(tmp_path)], env={"ENGRAM_URL": None})
    assert "service: no Engram service answers at http://127.0.0.1:9" in status.output, "later, without it"
    out = run.invoke(cli, ["hooks", "install", "gemini-cli", "--user"], env={"ENGRAM_URL": None})
    assert "at http://127.0.0.1:9" in out.output and state.load_config()["url"] == "http://127.0.0.1:9"
    user = json.loads((tmp_path / "home" / ".gemini" / "settings.json").read_text())["mcpServers"]["engram"]
    assert user["env"] == {"ENGRAM_URL": "http://127.0.0.1:9", "ENGRAM_API_KEY": "k-env"}


@pytest.mark.parametrize("cli_name", ["claude-code", "gemini-cli"])
def test_uninstall_leaves_a_fresh_project_as_it_was(tmp_path, monkeypatch, cli_name):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    project = tmp_path / "proj"
    project.mkdir()
    run = CliRunner()
    args = ["hooks", "install", cli_name, "--dir", str(project), "--url", "http://127.0.0.1:9"]
    assert run.invoke(cli, args).exit_code == 0 and list(project.iterdir())
    assert run.invoke(cli, ["hooks", "uninstall", cli_name, "--dir", str(project)]).exit_code == 0
    assert list(project.iterdir()) == [], "no settings folder left empty"


def test_install_says_it_replaces_an_mcp_server_named_engram(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / ".mcp.json").write_text('{"mcpServers": {"engram": {"command": "my-own-engram"}}}')
    args = ["hooks", "install", "claude-code", "--dir", str(tmp_path), "--url", "http://127.0.0.1:9"]
    for _ in range(2):  # again: it still replaces theirs
        out = CliRunner().invoke(cli, args)
        assert f"warning: it replaces the MCP server `engram` {tmp_path / '.mcp.json'} had" in out.output
    (tmp_path / "other").mkdir()
    out = CliRunner().invoke(cli, [*args[:3], "--dir", str(tmp_path / "other")])
    assert out.exit_code == 0 and "warning" not in out.output


def test_install_says_the_project_mcp_server_gets_no_key(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    args = ["hooks", "install", "claude-code", "--dir", str(tmp_path), "--url", "http://127.0.0.1:9"]
    out = CliRunner().invoke(cli, [*args, "--api-key", "k-1"])
    assert out.exit_code == 0 and "the MCP server in" in out.output and "gets none" in out.output
    assert "k-1" not in (tmp_path / ".mcp.json").read_text()
    out = CliRunner().invoke(cli, [*args, "--api-key", "k-1", "--user"])
    assert out.exit_code == 0 and "gets none" not in out.output


def test_status_says_a_settings_file_is_not_json(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / ".gemini").mkdir()
    (tmp_path / ".gemini" / "settings.json").write_text(USER_SETTINGS)
    out = CliRunner().invoke(cli, ["--url", "http://127.0.0.1:9", "hooks", "status", "--dir", str(tmp_path)])
    line = next(x for x in out.output.splitlines() if x.startswith("gemini-cli   project"))
    assert "settings not JSON; MCP server unknown: not JSON" in line
    assert "claude-code  project  no hooks; MCP server no" in out.output


def test_the_state_folders_and_log_are_the_user_s_only(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    old = os.umask(0o022)
    try:
        state.start_log()
        state.log.info("one line")
        with state.session("claude-code", "s1") as saved:
            saved["episode"] = {"episode_id": "e"}
        (handler,) = state.log.handlers
        handler.doRollover()
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "engram").rglob("*")}
    modes["engram"] = (tmp_path / "engram").stat().st_mode & 0o777
    assert {k: v for k, v in modes.items() if k != ".lock"} == {
        "engram": 0o700,
        "sessions": 0o700,
        "hooks.log": 0o600,
        "hooks.log.1": 0o600,
        next(p.name for p in (tmp_path / "engram" / "sessions").glob("*.json")): 0o600,
    }


def test_a_secret_the_prompt_gave_is_redacted_in_the_rest_of_the_task(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    down = {"url": "http://127.0.0.1:9", "api_key": None}
    prompt = "The staging db password is Hunter2pass, make the migration connect"
    main("claude-code", "UserPromptSubmit", json.dumps(payload("UserPromptSubmit", prompt=prompt)), **down)
    tool = payload("PostToolUse", tool_name="Bash", tool_input={"command": "./migrate --db staging"})
    main(
        "claude-code",
        "PostToolUse",
        json.dumps({**tool, "tool_response": {"stdout": "Hunter2pass ok"}}),
        **down,
    )
    answer = "It connects now: migrate reads Hunter2pass from STAGING_DB (kept out of the repository)."
    main("claude-code", "Stop", json.dumps(payload("Stop", last_assistant_message=answer)), **down)
    (spooled,) = state.spooled()
    episode = json.loads(spooled.read_text())
    assert "Hunter2pass" not in spooled.read_text()
    assert episode["solution"] == answer.replace("Hunter2pass", REDACTED)
    assert episode["task"]["description"] == prompt.replace("Hunter2pass", REDACTED)
