"""An index and documents holding fields Engram no longer writes (an indexed `context_text` TEXT field,
`context_of`, `own_vector`: the previous episode of a session folded into an episode's document) are
read as if the fields were not there: no search matches their words, no answer shows them, a worker
starts on the index, and a replay writes the documents without them."""

from __future__ import annotations

from redis.exceptions import ResponseError

from services.consolidator.replay import replay
from shared.embedding import HashingEmbedder
from shared.index import current_generation
from shared.keys import Keys
from tests.integration.test_query_e2e import drain
from tests.integration.test_query_support import episode, ids

pytest_plugins = ["tests.integration.test_query_support"]

LEFTOVERS = {"context_text": "zebra quartz", "context_of": "a1", "own_vector": b"\x00" * 16}


async def test_fields_no_longer_written_are_not_read(api, settings, redis):
    eps = [episode(f"a{i}", task=f"deploy the billing service step {i}", session_id="s1") for i in (1, 2)]
    assert (await api.post("/v1/episodes", json={"episodes": eps})).status == 202
    await drain(settings, redis)
    keys = Keys(settings.prefix)
    gen = await current_generation(redis, keys)
    try:
        await redis.execute_command(
            "FT.ALTER", keys.episode_index(gen), "SCHEMA", "ADD", "context_text", "TEXT", "WEIGHT", 1.0
        )
    except ResponseError as exc:  # a build that still indexes the field created it
        assert "duplicate" in str(exc).lower()
    await redis.hset(keys.episode_doc(gen, "default", "a2"), mapping=LEFTOVERS)

    keyword = await api.post("/v1/recall", json={"query": "zebra quartz", "mode": "keyword", "top_k": 5})
    assert keyword.status == 200
    assert [hit["relevance"] for hit in (await keyword.json())["results"]] == [0.0, 0.0]  # matched no word
    hybrid = await api.post("/v1/recall", json={"query": "deploy the billing service step 2", "top_k": 5})
    body = await hybrid.json()
    assert hybrid.status == 200 and "a2" in ids(body)
    assert all("context" not in hit for hit in body["results"])
    got = await api.get("/v1/episodes/a2")
    assert got.status == 200 and "context" not in await got.json()

    # a worker starts on the index as it is, and projects into it
    more = [episode("a3", task="deploy the billing service step 3", session_id="s1")]
    assert (await api.post("/v1/episodes", json={"episodes": more})).status == 202
    await drain(settings, redis)
    out = await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    new = out["generation"]
    for eid in ("a1", "a2", "a3"):
        doc = await redis.hgetall(keys.episode_doc(new, "default", eid))
        assert doc and not {k.decode() for k in doc} & set(LEFTOVERS), eid
