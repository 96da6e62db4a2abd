"""The TypeScript client (client-ts/, npm `engram-episodic`) against the real stack: Redis, a consolidator
and the query service on private ports, as the Python client's tests run them. The Node suite
(client-ts/test/*.test.ts, `node --test`) gets the service's address in ENGRAM_URL / ENGRAM_API_KEY, and a
second service whose consolidator never reads (ENGRAM_MAX_LAG 2) in ENGRAM_LAG_URL for the 429 path.

The pinned Node dependencies (client-ts/package-lock.json) are installed with `npm ci` on first use. Without
node/npm on the PATH the tests are skipped with that reason; CI has Node 20."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_episodic import ApiError, Engram, EpisodeForgotten, InvalidEpisode, ResourceNotFound
from engram_episodic.client import Calls
from engram_episodic.errors import EngramError
from engram_episodic.events import EpisodeCompleted
from engram_episodic.validation import parse_episode
from services.consolidator.worker import Worker
from shared import streams
from shared.codec import encode
from shared.embedding import HashingEmbedder
from shared.keys import Keys
from shared.redis_conn import connect
from shared.settings import Settings
from tests.helpers import drop_prefix
from tests.integration.test_schemathesis import LiveApp

pytestmark = [
    pytest.mark.slow,  # installs the Node dependencies once, builds the package, runs Node (~1 min)
    pytest.mark.timeout(900),
]

PACKAGE = Path(__file__).resolve().parents[2] / "client-ts"
KEY = "ts-client-key-00000000000000000000"
LAG_KEY = "ts-client-lag-key-000000000000000000"
NODE_TIMEOUT = 600


def _npm() -> str:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(
            "NODE IS MISSING: the TypeScript client's tests (client-ts/) need node >= 20 and npm on the PATH"
        )
    return npm


@pytest.fixture(scope="module")
def npm() -> str:
    """npm, with client-ts/node_modules installed from the lock file (`npm ci`) when missing or older."""
    npm = _npm()
    stamp = PACKAGE / "node_modules" / ".package-lock.json"
    lock = PACKAGE / "package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
        print("engram ◆ first use: npm ci in client-ts (the pinned Node dependencies)")
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=PACKAGE,
            capture_output=True,
            text=True,
            timeout=NODE_TIMEOUT,
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return npm


def _settings(redis_url: str, prefix: str, key: str, namespace: str, **extra) -> Settings:
    return Settings(
        redis_url=redis_url,
        prefix=prefix,
        embedder="hashing",
        embed_dim=64,
        vector_algorithm="FLAT",
        api_keys={key: namespace},
        **extra,
    )


@pytest.fixture(scope="module")
def stack(redis_url) -> Iterator[dict[str, str]]:
    """Two services on private ports: one with its consolidator running, one (max_lag 2) whose
    consumer group reads nothing, so its ingest answers 429 once three entries wait."""
    prefix, lag_prefix = f"ts{uuid.uuid4().hex[:8]}:", f"tl{uuid.uuid4().hex[:8]}:"
    settings = _settings(redis_url, prefix, KEY, "ns-ts")
    lag_settings = _settings(redis_url, lag_prefix, LAG_KEY, "ns-ts-lag", max_lag=2)
    app, lag_app = LiveApp(settings), LiveApp(lag_settings)
    app.start()
    lag_app.start()
    stop = asyncio.Event()

    async def consolidate() -> None:  # the consolidator on the app's loop, as the stack runs one beside it
        r = connect(redis_url)
        worker = Worker(settings, r, HashingEmbedder(settings.embed_dim), name="ts-client")
        await worker.setup()
        while not stop.is_set():
            await worker.turn()
        await r.aclose()

    async def idle_group() -> None:
        r = connect(redis_url)
        await streams.StreamGroup(r, Keys(lag_prefix).stream, lag_settings.consumer_group).ensure()
        await r.aclose()

    async def dead_letters() -> None:
        """Two events of the wrong vector dimension, published past the service (which refuses them):
        the consolidator dead-letters them, for the Node suite's dead-letter calls."""
        r = connect(redis_url)
        events = [
            encode(
                EpisodeCompleted(
                    namespace="ns-ts",
                    episode_id=eid,
                    occurred_at=1.0,
                    episode=parse_episode(
                        {
                            "episode_id": eid,
                            "task": "rotate the keys",
                            "outcome": "failure",
                            "vector": [0.5] * 3,
                        }
                    ),
                )
            )
            for eid in ("ts-dead-1", "ts-dead-2")
        ]
        await streams.publish(r, Keys(prefix).stream_of("ns-ts"), events)
        await r.aclose()

    asyncio.run_coroutine_threadsafe(idle_group(), lag_app.loop).result(timeout=30)
    asyncio.run_coroutine_threadsafe(dead_letters(), app.loop).result(timeout=30)
    running = asyncio.run_coroutine_threadsafe(consolidate(), app.loop)
    try:
        yield {
            "ENGRAM_URL": app.url,
            "ENGRAM_API_KEY": KEY,
            "ENGRAM_LAG_URL": lag_app.url,
            "ENGRAM_LAG_API_KEY": LAG_KEY,
        }
    finally:
        app.loop.call_soon_threadsafe(stop.set)
        running.result(timeout=30)
        app.stop()
        lag_app.stop()
        drop_prefix(redis_url, prefix)
        drop_prefix(redis_url, lag_prefix)


def _run(npm: str, script: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        [npm, "run", "--silent", script],
        cwd=PACKAGE,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
    )
    assert done.returncode == 0, f"npm run {script} failed:\n{done.stdout[-12000:]}\n{done.stderr[-6000:]}"


def test_package_and_examples_type_check(npm):
    """`tsc --noEmit` on the package (browser/edge libs only: no Node module in its core) and the examples."""
    _run(npm, "check")


def test_node_suite_against_the_running_stack(npm, stack):
    """Every method, the errors, retries, parts, pagination, forgets, the AI SDK tools and the generated
    types against the service's own /openapi.json (client-ts/test/)."""
    _run(npm, "test", stack)


CORE = ("index.js", "errors.js", "parts.js", "openapi.js", "tools.js")


def test_packed_tarball_installs_offline_and_runs_the_quickstart(npm, stack, tmp_path):
    """`npm pack` → a tarball that installs into an empty project with no registry (`--offline`) and runs
    the README's ten-line example (client-ts/examples/quickstart.ts is plain JavaScript too) under Node, Bun and
    Deno; its core
    imports nothing but its own modules (no Node built-in: browsers and edge runtimes load it)."""
    _run(npm, "build")
    packed = subprocess.run(
        [npm, "pack", "--pack-destination", str(tmp_path)],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
    )
    assert packed.returncode == 0, packed.stderr
    tarball = tmp_path / packed.stdout.strip().splitlines()[-1]
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text('{"name": "app", "private": true, "type": "module"}\n')
    installed = subprocess.run(
        [npm, "install", "--offline", "--no-audit", "--no-fund", str(tarball)],
        cwd=app,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    dist = app / "node_modules" / "engram-episodic" / "dist"
    for name in CORE:
        imports = re.findall(r'^(?:import|export)[^;]*? from "([^"]+)"', (dist / name).read_text(), re.M)
        assert all(i.startswith("./") for i in imports), (name, imports)
    (app / "quickstart.mjs").write_text((PACKAGE / "examples" / "quickstart.ts").read_text())
    bins = PACKAGE / "node_modules" / ".bin"  # Bun and Deno: pinned devDependencies, binaries from npm
    for runtime in (
        ["node"],
        [str(bins / "bun"), "run"],
        [str(bins / "deno"), "run", "--allow-net", "--allow-env", "--allow-read"],
    ):
        ran = subprocess.run(
            [*runtime, "quickstart.mjs"],
            cwd=app,
            env={**os.environ, **stack},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 0, (runtime, ran.stdout + ran.stderr)
        assert "success fix the flaky login test" in ran.stdout, (runtime, ran.stdout)


# --- the cases both clients run (tests/cases/clients.json) ---------------------------------------------------
CASES = json.loads((Path(__file__).resolve().parents[1] / "cases" / "clients.json").read_text("utf-8"))[
    "cases"
]


def _fill(value: Any, run: str, saved: dict[str, Any]) -> Any:
    """`value` with "$run" replaced by this run's token and a whole "$name" string by a saved value."""
    if isinstance(value, str):
        if value.startswith("$") and value[1:] in saved:
            return saved[value[1:]]
        return value.replace("$run", run)
    if isinstance(value, list):
        return [_fill(v, run, saved) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, run, saved) for k, v in value.items()}
    return value


def _python_step(memory: Engram, step: dict[str, Any]) -> Any:
    """One case step with the Python client: the answer's JSON (the ids for record and list_episodes)."""
    op, wait = step["op"], step.get("wait")
    if op == "record":
        return memory.record(step["episode"], wait=wait)
    if op == "publish":
        return memory.call(Calls.publish(step["episodes"])[1][0].as_json())
    if op == "list_episodes":
        return [e.episode_id for e in memory.iter_episodes(**step.get("options", {}))]
    calls = {
        "get_episode": lambda: Calls.get_episode(step["id"]),
        "recall": lambda: Calls.recall(step["query"], **step.get("options", {})),
        "context": lambda: Calls.context(step["task"], **step.get("options", {})),
        "update_episode": lambda: Calls.update_episode(step["id"], wait=wait, **step["changes"]),
        "forget_episode": lambda: Calls.forget_episode(step["id"], wait=wait),
        "forget_user": lambda: Calls.forget_user(step["id"], wait=wait),
        "list_facts": lambda: Calls.list_facts(**step.get("options", {})),
        "summary": Calls.summary,
        "redrive_dead_letters": lambda: Calls.redrive_dead_letters(step["ids"]),
        "discard_dead_letters": lambda: Calls.discard_dead_letters(step["ids"]),
    }
    return memory.call(calls[op]().as_json())


def _at(answer: Any, path: str) -> Any:
    for part in path.split(".") if path else ():
        answer = answer[int(part)] if isinstance(answer, list) else answer[part]
    return answer


def _check_error(expected: Any, exc: Exception) -> None:
    if expected == "not_found":
        assert isinstance(exc, ResourceNotFound), repr(exc)
    elif expected == "forgotten":
        assert isinstance(exc, EpisodeForgotten), repr(exc)
    else:
        assert isinstance(exc, InvalidEpisode | ApiError), repr(exc)
        assert sorted({field for field, _ in exc.errors}) == sorted(expected["fields"]), exc.errors


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_shared_case_with_the_python_client(stack, case):
    """The Python half of the shared cases; client-ts/test/cases.test.ts runs the same file."""
    run, saved = uuid.uuid4().hex[:8], {}
    with Engram(stack["ENGRAM_URL"], api_key=stack["ENGRAM_API_KEY"]) as memory:
        for raw in case["steps"]:
            step = _fill(raw, run, saved)
            try:
                answer = _python_step(memory, step)
            except (EngramError, ValueError) as exc:
                assert "error" in step, f"{step['op']} raised {exc!r}"
                _check_error(step["error"], exc)
                continue
            assert "error" not in step, f"{step['op']} answered {answer!r}, expected {step['error']}"
            if "save" in step:
                saved[step["save"]] = answer
            for expect in step.get("expect", []):
                got = _at(answer, expect["path"])
                if "equals" in expect:
                    assert got == expect["equals"], (expect, got)
                if "length" in expect:
                    assert len(got) == expect["length"], (expect, got)
                if "contains" in expect:
                    assert expect["contains"] in got, (expect, got)
