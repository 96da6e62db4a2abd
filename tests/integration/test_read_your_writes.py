"""Read-your-writes over HTTP: an accepted episode is `pending` until projected, and ingest can wait."""

from __future__ import annotations

import asyncio

from tests.helpers import wait_until
from tests.integration.test_query_e2e import consolidating, drain
from tests.integration.test_query_support import KEY_A, KEY_B, auth, episode

pytest_plugins = ["tests.integration.test_query_support"]


async def test_accepted_but_not_projected_is_pending_not_404(tenants, settings, redis):
    resp = await tenants.post(
        "/v1/episodes", json=episode("ryw-1", task="rotate the keys"), headers=auth(KEY_A)
    )
    assert resp.status == 202
    got = await tenants.get("/v1/episodes/ryw-1", headers=auth(KEY_A))
    assert got.status == 200, await got.text()
    body = await got.json()
    assert body["status"] == "pending" and body["episode"] is None and body["episode_id"] == "ryw-1"
    assert (await tenants.get("/v1/episodes/ryw-1", headers=auth(KEY_B))).status == 404, "not across tenants"
    assert (await tenants.get("/v1/episodes/never-sent", headers=auth(KEY_A))).status == 404
    await drain(settings, redis)
    body = await (await tenants.get("/v1/episodes/ryw-1", headers=auth(KEY_A))).json()
    assert body["status"] == "completed" and body["episode"]["task"]["description"] == "rotate the keys"
    await tenants.post(
        "/v1/episodes", json=episode("ryw-1", task="rotate the keys again"), headers=auth(KEY_A)
    )
    await tenants.delete("/v1/episodes/ryw-1", headers=auth(KEY_A))
    await drain(settings, redis)
    assert (await tenants.get("/v1/episodes/ryw-1", headers=auth(KEY_A))).status == 404, (
        "forgotten, not pending"
    )


async def test_get_episode_refuses_query_parameters(tenants):
    resp = await tenants.get("/v1/episodes/x", params={"include": "vector"}, headers=auth(KEY_A))
    assert resp.status == 422
    assert (await resp.json())["errors"] == [{"field": "include", "reason": "is not a known query parameter"}]


async def test_ingest_waits_until_projected_when_asked(tenants, settings, redis):
    batch = {"episodes": [episode(f"w{i}", task=f"upgrade the kernel {i}") for i in range(3)]}
    async with consolidating(settings, redis, "ryw"):
        resp = await tenants.post("/v1/episodes", params={"wait": "10"}, json=batch, headers=auth(KEY_A))
        body = await resp.json()
    assert resp.status == 202 and body["projected"] is True and all(r["projected"] for r in body["results"])
    recall = await (
        await tenants.post(
            "/v1/recall", json={"query": "upgrade the kernel", "top_k": 5}, headers=auth(KEY_A)
        )
    ).json()
    assert sorted(r["episode"]["episode_id"] for r in recall["results"]) == ["w0", "w1", "w2"]

    # nobody consolidates now: the wait ends at its bound and says so
    resp = await tenants.post("/v1/episodes", params={"wait": "0.2"}, json=episode("w9"), headers=auth(KEY_A))
    body = await resp.json()
    assert resp.status == 202 and body["projected"] is False and body["results"][0]["projected"] is False
    for bad in ("31", "-1", "soon"):
        resp = await tenants.post(
            "/v1/episodes", params={"wait": bad}, json=episode("w10"), headers=auth(KEY_A)
        )
        assert resp.status == 422 and (await resp.json())["errors"][0]["field"] == "wait"


async def test_the_client_reads_its_writes(tenants, settings, redis):
    from engram_episodic import AsyncEngram, WaitTimeout

    base = str(tenants.make_url("")).rstrip("/")
    async with AsyncEngram(base, api_key=KEY_A) as memory:
        eid = await memory.record(task="renew the dns zone", outcome="success")
        pending = await memory.get_episode(eid)
        assert pending.status == "pending" and pending.episode is None
        try:
            await memory.record(task="renew the dns zone again", outcome="success", wait=0.2)
        except WaitTimeout as exc:
            assert "accepted, but not projected within 0.2s" in str(exc)
        else:
            raise AssertionError("nobody consolidates: the wait must time out")
        async with consolidating(settings, redis, "ryw-client"):
            again = await memory.record(
                episode_id=eid, task="renew the dns zone (v2)", outcome="failure", wait=10
            )
        assert again == eid
        stored = await memory.get_episode(eid)
    assert stored.status == "completed" and stored.episode.outcome == "failure", (
        "the new version, not the old"
    )


async def test_an_accepted_episode_can_be_forgotten_before_it_is_projected(tenants, settings, redis):
    """DELETE of a pending episode is not a 404, and the episode is not projected afterwards."""
    await tenants.post("/v1/episodes", json=episode("early", task="SECRET-EARLY plans"), headers=auth(KEY_A))
    assert (await tenants.delete("/v1/episodes/early", headers=auth(KEY_B))).status == 404, (
        "not another tenant's"
    )
    resp = await tenants.delete("/v1/episodes/early", headers=auth(KEY_A))
    assert resp.status == 202, await resp.text()
    await drain(settings, redis)
    assert (await tenants.get("/v1/episodes/early", headers=auth(KEY_A))).status == 404
    recall = await (
        await tenants.post(
            "/v1/recall", json={"query": "SECRET-EARLY plans", "top_k": 5}, headers=auth(KEY_A)
        )
    ).json()
    assert recall["results"] == []


async def test_a_wait_on_an_update_sees_the_new_version(tenants, settings, redis):
    """For an episode that already had events, the worker records the new event before it rewrites the
    document: a wait that watched the event hash alone returned while GET still showed the old version."""
    async with consolidating(settings, redis, "ryw-update"):
        for i in range(15):
            body = episode("upd", task="patch the api gateway", solution=f"v{i}")
            resp = await tenants.post("/v1/episodes", params={"wait": "10"}, json=body, headers=auth(KEY_A))
            assert (await resp.json())["projected"] is True
            got = await (await tenants.get("/v1/episodes/upd", headers=auth(KEY_A))).json()
            assert got["episode"]["solution"] == f"v{i}", f"version {i}: read {got['episode']['solution']}"


async def test_a_wait_says_at_once_why_an_episode_will_never_be_projected(api, settings, redis):
    """Re-posting a forgotten episode_id with `?wait=30` answered after the full 30 s
    with `projected: false` (the consolidator drops it: a forgotten id stays forgotten). A dropped or
    dead-lettered event is now said as soon as it is acked, with the reason, in the client's error too."""
    from engram_episodic import AsyncEngram, WaitTimeout
    from services.consolidator import deadletters
    from shared import streams
    from shared.keys import Keys

    keys = Keys(settings.prefix)
    async with consolidating(settings, redis, "ryw-why"):
        assert (await api.post("/v1/episodes", json=episode("gone"), params={"wait": 10})).status == 202
        assert (await api.delete("/v1/episodes/gone")).status == 202
        await wait_until(lambda: redis.exists(keys.tombstone(settings.default_namespace, "gone")))
        body = await (await api.post("/v1/episodes", json=episode("gone"), params={"wait": 30})).json()
        assert body["projected"] is False and body["reason"] == "forgotten", body
        async with AsyncEngram(str(api.make_url("")).rstrip("/")) as memory:
            try:
                await memory.publish([episode("gone"), episode("fine")], wait=30)
            except WaitTimeout as exc:
                assert "gone: forgotten before, so not published" in str(exc), str(exc)
                assert "fine" not in str(exc) and not str(exc).startswith("accepted"), str(exc)
            else:
                raise AssertionError("a forgotten id is never projected")

    # without a consolidator, this test dead-letters the request's event as a worker gives up on one
    waited = asyncio.ensure_future(api.post("/v1/episodes", json=episode("poison"), params={"wait": 30}))
    group = streams.StreamGroup(redis, keys.stream, settings.consumer_group)
    await group.ensure()
    entries = await wait_until(lambda: group.read_new("t", count=10, block_ms=None), message="the entry")
    [entry] = [e for e in entries if b"poison" in e.payload]
    await deadletters.dead_letter(group, keys, entry, "a reason", consumer="t")
    body = await (await waited).json()
    assert body["projected"] is False and body["reason"] == "dead_lettered", body


async def test_a_read_patch_or_forget_right_after_a_publish_never_answers_404(api, settings, redis):
    """GET, PATCH and DELETE right after a POST answered 404 now and then (6 of 60
    GETs; a DELETE that then did not forget): the document was not written at the first read and the
    entry was acked by the time the pending check looked. Each of them is retried here while a
    consolidator projects beside it; none may be a 404."""
    async with consolidating(settings, redis, "ryw-race"):
        for i in range(60):
            for method, body in (("GET", None), ("PATCH", {"importance": 3}), ("DELETE", None)):
                eid = f"race-{method}-{i}"
                assert (await api.post("/v1/episodes", json=episode(eid))).status == 202
                for _ in range(i % 4):  # let the consolidator get a little further each time
                    await asyncio.sleep(0)
                resp = await api.request(method, f"/v1/episodes/{eid}", json=body)
                assert resp.status in (200, 202), (method, i, await resp.text())


async def test_an_expired_episode_posted_again_says_expired(api, settings, redis):
    """Re-posting an episode past its ttl answered `projected: true`, yet it stayed
    hidden (it keeps its expiry). The answer now says `reason: expired`."""
    import time

    async with consolidating(settings, redis, "ryw-expired"):
        first = {"episode_id": "ttl-3", "task": "third", "outcome": "success", "ttl": 1}
        assert (await (await api.post("/v1/episodes", json=first, params={"wait": 10})).json())["projected"]
        expires = time.time() + 1.0
        await wait_until(lambda: time.time() > expires, message="the ttl passes")
        again = {"episode_id": "ttl-3", "task": "third again", "outcome": "success"}
        body = await (await api.post("/v1/episodes", json=again, params={"wait": 10})).json()
        assert body["projected"] is False and body["reason"] == "expired", body
        assert (await api.get("/v1/episodes/ttl-3")).status == 404


async def test_a_wait_ends_when_its_episode_was_re_published_under_another_user(api, settings, redis):
    """An episode posted by one user and at once by another is the second user's: the first user's
    event leaves the episode's event hash when both are projected together, and the first post's wait
    answers then that it was projected, instead of waiting out its bound."""
    from shared.keys import Keys

    first = asyncio.ensure_future(
        api.post("/v1/episodes", json=episode("swap-w", user_id="owner-a"), params={"wait": 8})
    )
    stream = Keys(settings.prefix).stream
    await wait_until(lambda: redis.xlen(stream), message="the first post's entry")
    assert (await api.post("/v1/episodes", json=episode("swap-w", user_id="owner-b"))).status == 202
    started = asyncio.get_running_loop().time()
    async with consolidating(settings, redis, "ryw-swap"):
        body = await (await first).json()
    assert body["projected"] is True, body
    assert asyncio.get_running_loop().time() - started < 4
    got = await (await api.get("/v1/episodes/swap-w")).json()
    assert got["episode"]["user_id"] == "owner-b"
