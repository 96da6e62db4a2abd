"""Expiry: `expires_at` / `ttl` hide an episode from every read at once (a NUMERIC filter in the query),
then the consolidator's sweep erases it like a forget."""

from __future__ import annotations

import time

from services.consolidator import expiry
from shared import streams
from shared.codec import decode
from shared.keys import Keys
from tests.helpers import wait_until
from tests.integration.test_query_e2e import consolidating, drain
from tests.integration.test_query_support import episode

pytest_plugins = ["tests.integration.test_query_support"]


def ids(body):
    return sorted(r["episode"]["episode_id"] if "episode" in r else r["episode_id"] for r in body["results"])


async def test_expired_episodes_are_hidden_everywhere_then_erased(api, settings, redis, prefix):
    now = time.time()
    common = dict(task="renew the tls certificate", category="ops", agent_id="ops")
    items = [
        episode("live", completed_at=now - 300, **common),
        episode("later", completed_at=now - 300, ttl="1d", **common),
        # an episode sent after its expiry (a late import) is hidden from the start
        episode("gone", completed_at=now - 300, expires_at=now - 60, outcome="failure", **common),
    ]
    resp = await api.post("/v1/episodes", json={"episodes": items})
    assert resp.status == 202, await resp.text()
    await drain(settings, redis)
    later = await (await api.get("/v1/episodes/later")).json()
    assert later["episode"]["expires_at"].endswith("Z")
    assert (await api.get("/v1/episodes/gone")).status == 404

    recall = await (
        await api.post("/v1/recall", json={"query": "renew the tls certificate", "top_k": 10})
    ).json()
    assert ids(recall) == ["later", "live"]
    context = await (await api.post("/v1/context", json={"task": "renew the tls certificate"})).json()
    assert "gone" not in ids(context) and "gone" not in [e["episode_id"] for e in context["short_term"]]
    skills = await (await api.get("/v1/skills")).json()
    assert skills["results"][0]["episodes"] == 2 and skills["results"][0]["successes"] == 2
    curve = await (await api.get("/v1/learning-curve")).json()
    assert sorted(p["episode_id"] for p in curve["results"]) == ["later", "live"]
    listed = await (await api.get("/v1/episodes")).json()
    assert ids(listed) == ["later", "live"]
    suggest = await (await api.post("/v1/suggest", json={"task": "renew the tls certificate"})).json()
    assert suggest["failures"] == 0
    assert (await api.patch("/v1/episodes/gone", json={"importance": 3})).status == 404

    # the sweep erases it as a forget: document, events, stream entries; a tombstone stays
    keys = Keys(prefix)
    assert await expiry.sweep(redis, settings) == 1
    assert await expiry.sweep(redis, settings) == 0  # the lease: one sweep per interval across workers
    await drain(settings, redis)
    assert await redis.exists(keys.tombstone("default", "gone"))
    assert not await redis.exists(keys.episode_doc(1, "default", "gone"))
    left = [decode(e.payload) for e in await streams.read_range(redis, keys.stream)]
    assert [type(e).__name__ for e in left if getattr(e, "episode_id", None) == "gone"] == [
        "EpisodeForgotten"
    ]


async def test_an_expiry_set_later_hides_the_episode_when_it_passes(api, settings, redis):
    await api.post("/v1/episodes", json=episode("e1"))
    await drain(settings, redis)
    async with consolidating(settings, redis):
        resp = await api.patch("/v1/episodes/e1", json={"ttl": "1s"}, params={"wait": 10})
        assert (await resp.json())["projected"]
        assert (await api.get("/v1/episodes/e1")).status == 200
        # no sweep runs here: the query alone hides it once the instant passes
        await wait_until(
            lambda: _status(api, "/v1/episodes/e1", 404), timeout=10, message="the episode to expire"
        )
        body = await (await api.post("/v1/recall", json={"query": "a task"})).json()
        assert body["results"] == []


async def _status(api, path, status):
    return (await api.get(path)).status == status


async def test_bad_expiries_are_422_naming_the_field(api):
    cases = [
        (episode("a", ttl="soon"), "ttl"),
        (episode("b", ttl=-5), "ttl"),
        (episode("c", ttl="1d", expires_at="2030-01-01T00:00:00Z"), "ttl"),
        (episode("d", completed_at=1_700_000_000.0, expires_at=1_600_000_000.0), "expires_at"),
        (episode("e", expires_at="tomorrow"), "expires_at"),
        # no completed_at: it defaults to now, and an expiry before that was accepted, then dead-lettered
        (
            {k: v for k, v in episode("f", expires_at="2020-01-01T00:00:00Z").items() if k != "completed_at"},
            "expires_at",
        ),
    ]
    for body, field in cases:
        resp = await api.post("/v1/episodes", json=body)
        assert resp.status == 422, (body, await resp.text())
        assert field in {e["field"] for e in (await resp.json())["errors"]}, body


async def test_facts_are_built_without_expired_episodes(api, settings, redis):
    now = time.time()
    common = dict(task="rotate the api gateway tls certificate", category="ops", agent_id="ops")
    live = [episode(f"l{i}", completed_at=now - 300 + i, **common) for i in range(4)]
    gone = [episode(f"g{i}", completed_at=now - 300 + i, expires_at=now - 10, **common) for i in range(4)]
    await api.post("/v1/episodes", json={"episodes": live + gone})
    await drain(settings, redis)
    assert (await api.post("/v1/consolidate", json={})).status == 200
    facts = (await (await api.post("/v1/facts/search", json={"top_k": 100})).json())["results"]
    assert facts, "four live episodes of one task make a fact"
    evidence = {e for f in facts for e in f["evidence"]}
    assert evidence and not any(e.startswith("g") for e in evidence)
    assert all(f["support"] <= 4 for f in facts)


async def test_a_facts_evidence_hides_an_episode_that_expired_since(api, settings, redis):
    now = time.time()
    common = dict(task="rotate the api gateway tls certificate", category="ops", agent_id="ops")
    await api.post(
        "/v1/episodes",
        json={"episodes": [episode(f"l{i}", completed_at=now - 300 + i, **common) for i in range(5)]},
    )
    await drain(settings, redis)
    assert (await api.post("/v1/consolidate", json={})).status == 200
    [fact, *_] = (await (await api.post("/v1/facts/search", json={"top_k": 100})).json())["results"]
    assert "l0" in fact["evidence"]
    async with consolidating(settings, redis):
        resp = await api.patch("/v1/episodes/l0", json={"ttl": "1s"}, params={"wait": 10})
        assert (await resp.json())["projected"]
    await wait_until(lambda: _status(api, "/v1/episodes/l0", 404), timeout=10, message="l0 to expire")
    detail = await (await api.get(f"/v1/facts/{fact['fact_id']}")).json()
    shown = [e["episode_id"] for e in detail["evidence"]]
    assert shown and "l0" not in shown


async def test_a_ttl_counts_from_completed_at_also_when_it_defaults_to_now(api, settings, redis):
    """Without `completed_at`, a `ttl` counts from the completion (now), not from `started_at` (a 2 h
    ttl of an episode started an hour ago expired an hour after completion; a 1 h ttl of one started
    2 h ago was a 422 naming `expires_at`, which nobody sent), and `ttl: 1d` is 86400 s, not
    86399.99998 s (two clock reads)."""
    from engram_episodic import AsyncEngram

    now = time.time()
    cases = [("two-hours", "2h", now - 3600, 7200.0), ("one-hour", "1h", now - 7200, 3600.0)]
    for eid, ttl, started, _seconds in cases:
        body = {"episode_id": eid, "task": "x", "outcome": "success", "ttl": ttl, "started_at": started}
        resp = await api.post("/v1/episodes", json=body)
        assert resp.status == 202, await resp.text()
    async with AsyncEngram(str(api.make_url("")).rstrip("/")) as memory:
        await memory.record(episode_id="one-day", task="x", outcome="success", ttl="1d")
        cases.append(("one-day", "1d", None, 86400.0))
        # an episode block counts it from its completion too, not from the block's start
        async with memory.episode("a block", ttl="1h", started_at=now - 600, episode_id="block") as ep:
            await ep.complete("success")
        cases.append(("block", "1h", now - 600, 3600.0))
        await drain(settings, redis)
        for eid, _ttl, _started, seconds in cases:
            got = (await memory.get_episode(eid)).episode
            assert abs(got.expires_at - got.completed_at - seconds) < 1e-6, (
                eid,
                got.expires_at - got.completed_at,
            )
            assert abs(got.completed_at - now) < 60


async def test_a_null_expiry_clears_it_and_the_sweep_leaves_the_episode(api, settings, redis):
    now = time.time()
    await api.post(
        "/v1/episodes",
        json={"episodes": [episode(e, completed_at=now - 60, ttl="1h") for e in ("by-ttl", "by-at")]},
    )
    await drain(settings, redis)
    async with consolidating(settings, redis):
        for eid, body in (("by-ttl", {"ttl": None}), ("by-at", {"expires_at": None})):
            resp = await api.patch(f"/v1/episodes/{eid}", json=body, params={"wait": 10})
            assert resp.status == 202, await resp.text()
            assert (await resp.json())["projected"]
            got = await (await api.get(f"/v1/episodes/{eid}")).json()
            assert got["episode"].get("expires_at") is None
    # two hours on the sweep finds nothing to erase: the episodes no longer expire
    assert await expiry.expired(redis, Keys(settings.prefix), now + 7200) == {}
    resp = await api.post("/v1/recall", json={"query": "a task", "as_of": now + 7200})
    assert sorted(r["episode"]["episode_id"] for r in (await resp.json())["results"]) == ["by-at", "by-ttl"]


def test_the_client_sends_a_null_expiry_as_a_clear():
    from engram_episodic.calls import Calls

    assert Calls.update_episode("e1", expires_at=None).body == {"expires_at": None}
    assert Calls.update_episode("e1", ttl=None).body == {"ttl": None}
    assert Calls.update_episode("e1", importance=3, ttl=None).body == {"importance": 3, "ttl": None}
