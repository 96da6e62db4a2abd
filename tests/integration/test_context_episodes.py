"""ENGRAM_CONTEXT_EPISODES against the real Redis: a stored vector leans towards the previous episode of
its session whatever the arrival order; forgetting re-bases the successor; replay rebuilds the same bytes."""

from __future__ import annotations

import dataclasses

import numpy as np

from services.consolidator.context import OWN_FIELD, contextual
from services.consolidator.replay import replay
from shared.embedding import HashingEmbedder
from shared.index import current_generation
from shared.keys import Keys
from shared.sdk import EngramClient
from tests.integration.test_consolidator import drain, make_worker

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


async def test_off_by_default_a_vector_is_its_own_texts(settings, redis):
    keys = Keys(settings.prefix)
    await ingest(settings, redis, "ns", [("e1", 10.0), ("e2", 20.0)], batches=False)
    got = np.frombuffer(await stored(redis, keys, "ns", "e2"), dtype=np.float32)
    np.testing.assert_allclose(got, await own(settings, "e2"), atol=1e-6)
    assert await stored(redis, keys, "ns", "e2", OWN_FIELD) is None


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
