"""The same recall asked again of an unchanged namespace answers the same: no count a query service
remembers (scope sizes for the `auto` preset, idf counts) outlives a write to the namespace."""

from __future__ import annotations

import asyncio
import random

from tests.integration.test_query_e2e import drain
from tests.integration.test_query_support import auth, episode

pytest_plugins = ["tests.integration.test_query_support"]

NOW = 1_760_000_000.0
KEY = "repeat-key-0123456789"


def texts(rng: random.Random, n: int) -> list[str]:
    """`n` texts over an 80-word vocabulary, its first words far more frequent (Zipf-like)."""
    words = [
        "".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") for _ in range(3)) for _ in range(80)
    ]
    weights = [1 / (j + 1) for j in range(len(words))]
    return [" ".join(rng.choices(words, weights=weights, k=rng.randint(4, 12))) for _ in range(n)]


async def ingest(api, settings, redis, rng: random.Random, first: int, n: int, vocabulary: list[str]) -> None:
    items = [
        episode(
            f"e{i}",
            task=text,
            completed_at=NOW - rng.uniform(0, 30 * 86400),
            outcome=rng.choice(("success", "partial", "failure")),
            importance=rng.randint(1, 10),
        )
        for i, text in enumerate(vocabulary[first : first + n], start=first)
    ]
    resp = await api.post("/v1/episodes", json={"episodes": items}, headers=auth(KEY))
    assert resp.status == 202, await resp.text()
    await drain(settings, redis)


async def test_an_unchanged_namespace_answers_a_repeated_recall_identically(make_client, settings, redis):
    """Counts remembered before an ingest (the scope's size: 200 episodes, `normal`, against 500 now,
    `late`; the query words' idf) ranked the first recalls after it otherwise than a later pass once
    they expired, or another query service counting afresh."""
    rng = random.Random(7)
    corpus = texts(rng, 500)
    queries = [" ".join(text.split()[:3]) for text in rng.sample(corpus, 30)]
    api = await make_client(api_keys={KEY: "ns"})
    gate = asyncio.Semaphore(6)

    async def ask(client, query: str, body: dict) -> list[tuple[str, float]]:
        async with gate:
            resp = await client.post(
                "/v1/recall", json={"query": query, "top_k": 10, "as_of": NOW, **body}, headers=auth(KEY)
            )
        assert resp.status == 200, await resp.text()
        return [(r["episode"]["episode_id"], r["priority"]) for r in (await resp.json())["results"]]

    async def everything(client) -> list[list[tuple[str, float]]]:
        # `auto` weights (the scope's size), and keyword relevance alone (the idf counts)
        bodies = ({}, {"mode": "keyword", "weights": {"similarity": 1.0}})
        return await asyncio.gather(*(ask(client, q, b) for b in bodies for q in queries))

    await ingest(api, settings, redis, rng, 0, 200, corpus)
    await everything(api)  # the service remembers counts of 200 episodes
    await ingest(api, settings, redis, rng, 200, 300, corpus)
    first, again = await everything(api), await everything(api)
    fresh = await everything(await make_client(api_keys={KEY: "ns"}))  # another process, nothing remembered
    assert first == again == fresh


async def test_the_namespace_version_moves_with_each_write_and_is_none_while_projecting(
    make_client, settings, redis
):
    from services.query.appkeys import SCOPE_SIZES

    api = await make_client(api_keys={KEY: "ns"})
    sizes = api.server.app[SCOPE_SIZES]
    assert await sizes.version(redis, "ns") == "0-0"  # nothing published yet
    versions = []
    for i in range(2):
        resp = await api.post("/v1/episodes", json=episode(f"v{i}"), headers=auth(KEY))
        assert resp.status == 202
        assert await sizes.version(redis, "ns") is None  # an entry waits: nothing is remembered
        await drain(settings, redis)
        versions.append(await sizes.version(redis, "ns"))
    assert None not in versions and versions[0] != versions[1]


async def test_a_recall_after_an_ingest_ranks_as_a_fresh_process(make_client, settings, redis):
    """The index size decides whether the BM25 arm waits for the idf (to search without the common
    words): remembered from 100 episodes, when no word can be common (in more than ~154 episodes at
    `bm25_common_idf` 0.5), it let the first recalls after 400 more search by every word and rank
    otherwise than a process counting afresh. The remembered counts are held for an hour here, so the
    first pass surely falls within them."""
    from services.query.appkeys import SCOPE_SIZES

    rng = random.Random(11)
    corpus = texts(rng, 500)
    queries = [" ".join(text.split()[:3]) for text in rng.sample(corpus, 30)]
    api = await make_client(api_keys={KEY: "ns"}, bm25_common_idf=0.5)
    api.server.app[SCOPE_SIZES].ttl = 3600.0

    async def everything(client) -> list[list[tuple[str, float]]]:
        async def ask(query: str, body: dict) -> list[tuple[str, float]]:
            body = {"query": query, "top_k": 10, "candidates": 10, "as_of": NOW, **body}
            resp = await client.post("/v1/recall", json=body, headers=auth(KEY))
            assert resp.status == 200, await resp.text()
            return [(r["episode"]["episode_id"], r["priority"]) for r in (await resp.json())["results"]]

        bodies = ({"mode": "hybrid"}, {"mode": "keyword", "weights": {"similarity": 1.0}})
        return [await ask(q, b) for b in bodies for q in queries]

    await ingest(api, settings, redis, rng, 0, 100, corpus)
    await everything(api)  # the service remembers an index of 100 episodes
    await ingest(api, settings, redis, rng, 100, 400, corpus)
    first = await everything(api)
    fresh = await everything(await make_client(api_keys={KEY: "ns"}, bm25_common_idf=0.5))
    assert first == fresh


async def test_the_index_size_a_namespace_reads_moves_with_that_namespace_alone(make_client, settings, redis):
    """What a recall decides by the index's size (the KNN's `HYBRID_POLICY` under HNSW) is read per
    namespace: recounted as soon as the namespace's partition changes (not 5 s later, after its first
    recalls), and not moved by a write to a namespace of another partition while it is remembered.
    Read without a namespace, it is remembered whatever is written."""
    from services.query.appkeys import SCOPE_SIZES

    settings = settings.with_(stream_partitions=4)
    keys = settings.keys
    other = next(f"other-{i}" for i in range(100) if keys.partition(f"other-{i}") != keys.partition("ns"))
    api = await make_client(stream_partitions=4, api_keys={KEY: "ns", "other-key-0123456789": other})
    sizes, index = api.server.app[SCOPE_SIZES], keys.episode_index_alias
    sizes.ttl = 3600.0
    assert await sizes.indexed(redis, index, "ns") == await sizes.indexed(redis, index, None) == 0
    for key, name, total in ((KEY, "ns", 1), ("other-key-0123456789", other, 2)):
        resp = await api.post("/v1/episodes", json=episode(f"{name}-1"), headers=auth(key))
        assert resp.status == 202
        await drain(settings, redis)
        assert await sizes.indexed(redis, index, name) == total
    assert await sizes.indexed(redis, index, "ns") == 1  # its partition is as it was: the count stands
    # the keyword arm's estimate (no answer depends on it) is not recounted on every write
    assert await sizes.indexed(redis, index, None) == 0
