"""Facts across a reindex to another embedder: readable at once in the new generation, with no
consolidation run, and `/readyz` and the replay's counts say what was done with them."""

from __future__ import annotations

from services.consolidator.facts import Consolidator
from services.consolidator.replay import replay
from shared.embedding import HashingEmbedder
from shared.facts import FactQuery, FactScope, live_facts_index, search_facts
from shared.index import index_exists
from shared.keys import Keys
from shared.tags import BLAKE2B
from tests.integration.test_consolidator import drain
from tests.integration.test_facts import FAMILIES, facts, make_worker, planted, publish
from tests.integration.test_query_support import make_client  # noqa: F401  (fixture)

OTHER_DIM = 128  # the deployment's is 256 (tests/conftest.py)


async def test_reindex_to_another_dimension_keeps_facts_readable(settings, redis, make_client):  # noqa: F811
    """Facts kept the old embedder's centroids: of another dimension the facts index could not hold
    them (`Could not add vector with blob size 1024 (expected size 512)`), so every fact was missing
    from searches and lists until a manual `POST /v1/consolidate`."""
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    await publish(s, redis, planted(), namespace="default")
    worker = make_worker(s, redis)
    await drain(worker)
    await Consolidator(s, redis, s.embed_dim).consolidate(FactScope("default"))
    await drain(worker)
    before = await facts(redis, s, namespace="default", include_superseded=True)
    assert len(before) == 3

    reindexed = s.with_(embed_dim=OTHER_DIM)
    other = HashingEmbedder(OTHER_DIM)
    result = await replay(reindexed, redis, other)
    assert (result["facts"], result["fact_scopes"], result["facts_indexed"], result["facts_reembedded"]) == (
        3,
        1,
        3,
        3,
    )
    after = await facts(redis, s, namespace="default", include_superseded=True)
    assert [(f.fact_id, f.text, f.version, f.evidence) for f in after] == [
        (f.fact_id, f.text, f.version, f.evidence) for f in before
    ]
    assert all(len(f.centroid) == OTHER_DIM for f in after)
    keys = Keys(s.prefix)
    assert await index_exists(redis, keys.facts_index_alias)  # it followed the swap
    # found by similarity in the new embedder's space
    (vector,) = await other.embed([FAMILIES["mig"].format("refunds")])
    index = await live_facts_index(redis, keys)
    hits = await search_facts(
        redis, index, FactQuery(tags=BLAKE2B, namespace="default"), vector=vector, top_k=1
    )
    assert [h.fact.support for h in hits] == [10]

    # the query service started again with the new embedder: facts answer, /readyz says what was done
    api = await make_client(embedder=other, embed_dim=OTHER_DIM)
    resp = await api.post("/v1/facts/search", json={"query": "migrate the refunds table with alembic"})
    assert resp.status == 200, await resp.text()
    assert [f["support"] for f in (await resp.json())["results"]][:1] == [10]
    ready = await api.get("/readyz")
    assert ready.status == 200, await ready.text()
    state = (await ready.json())["facts"]
    assert state["generation"] == 2 and state["indexed"] == 3
    assert state["replay"] == {
        "facts": 3,
        "fact_scopes": 1,
        "facts_indexed": 3,
        "facts_reembedded": 3,
        "embedder": other.name,
        "dim": OTHER_DIM,
    }
