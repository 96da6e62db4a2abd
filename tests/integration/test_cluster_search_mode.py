"""`ENGRAM_CLUSTER_SEARCH=coordinator` on a cluster whose search module has none (the embedded
RediSearch 2.10; it used to end in a ClusterCrossSlotError traceback at the alias update and a stray
index on one node) is refused with a ConfigError naming the variable before anything is created."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio.cluster import RedisCluster

from engram_episodic.errors import ConfigError
from shared import cluster
from shared.redis_conn import connect
from tests.integration.test_consolidator import make_worker


async def test_a_coordinator_is_refused_on_a_shard_local_cluster(
    cluster_url, cluster_settings, cluster_redis
):
    await cluster.check_search(cluster_redis)  # shard mode: nothing to check
    s = cluster_settings.with_(cluster_search="coordinator")
    redis = connect(cluster_url, prefix=s.prefix, cluster_search="coordinator")
    try:
        with pytest.raises(
            ConfigError, match="ENGRAM_CLUSTER_SEARCH=coordinator.*ENGRAM_CLUSTER_SEARCH=shard"
        ):
            await make_worker(s, redis).setup()
        await redis.initialize()
        for node in redis.get_primaries():  # nothing was created: no index, no consumer group
            names = await redis.execute_command("FT._LIST", target_nodes=node)
            assert not [n for n in names if n.decode().startswith(s.prefix)], node.name
        assert [k async for k in cluster_redis.scan_iter(match=f"{s.prefix}*")] == []
    finally:
        await redis.aclose()


async def test_a_reader_follows_a_replay_swap_at_once(cluster_url, cluster_settings, cluster_redis):
    """A replay points the alias at the new generation, then drops the old one. Another process's
    client, which had the alias cached (`cluster.ALIAS_TTL`), answered "Unknown index name" until the
    cache expired (a CI run of test_cluster_join failed on it). A missing index behind a cached alias
    now re-reads the alias."""
    from shared.index import Scope, VectorParams, count, ensure_episode_index, point_alias_at
    from shared.keys import Keys
    from shared.tags import BLAKE2B

    s, keys = cluster_settings, Keys(cluster_settings.prefix)
    params = VectorParams.of(s, s.embed_dim)
    await ensure_episode_index(cluster_redis, keys, 1, params, "hashing", tag_key=None)
    reader = connect(cluster_url, prefix=s.prefix)
    try:
        scope = Scope(namespace="ns-swap", tags=BLAKE2B)
        with cluster.route("ns-swap"):
            assert await count(reader, keys.episode_index_alias, scope) == 0  # the alias is cached now
        await ensure_episode_index(cluster_redis, keys, 2, params, "hashing", tag_key=None, point_alias=False)
        await point_alias_at(cluster_redis, keys.episode_index_alias, keys.episode_index(2))
        await cluster_redis.execute_command("FT.DROPINDEX", keys.episode_index(1))
        with cluster.route("ns-swap"):
            assert await count(reader, keys.episode_index_alias, scope) == 0
            assert await reader.resolve(keys.episode_index_alias) == keys.episode_index(2)
    finally:
        await reader.aclose()


class _HeldAliasReads(RedisCluster):
    """Holds the reply of each alias read (an `HGET` of an `ftalias:` field) until `release` is set."""

    held: asyncio.Event
    release: asyncio.Event

    async def execute_command(self, *args, **kwargs):
        reply = await super().execute_command(*args, **kwargs)
        if args[0] == "HGET" and str(args[2]).startswith(cluster.ALIAS):
            self.held.set()
            await self.release.wait()
        return reply


class _HeldCluster(cluster.EngramCluster, _HeldAliasReads):
    """`EngramCluster` whose own alias reads (`super().execute_command`) go through the hold."""


async def test_an_alias_change_during_a_resolve_neither_fails_it_nor_goes_stale(cluster_url, prefix):
    """The alias cache was set to None by an alias change while a resolve awaited its read; the
    resolve then stored into None: `TypeError: 'NoneType' object does not support item assignment`
    (failed consolidations, dead-lettered snapshots). The change now swaps in a new cache, and the
    read, which began before the change, lands in the discarded one."""
    reader = connect(cluster_url, prefix=prefix)
    reader.__class__ = _HeldCluster
    reader.held, reader.release = asyncio.Event(), asyncio.Event()
    alias, index = f"{prefix}alias", f"{prefix}idx"
    try:
        resolving = asyncio.create_task(reader.resolve(alias))
        await reader.held.wait()  # the alias is read, the resolve not finished
        await reader.execute_command("FT.ALIASUPDATE", alias, index)
        reader.release.set()
        assert await resolving == alias  # read before the alias existed
        assert await reader.resolve(alias) == index  # not the answer read before the change
        await reader.execute_command("FT.ALIASDEL", alias)
        assert await reader.resolve(alias) == alias
    finally:
        reader.release.set()
        await reader.execute_command("HDEL", reader.meta, cluster.ALIAS + alias)
        await reader.aclose()


async def test_the_cursor_reads_of_a_routed_aggregate_reach_its_node(cluster_settings, cluster_redis):
    """`FT.CURSOR READ <index> <id>` names its index second: it was routed as an index named "READ"
    ("Unknown index name"), so reading every key of a namespace of more than one batch (a forget by
    scope, a consolidation's episodes) failed on a shard-local cluster."""
    from shared.index_pages import every_key
    from shared.keys import Keys
    from tests.integration.test_consolidator import drain
    from tests.integration.test_facts import make_worker, planted, publish

    s, redis = cluster_settings, cluster_redis
    await publish(s, redis, planted()[:5], namespace="cursor")
    await drain(make_worker(s, redis))
    with cluster.route("cursor"):
        assert len(await every_key(redis, Keys(s.prefix).episode_index_alias, "*", batch=2)) == 5
