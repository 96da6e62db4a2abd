"""A primary of a private 3-primary cluster stopped (`SIGSTOP`):
recall answers 503 with Retry-After, never 500, for a namespace on a live primary (ClusterDownError
once the cluster state is `fail`) and for one on the stopped primary (timeouts), `/readyz` says
`redis: false`; and 200 again once the primary is back. A publisher meanwhile retries the cluster's faults until its deadline and says how
many attempts it made (it said "after 0 attempt(s)", or "Redis refused the events: The cluster is
down")."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis as sync_redis

from deploy.embedded_redis import EmbeddedCluster
from engram_episodic.errors import PublishError
from services.query.app import make_app
from shared.embedding import HashingEmbedder
from shared.keys import Keys
from shared.redis_conn import connect
from shared.sdk import EngramClient
from shared.settings import Settings
from tests.helpers import wait_until
from tests.integration.test_consolidator import drain, make_worker
from tests.integration.test_facts import ep

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # a cluster of its own, and its failure detection


def cluster_state(port: int) -> str:
    client = sync_redis.Redis(port=port, socket_timeout=2)
    try:
        info = client.execute_command("CLUSTER", "INFO").decode()
    finally:
        client.close()
    return next(line.split(":")[1].strip() for line in info.splitlines() if line.startswith("cluster_state"))


async def test_recall_is_503_never_500_while_a_primary_is_stopped(tmp_path, aiohttp_client):
    cluster = EmbeddedCluster(data_dir=tmp_path / "cluster", primaries=3).start()
    stopped = cluster.primary_nodes[1]
    redis = connect(cluster.url, prefix="outage:", socket_timeout=2.0, retries=1)
    try:
        s = Settings(
            redis_url=cluster.url,
            prefix="outage:",
            embedder="hashing",
            embed_dim=256,
            vector_algorithm="FLAT",
            block_ms=50,
            lease_ms=2000,
        )
        keys = Keys(s.prefix)
        await redis.initialize()
        home = {}  # a namespace on the primary that stays up, and one on the stopped one
        for i in range(200):
            port = redis.get_node_from_key(keys.episode_doc(1, f"ns-{i}", "x")).port
            home.setdefault(port, f"ns-{i}")
        live_ns, stopped_ns = home[cluster.primary_nodes[0].port], home[stopped.port]
        for ns in (live_ns, stopped_ns):
            await EngramClient(redis, namespace=ns, prefix=s.prefix).record(ep("mig", 1))
        await drain(make_worker(s, redis))
        api = s.with_(api_keys={"key-live": live_ns, "key-stopped": stopped_ns})
        http = await aiohttp_client(make_app(api, redis=redis, embedder=HashingEmbedder(s.embed_dim)))

        async def recall(key: str):
            return await http.post(
                "/v1/recall",
                json={"query": "migrate the orders table schema", "top_k": 5},
                headers={"Authorization": f"Bearer {key}"},
            )

        async def redis_ready() -> bool:
            reply = await http.get("/readyz")
            return reply.status == 200 and (await reply.json())["checks"]["redis"] is True

        assert (await recall("key-live")).status == 200
        assert await redis_ready()
        assert stopped.process is not None
        os.kill(stopped.process.pid, signal.SIGSTOP)
        try:
            port = cluster.primary_nodes[0].port
            # /readyz says so at once: a PING of one node said `redis: true` for as long as it was down
            reply = await http.get("/readyz")
            assert reply.status == 503 and (await reply.json())["checks"]["redis"] is False
            await wait_until(lambda: cluster_state(port) == "fail", timeout=30, message="the cluster to fail")
            reply = await http.get("/readyz")
            assert reply.status == 503 and (await reply.json())["checks"]["redis"] is False
            for key in ("key-live", "key-stopped"):
                began = time.monotonic()
                reply = await recall(key)
                assert reply.status == 503, (key, reply.status, await reply.text())
                assert reply.headers["Retry-After"] == "1"
                assert time.monotonic() - began < 30, key
            for ns in (live_ns, stopped_ns):  # the publisher retries a cluster fault and counts right
                with pytest.raises(PublishError) as caught:
                    await EngramClient(redis, namespace=ns, prefix=s.prefix, publish_timeout=3).record(
                        ep("mig", 2)
                    )
                assert "0 attempt(s)" not in str(caught.value) and "refused" not in str(caught.value), ns
        finally:
            os.kill(stopped.process.pid, signal.SIGCONT)

        async def answers() -> bool:
            return (await recall("key-live")).status == 200

        await wait_until(answers, timeout=60, message="recall to answer once the primary is back")
        await wait_until(redis_ready, timeout=30, message="/readyz to say redis: true again")
    finally:
        await redis.aclose()
        cluster.stop()
