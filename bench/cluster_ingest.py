"""Ingest over stream partitions: one Redis against a 3-primary cluster with one stream and with 16
partitions, in the same run (docs/scaling.md, Ingest partitions).

`python -m bench.cluster_ingest [--namespaces 48] [--per-namespace 100] [--batch 10]
[--partitioned-first]` starts one embedded Redis, then a fresh 3-primary embedded cluster (same wheels)
for each of one stream and 16 partitions. Into each deployment it publishes
the same episodes through the SDK (`--batch` episodes per publish call, each call one namespace), then
one in-process worker (hashing embedder) projects them all. For each phase it reports, per Redis
node: the CPU it spent (`INFO cpu` used_cpu_sys + used_cpu_user deltas, microseconds per episode) and
the stream commands it served (`INFO commandstats` call deltas of XADD, XREADGROUP, XACK: commands run
by scripts count too); how the stream entries spread over the primaries (partition balance); and, for
`--idle` seconds after, what an idle worker's polling (all its lanes) costs each node per second.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bench.cluster_recall import episode
from deploy.embedded_redis import EmbeddedCluster, EmbeddedRedis, free_port
from engram_episodic.drafts import finished_episode
from engram_episodic.events import EpisodeCompleted
from services.consolidator.worker import Worker
from shared.embedding import HashingEmbedder
from shared.redis_conn import connect
from shared.sdk import EngramClient
from shared.settings import Settings

COMMANDS = ("xadd", "xreadgroup", "xack")


async def node_stats(redis, nodes: list, commands=COMMANDS) -> dict[str, tuple[float, dict[str, int]]]:
    """node name → (used CPU seconds, {command: calls}) from INFO cpu and INFO commandstats."""
    out = {}
    for node in nodes:
        target = {"target_nodes": node} if node is not None else {}
        cpu = await redis.info("cpu", **target)
        stats = await redis.info("commandstats", **target)
        calls = {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in commands}
        out["single" if node is None else str(node.port)] = (
            float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
            calls,
        )
    return out


def deltas(before: dict, after: dict, episodes: int) -> dict[str, dict]:
    """Per node: CPU µs per episode and command calls during a phase."""
    return {
        name: {
            "cpu_us_per_episode": round((after[name][0] - before[name][0]) / episodes * 1e6, 1),
            **{c: after[name][1][c] - before[name][1][c] for c in COMMANDS},
        }
        for name in before
    }


async def measure(url: str, partitions: int, args: argparse.Namespace) -> dict:
    settings = Settings(
        redis_url=url,
        prefix=f"ingest{partitions}:",
        embedder="hashing",
        embed_dim=384,
        block_ms=50,
        stream_partitions=partitions,
    )
    keys = settings.keys
    redis = connect(url, prefix=settings.prefix)
    nodes: list = [None]
    if hasattr(redis, "get_primaries"):
        await redis.initialize()
        nodes = list(redis.get_primaries())
    namespaces = [f"tenant-{i}" for i in range(args.namespaces)]
    episodes = args.namespaces * args.per_namespace
    worker = Worker(settings, redis, HashingEmbedder(settings.embed_dim), name="bench")
    await worker.setup()  # records P and creates the groups before anything is published

    before = await node_stats(redis, nodes)
    started = time.perf_counter()
    for ns in namespaces:
        client = EngramClient(redis, namespace=ns, prefix=settings.prefix, partitions=partitions)
        for start in range(0, args.per_namespace, args.batch):
            events = []
            for i in range(start, min(start + args.batch, args.per_namespace)):
                ep = finished_episode(episode(ns, i))
                events.append(
                    EpisodeCompleted(
                        namespace=ns, episode_id=ep.episode_id, occurred_at=time.time(), episode=ep
                    )
                )
            await client.publish(events)
    publish_s = time.perf_counter() - started
    published = await node_stats(redis, nodes)

    started = time.perf_counter()
    while await worker.turn():
        pass
    project_s = time.perf_counter() - started
    projected = await node_stats(redis, nodes)

    # an idle worker (Settings.in_flight lanes, nothing to read): what its polling costs each node
    stop = asyncio.Event()
    idler = Worker(settings.with_(block_ms=1000), redis, HashingEmbedder(settings.embed_dim), name="idle")
    idle = asyncio.create_task(idler.run(stop))  # Settings.block_ms default, as deployed
    await asyncio.sleep(1.0)  # its setup and first turns
    quiet = await node_stats(redis, nodes, ("xreadgroup", "xautoclaim"))
    await asyncio.sleep(args.idle)
    after_idle = await node_stats(redis, nodes, ("xreadgroup", "xautoclaim"))
    stop.set()
    await idle
    idle_cost = {
        name: {
            "cpu_ms_per_s": round((after_idle[name][0] - quiet[name][0]) / args.idle * 1e3, 2),
            **{c: round((after_idle[name][1][c] - quiet[name][1][c]) / args.idle) for c in quiet[name][1]},
        }
        for name in quiet
    }

    spread: dict[str, int] = {}
    per_partition = [int(await redis.xlen(stream)) for stream in keys.streams]
    for stream, n in zip(keys.streams, per_partition, strict=True):
        node = redis.get_node_from_key(stream).port if hasattr(redis, "get_node_from_key") else "single"
        spread[str(node)] = spread.get(str(node), 0) + n
    await redis.aclose()
    return {
        "partitions": partitions,
        "publish_episodes_per_s": round(episodes / publish_s),
        "project_episodes_per_s": round(episodes / project_s),
        "entries_per_primary": spread,
        "entries_per_partition": per_partition,
        "publish": deltas(before, published, episodes),
        "project": deltas(published, projected, episodes),
        "idle_worker_per_s": idle_cost,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", type=int, default=48)
    parser.add_argument("--per-namespace", type=int, default=100)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of an idle worker measured")
    parser.add_argument("--partitioned-first", action="store_true", help="measure 16 partitions first")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        single = EmbeddedRedis(port=free_port(), data_dir=Path(tmp) / "single").start()
        try:
            results.append(("one Redis", asyncio.run(measure(single.url, 1, args))))
        finally:
            single.stop()
        # a fresh cluster for each: a second deployment on the same nodes ran measurably slower (its
        # nodes still held the first one's keys and indexes)
        for partitions in (16, 1) if args.partitioned_first else (1, 16):
            cluster = EmbeddedCluster(data_dir=Path(tmp) / f"cluster{partitions}", primaries=3).start()
            try:
                result = asyncio.run(measure(cluster.url, partitions, args))
            finally:
                cluster.stop()
            name = "one stream" if partitions == 1 else f"{partitions} partitions"
            results.append((f"3-primary cluster, {name}", result))
    for name, result in results:
        print(f"--- {name}")
        for key, value in result.items():
            if isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):
                print(f"{key}:")
                for node, row in value.items():
                    print(f"  {node}: {row}")
            else:
                print(f"{key}: {value}")


if __name__ == "__main__":
    main()
