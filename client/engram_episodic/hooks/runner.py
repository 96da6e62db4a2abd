"""`engram hook <cli> <event>`: one hook invocation, from the CLI's JSON on stdin to what it prints.

A task is an episode: the prompt opens a draft (`EpisodeDraft`, kept in the session's state file between
invocations), each tool use adds an action, and the agent's answer completes it with the outcome of the
last test run. The prompt is answered with what worked and what failed on similar tasks of the same
repository. A hook never harms the agent: every error is logged (state.py's hooks.log) and swallowed,
the exit status is 0, recall is bounded (RECALL_SECONDS), and a finished episode is spooled first and
leaves the spool once the service took it (this hook, or a later one).
"""

from __future__ import annotations

import getpass
import hashlib
import itertools
import json
import os
import re
import subprocess
import time
from collections.abc import Collection, Mapping
from typing import Any

from engram_episodic.client import Engram
from engram_episodic.drafts import EpisodeDraft
from engram_episodic.errors import ApiError, EngramError
from engram_episodic.events import Action
from engram_episodic.hooks import state
from engram_episodic.hooks.payloads import (
    SHELL_TOOLS,
    HookEvent,
    capped,
    read_event,
    redact,
    redact_seen,
    secrets_in,
)
from engram_episodic.hooks.testruns import MAX_FAILURE_LINES, parse_test_output, runs_tests
from engram_episodic.shapes import episode_to_dict, to_plain
from engram_episodic.types import Recall, Suggestion
from engram_episodic.validation import MAX_ACTIONS, MAX_ID_CHARS, MAX_TAG_CHARS

RECALL_SECONDS = 1.5
"""Recall and advice at a prompt together take at most about this long (the agent waits for them)."""
PUBLISH_SECONDS = 3.0
"""How long the end of a task waits for the service before it spools the episode."""
IDLE_SECONDS = 86400.0
"""A task untouched this long (its CLI stopped without Stop or SessionEnd) is completed by the next
session's start, with what its tests said."""
MAX_CONTEXT_CHARS = 2000
MAX_TASK_CHARS = 4000
MAX_SOLUTION_CHARS = 2000
TOP_K = 3
MIN_RELEVANCE = 0.3
"""Past tasks below this relevance are not shown: above the service's general floor (hybrid 0.15), since
what is added to every prompt must be about the task."""

log = state.log


def repo_identity(cwd: str, *, hashed: bool = False) -> str:
    """The repository `cwd` is in: its `origin` remote URL (credentials and `.git` dropped), else the
    work tree's top folder, else `cwd`; with `hashed`, `repo:` and 16 hex digits of its SHA-256."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", "-C", cwd, *args], capture_output=True, text=True, timeout=2, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    remote = re.sub(r"(://)[^/@\s]+@", r"\1", git("config", "--get", "remote.origin.url"))
    ident = remote.removesuffix(".git") or git("rev-parse", "--show-toplevel") or os.path.abspath(cwd)
    if hashed or len(ident) > MAX_ID_CHARS:
        return "repo:" + hashlib.sha256(ident.encode()).hexdigest()[:16]
    return ident


def last_answer(transcript_path: str | None) -> str | None:
    """The agent's last text answer in a JSONL transcript (Claude Code's: one message per line, the
    assistant's with `message.content` text blocks), read from its last 256 KiB; None without one."""
    if not transcript_path:
        return None
    try:
        with open(transcript_path, "rb") as f:
            f.seek(max(0, os.path.getsize(transcript_path) - 256 * 1024))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        message = entry.get("message") if isinstance(entry, dict) else None
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        content = message.get("content")
        blocks = [content] if isinstance(content, str) else content if isinstance(content, list) else []
        texts = [b if isinstance(b, str) else b.get("text", "") for b in blocks if isinstance(b, str | dict)]
        text = "\n".join(t for t in texts if isinstance(t, str) and t.strip())
        if text:
            return text
    return None


# the draft between invocations ----------------------------------------------------------------------
def _open_draft(event: HookEvent, config: Mapping[str, Any]) -> dict[str, Any]:
    draft = EpisodeDraft(
        capped(redact(event.prompt or ""), MAX_TASK_CHARS) or "(empty prompt)",
        agent_id=repo_identity(event.cwd, hashed=bool(config.get("hash_repo"))),
        user_id=os.environ.get("ENGRAM_USER_ID") or getpass.getuser(),
        session_id=capped(event.session_id, MAX_ID_CHARS),
        metadata={"cli": event.cli},
    )
    return {"episode": episode_to_dict(draft.start), "actions": [], "tests": None, "test_runs": 0}


def _draft(saved: Mapping[str, Any]) -> EpisodeDraft:
    """The saved draft, rebuilt (its actions were validated when they were recorded)."""
    fields = dict(saved["episode"])
    draft = EpisodeDraft(fields.pop("task"), **fields)
    draft.actions = [Action(**a) for a in saved["actions"]]
    return draft


def _record_tool(saved: dict[str, Any], event: HookEvent, config: Mapping[str, Any]) -> None:
    tool = event.tool
    assert tool is not None
    output = None
    if tool.command is not None and runs_tests(tool.command, config.get("test_commands") or ()):
        run = parse_test_output(tool.output, failed=not tool.success)
        if run is not None:
            failures = [redact(line, tool.command) for line in run.failures]
            saved["tests"] = {
                "passed": run.passed,
                "total": run.total,
                "command": capped(redact(tool.command), 200),
                "failures": failures,
            }
            saved["test_runs"] += 1
            seen = saved.setdefault("failures_seen", [])  # what the tests said along the way
            seen += [f for f in failures if f not in seen][: MAX_FAILURE_LINES - len(seen)]
            output = run.summary()
    action = _draft(saved).action(
        tool.name, input=tool.summary or None, output=output, success=tool.success, error=tool.error
    )
    saved["actions"] = [*saved["actions"], to_plain(action)][-MAX_ACTIONS:]
    _remember(saved, tool.secrets)


def _remember(saved: dict[str, Any], secrets: Collection[str]) -> None:
    """Keep the digests of the secrets seen in the session (the last 100)."""
    saved["secrets"] = list(dict.fromkeys([*saved.get("secrets", ()), *secrets]))[-100:]


def _command_name(command: str) -> str:
    """A shell command's first words, up to its first argument (`python -m pytest`, `npm test`;
    `cd dir` and `NAME=value` prefixes skipped)."""
    for segment in re.split(r"&&|\|\||[;|]", command):
        words = list(itertools.dropwhile(lambda w: "=" in w, segment.split()))
        if words and words[0] != "cd":
            rest = itertools.takewhile(lambda w: w == "-m" or not re.search(r"[-/.=\"'$\[]", w), words[1:3])
            return " ".join([words[0], *rest])
    return ""


def strategy(actions: list[dict[str, Any]]) -> str | None:
    """The task's approach, as `suggest` reports what worked: its tools in the order first used, a shell
    tool by its command's first words (`Read + pytest + Edit`); at most MAX_TAG_CHARS, None without one."""
    names = [
        _command_name(a.get("input") or "") if a["action_type"] in SHELL_TOOLS else a["action_type"]
        for a in actions
        if a["action_type"] != "prompt"
    ]
    text = " + ".join(dict.fromkeys(n for n in names if n))
    return capped("".join(c for c in text if c.isprintable()), MAX_TAG_CHARS) or None


def completed(saved: Mapping[str, Any], answer: str | None, *, ended_by: str) -> dict[str, Any]:
    """The finished episode of a saved draft, JSON-shaped: the outcome of its last test run (every test
    passed: success; some: partial; none, or the run errored: failure) with reward = pass rate and
    iterations = test runs; without a test run, `partial` with no reward and the details saying so.
    `answer` (the agent's last message) is the solution, redacted and capped; every word that is one of
    the secrets the task saw (`saved["secrets"]`: their digests) is redacted in every field."""
    tests = saved.get("tests")
    fields: dict[str, Any] = {"iterations": saved.get("test_runs", 0)}
    if answer:
        fields["solution"] = capped(redact(answer), MAX_SOLUTION_CHARS)
    if tests is None:
        outcome = "partial"
        fields["outcome_details"] = f"not measured: no test run in this task ({ended_by})"
    else:
        passed, total = tests["passed"], tests["total"]
        outcome = "success" if total and passed == total else "partial" if passed else "failure"
        summary = f"{passed}/{total} tests passed" if total else "the tests errored before any ran"
        said = [f"`{tests['command']}`: {summary}", *tests["failures"]]
        earlier = [f for f in saved.get("failures_seen", []) if f not in tests["failures"]]
        if earlier:
            said.append("failing earlier: " + "; ".join(earlier))
        fields["feedback"] = {
            "tests_passed": passed,
            "tests_total": total,
            "reward": passed / total if total else 0.0,
            "message": capped("; ".join(said), 1000),
        }
        fields["outcome_details"] = f"last of {saved.get('test_runs', 0)} test runs: {summary} ({ended_by})"
    fields["strategy_used"] = strategy(saved["actions"])
    episode = _draft(saved).completion(outcome, keep_actions=None, **fields)
    return redact_seen(episode_to_dict(episode), saved.get("secrets", ()))  # the task's secrets, anywhere


# the service -----------------------------------------------------------------------------------------
def _client(url: str, api_key: str | None, timeout: float) -> Engram:
    return Engram(url, api_key=api_key, timeout=max(0.05, timeout), max_retries=0)


def flush(url: str, api_key: str | None) -> None:
    """Send spooled episodes, oldest first, for at most PUBLISH_SECONDS, removing each once it is done
    with: published, or refused (a 4xx other than 408/429 is logged and dropped: sending it again would
    be refused again); the first that fails otherwise stays, with those after it. A file leaves the
    spool only after its answer, and the ids are fixed, so one sent twice (its answer lost, the hook
    killed) is still one episode."""
    deadline = time.monotonic() + PUBLISH_SECONDS
    for path in state.spooled():
        left = deadline - time.monotonic()
        if left <= 0.1:
            break
        episode = state.read(path)
        if episode is not None:
            try:
                with _client(url, api_key, left) as client:
                    client.publish([episode])
                log.info("published episode %s", episode["episode_id"])
            except (EngramError, OSError, ValueError) as exc:
                if not isinstance(exc, ApiError) or not 400 <= exc.status < 500 or exc.status in (408, 429):
                    log.warning("episode %s not published (%s): stays spooled", episode["episode_id"], exc)
                    break
                log.error("episode %s refused (%s): dropped", episode["episode_id"], exc)
        path.unlink(missing_ok=True)


def _line(hit_episode: Mapping[str, Any]) -> str:
    """One recalled episode as the agent reads it: the task, its outcome and what the tests said, the
    approach (its last actions), and what worked (a success's solution) or the last answer."""
    ep = hit_episode
    fb = ep.get("feedback") or {}
    tests = (
        f", {fb['tests_passed']}/{fb['tests_total']} tests passed"
        if fb.get("tests_total") is not None and fb.get("tests_passed") is not None
        else ", no test run"
    )
    lines = [f'- tried before: "{capped(ep["task"]["description"], 160)}" — {ep.get("outcome")}{tests}']
    if fb.get("message"):
        lines.append(f"  tests said: {capped(fb['message'], 300)}")
    steps = [
        f"{a['action_type']} {a.get('input') or ''}".strip()
        + (f" → {a['output']}" if a.get("output") else "")
        for a in ep.get("actions") or ()
        if a["action_type"] != "prompt"
    ]
    steps = [s for i, s in enumerate(steps) if not i or s != steps[i - 1]]  # a test run again is a step
    if steps:
        lines.append("  approach: " + capped("; ".join(steps[-6:]), 400))
    if ep.get("solution"):
        label = "what worked" if ep.get("outcome") == "success" else "its last answer"
        lines.append(f"  {label}: {capped(ep['solution'], 300)}")
    return "\n".join(lines)


def _advice(found: Suggestion) -> str | None:
    """`suggest`'s verdict in one line: how similar tasks went and the strategies that worked (the
    failures are in the episodes shown, with what the tests said); None at low confidence or without a
    strategy that worked."""
    # a bare shell tool's name ("Bash", from an episode recorded without `strategy_used`) says nothing
    named = [s for s, _ in found.successful_strategies if not SHELL_TOOLS & set(s.split(" + "))]
    if found.confidence == "low" or not named:
        return None
    return (
        f"Advice ({found.confidence} confidence): {found.similar} similar tasks, {found.successes} succeeded, "
        f"{found.failures} failed; strategies that worked: {', '.join(named[:3])}"
    )


def context_for(
    prompt: str, agent_id: str, url: str, api_key: str | None, budget: float = RECALL_SECONDS
) -> str | None:
    """The context block for a prompt: this repository's past episodes that recall finds relevant (at
    least MIN_RELEVANCE: none is an answer), and `suggest`'s verdict when it has one;
    None when nothing is relevant or the service did not answer within `budget` seconds."""
    deadline = time.monotonic() + budget
    try:
        with _client(url, api_key, budget) as client:
            found: Recall = client.recall(prompt, agent_id=agent_id, top_k=TOP_K, min_relevance=MIN_RELEVANCE)
            hits = [h.episode for h in found.results if h.episode.outcome and h.episode.task]
            if not hits:
                return None
            header = "Engram: earlier attempts at similar tasks in this repository (outcomes measured by its tests)"
            text = "\n".join([header, *(_line(episode_to_dict(ep)) for ep in hits)])
            left = deadline - time.monotonic()
            if left > 0.2:
                client.timeout = left
                try:
                    advice = _advice(client.suggest(prompt, agent_id=agent_id))
                    text += f"\n{advice}" if advice else ""
                except (EngramError, OSError, ValueError) as exc:  # the episodes still go
                    log.warning("no advice: suggest failed (%s)", exc)
    except (EngramError, OSError, ValueError) as exc:
        log.warning("no context: recall failed (%s)", exc)
        return None
    return capped(text, MAX_CONTEXT_CHARS)


# one invocation ----------------------------------------------------------------------------------------
def _output(cli: str, event_name: str, context: str | None = None) -> str:
    if context:
        return json.dumps({"hookSpecificOutput": {"hookEventName": event_name, "additionalContext": context}})
    return "{}" if cli == "gemini-cli" else ""  # Gemini CLI parses stdout as JSON


def handle(cli: str, event_name: str, raw: str, *, url: str, api_key: str | None) -> str:
    """Run the hook for one event (`raw`: the CLI's JSON) and return what to print on stdout. Raises
    nothing the caller must handle beyond what `main` swallows."""
    event = read_event(cli, event_name, json.loads(raw) if raw.strip() else None)
    if event is None:
        log.info("%s %s: not an event Engram records", cli, event_name)
        return _output(cli, event_name)
    config = state.load_config()
    finished = False
    context = None
    if event.kind == "session":
        for path in state.idle_sessions(IDLE_SECONDS):  # their CLI stopped without an end event
            with state.session_at(path) as saved:
                if saved:
                    state.spool(
                        completed(saved, None, ended_by=f"no end event in {IDLE_SECONDS // 3600:g} h")
                    )
                    saved.clear()
        flush(url, api_key)
        return _output(cli, event_name)
    with state.session(cli, event.session_id) as saved:
        if event.kind == "start":
            if saved:  # a prompt while the task is open (an interrupted turn): it goes on
                action = _draft(saved).action("prompt", input=capped(redact(event.prompt or ""), 500))
                saved["actions"] = [*saved["actions"], to_plain(action)][-MAX_ACTIONS:]
            else:
                saved.update(_open_draft(event, config))
            _remember(saved, secrets_in(event.prompt or ""))
            agent_id = saved["episode"]["agent_id"]
        elif not saved:
            log.info("%s %s: no open task in this session", cli, event_name)
        elif event.kind == "tool":
            _record_tool(saved, event, config)
        else:  # end, session_end
            answer = event.answer or last_answer(event.transcript_path)
            ended_by = event.name + (f": {event.source}" if event.source else "")
            # spooled with the draft's removal: a hook killed before the service answered loses nothing
            state.spool(completed(saved, answer, ended_by=ended_by))
            saved.clear()
            finished = True
    if event.kind == "start" and event.prompt:
        context = context_for(event.prompt, agent_id, url, api_key)
    if finished:
        flush(url, api_key)
    return _output(cli, event_name, context)


def main(cli: str, event_name: str, raw: str, *, url: str, api_key: str | None) -> str:
    """`handle`, with every error logged and swallowed: the CLI always gets exit status 0 and valid output."""
    state.start_log()
    started = time.monotonic()
    try:
        out = handle(cli, event_name, raw, url=url, api_key=api_key)
    except Exception:  # a hook never fails the agent: the error is in hooks.log
        log.exception("%s %s failed", cli, event_name)
        out = _output(cli, event_name)
    log.info("%s %s done in %.2fs", cli, event_name, time.monotonic() - started)
    return out
