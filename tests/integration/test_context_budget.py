"""`POST /v1/context`'s prompt section fills its `max_chars` by priority across its sections (facts and
episodes alike, the lowest-ranked item cut, never a whole section dropped while room is left), and
lists no episode below the recall mode's relevance floor. Through the HTTP API, real Redis."""

from __future__ import annotations

from aiohttp import web

from services.query.app import make_app
from services.query.recall.relevance import CONTEXT_FLOOR
from shared.embedding import HashingEmbedder
from tests.integration.test_query_support import ServiceTestServer, episode, put

pytest_plugins = ["tests.integration.test_query_support"]

TASK = "migrate the orders table to the new billing schema"
FACTS = [
    {"text": f"fact {i}: the orders table migration needs a lock on billing rows, " + "detail " * 40}
    for i in range(5)
]


async def _client(aiohttp_client, settings, redis, known=FACTS):
    async def facts(r, scope, vector, k):
        return known[:k]

    app: web.Application = make_app(
        settings, redis=redis, embedder=HashingEmbedder(settings.embed_dim), facts=facts
    )
    return await aiohttp_client(ServiceTestServer(app))


async def _seed(redis, prefix):
    for i in range(5):
        await put(
            redis,
            prefix,
            "default",
            episode(
                f"m{i}",
                task=f"{TASK} step {i}",
                solution="copy the rows in batches of 1000, then swap the tables " * 8,
                reward=0.8,
                completed_at=1_700_000_000 + i,
            ),
        )


async def test_a_small_budget_holds_facts_and_episodes_and_is_filled(aiohttp_client, settings, redis, prefix):
    await _seed(redis, prefix)
    client = await _client(aiohttp_client, settings, redis)
    for max_chars in (1500, 1000, 2500):
        body = await (await client.post("/v1/context", json={"task": TASK, "max_chars": max_chars})).json()
        prompt = body["prompt"]
        assert body["truncated"] and len(prompt) <= max_chars
        assert "Known facts:" in prompt and "fact 0:" in prompt, "the best fact is kept at any budget"
        assert "### Episode 1" in prompt, "the best episode is kept beside it"
        assert len(prompt) >= max_chars - 60, f"{len(prompt)} of {max_chars}: the budget is filled"
        assert prompt.endswith("…"), "the lowest-ranked item is cut, not dropped"
    roomy = await (
        await client.post("/v1/context", json={"task": TASK, "max_chars": 20000, "top_k": 5})
    ).json()
    assert not roomy["truncated"] and roomy["prompt"].count("### Episode") == 5
    assert all(f["text"][:20] in roomy["prompt"] for f in FACTS)


async def test_unrelated_episodes_are_not_listed(aiohttp_client, settings, redis, prefix):
    """An episode sharing no word with the task, newer than every related one (so the recency list
    brings it into the pool), is neither listed nor counted among the similar episodes."""
    await _seed(redis, prefix)
    for i, text in enumerate(("water the garden plants", "renew the passport at the embassy")):
        await put(redis, prefix, "default", episode(f"none{i}", task=text, completed_at=1_800_000_000 + i))
    client = await _client(aiohttp_client, settings, redis)
    body = await (await client.post("/v1/context", json={"task": TASK, "top_k": 10})).json()
    ids = [r["episode"]["episode_id"] for r in body["results"]]
    assert sorted(ids) == [f"m{i}" for i in range(5)], [
        (r["episode"]["episode_id"], r["relevance"]) for r in body["results"]
    ]
    assert all(r["relevance"] >= CONTEXT_FLOOR[settings.recall_mode] for r in body["results"])
    assert body["replay_context"]["episodes"] == 5, "the summary counts only the relevant ones"
    assert "garden" not in body["prompt"] and "passport" not in body["prompt"]
    asked = await (
        await client.post("/v1/context", json={"task": TASK, "top_k": 10, "min_relevance": 0.0})
    ).json()
    assert {"none0", "none1"} <= {r["episode"]["episode_id"] for r in asked["results"]}, (
        "an explicit 0 keeps all"
    )


async def test_facts_below_the_floor_are_not_known_facts(aiohttp_client, settings, redis, prefix):
    """A fact whose centroid points away from the task (cosine below the vector floor) is no knowledge
    of it: not in "Known facts" unless `min_relevance` asks for everything."""
    scored = [
        {"text": "rotating the database credentials needs the vault token", "score": 0.62},
        {"text": "paint the office walls blue", "score": 0.089},
    ]

    client = await _client(aiohttp_client, settings, redis, known=scored)
    body = await (await client.post("/v1/context", json={"task": "rotate the database credentials"})).json()
    assert [f["text"] for f in body["facts"]] == [scored[0]["text"]]
    assert "paint the office" not in body["prompt"]
    everything = {"task": "rotate the database credentials", "min_relevance": 0}
    body = await (await client.post("/v1/context", json=everything)).json()
    assert len(body["facts"]) == 2
