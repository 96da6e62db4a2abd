"""`GET /v1/dead-letters`, `POST /v1/dead-letters/redrive` and `/discard`: a tenant sees why its own
events were dead-lettered and re-drives or discards them, and nothing of another namespace's."""

from __future__ import annotations

from engram_episodic.events import EpisodeCompleted
from engram_episodic.validation import parse_episode
from shared import streams
from shared.codec import encode
from shared.keys import Keys
from tests.integration.test_query_e2e import drain
from tests.integration.test_query_support import KEY_A, KEY_B, auth, episode

pytest_plugins = ["tests.integration.test_query_support"]


async def dead_lettered(settings, redis, namespace: str, episode_id: str) -> None:
    """An event of the wrong vector dimension published by a client other than the service (which
    refuses it): the consolidator dead-letters it."""
    bad = {**episode(episode_id, task="rotate the keys"), "vector": [0.5] * 3, "completed_at": 1.0}
    event = EpisodeCompleted(
        namespace=namespace, episode_id=episode_id, occurred_at=1.0, episode=parse_episode(bad)
    )
    await streams.publish(redis, Keys(settings.prefix).stream_of(namespace), [encode(event)])
    await drain(settings, redis)


async def test_a_tenant_lists_redrives_and_discards_only_its_dead_letters(tenants, settings, redis):
    await dead_lettered(settings, redis, "ns-a", "bad-a")
    await dead_lettered(settings, redis, "ns-b", "bad-b")
    mine = await (await tenants.get("/v1/dead-letters", headers=auth(KEY_A))).json()
    assert mine["total"] == 1 and [d["episode_id"] for d in mine["results"]] == ["bad-a"]
    letter = mine["results"][0]
    assert "vector" in letter["reason"] and letter["at"].endswith("Z")
    theirs = await (await tenants.get("/v1/dead-letters", headers=auth(KEY_B))).json()
    assert [d["episode_id"] for d in theirs["results"]] == ["bad-b"]

    # another namespace's id is unknown to this one: nothing is done
    refused = await tenants.post(
        "/v1/dead-letters/discard", json={"ids": [letter["id"]]}, headers=auth(KEY_B)
    )
    assert refused.status == 404
    redriven = await tenants.post(
        "/v1/dead-letters/redrive", json={"ids": [letter["id"], "0-1"]}, headers=auth(KEY_A)
    )
    assert await redriven.json() == {"done": 1, "unknown": ["0-1"]}
    await drain(settings, redis)  # published again, and dead-lettered again: the fault is in the event
    again = await (await tenants.get("/v1/dead-letters", headers=auth(KEY_A))).json()
    assert again["total"] == 1 and again["results"][0]["id"] != letter["id"]
    discarded = await tenants.post(
        "/v1/dead-letters/discard", json={"ids": [again["results"][0]["id"]]}, headers=auth(KEY_A)
    )
    assert await discarded.json() == {"done": 1, "unknown": []}
    assert (await (await tenants.get("/v1/dead-letters", headers=auth(KEY_A))).json())["total"] == 0
    assert (await (await tenants.get("/v1/dead-letters", headers=auth(KEY_B))).json())["total"] == 1


async def test_dead_letter_requests_name_their_bad_fields(tenants):
    empty = await tenants.post("/v1/dead-letters/redrive", json={"ids": []}, headers=auth(KEY_A))
    assert empty.status == 422 and (await empty.json())["errors"][0]["field"] == "ids"
    limit = await tenants.get("/v1/dead-letters?limit=0", headers=auth(KEY_A))
    assert limit.status == 422 and (await limit.json())["errors"][0]["field"] == "limit"
    assert (await tenants.get("/v1/dead-letters")).status == 401
