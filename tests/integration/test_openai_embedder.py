"""OpenAIEmbedder against a local server speaking `POST /v1/embeddings` (loopback only, no Redis).

The fake server answers with HashingEmbedder vectors scaled by 3 (so the client must normalise) and
with `data` shuffled (so the client must reorder by `index`). A script of per-request behaviours
("503", "429", "hang", ...) drives the failure cases; unscripted requests succeed.
"""

from __future__ import annotations

import asyncio
import math
import random
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from shared.embedding import EmbeddingError, HashingEmbedder, embed_query
from shared.embedding_openai import OpenAIEmbedder, retry_after_seconds

DIM = 32
MODEL = "fake-embed-1"
API_KEY = "sk-test-not-a-real-key"


@dataclass
class FakeServer:
    url: str = ""
    dim: int = DIM
    script: list[str] = field(default_factory=list)
    bodies: list[dict] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def expected(self, texts: list[str]) -> np.ndarray:
        return HashingEmbedder(dim=self.dim).embed_sync(texts)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        self.auth.append(request.headers.get("Authorization"))
        action = self.script.pop(0) if self.script else "ok"
        if action == "503":
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        if action == "429":
            return web.json_response(
                {"error": {"message": "rate limited"}}, status=429, headers={"Retry-After": "0"}
            )
        if action == "401":
            return web.json_response({"error": {"message": "invalid api key"}}, status=401)
        if action == "hang":
            await self.release.wait()
        if action == "short":
            return web.json_response({"data": []})
        dim = self.dim + 1 if action == "wider" else self.dim
        vectors = HashingEmbedder(dim=dim).embed_sync(body["input"]) * 3.0
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        random.Random(len(self.bodies)).shuffle(data)
        return web.json_response({"object": "list", "data": data, "model": body["model"]})


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    fake = FakeServer()
    app = web.Application()
    app.router.add_post("/v1/embeddings", fake.handle)
    test_server = TestServer(app, host="127.0.0.1")
    await test_server.start_server()
    fake.url = str(test_server.make_url("")).rstrip("/")
    yield fake
    fake.release.set()  # let a hanging handler finish so the server shuts down at once
    await test_server.close()


@pytest.fixture
async def make_client(server):
    """Factory: an OpenAIEmbedder for the fake server; every one is closed after the test."""
    clients: list[OpenAIEmbedder] = []

    def create(**overrides) -> OpenAIEmbedder:
        options = {
            "url": server.url,
            "model": MODEL,
            "api_key": API_KEY,
            "timeout": 5.0,
            "batch_size": 4,
            "retries": 3,
            "backoff": 0.0,
        }
        options.update(overrides)
        client = OpenAIEmbedder(**options)
        clients.append(client)
        return client

    yield create
    for client in clients:
        await client.aclose()


def texts_of(n: int) -> list[str]:
    return [(f"episode {i}: " + "retry the flaky migration test " * (i % 3 + 1)).strip() for i in range(n)]


async def test_batches_and_reorders_by_index(server, make_client):
    texts = texts_of(10)
    client = make_client(batch_size=4)
    vectors = await client.embed(texts)
    assert len(server.bodies) == math.ceil(10 / 4)
    assert sorted(t for body in server.bodies for t in body["input"]) == sorted(texts)
    assert all(len(body["input"]) <= 4 for body in server.bodies)
    assert vectors.dtype == np.float32 and vectors.shape == (10, DIM)
    np.testing.assert_allclose(vectors, server.expected(texts), atol=1e-6)  # reordered and normalised
    assert client.dim == DIM  # learned from the first response


async def test_sends_model_input_and_bearer_key(server, make_client):
    await make_client().embed(["hello world"])
    assert server.bodies == [{"model": MODEL, "input": ["hello world"]}]
    assert server.auth == [f"Bearer {API_KEY}"]


async def test_no_authorization_header_without_key(server, make_client):
    await make_client(api_key=None).embed(["hello"])
    assert server.auth == [None]


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
async def test_url_with_or_without_v1(server, make_client, suffix):
    client = make_client(url=server.url + suffix)
    assert client.endpoint == server.url + "/v1/embeddings"
    vector = await embed_query(client, "migration test")
    np.testing.assert_allclose(vector, server.expected(["migration test"])[0], atol=1e-6)


async def test_retries_after_a_503(server, make_client):
    server.script = ["503"]
    vectors = await make_client().embed(["a", "b"])
    assert len(server.bodies) == 2
    np.testing.assert_allclose(vectors, server.expected(["a", "b"]), atol=1e-6)


async def test_429_honours_retry_after(server, make_client):
    """With Retry-After: 0 the retry is immediate, although the backoff alone would wait 60 s."""
    server.script = ["429", "429"]
    client = make_client(backoff=60.0, max_backoff=60.0)
    async with asyncio.timeout(10):
        vectors = await client.embed(["rate limited text"])
    assert len(server.bodies) == 3
    np.testing.assert_allclose(vectors, server.expected(["rate limited text"]), atol=1e-6)


async def test_gives_up_after_retries(server, make_client):
    server.script = ["503"] * 10
    with pytest.raises(EmbeddingError, match=r"HTTP 503 \(gave up after 3 attempts"):
        await make_client(retries=2).embed(["x"])
    assert len(server.bodies) == 3


async def test_client_errors_are_not_retried_and_hide_the_key(server, make_client):
    server.script = ["401"]
    with pytest.raises(EmbeddingError, match="HTTP 401.*invalid api key") as caught:
        await make_client().embed(["x"])
    assert len(server.bodies) == 1
    assert API_KEY not in str(caught.value)


async def test_timeout_raises_embedding_error(server, make_client):
    server.script = ["hang"]
    with pytest.raises(EmbeddingError, match=r"no response within 0\.2s"):
        await make_client(timeout=0.2, retries=0).embed(["slow"])
    assert len(server.bodies) == 1


async def test_timeout_is_retried(server, make_client):
    server.script = ["hang"]
    vectors = await make_client(timeout=0.2, retries=1).embed(["slow once"])
    assert len(server.bodies) == 2
    np.testing.assert_allclose(vectors, server.expected(["slow once"]), atol=1e-6)


async def test_connection_refused_is_retried_then_raises(make_client):
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = make_client(url=f"http://127.0.0.1:{port}", retries=2)
    with pytest.raises(EmbeddingError, match=r"connection error.*gave up after 3 attempts"):
        await client.embed(["x"])


async def test_given_dim_mismatch_raises(server, make_client):
    with pytest.raises(EmbeddingError, match=f"dimension {DIM}, expected 16"):
        await make_client(dim=16).embed(["x"])


async def test_learned_dim_mismatch_on_a_later_response_raises(server, make_client):
    client = make_client()
    await client.embed(["first"])
    assert client.dim == DIM
    server.script = ["wider"]
    with pytest.raises(EmbeddingError, match=f"dimension {DIM + 1}, expected {DIM}"):
        await client.embed(["second"])


async def test_wrong_number_of_vectors_raises(server, make_client):
    server.script = ["short"]
    with pytest.raises(EmbeddingError, match="expected 2 embeddings"):
        await make_client().embed(["a", "b"])


async def test_dim_unknown_until_first_response_then_ensure_dim(server, make_client):
    client = make_client()
    with pytest.raises(EmbeddingError, match="dimension is unknown"):
        _ = client.dim
    assert await client.ensure_dim() == DIM
    assert len(server.bodies) == 1


async def test_a_long_input_is_truncated_before_sending(server, make_client):
    """Case C10: a 200,000-character input is cut to max_chars before it is sent to the provider."""
    client = make_client(max_chars=100)
    await client.embed(["y" * 200_000, "short"])
    assert sorted(len(t) for t in server.bodies[0]["input"]) == [5, 100]
    assert client.truncations == 1


async def test_empty_text_is_rejected_before_any_request(server, make_client):
    with pytest.raises(ValueError, match=r"texts\[1\] is empty"):
        await make_client().embed(["ok", "   "])
    assert server.bodies == []


async def test_aclose_is_idempotent_and_the_client_reopens(server, make_client):
    client = make_client()
    await client.embed(["one"])
    await client.aclose()
    await client.aclose()
    await client.embed(["two"])
    assert len(server.bodies) == 2


def test_retry_after_parsing():
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("0") == 0.0
    assert retry_after_seconds("2.5") == 2.5
    assert retry_after_seconds("-3") == 0.0
    assert retry_after_seconds("soon") is None
    now = 1_750_000_000.0  # 2025-06-15T15:06:40Z
    assert retry_after_seconds("Sun, 15 Jun 2025 15:06:50 GMT", now=now) == 10.0
    assert retry_after_seconds("Sun, 15 Jun 2025 15:00:00 GMT", now=now) == 0.0
