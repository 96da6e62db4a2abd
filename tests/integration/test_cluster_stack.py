"""Engram on a real local Redis Cluster (3 primaries, the embedded wheels): ingest through the SDK,
projection by one and two workers, recall, forgetting, facts and replay, with every index on every
primary and each namespace's searches routed to the primary that owns its slot (`shared.cluster`)."""

from __future__ import annotations

import pytest
import redis as syncredis
from redis.crc import key_slot

from services.consolidator.facts import Consolidator
from services.consolidator.replay import replay
from services.query.app import make_app
from shared import cluster
from shared.embedding import HashingEmbedder
from shared.facts import FactQuery, FactScope, live_facts_index, search_facts
from shared.index import Scope, count
from shared.keys import Keys, ns_tag
from shared.sdk import EngramClient
from shared.tags import BLAKE2B
from tests.helpers import wait_until
from tests.integration.test_consolidator import drain, make_worker
from tests.integration.test_facts import ep

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

NAMESPACES = [f"team-{i}" for i in range(6)]


def spread(redis) -> set[str]:
    """The primaries that own the test namespaces' slots."""
    return {redis.get_node_from_key(ns_tag(ns)).name for ns in NAMESPACES}


async def in_index(redis, keys: Keys, namespace: str, **scope) -> int:
    with cluster.route(namespace):
        return await count(redis, keys.episode_index_alias, Scope(namespace=namespace, tags=BLAKE2B, **scope))


async def test_ingest_recall_forget_facts_and_replay_on_a_cluster(
    cluster_settings, cluster_redis, aiohttp_client
):
    s, redis = cluster_settings, cluster_redis
    keys = Keys(s.prefix)
    await redis.initialize()
    assert len(spread(redis)) >= 2  # the namespaces live on several primaries
    for ns in NAMESPACES:
        client = EngramClient(redis, namespace=ns, prefix=s.prefix)
        for i in range(5):
            await client.record(ep("mig", i, user=f"user-{i % 2}"))
    worker = make_worker(s, redis)
    await drain(worker)
    for ns in NAMESPACES:
        assert await in_index(redis, keys, ns) == 5
    # recall through the query service, one API key per namespace
    api = s.with_(api_keys={f"key-{ns}": ns for ns in NAMESPACES})
    http = await aiohttp_client(make_app(api, redis=redis, embedder=HashingEmbedder(s.embed_dim)))
    for ns in NAMESPACES:
        reply = await http.post(
            "/v1/recall",
            json={"query": "migrate the orders table schema", "top_k": 10},
            headers={"Authorization": f"Bearer key-{ns}"},
        )
        assert reply.status == 200, await reply.text()
        assert sorted(h["episode"]["episode_id"] for h in (await reply.json())["results"]) == [
            f"mig-{i}" for i in range(5)
        ]

    # forgetting an episode and a user
    client = EngramClient(redis, namespace=NAMESPACES[0], prefix=s.prefix)
    assert await in_index(redis, keys, NAMESPACES[0], user_id="user-1") == 2
    await client.forget_episode("mig-0")
    await client.forget_user("user-1")
    await drain(worker)
    assert await in_index(redis, keys, NAMESPACES[0]) == 2  # mig-2, mig-4 (user-0); mig-0 forgotten
    assert await in_index(redis, keys, NAMESPACES[1]) == 5

    # facts of a namespace on its primary
    cons = Consolidator(s, redis, s.embed_dim)
    result = await cons.consolidate(FactScope(NAMESPACES[1]))
    assert result.status != "busy"
    await drain(worker)
    with cluster.route(NAMESPACES[1]):
        facts = await search_facts(
            redis,
            await live_facts_index(redis, keys),
            FactQuery(tags=BLAKE2B, namespace=NAMESPACES[1]),
            top_k=10,
        )
    assert facts and all(f.fact.namespace == NAMESPACES[1] for f in facts)
    await cons.aclose()

    # replay builds generation 2 on every primary and keeps what was forgotten forgotten
    out = await replay(s, redis, HashingEmbedder(s.embed_dim))
    assert out["generation"] == 2
    assert await in_index(redis, keys, NAMESPACES[0]) == 2
    for ns in NAMESPACES[1:]:
        assert await in_index(redis, keys, ns) == 5


async def test_two_workers_share_the_stream_on_a_cluster(cluster_settings, cluster_redis):
    s, redis = cluster_settings.with_(batch_size=8), cluster_redis
    keys = Keys(s.prefix)
    for ns in NAMESPACES:
        client = EngramClient(redis, namespace=ns, prefix=s.prefix)
        for i in range(20):
            await client.record(ep("ui", i))
    a, b = make_worker(s, redis, name="w1"), make_worker(s, redis, name="w2")
    await drain(a, b)
    for ns in NAMESPACES:
        assert await in_index(redis, keys, ns) == 20


def _nodes(port: int) -> dict[str, tuple[int, set[int]]]:
    """node id -> (port, slots) of the primaries, from CLUSTER NODES on any node."""
    c = syncredis.Redis(port=port, socket_timeout=5)
    try:
        out: dict[str, tuple[int, set[int]]] = {}
        for line in c.execute_command("CLUSTER", "NODES").decode().splitlines():
            fields = line.split()
            if "master" not in fields[2]:
                continue
            slots: set[int] = set()
            for part in fields[8:]:
                if part.startswith("["):
                    continue
                lo, _, hi = part.partition("-")
                slots.update(range(int(lo), int(hi or lo) + 1))
            out[fields[0]] = (int(fields[1].split(":")[1].split("@")[0]), slots)
        return out
    finally:
        c.close()


def migrate_slot(any_port: int, slot: int) -> tuple[int, int]:
    """Move `slot` with its keys to another primary (CLUSTER SETSLOT / MIGRATE, as redis-cli --cluster
    reshard does); returns (source port, destination port)."""
    nodes = _nodes(any_port)
    src_id = next(i for i, (_, slots) in nodes.items() if slot in slots)
    dst_id = next(i for i in nodes if i != src_id)
    src_port, dst_port = nodes[src_id][0], nodes[dst_id][0]
    src, dst = syncredis.Redis(port=src_port), syncredis.Redis(port=dst_port)
    try:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", "127.0.0.1", dst_port, "", 0, 5000, "KEYS", *keys)
        for port, _ in nodes.values():
            c = syncredis.Redis(port=port)
            try:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
            finally:
                c.close()
    finally:
        src.close()
        dst.close()
    return src_port, dst_port


async def test_recall_finds_a_namespace_after_its_slot_moves_to_another_primary(
    cluster_settings, cluster_redis, cluster_url, aiohttp_client
):
    """The stack keeps running across a reshard: the same worker and query service, a stale slot map
    (MOVED), the namespace's index created on the new primary, its documents indexed there."""
    s, redis = cluster_settings, cluster_redis
    ns = "moving-team"
    client = EngramClient(redis, namespace=ns, prefix=s.prefix)
    for i in range(8):
        await client.record(ep("mig", i))
    worker = make_worker(s, redis)
    await drain(worker)
    api = s.with_(api_keys={"key": ns})
    http = await aiohttp_client(make_app(api, redis=redis, embedder=HashingEmbedder(s.embed_dim)))

    async def recalled() -> set[str]:
        reply = await http.post(
            "/v1/recall",
            json={"query": "migrate the orders table schema", "top_k": 20},
            headers={"Authorization": "Bearer key"},
        )
        assert reply.status == 200, await reply.text()
        return {h["episode"]["episode_id"] for h in (await reply.json())["results"]}

    assert await recalled() == {f"mig-{i}" for i in range(8)}
    slot = key_slot(ns_tag(ns).encode())
    src, dst = migrate_slot(int(cluster_url.rsplit(":", 1)[1]), slot)
    assert src != dst and any(port == dst and slot in slots for port, slots in _nodes(dst).values())
    for i in range(8, 12):  # ingest goes on, into the new primary
        await client.record(ep("mig", i))
    await drain(worker)
    want = {f"mig-{i}" for i in range(12)}

    async def complete() -> bool:
        return await recalled() == want

    await wait_until(complete, timeout=30, interval=0.2, message="recall after the reshard")
