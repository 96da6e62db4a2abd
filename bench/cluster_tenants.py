"""How many namespaces one primary holds when each has its own index (shard-local search).

    python -m bench.cluster_tenants [--namespaces 100,1000,5000] [--per-namespace 3] [--searches 300]
        [--algorithm HNSW|FLAT] [--block-size 64]

For each count N, a fresh one-primary embedded cluster (it owns every slot, so every namespace's
index lands on it; the same module and code path as a bigger cluster's primary) gets the real
episode and facts index templates (`Worker.setup`, HNSW, 384 dims), then:

- `FT.CREATE` of every namespace's two indexes (`shared.cluster.ensure_shards`): seconds per create,
  first and last tenth of the namespaces apart (does a create slow down as indexes accumulate?);
- memory (INFO `used_memory`) per namespace with empty indexes, then with `--per-namespace`
  episodes each (SDK publish + one in-process worker, hashing embedder);
- `FT.SEARCH` latency on random namespaces' indexes: a pre-filtered KNN of 5 and a `LIMIT 0 0`
  count, p50/p95 over `--searches` calls, and the Redis CPU per search (INFO used_cpu_sys+user);
- the time of `FT._LIST` and of `INFO` (both walk every index).

Prints one line per N; docs/scaling.md's "How many namespaces" table is made from it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import redis as syncredis

from bench.common import percentile_ms, record_migrations
from deploy.embedded_redis import EmbeddedCluster
from services.consolidator.worker import Worker
from shared import cluster as search_routing
from shared.embedding import HashingEmbedder
from shared.facts import ensure_facts_index
from shared.keys import Keys
from shared.redis_conn import connect
from shared.settings import Settings


def used_cpu(info: dict) -> float:
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def measure(n: int, args: argparse.Namespace, tmp: Path) -> dict:
    """The numbers of the module docstring for `n` namespaces on one fresh primary."""
    c = EmbeddedCluster(data_dir=tmp / f"n{n}", primaries=1).start()
    try:
        settings = Settings(
            redis_url=c.url,
            prefix="bench:",
            embedder="hashing",
            embed_dim=384,
            block_ms=50,
            vector_algorithm=args.algorithm,
            vector_block_size=args.block_size,
        )
        keys = Keys(settings.prefix)
        redis = connect(c.url, prefix=settings.prefix)
        embedder = HashingEmbedder(settings.embed_dim)
        worker = Worker(settings, redis, embedder, name="bench")
        await worker.setup()
        await ensure_facts_index(redis, keys, 1, settings.embed_dim)
        indexes = [keys.episode_index(1), keys.facts_index(1)]
        namespaces = [f"tenant-{i}" for i in range(n)]
        node = c.primary_nodes[0]
        raw = syncredis.Redis(port=node.port, socket_timeout=60)
        base = raw.info("memory")["used_memory"]
        creates: list[float] = []
        for ns in namespaces:
            t = time.perf_counter()
            await search_routing.ensure_shards(redis, indexes, [ns])
            creates.append(time.perf_counter() - t)
        empty = raw.info("memory")["used_memory"]
        tenth = max(1, n // 10)
        started = time.perf_counter()
        await record_migrations(redis, settings.prefix, namespaces, args.per_namespace)
        while await worker.turn():
            pass
        ingest_s = time.perf_counter() - started
        small = raw.info("memory")["used_memory"]

        rng = random.Random(0)
        vector = np.asarray(
            (await embedder.embed(["migrate the orders table"]))[0], dtype=np.float32
        ).tobytes()
        knn, counts = [], []
        cpu0 = used_cpu(raw.info("cpu"))
        for _ in range(args.searches):
            ns = rng.choice(namespaces)
            with search_routing.route(ns):
                t = time.perf_counter()
                await redis.execute_command(
                    "FT.SEARCH",
                    indexes[0],
                    "*=>[KNN 5 @vector $BLOB AS dist]",
                    "PARAMS",
                    2,
                    "BLOB",
                    vector,
                    "SORTBY",
                    "dist",
                    "RETURN",
                    1,
                    "dist",
                    "DIALECT",
                    2,
                    "LIMIT",
                    0,
                    5,
                )
                knn.append(time.perf_counter() - t)
                t = time.perf_counter()
                await redis.execute_command("FT.SEARCH", indexes[0], "@outcome:{success}", "LIMIT", 0, 0)
                counts.append(time.perf_counter() - t)
        cpu_per_search_ms = (used_cpu(raw.info("cpu")) - cpu0) / (2 * args.searches) * 1e3
        t = time.perf_counter()
        listed = len(raw.execute_command("FT._LIST"))
        list_s = time.perf_counter() - t
        t = time.perf_counter()
        raw.info("everything")
        info_s = time.perf_counter() - t
        raw.close()
        await redis.aclose()
        return {
            "namespaces": n,
            "indexes": listed,
            "ft_create_ms_first_tenth": 1e3 * sum(creates[:tenth]) / (2 * tenth),
            "ft_create_ms_last_tenth": 1e3 * sum(creates[-tenth:]) / (2 * tenth),
            "kb_per_empty_namespace": (empty - base) / n / 1024,
            "kb_per_namespace_with_episodes": (small - base) / n / 1024,
            "ingest_episodes_per_s": n * args.per_namespace / ingest_s,
            "knn_p50_ms": percentile_ms(knn, 50),
            "knn_p95_ms": percentile_ms(knn, 95),
            "count_p50_ms": percentile_ms(counts, 50),
            "redis_cpu_ms_per_search": cpu_per_search_ms,
            "ft_list_ms": list_s * 1e3,
            "info_everything_ms": info_s * 1e3,
            "used_memory_mb": small / 2**20,
        }
    finally:
        c.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", default="100,1000,5000", help="comma-separated counts")
    parser.add_argument("--per-namespace", type=int, default=3)
    parser.add_argument("--searches", type=int, default=300)
    parser.add_argument("--algorithm", choices=("HNSW", "FLAT"), default="HNSW")
    parser.add_argument("--block-size", type=int, default=0, help="ENGRAM_VECTOR_BLOCK_SIZE (FLAT only)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.namespaces.split(",")):
            result = asyncio.run(measure(n, args, Path(tmp)))
            result["load_average"] = os.getloadavg()[0]
            print(
                " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()),
                flush=True,
            )


if __name__ == "__main__":
    main()
