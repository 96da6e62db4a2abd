"""Shared fixtures and seeding helpers of the query-service tests (no tests here).

Documents are written directly with `shared.index.episode_fields` (what the consolidator writes), so the
ranking tests control every stored value, including the vectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from engram_episodic.timeutil import parse_instant
from engram_episodic.validation import parse_episode
from services.query.app import make_app
from services.query.server import AppRunner
from shared.embedding import Embedder, HashingEmbedder
from shared.index import STATUS_COMPLETED, embedding_text, episode_fields
from shared.keys import Keys
from shared.tags import BLAKE2B
from tests.helpers import wait_until

DAY = 86400.0
KEY_A, KEY_B = "key-for-a-0123456789", "key-for-b-9876543210"
METRICS_KEY = "key-for-metrics-5555555555"


def unit(*xs: float, dim: int = 256) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    v[: len(xs)] = xs
    return v / np.linalg.norm(v)


class TableEmbedder(Embedder):
    """Returns the vector listed for a text, else the hashing embedding; counts texts embedded."""

    def __init__(self, dim: int, table: dict[str, np.ndarray] | None = None):
        super().__init__(name="table-test", dim=dim, max_chars=2000, batch_size=64)
        self.table = dict(table or {})
        self.hashing = HashingEmbedder(dim)
        self.calls = 0

    async def _embed_batch(self, texts: list[str]):
        self.calls += len(texts)
        rows = [self.table[t] if t in self.table else self.hashing.embed_sync([t])[0] for t in texts]
        return np.stack(rows), [False] * len(texts)


def episode(
    episode_id: str,
    *,
    task: str = "a task",
    category: str = "debugging",
    outcome: str = "success",
    completed_at: float | str = 1_700_000_000.0,
    reward: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "episode_id": episode_id,
        "task": {"description": task, "category": category},
        "outcome": outcome,
        "completed_at": completed_at,
        **extra,
    }
    if reward is not None:
        data.setdefault("feedback", {})["reward"] = reward
    return data


async def put(
    redis,
    prefix: str,
    namespace: str,
    data: dict[str, Any],
    vector: np.ndarray | None = None,
    *,
    status: str = STATUS_COMPLETED,
    dim: int = 256,
) -> str:
    """Write one episode document as the consolidator would; the vector defaults to its hashing embedding."""
    ep = parse_episode(data)
    if vector is None:
        vector = HashingEmbedder(dim).embed_sync([embedding_text(ep)])[0]
    keys = Keys(prefix)
    await redis.hset(
        keys.episode_doc(1, namespace, ep.episode_id),
        mapping=episode_fields(namespace, ep, status=status, vector=vector, tags=BLAKE2B),
    )
    return ep.episode_id


async def put_all(redis, prefix: str, namespace: str, items: Sequence[dict[str, Any]]) -> None:
    for item in items:
        await put(redis, prefix, namespace, item)


def ids(body: dict[str, Any]) -> list[str]:
    return [r["episode"]["episode_id"] for r in body["results"]]


def at(text: str) -> float:
    return parse_instant(text)


async def fully_indexed(redis, prefix: str) -> bool:
    """True once the index has no background scan running (FT.CREATE over existing keys backfills
    asynchronously: a query right after it may miss documents written before)."""
    reply = await redis.execute_command("FT.INFO", Keys(prefix).episode_index_alias)
    info = dict(zip(reply[::2], reply[1::2], strict=False))
    return info.get(b"indexing") in (b"0", 0) and float(info.get(b"percent_indexed", 1)) >= 1.0


class ServiceTestServer(TestServer):
    """aiohttp's test server with the runner `python -m services.query` serves with (its own answers to
    unparseable requests, credentials redacted from aiohttp's logs)."""

    async def _make_runner(self, **kwargs: Any) -> AppRunner:
        return AppRunner(self.app, **kwargs)


@pytest.fixture
def make_client(aiohttp_client, settings, redis):
    """Factory: a test client of the app with the given settings overrides and embedder.

    Waits until the index has indexed documents seeded before the app created it."""

    async def create(embedder: Embedder | None = None, **overrides: Any):
        s = settings.with_(**overrides) if overrides else settings
        app = make_app(s, redis=redis, embedder=embedder or HashingEmbedder(s.embed_dim))
        client = await aiohttp_client(ServiceTestServer(app))
        await wait_until(lambda: fully_indexed(redis, s.prefix), message="index backfill")
        return client

    return create


@pytest.fixture
async def api(make_client):
    return await make_client()


@pytest.fixture
async def tenants(make_client):
    """A client of a service with two API keys: KEY_A → ns-a, KEY_B → ns-b."""
    return await make_client(api_keys={KEY_A: "ns-a", KEY_B: "ns-b"})


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
