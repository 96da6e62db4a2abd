"""The query service opens its port at once and loads behind it (services.query.startup): /readyz 503
with what is pending, the API 503 problem+json, then ready; a failed start-up still fails the process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from deploy.embedded_redis import EmbeddedRedis, free_port
from engram_episodic.errors import Conflict
from services.query.app import make_app
from services.query.appkeys import STARTUP
from shared.embedding import HashingEmbedder
from tests.helpers import spawn_query_service, wait_until

ROOT = Path(__file__).resolve().parents[2]


class SlowModel(HashingEmbedder):
    """An embedder whose `load()` (a model's unpack and load) lasts until the test sets `release`."""

    def __init__(self, dim: int):
        super().__init__(dim)
        self.release = asyncio.Event()
        self._loaded = False

    @property
    def loaded(self) -> bool:
        return self._loaded

    async def load(self) -> None:
        await self.release.wait()
        self._loaded = True


async def test_the_api_answers_503_with_what_is_pending_until_the_model_is_loaded(
    aiohttp_client, settings, redis
):
    model = SlowModel(settings.embed_dim)
    app = make_app(settings, redis=redis, embedder=model, background_start=True)
    client = await aiohttp_client(app)  # serves although the model is still loading
    resp = await client.get("/readyz")
    body = await resp.json()
    assert resp.status == 503 and body["status"] == "starting", body
    assert body["pending"] == ["embedder", "index"] and body["checks"]["embedder"] is False
    assert body["checks"]["index"] is False  # pending here, whatever Redis holds: the two agree
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/openapi.json")).status == 200
    resp = await client.post("/v1/recall", json={"query": "flaky login test"})
    assert resp.status == 503 and resp.content_type == "application/problem+json"
    assert resp.headers["Retry-After"] == "2"
    problem = await resp.json()
    assert problem["pending"] == ["embedder", "index"] and "starting" in problem["detail"]
    model.release.set()

    async def ready():
        return (await client.get("/readyz")).status == 200

    await wait_until(ready, timeout=15, message="/readyz 200 once loaded")
    resp = await client.post("/v1/recall", json={"query": "flaky login test"})
    assert resp.status == 200, await resp.text()


async def test_every_route_the_start_up_holds_back_documents_its_503(aiohttp_client, settings, redis):
    """The start-up gate's 503 is in the OpenAPI document. Every operation outside
    `operations` lists it, and answers it while the start-up runs (ids and bodies need not be valid:
    the gate answers before any handler reads them); the operations routes it lets through answer."""
    import re

    model = SlowModel(settings.embed_dim)
    client = await aiohttp_client(make_app(settings, redis=redis, embedder=model, background_start=True))
    doc = await (await client.get("/openapi.json")).json()
    gated = 0
    for path, ops in doc["paths"].items():
        url = re.sub(r"\{\w+\}", "x", path)
        for method, op in ops.items():
            resp = await client.request(method, url, json={} if method in ("post", "patch") else None)
            if op["tags"] == ["operations"]:
                assert resp.status != 503 or path == "/readyz", (method, path)
                continue
            gated += 1
            assert "starting" in op["responses"]["503"]["description"], (method, path)
            assert resp.status == 503 and "starting" in (await resp.json())["detail"], (method, path)
    assert gated >= 20
    model.release.set()
    await wait_until(lambda: _ready(client), timeout=15, message="/readyz 200 once loaded")


async def _ready(client) -> bool:
    return (await client.get("/readyz")).status == 200


async def test_a_background_start_up_that_conflicts_is_raised_by_wait(aiohttp_client, settings, redis):
    first = make_app(settings, redis=redis, embedder=HashingEmbedder(settings.embed_dim))
    await aiohttp_client(first)  # records hashing/256 for generation 1
    app = make_app(settings, redis=redis, embedder=HashingEmbedder(128), background_start=True)
    await aiohttp_client(app)
    with pytest.raises(Conflict, match="reindex"):
        await asyncio.wait_for(app[STARTUP].wait(), 15)


@pytest.mark.slow
async def test_the_process_listens_before_redis_answers_and_turns_ready_after(settings, tmp_path):
    server = EmbeddedRedis(port=free_port(), data_dir=tmp_path / "redis")
    port, log = free_port(), tmp_path / "query.log"
    # nothing listens at server.url yet
    proc = spawn_query_service(server.url, settings.prefix, port, log, ENGRAM_LOG_LEVEL="WARNING")
    url = f"http://127.0.0.1:{port}"

    async def readyz():
        assert proc.poll() is None, log.read_text()
        try:
            async with aiohttp.ClientSession() as s, s.get(f"{url}/readyz") as r:
                return r.status, await r.json()
        except aiohttp.ClientConnectionError:
            return None

    try:
        status, body = await wait_until(readyz, timeout=60, message="the port answers")
        assert status == 503 and body["status"] == "starting" and body["pending"] == ["index"], body
        server.start()

        async def ready():
            got = await readyz()
            return got is not None and got[0] == 200

        await wait_until(ready, timeout=60, message="/readyz 200 once Redis is up")
    finally:
        proc.terminate()
        code = proc.wait(timeout=30)
        server.kill()
    assert code == 0, log.read_text()


@pytest.mark.slow  # the service as a process
async def test_ctrl_c_under_make_run_lets_requests_in_flight_finish(redis_url, prefix, tmp_path):
    """Ctrl-C under `make run` is two signals: the terminal's SIGINT reaches the service, then the
    supervisor sends SIGTERM. The second interrupted aiohttp's drain (16 of 16
    recalls in flight got no answer, exit 1, "Task was destroyed but it is pending!"). Requests held
    open by `?wait` (no consolidator runs, so they wait out their timeout) must all be answered."""
    import signal

    import redis.asyncio as aioredis

    from shared.keys import Keys

    port, log = free_port(), tmp_path / "query.log"
    proc = spawn_query_service(redis_url, prefix, port, log, ENGRAM_EMBED_DIM="64")
    url = f"http://127.0.0.1:{port}"
    r = aioredis.from_url(redis_url)
    try:

        async def ready() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                async with aiohttp.ClientSession() as s, s.get(f"{url}/readyz") as resp:
                    return resp.status == 200
            except aiohttp.ClientConnectionError:
                return False

        await wait_until(ready, timeout=60, message="query service ready")
        async with aiohttp.ClientSession() as session:

            async def publish(i: int) -> int:
                body = {"episode_id": f"held-{i}", "task": "a task", "outcome": "success"}
                async with session.post(f"{url}/v1/episodes?wait=4", json=body) as resp:
                    return resp.status

            held = [asyncio.ensure_future(publish(i)) for i in range(4)]
            stream = Keys(prefix).stream

            async def all_published() -> bool:
                return await r.xlen(stream) >= 4

            await wait_until(all_published, message="the held requests are in flight")
            proc.send_signal(signal.SIGINT)

            async def draining() -> bool:  # the first signal is handled: the port no longer listens
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    return True
                writer.close()
                return False

            await wait_until(draining, message="the drain started")
            proc.send_signal(signal.SIGTERM)  # the supervisor's, during the drain
            statuses = await asyncio.gather(*held, return_exceptions=True)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await r.aclose()
    text = log.read_text()
    assert statuses == [202] * 4, (statuses, text)
    assert code == 0, text
    assert "destroyed" not in text and "Traceback" not in text, text
