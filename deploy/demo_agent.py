"""`python -m deploy.demo_agent`: a pretend agent that records episodes and recalls them (exit 0 = works).

An agent as production runs them: only the query service, through `engram_episodic.AsyncEngram` with
an API key. It records five finished episodes (fixed ids `demo-1`..`demo-5`, so a rerun updates them;
`metadata.demo_run` marks this run's write), waiting until they are projected, then recalls and prints
the experience worth replaying. Used by `docker compose --profile demo up demo-agent` and test_deploy.py.

Environment: `ENGRAM_QUERY_URL` (default `http://127.0.0.1:8080`), `ENGRAM_DEMO_API_KEY`,
`ENGRAM_DEMO_TIMEOUT` (default `120s`), `ENGRAM_LOG_LEVEL`. Exit codes: 0 recalled; 1 timed out, failed
or recalled nothing; 2 bad configuration.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Mapping
from typing import Any

from engram_episodic import AsyncEngram, EngramError, WaitTimeout
from engram_episodic.calls import MAX_WAIT
from engram_episodic.errors import ConfigError
from shared.settings import parse_duration

EPISODES: tuple[dict[str, Any], ...] = (
    {
        "task": {
            "description": "fix the flaky login test that fails with 401 after midnight",
            "category": "debugging",
            "complexity": 0.4,
        },
        "solution": "freeze the clock with a fixture; the token expiry used wall time",
        "outcome": "success",
        "importance": 7,
        "strategy_used": "iterative",
        "feedback": {"reward": 1.0, "tests_passed": 42, "tests_total": 42},
    },
    {
        "task": {
            "description": "add pagination to the /orders endpoint",
            "category": "code_generation",
            "complexity": 0.5,
        },
        "solution": "cursor pagination on (created_at, id)",
        "outcome": "success",
        "importance": 5,
        "strategy_used": "test_first",
        "feedback": {"reward": 0.9},
    },
    {
        "task": {
            "description": "speed up the nightly report query",
            "category": "refactoring",
            "complexity": 0.7,
        },
        "solution": "a covering index; the ORM was loading every column",
        "outcome": "partial",
        "importance": 6,
        "strategy_used": "profile_first",
        "feedback": {"reward": 0.5},
    },
    {
        "task": {
            "description": "write tests for the payment retry logic",
            "category": "testing",
            "complexity": 0.3,
        },
        "solution": "a fake clock and a scripted gateway",
        "outcome": "success",
        "importance": 4,
        "strategy_used": "test_first",
        "feedback": {"reward": 1.0, "tests_passed": 12, "tests_total": 12},
    },
    {
        "task": {
            "description": "debug the intermittent timeout in the login service",
            "category": "debugging",
            "complexity": 0.8,
        },
        "solution": "connection pool exhausted; raised the pool size and added a timeout",
        "outcome": "failure",
        "importance": 8,
        "strategy_used": "bisect",
        "feedback": {"reward": 0.0},
    },
)
QUESTION = "the login test fails only at night"


def _config(env: Mapping[str, str]) -> tuple[str, str, float]:
    url = env.get("ENGRAM_QUERY_URL", "http://127.0.0.1:8080").rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"ENGRAM_QUERY_URL={url[:80]!r} must start with http:// or https://")
    key = env.get("ENGRAM_DEMO_API_KEY", "")
    timeout = parse_duration(env.get("ENGRAM_DEMO_TIMEOUT", "120s"), name="ENGRAM_DEMO_TIMEOUT")
    return url, key, timeout


async def main(env: Mapping[str, str]) -> int:
    try:
        url, key, timeout = _config(env)
    except ConfigError as exc:
        print(f"demo-agent: {exc}", file=sys.stderr)
        return 2
    run = uuid.uuid4().hex[:12]
    try:
        async with AsyncEngram(url, api_key=key or None, timeout=30.0) as memory:
            return await _demo(memory, run, timeout)
    except EngramError as exc:
        print(f"demo-agent: {exc}", file=sys.stderr)
        return 1


async def _demo(memory: AsyncEngram, run: str, timeout: float) -> int:
    episodes = [
        {**episode, "episode_id": f"demo-{i}", "agent_id": "demo-agent", "metadata": {"demo_run": run}}
        for i, episode in enumerate(EPISODES, start=1)
    ]
    deadline = time.monotonic() + timeout
    # answered once projected (read-your-writes, at most MAX_WAIT a call): again until the deadline
    while True:
        try:
            await memory.publish(episodes, wait=min(MAX_WAIT, max(1.0, deadline - time.monotonic())))
            break
        except WaitTimeout as exc:
            if time.monotonic() >= deadline:
                print(f"demo-agent: not consolidated after {timeout:g}s: {exc}", file=sys.stderr)
                return 1
    print(
        f"demo-agent ◆ recorded {len(episodes)} episodes (run {run}); all {len(episodes)} episodes consolidated",
        flush=True,
    )
    found = await memory.recall(QUESTION, top_k=3)
    print(f"demo-agent ◆ recall {QUESTION!r} → {len(found)} experience(s)", flush=True)
    for hit in found:
        ep = hit.episode
        print(
            f"  {ep.episode_id}: {ep.task.description if ep.task else ''} [{ep.outcome}] "
            f"priority={hit.priority:.3f}",
            flush=True,
        )
    return 0 if found.results else 1


if __name__ == "__main__":
    from shared.logs import configure

    configure(os.environ)
    sys.exit(asyncio.run(main(os.environ)))
