"""Stream partitions on the suite's real 3-primary cluster (ingest spread over the shards):
entries of many namespaces land in partitions on every primary and are projected once; two workers,
one added mid-stream and one killed with SIGKILL, lose and double nothing; dead letters go back to
their partition; sealed publishing works and a plaintext publisher is refused; forget, erasure and
replay act on every partition; another partition count is refused at start."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from redis.crc import key_slot
from redis.exceptions import ResponseError

from engram_episodic.errors import ConfigError
from services.consolidator import erasure
from services.consolidator.deadletters import list_dead_letters, redrive
from services.consolidator.replay import replay
from services.query.app import make_app
from shared import partitions, streams
from shared.codec import payload_ref
from shared.crypto import MasterKey
from shared.embedding import HashingEmbedder
from shared.index import is_missing_index
from shared.keyring import KeyRing
from shared.keys import Keys
from shared.sdk import EngramClient
from tests.helpers import wait_until
from tests.integration.test_cluster_stack import in_index
from tests.integration.test_consolidator import drain, make_worker
from tests.integration.test_facts import ep
from tests.integration.test_worker_process import spawn_worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

NAMESPACES = [f"tenant-{i}" for i in range(24)]


def primary(redis, key: str) -> str:
    return redis.get_node_from_key(key).name


async def lengths(redis, keys: Keys) -> list[int]:
    return [int(await redis.xlen(s)) for s in keys.streams]


async def group_state(redis, keys: Keys, group: str) -> list[dict[str, int]]:
    return await streams.Partitions(redis, keys.streams, group).each()


async def test_ingest_spreads_over_every_primary_and_is_projected_once(
    cluster_settings, cluster_redis, aiohttp_client
):
    s, redis = cluster_settings, cluster_redis
    keys = s.keys
    await redis.initialize()
    assert keys.partitions == 16
    for n, ns in enumerate(NAMESPACES):
        client = EngramClient(redis, namespace=ns, prefix=s.prefix)  # P: the cluster's default, recorded
        for i in range(3):
            await client.record(ep("mig", i, user=f"user-{(n + i) % 2}"))
    assert await partitions.recorded(redis, keys) == 16
    per_partition = await lengths(redis, keys)
    assert sum(per_partition) == 3 * len(NAMESPACES)
    for ns in NAMESPACES:  # each namespace's events are all in its own partition
        assert await redis.xlen(keys.stream_of(ns)) >= 3
    used = [keys.streams[i] for i, n in enumerate(per_partition) if n]
    assert len(used) >= 8  # 24 namespaces hash to many of the 16 partitions
    assert len({primary(redis, stream) for stream in used}) == 3  # and those are on all 3 primaries

    worker = make_worker(s, redis)
    await drain(worker)
    ok = worker.metrics.registry.get_sample_value(
        "engram_events_processed_total", {"type": "EpisodeCompleted", "result": "ok"}
    )
    assert ok == 3 * len(NAMESPACES)  # each entry projected once: no partition read twice
    for ns in NAMESPACES:
        assert await in_index(redis, keys, ns) == 3
    assert all(
        row == {"pending": 0, "lag": 0, "consumers": 1}
        for row in await group_state(redis, keys, "consolidator")
    )
    await worker.refresh_lag()
    sample = worker.metrics.registry.get_sample_value
    assert (
        sample("engram_consumer_lag") == 0
        and sample("engram_consumer_partition_lag", {"partition": "15"}) == 0
    )

    # recall through the query service finds them, namespace by namespace
    api = s.with_(api_keys={f"key-{ns}": ns for ns in NAMESPACES[:4]})
    http = await aiohttp_client(make_app(api, redis=redis, embedder=HashingEmbedder(s.embed_dim)))
    for ns in NAMESPACES[:4]:
        reply = await http.post(
            "/v1/recall",
            json={"query": "migrate the orders table schema", "top_k": 10},
            headers={"Authorization": f"Bearer key-{ns}"},
        )
        assert reply.status == 200, await reply.text()
        assert sorted(h["episode"]["episode_id"] for h in (await reply.json())["results"]) == [
            "mig-0",
            "mig-1",
            "mig-2",
        ]
        # read-your-writes: accepted and not yet projected is `pending`, found in the namespace's partition
        reply = await http.post(
            "/v1/episodes", json=ep("mig", 3), headers={"Authorization": f"Bearer key-{ns}"}
        )
        assert reply.status == 202, await reply.text()
        got = await http.get("/v1/episodes/mig-3", headers={"Authorization": f"Bearer key-{ns}"})
        assert (await got.json())["status"] == "pending"
    # ?wait= sees its entries acked by the group of the namespace's partition, with a worker running
    stop = asyncio.Event()
    running = asyncio.create_task(make_worker(s, redis, name="w2").run(stop))
    try:
        reply = await http.post(
            "/v1/episodes?wait=30",
            json=ep("mig", 4),
            headers={"Authorization": f"Bearer key-{NAMESPACES[0]}"},
        )
        assert reply.status == 202 and (await reply.json())["projected"] is True, await reply.text()
    finally:
        stop.set()
        await running
    await drain(worker)
    for ns in NAMESPACES[:4]:
        got = await http.get("/v1/episodes/mig-3", headers={"Authorization": f"Bearer key-{ns}"})
        assert (await got.json())["status"] == "completed"
        assert await in_index(redis, keys, ns) == (5 if ns == NAMESPACES[0] else 4)

    # a dead letter records its partition and is re-driven into it
    bad = NAMESPACES[5]
    await EngramClient(redis, namespace=bad, prefix=s.prefix).record(ep("mig", 9) | {"vector": [0.5] * 3})
    await drain(worker)
    (letter,) = await list_dead_letters(redis, keys)
    assert letter.source == keys.stream_of(bad)
    before = await redis.xlen(keys.stream_of(bad))
    assert await redrive(redis, keys, await list_dead_letters(redis, keys)) == 1
    assert await redis.xlen(keys.stream_of(bad)) == before  # the original deleted, the copy back in place
    assert not await list_dead_letters(redis, keys)

    # forgetting deletes from the namespace's partition; erasure compacts every partition; replay reads all
    target = NAMESPACES[7]
    client = EngramClient(redis, namespace=target, prefix=s.prefix)
    stream = keys.stream_of(target)
    before = await redis.xlen(stream)
    await client.forget_episode("mig-0")
    await client.forget_user("user-1")  # 7 + i odd: mig-0 and mig-2
    await drain(worker)
    assert await in_index(redis, keys, target) == 1  # mig-1 only
    assert await redis.xlen(stream) < before + 2  # the forgotten episodes' entries left the partition
    report = await erasure.run(redis, keys)
    assert len(report["compaction"]["partitions"]) == 16
    assert report["compaction"]["compacted"]
    assert report["aof_rewritten"]  # on every primary (the session cluster's nodes run with AOF on)
    out = await replay(s, redis, HashingEmbedder(s.embed_dim))
    assert out["generation"] == 2
    assert await in_index(redis, keys, target) == 1
    for ns in NAMESPACES[8:]:
        assert await in_index(redis, keys, ns) == 3


async def test_another_partition_count_is_refused_at_start(cluster_settings, cluster_redis, aiohttp_client):
    s, redis = cluster_settings, cluster_redis
    await EngramClient(redis, namespace="a", prefix=s.prefix).record(ep("mig", 0))
    assert await partitions.recorded(redis, s.keys) == 16
    with pytest.raises(ConfigError, match="ENGRAM_STREAM_PARTITIONS=8 but this deployment .* with 16"):
        await make_worker(s.with_(stream_partitions=8), redis).setup()
    with pytest.raises(ConfigError, match="ENGRAM_STREAM_PARTITIONS=8 but"):  # the query service's start
        await aiohttp_client(
            make_app(s.with_(stream_partitions=8), redis=redis, embedder=HashingEmbedder(s.embed_dim))
        )
    with pytest.raises(ConfigError, match="started with 16 stream partitions"):
        await EngramClient(redis, namespace="a", prefix=s.prefix, partitions=4).record(ep("mig", 1))
    # a deployment from before the layout record (and partitions): refused, whatever P is set
    old = cluster_settings.with_(prefix=s.prefix + "old:")
    await redis.hset(Keys(old.prefix).meta, "generation", 1)
    with pytest.raises(ConfigError, match="was written by an older Engram layout"):
        await make_worker(old.with_(stream_partitions=1), redis).setup()
    async for key in redis.scan_iter(match=f"{old.prefix}*"):
        await redis.unlink(key)


async def test_sealed_publishing_on_a_cluster_and_a_plaintext_publisher_is_refused(
    cluster_settings, cluster_redis
):
    master_key = b"\x07" * 32
    s, redis = cluster_settings.with_(master_key=master_key), cluster_redis
    keys = s.keys
    names = NAMESPACES[:9]
    for ns in names:
        sealed = EngramClient(redis, namespace=ns, prefix=s.prefix, master_key=master_key)
        for i in range(2):
            await sealed.record(ep("mig", i, user=f"user-{i}"))
    assert all([await redis.exists(keys.encrypted_marker(i)) for i in range(keys.partitions)])
    rows = [row for stream in keys.streams for row in await redis.xrange(stream)]
    assert len(rows) == 2 * len(names) and all(payload_ref(f[b"e"]) is not None for _, f in rows)
    # every user's data key is in the slot of its namespace's partition (one script: checks and XADD)
    deployment = await KeyRing(keys, MasterKey(master_key)).load(redis)
    for ns in names:
        for user in ("user-0", "user-1"):
            name = keys.data_key(deployment.ref(ns, user), ns)
            assert await redis.exists(name)
            assert key_slot(name.encode()) == key_slot(keys.stream_of(ns).encode())
    worker = make_worker(s, redis)
    await drain(worker)
    for ns in names:
        assert await in_index(redis, keys, ns) == 2

    # a publisher without the master key is refused atomically, in its partition's script
    before = await lengths(redis, keys)
    for ns in names:
        with pytest.raises(ConfigError, match="encrypts its stream"):
            await EngramClient(redis, namespace=ns, prefix=s.prefix).record(ep("mig", 5))
    assert await lengths(redis, keys) == before

    # forgetting a user shreds their data key in the partition's slot
    ns = names[0]
    ring = worker.keyring
    assert ring is not None
    gone = keys.data_key((await ring.load(redis)).ref(ns, "user-1"), ns)
    assert await redis.exists(gone)
    await EngramClient(redis, namespace=ns, prefix=s.prefix, master_key=master_key).forget_user("user-1")
    await drain(worker)
    assert not await redis.exists(gone)
    assert await in_index(redis, keys, ns) == 1


async def _all_done(redis, keys: Keys, namespaces: list[str], n: int, group: str) -> bool:
    for ns in namespaces:
        if await _indexed(redis, keys, ns) != n:
            return False
    return all(row["pending"] == 0 and row["lag"] == 0 for row in await group_state(redis, keys, group))


async def test_a_worker_added_and_one_killed_lose_and_double_nothing_on_a_cluster(
    cluster_settings, cluster_redis
):
    # no fact runs: their snapshots are stream entries too, and the end counts the episodes' entries
    s = cluster_settings.with_(
        batch_size=100, lease_ms=1500, facts_every=1_000_000, facts_importance_threshold=1e9
    )
    redis = cluster_redis
    keys = s.keys
    names = NAMESPACES[:8]
    per_ns = 1000  # enough that the first worker cannot drain every partition before the second joins
    for ns in names:
        client = EngramClient(redis, namespace=ns, prefix=s.prefix)
        for start in range(0, per_ns, 100):
            batch = [ep("ui", i) | {"episode_id": f"e{i}"} for i in range(start, start + 100)]
            await client.publish([client_event(ns, e) for e in batch])
    total = len(names) * per_ns
    assert sum(await lengths(redis, keys)) == total

    doomed = spawn_worker(
        s,
        "doomed",
        ENGRAM_LEASE_MS="1500",
    )
    added = make_worker(s, redis, name="added")
    stop = asyncio.Event()
    run = None
    try:
        await wait_until(
            lambda: _indexed_total(redis, keys, names, at_least=1),
            timeout=90,
            message="the first worker's progress",
        )
        run = asyncio.create_task(added.run(stop))  # a worker joins mid-stream
        await wait_until(lambda: added.processed > 0, timeout=60, message="the added worker's progress")
    finally:
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        doomed.stderr.close()
    state = await group_state(redis, keys, s.consumer_group)
    assert sum(r["pending"] + r["lag"] for r in state) > 0, "the kill came too late to test anything"
    try:
        await wait_until(
            lambda: _all_done(redis, keys, names, per_ns, s.consumer_group),
            timeout=120,
            message=f"{total} episodes indexed, nothing pending",
        )
    finally:
        stop.set()
        if run is not None:
            await run
    for ns in names:  # none lost, none doubled (one document per episode, one entry per event)
        assert await in_index(redis, keys, ns) == per_ns
    assert sum(await lengths(redis, keys)) == total
    assert not await list_dead_letters(redis, keys)


async def _indexed(redis, keys: Keys, ns: str) -> int:
    """`in_index`, 0 while the namespace's index does not exist yet (made with its first document)."""
    try:
        return await in_index(redis, keys, ns)
    except ResponseError as exc:
        if not is_missing_index(exc):
            raise
        return 0


async def _indexed_total(redis, keys: Keys, names: list[str], *, at_least: int) -> bool:
    return sum([await _indexed(redis, keys, ns) for ns in names]) >= at_least


def client_event(ns: str, data: dict):
    from engram_episodic.drafts import finished_episode
    from engram_episodic.events import EpisodeCompleted

    episode = finished_episode(data)
    return EpisodeCompleted(
        namespace=ns, episode_id=episode.episode_id, occurred_at=time.time(), episode=episode
    )


async def test_each_partition_is_read_on_its_primary_without_asking_a_node_for_its_keys(
    cluster_settings, cluster_redis
):
    """XREADGROUP names its keys after STREAMS (movable keys): routed by redis-py, every call first
    asked a node `COMMAND GETKEYS` (~650/s on one primary beside an idle worker). Each partition's
    group read goes straight to the primary owning it, and no node is asked."""
    redis, keys = cluster_redis, cluster_settings.keys
    groups = [streams.StreamGroup(redis, stream, "probe") for stream in keys.streams]
    for group in groups:
        await group.ensure()
        await redis.xadd(group.stream, {"n": group.stream})
    await redis.initialize()

    async def calls(command: str) -> dict[str, int]:
        stats = {}
        for node in redis.get_primaries():
            info = await redis.info("commandstats", target_nodes=node)
            stats[node.name] = int(info.get(f"cmdstat_{command}", {}).get("calls", 0))
        return stats

    getkeys, reads = await calls("command|getkeys"), await calls("xreadgroup")
    for group in groups:
        (entry,) = await group.read_new("c", count=10, block_ms=None)
        assert entry.stream == group.stream
    assert await calls("command|getkeys") == getkeys
    after = await calls("xreadgroup")
    owned = {name: [primary(redis, s) for s in keys.streams].count(name) for name in after}
    assert {name: after[name] - reads[name] for name in after} == owned
