"""A deployment of the layout before hash tags moves to the cluster-ready layout by `replay`.

The old layout is made from a current deployment by renaming every tagged key to its legacy name
(`LegacyKeys`: the same digests without the `{tag}:` part) and removing the generation's layout field,
which is exactly what an older build left behind. Then: the worker refuses to start on it and says to
replay; the replay rebuilds everything in the new layout; forgotten episodes and users stay forgotten
through their legacy tombstones; dead letters written before are still reached by a forget.
"""

from __future__ import annotations

import re
import time

import pytest

from engram_episodic.events import EpisodeCompleted
from services.consolidator.deadletters import list_dead_letters
from services.consolidator.replay import replay
from shared.embedding import HashingEmbedder
from shared.index import Scope, count
from shared.keys import Keys, LegacyKeys
from shared.legacy import LegacyLayout
from shared.sdk import EngramClient
from shared.tags import BLAKE2B
from tests.integration.test_consolidator import drain, make_worker


def episode(eid: str, user: str = "alice", **kw) -> dict:
    return {
        "episode_id": eid,
        "task": {"description": f"task {eid}"},
        "outcome": "success",
        "user_id": user,
    } | kw


async def to_legacy_layout(redis, keys: Keys) -> int:
    """Rename every tagged key of `keys.prefix` to its legacy name; returns how many."""
    tagged = re.compile(rb"^(" + re.escape(keys.prefix.encode()) + rb"[^{]*?)\{[0-9a-f]{12}\}:(.*)$")
    renamed = 0
    async for key in redis.scan_iter(match=f"{keys.prefix}*", count=1000):
        m = tagged.match(key)
        if m is None:
            continue
        if m.group(1).endswith((b"trigger:", b"factsrecent:", b"lock:consolidate:")):
            await redis.unlink(key)  # transient: an older build's would simply be lost
            continue
        await redis.rename(key, m.group(1) + m.group(2))
        renamed += 1
    await redis.hdel(keys.meta, "g1:layout")
    return renamed


async def test_replay_migrates_a_legacy_layout_and_keeps_everything_forgotten(settings, redis):
    keys, legacy = Keys(settings.prefix), LegacyKeys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    for i in range(6):
        await client.record(episode(f"kept-{i}"))
    await client.record(episode("gone"))
    await client.record(episode("bob-old", user="bob"))
    await client.record(episode("dead", user="carol", vector=[0.5] * 3))  # wrong dimension: dead-lettered
    worker = make_worker(settings, redis)
    await drain(worker)
    await client.forget_episode("gone")
    await client.forget_user("bob")
    await drain(worker)
    forgot_bob = time.time()
    assert len(await list_dead_letters(redis, keys)) == 1
    # retention trimmed the projected entries, the forgets with them: only the tombstones remember
    await redis.xtrim(keys.stream, maxlen=0)

    assert await to_legacy_layout(redis, keys) > 8
    assert await redis.exists(legacy.tombstone("ns", "gone"), legacy.user_tombstone("ns", "bob")) == 2
    with pytest.raises(LegacyLayout, match="services.consolidator replay"):
        await make_worker(settings, redis, name="w2").setup()

    result = await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert result["generation"] == 2 and result["snapshot_episodes"] == 6
    assert await count(redis, keys.episode_index_alias, Scope(namespace="ns", tags=BLAKE2B)) == 6
    assert (
        await redis.exists(keys.episode_doc(2, "ns", "kept-0"), keys.episode_events(2, "ns", "kept-0")) == 2
    )
    assert not [k async for k in redis.scan_iter(match=f"{keys.gen_prefix(1)}*")]

    # a late re-publish of the forgotten episode, and an old episode of the forgotten user, stay out
    worker = make_worker(settings, redis, name="w3")
    await client.record(episode("gone"))
    await client.publish(
        [
            EpisodeCompleted(
                namespace="ns",
                episode_id="bob-older",
                occurred_at=forgot_bob - 3600,
                episode=client_episode("bob-older", "bob"),
            )
        ]
    )
    await client.record(episode("kept-new"))
    await drain(worker)
    assert await count(redis, keys.episode_index_alias, Scope(namespace="ns", tags=BLAKE2B)) == 7
    assert not await redis.exists(keys.episode_doc(2, "ns", "gone"), keys.episode_doc(2, "ns", "bob-older"))

    # the dead letter written before the migration goes with its user's forget
    await client.forget_user("carol")
    await drain(worker)
    assert await list_dead_letters(redis, keys) == []


def client_episode(eid: str, user: str):
    from engram_episodic.validation import parse_episode

    return parse_episode(episode(eid, user=user))
