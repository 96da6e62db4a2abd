"""ENGRAM_CONTEXT_EPISODES on the paths the first trials did not take, against the real Redis: the context
shown by `GET /v1/episodes/{id}`, a replay and `engram-admin replay` / `reindex` rebuilding the same bytes
(late arrivals, one-episode sessions, shared completed_at), expiry, agent-supplied vectors."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import orjson
import pytest

from engram_episodic.errors import ConfigError
from engram_episodic.types import StoredEpisode
from services.consolidator import expiry, retention
from services.consolidator.context import CONTEXT_FIELD, CONTEXT_OF_FIELD, OWN_FIELD, contextual
from services.consolidator.replay import replay
from shared.embedding import HashingEmbedder
from shared.index import current_generation
from shared.keys import Keys
from shared.keywords import fold_for_search
from shared.sdk import EngramClient
from tests.helpers import wait_until
from tests.integration.test_cli_admin import env_for, invoke
from tests.integration.test_consolidator import drain, make_worker
from tests.integration.test_context_episodes import TEXTS, own, stored, turn
from tests.openapi_check import success_schema, validator

pytest_plugins = ["tests.integration.test_query_support"]

FIELDS = ("vector", OWN_FIELD, CONTEXT_FIELD, CONTEXT_OF_FIELD)


def on(settings):
    return dataclasses.replace(settings, context_episodes=1)


async def record(settings, redis, ns: str, episodes: list[dict], *, batches: bool = False) -> None:
    client = EngramClient(redis, namespace=ns, prefix=settings.prefix)
    worker = make_worker(settings, redis)
    for ep in episodes:
        await client.record(ep)
        if batches:  # one batch per episode: each arrives after the ones published before it
            await drain(worker)
    await drain(worker)


async def snapshot(redis, keys: Keys, ns: str, eids) -> dict[str, tuple[bytes | None, ...]]:
    """The context-related fields of each episode's document, as stored."""
    gen = await current_generation(redis, keys)
    out = {}
    for eid in eids:
        out[eid] = tuple(await redis.hmget(keys.episode_doc(gen, ns, eid), FIELDS))
    return out


async def get(api, eid: str) -> dict:
    resp = await api.get(f"/v1/episodes/{eid}")
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    status, schema = success_schema("GET", "/v1/episodes/{episode_id}")
    validator(schema).validate(body)
    return body


async def test_get_episode_shows_the_context_and_not_a_forgotten_predecessors_text(
    settings, redis, make_client
):
    settings = on(settings)
    await record(settings, redis, "default", [turn("e1", 10.0), turn("e2", 20.0), turn("e3", 30.0)])
    api = await make_client(context_episodes=1)
    assert "context" not in await get(api, "e1")  # the session's first: nothing taken
    body = await get(api, "e3")
    assert body["context"] == {"previous_episode_id": "e2", "text": fold_for_search(TEXTS["e2"])}
    typed = StoredEpisode.from_json(body).context  # the typed client reads it
    assert typed is not None and typed.previous_episode_id == "e2" and typed.text == body["context"]["text"]

    await EngramClient(redis, namespace="default", prefix=settings.prefix).forget_episode("e2")
    await drain(make_worker(settings, redis))
    body = await get(api, "e3")
    assert body["context"] == {"previous_episode_id": "e1", "text": fold_for_search(TEXTS["e1"])}
    assert b"feel" not in orjson.dumps(body), "the forgotten e2's words are in no answer"


async def test_get_episode_has_no_context_with_the_setting_off(settings, redis, make_client):
    settings = dataclasses.replace(settings, context_episodes=0)  # pinned: whatever the default
    await record(settings, redis, "default", [turn("e1", 10.0), turn("e2", 20.0)])
    api = await make_client(context_episodes=0)
    assert "context" not in await get(api, "e2")


async def test_replay_and_the_cli_rebuild_the_same_bytes_late_arrivals_ties_and_single_sessions(
    settings, redis, monkeypatch
):
    settings = on(settings)
    keys = Keys(settings.prefix)
    # s1 arrives late (e3 first, then e1 before it, then e2 between); s2 holds one episode; s3's three
    # episodes share one completed_at, arriving out of their episode_id order
    tied = [{**turn(eid, 50.0, "s3"), "episode_id": f"t-{eid}"} for eid in ("e3", "e1", "e2")]
    order = [turn("e3", 30.0), turn("x1", 25.0, "s2"), turn("e1", 10.0), turn("e2", 20.0), *tied]
    await record(settings, redis, "ns", order, batches=True)
    eids = ["e1", "e2", "e3", "x1", "t-e1", "t-e2", "t-e3"]
    before = await snapshot(redis, keys, "ns", eids)
    o = {eid: await own(settings, eid) for eid in TEXTS}
    assert before["x1"][0] == o["x1"].tobytes() and before["x1"][2:] == (None, None)  # alone: nothing taken
    assert before["t-e2"][0] == contextual(o["e2"], o["e1"]).tobytes()  # ties: by episode_id
    assert before["t-e2"][2:] == (fold_for_search(TEXTS["e1"]).encode(), b"t-e1")
    assert before["t-e3"][3] == b"t-e2" and before["t-e1"][2:] == (None, None)
    assert before["e3"][2:] == (fold_for_search(TEXTS["e2"]).encode(), b"e2")

    # the stream trimmed first: the replay re-folds the episodes' event snapshots (retention.py)
    assert await retention.trim(redis, settings.keys, retention_seconds=0.0, now=time.time() + 1.0) > 0
    result = await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert result["generation"] == 2
    assert await snapshot(redis, keys, "ns", eids) == before

    env_for(monkeypatch, settings)
    monkeypatch.setenv("ENGRAM_CONTEXT_EPISODES", "1")
    for args in (["replay", "--no-progress"], ["reindex", "--embedder", "hashing", "--no-progress"]):
        out = await invoke(*args)
        assert out.exit_code == 0, out.output
        assert await snapshot(redis, keys, "ns", eids) == before, args
    assert await current_generation(redis, keys) == 4


async def test_an_expired_episodes_text_leaves_its_successor(settings, redis, make_client):
    settings = on(settings)
    keys = Keys(settings.prefix)
    soon = time.time() + 1.0
    await record(
        settings,
        redis,
        "default",
        [turn("e1", 10.0), {**turn("e2", 20.0), "expires_at": soon}, turn("e3", 30.0)],
    )
    assert await stored(redis, keys, "default", "e3", CONTEXT_FIELD) == fold_for_search(TEXTS["e2"]).encode()
    api = await make_client(context_episodes=1)
    assert (await get(api, "e3"))["context"]["previous_episode_id"] == "e2"
    await wait_until(lambda: time.time() > soon + 0.05, message="e2 expired")
    # hidden at once, as from every read, before the sweep erases it
    assert "context" not in await get(api, "e3")
    assert await expiry.sweep(redis, settings) == 1
    await drain(make_worker(settings, redis))
    assert await stored(redis, keys, "default", "e2") is None
    assert await stored(redis, keys, "default", "e3", CONTEXT_FIELD) == fold_for_search(TEXTS["e1"]).encode()
    o = {eid: await own(settings, eid) for eid in ("e1", "e3")}
    assert await stored(redis, keys, "default", "e3") == contextual(o["e3"], o["e1"]).tobytes()
    assert (await get(api, "e3"))["context"]["previous_episode_id"] == "e1"


async def test_an_agent_vector_is_kept_and_gives_its_successor_no_context(settings, redis):
    settings = on(settings)
    keys = Keys(settings.prefix)
    mine = np.zeros(settings.embed_dim, dtype=np.float32)
    mine[3] = 1.0
    episodes = [turn("e1", 10.0), {**turn("e2", 20.0), "vector": mine.tolist()}, turn("e3", 30.0)]
    await record(settings, redis, "ns", episodes)
    e2 = (await snapshot(redis, keys, "ns", ["e2"]))["e2"]
    assert e2 == (mine.tobytes(), None, None, None), "its own vector, untouched, nothing taken"
    o3 = await own(settings, "e3")
    assert (await snapshot(redis, keys, "ns", ["e3"]))["e3"] == (o3.tobytes(), o3.tobytes(), None, None)
    await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert (await snapshot(redis, keys, "ns", ["e2"]))["e2"] == e2


async def test_a_patch_rewrites_the_document_and_the_rebase_restores_its_context(
    settings, redis, make_client
):
    """PATCH rewrites the whole document (REPLACE_DOC_LUA drops context_text and context_of): the re-base
    after the batch must put them back, unchanged."""
    settings = on(settings)
    keys = Keys(settings.prefix)
    await record(settings, redis, "default", [turn("e1", 10.0), turn("e2", 20.0), turn("e3", 30.0)])
    before = await snapshot(redis, keys, "default", ["e2", "e3"])
    api = await make_client(context_episodes=1)
    resp = await api.patch("/v1/episodes/e2", json={"feedback": {"reward": 0.25}})
    assert resp.status == 202, await resp.text()
    await drain(make_worker(settings, redis))
    assert b"0.25" in (await stored(redis, keys, "default", "e2", "doc") or b"")
    assert await snapshot(redis, keys, "default", ["e2", "e3"]) == before
    assert (await get(api, "e2"))["context"]["previous_episode_id"] == "e1"


async def test_a_forgotten_episode_leaves_no_trace_in_the_centroid_of_a_fact_it_is_not_evidence_of(
    settings, redis
):
    """doc-0 sits between mig-3 and mig-4 in one session, so mig-4's stored vector leans on it. A fact
    clustered on the stored vectors kept 0.2·own(doc-0)/8 in the mig fact's centroid after doc-0 was
    forgotten (the fact did not name doc-0: nothing rebuilt it). Facts cluster the own vectors."""
    from services.consolidator.facts import Consolidator
    from shared.facts import FactScope
    from tests.integration.test_facts import HOUR, T0, ep, facts

    s = on(settings).with_(facts_every=10_000, facts_importance_threshold=1e9)
    keys = Keys(s.prefix)
    episodes = [{**ep("mig", i, at=T0 + i * HOUR), "session_id": "s"} for i in range(8)]
    episodes.append({**ep("doc", 0, at=T0 + 3.5 * HOUR), "session_id": "s"})
    await record(s, redis, "ns", episodes)
    assert await stored(redis, keys, "ns", "mig-4", CONTEXT_OF_FIELD) == b"doc-0"
    await Consolidator(s, redis, s.embed_dim).consolidate(FactScope("ns"))
    await drain(make_worker(s, redis))
    await EngramClient(redis, namespace="ns", prefix=s.prefix).forget_episode("doc-0")
    await drain(make_worker(s, redis))
    assert await stored(redis, keys, "ns", "mig-4", CONTEXT_OF_FIELD) == b"mig-3"
    (fact,) = [f for f in await facts(redis, s) if f.evidence[0].startswith("mig")]
    owns = [
        np.frombuffer(await stored(redis, keys, "ns", eid, OWN_FIELD), dtype=np.float32).astype(np.float64)
        for eid in fact.evidence
    ]
    mean = np.mean([v / np.linalg.norm(v) for v in owns], axis=0)
    np.testing.assert_allclose(fact.centroid_array(), mean / np.linalg.norm(mean), atol=1e-6)


async def test_engram_export_then_import_rebuilds_the_same_contexts(settings, redis, make_client, tmp_path):
    """`engram export` / `engram import` with the setting on: the imported namespace's documents hold
    the same vectors, own vectors, context_text and context_of as the source's (arrived late there,
    oldest first in the file)."""
    from tests.integration.test_query_cli import run
    from tests.integration.test_query_support import KEY_A, KEY_B, auth

    settings = on(settings)
    keys = Keys(settings.prefix)
    api = await make_client(api_keys={KEY_A: "team-a", KEY_B: "team-b"}, context_episodes=1)
    worker = make_worker(settings, redis)
    for group in ([turn("e3", 30.0)], [turn("e1", 10.0), turn("x1", 25.0, "s2")], [turn("e2", 20.0)]):
        resp = await api.post("/v1/episodes", json={"episodes": group}, headers=auth(KEY_A))
        assert resp.status == 202, await resp.text()
        await drain(worker)
    eids = ["e1", "e2", "e3", "x1"]
    before = await snapshot(redis, keys, "team-a", eids)
    assert before["e3"][3] == b"e2" and before["e2"][3] == b"e1"
    file = tmp_path / "memory.jsonl"
    out = await run(api, "export", "--out", str(file), key=KEY_A)
    assert out.exit_code == 0, out.output
    out = await run(api, "import", str(file), "--no-progress", key=KEY_B)
    assert out.exit_code == 0, out.output
    await drain(worker)
    assert await snapshot(redis, keys, "team-b", eids) == before


async def test_recall_hits_show_the_context_they_matched_on(settings, redis, make_client):
    """A keyword recall on e1's words finds e2 through its context_text: the hit says so (with the
    setting on the query service); never for a forgotten predecessor; not with the setting off."""
    from engram_episodic.types import RecallHit

    settings = on(settings)
    await record(settings, redis, "default", [turn("e1", 10.0), turn("e2", 20.0), turn("x1", 25.0, "s2")])
    query = {"query": "LGBTQ support group", "mode": "keyword", "top_k": 5}
    status, schema = success_schema("POST", "/v1/recall")

    async def hits(api) -> dict[str, dict]:
        resp = await api.post("/v1/recall", json=query)
        assert resp.status == status, await resp.text()
        body = await resp.json()
        validator(schema).validate(body)
        return {r["episode"]["episode_id"]: r for r in body["results"] if r["relevance"] > 0.0}

    api = await make_client(context_episodes=1)
    got = await hits(api)
    assert set(got) == {"e1", "e2"} and "context" not in got["e1"]
    assert got["e2"]["context"] == {"previous_episode_id": "e1", "text": fold_for_search(TEXTS["e1"])}
    assert RecallHit.from_json(got["e2"]).context.previous_episode_id == "e1"  # type: ignore[union-attr]
    # a query service started without the setting follows the deployment's record (1 here); an explicit 0
    # is refused at its start (shared.context_setting; tests/integration/test_context_record.py)
    assert (await hits(await make_client()))["e2"]["context"] == got["e2"]["context"]
    # /v1/context's results are recall hits (RecallHit): they carry it too
    resp = await api.post("/v1/context", json={"task": query["query"], "top_k": 5})
    assert resp.status == 200, await resp.text()
    in_context = {r["episode"]["episode_id"]: r for r in (await resp.json())["results"]}
    assert in_context["e2"]["context"] == got["e2"]["context"] and "context" not in in_context["e1"]
    with pytest.raises(ConfigError, match="ENGRAM_CONTEXT_EPISODES=0 but"):
        await make_client(context_episodes=0)

    await EngramClient(redis, namespace="default", prefix=settings.prefix).forget_episode("e1")
    await drain(make_worker(settings, redis))
    resp = await api.post("/v1/recall", json={**query, "query": "how did it feel"})
    (e2,) = [r for r in (await resp.json())["results"] if r["episode"]["episode_id"] == "e2"]
    assert "context" not in e2 and b"lgbtq" not in orjson.dumps(e2).lower()
