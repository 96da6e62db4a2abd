"""A primary of a local Redis Cluster (3 primaries, 1 replica each) is killed while Engram runs: its
replica takes over and nothing that was acknowledged — published, replicated, projected — is lost; the
same worker and query service go on, ingest included."""

from __future__ import annotations

import pytest
import redis as syncredis

from deploy.embedded_redis import EmbeddedCluster
from services.query.app import make_app
from shared.embedding import HashingEmbedder
from shared.keys import ns_tag
from shared.redis_conn import connect
from shared.sdk import EngramClient
from shared.settings import Settings
from tests.helpers import wait_until
from tests.integration.test_consolidator import drain, make_worker
from tests.integration.test_facts import ep

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # a six-node cluster starts and stops here


@pytest.fixture
def replicated(tmp_path):
    cluster = EmbeddedCluster(data_dir=tmp_path / "cluster", primaries=3, replicas=1)
    cluster.start()
    yield cluster
    cluster.stop()


def owner_port(any_port: int, key: str) -> int:
    c = syncredis.Redis(port=any_port, socket_timeout=5)
    try:
        slot = c.execute_command("CLUSTER", "KEYSLOT", key)
        for lo, hi, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
            if lo <= slot <= hi:
                return int(primary[1])
    finally:
        c.close()
    raise AssertionError("slot not covered")


async def test_a_killed_primary_fails_over_and_nothing_acknowledged_is_lost(replicated, aiohttp_client):
    s = Settings(
        redis_url=replicated.url,
        prefix="fo:",
        embedder="hashing",
        embed_dim=256,
        vector_algorithm="FLAT",
        block_ms=50,
        lease_ms=2000,
    )
    keys, ns = s.keys, "tenant"
    redis = connect(s.redis_url, prefix=s.prefix)
    client = EngramClient(redis, namespace=ns, prefix=s.prefix)
    for i in range(10):
        await client.record(ep("mig", i))
    worker = make_worker(s, redis)
    await drain(worker)
    # the primary holding the namespace (and, if it is the same, its stream partition): acknowledged by its replica
    victim_port = owner_port(replicated.nodes[0].port, ns_tag(ns))
    victim = next(n for n in replicated.nodes if n.port == victim_port)
    v = syncredis.Redis(port=victim_port)
    assert v.execute_command("WAIT", 1, 5000) == 1  # every write so far is on the replica too
    v.close()
    survivor = next(n for n in replicated.primary_nodes if n.port != victim_port)
    victim.kill()

    def promoted() -> bool:
        try:
            port = owner_port(survivor.port, ns_tag(ns))
        except (syncredis.RedisError, AssertionError):
            return False
        return port != victim_port

    await wait_until(promoted, timeout=60, interval=0.2, message="the replica's promotion")
    api = s.with_(api_keys={"key": ns})
    http = await aiohttp_client(make_app(api, redis=redis, embedder=HashingEmbedder(s.embed_dim)))

    async def recalled() -> set[str]:
        reply = await http.post(
            "/v1/recall",
            json={"query": "migrate the orders table", "top_k": 30},
            headers={"Authorization": "Bearer key"},
        )
        return (
            {h["episode"]["episode_id"] for h in (await reply.json())["results"]}
            if reply.status == 200
            else set()
        )

    async def recalled_all(want: set[str]):
        return await recalled() == want

    await wait_until(
        lambda: recalled_all({f"mig-{i}" for i in range(10)}),
        timeout=30,
        interval=0.2,
        message="recall after failover",
    )
    for i in range(10, 14):  # ingest and projection go on against the promoted replica
        await client.record(ep("mig", i))
    await drain(worker)
    await wait_until(
        lambda: recalled_all({f"mig-{i}" for i in range(14)}),
        timeout=30,
        interval=0.2,
        message="new episodes",
    )
    assert await redis.xlen(keys.stream_of(ns)) >= 14  # the namespace's partition
    await redis.aclose()
