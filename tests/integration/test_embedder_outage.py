"""The embedder failing, at query time and in the consolidator: a provider speaking OpenAI's API that
answers 503, hangs, closes the connection or refuses it (a real local HTTP server on a private loopback
port), and a local model that raises. Every route that embeds answers 503 with Retry-After and logs one
line without a traceback; a keyword-mode recall answers without the cosines instead
(`similarity_unavailable`). The consolidator retries the batch whole with a backoff, then dead-letters it
naming the provider's failure."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from deploy.embedded_redis import free_port
from services.consolidator import deadletters
from services.consolidator.worker import Worker
from shared.embedding import HashingEmbedder
from shared.embedding_openai import OpenAIEmbedder
from tests.helpers import wait_until
from tests.integration.test_query_support import episode, put
from tests.integration.test_worker_process import publish_many

pytestmark = pytest.mark.slow  # starts servers: `make test-fast` skips it

pytest_plugins = ["tests.integration.test_query_support"]

DIM = 256  # the test settings' embed_dim: the seeded documents' hashing vectors
EMBEDDING_ROUTES = (
    ("/v1/recall", {"query": "flaky migration test", "mode": "vector"}),
    ("/v1/recall", {"query": "flaky migration test", "mode": "hybrid"}),
    ("/v1/context", {"task": "flaky migration test"}),
    ("/v1/strategy", {"task": "flaky migration test"}),
    ("/v1/suggest", {"task": "flaky migration test"}),
    ("/v1/facts/search", {"query": "flaky migration test"}),
)


@dataclass
class Provider:
    """An embeddings server: `mode` "ok" (hashing vectors), "503" or "hang" (until released)."""

    url: str = ""
    mode: str = "ok"
    requests: int = 0
    times: list[float] = field(default_factory=list)
    inputs: list[list[str]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.times.append(time.monotonic())
        body = await request.json()
        self.inputs.append(body["input"])
        if self.mode == "503":
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        if self.mode == "hang":
            await self.release.wait()
        vectors = HashingEmbedder(DIM).embed_sync(body["input"])
        data = [{"index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        return web.json_response({"data": data, "model": body["model"]})


@pytest.fixture
async def provider() -> AsyncIterator[Provider]:
    fake = Provider()
    app = web.Application()
    app.router.add_post("/v1/embeddings", fake.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    fake.url = str(server.make_url("")).rstrip("/")
    yield fake
    fake.release.set()
    await server.close()


@pytest.fixture
async def closing_url() -> AsyncIterator[str]:
    """A server that reads the request's first bytes and closes the connection without an answer."""

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.close()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()
    await server.wait_closed()


OPENED: list[OpenAIEmbedder] = []
"""The embedders a test made (`openai_embedder`): an injected embedder is its caller's to close."""


@pytest.fixture(autouse=True)
async def _close_embedders() -> AsyncIterator[None]:
    yield
    while OPENED:
        await OPENED.pop().aclose()


def openai_embedder(url: str, retries: int = 1) -> OpenAIEmbedder:
    """An embedder of the provider at `url`, closed after the test; a short timeout and no backoff
    between its retries: the outage is reached in about a second."""
    OPENED.append(OpenAIEmbedder(url, "fake-embed", dim=DIM, timeout=0.5, retries=retries, backoff=0.0))
    return OPENED[-1]


async def seeded_client(make_client, redis, settings, embedder):
    client = await make_client(embedder=embedder)
    await put(redis, settings.prefix, "default", episode("e1", task="fix the flaky migration test"))
    return client


def no_traceback(caplog) -> None:
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [(r.name, r.getMessage()) for r in bad]


async def assert_503(client, path: str, body: dict) -> None:
    resp = await client.post(path, json=body)
    text = await resp.text()
    assert resp.status == 503, (path, body, text)
    assert resp.content_type == "application/problem+json"
    assert int(resp.headers["Retry-After"]) >= 1
    assert "embedding model is unavailable" in (await resp.json())["detail"]


async def test_a_provider_answering_503_is_a_503_on_every_route_that_embeds(
    make_client, redis, settings, provider, caplog
):
    client = await seeded_client(make_client, redis, settings, openai_embedder(provider.url))
    resp = await client.post("/v1/recall", json={"query": "migration test", "mode": "vector"})
    assert resp.status == 200 and len((await resp.json())["results"]) == 1  # the provider up
    provider.mode = "503"
    caplog.set_level(logging.INFO)
    for path, body in EMBEDDING_ROUTES:
        await assert_503(client, path, body)
    no_traceback(caplog)
    said = [r for r in caplog.records if "embedder unavailable" in r.getMessage()]
    assert len(said) == len(EMBEDDING_ROUTES) and all(r.levelno == logging.WARNING for r in said)


async def test_a_keyword_recall_answers_without_the_cosines_while_the_provider_fails(
    make_client, redis, settings, provider, caplog
):
    client = await seeded_client(make_client, redis, settings, openai_embedder(provider.url))
    resp = await client.post("/v1/recall", json={"query": "flaky migration", "mode": "keyword"})
    up = await resp.json()
    assert resp.status == 200 and up["results"][0]["similarity"] > 0
    assert "similarity_unavailable" not in up
    provider.mode = "503"
    caplog.set_level(logging.INFO)
    resp = await client.post("/v1/recall", json={"query": "migration flaky", "mode": "keyword"})
    body = await resp.json()
    assert resp.status == 200, body
    assert body["similarity_unavailable"] is True and body["mode"] == "keyword"
    assert [r["episode"]["episode_id"] for r in body["results"]] == ["e1"]
    assert body["results"][0]["similarity"] is None and body["results"][0]["relevance"] > 0
    no_traceback(caplog)


async def test_context_in_keyword_mode_answers_without_the_cosines_and_facts(
    make_client, redis, settings, provider
):
    client = await make_client(embedder=openai_embedder(provider.url), recall_mode="keyword")
    await put(redis, settings.prefix, "default", episode("e1", task="fix the flaky migration test"))
    provider.mode = "503"
    resp = await client.post("/v1/context", json={"task": "flaky migration"})
    body = await resp.json()
    assert resp.status == 200, body
    assert body["similarity_unavailable"] is True and body["facts"] == []
    assert [r["similarity"] for r in body["results"]] == [None]


async def test_a_provider_that_hangs_is_a_503(make_client, redis, settings, provider, caplog):
    client = await seeded_client(make_client, redis, settings, openai_embedder(provider.url))
    provider.mode = "hang"
    caplog.set_level(logging.INFO)
    await assert_503(client, "/v1/recall", {"query": "flaky migration", "mode": "hybrid"})
    assert provider.requests == 2  # the attempt and its one retry, each past the 0.5 s timeout
    no_traceback(caplog)


@pytest.mark.parametrize("kind", ["closes the connection", "refuses the connection"])
async def test_a_provider_that_closes_or_refuses_is_a_503(
    make_client, redis, settings, closing_url, kind, caplog
):
    url = closing_url if kind == "closes the connection" else f"http://127.0.0.1:{free_port()}"
    client = await seeded_client(make_client, redis, settings, openai_embedder(url))
    caplog.set_level(logging.INFO)
    await assert_503(client, "/v1/recall", {"query": "flaky migration", "mode": "vector"})
    resp = await client.post("/v1/recall", json={"query": "flaky migration", "mode": "keyword"})
    assert resp.status == 200 and (await resp.json())["similarity_unavailable"] is True
    no_traceback(caplog)


class RaisingModel(HashingEmbedder):
    """A local model whose forward pass raises (out of memory, a broken graph) once `broken` is set."""

    broken = False

    async def _embed_batch(self, texts):
        if self.broken:
            raise RuntimeError("CUDA out of memory (a local model's own exception)")
        return await super()._embed_batch(texts)


async def test_a_local_model_that_raises_is_a_503_not_a_500(make_client, redis, settings, caplog):
    model = RaisingModel(DIM)
    client = await seeded_client(make_client, redis, settings, model)
    model.broken = True
    caplog.set_level(logging.INFO)
    for path, body in EMBEDDING_ROUTES:
        await assert_503(client, path, body)
    resp = await client.post("/v1/recall", json={"query": "flaky migration", "mode": "keyword"})
    assert resp.status == 200 and (await resp.json())["results"][0]["similarity"] is None
    no_traceback(caplog)


async def test_the_consolidator_backs_off_then_dead_letters_naming_the_provider_failure(
    settings, redis, provider, caplog
):
    """A provider answering 503: the batch is retried whole (one request per delivery, never entry by
    entry), at growing intervals, then dead-lettered with the provider's failure as the reason; never
    acked silently, never a traceback."""
    provider.mode = "503"
    s = settings.with_(in_flight=1, max_deliveries=2)
    embedder = openai_embedder(provider.url, retries=0)
    worker = Worker(s, redis, embedder, name="outage")
    await publish_many(redis, s, 3)
    caplog.set_level(logging.INFO)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        dead = await wait_until(lambda: dead_letters(redis, s, 3), timeout=30, message="3 dead letters")
    finally:
        stop.set()
        await running
    assert provider.requests == 2  # one per delivery of the batch of 3 (max_deliveries 2)
    first, second = provider.times
    assert second - first >= 0.9  # EMBEDDER_BACKOFF: 1 s after the first failure
    for letter in dead:
        assert letter.reason.startswith("DeliveryLimit: failed 2 deliveries; last error: EmbedderUnavailable")
        assert "openai/fake-embed: HTTP 503" in letter.reason
    assert worker.processed == 0 and not await redis.exists(s.keys.episode_doc(1, "ns", "e0"))
    no_traceback(caplog)
    said = [r.getMessage() for r in caplog.records if "embedder unavailable" in r.getMessage()]
    assert len(said) == 2 and "read again in 1.0s" in said[0] and "HTTP 503" in said[0]


async def test_the_consolidator_projects_the_batch_once_the_provider_is_back(settings, redis, provider):
    provider.mode = "503"
    s = settings.with_(in_flight=1, max_deliveries=5)
    embedder = openai_embedder(provider.url, retries=0)
    worker = Worker(s, redis, embedder, name="outage")
    await publish_many(redis, s, 3)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        await wait_until(lambda: provider.requests >= 1, message="a first failed delivery")
        provider.mode = "ok"
        await wait_until(lambda: worker.processed == 3, timeout=20, message="projected after the outage")
    finally:
        stop.set()
        await running
    assert await dead_letters(redis, s, 0) == [] and provider.requests == 2
    assert await redis.exists(s.keys.episode_doc(1, "ns", "e0"))


async def dead_letters(redis, s, n: int) -> list:
    """The dead letters once there are `n` of them (`[]` for none when `n` is 0), else None."""
    got = await deadletters.list_dead_letters(redis, s.keys)
    return got if len(got) == n else None


async def test_the_query_service_tells_the_dead_letters_and_the_lag(make_client, settings, redis, provider):
    """Dead letters and consumer lag were visible only on the consolidator's port: `/readyz` and
    `/metrics` of the query service say them too, without making it not ready."""
    client = await make_client(embedder=openai_embedder(provider.url))
    resp = await client.get("/readyz")
    body = await resp.json()
    assert resp.status == 200 and body["dead_letters"] == 0 and body["lag"] == 0
    provider.mode = "503"
    s = settings.with_(in_flight=1, max_deliveries=1)
    embedder = openai_embedder(provider.url, retries=0)
    worker = Worker(s, redis, embedder, name="outage")
    await publish_many(redis, s, 2)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        await wait_until(lambda: dead_letters(redis, s, 2), timeout=30, message="2 dead letters")
    finally:
        stop.set()
        await running
    await publish_many(redis, s, 3)  # e0..e2 again, read by nobody: lag 3
    resp = await client.get("/readyz")
    body = await resp.json()
    assert resp.status == 200 and body["status"] == "ready", body
    assert body["dead_letters"] == 2 and body["lag"] == 3
    text = await (await client.get("/metrics")).text()
    assert "engram_stream_dead_letters 2.0" in text and "engram_stream_lag 3.0" in text


async def test_concurrent_recalls_share_the_provider_timeouts(make_client, redis, settings, provider):
    """Recalls waiting for one pass while the provider hangs fail with it: the pass is not retried text
    by text, which made the last request wait out the timeouts once per text before it."""
    client = await seeded_client(make_client, redis, settings, openai_embedder(provider.url))
    provider.mode = "hang"
    queries = [f"flaky migration {i}" for i in range(4)]
    answers = await asyncio.gather(
        *(client.post("/v1/recall", json={"query": q, "mode": "vector"}) for q in queries)
    )
    assert [a.status for a in answers] == [503] * 4
    shared = [i for i, texts in enumerate(provider.inputs) if len(texts) > 1]
    assert shared, provider.inputs  # some queries waited for the first one's pass and shared the next
    alone_after = {texts[0] for texts in provider.inputs[shared[0] + 1 :] if len(texts) == 1}
    assert not alone_after & set(provider.inputs[shared[0]]), provider.inputs  # none retried alone


async def test_a_provider_down_at_start_delays_readiness_instead_of_stopping_it(provider, caplog):
    """A service starting while its provider answers 503 keeps asking for the vector length (one line
    a try, no traceback) and starts once the provider answers; an admin command is told at once."""
    from shared.embedding_base import EmbedderUnavailable, dim_when_answering

    provider.mode = "503"
    embedder = OpenAIEmbedder(f"{provider.url}/v1", "fake-embed", timeout=0.5, retries=0, backoff=0.0)
    OPENED.append(embedder)
    with pytest.raises(EmbedderUnavailable):
        await embedder.ensure_dim()
    waiting = asyncio.create_task(dim_when_answering(embedder, "query service", ceiling=1.0))
    await wait_until(lambda: provider.requests >= 3, timeout=20, message="asked again")
    assert not waiting.done()
    provider.mode = "ok"
    assert await asyncio.wait_for(waiting, timeout=20) == DIM
    no_traceback(caplog)
    assert "does not answer" in caplog.text
