"""Retention trims only what every group projected; a replay from snapshot + tail rebuilds all."""

from __future__ import annotations

import time

from services.consolidator.replay import replay
from services.consolidator.retention import trim
from shared import streams
from shared.embedding import HashingEmbedder
from shared.keys import Keys
from shared.sdk import EngramClient
from tests.integration.test_consolidator import docs, drain, episode, make_worker  # noqa: F401


async def test_trim_keeps_unprojected_and_replay_rebuilds_from_snapshot(settings, redis):
    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    for i in range(20):
        async with client.episode(task=f"job {i}", user_id=f"u{i % 2}") as ep:
            await ep.action("step", input=f"input {i}")
            await ep.complete("success" if i % 3 else "failure", feedback={"reward": i / 20})
    worker = make_worker(settings, redis)
    await drain(worker)
    projected = await docs(redis, keys, "ns", status=None)
    assert len(projected) == 20
    # 5 more entries delivered to a consumer that never acks: they are not projected yet
    for i in range(5):
        await client.record(episode(f"late{i}"))
    await redis.xreadgroup(settings.consumer_group, "stuck", {keys.stream: ">"}, count=5)
    far_future = time.time() + 10 * 365 * 86400
    removed = await trim(redis, keys, retention_seconds=60, now=far_future)
    assert removed == 60  # 20 episodes x (start, action, completion), all acked
    remaining = await streams.read_range(redis, keys.stream)
    assert len(remaining) == 5
    # the window protects recent acked entries too
    assert await trim(redis, keys, retention_seconds=3600) == 0
    # forget one episode after the trim, then rebuild from snapshot + tail
    forgotten = next(iter(projected))
    await client.forget_episode(forgotten)
    await drain(worker)  # the lease returns the stuck entries to a live worker eventually; drain now:
    worker.settings = settings.with_(lease_ms=10)
    await drain(worker)
    live = await docs(redis, keys, "ns", status=None)
    assert len(live) == 24 and forgotten not in live
    result = await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert result["snapshot_episodes"] == 24
    assert await docs(redis, keys, "ns", status=None) == live


async def test_no_group_means_no_trim(settings, redis):
    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    await client.record(episode("e"))
    assert await trim(redis, keys, retention_seconds=1, now=time.time() + 1e6) == 0
    assert len(await streams.read_range(redis, keys.stream)) == 1


async def test_each_partition_is_trimmed_by_what_its_group_still_needs(settings, redis):
    s = settings.with_(stream_partitions=4)
    keys = s.keys
    namespaces = [f"ns{i}" for i in range(8)]
    assert len({keys.partition(ns) for ns in namespaces}) > 1
    for ns in namespaces:
        client = EngramClient(redis, namespace=ns, prefix=s.prefix, partitions=4)
        for i in range(3):
            await client.record(episode(f"e{i}"))
    worker = make_worker(s, redis)
    await drain(worker)
    # 2 more entries of one namespace delivered to a consumer that never acks: its partition keeps them
    held = keys.stream_of(namespaces[0])
    late = EngramClient(redis, namespace=namespaces[0], prefix=s.prefix, partitions=4)
    for i in range(2):
        await late.record(episode(f"late{i}"))
    await redis.xreadgroup(s.consumer_group, "stuck", {held: ">"}, count=2)
    removed = await trim(redis, keys, retention_seconds=60, now=time.time() + 10 * 365 * 86400)
    assert removed == 3 * len(namespaces)
    assert {stream: await redis.xlen(stream) for stream in keys.streams} == {
        stream: 2 if stream == held else 0 for stream in keys.streams
    }
    # a replay rebuilds every namespace from the snapshots and what the partitions still hold
    worker.settings = s.with_(lease_ms=10)
    await drain(worker)
    result = await replay(s, redis, HashingEmbedder(s.embed_dim))
    assert result["snapshot_episodes"] == 3 * len(namespaces) + 2
    for ns in namespaces:
        assert len(await docs(redis, keys, ns, status=None)) == (5 if ns == namespaces[0] else 3)
