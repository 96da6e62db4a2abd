"""`ENGRAM_CLUSTER_SEARCH=coordinator` on a cluster whose search module has none (the embedded
RediSearch 2.10; issue 16's trial: a ClusterCrossSlotError traceback at the alias update and a stray
index on one node) is refused with a ConfigError naming the variable before anything is created."""

from __future__ import annotations

import pytest

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
