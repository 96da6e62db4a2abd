"""ENGRAM_CONTEXT_EPISODES against the real Redis: a stored vector leans towards the previous episode of
its session, and its context_text holds that episode's task, whatever the arrival order; forgetting
re-bases the successor; replay rebuilds the same bytes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from services.consolidator.context import CONTEXT_FIELD, OWN_FIELD, contextual
from services.consolidator.replay import replay
from shared.embedding import HashingEmbedder
from shared.index import VectorParams, current_generation, ensure_episode_index, episode_schema, escape_tag
from shared.keys import Keys
from shared.keywords import fold_for_search
from shared.legacy import LAYOUT
from shared.sdk import EngramClient
from tests.integration.test_consolidator import drain, make_worker

pytest_plugins = ["tests.integration.test_query_support"]

TEXTS = {
    "e1": "Caroline: I went to the LGBTQ support group yesterday",
    "e2": "Melanie: How did it feel to be there?",
    "e3": "Caroline: It was powerful, the stories inspired me",
    "x1": "Melanie: I painted a sunrise over the lake",
}


def turn(eid: str, at: float, session: str = "s1") -> dict:
    return {
        "episode_id": eid,
        "task": TEXTS[eid],
        "outcome": "success",
        "session_id": session,
        "started_at": at,
        "completed_at": at,
    }


async def own(settings, eid: str) -> np.ndarray:
    """The vector of the episode's own text, as the worker's embedder computes it."""
    return (await HashingEmbedder(settings.embed_dim).embed([TEXTS[eid]]))[0]


async def stored(redis, keys: Keys, ns: str, eid: str, field: str = "vector") -> bytes | None:
    return await redis.hget(keys.episode_doc(await current_generation(redis, keys), ns, eid), field)


async def ingest(settings, redis, ns: str, order: list[tuple[str, float]], *, batches: bool) -> None:
    client = EngramClient(redis, namespace=ns, prefix=settings.prefix)
    worker = make_worker(settings, redis)
    for eid, at in order:
        await client.record(turn(eid, at, "s2" if eid.startswith("x") else "s1"))
        if batches:  # one batch per episode: each arrives after the ones published before it
            await drain(worker)
    await drain(worker)


async def test_vectors_lean_on_the_previous_turn_of_the_session_whatever_the_arrival_order(settings, redis):
    settings = dataclasses.replace(settings, context_episodes=1)
    keys = Keys(settings.prefix)
    await ingest(
        settings, redis, "in-order", [("e1", 10.0), ("e2", 20.0), ("x1", 25.0), ("e3", 30.0)], batches=False
    )
    # late arrivals: e3 first, then e1 (before it), then e2 (between them)
    await ingest(
        settings, redis, "late", [("e3", 30.0), ("x1", 25.0), ("e1", 10.0), ("e2", 20.0)], batches=True
    )
    o = {eid: await own(settings, eid) for eid in TEXTS}
    expected = {
        "e1": o["e1"],
        "e2": contextual(o["e2"], o["e1"]),
        "e3": contextual(o["e3"], o["e2"]),
        "x1": o["x1"],  # alone in its session
    }
    for ns in ("in-order", "late"):
        for eid, vec in expected.items():
            got = np.frombuffer(await stored(redis, keys, ns, eid), dtype=np.float32)
            np.testing.assert_allclose(got, vec, atol=1e-6, err_msg=f"{ns} {eid}")
            own_got = np.frombuffer(await stored(redis, keys, ns, eid, OWN_FIELD), dtype=np.float32)
            np.testing.assert_allclose(own_got, o[eid], atol=1e-6)
    for eid in expected:  # the same bytes whatever the order
        assert await stored(redis, keys, "in-order", eid) == await stored(redis, keys, "late", eid)
    assert float(expected["e2"] @ o["e1"]) > float(o["e2"] @ o["e1"])  # the context moved it


async def test_forgetting_an_episode_rebases_its_successor_and_replay_rebuilds_the_same_bytes(
    settings, redis
):
    settings = dataclasses.replace(settings, context_episodes=1)
    keys = Keys(settings.prefix)
    await ingest(settings, redis, "ns", [("e1", 10.0), ("e2", 20.0), ("e3", 30.0)], batches=False)
    o = {eid: await own(settings, eid) for eid in TEXTS}
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    await client.forget_episode("e2")
    await drain(make_worker(settings, redis))
    assert await stored(redis, keys, "ns", "e2") is None
    got = np.frombuffer(await stored(redis, keys, "ns", "e3"), dtype=np.float32)
    np.testing.assert_allclose(got, contextual(o["e3"], o["e1"]), atol=1e-6)  # e2's text is gone from it
    before = {eid: await stored(redis, keys, "ns", eid) for eid in ("e1", "e3")}
    result = await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert result["generation"] == 2
    assert {eid: await stored(redis, keys, "ns", eid) for eid in ("e1", "e3")} == before


async def test_off_a_vector_is_its_own_texts(settings, redis):
    settings = dataclasses.replace(settings, context_episodes=0)  # pinned: whatever the default
    keys = Keys(settings.prefix)
    await ingest(settings, redis, "ns", [("e1", 10.0), ("e2", 20.0)], batches=False)
    got = np.frombuffer(await stored(redis, keys, "ns", "e2"), dtype=np.float32)
    np.testing.assert_allclose(got, await own(settings, "e2"), atol=1e-6)
    assert await stored(redis, keys, "ns", "e2", OWN_FIELD) is None
    assert await stored(redis, keys, "ns", "e2", CONTEXT_FIELD) is None


async def test_a_rewrite_that_keeps_the_text_keeps_the_own_vector_for_the_next_turn(settings, redis):
    settings = dataclasses.replace(settings, context_episodes=1)
    keys = Keys(settings.prefix)
    await ingest(settings, redis, "ns", [("e1", 10.0)], batches=False)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    await client.record({**turn("e1", 10.0), "feedback": {"reward": 0.5}})  # same text: not re-embedded
    await drain(make_worker(settings, redis))
    assert b"0.5" in (await stored(redis, keys, "ns", "e1", "doc") or b"")
    await ingest(settings, redis, "ns", [("e2", 20.0)], batches=False)
    got = np.frombuffer(await stored(redis, keys, "ns", "e2"), dtype=np.float32)
    np.testing.assert_allclose(
        got, contextual(await own(settings, "e2"), await own(settings, "e1")), atol=1e-6
    )


async def hits(redis, keys: Keys, word: str) -> list[bytes]:
    """Keys of the documents whose task or context_text matches `word`."""
    index = keys.episode_index(await current_generation(redis, keys))
    q = f"@task|{CONTEXT_FIELD}:{escape_tag(word)}"
    return sorted((await redis.execute_command("FT.SEARCH", index, q, "NOCONTENT", "DIALECT", 2))[1:])


async def test_context_text_is_the_previous_task_rebased_on_late_arrival_and_cleared_on_erasure(
    settings, redis
):
    settings = dataclasses.replace(settings, context_episodes=1)
    keys = Keys(settings.prefix)
    await ingest(settings, redis, "ns", [("e1", 10.0), ("e3", 30.0)], batches=True)
    assert await stored(redis, keys, "ns", "e1", CONTEXT_FIELD) is None  # the session's first
    assert await stored(redis, keys, "ns", "e3", CONTEXT_FIELD) == fold_for_search(TEXTS["e1"]).encode()
    await ingest(settings, redis, "ns", [("e2", 20.0)], batches=True)  # late: between e1 and e3
    assert await stored(redis, keys, "ns", "e2", CONTEXT_FIELD) == fold_for_search(TEXTS["e1"]).encode()
    assert await stored(redis, keys, "ns", "e3", CONTEXT_FIELD) == fold_for_search(TEXTS["e2"]).encode()
    gen = await current_generation(redis, keys)
    doc = {eid: keys.episode_doc(gen, "ns", eid) for eid in TEXTS}
    assert await hits(redis, keys, "feel") == sorted([doc["e2"].encode(), doc["e3"].encode()])
    await EngramClient(redis, namespace="ns", prefix=settings.prefix).forget_episode("e2")
    await drain(make_worker(settings, redis))
    assert await hits(redis, keys, "feel") == [], "e2's text survives in no document"
    assert await stored(redis, keys, "ns", "e3", CONTEXT_FIELD) == fold_for_search(TEXTS["e1"]).encode()
    before = {eid: await stored(redis, keys, "ns", eid, CONTEXT_FIELD) for eid in ("e1", "e3")}
    await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert {eid: await stored(redis, keys, "ns", eid, CONTEXT_FIELD) for eid in ("e1", "e3")} == before


@pytest.mark.parametrize("on", [0, 1])
async def test_keyword_recall_finds_a_turn_by_its_predecessors_words_only_with_the_setting(
    settings, redis, make_client, on
):
    settings = dataclasses.replace(settings, context_episodes=on)
    await ingest(settings, redis, "default", [("e1", 10.0), ("e2", 20.0), ("x1", 25.0)], batches=False)
    api = await make_client(context_episodes=on)
    resp = await api.post("/v1/recall", json={"query": "LGBTQ support group", "mode": "keyword", "top_k": 5})
    assert resp.status == 200, await resp.text()
    results = (await resp.json())["results"]
    matched = [r["episode"]["episode_id"] for r in results if r["relevance"] > 0.0]  # others fill top_k
    assert matched == (["e1", "e2"] if on else ["e1"])


async def test_an_index_built_before_context_text_gets_the_field(redis, prefix):
    """Upgrade: ensure_episode_index FT.ALTERs the TEXT field into an older index, so it is searched."""
    keys = Keys(prefix)
    params = VectorParams(dim=256, algorithm="FLAT")
    old = episode_schema(params)
    i = old.index(CONTEXT_FIELD)
    del old[i : i + 4]  # name, TEXT, WEIGHT, weight
    index = keys.episode_index(1)
    await redis.execute_command(
        "FT.CREATE", index, "ON", "HASH", "PREFIX", 1, keys.episode_doc_prefix(1), "SCHEMA", *old
    )
    await redis.hset(keys.meta, "g1:layout", LAYOUT)
    await ensure_episode_index(redis, keys, 1, params, "hashing-256", tag_key=None)
    await redis.hset(keys.episode_doc(1, "ns", "a"), mapping={"namespace": "ns", CONTEXT_FIELD: "sunrise"})
    reply = await redis.execute_command(
        "FT.SEARCH", index, f"@{CONTEXT_FIELD}:sunrise", "NOCONTENT", "DIALECT", 2
    )
    assert reply[0] == 1


async def test_another_users_turn_is_never_the_context_of_an_episode(settings, redis):
    """A session shared by two users: each user's chain is their own, so a user's words are in no
    document of another user's (a recall scoped to one user cannot match on the other's words)."""
    settings = dataclasses.replace(settings, context_episodes=1)
    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    for eid, at, user in (("e1", 10.0, "alice"), ("e2", 20.0, "bob"), ("e3", 30.0, "alice")):
        await client.record({**turn(eid, at), "user_id": user})
    await drain(make_worker(settings, redis))
    o = {eid: await own(settings, eid) for eid in ("e1", "e2", "e3")}
    assert await stored(redis, keys, "ns", "e2", CONTEXT_FIELD) is None  # bob's first episode
    assert await stored(redis, keys, "ns", "e2") == o["e2"].tobytes()
    assert await stored(redis, keys, "ns", "e3", CONTEXT_FIELD) == fold_for_search(TEXTS["e1"]).encode()
    assert await stored(redis, keys, "ns", "e3") == contextual(o["e3"], o["e1"]).tobytes()


async def test_an_episode_moved_to_another_session_leaves_its_old_followers_context(settings, redis):
    """Re-published into another session, e2 must leave e3's context_text and vector (its old session is
    re-based too, not only the new one)."""
    settings = dataclasses.replace(settings, context_episodes=1)
    keys = Keys(settings.prefix)
    await ingest(settings, redis, "ns", [("e1", 10.0), ("e2", 20.0), ("e3", 30.0)], batches=True)
    assert await stored(redis, keys, "ns", "e3", CONTEXT_FIELD) == fold_for_search(TEXTS["e2"]).encode()
    await EngramClient(redis, namespace="ns", prefix=settings.prefix).record(turn("e2", 20.0, "elsewhere"))
    await drain(make_worker(settings, redis))
    assert await stored(redis, keys, "ns", "e3", CONTEXT_FIELD) == fold_for_search(TEXTS["e1"]).encode()
    o = {eid: await own(settings, eid) for eid in ("e1", "e3")}
    assert await stored(redis, keys, "ns", "e3") == contextual(o["e3"], o["e1"]).tobytes()
