"""Recall through the service with the default embedder, two query services side by side.

    python -m bench.query_batch [--embedder mpnet] [--episodes 300] [--clients 8] [--requests 64] [--rounds 4]
        [--compare batch|backend]

One private Redis, one consolidator projecting `--episodes` short episodes, and two query services on
it that differ only in `ENGRAM_QUERY_BATCH` (`--compare batch`, the default; 1: each query embedded
alone; 32: concurrent queries share forward passes, `shared.query_vectors.QueryBatcher`) or in
`ENGRAM_EMBED_BACKEND` (`--compare backend`: torch vs auto, i.e. ONNX Runtime), both with the query
cache off so every request embeds. Rounds alternate the two services; every request has a query text never sent before. Reports
p50 / p95 latency and recalls/s per variant and their ratios (same run, same machine).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from redis.exceptions import ResponseError

from bench.common import (
    ClientPool,
    check_alive,
    percentile_ms,
    poll_until,
    private_redis,
    service_env,
    spawn_query_service,
    spawn_workers,
    stop_processes,
    table,
    wait_http_ready,
)
from engram_episodic.client import Calls
from shared.redis_conn import connect

TOPICS = [
    "payment parser",
    "login page",
    "billing export",
    "search index",
    "image resizer",
    "audit log",
    "rate limiter",
    "email digest",
    "cache warmup",
    "feature flag",
]


# the two query services of a run: label → the environment they differ in
VARIANTS = {
    "batch": {
        "ENGRAM_QUERY_BATCH=1": {"ENGRAM_QUERY_BATCH": "1"},
        "ENGRAM_QUERY_BATCH=32": {"ENGRAM_QUERY_BATCH": "32"},
    },
    "backend": {
        "ENGRAM_EMBED_BACKEND=torch": {"ENGRAM_EMBED_BACKEND": "torch"},
        "ENGRAM_EMBED_BACKEND=auto": {"ENGRAM_EMBED_BACKEND": "auto"},
    },
}


async def run(args: argparse.Namespace) -> None:
    from deploy.embedded_redis import free_port
    from shared.index import Scope, count
    from shared.keys import Keys
    from shared.sdk import EngramClient
    from shared.tags import BLAKE2B  # a namespace-only scope digests nothing

    prefix = f"qb{uuid.uuid4().hex[:6]}:"
    with private_redis() as server:
        env = service_env(server.url, prefix, args.embedder, ENGRAM_QUERY_CACHE="0")
        procs = spawn_workers(1, env, name="qb")
        r = connect(server.url)
        try:
            sdk = EngramClient(r, namespace="default", prefix=prefix)
            for i in range(args.episodes):
                await sdk.record(
                    {
                        "task": f"fix the flaky {TOPICS[i % len(TOPICS)]} test number {i}",
                        "outcome": "success" if i % 3 else "failure",
                        "solution": f"step {i}",
                    }
                )
            keys = Keys(prefix)

            async def projected() -> bool:
                check_alive(procs, "consolidator")
                try:
                    n = await count(r, keys.episode_index_alias, Scope(namespace="default", tags=BLAKE2B))
                except ResponseError:  # the worker has not created the index yet
                    return False
                return n >= args.episodes

            await poll_until(projected, timeout=args.timeout)
            variants = VARIANTS[args.compare]
            services = {}
            for label, overrides in variants.items():
                port = free_port()
                proc = spawn_query_service({**env, **overrides}, port)
                procs.append(proc)
                services[label] = (f"http://127.0.0.1:{port}", proc)
            for base, proc in services.values():
                await wait_http_ready(base, proc, timeout=args.timeout)
            results: dict[str, list[tuple[list[float], float]]] = {label: [] for label in variants}
            labels = list(variants)
            n = 0
            for rnd in range(args.rounds):
                for batch in labels if rnd % 2 == 0 else labels[::-1]:
                    base, _ = services[batch]
                    async with ClientPool(base, args.clients, timeout=120.0) as pool:
                        lat: list[float] = []
                        todo = list(range(n, n + args.requests))

                        async def client(
                            pool: ClientPool = pool, lat: list[float] = lat, todo: list[int] = todo
                        ) -> None:
                            while todo:  # closed loop: each client sends its next query when answered
                                i = todo.pop()
                                query = f"how did we fix the {TOPICS[i % len(TOPICS)]} problem, take {uuid.uuid4().hex}"
                                started = time.perf_counter()
                                await pool.call(Calls.recall(query, {"top_k": 5}))
                                lat.append(time.perf_counter() - started)

                        started = time.perf_counter()
                        await asyncio.gather(*(client() for _ in range(args.clients)))
                        results[batch].append((lat, time.perf_counter() - started))
                        n += args.requests
            rows = []
            summary = {}
            for batch, runs in results.items():
                all_lat = [x for lat, _ in runs for x in lat]
                rate = statistics.median(args.requests / wall for _, wall in runs)
                summary[batch] = (percentile_ms(all_lat, 50), percentile_ms(all_lat, 95), rate)
                rows.append(
                    [
                        batch,
                        f"{summary[batch][0]:.0f}",
                        f"{summary[batch][1]:.0f}",
                        f"{rate:.1f}",
                    ]
                )
            print(
                f"{args.embedder}, {args.episodes} episodes, {args.clients} clients, "
                f"{args.rounds} rounds x {args.requests} requests per variant"
            )
            print(table(["variant", "p50 ms", "p95 ms", "recalls/s"], rows))
            first, second = labels
            print(
                f"{second} / {first}: p50 x{summary[second][0] / summary[first][0]:.2f}, "
                f"p95 x{summary[second][1] / summary[first][1]:.2f}, "
                f"recalls/s x{summary[second][2] / summary[first][2]:.2f}"
            )
        finally:
            await r.aclose()
            stop_processes(procs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--embedder", default="mpnet")
    p.add_argument("--episodes", type=int, default=300)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=64, help="requests per round and variant")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument(
        "--compare",
        choices=tuple(VARIANTS),
        default="batch",
        help="batch: ENGRAM_QUERY_BATCH 1 vs 32; backend: ENGRAM_EMBED_BACKEND torch vs auto (ONNX)",
    )
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
