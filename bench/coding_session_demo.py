"""Coding agents that learn from their own runs: fixture sessions of Claude Code replayed through
`engram hook claude-code <event>` against a real Engram, the project's tests as the reward.

    python -m bench.coding_session_demo                         # a private stack (Redis, worker, query)
    python -m bench.coding_session_demo --url URL --api-key KEY  # a running one (`make run`)

A small repository, `calc`, has a failing `parse_date` test. Attempt 1 ends with the tests still failing
(tests/fixtures/agent_hooks/claude_code_tests_still_failing.json); attempt 2 is given attempt 1's failure
and approach as context, and its tests fail then pass (claude_code_fail_then_pass.json); attempt 3 is
given both: what failed and what fixed it. A session of another repository on the same task is given
nothing. The script prints each context and each episode, and exits 1 if one is not what it should be.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "agent_hooks"
Invoke = Callable[[str, str, str], str]
"""Run `engram hook CLI EVENT` with a payload on stdin: (cli, event, stdin) → stdout."""


def load(name: str) -> dict[str, Any]:
    """A fixture session: {"cli", "about", "transcript": [JSONL entries], "steps": [{"event", "payload"}]}."""
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def _filled(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        for name, text in names.items():
            value = value.replace(name, text)
        return value
    if isinstance(value, list):
        return [_filled(v, names) for v in value]
    if isinstance(value, dict):
        return {k: _filled(v, names) for k, v in value.items()}
    return value


def replay(invoke: Invoke, fixture: dict[str, Any], *, repo: Path, session: str, workdir: Path) -> list[str]:
    """Replay a fixture session in `repo` as session `session` (its $REPO, $SESSION and $TRANSCRIPT
    filled; the transcript written under `workdir`); each step's stdout, in order."""
    transcript = workdir / f"{session}.jsonl"
    names = {"$REPO": str(repo), "$SESSION": session, "$TRANSCRIPT": str(transcript)}
    if fixture["transcript"]:
        lines = (json.dumps(_filled(e, names)) for e in fixture["transcript"])
        transcript.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [
        invoke(fixture["cli"], step["event"], json.dumps(_filled(step["payload"], names)))
        for step in fixture["steps"]
    ]


def context_of(output: str) -> str | None:
    """The additionalContext a hook's stdout gives the agent (None: nothing)."""
    return json.loads(output)["hookSpecificOutput"]["additionalContext"] if output.strip() else None


def subprocess_invoke(env: dict[str, str]) -> Invoke:
    """`engram hook` as the CLIs run it: a process, the payload on stdin, a time bound."""

    def invoke(cli: str, event: str, stdin: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "engram_episodic.cli", "hook", cli, event],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"engram hook {cli} {event} exited {done.returncode}: {done.stderr}")
        return done.stdout

    return invoke


@contextmanager
def private_stack() -> Iterator[tuple[str, str]]:
    """A Redis, a worker and a query service of their own (the hashing embedder); (url, api key)."""
    from bench.common import (
        free_port,
        private_redis,
        service_env,
        spawn_query_service,
        spawn_workers,
        stop_processes,
        wait_http_ready,
    )

    key = "demo-key-0123456789"
    with private_redis() as redis:
        env = service_env(redis.url, "demo:", "hashing", ENGRAM_API_KEYS=f"{key}=demo")
        procs = spawn_workers(1, env, name="demo")
        port = free_port()
        procs.append(spawn_query_service(env, port))
        url = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(wait_http_ready(url, procs[-1]))
            yield url, key
        finally:
            stop_processes(procs)


def _episode(url: str, key: str, session: str) -> dict[str, Any]:
    """The session's episode once the worker projected it."""
    from engram_episodic import Engram

    with Engram(url, api_key=key) as client:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            page = client.list_episodes(session_id=session)
            if page.episodes and page.episodes[0].outcome:
                return json.loads(json.dumps(page.raw["results"][0]))
            time.sleep(0.1)
    raise SystemExit(f"the episode of session {session} was not projected in 30 s")


def run(url: str, key: str, workdir: Path) -> list[str]:
    """The demo against the service at `url`; the problems found (empty: as it should be)."""
    env = {**os.environ, "ENGRAM_URL": url, "ENGRAM_API_KEY": key, "XDG_STATE_HOME": str(workdir / "state")}
    invoke = subprocess_invoke(env)
    calc, other = workdir / "calc", workdir / "other"
    calc.mkdir()
    other.mkdir()
    problems: list[str] = []

    def attempt(n: int, fixture: str, repo: Path, expect: list[str]) -> None:
        session = f"demo-attempt-{n}"
        outputs = replay(invoke, load(fixture), repo=repo, session=session, workdir=workdir)
        context = next((context_of(o) for o in outputs if o.strip()), None)
        print(f"\n== attempt {n} ({repo.name}): context given with the prompt ==\n{context or '(nothing)'}")
        problems.extend(
            f"attempt {n}: context lacks {text!r}" for text in expect if text not in (context or "")
        )
        if not expect and context:
            problems.append(f"attempt {n}: context given where none is relevant")
        ep = _episode(url, key, session)
        fb = ep.get("feedback") or {}
        print(
            f"-- episode: outcome {ep['outcome']}, reward {fb.get('reward')}, tests "
            f"{fb.get('tests_passed')}/{fb.get('tests_total')}, {ep.get('iterations')} test runs, "
            f"{len(ep.get('actions') or [])} actions"
        )

    attempt(1, "claude_code_tests_still_failing.json", calc, [])
    attempt(
        2,
        "claude_code_fail_then_pass.json",
        calc,
        ["failure, 0/1 tests passed", "FAILED tests/test_dates.py"],
    )
    attempt(
        3,
        "claude_code_fail_then_pass.json",
        calc,
        ["success, 3/3 tests passed", "what worked: Fixed", "failing earlier: FAILED tests/test_dates.py"],
    )
    attempt(4, "claude_code_fail_then_pass.json", other, [])
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="A running Engram (default: start a private one).")
    parser.add_argument("--api-key", default=os.environ.get("ENGRAM_API_KEY"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="engram-demo-") as tmp:
        if args.url:
            problems = run(args.url, args.api_key or "", Path(tmp))
        else:
            with private_stack() as (url, key):
                problems = run(url, key, Path(tmp))
    for problem in problems:
        print("PROBLEM:", problem)
    print("\nas expected" if not problems else f"\n{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
