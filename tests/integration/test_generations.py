"""Keys exist only in the live generation and the one a replay is building (`shared.generations`).

A write into a generation that a replay swapped out and dropped meanwhile, and the partial generation
of an interrupted or killed replay, held text that no forget reached. Each test here drives one such
interleaving deterministically (a write paused on an `asyncio.Event` while a replay runs, a replay
paused mid-way) and ends with the key-leak check: no key under the test's prefix, in any generation,
still holds the forgotten text.
"""

from __future__ import annotations

import asyncio

import pytest

from engram_episodic.errors import Conflict
from services.consolidator import erasure
from services.consolidator import facts as facts_module
from services.consolidator import replay as replay_module
from services.consolidator.facts import Consolidator
from services.consolidator.replay import replay
from shared import generations
from shared.embedding import HashingEmbedder
from shared.facts import FactScope
from shared.generations import StaleGeneration
from shared.index import current_generation
from shared.keys import Keys
from shared.sdk import EngramClient
from tests.helpers import leaked_text, wait_until
from tests.integration.test_consolidator import docs, drain, episode, make_worker
from tests.integration.test_facts import planted, publish


class GatedEmbedder(HashingEmbedder):
    """Embeds only once `gate` is set (its first `free` calls pass); `reached` is set when a call is
    waiting for it."""

    def __init__(self, dim: int, free: int = 0):
        super().__init__(dim)
        self.reached = asyncio.Event()
        self.gate = asyncio.Event()
        self.free = free

    async def embed(self, texts):
        if self.free:
            self.free -= 1
        else:
            self.reached.set()
            await self.gate.wait()
        return await super().embed(texts)


async def generation_keys(redis, keys: Keys, gen: int) -> list[bytes]:
    return [k async for k in redis.scan_iter(match=f"{keys.gen_prefix(gen)}*", count=1000)]


async def test_a_batch_projected_into_a_generation_swapped_out_meanwhile_leaves_nothing_in_it(
    settings, redis
):
    keys = settings.keys
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    await client.record(episode("e1"))
    await drain(make_worker(settings, redis))
    await client.record(
        episode("late", task={"description": "rotate the zebra credentials", "category": "ops"})
    )
    gated = GatedEmbedder(settings.embed_dim)
    worker = make_worker(settings, redis, name="w2")
    worker.embedder = gated
    await worker.setup()
    assert worker.projector is not None and worker.projector.gen == 1
    turn = asyncio.create_task(worker.turn())
    await asyncio.wait_for(gated.reached.wait(), 10)  # read generation 1, about to write into it
    out = await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert out["generation"] == 2 and await generation_keys(redis, keys, 1) == []
    gated.gate.set()
    assert await asyncio.wait_for(turn, 10) == 1
    assert await generation_keys(redis, keys, 1) == []  # swept by the writer, projected again into 2
    assert "late" in await docs(redis, keys, "ns")
    await client.forget_episode("late")
    await drain(make_worker(settings, redis, name="w3"))
    assert await leaked_text(redis, settings.prefix, ["zebra"]) == []


async def test_a_facts_run_that_read_a_generation_before_a_replay_writes_nothing_into_it(
    settings, redis, monkeypatch
):
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    keys = s.keys
    await publish(s, redis, planted())
    await drain(make_worker(s, redis))
    cons = Consolidator(s, redis, s.embed_dim)
    reached, gate = asyncio.Event(), asyncio.Event()
    publish_snapshot = Consolidator.publish_snapshot

    async def paused(self, event):
        reached.set()
        await gate.wait()
        return await publish_snapshot(self, event)

    monkeypatch.setattr(Consolidator, "publish_snapshot", paused)
    run = asyncio.create_task(cons.consolidate(FactScope("ns")))
    await asyncio.wait_for(reached.wait(), 10)  # planned from generation 1, about to write there
    await replay(s, redis, HashingEmbedder(s.embed_dim))
    gate.set()
    assert (await asyncio.wait_for(run, 10)).status == "published"
    assert await generation_keys(redis, keys, 1) == []
    await drain(make_worker(s, redis, name="w2"))  # the published snapshot reaches generation 2
    assert [k for k in await generation_keys(redis, keys, 2) if b":fact:" in k]


async def test_a_stale_write_of_facts_is_swept_and_refused(settings, redis, monkeypatch):
    """The same, driven at the write itself: a snapshot applied with a generation number that a replay
    has since swapped out and dropped."""
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    await publish(s, redis, planted())
    await drain(make_worker(s, redis))
    await replay(s, redis, HashingEmbedder(s.embed_dim))
    cons = Consolidator(s, redis, s.embed_dim)

    async def stale(_r, _keys):
        return 1

    monkeypatch.setattr(facts_module, "current_generation", stale)
    result = await cons.consolidate(FactScope("ns"))
    monkeypatch.undo()
    assert result.status == "published"
    assert await generation_keys(redis, s.keys, 1) == []
    with pytest.raises(StaleGeneration):
        await generations.check_writable(redis, s.keys, 1)


async def _paused_replay(settings, redis, free: int = 0):
    """A replay paused in its snapshot phase (generation 2 holds copies of the episodes' events), or
    with `free=1` in its stream phase (and the facts of generation 1 imported)."""
    gated = GatedEmbedder(settings.embed_dim, free)
    task = asyncio.create_task(replay(settings, redis, gated))
    await asyncio.wait_for(gated.reached.wait(), 10)
    return task, gated


async def _seed(settings, redis) -> EngramClient:
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    await client.record(episode("keep"))
    await client.record(
        episode(
            "gone",
            user_id="u-gone",
            task={"description": "reset the walrus password", "category": "ops"},
            solution="walrus solved",
        )
    )
    await drain(make_worker(settings, redis))
    return client


async def test_a_forget_reaches_the_generation_a_replay_is_building_and_a_cancel_drops_it(settings, redis):
    keys = settings.keys
    client = await _seed(settings, redis)
    task, _gated = await _paused_replay(settings, redis)
    assert await generations.writable(redis, keys) == (1, 2)
    assert await leaked_text(redis, settings.prefix, ["walrus"])  # the building copy holds it, too
    await client.forget_user("u-gone")
    await drain(make_worker(settings, redis, name="w2"))
    assert await leaked_text(redis, settings.prefix, ["walrus"]) == []
    # the applied forget stays in the stream while the replay may still have to read it
    assert await erasure.drop_applied_forgets(redis, keys) == 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await generation_keys(redis, keys, 2) == []
    assert await generations.writable(redis, keys) == (1, None)
    assert await erasure.drop_applied_forgets(redis, keys) == 1
    assert set(await docs(redis, keys, "ns")) == {"keep"}


async def test_a_forget_rebuilds_no_fact_of_the_building_generation_that_names_it(settings, redis):
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    client = await publish(s, redis, planted())
    await drain(make_worker(s, redis))
    assert (await Consolidator(s, redis, s.embed_dim).consolidate(FactScope("ns"))).status == "published"
    task, _gated = await _paused_replay(s, redis, free=1)
    assert [k for k in await generation_keys(redis, s.keys, 2) if b":fact:" in k]
    words = ["alembic", "markdown", "react"]
    assert await leaked_text(redis, s.prefix, words)
    await client.forget_user("user-b")
    await drain(make_worker(s, redis, name="w2"))
    assert await leaked_text(redis, s.prefix, words) == []
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_killed_replays_generation_is_swept_once_its_lease_runs_out(settings, redis, monkeypatch):
    keys = settings.keys
    await _seed(settings, redis)

    async def dead(_redis, _keys, _gen):  # a replay killed outright renews nothing
        return None

    monkeypatch.setattr(replay_module, "_heartbeat", dead)
    task, gated = await _paused_replay(settings, redis)
    assert await generation_keys(redis, keys, 2)
    worker = make_worker(settings, redis, name="w2")
    await worker.setup()
    await worker._sweep()  # the lease is fresh: generation 2 is kept
    assert await generation_keys(redis, keys, 2)
    monkeypatch.setattr(generations, "BUILD_LEASE_MS", 0)
    await worker._sweep()
    assert await generation_keys(redis, keys, 2) == []
    assert await redis.hget(keys.meta, erasure.PENDING_FIELD) is not None  # the AOF's copy goes next
    assert await generations.writable(redis, keys) == (1, None)
    gated.gate.set()  # the "dead" replay wakes up: refused, and leaves nothing
    with pytest.raises(Conflict, match="replay abandoned: generation 2 had no heartbeat"):
        await asyncio.wait_for(task, 10)
    await wait_until(lambda: _no_keys(redis, keys, 2), message="no key of generation 2")
    assert await current_generation(redis, keys) == 1
    assert set(await docs(redis, keys, "ns")) == {"keep", "gone"}


async def _no_keys(redis, keys, gen) -> bool:
    return await generation_keys(redis, keys, gen) == []


async def test_a_replay_refuses_to_start_beside_a_running_one(settings, redis):
    await _seed(settings, redis)
    task, gated = await _paused_replay(settings, redis)
    with pytest.raises(generations.ReplayRunning, match="building generation 2"):
        await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    gated.gate.set()
    out = await asyncio.wait_for(task, 20)
    assert out["generation"] == 2 and await generation_keys(redis, settings.keys, 1) == []


async def test_a_replay_after_an_interrupted_one_takes_a_new_number_and_sweeps_the_old(
    settings, redis, monkeypatch
):
    keys = settings.keys
    await _seed(settings, redis)

    async def dead(_redis, _keys, _gen):
        return None

    monkeypatch.setattr(replay_module, "_heartbeat", dead)
    monkeypatch.setattr(replay_module, "_abandon", dead)  # killed: nothing cleans up
    task, _gated = await _paused_replay(settings, redis)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await generation_keys(redis, keys, 2)
    monkeypatch.undo()  # the next replay runs as it does
    monkeypatch.setattr(generations, "BUILD_LEASE_MS", 0)  # the killed one's lease has run out
    out = await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert out["generation"] == 3
    assert await generation_keys(redis, keys, 2) == [] and await generation_keys(redis, keys, 1) == []
    assert set(await docs(redis, keys, "ns")) == {"keep", "gone"}
