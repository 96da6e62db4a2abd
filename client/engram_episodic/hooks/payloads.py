"""The coding CLIs' hook payloads, read into one shape, and what of them may be recorded (pure).

Claude Code and Gemini CLI send each hook a JSON object on stdin with `session_id`, `transcript_path`,
`cwd` and `hook_event_name`, plus the event's own fields (`prompt`, `tool_name`, `tool_input`,
`tool_response`, ...); the fixtures in tests/fixtures/agent_hooks pin the shapes read here. An action
keeps the tool's name, a short summary of its input (the command, the file paths: never a file's
contents) and whether it succeeded; everything kept passes `redact` first.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

CLIS = ("claude-code", "gemini-cli")
EVENTS: dict[str, dict[str, str]] = {
    # CLI event name → what the hook does: `session` (a session starts or resumes: send the spool),
    # `start` (a prompt: open the task's draft, answer with context), `tool` (record an action),
    # `end` (the agent answered: complete the draft), `session_end` (complete a draft left open)
    "claude-code": {
        "SessionStart": "session",
        "UserPromptSubmit": "start",
        "PostToolUse": "tool",
        "PostToolUseFailure": "tool",
        "Stop": "end",
        "SessionEnd": "session_end",
    },
    "gemini-cli": {
        "SessionStart": "session",
        "BeforeAgent": "start",
        "AfterTool": "tool",
        "AfterAgent": "end",
        "SessionEnd": "session_end",
    },
}
SHELL_TOOLS = frozenset({"Bash", "run_shell_command"})
MAX_SUMMARY_CHARS = 500
MAX_ERROR_CHARS = 300
MAX_ERROR_LINES = 4
_BANNER = re.compile(r"\s*(?:[=_*~#!-]{3,}.*)?$")
_TELLING = re.compile(r"(?i)error|fail|denied|not found|no such|exception|fatal|cannot|invalid|refused")
# input fields worth keeping: commands, paths, patterns; never contents (`content`, `new_string`, ...)
_SUMMARY_KEYS = (
    "command",
    "file_path",
    "absolute_path",
    "notebook_path",
    "path",
    "dir_path",
    "pattern",
    "glob",
    "url",
    "query",
    "subagent_type",
)

REDACTED = "[REDACTED]"
_SECRET_WORD = r"[\w.-]*(?:key|token|secret|passw(?:or)?d|pwd|auth|credential|private|cookie)[\w.-]*"
# each pattern's group `v` is the secret: it becomes [REDACTED], the rest of the match stays
_REDACTIONS = tuple(
    re.compile(p)
    for p in (
        # URL credentials: https://user:pass@host
        r"://[^/\s:@]+:(?P<v>[^@\s/]+)@",
        # Authorization headers and bearer tokens
        r"(?i)\b(?:bearer|basic|token)\s+(?P<v>[A-Za-z0-9._~+/=-]{8,})",
        # NAME=value, name: value, "name": "value" where the name says secret (not a URL's user name)
        rf"(?i)(?<!/)\b{_SECRET_WORD}[\"']?\s*[=:]\s*([\"']?)(?P<v>[^\s\"'&;,]+)\1",
        # --api-key VALUE
        rf"(?i)--{_SECRET_WORD}\s+(?P<v>[^\s-]\S*)",
        # prose: "password hunter2pass", "the token is Abc123" (not a word: "password reset", "token_type")
        r"(?i)\b(?:password|passwd|pwd|secret|token|api[_-]?key)[ \t]+(?:is[ \t]+)?"
        r"(?-i:(?![a-z_]+\b|[A-Z][a-z]+\b))(?P<v>\w[^\s'\"]{3,}?)(?=[.,;:!?)\]]*(?:[\s'\"]|$))",
        # a password glued to a database client's -p (`mysql -pS3cret`; `-p db` alone prompts for it)
        r"\b(?:mysql\w*|mariadb[\w-]*)\b[^|;&\n]*?\s-p(?P<v>'[^']*'|\"[^\"]*\"|[^\s'\"]+)",
        r"\bsshpass\b[^|;&\n]*?\s-p\s*(?P<v>\S+)",
        # well-known token shapes (OpenAI/Anthropic, GitHub, GitLab, Slack, AWS, Google, JWT, PEM)
        r"(?P<v>\b(?:sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|glpat-[\w-]{20,}"
        r"|xox[abprs]-[\w-]{10,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35}"
        r"|eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]{8,}))",
        r"(?P<v>-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$))",
        # long random-looking strings (letters and digits mixed, 32+ characters)
        r"(?P<v>\b(?=[A-Za-z0-9+/_-]*\d)(?=[A-Za-z0-9+/_-]*[A-Za-z])[A-Za-z0-9+/_-]{32,}={0,2})",
    )
)
_ENV_ASSIGNMENT = re.compile(r"\b[A-Z_][A-Z0-9_]*=(?P<v>\"[^\"]*\"|'[^']*'|\S+)")
_MIN_ECHOED_CHARS = 4
"""A secret this long or longer is redacted wherever else it appears (a shorter one would hit words)."""
_WORD = re.compile(r"[^\s\"'`()<>\[\]{},;]+?(?=[.:!?]*(?:[\s\"'`()<>\[\]{},;]|$))")


def _redacted(text: str) -> tuple[str, set[str]]:
    """`text` with each pattern's secrets replaced, and the secrets found."""
    found: set[str] = set()

    def hide(m: re.Match[str]) -> str:
        if m.group("v") == REDACTED:
            return m.group(0)
        found.add(m.group("v").strip("'\""))
        return m.group(0)[: m.start("v") - m.start()] + REDACTED + m.group(0)[m.end("v") - m.start() :]

    for pattern in _REDACTIONS:
        text = pattern.sub(hide, text)
    if ".env" in text:
        text = _ENV_ASSIGNMENT.sub(hide, text)
    return text, found


def redact(text: str, *context: str) -> str:
    """`text` with secrets-looking values replaced by [REDACTED]: credentials in URLs, bearer tokens,
    values named like a key, token, secret or password (`PGPASSWORD=…`, `--password …`, "password
    hunter2pass"), a database client's `-p<password>`, well-known token formats, private keys, long
    random-looking strings; when the text names a `.env` file, every `NAME=value` assignment (upper-case
    names, as in a `.env`); and every other occurrence of a secret found so in `text` or in `context`
    (other text of the same hook input: an error that echoes the command's password)."""
    text, found = _redacted(text)
    for other in context:
        found |= _redacted(other)[1]
    for secret in sorted(found, key=len, reverse=True):
        if len(secret) >= _MIN_ECHOED_CHARS:
            text = text.replace(secret, REDACTED)
    return text


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "replace")).hexdigest()[:16]


def secrets_in(*texts: str) -> list[str]:
    """Digests of the secrets `redact` finds in `texts` (those it redacts wherever they appear): what a
    session keeps to redact them in its later text too, without keeping them."""
    return sorted({_digest(s) for t in texts for s in _redacted(t)[1] if len(s) >= _MIN_ECHOED_CHARS})


def redact_seen(value: Any, digests: Collection[str]) -> Any:
    """`value` (JSON-shaped) with each word of its strings whose digest is in `digests` (from
    `secrets_in`) replaced by [REDACTED]."""
    if isinstance(value, str) and digests:
        return _WORD.sub(lambda m: REDACTED if _digest(m.group(0)) in digests else m.group(0), value)
    if isinstance(value, Mapping):
        return {k: redact_seen(v, digests) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_seen(v, digests) for v in value]
    return value


def capped(text: str, limit: int) -> str:
    """`text` cut to `limit` characters (an ellipsis marks a cut)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class ToolUse:
    """One tool call as recorded: `name`, `summary` (redacted, capped), `success`, `error` (redacted,
    capped), for a shell tool the raw `command` and `output` (read for test counts, never kept), and
    `secrets_in` its input and error."""

    name: str
    summary: str
    success: bool
    error: str | None = None
    command: str | None = None
    output: str = ""
    secrets: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HookEvent:
    """A CLI's hook payload in one shape. `kind` is one of EVENTS' values; `answer` the agent's last
    message when the payload carries it (Gemini's `prompt_response`, Claude Code's
    `last_assistant_message`), else read from `transcript_path`."""

    cli: str
    name: str
    kind: str
    session_id: str
    cwd: str
    prompt: str | None = None
    tool: ToolUse | None = None
    answer: str | None = None
    transcript_path: str | None = None
    source: str | None = None


def _text(value: Any) -> str:
    """A tool response's text: strings as they are, lists and objects by their string values."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return "\n".join(_text(v) for v in value.values() if isinstance(v, str | list | dict))
    if isinstance(value, list):
        return "\n".join(_text(v) for v in value)
    return ""


def _summary(tool_input: Any, cwd: str) -> str:
    """The input's command, paths and patterns (not redacted yet)."""
    if not isinstance(tool_input, Mapping):
        return ""
    parts = []
    for key in _SUMMARY_KEYS:
        value = tool_input.get(key)
        if not isinstance(value, str) or not value:
            continue
        if key.endswith("path") and cwd and os.path.isabs(value) and value.startswith(cwd.rstrip("/") + "/"):
            value = os.path.relpath(value, cwd)
        parts.append(value if key == "command" else f"{key}={value}")
    return "; ".join(parts)


def _error_lines(error: str) -> str:
    """An error's first line (Claude Code's is `Exit code 1`) and then its first lines that say what went
    wrong (naming an error, a failure, a refusal; without one, the next lines), at most MAX_ERROR_LINES;
    blank lines and banners (`==== FAILURES ====`) skipped."""
    lines = [" ".join(line.split()) for line in error.splitlines() if not _BANNER.match(line)]
    telling = [line for line in lines[1:] if _TELLING.search(line)] or lines[1:]
    return "\n".join(lines[:1] + telling[: MAX_ERROR_LINES - 1])


def _tool(cli: str, name: str, data: Mapping[str, Any], cwd: str) -> ToolUse:
    tool_name = str(data.get("tool_name") or "tool")
    tool_input = data.get("tool_input")
    response = data.get("tool_response")
    error: Any = data.get("error")  # Claude Code's PostToolUseFailure
    output = _text(response)
    if cli == "gemini-cli" and isinstance(response, Mapping):
        error = error or response.get("error")
        output = _text(response.get("llmContent") or response.get("returnDisplay"))
    if isinstance(error, Mapping):
        error = error.get("message") or _text(error)
    code = re.search(r"(?im)^exit code:?\s*(-?\d+)", f"{error or ''}\n{output}")
    exit_code = (response.get("exit_code") if isinstance(response, Mapping) else None) or (
        int(code.group(1)) if code else 0
    )
    success = name != "PostToolUseFailure" and not error and not exit_code
    if error:
        output = f"{output}\n{error}"
    command = tool_input.get("command") if isinstance(tool_input, Mapping) else None
    said = _error_lines(str(error or ""))
    summary = _summary(tool_input, cwd)
    return ToolUse(
        name=tool_name,
        summary=capped(redact(summary, said), MAX_SUMMARY_CHARS),
        success=success,
        error=capped(redact(said, summary), MAX_ERROR_CHARS) or None,
        command=command if tool_name in SHELL_TOOLS and isinstance(command, str) else None,
        output=output,
        secrets=tuple(secrets_in(summary, said)),
    )


def read_event(cli: str, name: str, data: Any) -> HookEvent | None:
    """The hook payload `data` of event `name` from `cli`, or None when it is not one Engram handles
    (an unknown event, a payload that is not an object or has no `session_id`)."""
    kind = EVENTS.get(cli, {}).get(name)
    if kind is None or not isinstance(data, Mapping) or not isinstance(data.get("session_id"), str):
        return None
    cwd = str(data.get("cwd") or os.getcwd())
    answer = data.get("prompt_response") or data.get("last_assistant_message")
    return HookEvent(
        cli=cli,
        name=name,
        kind=kind,
        session_id=data["session_id"],
        cwd=cwd,
        prompt=data["prompt"] if isinstance(data.get("prompt"), str) else None,
        tool=_tool(cli, name, data, cwd) if kind == "tool" else None,
        answer=answer if isinstance(answer, str) else None,
        transcript_path=data.get("transcript_path") if isinstance(data.get("transcript_path"), str) else None,
        source=str(data.get("source") or data.get("reason") or "") or None,
    )
