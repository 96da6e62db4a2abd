"""Bulk forgetting: by agent, by session, by ids; each a job that says how many and when it is done."""

from __future__ import annotations

import asyncio

from engram_episodic import AsyncEngram, Engram
from shared import streams
from shared.codec import decode
from shared.keys import Keys, digest
from tests.helpers import leaked_text, wait_until
from tests.integration.test_query_e2e import consolidating, drain
from tests.integration.test_query_support import KEY_A, KEY_B, auth, episode

pytest_plugins = ["tests.integration.test_query_support"]


async def listed(api, headers=None, **params):
    body = await (
        await api.get("/v1/episodes", params={"limit": 1000, **params}, headers=headers or {})
    ).json()
    return sorted(r["episode_id"] for r in body["results"])


async def test_forget_an_agent_and_a_session_as_jobs(api, settings, redis):
    items = [
        episode(f"e{i}", agent_id="a" if i < 4 else "b", session_id="s1" if i % 2 else "s2") for i in range(8)
    ]
    async with consolidating(settings, redis):
        await api.post("/v1/episodes", json={"episodes": items}, params={"wait": 10})
        # a draft of agent a is found too (the index holds it; listing shows only completed ones)
        await api.post("/v1/episodes", json=episode("d0", agent_id="a"), params={"wait": 10})
        resp = await api.delete("/v1/agents/a")
        assert resp.status == 202, await resp.text()
        job = await resp.json()
        assert job["episodes"] == 5 and job["kind"] == "agent" and job["agent_id"] == "a"
        assert job["job"] == f"/v1/forget/{job['job_id']}"

        async def status():
            return await (await api.get(job["job"])).json()

        done = await wait_until(lambda: _done(status), message="the agent's forget")
        assert done["forgotten"] == 5 and done["status"] == "done"
        assert await listed(api) == ["e4", "e5", "e6", "e7"]
        for i in range(4):
            assert (await api.get(f"/v1/episodes/e{i}")).status == 404

        job = await (await api.delete("/v1/sessions/s1")).json()
        assert job["episodes"] == 2 and job["kind"] == "session"  # e5, e7 (e1, e3 went with agent a)
        await wait_until(lambda: _done(lambda: api.get(job["job"])), message="the session's forget")
        assert await listed(api) == ["e4", "e6"]
        # nothing left to forget: a job of zero, done at once
        empty = await (await api.delete("/v1/agents/a")).json()
        assert empty["episodes"] == 0 and empty["status"] == "done"


async def _done(status):
    body = await status()
    if not isinstance(body, dict):
        body = await body.json()
    return body if body.get("status") == "done" else None


async def test_forget_by_ids_reports_unknown_and_already_forgotten(api, settings, redis):
    await api.post("/v1/episodes", json={"episodes": [episode(f"e{i}") for i in range(4)]})
    await drain(settings, redis)
    await api.delete("/v1/episodes/e0")
    await drain(settings, redis)
    await api.post("/v1/episodes", json=episode("late"))  # accepted, not projected yet: still forgettable
    resp = await api.post("/v1/forget", json={"episode_ids": ["e0", "e1", "e2", "nope", "e1", "late"]})
    assert resp.status == 202, await resp.text()
    job = await resp.json()
    assert job["episodes"] == 3 and job["unknown"] == ["nope"] and job["already_forgotten"] == ["e0"]
    assert job["status"] == "pending"
    await drain(settings, redis)
    assert (await (await api.get(job["job"])).json())["status"] == "done"
    assert await listed(api) == ["e3"]
    assert (await api.post("/v1/forget", json={"episode_ids": ["nope"]})).status == 404
    for bad in ({"episode_ids": []}, {"episode_ids": [""]}, {"ids": ["e3"]}, {"episode_ids": ["x"] * 1001}):
        resp = await api.post("/v1/forget", json=bad)
        assert resp.status == 422, bad
    assert (await api.get("/v1/forget/0123")).status == 404


async def test_a_scope_with_nothing_projected_is_a_job_of_zero_not_a_404(api, settings, redis):
    """`DELETE /v1/agents/<unknown>` answers 202, and the OpenAPI document says so instead of a 404. The
    202 is right (docs/api.md, Bulk forget): a scope is not a resource, and a retried forget answers as
    the first one did. The document now agrees, for users too (a forget of a user never looks it up)."""
    doc = await (await api.get("/openapi.json")).json()
    for path in ("/v1/agents/{agent_id}", "/v1/sessions/{session_id}", "/v1/users/{user_id}"):
        assert "404" not in doc["paths"][path]["delete"]["responses"], path
    assert "404" in doc["paths"]["/v1/episodes/{episode_id}"]["delete"]["responses"]
    for path in ("/v1/agents/nobody", "/v1/sessions/nowhere"):
        resp = await api.delete(path)
        assert resp.status == 202, await resp.text()
        job = await resp.json()
        assert (job["episodes"], job["status"]) == (0, "done")
    await api.post("/v1/episodes", json=episode("e0", agent_id="a"))
    await drain(settings, redis)
    first = await (await api.delete("/v1/agents/a")).json()
    await drain(settings, redis)
    retried = await api.delete("/v1/agents/a")  # as after a lost answer
    assert first["episodes"] == 1 and retried.status == 202
    assert (await retried.json())["episodes"] == 0


async def test_a_repeated_id_is_forgotten_once_never_a_404(api, settings, redis):
    """A repeated id must not turn a forget into a 404. Each id counts once, whatever
    it is: held, accepted and in flight, forgotten before, or unknown beside a known one."""
    await api.post("/v1/episodes", json={"episodes": [episode("e0"), episode("e1")]})
    await drain(settings, redis)
    await api.delete("/v1/episodes/e0")
    await drain(settings, redis)
    await api.post("/v1/episodes", json=episode("late"))  # accepted, not projected
    for ids, episodes, unknown, gone in (
        (["e1", "e1"], 1, [], []),
        (["late", "late", "late"], 1, [], []),
        (["e0", "e0"], 0, [], ["e0"]),
        (["e1", "nope", "nope", "e1"], 1, ["nope"], []),
    ):
        resp = await api.post("/v1/forget", json={"episode_ids": ids})
        assert resp.status == 202, (ids, await resp.text())
        job = await resp.json()
        assert (job["episodes"], job["unknown"], job["already_forgotten"]) == (episodes, unknown, gone), ids
        record = await redis.hget(Keys(settings.prefix).forget_job(job["job_id"]), "tombs")
        assert len(record) == 32 * episodes  # one tombstone digest per distinct id
    # unknown ids alone stay the documented 404, repeated or not
    for ids in (["nope"], ["nope", "nope"]):
        resp = await api.post("/v1/forget", json={"episode_ids": ids})
        assert resp.status == 404 and "none of these" in (await resp.json())["detail"]


async def test_a_jobs_status_is_what_the_document_says(api, settings, redis):
    """docs/api.md said `GET /v1/forget/{job_id}` repeats agent_id / session_id / unknown; it never did
    (the job record keeps no ids). The 202 says them once (`ForgetJobStarted`), the status resource
    gives the counts (`ForgetJob`), and the document lists exactly those fields."""
    doc = await (await api.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    status_fields = set(schemas["ForgetJob"]["properties"])
    started_fields = status_fields | set(schemas["ForgetJobStarted"]["properties"])
    await api.post("/v1/episodes", json=episode("e0", agent_id="a", session_id="s"))
    await drain(settings, redis)
    for method, path, body, extra in (
        ("DELETE", "/v1/agents/a", None, {"agent_id"}),
        ("DELETE", "/v1/sessions/s", None, {"session_id"}),
        ("POST", "/v1/forget", {"episode_ids": ["e0", "x"]}, {"unknown", "already_forgotten"}),
    ):
        started = await (await api.request(method, path, json=body)).json()
        assert set(started) == status_fields | extra and set(started) <= started_fields, path
        status = await (await api.get(started["job"])).json()
        assert set(status) == status_fields, (path, status)
        assert {k: status[k] for k in status_fields - {"status", "forgotten"}} == {
            k: started[k] for k in status_fields - {"status", "forgotten"}
        }


async def test_jobs_are_per_tenant_and_hold_no_ids(tenants, settings, redis, prefix):
    for key in (KEY_A, KEY_B):
        await tenants.post("/v1/episodes", json=episode("x", agent_id="bot"), headers=auth(key))
    await drain(settings, redis)
    base = str(tenants.make_url("")).rstrip("/")
    async with AsyncEngram(base, api_key=KEY_A) as memory:
        job = await memory.forget_agent("bot")
        assert job.episodes == 1 and not job.done
        assert (await tenants.get(f"/v1/forget/{job.job_id}", headers=auth(KEY_B))).status == 404
        await drain(settings, redis)
        assert (await memory.forget_job(job.job_id)).done
    assert await listed(tenants, headers=auth(KEY_B)) == ["x"]  # the other tenant's agent "bot" is intact
    record = await redis.hgetall(Keys(prefix).forget_job(job.job_id))
    assert record[b"tombs"] == digest("ns-a", "x").encode()  # digests of the ids, never the ids
    assert b"bot" not in b"".join(record.values())
    assert 0 < await redis.ttl(Keys(prefix).forget_job(job.job_id)) <= 7 * 86400

    def sync():
        with Engram(base, api_key=KEY_B) as m:
            by_session = m.forget_session("none")
            by_ids = m.forget_episodes(["x"])
            return by_session, by_ids

    by_session, by_ids = await asyncio.to_thread(sync)
    assert by_session.episodes == 0 and by_session.done and by_ids.episodes == 1


async def test_the_cli_forgets_an_agent(api, settings, redis):
    from tests.integration.test_query_cli import run

    await api.post("/v1/episodes", json={"episodes": [episode(f"e{i}", agent_id="bot") for i in range(3)]})
    await drain(settings, redis)
    out = await run(api, "forget", "--agent", "bot")
    assert out.exit_code == 0 and "forgetting 3 episodes of the agent" in out.output, out.output
    out = await run(api, "forget", "--agent", "bot", "--user", "u")
    assert out.exit_code == 2
    await drain(settings, redis)
    assert await listed(api) == []
    # --wait waits for the job (`--agent … --wait 5` must not come back at once, the wait unsaid)
    await api.post(
        "/v1/episodes", json={"episodes": [episode(f"s{i}", session_id="run-7") for i in range(2)]}
    )
    await drain(settings, redis)
    late = await run(api, "forget", "--session", "run-7", "--wait", "0.3")  # no consolidator: not done
    assert late.exit_code == 0 and "not yet done after 0.3s" in late.output, late.output
    async with consolidating(settings, redis, "cli-job"):
        out = await run(api, "forget", "--session", "run-7", "--wait", "20")
    assert out.exit_code == 0 and "forgot 2 episodes of the session" in out.output, out.output
    assert "erased from every read" in out.output and await listed(api) == []


async def test_an_agent_or_session_forget_also_erases_episodes_still_in_flight(api, settings, redis):
    """`DELETE /v1/agents/a` right after publishing must not miss the episodes accepted but not yet
    projected, which would then appear after the forget. The forget now records its time first,
    and the projection refuses (and erases) any episode of the agent or session that began before it;
    the agent's episodes published after the call are kept, through a replay too."""
    from services.consolidator.replay import replay
    from shared.embedding import HashingEmbedder

    gone = "the alpaca task"  # the text of the episodes forgotten below, and of no other
    early = [episode("a1", agent_id="a", task=gone), episode("a2", agent_id="a", session_id="s9", task=gone)]
    early += [episode("b1", agent_id="b"), episode("s1", agent_id="c", session_id="s9", task=gone)]
    assert (await api.post("/v1/episodes", json={"episodes": early})).status == 202  # no consolidator yet
    job = await (await api.delete("/v1/agents/a")).json()
    assert job["episodes"] == 0  # none in the index yet
    await (await api.delete("/v1/sessions/s9")).json()
    later = [episode("a3", agent_id="a"), episode("s2", agent_id="c", session_id="s9")]
    assert (await api.post("/v1/episodes", json={"episodes": later})).status == 202
    await drain(settings, redis)
    assert await listed(api) == ["a3", "b1", "s2"]
    for gone in ("a1", "a2", "s1"):
        assert (await api.get(f"/v1/episodes/{gone}")).status == 404
    entries = await streams.read_range(redis, Keys(settings.prefix).stream)
    in_stream = {getattr(decode(e.payload), "episode_id", None) for e in entries}
    assert not in_stream & {"a1", "a2", "s1"}, "their stream entries are deleted too"
    await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert await listed(api) == ["a3", "b1", "s2"]
    assert await leaked_text(redis, settings.prefix, ["alpaca"]) == []


async def test_an_episode_begun_before_its_agents_forget_is_refused_on_the_slow_path(api, settings, redis):
    """Its first event (an action) was recorded before the forget, without a document for the index to
    list; its completion arrives after: the write script (`PROJECT_LUA`) refuses and erases it."""
    import time

    from engram_episodic.events import Action, ActionRecorded, Episode, EpisodeCompleted, Task
    from shared.sdk import EngramClient

    ns = settings.default_namespace
    sdk = EngramClient(redis, namespace=ns, prefix=settings.prefix)
    step = Action(action_type="run", input="make build")
    await sdk.publish([ActionRecorded(namespace=ns, episode_id="z1", occurred_at=time.time(), action=step)])
    await drain(settings, redis)
    assert (await (await api.delete("/v1/agents/a")).json())["episodes"] == 0
    done = Episode(
        episode_id="z1",
        task=Task(description="build"),
        outcome="success",
        agent_id="a",
        completed_at=time.time(),
    )
    await sdk.publish(
        [EpisodeCompleted(namespace=ns, episode_id="z1", occurred_at=time.time(), episode=done)]
    )
    await drain(settings, redis)
    assert (await api.get("/v1/episodes/z1")).status == 404
    assert await redis.exists(Keys(settings.prefix).tombstone(ns, "z1"))


async def test_a_job_is_done_only_once_its_episodes_documents_are_gone(api, settings, redis):
    """A fresh-clone CI run listed an episode of a job already `done`: the consolidator tombstones an
    episode first and deletes its document a few steps later, and the job counted tombstones only. Here
    the first step is taken alone (the tombstone set, the document kept): the job stays pending."""
    await api.post(
        "/v1/episodes", json={"episodes": [episode("j1", agent_id="a"), episode("j2", agent_id="a")]}
    )
    await drain(settings, redis)
    job = await (await api.delete("/v1/agents/a")).json()
    keys = Keys(settings.prefix)
    for eid in ("j1", "j2"):
        await redis.set(keys.tombstone(settings.default_namespace, eid), 1)  # erase_episode's first step
    status = await (await api.get(job["job"])).json()
    assert status["status"] == "pending" and status["forgotten"] == 0, status
    await drain(settings, redis)
    status = await (await api.get(job["job"])).json()
    assert status["status"] == "done" and status["forgotten"] == 2, status
    assert await listed(api) == []
