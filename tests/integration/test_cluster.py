"""The local Redis Cluster of the embedded wheels, which stream partitions on a cluster rest on: three
primaries with a replica each on private ports, RediSearch on every node, redis-py's cluster client across
slots, and the shard-locality of the embedded search module measured as a fact the routing must respect."""

from __future__ import annotations

import uuid

import pytest
import redis
from redis.crc import key_slot

from deploy.embedded_redis import (
    CLUSTER_SLOTS,
    MAX_CLUSTER_PORT,
    EmbeddedCluster,
    free_cluster_ports,
    slot_ranges,
)
from shared.redis_conn import connect
from tests.helpers import wait_until

pytestmark = pytest.mark.slow  # spawns processes or servers: `make test-fast` skips it


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = EmbeddedCluster(data_dir=tmp_path_factory.mktemp("cluster"), primaries=3, replicas=1)
    c.start()
    yield c
    c.stop()


def node_client(node) -> redis.Redis:
    return redis.Redis(port=node.port, socket_timeout=5, protocol=2)


def test_slot_ranges_cover_every_slot_once():
    for n in (1, 2, 3, 5, 16):
        ranges = slot_ranges(n)
        assert ranges[0][0] == 0 and ranges[-1][1] == CLUSTER_SLOTS - 1 and len(ranges) == n
        assert all(b[0] == a[1] + 1 for a, b in zip(ranges, ranges[1:], strict=False))
    with pytest.raises(ValueError):
        slot_ranges(0)
    ports = free_cluster_ports(4)
    assert len(set(ports)) == 4 and max(ports) <= MAX_CLUSTER_PORT


def test_the_cluster_is_up_with_search_on_every_node_and_replicas_attached(cluster):
    assert cluster.url.startswith("redis+cluster://127.0.0.1:")
    owned = 0
    for node in cluster.nodes:
        c = node_client(node)
        try:
            assert b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO")
            c.execute_command("FT._LIST")  # the module answers on every node
        finally:
            c.close()
    for node in cluster.primary_nodes:
        c = node_client(node)
        try:
            assert c.info("replication")["connected_slaves"] == 1
            my_id = c.execute_command("CLUSTER", "MYID")
            for line in c.execute_command("CLUSTER", "NODES").splitlines():
                fields = line.split()
                if fields[0] == my_id:
                    for part in fields[8:]:
                        lo, _, hi = part.decode().partition("-")
                        owned += int(hi or lo) - int(lo) + 1
        finally:
            c.close()
    assert owned == CLUSTER_SLOTS


def tag_in(lo: int, hi: int) -> str:
    """A short hash tag whose slot lies in [lo, hi] (a name routed to the node owning that range)."""
    return next(f"n{i}" for i in range(100_000) if lo <= key_slot(f"n{i}".encode()) <= hi)


@pytest.mark.timeout(120)  # the module's six-node cluster stops in this test's teardown: 27 s measured
async def test_the_cluster_client_spreads_keys_and_the_embedded_search_is_shard_local(cluster):
    """Measured facts the routing must respect (docs/scaling.md): the embedded RediSearch 2.10 in cluster
    mode treats an index name as a key — `FT.CREATE` / `FT.SEARCH` of a name are MOVED to the node owning
    its slot — and a node's index sees only that node's documents (no coordinator). So every primary
    gets its own index, named with a hash tag of a slot it owns, and a namespace's query goes to the
    primary owning its hash tag's slot."""
    r = connect(cluster.url)
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    try:
        keys = [f"{prefix}doc:{i}" for i in range(60)]
        for i, key in enumerate(keys):
            await r.hset(key, mapping={"ns": "a", "n": i})
        assert [int((await r.hget(k, "n")).decode()) for k in keys] == list(range(60))
        assert len({key_slot(k.encode()) for k in keys}) > 3
        names = []
        for node, (lo, hi) in zip(cluster.primary_nodes, slot_ranges(cluster.primaries), strict=True):
            name = f"{prefix}idx:{{{tag_in(lo, hi)}}}"
            names.append(name)
            c = node_client(node)
            try:
                c.execute_command(
                    "FT.CREATE",
                    name,
                    "ON",
                    "HASH",
                    "PREFIX",
                    1,
                    f"{prefix}doc:",
                    "SCHEMA",
                    "ns",
                    "TAG",
                    "n",
                    "NUMERIC",
                )
            finally:
                c.close()

        def counts(tag: str) -> list[int]:
            out = []
            for node, name in zip(cluster.primary_nodes, names, strict=True):
                c = node_client(node)
                try:
                    out.append(int(c.execute_command("FT.SEARCH", name, f"@ns:{{{tag}}}", "LIMIT", 0, 0)[0]))
                finally:
                    c.close()
            return out

        # documents that existed before FT.CREATE are indexed in the background
        await wait_until(lambda: sum(counts("a")) == 60, message="every node indexed its documents")
        assert all(0 < n < 60 for n in counts("a"))
        c = node_client(cluster.primary_nodes[0])
        try:  # another node's index name is redirected, not answered
            with pytest.raises(redis.exceptions.MovedError):
                c.execute_command("FT.SEARCH", names[1], "*", "LIMIT", 0, 0)
        finally:
            c.close()
        # keys sharing a hash tag share a slot, hence a node: one FT.SEARCH there sees all of them
        tagged = [f"{prefix}doc:{{ns-a}}:{i}" for i in range(20)]
        for key in tagged:
            await r.hset(key, mapping={"ns": "tagged", "n": 1})
        assert sorted(counts("tagged")) == [0, 0, 20]  # written after FT.CREATE: indexed synchronously
    finally:
        await r.aclose()
