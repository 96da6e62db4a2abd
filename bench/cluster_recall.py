"""Recall on a local Redis Cluster against one Redis, in the same run (docs/scaling.md).

    python -m bench.cluster_recall [--namespaces 12] [--per-namespace 300] [--recalls 300]
        [--clients 1,8,16] [--json out.json]

Starts one embedded Redis and a 3-primary embedded cluster from the same wheels, ingests the same
episodes into each (SDK publish, one in-process worker, hashing embedder: the model is out of the
picture), then runs `POST /v1/recall`s through the query service in process, cycling over the
namespaces, with 1, 8 and 16 concurrent clients. Reports recall p50/p95 and recalls/s per client
count, the Redis CPU time per ingested episode and per recall per node (INFO `used_cpu_sys` +
`used_cpu_user` deltas) with its `INFO commandstats` breakdown (calls and usec per operation),
`used_memory` per node, and how the namespaces spread over the primaries.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import redis as syncredis
from aiohttp.test_utils import TestClient, TestServer

from bench.common import percentile_ms, record_migrations
from deploy.embedded_redis import EmbeddedCluster, EmbeddedRedis, free_port
from services.consolidator.worker import Worker
from services.query.app import make_app
from shared.embedding import HashingEmbedder
from shared.keys import ns_tag
from shared.redis_conn import connect
from shared.settings import Settings


def node_stats(ports: dict[str, int]) -> dict[str, dict]:
    """Per node: Redis CPU seconds (INFO `used_cpu_sys` + `used_cpu_user`, the server's own process,
    microsecond resolution) and `INFO commandstats` ({command: (calls, usec)})."""
    out: dict[str, dict] = {}
    for name, port in ports.items():
        c = syncredis.Redis(port=port, socket_timeout=30)
        try:
            cpu = c.info("cpu")
            stats = c.info("commandstats")
        finally:
            c.close()
        out[name] = {
            "cpu": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
            "commands": {k.removeprefix("cmdstat_"): (v["calls"], v["usec"]) for k, v in stats.items()},
        }
    return out


def delta(before: dict[str, dict], after: dict[str, dict], per: int) -> dict[str, dict]:
    """CPU ms and {command: calls, usec} per operation, per node, between two `node_stats`."""
    out: dict[str, dict] = {}
    for name in before:
        commands = {}
        for cmd, (calls, usec) in after[name]["commands"].items():
            calls0, usec0 = before[name]["commands"].get(cmd, (0, 0))
            if calls > calls0:
                commands[cmd] = (round((calls - calls0) / per, 2), round((usec - usec0) / per, 1))
        out[name] = {"cpu_ms": (after[name]["cpu"] - before[name]["cpu"]) / per * 1e3, "commands": commands}
    return out


async def measure(url: str, ports: dict[str, int], args: argparse.Namespace) -> dict:
    settings = Settings(redis_url=url, prefix="bench:", embedder="hashing", embed_dim=384, block_ms=50)
    namespaces = [f"tenant-{i}" for i in range(args.namespaces)]
    redis = connect(url, prefix=settings.prefix, max_connections=64)
    await record_migrations(redis, settings.prefix, namespaces, args.per_namespace)
    worker = Worker(settings, redis, HashingEmbedder(settings.embed_dim), name="bench")
    await worker.setup()
    before = node_stats(ports)
    started = time.perf_counter()
    while await worker.turn():
        pass
    ingest_s = time.perf_counter() - started
    episodes = args.namespaces * args.per_namespace
    result: dict = {
        "ingest_episodes_per_s": episodes / ingest_s,
        "ingest_per_episode": delta(before, node_stats(ports), episodes),
    }
    used = {}
    for name, port in ports.items():
        c = syncredis.Redis(port=port, socket_timeout=30)
        try:
            used[name] = c.info("memory")["used_memory"]
        finally:
            c.close()
    result["used_memory_mb"] = {name: round(v / 2**20, 1) for name, v in used.items()}

    app = make_app(
        settings.with_(api_keys={f"k-{ns}": ns for ns in namespaces}),
        redis=redis,
        embedder=HashingEmbedder(settings.embed_dim),
    )
    words = ["orders", "users", "invoices", "billing"]
    async with TestClient(TestServer(app)) as http:

        async def one(i: int, latencies: list[float] | None) -> None:
            ns = namespaces[i % len(namespaces)]
            t = time.perf_counter()
            reply = await http.post(
                "/v1/recall",
                json={"query": f"migrate the {words[i % 4]} table", "top_k": 5},
                headers={"Authorization": f"Bearer k-{ns}"},
            )
            assert reply.status == 200, await reply.text()
            await reply.read()
            if latencies is not None:
                latencies.append(time.perf_counter() - t)

        async def run(n: int, clients: int, latencies: list[float] | None) -> float:
            queue = iter(range(n))

            async def client() -> None:
                for i in queue:
                    await one(i, latencies)

            t = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(clients)))
            return time.perf_counter() - t

        await run(30, 1, None)  # warm: every namespace's index settled, connections open
        for clients in args.clients:
            latencies: list[float] = []
            before = node_stats(ports)
            wall = await run(args.recalls, clients, latencies)
            result[f"recall_{clients}_clients"] = {
                "p50_ms": percentile_ms(latencies, 50),
                "p95_ms": percentile_ms(latencies, 95),
                "recalls_per_s": args.recalls / wall,
                "per_recall": delta(before, node_stats(ports), args.recalls),
            }
    spread: dict[str, int] = {}
    if hasattr(redis, "get_node_from_key"):
        for ns in namespaces:
            node = redis.get_node_from_key(ns_tag(ns)).port
            spread[str(node)] = spread.get(str(node), 0) + 1
    result["namespaces_per_primary"] = spread
    await redis.aclose()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", type=int, default=12)
    parser.add_argument("--per-namespace", type=int, default=300)
    parser.add_argument("--recalls", type=int, default=300)
    parser.add_argument("--clients", default="1,8,16", help="concurrent clients, comma-separated")
    parser.add_argument("--json", type=Path, help="also write the results there")
    args = parser.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        single = EmbeddedRedis(port=free_port(), data_dir=Path(tmp) / "single").start()
        cluster = EmbeddedCluster(data_dir=Path(tmp) / "cluster", primaries=3).start()
        try:
            one = asyncio.run(measure(single.url, {"single": single.port}, args))
            three = asyncio.run(
                measure(cluster.url, {str(n.port): n.port for n in cluster.primary_nodes}, args)
            )
        finally:
            cluster.stop()
            single.stop()
    print(f"load average {os.getloadavg()}")
    for name, result in (("one Redis", one), ("3-primary cluster", three)):
        print(f"--- {name}")
        print(json.dumps(result, indent=1, default=lambda v: round(v, 3)))
    if args.json:
        args.json.write_text(json.dumps({"one": one, "cluster": three, "load": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
