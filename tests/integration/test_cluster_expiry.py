"""Expiry on the suite's shard-local cluster (the consolidator must not die every
`ENGRAM_EXPIRY_INTERVAL` with "FT.AGGREGATE on a shard-local cluster needs its namespace"): a running
worker's sweep erases the expired episodes of namespaces on several primaries, keeps the others, and
the worker keeps running."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from shared import cluster
from shared.keys import Keys
from shared.sdk import EngramClient
from tests.helpers import wait_until
from tests.integration.test_cluster_stack import in_index
from tests.integration.test_consolidator import make_worker
from tests.integration.test_facts import ep

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

NAMESPACES = [f"expiring-{i}" for i in range(6)]


async def test_a_running_worker_erases_expired_episodes_of_every_namespace(cluster_settings, cluster_redis):
    s = dataclasses.replace(cluster_settings, expiry_interval=0.2)
    redis = cluster_redis
    keys = Keys(s.prefix)
    await redis.initialize()
    homes = {redis.get_node_from_key(keys.episode_doc(1, ns, "mig-1")).name for ns in NAMESPACES}
    assert len(homes) >= 2  # the namespaces live on several primaries
    for ns in NAMESPACES:
        client = EngramClient(redis, namespace=ns, prefix=s.prefix)
        await client.record(ep("mig", 1) | {"ttl": "2s"})
        await client.record(ep("mig", 2))
    stop = asyncio.Event()
    running = asyncio.create_task(make_worker(s, redis, name="w-expiry").run(stop))
    try:
        for ns in NAMESPACES:  # both projected, then the expired one erased by the sweep
            await wait_until(
                lambda ns=ns: _only(redis, keys, ns), timeout=60, message=f"the expiry sweep of {ns}"
            )
            assert not running.done()
        assert not await redis.exists(keys.episode_doc(1, NAMESPACES[0], "mig-1"))
        assert await redis.exists(keys.tombstone(NAMESPACES[0], "mig-1"))
        # every namespace's index is searched, on its own primary
        targets = await cluster.search_targets(redis, keys.episode_index_alias)
        assert {t["target_nodes"].name for _, t in targets} == homes
        assert len(targets) >= len(NAMESPACES)
    finally:
        stop.set()
        await running


async def _only(redis, keys: Keys, ns: str) -> bool:
    """The namespace's live document is projected, and its expired one erased (a tombstone)."""
    return (
        await redis.exists(keys.episode_doc(1, ns, "mig-2"))
        and not await redis.exists(keys.episode_doc(1, ns, "mig-1"))
        and await redis.exists(keys.tombstone(ns, "mig-1"))
        and await in_index(redis, keys, ns) == 1
    )
