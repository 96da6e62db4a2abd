"""`make bench`'s ingest phases: end to end (publish → recallable) through real consolidator processes,
each figure next to its bound measured in the same run.

- `ingest_phase` (phase "ingest"): synthetic agent episodes with the hashing embedder (vs pipelined
  HSET of the same documents into the same schema) and with MiniLM (vs the model alone).
- `real_ingest_phase` (phase "ingest-real"): real texts with the default embedder (`auto` → mpnet, its
  documents on OpenVINO bfloat16 where the CPU has it, else ONNX Runtime's float graph), LoCoMo dialogue turns and 2,000-character texts, vs the embedder alone on the same
  texts in the same process, interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from typing import Any

import numpy as np

from bench.common import (
    Timer,
    check_alive,
    drop_prefix,
    poll_until,
    proc_cpu,
    ratio,
    redis_cpu,
    service_env,
    spawn_workers,
    stop_processes,
)
from shared.settings import Settings

DIM = 384
DEFAULTS = Settings()
"""The workers' read and embedding batch sizes, which the embedder-alone side copies."""
NAMESPACE = "bench"
_VERBS = ("fix", "refactor", "test", "document", "optimise", "review", "port", "debug", "design", "profile")
_NOUNS = (
    "login flow",
    "payment service",
    "cache layer",
    "search index",
    "CSV importer",
    "retry policy",
    "websocket handler",
    "database migration",
    "rate limiter",
    "feature flag",
    "PDF export",
    "session store",
    "email queue",
    "auth middleware",
    "metrics exporter",
    "image resizer",
)
_TAILS = (
    "after the upgrade",
    "under load",
    "for the mobile client",
    "in the nightly job",
    "behind the proxy",
    "with flaky tests",
    "for the new tenant",
    "on the staging cluster",
)


def synthetic_episode(i: int, rng: np.random.Generator) -> dict[str, Any]:
    """A plausible agent episode (task ~ 60-120 characters, a solution, reward, outcome)."""
    verb, noun, tail = _VERBS[i % 10], _NOUNS[rng.integers(16)], _TAILS[rng.integers(8)]
    return {
        "episode_id": f"ep-{i}",
        "agent_id": f"agent-{i % 8}",
        "user_id": f"user-{i % 32}",
        "task": {
            "description": f"{verb} the {noun} {tail} (ticket {i})",
            "category": "debugging",
            "complexity": float(rng.random()),
        },
        "solution": f"changed the {noun} configuration and added a regression test for case {i}",
        "outcome": ("success", "partial", "failure")[i % 3],
        "feedback": {"reward": float(rng.random())},
        "importance": int(1 + i % 10),
        "strategy_used": ("iterative", "exploratory")[i % 2],
        "completed_at": 1_700_000_000.0 + 60.0 * i,
    }


# --- phase 1: ingest -----------------------------------------------------------------------------------
async def ingest_phase(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per embedder: rounds of (raw HSET rate, then the pipeline with each worker count), interleaved so
    that a slow spell of the shared machine hits both sides; the ratio is of the medians.

    The hashing embedder runs `args.repeats` rounds (one round of 10k is ~2 s per side, and single
    rounds of the raw rate were seen anywhere from 5,000 to 7,300/s on the same code); model
    embedders run one (their bound is the model, which varies far less).
    """
    from shared.embedding import make_embedder

    rows = []
    for name in args.embedders:
        n = args.ingest_hashing if name == "hashing" else args.ingest_minilm
        rounds = args.repeats if name == "hashing" else 1
        embedder = make_embedder(Settings(embedder=name, embed_dim=DIM))
        await embedder.load()
        episodes = [synthetic_episode(i, np.random.default_rng(i)) for i in range(n)]
        raw_rates: list[float] = []
        embed_rates: list[float] = []
        # --encryption: the pipeline without and/or with a master key (sealed stream), interleaved per round
        sealed_modes = {"off": [False], "on": [True], "both": [False, True]}[args.encryption]
        e2e: dict[tuple[int, bool], list[dict[str, float]]] = {
            (k, m): [] for k in args.workers for m in sealed_modes
        }
        try:
            for _ in range(rounds):
                raw = await raw_write_rate(url, episodes, embedder)
                raw_rates.append(raw["rate"])
                embed_rates.append(raw["embed_rate"])
                for k in args.workers:
                    for sealed in sealed_modes:
                        e2e[(k, sealed)].append(
                            await pipeline_rate(
                                url, episodes, name, k, args, master_key=os.urandom(32) if sealed else None
                            )
                        )
        finally:
            await embedder.aclose()
        raw_rate, embed_rate = float(np.median(raw_rates)), float(np.median(embed_rates))
        for (k, sealed), runs in e2e.items():
            rates = [r["rate"] for r in runs]
            rate = float(np.median(rates))
            bound = min(raw_rate, embed_rate) if name != "hashing" else raw_rate
            cpu = {
                side: float(np.median([r["cpu_us_per_episode"][side] for r in runs]))
                for side in ("publisher", "workers", "redis")
            }
            row = {
                "embedder": name,
                "workers": k,
                "sealed": sealed,
                "episodes": n,
                "rounds": rounds,
                "e2e_rate": rate,
                "cpu_us_per_episode": cpu,
                "e2e_rates": rates,
                "publish_s": float(np.median([r["publish_s"] for r in runs])),
                "publish_rates": [n / r["publish_s"] for r in runs],
                "raw_hset_rate": raw_rate,
                "raw_hset_rates": raw_rates,
                "embed_rate": embed_rate,
                "ratio_vs_raw": ratio(rate, raw_rate),
                "ratio_vs_bound": ratio(rate, bound),
                "round_ratios": [ratio(e, r) for e, r in zip(rates, raw_rates, strict=True)],
            }
            if sealed and (k, False) in e2e:  # the cost of encryption: sealed over plain, round by round
                plain = [r["rate"] for r in e2e[(k, False)]]
                row["ratio_vs_plain"] = ratio(rate, float(np.median(plain)))
                row["round_ratios_vs_plain"] = [ratio(e, p) for e, p in zip(rates, plain, strict=True)]
                row["publish_ratio_vs_plain"] = ratio(
                    float(np.median([r["publish_s"] for r in e2e[(k, False)]])), row["publish_s"]
                )
                plain_cpu = {
                    side: float(np.median([r["cpu_us_per_episode"][side] for r in e2e[(k, False)]]))
                    for side in cpu
                }
                row["cpu_ratio_vs_plain"] = {side: ratio(cpu[side], plain_cpu[side]) for side in cpu}
                row["cpu_ratio_vs_plain"]["total"] = ratio(sum(cpu.values()), sum(plain_cpu.values()))
            rows.append(row)
            print(
                f"  ingest {name} ×{k}{' sealed' if sealed else ''}: {rate:.0f} ep/s end to end (median of "
                f"{rounds}); raw HSET {raw_rate:.0f} ep/s; embedder alone {embed_rate:.0f} texts/s"
                + (f"; {row['ratio_vs_plain']:.2f} of plain" if "ratio_vs_plain" in row else "")
                + "; CPU µs/episode "
                + ", ".join(f"{side} {v:.0f}" for side, v in cpu.items())
                + (
                    f" (× {row['cpu_ratio_vs_plain']['total']:.2f} of plain in total)"
                    if sealed and "cpu_ratio_vs_plain" in row
                    else ""
                ),
                flush=True,
            )
    return rows


async def raw_write_rate(url: str, episodes: list[dict[str, Any]], embedder) -> dict[str, float]:
    """Embedder rate (in process) and pipelined-HSET rate of the same documents into the same schema."""
    from engram_episodic.validation import parse_episode
    from shared.index import VectorParams, embedding_text, ensure_episode_index, episode_fields
    from shared.keys import Keys
    from shared.partitions import check_partitions
    from shared.redis_conn import connect

    parsed = [parse_episode(e) for e in episodes]
    texts = [embedding_text(e) for e in parsed]
    with Timer() as t_embed:
        vectors = await embedder.embed(texts)
    keys = Keys(f"raw{uuid.uuid4().hex[:6]}:")
    r = connect(url)
    try:
        params = VectorParams(dim=vectors.shape[1])
        await check_partitions(r, keys, sealed=False)  # records this layout, as a service's start does
        tags = await ensure_episode_index(r, keys, 1, params, embedder.name, tag_key=None)
        docs = [
            (
                keys.episode_doc(1, NAMESPACE, e.episode_id),
                episode_fields(NAMESPACE, e, status="completed", vector=v, tags=tags),
            )
            for e, v in zip(parsed, vectors, strict=True)
        ]
        with Timer() as t_write:
            for start in range(0, len(docs), 500):
                async with r.pipeline(transaction=False) as pipe:
                    for key, fields in docs[start : start + 500]:
                        pipe.hset(key, mapping=fields)
                    await pipe.execute()
        await drop_prefix(r, keys)
    finally:
        await r.aclose()
    return {"rate": len(docs) / t_write.seconds, "embed_rate": len(texts) / t_embed.seconds}


async def pipeline_rate(
    url: str,
    episodes: list[dict[str, Any]],
    embedder: str,
    workers: int,
    args: argparse.Namespace,
    master_key: bytes | None = None,
    extra_env: dict[str, str] | None = None,
) -> dict[str, float]:
    """Start `workers` consolidators, wait until ready, publish every episode, wait until all are recallable.
    With `master_key`, the SDK seals the events and the workers open them (shared/crypto.py)."""
    import base64

    from engram_episodic.events import EpisodeCompleted
    from engram_episodic.validation import parse_episode
    from shared import streams
    from shared.index import Scope, count, index_exists
    from shared.keys import Keys
    from shared.redis_conn import connect
    from shared.sdk import EngramClient
    from shared.tags import BLAKE2B  # a namespace-only scope digests nothing: any generation's mode fits

    prefix = f"e2e{uuid.uuid4().hex[:6]}:"
    keys = Keys(prefix)
    env = service_env(url, prefix, embedder, ENGRAM_EMBED_DIM=str(DIM))
    env.update(extra_env or {})
    env.pop("ENGRAM_MASTER_KEY_FILE", None)
    env.pop("ENGRAM_MASTER_KEY", None)
    if master_key is not None:
        env["ENGRAM_MASTER_KEY"] = base64.b64encode(master_key).decode()
    procs = spawn_workers(workers, env, name=f"bench-{embedder}")
    r = connect(url)
    try:
        # ready = the index exists (a worker creates it after loading its embedder)
        async def ready() -> bool:
            check_alive(procs, "consolidator worker")
            return await index_exists(r, keys.episode_index_alias)

        await poll_until(ready, timeout=180, what="worker start")
        await asyncio.sleep(0.5 if workers == 1 else 2.0)  # let the second worker load its model too
        client = EngramClient(r, namespace=NAMESPACE, prefix=prefix, master_key=master_key)
        events = [
            EpisodeCompleted(
                namespace=NAMESPACE,
                episode_id=e["episode_id"],
                occurred_at=time.time(),
                episode=parse_episode(e),
            )
            for e in episodes
        ]
        from tqdm import tqdm

        bar = tqdm(
            total=len(events), desc=f"ingest {embedder} ×{workers}", unit="ep", leave=False, disable=None
        )
        cpu_before = (time.process_time(), proc_cpu(procs), await redis_cpu(r))
        started = time.perf_counter()
        for start in range(0, len(events), 100):
            await client.publish(events[start : start + 100])
        publish_s = time.perf_counter() - started
        publisher_cpu = time.process_time() - cpu_before[0]

        async def done() -> bool:
            # XINFO GROUPS first: an FT.SEARCH count of 10k documents costs Redis ~0.8 ms, ~3% of the
            # Redis time the pipeline is measured by when polled every 50 ms. RediSearch indexes as the
            # HSET runs, so once the group has nothing undelivered or unacked, the count is final.
            check_alive(procs, "consolidator worker")
            info = await streams.StreamGroup(r, keys.stream, Settings().consumer_group).info()
            if info["lag"] or info["pending"]:
                bar.update(max(0, len(events) - info["lag"] - info["pending"] - bar.n))
                return False
            n = await count(r, keys.episode_index_alias, Scope(namespace=NAMESPACE, tags=BLAKE2B))
            bar.update(max(0, n - bar.n))
            return n >= len(events)

        # every 10 ms: the end is overshot by half the interval on average, ~1.5% of a 2 s round at 50 ms
        await poll_until(done, timeout=args.timeout, interval=0.01, what=f"{len(events)} episodes recallable")
        elapsed = time.perf_counter() - started
        # CPU seconds per episode of each side: unlike the rates, barely moved by other load on the machine
        # (Redis's includes the 10 ms polls, the same for both sides of a comparison)
        cpu = {
            "publisher": publisher_cpu,
            "workers": proc_cpu(procs) - cpu_before[1],
            "redis": await redis_cpu(r) - cpu_before[2],
        }
        bar.close()
    finally:
        stop_processes(procs)
        await drop_prefix(r, keys)
        await r.aclose()
    return {
        "rate": len(episodes) / elapsed,
        "publish_s": publish_s,
        "cpu_us_per_episode": {k: 1e6 * v / len(episodes) for k, v in cpu.items()},
    }


# --- phase "ingest-real": real texts with the default embedder ---------------------------------------------


async def real_ingest_phase(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per text kind (LoCoMo turns, 2,000-character texts) and per (threads, embed batch) variant: rounds
    of (the embedder alone on the texts, in calls of the workers' batch size as a worker reads them; then one
    consolidator process projecting the same texts published through the SDK, until all are
    recallable). Rates are texts/s; the ratio is of the medians of the interleaved rounds."""
    from bench.perf_corpus import long_texts, real_texts
    from engram_episodic.validation import parse_episode
    from shared.embedding import make_embedder
    from shared.index import embedding_text

    turns, _, source = real_texts()
    kinds = {
        "dialogue turns": turns[: args.ingest_turns],
        "2,000-character texts": long_texts(turns, args.ingest_long),
    }
    rows = []
    for threads in args.ingest_threads:
        for embed_batch in (DEFAULTS.embed_batch_size,):
            settings = Settings(
                embedder=args.recall_embedder, embed_threads=threads, embed_batch_size=embed_batch
            )
            embedder = make_embedder(settings)
            await embedder.load()
            try:
                for kind, texts in kinds.items():
                    now = time.time()
                    episodes = [
                        {
                            "episode_id": f"r-{i}",
                            "task": t,
                            "outcome": "success",
                            "agent_id": "speaker",
                            "completed_at": now,
                        }
                        for i, t in enumerate(texts)
                    ]
                    seen = [embedding_text(parse_episode(e)) for e in episodes]  # what the worker embeds
                    alone, alone_cpu, e2e = [], [], []
                    for _ in range(args.real_rounds):
                        cpu0 = time.process_time()  # every thread of this process: the model's too
                        with Timer() as t_alone:
                            for start in range(0, len(seen), DEFAULTS.batch_size):
                                await embedder.embed(seen[start : start + DEFAULTS.batch_size])
                        alone.append(len(seen) / t_alone.seconds)
                        alone_cpu.append(1e6 * (time.process_time() - cpu0) / len(seen))
                        e2e.append(
                            await pipeline_rate(
                                url,
                                episodes,
                                args.recall_embedder,
                                1,
                                args,
                                extra_env={"ENGRAM_EMBED_THREADS": str(threads)},
                            )
                        )
                    rate = float(np.median([r["rate"] for r in e2e]))
                    alone_rate = float(np.median(alone))
                    row = {
                        "kind": kind,
                        "source": source,
                        "embedder": embedder.name,
                        "backend": getattr(embedder, "runs_on", "n/a"),
                        "threads": threads,
                        "embed_batch": embed_batch,
                        "texts": len(texts),
                        "mean_chars": float(np.mean([len(t) for t in seen])),
                        "rounds": args.real_rounds,
                        "e2e_rate": rate,
                        "e2e_rates": [r["rate"] for r in e2e],
                        "embed_rate": alone_rate,
                        "embed_rates": alone,
                        "ratio_vs_embedder": ratio(rate, alone_rate),
                        "cpu_us_per_episode": e2e[-1]["cpu_us_per_episode"],
                        "embed_cpu_us_per_text": float(np.median(alone_cpu)),
                    }
                    # CPU seconds barely move with the machine's other load, unlike the rates: the
                    # share of the worker's CPU per episode that the model alone needs for the same text
                    worker_cpu = float(np.median([r["cpu_us_per_episode"]["workers"] for r in e2e]))
                    row["cpu_ratio_vs_embedder"] = ratio(row["embed_cpu_us_per_text"], worker_cpu)
                    rows.append(row)
                    print(
                        f"  ingest {kind} ({embedder.name}/{row['backend']}, {threads} threads, batch "
                        f"{embed_batch}): {rate:.1f}/s end to end, embedder alone {alone_rate:.1f}/s "
                        f"(×{row['ratio_vs_embedder']:.2f}); CPU per text: model alone / worker ×{row['cpu_ratio_vs_embedder']:.2f}",
                        flush=True,
                    )
            finally:
                await embedder.aclose()
    return rows


def render_real_ingest(rows: list[dict[str, Any]]) -> str:
    """The real-text ingest table (Markdown)."""
    from bench.common import table

    body = [
        [
            r["kind"],
            r["backend"],
            r["threads"],
            r["embed_batch"],
            r["texts"],
            r["mean_chars"],
            r["e2e_rate"],
            r["embed_rate"],
            r["ratio_vs_embedder"],
            r["cpu_ratio_vs_embedder"],
        ]
        for r in rows
    ]
    return (
        f"\nIngest of real texts with the default embedder ({rows[0]['embedder']}, {rows[0]['source']}), "
        "publish → recallable, one worker (texts/s; medians of interleaved rounds):\n\n"
        + table(
            [
                "texts",
                "backend",
                "threads",
                "embed batch",
                "n",
                "mean chars",
                "end to end",
                "embedder alone",
                "ratio",
                "CPU/text: model alone / worker",
            ],
            body,
        )
    )
