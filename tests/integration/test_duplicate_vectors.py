"""Episodes whose vectors are identical (an agent that ran the same task many times) crowd an HNSW
walk's beam; the KNN arms ask again with a wider one (services.query.recall.arms.widened_ef), against the real
module's graph."""

from __future__ import annotations

import numpy as np
import pytest

from engram_episodic.validation import parse_episode
from services.query.recall.arms import knn_search
from shared.index import STATUS_COMPLETED, Scope, episode_fields
from shared.keys import Keys
from shared.tags import BLAKE2B
from tests.helpers import wait_until
from tests.integration.test_query_support import episode, fully_indexed, make_client  # noqa: F401  (fixture)

DISTINCT, COPIES, LATENT, K, EF = 300, 14, 32, 100, 100


def _vectors(rng: np.random.Generator, n: int, basis: np.ndarray) -> np.ndarray:
    """float32[n, dim] unit vectors on a LATENT-dimensional subspace (text embeddings are far from
    isotropic; random isotropic vectors defeat HNSW with or without copies)."""
    v = rng.standard_normal((n, LATENT)) @ basis
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


async def _seed(redis, prefix: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """DISTINCT vectors, each written COPIES times in a row (the same task run again and again), and
    30 queries; → (float32[DISTINCT * COPIES, dim], float32[30, dim])."""
    rng = np.random.default_rng(20)
    basis = rng.standard_normal((LATENT, dim))
    vectors = np.repeat(_vectors(rng, DISTINCT, basis), COPIES, axis=0)
    keys = Keys(prefix)
    async with redis.pipeline(transaction=False) as pipe:
        for i, v in enumerate(vectors):
            ep = parse_episode(episode(f"run-{i}", task=f"task {i // COPIES}"))
            pipe.hset(
                keys.episode_doc(1, "agent", ep.episode_id),
                mapping=episode_fields("agent", ep, status=STATUS_COMPLETED, vector=v, tags=BLAKE2B),
            )
        await pipe.execute()
    return vectors, _vectors(rng, 30, basis)


def _recall(hits, vectors: np.ndarray, q: np.ndarray, prefix: str) -> float:
    """The share of the exact K nearest (ties at the K-th similarity count as found) among the hits."""
    sims = vectors @ q
    kth = np.sort(sims)[::-1][K - 1]
    keys = Keys(prefix)
    row = {keys.episode_doc(1, "agent", f"run-{i}").encode(): i for i in range(len(vectors))}
    found = [row[h.key] for h in hits]
    return sum(sims[i] >= kth - 1e-4 for i in found) / K


@pytest.mark.timeout(180)  # 4,200 documents into the HNSW graph on a shared machine
async def test_copies_of_one_vector_do_not_hide_the_nearest_episodes(redis, prefix, settings, make_client):  # noqa: F811
    settings = settings.with_(vector_algorithm="HNSW", hnsw_ef_runtime=EF)
    await make_client(vector_algorithm="HNSW", hnsw_ef_runtime=EF)  # creates the HNSW index
    assert settings.graph_ef == EF
    index = Keys(prefix).episode_index_alias
    vectors, queries = await _seed(redis, prefix, settings.embed_dim)
    await wait_until(lambda: fully_indexed(redis, prefix), timeout=120)
    scope = Scope(namespace="agent", tags=BLAKE2B)

    async def walks(graph_ef: int) -> list[float]:
        out = []
        for q in queries:
            batches = await knn_search(
                redis, index, scope, q, K, return_fields=(), policy="BATCHES", graph_ef=graph_ef
            )
            out.append(_recall(batches, vectors, q, prefix))
        return out

    plain, widened = await walks(0), await walks(EF)
    # the fixture does crowd the walk (else this test proves nothing) ...
    assert np.mean(plain) < 0.95, np.mean(plain)
    # ... and the wider beam finds the nearest again
    assert np.mean(widened) >= 0.99 and min(widened) >= 0.9, widened
    exact = await knn_search(
        redis, index, scope, queries[0], K, return_fields=(), policy="ADHOC_BF", graph_ef=EF
    )
    assert _recall(exact, vectors, queries[0], prefix) == 1.0  # the exact policy is never asked twice
