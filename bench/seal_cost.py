"""CPU cost of sealing the stream, in process: the publisher and the worker, plain vs sealed, interleaved.

    python -m bench.seal_cost [--episodes 5000] [--rounds 5]

Rates measured end to end (`python -m bench.perf --phases ingest --embedders hashing --encryption
both`) swing with anything else running on the machine; CPU seconds of one process barely do. For each
round, against a private embedded Redis: publish the same synthetic episodes through the SDK (one
`publish` per 100, users as in bench.perf) without and with a master key, then project them with the
worker's Projector in batches of 256 (the hashing embedder), and count this process's CPU time
(`time.process_time`) of each side. Prints medians in µs per episode and the sealed/plain ratios;
writes bench/seal-cost-results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path

import numpy as np

from bench.common import ROOT, machine, private_redis
from bench.perf import DIM, NAMESPACE, synthetic_episode


async def one_side(url: str, events: list, master_key: bytes | None) -> dict[str, float]:
    from services.consolidator.projector import Projector
    from shared import streams
    from shared.embedding import HashingEmbedder
    from shared.index import VectorParams, ensure_episode_index
    from shared.keyring import KeyRing
    from shared.keys import Keys
    from shared.redis_conn import connect
    from shared.sdk import EngramClient
    from shared.settings import Settings

    keys = Keys(f"seal{uuid.uuid4().hex[:6]}:")
    r = connect(url)
    try:
        embedder = HashingEmbedder(DIM)
        # the publisher is the deployment's first process: it records the layout (shared.partitions)
        client = EngramClient(r, namespace=NAMESPACE, prefix=keys.prefix, master_key=master_key)
        cpu = time.process_time()
        for start in range(0, len(events), 100):
            await client.publish(events[start : start + 100])
        publish = time.process_time() - cpu
        tags = await ensure_episode_index(
            r, keys, 1, VectorParams(dim=DIM, algorithm="FLAT"), embedder.name, tag_key=None
        )
        ring = KeyRing(keys, client._ring.master) if master_key is not None else None
        # nothing here is forgotten: the default settings (for this prefix) are never read
        projector = Projector(r, embedder, 1, keyring=ring, tags=tags, settings=Settings(prefix=keys.prefix))
        entries = await streams.read_range(r, keys.stream, count=len(events) + 10)
        cpu = time.process_time()
        for start in range(0, len(entries), 256):
            result = await projector.apply(entries[start : start + 256])
            assert not result.dead, result.dead[:1]
        project = time.process_time() - cpu
        n = len(events)
        return {"publish_us": 1e6 * publish / n, "project_us": 1e6 * project / n}
    finally:
        async for key in r.scan_iter(match=f"{keys.prefix}*", count=1000):
            await r.unlink(key)
        await r.execute_command("FT.DROPINDEX", keys.episode_index(1))
        await r.aclose()


async def run(args: argparse.Namespace) -> dict:
    from engram_episodic.events import EpisodeCompleted
    from engram_episodic.validation import parse_episode

    events = [
        EpisodeCompleted(
            namespace=NAMESPACE, episode_id=e["episode_id"], occurred_at=time.time(), episode=parse_episode(e)
        )
        for e in (synthetic_episode(i, np.random.default_rng(i)) for i in range(args.episodes))
    ]
    sides: dict[str, list[dict[str, float]]] = {"plain": [], "sealed": []}
    with private_redis() as server:
        for _ in range(args.rounds):
            sides["plain"].append(await one_side(server.url, events, None))
            sides["sealed"].append(await one_side(server.url, events, os.urandom(32)))
    out = {"machine": machine(), "episodes": args.episodes, "rounds": args.rounds, "raw": sides}
    for step in ("publish_us", "project_us"):
        plain = float(np.median([s[step] for s in sides["plain"]]))
        sealed = float(np.median([s[step] for s in sides["sealed"]]))
        out[step] = {"plain": plain, "sealed": sealed, "ratio": sealed / plain}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.seal_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "bench" / "seal-cost-results.json"))
    args = p.parse_args(argv)
    res = asyncio.run(run(args))
    Path(args.out).write_text(json.dumps(res, indent=2))
    for step in ("publish_us", "project_us"):
        v = res[step]
        print(
            f"{step[:-3]:>8}: plain {v['plain']:.1f} µs/episode, sealed {v['sealed']:.1f} µs/episode, "
            f"ratio {v['ratio']:.3f} (CPU of this process, medians of {args.rounds} interleaved rounds)"
        )
    print(f"load average at start {res['machine'].get('loadavg_1m')}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
