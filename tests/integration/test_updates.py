"""`PATCH /v1/episodes/{id}`: a change after the fact is an event, folded idempotently, rebuilt by replay."""

from __future__ import annotations

import asyncio
import os

import pytest

from engram_episodic import AsyncEngram, Engram, InvalidEpisode, ResourceNotFound
from engram_episodic.events import EpisodeUpdated
from services.consolidator.replay import replay
from shared import streams
from shared.codec import decode
from shared.embedding import HashingEmbedder
from shared.keys import Keys
from tests.helpers import wait_until
from tests.integration.test_query_e2e import consolidating, drain
from tests.integration.test_query_support import KEY_A, KEY_B, auth, episode

pytest_plugins = ["tests.integration.test_query_support"]


async def stored(api, episode_id, headers=None):
    resp = await api.get(f"/v1/episodes/{episode_id}", headers=headers or {})
    assert resp.status == 200, await resp.text()
    return (await resp.json())["episode"]


async def test_a_reward_that_arrives_later(api, settings, redis):
    first = episode(
        "e1",
        reward=None,
        feedback={"message": "tests pass"},
        metadata={"ticket": "T-1", "drop": 1},
        importance=3,
    )
    async with consolidating(settings, redis):
        assert (await api.post("/v1/episodes", json=first, params={"wait": 10})).status == 202
        resp = await api.patch(
            "/v1/episodes/e1",
            json={"feedback": {"reward": 0.9}, "importance": 8, "metadata": {"drop": None, "pr": 42}},
            params={"wait": 10},
        )
        assert resp.status == 202, await resp.text()
        body = await resp.json()
        assert body["episode_id"] == "e1" and body["event_id"] and body["projected"] is True
        got = await stored(api, "e1")
        assert got["feedback"] == {"reward": 0.9, "message": "tests pass"}  # merged, not replaced
        assert got["importance"] == 8 and got["metadata"] == {"ticket": "T-1", "pr": 42}
        assert got["outcome"] == "success"
        resp = await api.patch("/v1/episodes/e1", json={"outcome": "failure"}, params={"wait": 10})
        assert (await resp.json())["projected"]
        assert (await stored(api, "e1"))["outcome"] == "failure"
        # recall's filters and signals see it: the index fields were rewritten too
        recall = await (await api.post("/v1/recall", json={"query": "a task", "outcome": "failure"})).json()
        assert [r["episode"]["episode_id"] for r in recall["results"]] == ["e1"]
        assert recall["results"][0]["episode"]["feedback"]["reward"] == 0.9
    events = [decode(e.payload) for e in await streams.read_range(redis, Keys(settings.prefix).stream)]
    updates = [e for e in events if isinstance(e, EpisodeUpdated)]
    assert [u.importance for u in updates] == [8, None] and updates[1].outcome == "failure"

    # redelivering the updates is harmless, and a replay rebuilds the same document from the events
    before = await stored(api, "e1")
    await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert await stored(api, "e1") == before


async def test_unknown_forgotten_and_bad_patches(api, settings, redis):
    assert (await api.patch("/v1/episodes/nope", json={"importance": 5})).status == 404
    await api.post("/v1/episodes", json=episode("e1"))
    await drain(settings, redis)
    cases = [
        ({}, "<root>"),
        ({"importance": 11}, "importance"),
        ({"outcome": "great"}, "outcome"),
        ({"feedback": {"reward": "high"}}, "feedback.reward"),
        ({"task": "renamed"}, "task"),
        ({"metadata": [1]}, "metadata"),
        ({"feedback": {"reward": None}}, "feedback"),  # a null keeps the stored value: a no-op was a 202
        ({"feedback": {}}, "feedback"),
        ({"metadata": {}}, "metadata"),  # merged key by key: a change of nothing
    ]
    for body, field in cases:
        resp = await api.patch("/v1/episodes/e1", json=body)
        assert resp.status == 422, (body, await resp.text())
        fields = {e["field"] for e in (await resp.json())["errors"]}
        assert field in fields, (body, fields)
    assert (await api.patch("/v1/episodes/e1", data=b"{")).status == 400
    assert (await api.delete("/v1/episodes/e1")).status == 202
    await drain(settings, redis)
    assert (await api.patch("/v1/episodes/e1", json={"importance": 5})).status == 404


async def test_a_patch_refused_once_merged_with_the_stored_episode_is_a_422(api, settings, redis):
    """Fields valid alone that the stored episode makes invalid (tests_passed 5 of a
    stored 3, metadata merged past 64 KiB, expires_at before completed_at) are refused naming the field,
    nothing is published, and the episode reads back as before, in the client too."""
    first = episode(
        "m1",
        feedback={"reward": 0.5, "tests_passed": 2, "tests_total": 3},
        metadata={"a": "x" * 40_000},
        completed_at="2026-12-03T09:07:00+00:00",
    )
    async with consolidating(settings, redis):
        assert (await api.post("/v1/episodes", json=first, params={"wait": 10})).status == 202
        before = await stored(api, "m1")
        length = await redis.xlen(Keys(settings.prefix).stream)
        cases = [
            ({"feedback": {"tests_passed": 5}}, "feedback.tests_passed"),
            ({"feedback": {"tests_total": 1}}, "feedback.tests_passed"),
            ({"metadata": {"b": "y" * 40_000}}, "metadata"),
            ({"expires_at": "2026-12-03T09:00:00+00:00"}, "expires_at"),
        ]
        for body, field in cases:
            resp = await api.patch("/v1/episodes/m1", json=body, params={"wait": 5})
            assert resp.status == 422, (field, await resp.text())
            errors = (await resp.json())["errors"]
            assert field in {e["field"] for e in errors}, errors
            assert all("once merged with the stored episode" in e["reason"] for e in errors), errors
        assert await redis.xlen(Keys(settings.prefix).stream) == length  # nothing published
        assert await stored(api, "m1") == before
        # the same fields pass where the stored episode allows them
        resp = await api.patch(
            "/v1/episodes/m1",
            json={"feedback": {"tests_passed": 3}, "metadata": {"a": None}},
            params={"wait": 10},
        )
        assert resp.status == 202 and (await resp.json())["projected"], await resp.text()
        got = await stored(api, "m1")
        assert got["feedback"]["tests_passed"] == 3 and "metadata" not in got


async def test_a_waited_patch_the_fold_skipped_is_a_422(api, settings, redis):
    """A change accepted before its episode was projected, invalid once merged
    (tests_passed 5 of 3), answered `projected: true` with `?wait` although the fold skipped it. Now the
    wait ends in a 422 naming the field, and the episode keeps its values."""
    first = episode("late-1", feedback={"reward": 0.5, "tests_passed": 2, "tests_total": 3})
    assert (await api.post("/v1/episodes", json=first)).status == 202  # not projected: no consolidator
    patch = asyncio.ensure_future(
        api.patch("/v1/episodes/late-1", json={"feedback": {"tests_passed": 5}}, params={"wait": 20})
    )
    stream = Keys(settings.prefix).stream
    await wait_until(lambda: _length_is(redis, stream, 2), message="the update published")
    async with consolidating(settings, redis):
        resp = await patch
        assert resp.status == 422, await resp.text()
        [error] = (await resp.json())["errors"]
        assert error["field"] == "feedback.tests_passed" and "was not applied" in error["reason"]
        assert (await stored(api, "late-1"))["feedback"]["tests_passed"] == 2
        resp = await api.patch(
            "/v1/episodes/late-1", json={"feedback": {"tests_passed": 3}}, params={"wait": 10}
        )
        assert resp.status == 202 and (await resp.json())["projected"] is True


async def _length_is(redis, stream, n: int) -> bool:
    return await redis.xlen(stream) == n


async def test_patch_is_per_tenant_and_in_both_clients(tenants, settings, redis):
    await tenants.post("/v1/episodes", json=episode("shared-id"), headers=auth(KEY_A))
    await drain(settings, redis)
    resp = await tenants.patch("/v1/episodes/shared-id", json={"importance": 9}, headers=auth(KEY_B))
    assert resp.status == 404  # another namespace's id answers as one that does not exist
    base = str(tenants.make_url("")).rstrip("/")
    async with consolidating(settings, redis), AsyncEngram(base, api_key=KEY_A) as memory:
        done = await memory.update_episode("shared-id", feedback={"reward": 0.25}, wait=10)
        assert done.episode_id == "shared-id" and done.event_id and done.projected
        assert (await memory.get_episode("shared-id")).episode.feedback.reward == 0.25
        with pytest.raises(InvalidEpisode) as bad:  # checked before anything is sent
            await memory.update_episode("shared-id", importance=0)
        assert [f for f, _ in bad.value.errors] == ["importance"]

        def sync():
            with Engram(base, api_key=KEY_A) as m:
                m.update_episode("shared-id", outcome="partial", metadata={"k": 1}, wait=10)
                with pytest.raises(ResourceNotFound):
                    m.update_episode("missing", importance=2)
                return m.get_episode("shared-id").episode

        ep = await asyncio.to_thread(sync)
    assert ep.outcome == "partial" and ep.metadata == {"k": 1} and ep.feedback.reward == 0.25


async def test_a_sealed_update_is_shredded_with_its_user(make_client, settings, redis):
    """With a master key the update's text is sealed under the episode's user's key: no plaintext in
    the stream, readable by the workers, gone when the user is forgotten."""
    sealed = settings.with_(master_key=os.urandom(32))
    api = await make_client(master_key=sealed.master_key)
    keys = Keys(sealed.prefix)
    await api.post("/v1/episodes", json=episode("e1", user_id="ann"))
    await drain(sealed, redis)
    secret = "the customer's card number was 4111"
    resp = await api.patch(
        "/v1/episodes/e1", json={"feedback": {"message": secret}, "metadata": {"n": secret}}
    )
    assert resp.status == 202
    raw = b"".join(v for _sid, f in await redis.xrange(keys.stream) for v in f.values())
    assert secret.encode() not in raw
    await drain(sealed, redis)
    assert (await stored(api, "e1"))["feedback"]["message"] == secret
    assert (await api.delete("/v1/users/ann")).status == 202
    await drain(sealed, redis)
    assert (await api.get("/v1/episodes/e1")).status == 404
    assert await redis.xlen(keys.stream) <= 1  # only the forget itself may remain until housekeeping


async def test_a_waited_patch_that_expires_the_episode_is_projected(api, settings, redis):
    """`update_episode(eid, expires_at=<past>, wait=...)` raised WaitTimeout "expired ... publish
    under a new episode_id", though the change did what it asked: hide the episode now."""
    async with consolidating(settings, redis):
        assert (await api.post("/v1/episodes", json=episode("x1"), params={"wait": 10})).status == 202
        resp = await api.patch(
            "/v1/episodes/x1", json={"expires_at": "2024-01-01T00:00:00Z"}, params={"wait": 10}
        )
        body = await resp.json()
        assert resp.status == 202 and body["projected"] is True and "reason" not in body, body
        assert (await api.get("/v1/episodes/x1")).status == 404
