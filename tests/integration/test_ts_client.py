"""The TypeScript client (client-ts/, npm `engram-episodic`) against the real stack: Redis, a consolidator
and the query service on private ports, as the Python client's tests run them. The Node suite
(client-ts/test/*.test.ts, `node --test`) gets the service's address in ENGRAM_URL / ENGRAM_API_KEY, and a
second service whose consolidator never reads (ENGRAM_MAX_LAG 2) in ENGRAM_LAG_URL for the 429 path.

The pinned Node dependencies (client-ts/package-lock.json) are installed with `npm ci` on first use. Without
node/npm on the PATH the tests are skipped with that reason; CI has Node 20."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.consolidator.worker import Worker
from shared import streams
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

    asyncio.run_coroutine_threadsafe(idle_group(), lag_app.loop).result(timeout=30)
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
