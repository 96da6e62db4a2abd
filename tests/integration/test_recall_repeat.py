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
