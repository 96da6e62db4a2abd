"""A broad filter's KNN runs in batches (services.query.recall.arms) and answers as the ad-hoc one does."""

from __future__ import annotations

import numpy as np
import pytest

from engram_episodic.validation import parse_episode
from services.query.recall.arms import knn_search
from services.query.recall.plan import Query, RecallParams, plan
from services.query.recall.sizes import ScopeSizes
from services.query.store import EpisodeStore
from shared.index import STATUS_COMPLETED, Scope, episode_fields
from shared.keys import Keys
from shared.tags import BLAKE2B
from tests.helpers import wait_until
from tests.integration.test_query_support import episode, fully_indexed, make_client  # noqa: F401  (fixture)

DIM = 256


async def _seed(redis, prefix: str, namespace: str, n: int, rng: np.random.Generator) -> np.ndarray:
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    keys = Keys(prefix)
    async with redis.pipeline(transaction=False) as pipe:
        for i, v in enumerate(vectors):
            ep = parse_episode(episode(f"{namespace}-{i}", task=f"task {i}"))
            pipe.hset(
                keys.episode_doc(1, namespace, ep.episode_id),
                mapping=episode_fields(namespace, ep, status=STATUS_COMPLETED, vector=v, tags=BLAKE2B),
            )
        await pipe.execute()
    return vectors


async def _policy(redis, index: str, scope: Scope, sizes: ScopeSizes, *, graph: bool) -> str | None:
    """The KNN policy a default (`auto`) recall of `scope` plans."""
    q = Query(redis, index, scope, "", np.zeros(DIM, np.float32), EpisodeStore(redis, Keys("")), sizes)
    params = RecallParams(
        top_k=5,
        depth=5,
        mode="vector",
        preset=None,
        weights=None,
        half_life=86_400.0,
        as_of=0.0,
        normalize="none",
        recency_from="completed",
        touch_now=None,
        graph_index=graph,
    )
    return (await plan(q, params)).policy


@pytest.mark.timeout(120)  # 2,200 documents through the HNSW graph on a shared machine
async def test_a_big_namespace_runs_its_knn_in_batches_with_the_same_answer(redis, prefix, make_client):  # noqa: F811
    await make_client()  # creates the index
    index = Keys(prefix).episode_index_alias
    rng = np.random.default_rng(7)
    big = await _seed(redis, prefix, "big", 2_100, rng)
    await _seed(redis, prefix, "small", 100, rng)
    await wait_until(lambda: fully_indexed(redis, prefix), timeout=60)
    sizes = ScopeSizes(ttl=60)
    big_scope, small_scope = Scope(namespace="big", tags=BLAKE2B), Scope(namespace="small", tags=BLAKE2B)
    big_size = await sizes.size(redis, index, big_scope)
    small_size = await sizes.size(redis, index, small_scope)
    assert (big_size, small_size) == (2_100, 100)
    assert await _policy(redis, index, big_scope, sizes, graph=True) == "BATCHES"
    assert await _policy(redis, index, small_scope, sizes, graph=True) is None
    assert await _policy(redis, index, big_scope, sizes, graph=False) is None
    big_keys = {Keys(prefix).episode_doc(1, "big", f"big-{i}").encode() for i in range(len(big))}
    for q in big[:20]:
        batches = await knn_search(redis, index, big_scope, q, 5, return_fields=(), policy="BATCHES")
        adhoc = await knn_search(redis, index, big_scope, q, 5, return_fields=(), policy="ADHOC_BF")
        assert batches[0].key == adhoc[0].key  # the stored vector itself, found either way
        assert {h.key for h in batches} <= big_keys  # the scope holds in batches too
        assert len(batches) == 5


async def test_an_unknown_policy_is_refused(redis, prefix, make_client):  # noqa: F811
    await make_client()
    index = Keys(prefix).episode_index_alias
    with pytest.raises(ValueError, match="policy"):
        await knn_search(
            redis,
            index,
            Scope(namespace="x", tags=BLAKE2B),
            np.ones(DIM, np.float32),
            1,
            return_fields=(),
            policy="BATCHES) | (@namespace:{other}",
        )
