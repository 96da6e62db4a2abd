"""End to end: HTTP ingest → stream → consolidator projection → HTTP recall, GET, skills, forget."""

from __future__ import annotations

import asyncio
import contextlib

from services.consolidator.worker import Worker
from shared.embedding import HashingEmbedder
from tests.integration.test_query_support import KEY_A, KEY_B, auth, episode, ids

pytest_plugins = ["tests.integration.test_query_support"]


@contextlib.asynccontextmanager
async def consolidating(settings, redis, name: str = "bg"):
    """A consolidator projecting in the background of the test's loop (as the stack's would) until the
    block ends; yields the worker."""
    worker = Worker(settings, redis, HashingEmbedder(settings.embed_dim), name=name)
    await worker.setup()
    stop = asyncio.Event()

    async def run() -> None:
        while not stop.is_set():
            await worker.turn()  # an idle turn blocks in XREADGROUP for Settings.block_ms

    task = asyncio.create_task(run())
    try:
        yield worker
    finally:
        stop.set()
        await task


async def drain(settings, redis) -> None:
    worker = Worker(settings, redis, HashingEmbedder(settings.embed_dim), name="e2e")
    await worker.setup()
    for _ in range(100):
        if not await worker.turn():
            return
    raise AssertionError("the stream never drained")


async def test_ingest_project_recall_forget_across_tenants(tenants, settings, redis):
    batch = {
        "episodes": [
            episode(
                f"e{i}",
                task=f"renew the tls certificate {i}",
                user_id=f"u{i % 2}",
                category="ops",
                reward=0.5 + i / 10,
            )
            for i in range(4)
        ]
    }
    await asyncio.gather(*(tenants.post("/v1/episodes", json=batch, headers=auth(k)) for k in (KEY_A, KEY_B)))
    await tenants.post("/v1/episodes", json=batch["episodes"][0], headers=auth(KEY_A))  # C01: a client retry
    await drain(settings, redis)

    async def recall(key, **body):
        resp = await tenants.post(
            "/v1/recall", json={"query": "renew the tls certificate", "top_k": 10, **body}, headers=auth(key)
        )
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


async def test_delete_forgets_an_episode_held_only_by_a_dead_letter_or_stored_events(api, settings, redis):
    """DELETE /v1/episodes/{id} used to need a document: an episode whose only event was dead-lettered,
    or that has only actions so far, could not be forgotten over HTTP. An id the namespace holds
    nothing of is still a 404."""
    from shared import streams as stream_commands
    from shared.keys import Keys

    keys = Keys(settings.prefix)
    bad = episode("dl-only", task="rotate the SECRET-D keys")
    bad["vector"] = [0.5] * 3  # the wrong dimension: dead-lettered by the worker
    assert (await api.post("/v1/episodes", json=bad)).status == 422  # the service refuses it itself...
    from engram_episodic.events import EpisodeCompleted
    from engram_episodic.validation import parse_episode
    from shared.codec import encode

    event = EpisodeCompleted(
        namespace="default",
        episode_id="dl-only",
        occurred_at=1.0,
        episode=parse_episode({**bad, "completed_at": 1.0}),
    )
    await stream_commands.publish(redis, keys.stream, [encode(event)])  # ...another client does not
    await drain(settings, redis)
    missing = await api.get("/v1/episodes/dl-only")  # a 404 that says where the episode went
    assert missing.status == 404 and "dead-lettered" in (await missing.json())["detail"]
    assert "dead-lettered" not in (await (await api.get("/v1/episodes/never-seen")).json())["detail"]
    assert (await api.delete("/v1/episodes/dl-only")).status == 202
    await drain(settings, redis)
    for stream in (keys.stream, keys.dead_letters):
        assert not [f for _sid, f in await redis.xrange(stream) if any(b"SECRET-D" in v for v in f.values())]
    assert (await api.delete("/v1/episodes/never-seen")).status == 404
    from engram_episodic.events import Action, ActionRecorded

    action = ActionRecorded(
        namespace="default",
        episode_id="act-only",
        occurred_at=2.0,
        action=Action(action_type="probe", input="SECRET-A"),
    )
    await stream_commands.publish(redis, keys.stream, [encode(action)])
    await drain(settings, redis)
    assert (await api.delete("/v1/episodes/act-only")).status == 202
    before = await redis.xlen(keys.stream)
    again = await api.delete("/v1/episodes/dl-only")  # forgotten: a repeat is the same forget, no new event
    assert again.status == 202 and (await again.json())["already_forgotten"] is True
    assert await redis.xlen(keys.stream) == before


async def test_an_episode_of_more_actions_than_one_event_carries_completes_and_reads_back(
    api, settings, redis
):
    """MAX_ACTIONS bounds one event, not an episode: an SDK episode of
    1,001 actions completes (the completion carries the last 1,000; the rest were published one by
    one), is projected whole, and GET and recall read it (the stored document was a 500)."""
    from engram_episodic.validation import MAX_ACTIONS
    from shared.sdk import EngramClient

    client = EngramClient(redis, namespace="default", prefix=settings.prefix)
    async with client.episode(task="walk the long corridor", episode_id="long-run") as ep:
        for i in range(MAX_ACTIONS + 1):
            await ep.action("step", input=f"door {i}")
        done = await ep.complete("success", solution="reached the end")
    assert len(done.actions) == MAX_ACTIONS + 1
    await drain(settings, redis)
    resp = await api.get("/v1/episodes/long-run")
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["episode"]["outcome"] == "success" and len(body["episode"]["actions"]) == MAX_ACTIONS + 1
    resp = await api.post("/v1/recall", json={"query": "walk the long corridor", "top_k": 1})
    assert resp.status == 200 and ids(await resp.json()) == ["long-run"]
