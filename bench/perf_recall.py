"""`make bench`'s recall phase with the default embedder: one namespace seeded to each size
(10k and 100k episodes by default), 1 / 8 / 16 concurrent clients on `POST /v1/recall` of a real
query-service process that embeds every query itself (the default embedder, `auto` → mpnet, its
queries on OpenVINO bfloat16 in shared passes where the CPU has it, else ONNX Runtime's int8 graph one
text per pass; its query cache off, so each request runs the model), against the floor measured in the same
run.

The corpus (bench.perf_corpus): every LoCoMo dialogue turn embedded once by the same embedder and
cached; the documents are derived from those real vectors (+ small noise, distinct texts) and written
straight into the index's key layout by `shared.index.episode_fields`, the consolidator's own document
builder, so the service reads what a consolidator would have written. The queries are LoCoMo questions,
embedded live by the service.

The floor at c clients = one forward pass of c queries in this process (the embedder the service
embeds queries with, `make_embedder(..., role="query")`: same model, query backend and threads: c concurrent recalls share one pass, `ENGRAM_QUERY_BATCH`) + one raw `FT.SEARCH` of the
same query (the KNN the service runs: `candidates` 100 deep, the service's hybrid policy, one client).
Reported: p50 / p95 / p99 and recalls/s per size and client count, their ratios to the floor, and
Redis CPU per recall (INFO used_cpu deltas over the requests).
"""

from __future__ import annotations

import argparse
import os
import re
import time
import uuid
from typing import Any

import numpy as np

from bench.common import (
    ClientPool,
    concurrent,
    drop_prefix,
    percentile_ms,
    ratio,
    redis_cpu,
    service_env,
    spawn_query_service,
    stop_processes,
    table,
    wait_http_ready,
)
from bench.perf_console import playground_vs_api, render_console
from bench.perf_corpus import cached_vectors, derive, derived_text, real_texts

NAMESPACE = "bench"
CANDIDATES = 100  # the service's default `candidates` per similarity list (api.md): the KNN it runs


REWARDS = ("continuous", "coarse", "none")
"""`--recall-reward`: a reward of ~2^32 distinct values, one of {0, 1} (three in four 1), or none."""


def _episode(
    i: int, text: str, completed_at: float, *, feedback: bool, reward: str = "continuous"
) -> dict[str, Any]:
    """A derived document as bench.locomo publishes a turn (the turn is the task), with an agent
    episode's outcome, importance and, when `feedback`, a reward (deterministic in i) of the kind
    `reward` names (REWARDS; "none" is as `feedback` False: LoCoMo turns carry none)."""
    episode: dict[str, Any] = {
        "episode_id": f"t-{i}",
        "task": text,
        "outcome": ("success", "partial", "failure")[i % 3],
        "importance": 1 + i % 10,
        "agent_id": f"speaker-{i % 2}",
        "completed_at": completed_at,
    }
    if feedback and reward == "continuous":
        # Knuth's multiplicative hash of i: no two episodes tie at the top-by-reward list's boundary
        episode["feedback"] = {"reward": ((i * 2654435761) % 2**32) / 2**32}
    elif feedback and reward == "coarse":  # a thumbs up / down: tens of thousands tie at the boundary
        episode["feedback"] = {"reward": 0.0 if i % 4 == 3 else 1.0}
    return episode


class CorpusSeeder:
    """Writes derived documents into one generation-1 episode index with the service's own settings
    (`shared.settings.Settings`: HNSW M / EF_CONSTRUCTION / EF_RUNTIME) by pipelined HSET."""

    def __init__(
        self,
        r,
        embedder_name: str,
        dim: int,
        texts: list[str],
        vectors: np.ndarray,
        *,
        feedback: bool = True,
        reward: str = "continuous",
    ):
        from shared.keys import Keys

        self.r = r
        self.embedder_name = embedder_name
        self.dim = dim
        self.keys = Keys(f"rc{uuid.uuid4().hex[:6]}:")
        self.texts = texts
        self.vectors = vectors  # float32[max size, dim], derived
        self.n = 0
        self.now = time.time()
        self.feedback = feedback
        self.reward = reward

    async def create(self) -> None:
        from shared.index import VectorParams, ensure_episode_index
        from shared.partitions import check_partitions
        from shared.settings import Settings

        params = VectorParams.of(Settings(), self.dim)
        await check_partitions(
            self.r, self.keys, sealed=False
        )  # records this layout, as a service's start does
        self.tags = await ensure_episode_index(self.r, self.keys, 1, params, self.embedder_name, tag_key=None)

    async def grow(self, size: int) -> float:
        """Add documents up to `size`; returns the insert rate (documents/s)."""
        from engram_episodic.validation import parse_episode
        from shared.index import episode_fields

        total = len(self.vectors)
        started = time.perf_counter()
        for start in range(self.n, size, 1000):
            async with self.r.pipeline(transaction=False) as pipe:
                for i in range(start, min(start + 1000, size)):
                    # one a minute, the newest now: recency spreads over ~70 days at 100k
                    e = parse_episode(
                        _episode(
                            i,
                            derived_text(self.texts, i),
                            self.now - 60.0 * (total - i),
                            feedback=self.feedback,
                            reward=self.reward,
                        )
                    )
                    fields = episode_fields(
                        NAMESPACE, e, status="completed", vector=self.vectors[i], tags=self.tags
                    )
                    pipe.hset(self.keys.episode_doc(1, NAMESPACE, e.episode_id), mapping=fields)
                await pipe.execute()
        rate = (size - self.n) / (time.perf_counter() - started)
        self.n = size
        return rate


async def model_pass(embedder: Any, queries: list[str], c: int, passes: int, offset: int) -> dict[str, float]:
    """The time of one forward pass of `c` distinct queries in this process: p50 / p95 of `passes`
    passes, ms. Measured right before the service at the same client count, so the shared machine's
    drifting load falls on both alike."""
    lat = []
    for p in range(passes):
        batch = [queries[(offset + p * c + j) % len(queries)] for j in range(c)]
        t0 = time.perf_counter()
        await embedder.embed(batch)
        lat.append(time.perf_counter() - t0)
    return {"pass_p50_ms": percentile_ms(lat, 50), "pass_p95_ms": percentile_ms(lat, 95)}


async def raw_knn(r, seeder: CorpusSeeder, vectors: np.ndarray, size: int, n: int) -> dict[str, float]:
    """One client, `n` raw `FT.SEARCH` KNN of the query vectors, as the service sends them: the namespace
    scope, KNN `CANDIDATES`, the service's hybrid policy for this scope's size, its returned fields."""
    from services.query.recall import RETURN_FIELDS
    from services.query.recall.arms import hybrid_policy, knn_search
    from shared.index import Scope

    scope = Scope(namespace=NAMESPACE, tags=seeder.tags)
    policy = hybrid_policy(size, size)
    for i in range(8):  # warm-up
        await knn_search(
            r,
            seeder.keys.episode_index_alias,
            scope,
            vectors[i % len(vectors)],
            CANDIDATES,
            return_fields=RETURN_FIELDS,
            policy=policy,
        )
    cpu0 = await redis_cpu(r)
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        await knn_search(
            r,
            seeder.keys.episode_index_alias,
            scope,
            vectors[i % len(vectors)],
            CANDIDATES,
            return_fields=RETURN_FIELDS,
            policy=policy,
        )
        lat.append(time.perf_counter() - t0)
    cpu = await redis_cpu(r) - cpu0
    return {
        "p50_ms": percentile_ms(lat, 50),
        "p99_ms": percentile_ms(lat, 99),
        "redis_cpu_ms": 1000.0 * cpu / n,
        "policy": policy or "module's",
    }


async def service_clients(
    base: str, r, queries: list[str], clients: int, n_req: int, options: dict[str, Any], offset: int
) -> dict[str, float]:
    """`clients` closed-loop clients, `n_req` recalls of distinct queries (each embedded by the service)."""
    from engram_episodic.client import Calls

    async with ClientPool(base, clients, 300.0, max_retries=0) as memory:

        async def one(i: int) -> None:
            call = Calls.recall(queries[(offset + i) % len(queries)], **options)
            payload = await memory.call(call.as_json())
            if len(payload["results"]) != options["top_k"]:
                raise RuntimeError(
                    f"/v1/recall → {len(payload['results'])} results, expected {options['top_k']}"
                )

        await concurrent(clients, 2 * clients, lambda i: one(n_req + i))  # warm-up (other queries)
        cpu0 = await redis_cpu(r)
        lat, wall = await concurrent(clients, n_req, one)
        cpu = await redis_cpu(r) - cpu0
    return {
        "p50_ms": percentile_ms(lat, 50),
        "p95_ms": percentile_ms(lat, 95),
        "p99_ms": percentile_ms(lat, 99),
        "qps": n_req / wall,
        "requests": n_req,
        "redis_cpu_ms_per_recall": 1000.0 * cpu / n_req,
    }


def _command_class(cmd: str) -> str:
    """The part of a recall a SLOWLOG entry belongs to, from its command line as SLOWLOG keeps it: each
    argument cut at 128 characters and at most 32 arguments, so the tests look at what survives."""
    if cmd.startswith("FT.INFO"):
        return "FT.INFO (index size)"
    if not cmd.startswith("FT.SEARCH"):
        return cmd.split(" ", 1)[0]
    # every KNN (shared.index) sorts by its distance; SLOWLOG keeps 32 arguments, so a restricted KNN's
    # (INKEYS and 100 keys first) is known by its query, a union's (a long query) by its SORTBY
    if "=>[KNN" in cmd or " SORTBY dist " in cmd:
        return "KNN, union of remembered lists" if ") | (" in cmd else "KNN (vector arm, restricted KNN)"
    if "BM25STD" in cmd:
        return "keyword arm (BM25, 100 deep)"
    if "@tiebreak:[" in cmd and " SORTBY " not in cmd:  # services.query.recall.lists: a floor at a tie
        return "top-by list, narrowed at a tie"
    if " SORTBY " in cmd:
        # a top-by list, narrowed by a remembered floor when a sort field has a finite lower bound (the
        # bench's requests set no `since` or reward filter; the expiry clause is `-@expires_at:[-inf …]`)
        narrowed = re.search(r"@(completed_at|reward|importance):\[(?!-inf)", cmd) is not None
        return "top-by list, narrowed" if narrowed else "top-by list, whole namespace"
    if " LIMIT 0 0 " in cmd:
        return "idf counts (one per query word)" if cmd.split(" ", 3)[2].startswith("(@task") else "counts"
    return "other FT.SEARCH"


async def redis_profile(r, base: str, queries: list[str], options: dict[str, Any], n: int) -> dict[str, Any]:
    """Where Redis's time goes in `n` sequential recalls (after 5 of warm-up): SLOWLOG with threshold 0,
    durations summed per `_command_class`; {class: {"us_per_recall", "calls_per_recall"}}. Redis's
    previous SLOWLOG settings are restored."""
    from engram_episodic.client import Calls

    before = await r.config_get("slowlog-*")
    async with ClientPool(base, 1, 300.0, max_retries=0) as memory:
        for q in queries[n : n + 5]:
            await memory.call(Calls.recall(q, **options).as_json())
        await r.config_set("slowlog-max-len", 100_000)
        await r.config_set("slowlog-log-slower-than", 0)
        await r.slowlog_reset()
        try:
            for q in queries[:n]:
                await memory.call(Calls.recall(q, **options).as_json())
        finally:
            await r.config_set("slowlog-log-slower-than", before["slowlog-log-slower-than"])
        entries = await r.slowlog_get(100_000)
        await r.config_set("slowlog-max-len", before["slowlog-max-len"])
    totals: dict[str, list[float]] = {}
    slowest: dict[str, tuple[float, str]] = {}  # per part, its slowest command (first 400 characters)
    for entry in entries:
        cmd = entry["command"]
        cmd = cmd.decode(errors="replace") if isinstance(cmd, bytes) else str(cmd)
        if cmd.startswith(("SLOWLOG", "CONFIG")):
            continue
        part, us = _command_class(cmd), float(entry["duration"])
        t = totals.setdefault(part, [0, 0.0])
        t[0] += 1
        t[1] += us
        if us > slowest.get(part, (-1.0, ""))[0]:
            slowest[part] = (us, cmd[:400])
    profile = {
        k: {"us_per_recall": v[1] / n, "calls_per_recall": v[0] / n, "slowest": slowest[k]}
        for k, v in sorted(totals.items(), key=lambda kv: -kv[1][1])
    }
    return {"recalls": n, "total_us_per_recall": sum(v[1] for v in totals.values()) / n, "by_part": profile}


async def recall_phase(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Seed, then per size and client count: the service, the raw KNN and the floor; see the module doc."""
    from shared.embedding import make_embedder
    from shared.redis_conn import connect
    from shared.settings import Settings

    # the service's environment (ENGRAM_EMBED_THREADS, ...) with the bench's embedder
    settings = Settings.from_env(
        {**os.environ, "ENGRAM_EMBEDDER": args.recall_embedder, "ENGRAM_EMBED_DIM": "384"}
    )
    embedder = make_embedder(settings)  # the corpus's vectors, as a consolidator embeds them
    asker = make_embedder(settings, role="query")  # the queries', as the query service embeds them
    for e in (embedder, asker):
        await e.load()
    turns, questions, source = real_texts()
    texts = turns[: args.corpus_texts]
    sizes = sorted(args.recall_sizes)
    out: dict[str, Any] = {
        "embedder": embedder.name,
        "backend": getattr(embedder, "runs_on", "n/a"),
        "query_backend": getattr(asker, "runs_on", "n/a"),
        "corpus": {"source": source, "real_texts": len(texts), "noise": args.corpus_noise},
        "clients": args.recall_clients,
        "top_k": args.top_k,
        "mode": args.recall_mode,
        "reward": args.recall_reward,
        "candidates": CANDIDATES,
        "sizes": {},
    }
    r = connect(url, max_connections=64)
    proc = None
    try:
        base, info = await cached_vectors(embedder, texts, cache_dir=args.cache_dir)
        out["corpus"].update(info)
        print(
            f"  corpus: {len(texts)} real texts ({source}), vectors {'cached' if info['cached'] else 'embedded'}"
            f" ({info['seconds']:.0f}s), derived to {sizes[-1]:,}",
            flush=True,
        )
        vectors, _ = derive(base, sizes[-1], noise=args.corpus_noise)
        query_vectors = await asker.embed(questions[:256])
        seeder = CorpusSeeder(r, embedder.name, embedder.dim, texts, vectors, reward=args.recall_reward)
        await seeder.create()
        from bench.common import free_port

        port = free_port()
        env = service_env(
            url,
            seeder.keys.prefix,
            args.recall_embedder,
            ENGRAM_EMBED_DIM="384",
            ENGRAM_DEFAULT_NAMESPACE=NAMESPACE,
            ENGRAM_QUERY_CACHE="0",  # every recall embeds its query, as a new question does
        )
        proc = spawn_query_service(env, port)
        base_url = f"http://127.0.0.1:{port}"
        await wait_http_ready(base_url, proc, timeout=300)
        offset = 0
        # the request a user sends: the query and top_k; the mode only when asked (default: hybrid)
        options: dict[str, Any] = {"top_k": args.top_k}
        if args.recall_mode != "default":
            options["mode"] = args.recall_mode
        for size in sizes:
            rate = await seeder.grow(size)
            used = int((await r.info("memory"))["used_memory"])
            row: dict[str, Any] = {"insert_rate": rate, "redis_bytes_per_episode": round(used / size)}
            print(
                f"  {size:,} episodes: {rate:,.0f} inserted/s, Redis {used / 2**30:.2f} GiB ({used / size / 1024:.1f} KiB each)"
            )
            row["raw_ft_search"] = raw = await raw_knn(r, seeder, query_vectors, size, args.raw_requests)
            for c in args.recall_clients:
                n_req = max(args.recall_requests * c, 2 * args.recall_requests)
                model = await model_pass(asker, questions, c, args.floor_passes, offset)
                s = await service_clients(base_url, r, questions, c, n_req, options, offset)
                offset += n_req + 2 * c
                floor = model["pass_p50_ms"] + raw["p50_ms"]
                s["model_pass"] = model
                s["floor_ms"] = floor
                s["p50_vs_floor"] = ratio(s["p50_ms"], floor)
                s["qps_vs_floor"] = ratio(s["qps"], 1000.0 * c / floor)
                row[str(c)] = s
                print(
                    f"  recall {size:,} ×{c}: p50 {s['p50_ms']:.0f} / p95 {s['p95_ms']:.0f} / p99 "
                    f"{s['p99_ms']:.0f} ms, {s['qps']:.1f}/s; floor {floor:.0f} ms (×{s['p50_vs_floor']:.2f}); "
                    f"Redis {s['redis_cpu_ms_per_recall']:.2f} ms CPU/recall",
                    flush=True,
                )
            if args.recall_profile:
                # distinct queries from the end of the list: the measured requests above start at its head
                tail = questions[-(args.recall_profile + 5) :]
                row["redis_profile"] = prof = await redis_profile(
                    r, base_url, tail, options, args.recall_profile
                )
                print(
                    f"  Redis per recall at {size:,} (SLOWLOG): {prof['total_us_per_recall'] / 1000:.1f} ms: "
                    + ", ".join(
                        f"{k} {v['us_per_recall'] / 1000:.1f} ms ×{v['calls_per_recall']:.1f}"
                        for k, v in prof["by_part"].items()
                    ),
                    flush=True,
                )
            out["sizes"][str(size)] = row
        if args.console_requests:  # the console's playground against the recall it shows, largest size
            tail = questions[-(args.recall_profile + args.console_requests + 10) : -(args.recall_profile + 5)]
            out["console"] = await playground_vs_api(base_url, tail[: args.console_requests], args.top_k)
            out["console"]["size"] = sizes[-1]
            print(f"  {render_console(out['console']).strip()}", flush=True)
        top = str(max(args.recall_clients))
        small, large = out["sizes"][str(sizes[0])], out["sizes"][str(sizes[-1])]
        out["qps_large_vs_small"] = ratio(large[top]["qps"], small[top]["qps"])
    finally:
        if proc is not None:
            stop_processes([proc])
        if "seeder" in locals():
            await drop_prefix(r, seeder.keys)
        await r.aclose()
        await embedder.aclose()
        await asker.aclose()
    return out


def render_profile(res: dict[str, Any]) -> str:
    """Where Redis's time goes per recall, per size (Markdown; empty without `--recall-profile`)."""
    rows = [
        [f"{int(size):,}", part, v["us_per_recall"] / 1000.0, v["calls_per_recall"]]
        for size, row in res["sizes"].items()
        for part, v in row.get("redis_profile", {}).get("by_part", {}).items()
    ]
    if not rows:
        return ""
    return "\n\nRedis per recall by part (SLOWLOG, sequential recalls):\n\n" + table(
        ["episodes", "part", "ms of Redis per recall", "calls per recall"], rows
    )


def render_recall(res: dict[str, Any]) -> str:
    """The recall phase's tables (Markdown)."""
    rows = []
    for size, row in res["sizes"].items():
        for c in res["clients"]:
            s = row[str(c)]
            rows.append(
                [
                    f"{int(size):,}",
                    c,
                    s["p50_ms"],
                    s["p95_ms"],
                    s["p99_ms"],
                    s["qps"],
                    s["floor_ms"],
                    s["p50_vs_floor"],
                    s["qps_vs_floor"],
                    s["redis_cpu_ms_per_recall"],
                    row["raw_ft_search"]["p50_ms"],
                ]
            )
    corpus = res["corpus"]
    return (
        f"\nRecall with the default embedder ({res['embedder']} on {res['backend']}, queries on "
        f"{res.get('query_backend', res['backend'])}), top_k {res['top_k']}, "
        f"mode {res.get('mode', 'default')}, reward {res.get('reward', 'continuous')}, "
        f"one namespace; corpus from {corpus['real_texts']} real texts ({corpus['source']}, noise "
        f"{corpus['noise']}); 16-client recalls/s at the largest size vs the smallest: "
        f"{res.get('qps_large_vs_small', float('nan')):.2f}:\n\n"
        + table(
            [
                "episodes",
                "clients",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "recalls/s",
                "floor ms",
                "p50 / floor",
                "recalls/s / floor's",
                "Redis CPU ms/recall",
                "raw FT.SEARCH p50 ms",
            ],
            rows,
        )
        + render_profile(res)
        + (render_console(res["console"]) if "console" in res else "")
    )
