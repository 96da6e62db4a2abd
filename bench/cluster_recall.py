"""Recall on a local Redis Cluster against one Redis, in the same run (docs/scaling.md, issue 16).

`python -m bench.cluster_recall [--namespaces 6] [--per-namespace 300] [--recalls 300]` starts one
embedded Redis and a 3-primary embedded cluster from the same wheels, ingests the same episodes into
each (SDK publish, one in-process worker, hashing embedder), then runs sequential `POST /v1/recall`s
through the query service in process, cycling over the namespaces. Reports recall p50/p95, the Redis
CPU time per ingested episode and per recall (utime+stime of each redis-server from /proc), per
primary, and how the namespaces spread over the primaries.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from bench.common import percentile_ms
from deploy.embedded_redis import EmbeddedCluster, EmbeddedRedis, free_port
from services.consolidator.worker import Worker
from services.query.app import make_app
from shared.embedding import HashingEmbedder
from shared.keys import ns_tag
from shared.redis_conn import connect
from shared.sdk import EngramClient
from shared.settings import Settings

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def episode(ns: str, i: int) -> dict:
    words = ["orders", "users", "invoices", "billing", "search", "login"]
    return {
        "episode_id": f"{ns}-{i}",
        "task": {"description": f"migrate the {words[i % 6]} table schema, step {i}", "category": "db"},
        "outcome": "success" if i % 3 else "failure",
        "solution": f"alembic revision {i} with a backfill",
        "user_id": f"user-{i % 7}",
        "feedback": {"reward": 1.0 if i % 3 else 0.0},
    }


async def measure(url: str, pids: dict[str, int], args: argparse.Namespace) -> dict:
    settings = Settings(redis_url=url, prefix="bench:", embedder="hashing", embed_dim=384, block_ms=50)
    namespaces = [f"tenant-{i}" for i in range(args.namespaces)]
    redis = connect(url, prefix=settings.prefix)
    for ns in namespaces:
        client = EngramClient(redis, namespace=ns, prefix=settings.prefix)
        for i in range(args.per_namespace):
            await client.record(episode(ns, i))
    worker = Worker(settings, redis, HashingEmbedder(settings.embed_dim), name="bench")
    await worker.setup()
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.perf_counter()
    while await worker.turn():
        pass
    ingest_s = time.perf_counter() - started
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    episodes = args.namespaces * args.per_namespace
    ingest_cpu = {name: (after[name] - before[name]) / episodes * 1e6 for name in pids}

    app = make_app(
        settings.with_(api_keys={f"k-{ns}": ns for ns in namespaces}),
        redis=redis,
        embedder=HashingEmbedder(settings.embed_dim),
    )
    async with TestClient(TestServer(app)) as http:
        latencies: list[float] = []
        for phase in ("warm", "measure"):
            n = 30 if phase == "warm" else args.recalls
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            for i in range(n):
                ns = namespaces[i % len(namespaces)]
                t = time.perf_counter()
                reply = await http.post(
                    "/v1/recall",
                    json={"query": f"migrate the {['orders', 'users'][i % 2]} table", "top_k": 5},
                    headers={"Authorization": f"Bearer k-{ns}"},
                )
                assert reply.status == 200, await reply.text()
                await reply.read()
                if phase == "measure":
                    latencies.append(time.perf_counter() - t)
            after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    recall_cpu = {name: (after[name] - before[name]) / args.recalls * 1e3 for name in pids}
    spread: dict[str, int] = {}
    if hasattr(redis, "get_node_from_key"):
        for ns in namespaces:
            node = redis.get_node_from_key(ns_tag(ns)).port
            spread[str(node)] = spread.get(str(node), 0) + 1
    await redis.aclose()
    return {
        "ingest_episodes_per_s": episodes / ingest_s,
        "ingest_redis_cpu_us_per_episode": ingest_cpu,
        "recall_p50_ms": percentile_ms(latencies, 50),
        "recall_p95_ms": percentile_ms(latencies, 95),
        "recall_redis_cpu_ms_per_recall": recall_cpu,
        "namespaces_per_primary": spread,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", type=int, default=6)
    parser.add_argument("--per-namespace", type=int, default=300)
    parser.add_argument("--recalls", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        single = EmbeddedRedis(port=free_port(), data_dir=Path(tmp) / "single").start()
        cluster = EmbeddedCluster(data_dir=Path(tmp) / "cluster", primaries=3).start()
        try:
            one = asyncio.run(measure(single.url, {"single": single.process.pid}, args))
            pids = {str(n.port): n.process.pid for n in cluster.primary_nodes}
            three = asyncio.run(measure(cluster.url, pids, args))
        finally:
            cluster.stop()
            single.stop()
    for name, result in (("one Redis", one), ("3-primary cluster", three)):
        print(f"--- {name}")
        for key, value in result.items():
            if isinstance(value, dict):
                value = {k: round(v, 3) if isinstance(v, float) else v for k, v in value.items()}
            elif isinstance(value, float):
                value = round(value, 2)
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
