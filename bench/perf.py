"""The performance suite (`make bench`): every figure next to its baseline measured in the same run.

Phases (sizes are options). On 2 shared cores, measured phase by phase: ingest + index ~3-10 minutes,
recall 4-8, ingest-real ~7 (so ~15-25 for the defaults; not timed as one invocation); `--quick` 6.6
minutes at load ~3. The first run also embeds the recall corpus once (~7 minutes), then it is cached:

1. ingest end to end: publish N synthetic episodes through the SDK while K consolidator processes
   (`python -m services.consolidator run`, ENGRAM_EMBEDDER=hashing|minilm) project them, until every
   one is recallable; vs the raw Redis write rate = pipelined HSET of the same documents (vectors
   precomputed) into an index with the same schema, measured in rounds interleaved with the pipeline
   runs (`--repeats`, medians). For minilm the embedder's own rate (in process, same thread count) is
   reported too, since no pipeline can beat it.
2. index cost: seed 10k then 100k episodes by the fast path (`shared.index.episode_fields` + pipelined
   HSET; clustered random unit vectors, 384 dims) into an HNSW index and a FLAT index; insert rate,
   memory per episode (INFO memory, FT.INFO), KNN latency and recall@10 against the exact answer.
3. recall latency: 16 concurrent clients on `POST /v1/recall` of a query-service process vs 16 concurrent
   raw `FT.SEARCH` KNN with the same filter, the same k and the same returned fields, vs an exact numpy
   scan in process; p50/p99 and throughput at 10k and 100k episodes.
4. recall with the default embedder (bench.perf_recall): 10k then 100k episodes in one namespace, built
   from real vectors (bench.perf_corpus), 1 / 8 / 16 clients through the query service embedding every
   query, vs the floor = the model's pass + one raw FT.SEARCH; Redis CPU per recall, and where it goes
   (SLOWLOG, by part of the recall).
5. ingest of real texts with the default embedder (bench.perf_ingest): LoCoMo turns and 2,000-character
   texts end to end, vs the embedder alone on the same texts.

Results: a table on stdout and `bench/results.json`. The machine is shared with other work; the load
average at the start is recorded with the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    ROOT,
    ClientPool,
    concurrent,
    drop_prefix,
    int_list,
    machine,
    percentile_ms,
    private_redis,
    ratio,
    service_env,
    spawn_query_service,
    stop_processes,
    table,
    wait_http_ready,
    write_json,
)
from bench.perf_corpus import CACHE_DIR
from bench.perf_ingest import (
    _NOUNS,
    _TAILS,
    _VERBS,
    DIM,
    NAMESPACE,
    ingest_phase,
    real_ingest_phase,
    render_real_ingest,
    synthetic_episode,
)
from bench.perf_recall import recall_phase, render_recall


# --- phase 2 and 3: index cost and recall latency -------------------------------------------------------------
def clustered_vectors(n: int, rng: np.random.Generator, centers: np.ndarray) -> np.ndarray:
    """Unit vectors around random cluster centres (more like text embeddings than uniform noise)."""
    idx = rng.integers(0, centers.shape[0], size=n)
    unit = centers / np.linalg.norm(centers, axis=1, keepdims=True)
    # noise of norm ~0.8 around a unit centre: members of one cluster have cosine ~0.6 to each other
    v = unit[idx] + 0.8 * rng.standard_normal((n, DIM)).astype(np.float32) / math.sqrt(DIM)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


class Seeder:
    """Writes documents by the fast path into one index (one prefix, one algorithm)."""

    def __init__(self, r, algorithm: str, embedder_name: str, args: argparse.Namespace):
        from shared.keys import Keys

        self.r = r
        self.algorithm = algorithm
        self.embedder_name = embedder_name
        self.keys = Keys(f"{algorithm.lower()}{uuid.uuid4().hex[:6]}:")
        self.args = args
        self.n = 0

    async def create(self) -> None:
        from shared.index import VectorParams, ensure_episode_index
        from shared.partitions import check_partitions

        params = VectorParams(
            dim=DIM,
            algorithm=self.algorithm,
            m=self.args.hnsw_m,
            ef_construction=self.args.hnsw_ef_construction,
            ef_runtime=self.args.hnsw_ef_runtime,
        )
        await check_partitions(
            self.r, self.keys, sealed=False
        )  # records this layout, as a service's start does
        self.tags = await ensure_episode_index(self.r, self.keys, 1, params, self.embedder_name, tag_key=None)

    async def add(self, vectors: np.ndarray) -> float:
        """Insert the next len(vectors) episodes; returns the insert rate (episodes/s, HSET pipelined)."""
        from tqdm import tqdm

        from engram_episodic.validation import parse_episode
        from shared.index import episode_fields

        rng = np.random.default_rng(self.n)
        docs = []
        for j, v in enumerate(vectors):
            i = self.n + j
            e = parse_episode(synthetic_episode(i, rng))
            docs.append(
                (
                    self.keys.episode_doc(1, NAMESPACE, e.episode_id),
                    episode_fields(NAMESPACE, e, status="completed", vector=v, tags=self.tags),
                )
            )
        bar = tqdm(
            total=len(docs),
            desc=f"seed {self.algorithm} to {self.n + len(docs):,}",
            unit="ep",
            leave=False,
            disable=None,
        )
        started = time.perf_counter()
        for start in range(0, len(docs), 1000):
            async with self.r.pipeline(transaction=False) as pipe:
                for key, fields in docs[start : start + 1000]:
                    pipe.hset(key, mapping=fields)
                await pipe.execute()
            bar.update(min(1000, len(docs) - start))
        elapsed = time.perf_counter() - started
        bar.close()
        self.n += len(docs)
        return len(docs) / elapsed

    async def knn_ids(self, q: np.ndarray, k: int, ef: int | None = None) -> list[int]:
        import orjson

        from services.query.recall.arms import knn_search
        from shared.index import Scope

        # the ids from the documents: the episode_id TAG field holds their digests (shared.tags)
        hits = await knn_search(
            self.r,
            self.keys.episode_index_alias,
            Scope(namespace=NAMESPACE, tags=self.tags),
            q,
            k,
            return_fields=("doc",),
            ef_runtime=ef,
        )
        return [int(orjson.loads(h.fields[b"doc"])["episode_id"].split("-")[1]) for h in hits]


async def used_memory(r) -> int:
    return int((await r.info("memory"))["used_memory"])


async def ft_info_mb(r, index: str) -> dict[str, float]:
    raw = await r.execute_command("FT.INFO", index)
    info = {
        raw[i].decode() if isinstance(raw[i], bytes) else raw[i]: raw[i + 1]
        for i in range(0, len(raw) - 1, 2)
    }
    out = {}
    for name in (
        "vector_index_sz_mb",
        "inverted_sz_mb",
        "doc_table_size_mb",
        "offset_vectors_sz_mb",
        "sortable_values_size_mb",
        "key_table_size_mb",
        "tag_overhead_sz_mb",
        "text_overhead_sz_mb",
        "total_index_memory_sz_mb",
    ):
        with_value = info.get(name)
        if with_value is not None:
            try:
                out[name] = float(with_value)
            except (TypeError, ValueError):
                pass
    return out


def exact_topk(matrix: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    scores = matrix @ q
    top = np.argpartition(-scores, k)[:k]
    return top[np.argsort(-scores[top])]


async def index_phase(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Seed HNSW and FLAT indexes to each size; measure inserts, memory, KNN quality and recall latency."""

    from shared.embedding import HashingEmbedder
    from shared.redis_conn import connect

    rng = np.random.default_rng(42)
    centers = rng.standard_normal((200, DIM)).astype(np.float32)
    sizes = sorted(args.sizes)
    all_vectors = clustered_vectors(sizes[-1], rng, centers)
    hashing = HashingEmbedder(DIM)
    words = [w for t in (_VERBS + _NOUNS + _TAILS) for w in t.split()]
    query_texts = [" ".join(rng.choice(words, size=8)) for _ in range(256)]
    query_vecs = hashing.embed_sync(query_texts)
    # queries for quality: perturbed stored vectors (a hashing query vector is unrelated to the synthetic ones)
    quality_q = all_vectors[
        rng.integers(0, sizes[0], size=args.quality_queries)
    ] + 0.05 * rng.standard_normal((args.quality_queries, DIM)).astype(np.float32)
    quality_q /= np.linalg.norm(quality_q, axis=1, keepdims=True)
    t_embed = []
    for text in query_texts[:100]:
        t0 = time.perf_counter()
        await hashing.embed([text])
        t_embed.append(time.perf_counter() - t0)
    embed_ms = percentile_ms(t_embed, 50)

    r = connect(url, max_connections=64) if _accepts_max(connect) else connect(url)
    result: dict[str, Any] = {"sizes": {}, "query_embed_ms_p50": embed_ms}
    seeders = {alg: Seeder(r, alg, hashing.name, args) for alg in ("HNSW", "FLAT")}
    for s in seeders.values():
        await s.create()
    mem_base = await used_memory(r)
    holder: dict[str, Any] = {"proc": None, "base": None}
    try:
        prev = 0
        for size in sizes:
            row: dict[str, Any] = {}
            for alg, s in seeders.items():
                before = await used_memory(r)
                rate = await s.add(all_vectors[prev:size])
                after = await used_memory(r)
                info = await ft_info_mb(r, s.keys.episode_index_alias)
                lat = []
                recalls = []
                matrix = all_vectors[:size]
                for q in quality_q:
                    t0 = time.perf_counter()
                    got = await s.knn_ids(q, 10)
                    lat.append(time.perf_counter() - t0)
                    exact = set(exact_topk(matrix, q, 10).tolist())
                    recalls.append(len(exact & set(got)) / 10)
                row[alg] = {
                    "insert_rate": rate,
                    "bytes_per_episode_added": (after - before) / (size - prev),
                    "knn10_p50_ms": percentile_ms(lat, 50),
                    "knn10_p99_ms": percentile_ms(lat, 99),
                    "recall_at_10": float(np.mean(recalls)),
                    "ft_info_mb": info,
                }
                if alg == "HNSW":
                    for ef in args.ef_sweep:
                        recalls, lat = [], []
                        for q in quality_q:
                            t0 = time.perf_counter()
                            got = await s.knn_ids(q, 10, ef=ef)
                            lat.append(time.perf_counter() - t0)
                            recalls.append(len(set(exact_topk(matrix, q, 10).tolist()) & set(got)) / 10)
                        row[alg][f"ef{ef}"] = {
                            "recall_at_10": float(np.mean(recalls)),
                            "knn10_p50_ms": percentile_ms(lat, 50),
                        }
                print(
                    f"  {alg} {size:,}: insert {rate:.0f} ep/s, KNN10 p50 {row[alg]['knn10_p50_ms']:.2f} ms, "
                    f"recall@10 {row[alg]['recall_at_10']:.3f}",
                    flush=True,
                )
            row["used_memory_bytes_per_episode"] = (await used_memory(r) - mem_base) / (2 * size)
            row["latency"] = await latency_at(
                url, r, seeders["HNSW"], all_vectors[:size], query_texts, query_vecs, args, holder
            )
            result["sizes"][str(size)] = row
            prev = size
    finally:
        if holder["proc"] is not None:
            stop_processes([holder["proc"]])
        for s in seeders.values():
            await drop_prefix(r, s.keys)
        await r.aclose()
    return result


def _accepts_max(connect) -> bool:
    import inspect

    return "max_connections" in inspect.signature(connect).parameters


async def latency_at(
    url: str,
    r,
    seeder: Seeder,
    matrix: np.ndarray,
    query_texts: list[str],
    query_vecs: np.ndarray,
    args: argparse.Namespace,
    holder: dict[str, Any],
) -> dict[str, Any]:
    """16 concurrent clients: POST /v1/recall vs raw FT.SEARCH KNN (same filter, k, fields) vs numpy scan."""
    from engram_episodic import ApiError
    from engram_episodic.client import Calls
    from services.query.recall import RETURN_FIELDS
    from services.query.recall.arms import knn_search
    from shared.index import Scope

    if holder["proc"] is None:
        port = _free_port()
        env = service_env(
            url,
            seeder.keys.prefix,
            "hashing",
            ENGRAM_EMBED_DIM=str(DIM),
            ENGRAM_VECTOR_ALGORITHM="HNSW",
            ENGRAM_DEFAULT_NAMESPACE=NAMESPACE,
        )
        holder["proc"] = spawn_query_service(env, port)
        holder["base"] = f"http://127.0.0.1:{port}"
        await wait_http_ready(holder["base"], holder["proc"])
    base = holder["base"]
    top_k, cand = args.top_k, 2 * args.top_k
    n_req, clients = args.requests, args.clients
    out: dict[str, Any] = {"clients": clients, "requests": n_req, "top_k": top_k, "candidates": cand}

    # `clients` keep-alive connections; each request sent once (a retry would hide an error in the
    # latencies), within the 300 s the aiohttp session allowed
    async with ClientPool(base, clients, 300.0, max_retries=0) as memory:

        async def service(i: int) -> None:
            call = Calls.recall(query_texts[i % len(query_texts)], top_k=top_k, mode="vector")
            try:
                payload = await memory.call(call.as_json())  # the JSON as it came: no per-hit parsing
            except ApiError as exc:
                raise RuntimeError(f"/v1/recall → {exc}: the service must see the seeded namespace") from exc
            if len(payload["results"]) != top_k:
                raise RuntimeError(
                    f"/v1/recall → {len(payload['results'])} results, expected {top_k}: "
                    f"the service must see the seeded namespace"
                )

        await concurrent(clients, 32, service)  # warm-up
        lat, wall = await concurrent(clients, n_req, service)
    out["service"] = {"p50_ms": percentile_ms(lat, 50), "p99_ms": percentile_ms(lat, 99), "qps": n_req / wall}

    scope = Scope(namespace=NAMESPACE, tags=seeder.tags)

    # the raw query as RediSearch plans it (HYBRID_POLICY left to the module), then in batches as the
    # service now runs a broad filter's KNN (services.query.recall.arms): the second is the floor to compare with
    for name, policy in (("raw_ft_search", None), ("raw_ft_search_batches", "BATCHES")):

        async def raw(i: int, policy: str | None = policy) -> None:
            await knn_search(
                r,
                seeder.keys.episode_index_alias,
                scope,
                query_vecs[i % len(query_vecs)],
                cand,
                return_fields=RETURN_FIELDS,
                policy=policy,
            )

        await concurrent(clients, 32, raw)
        lat, wall = await concurrent(clients, n_req, raw)
        out[name] = {"p50_ms": percentile_ms(lat, 50), "p99_ms": percentile_ms(lat, 99), "qps": n_req / wall}

    lat = []
    started = time.perf_counter()
    for i in range(min(n_req, 400)):
        t0 = time.perf_counter()
        exact_topk(matrix, query_vecs[i % len(query_vecs)], cand)
        lat.append(time.perf_counter() - t0)
    wall = time.perf_counter() - started
    out["numpy_scan"] = {
        "p50_ms": percentile_ms(lat, 50),
        "p99_ms": percentile_ms(lat, 99),
        "qps": len(lat) / wall,
        "note": "one thread, vectors already in process memory",
    }
    print(
        f"  recall {len(matrix):,}: service p50 {out['service']['p50_ms']:.1f} ms "
        f"({out['service']['qps']:.0f}/s), raw FT.SEARCH p50 {out['raw_ft_search']['p50_ms']:.1f} ms "
        f"({out['raw_ft_search']['qps']:.0f}/s), in batches {out['raw_ft_search_batches']['p50_ms']:.1f} ms "
        f"({out['raw_ft_search_batches']['qps']:.0f}/s), numpy p50 {out['numpy_scan']['p50_ms']:.2f} ms",
        flush=True,
    )
    return out


def _free_port() -> int:
    from deploy.embedded_redis import free_port

    return free_port()


# --- output ---------------------------------------------------------------------------------------------------
def _span(values: list[float] | None) -> str:
    """'0.71–0.83' for a list of per-round ratios ('' for none)."""
    if not values:
        return ""
    return f"{min(values):.2f}–{max(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def render(res: dict[str, Any]) -> str:
    parts = []
    if res.get("ingest"):
        rows = [
            [
                r["embedder"],
                r["workers"],
                "yes" if r.get("sealed") else "no",
                r["episodes"],
                r.get("rounds", 1),
                r["e2e_rate"],
                r["raw_hset_rate"],
                r["ratio_vs_raw"],
                _span(r.get("round_ratios")),
                r["embed_rate"],
                r["ratio_vs_bound"],
                r.get("ratio_vs_plain", math.nan),
            ]
            for r in res["ingest"]
        ]
        parts.append(
            "Ingest, publish → recallable (episodes/s; medians of interleaved rounds):\n\n"
            + table(
                [
                    "embedder",
                    "workers",
                    "sealed",
                    "episodes",
                    "rounds",
                    "end to end",
                    "raw HSET (same index)",
                    "ratio",
                    "ratio per round",
                    "embedder alone",
                    "ratio vs min(raw, embedder)",
                    "sealed / plain",
                ],
                rows,
            )
        )
    idx = res.get("index")
    if idx:
        rows = []
        for size, row in idx["sizes"].items():
            for alg in ("HNSW", "FLAT"):
                a = row[alg]
                rows.append(
                    [
                        f"{int(size):,}",
                        alg,
                        a["insert_rate"],
                        a["knn10_p50_ms"],
                        a["knn10_p99_ms"],
                        a["recall_at_10"],
                        a["bytes_per_episode_added"],
                        a["ft_info_mb"].get("vector_index_sz_mb", math.nan),
                    ]
                )
        parts.append(
            "\nVector index, 384 dims, COSINE (raw FT.SEARCH KNN 10, one client):\n\n"
            + table(
                [
                    "episodes",
                    "algorithm",
                    "insert/s",
                    "KNN p50 ms",
                    "KNN p99 ms",
                    "recall@10 vs exact",
                    "bytes/episode (INFO memory)",
                    "vector index MB (FT.INFO)",
                ],
                rows,
            )
        )
        ef_rows = []
        for size, row in idx["sizes"].items():
            for key, v in row["HNSW"].items():
                if key.startswith("ef"):
                    ef_rows.append([f"{int(size):,}", key[2:], v["recall_at_10"], v["knn10_p50_ms"]])
        if ef_rows:
            parts.append(
                "\nHNSW EF_RUNTIME sweep:\n\n"
                + table(["episodes", "EF_RUNTIME", "recall@10", "p50 ms"], ef_rows)
            )
        rows = []
        for size, row in idx["sizes"].items():
            lat = row["latency"]
            s, raw, npy = lat["service"], lat["raw_ft_search"], lat["numpy_scan"]
            target = 1.5 * raw["p50_ms"] + idx["query_embed_ms_p50"]
            rows.append(
                [
                    f"{int(size):,}",
                    s["p50_ms"],
                    s["p99_ms"],
                    s["qps"],
                    raw["p50_ms"],
                    raw["p99_ms"],
                    raw["qps"],
                    ratio(s["p50_ms"], raw["p50_ms"]),
                    target,
                    "yes" if s["p50_ms"] <= target else "no",
                    npy["p50_ms"],
                    npy["qps"],
                ]
            )
        parts.append(
            f"\nRecall, {lat['clients']} concurrent clients, top_k {lat['top_k']} "
            f"(KNN {lat['candidates']}), {lat['requests']} requests; query embedding (hashing) p50 "
            f"{idx['query_embed_ms_p50']:.2f} ms:\n\n"
            + table(
                [
                    "episodes",
                    "service p50",
                    "p99",
                    "req/s",
                    "raw FT.SEARCH p50",
                    "p99",
                    "req/s",
                    "p50 ratio",
                    "target 1.5×raw+embed",
                    "met",
                    "numpy scan p50",
                    "numpy q/s",
                ],
                rows,
            )
        )
        mem = [
            [
                f"{int(size):,}",
                row["used_memory_bytes_per_episode"],
                row["HNSW"]["ft_info_mb"].get("total_index_memory_sz_mb", math.nan),
                row["FLAT"]["ft_info_mb"].get("total_index_memory_sz_mb", math.nan),
            ]
            for size, row in idx["sizes"].items()
        ]
        parts.append(
            "\nMemory:\n\n"
            + table(
                [
                    "episodes",
                    "bytes/episode (INFO used_memory, avg of both)",
                    "HNSW index total MB (FT.INFO)",
                    "FLAT index total MB",
                ],
                mem,
            )
        )
    if res.get("recall"):
        parts.append(render_recall(res["recall"]))
    if res.get("ingest_real"):
        parts.append(render_real_ingest(res["ingest_real"]))
    return "\n".join(parts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.perf", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--phases",
        default="ingest,index,recall,ingest-real",
        help="comma-separated: ingest, index, recall (default embedder), ingest-real (default embedder)",
    )
    p.add_argument("--embedders", default="hashing,minilm", type=lambda s: s.split(","))
    p.add_argument("--workers", default="1,2", type=int_list)
    p.add_argument("--ingest-hashing", type=int, default=10_000, help="episodes per hashing ingest run")
    p.add_argument("--ingest-minilm", type=int, default=2_000, help="episodes per minilm ingest run")
    p.add_argument(
        "--encryption",
        choices=("off", "on", "both"),
        default="off",
        help="ingest without a master key, with one (sealed stream), or both interleaved per round",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="interleaved rounds of raw HSET and pipeline with the hashing embedder (medians)",
    )
    p.add_argument("--sizes", default="10000,100000", type=int_list)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=1600, help="recall requests per measurement")
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--quality-queries", type=int, default=200, help="queries for HNSW recall@10")
    p.add_argument("--ef-sweep", default="50,200", type=lambda s: [int(x) for x in s.split(",") if x])
    p.add_argument("--hnsw-m", type=int, default=16)
    p.add_argument("--hnsw-ef-construction", type=int, default=200)
    p.add_argument("--hnsw-ef-runtime", type=int, default=100)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a projection")
    g = p.add_argument_group("default embedder (phases recall and ingest-real)")
    g.add_argument("--recall-embedder", default="auto", help="ENGRAM_EMBEDDER of those phases")
    g.add_argument(
        "--recall-sizes",
        default="10000,100000",
        type=int_list,
        help="episodes in the one namespace, seeded in turn; throughput is compared largest vs smallest",
    )
    g.add_argument(
        "--recall-mode",
        default="default",
        choices=("default", "hybrid", "vector", "keyword"),
        help="the recall request's mode (default: none sent, i.e. the service's default, hybrid)",
    )
    g.add_argument(
        "--recall-reward",
        default="continuous",
        choices=("continuous", "coarse", "none"),
        help="the documents' reward: ~2^32 distinct values, {0, 1}, or none (LoCoMo turns carry none)",
    )
    g.add_argument("--recall-clients", default="1,8,16", type=int_list)
    g.add_argument(
        "--recall-requests", type=int, default=20, help="recalls per client (at least twice this in all)"
    )
    g.add_argument(
        "--recall-profile",
        type=int,
        default=20,
        help="sequential recalls per size profiled with SLOWLOG (where Redis's time goes; 0 = off)",
    )
    g.add_argument(
        "--console-requests",
        type=int,
        default=20,
        help="queries asked of the console's recall playground at the largest size (0 = off; bench.perf_console)",
    )
    g.add_argument("--raw-requests", type=int, default=200, help="sequential raw FT.SEARCH for the floor")
    g.add_argument(
        "--floor-passes", type=int, default=10, help="model passes before each client count's service run"
    )
    g.add_argument(
        "--corpus-texts", type=int, default=5000, help="real texts embedded (once, cached) for the corpus"
    )
    g.add_argument(
        "--corpus-noise", type=float, default=0.3, help="norm of the noise added to derived vectors"
    )
    g.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help="where corpus vectors are cached")
    g.add_argument(  # a round of 256 lasted ~3 s with bf16 documents: a fresh worker's first passes weighed
        "--ingest-turns", type=int, default=2048, help="LoCoMo turns per real-text ingest run"
    )
    g.add_argument(
        "--ingest-long", type=int, default=96, help="2,000-character texts per real-text ingest run"
    )
    g.add_argument("--real-rounds", type=int, default=2, help="interleaved rounds of real-text ingest")
    g.add_argument(
        "--ingest-threads",
        default="2",
        type=int_list,
        help="ENGRAM_EMBED_THREADS",
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results.json"))
    p.add_argument(
        "--peer",
        choices=("agent-memory-server",),
        help="run the LoCoMo side-by-side with this peer instead (bench/peer.py; the options after it are its own)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes for routine use: hashing ingest 3k, index and recall 2k/10k, 128 turns, 12 long texts",
    )
    args = p.parse_args(argv)
    if args.quick:  # overrides the sizes (a full run is the default: `make bench`)
        args.ingest_hashing, args.ingest_minilm, args.repeats = 3000, 500, 2
        args.sizes, args.recall_sizes, args.requests = [2000, 10000], [2000, 10000], 400
        args.ingest_turns, args.ingest_long, args.recall_requests = 128, 12, 10
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {"machine": machine(), "args": {k: v for k, v in vars(args).items()}}
    phases = args.phases.split(",")
    steps = (  # (phase, what it measures, result key, runner), in this order
        ("ingest", "ingest end to end", "ingest", ingest_phase),
        ("index", "index cost and recall latency", "index", index_phase),
        ("recall", "recall with the default embedder", "recall", recall_phase),
        ("ingest-real", "ingest of real texts with the default embedder", "ingest_real", real_ingest_phase),
    )
    with private_redis() as server:
        for phase, what, key, measure in steps:
            if phase in phases:
                print(f"phase: {what}", flush=True)
                res[key] = await measure(server.url, args)
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--peer" in argv:  # the side-by-side has its own harness and options (python -m bench.peer --help)
        from bench.peer import main as peer_main

        at = argv.index("--peer")
        parse_args(argv[at : at + 2])  # refuses an unknown peer with argparse's message
        return peer_main(argv[:at] + argv[at + 2 :])
    args = parse_args(argv)
    started = time.perf_counter()
    res = asyncio.run(run(args))
    res["wall_s"] = time.perf_counter() - started
    write_json(Path(args.out), res)
    print()
    print(render(res))
    print(
        f"\nwrote {args.out} ({res['wall_s']:.0f}s; load average at start {res['machine'].get('loadavg_1m')})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
