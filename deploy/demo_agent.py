"""`python -m deploy.demo_agent`: a pretend agent that publishes episodes and recalls them (exit 0 = works).

Publishes five finished coding episodes through the Python SDK (straight to the Redis stream), waits
until the consolidator has projected every one of them (`GET /v1/episodes/{id}` on the query service
returns this run's copy), then asks `POST /v1/recall` which past experience is worth replaying for a new
task and prints the answer. Used by `docker compose --profile demo up demo-agent` and by
tests/integration/test_deploy.py.

The episode ids are fixed (`demo-1` .. `demo-5`): running the demo again updates the same five
episodes, it never adds copies. Each run stamps `metadata.demo_run` so the wait sees this run's write.

Environment: `REDIS_URL` and `ENGRAM_PREFIX` (as every service), `ENGRAM_QUERY_URL` (default
`http://127.0.0.1:8080`), `ENGRAM_DEMO_API_KEY` (the Bearer key; empty when the query service runs
without keys), `ENGRAM_DEMO_NAMESPACE` (the namespace that key maps to, default `default`),
`ENGRAM_DEMO_TIMEOUT` (how long to wait for consolidation, default `120s`), `ENGRAM_LOG_LEVEL`.
Exit codes: 0 recalled, 1 timed out or recall returned nothing, 2 bad configuration.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp

from engram_episodic.errors import ConfigError, PublishError
from shared.sdk import EngramClient
from shared.settings import Settings, parse_duration

EPISODES: tuple[dict[str, Any], ...] = (
    {"task": {"description": "fix the flaky login test that fails with 401 after midnight",
              "category": "debugging", "complexity": 0.4},
     "solution": "freeze the clock with a fixture; the token expiry used wall time",
     "outcome": "success", "importance": 7, "strategy_used": "iterative",
     "feedback": {"reward": 1.0, "tests_passed": 42, "tests_total": 42}},
    {"task": {"description": "add pagination to the /orders endpoint", "category": "code_generation",
              "complexity": 0.5},
     "solution": "cursor pagination on (created_at, id)", "outcome": "success", "importance": 5,
     "strategy_used": "test_first", "feedback": {"reward": 0.9}},
    {"task": {"description": "speed up the nightly report query", "category": "refactoring",
              "complexity": 0.7},
     "solution": "a covering index; the ORM was loading every column", "outcome": "partial",
     "importance": 6, "strategy_used": "profile_first", "feedback": {"reward": 0.5}},
    {"task": {"description": "write tests for the payment retry logic", "category": "testing",
              "complexity": 0.3},
     "solution": "a fake clock and a scripted gateway", "outcome": "success", "importance": 4,
     "strategy_used": "test_first", "feedback": {"reward": 1.0, "tests_passed": 12, "tests_total": 12}},
    {"task": {"description": "debug the intermittent timeout in the login service", "category": "debugging",
              "complexity": 0.8},
     "solution": "connection pool exhausted; raised the pool size and added a timeout",
     "outcome": "failure", "importance": 8, "strategy_used": "bisect", "feedback": {"reward": 0.0}},
)
QUESTION = "the login test fails only at night"


def _config(env: Mapping[str, str]) -> tuple[Settings, str, str, str, float]:
    settings = Settings.from_env(env)
    if not settings.redis_url:
        raise ConfigError("REDIS_URL is not set (the demo publishes straight to the Redis stream)")
    url = env.get("ENGRAM_QUERY_URL", "http://127.0.0.1:8080").rstrip("/")
    key = env.get("ENGRAM_DEMO_API_KEY", "")
    namespace = env.get("ENGRAM_DEMO_NAMESPACE", "") or settings.default_namespace
    timeout = parse_duration(env.get("ENGRAM_DEMO_TIMEOUT", "120s"), name="ENGRAM_DEMO_TIMEOUT")
    return settings, url, key, namespace, timeout


async def _published(settings: Settings, namespace: str, run: str) -> list[str]:
    async with EngramClient.connect(settings.redis_url, namespace=namespace, prefix=settings.prefix,
                                    publish_timeout=settings.publish_timeout,
                                    retries=settings.publish_retries) as client:
        ids = []
        for i, episode in enumerate(EPISODES, start=1):
            ids.append(await client.record({**episode, "episode_id": f"demo-{i}", "agent_id": "demo-agent",
                                            "metadata": {"demo_run": run}}))
    return ids


async def _consolidated(http: aiohttp.ClientSession, url: str, episode_id: str, run: str) -> bool:
    try:
        async with http.get(f"{url}/v1/episodes/{episode_id}") as resp:
            if resp.status != 200:
                return False
            body = await resp.json()
    except (aiohttp.ClientError, TimeoutError):
        return False
    return (body.get("episode", {}).get("metadata") or {}).get("demo_run") == run


async def main(env: Mapping[str, str]) -> int:
    try:
        settings, url, key, namespace, timeout = _config(env)
    except ConfigError as exc:
        print(f"demo-agent: {exc}", file=sys.stderr)
        return 2
    run = uuid.uuid4().hex[:12]
    try:
        ids = await _published(settings, namespace, run)
    except PublishError as exc:
        print(f"demo-agent: {exc}", file=sys.stderr)
        return 1
    print(f"demo-agent ◆ published {len(ids)} episodes to namespace {namespace!r} (run {run})", flush=True)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as http:
        waiting = list(ids)
        while waiting:
            waiting = [i for i in waiting if not await _consolidated(http, url, i, run)]
            if waiting and time.monotonic() > deadline:
                print(f"demo-agent: {len(waiting)} episode(s) not consolidated after {timeout:g}s: "
                      f"{', '.join(waiting)}", file=sys.stderr)
                return 1
            if waiting:
                await asyncio.sleep(0.25)
        print(f"demo-agent ◆ all {len(ids)} episodes consolidated", flush=True)
        async with http.post(f"{url}/v1/recall", json={"query": QUESTION, "top_k": 3}) as resp:
            body = await resp.json()
            if resp.status != 200:
                print(f"demo-agent: recall answered {resp.status}: {json.dumps(body)[:500]}", file=sys.stderr)
                return 1
    results = body.get("results") or []
    print(f"demo-agent ◆ recall {QUESTION!r} → {len(results)} experience(s)", flush=True)
    for r in results:
        ep = r.get("episode", r)
        task = ep.get("task") or {}
        print(f"  {ep.get('episode_id')}: {task.get('description') if isinstance(task, dict) else task} "
              f"[{ep.get('outcome')}] priority={r.get('priority', 0):.3f}", flush=True)
    return 0 if results else 1


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("ENGRAM_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    sys.exit(asyncio.run(main(os.environ)))
