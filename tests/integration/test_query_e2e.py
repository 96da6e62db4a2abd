"""End to end: HTTP ingest → stream → consolidator projection → HTTP recall, GET, skills, forget."""

from __future__ import annotations

import asyncio

from services.consolidator.worker import Worker
from shared.embedding import HashingEmbedder
from tests.integration.test_query_support import KEY_A, KEY_B, auth, episode, ids

pytest_plugins = ["tests.integration.test_query_support"]


async def drain(settings, redis) -> None:
    worker = Worker(settings, redis, HashingEmbedder(settings.embed_dim), name="e2e")
    await worker.setup()
    for _ in range(100):
        if not await worker.turn():
            return
    raise AssertionError("the stream never drained")


async def test_ingest_project_recall_forget_across_tenants(tenants, settings, redis):
    batch = {"episodes": [episode(f"e{i}", task=f"renew the tls certificate {i}", user_id=f"u{i % 2}",
                                  category="ops", reward=0.5 + i / 10) for i in range(4)]}
    await asyncio.gather(*(tenants.post("/v1/episodes", json=batch, headers=auth(k)) for k in (KEY_A, KEY_B)))
    await tenants.post("/v1/episodes", json=batch["episodes"][0], headers=auth(KEY_A))  # C01: a client retry
    await drain(settings, redis)

    async def recall(key, **body):
        resp = await tenants.post("/v1/recall", json={"query": "renew the tls certificate", "top_k": 10, **body},
                                  headers=auth(key))
        assert resp.status == 200, await resp.text()
        return await resp.json()

    for key in (KEY_A, KEY_B):
        assert sorted(ids(await recall(key))) == ["e0", "e1", "e2", "e3"]
        skills = await (await tenants.get("/v1/skills", headers=auth(key))).json()
        assert skills["results"][0]["episodes"] == 4
    got = await (await tenants.get("/v1/episodes/e3", headers=auth(KEY_A))).json()
    assert got["episode"]["feedback"]["reward"] == 0.8 and got["status"] == "completed"

    assert (await tenants.delete("/v1/episodes/e0", headers=auth(KEY_A))).status == 202
    assert (await tenants.delete("/v1/users/u1", headers=auth(KEY_A))).status == 202
    await drain(settings, redis)
    assert ids(await recall(KEY_A)) == ["e2"]
    assert ids(await recall(KEY_A, mode="keyword")) == ["e2"]
    assert (await tenants.get("/v1/episodes/e0", headers=auth(KEY_A))).status == 404
    assert sorted(ids(await recall(KEY_B))) == ["e0", "e1", "e2", "e3"]  # the other tenant is untouched
