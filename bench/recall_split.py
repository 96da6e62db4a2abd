"""Where a lone recall's time goes with the default embedder: the model, and what follows it.

`python -m bench.recall_split [--size 100000] [--queries 200] [--modes hybrid,vector] [--embedder auto]`
seeds the recall phase's corpus (`bench.perf_recall.CorpusSeeder`: every LoCoMo turn embedded once by
the embedder and cached, derived to `--size` documents in one namespace) into a private Redis, then
recalls `--queries` LoCoMo questions one at a time in this process, as `POST /v1/recall` does by default
(`views.recall.recall_params` of `{"query": q, "top_k": 10}`, plus `mode`; the query's embedding started
as a task with `services.query.recall.recall` beside it, `views.recall.overlapped`), and times per recall:

- `model`: the query's forward pass alone (each question once more, with "?" appended, before the recalls:
  the query backend, one text per pass);
- `vector`: from the recall's start until its vector is there — the model's pass, with the searches that
  need no vector (the `auto` preset's count, the idf counts, the BM25 arm) beside it on the same cores;
- `after`: from then to the answer — the KNN arm, the keyword hits' cosines, the recency / reward lists,
  the scoring and the winners' documents: what no faster model can remove;
- `total`, and Redis's CPU per recall (`INFO cpu`, the process being Redis's only client).

A lone recall's p50 cannot fall below `model` + the Redis time of the `after` searches; the table shows
how far each mode is from that. HTTP adds ~1-2 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

MODES = ("hybrid", "vector", "keyword")
LEGEND = (
    "p50 ms of: model = the query's pass alone (measured apart), vector ready = from the recall's start "
    "until its vector is there (the pass, with the keyword side beside it), after it = the searches and "
    "scoring that follow, total; medians of separate timings need not add up"
)


def summarize(samples: dict[str, list[float]]) -> dict[str, float]:
    """p50 in ms of each timing (`model`, `vector`, `after`, `total`: seconds per recall), and `after`
    as a share of `total`'s p50. Raises ValueError when a timing has no sample."""
    out = {}
    for name in ("model", "vector", "after", "total"):
        if not samples.get(name):
            raise ValueError(f"no {name} timing")
        out[f"{name}_p50_ms"] = round(1000.0 * statistics.median(samples[name]), 2)
    out["after_share"] = round(out["after_p50_ms"] / out["total_p50_ms"], 3)
    return out


async def split(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from bench.common import redis_cpu
    from bench.perf_corpus import cached_vectors, derive, real_texts
    from bench.perf_recall import NAMESPACE, CorpusSeeder
    from services.query import models
    from services.query import recall as rc
    from services.query.recall.sizes import ScopeSizes
    from services.query.recall.vectors import QueryBatcher
    from services.query.store import EpisodeStore
    from services.query.views.recall import overlapped, recall_params
    from shared.embedding import make_embedder
    from shared.redis_conn import connect
    from shared.settings import Settings

    settings = Settings.from_env({**os.environ, "ENGRAM_EMBEDDER": args.embedder, "ENGRAM_EMBED_DIM": "384"})
    embedder, asker = make_embedder(settings), make_embedder(settings, role="query")
    for e in (embedder, asker):
        await e.load()
    turns, questions, source = real_texts()
    texts = turns[: args.corpus_texts]
    base, info = await cached_vectors(embedder, texts, cache_dir=args.cache_dir)
    vectors, _ = derive(base, args.size, noise=0.3)
    r = connect(url)
    seeder = CorpusSeeder(r, embedder.name, embedder.dim, texts, vectors)
    await seeder.create()
    rate = await seeder.grow(args.size)
    index, batcher = seeder.keys.episode_index_alias, QueryBatcher(asker)
    sizes = ScopeSizes(df_ttl=settings.idf_cache_ttl or 0.0)
    qs = questions[: args.queries]
    out: dict[str, Any] = {
        "embedder": embedder.name,
        "query_backend": getattr(asker, "runs_on", "n/a"),
        "corpus": {"source": source, "real_texts": len(texts), **info},
        "size": args.size,
        "insert_rate": round(rate, 1),
        "queries": len(qs),
        "modes": {},
    }
    for q in questions[-5:]:  # the first passes of a process are slower
        await batcher.embed(q)
    print(f"  queries on {out['query_backend']}; {LEGEND}", flush=True)
    for mode in args.modes:
        samples: dict[str, list[float]] = {"model": [], "vector": [], "after": [], "total": []}
        for q in qs:
            t0 = time.perf_counter()
            await batcher.embed(q + "?")
            samples["model"].append(time.perf_counter() - t0)
        cpu0 = await redis_cpu(r)
        for q in qs:
            req = models.RecallRequest(query=q, top_k=10, mode=mode)
            params = recall_params(req, settings, seeder.now)
            scope = rc.scope_of(NAMESPACE, req, seeder.tags)
            t0 = time.perf_counter()
            ready: list[float] = []
            async with overlapped(batcher.embed(q)) as vector:
                vector.add_done_callback(lambda _, at=ready: at.append(time.perf_counter()))
                await rc.recall(
                    rc.Query(r, index, scope, q, vector, EpisodeStore(r, seeder.keys), sizes), params
                )
            t1 = time.perf_counter()
            samples["vector"].append(ready[0] - t0)
            samples["after"].append(t1 - ready[0])
            samples["total"].append(t1 - t0)
        row = summarize(samples)
        row["redis_cpu_ms"] = round(1000.0 * (await redis_cpu(r) - cpu0) / len(qs), 2)
        out["modes"][mode] = row
        print(
            f"  {mode} at {args.size:,}: model {row['model_p50_ms']:.1f} ms, vector ready {row['vector_p50_ms']:.1f}, "
            f"after it {row['after_p50_ms']:.1f}, total {row['total_p50_ms']:.1f} (p50), "
            f"Redis {row['redis_cpu_ms']:.1f} ms CPU/recall",
            flush=True,
        )
    await r.aclose()
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=f"{__doc__.splitlines()[0]} Printed: {LEGEND}.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--size", type=int, default=100_000, help="episodes in the one namespace")
    p.add_argument("--queries", type=int, default=200, help="LoCoMo questions per mode")
    p.add_argument("--modes", default="hybrid,vector", help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--embedder", default="auto", help="ENGRAM_EMBEDDER (auto: the default model)")
    p.add_argument(
        "--corpus-texts",
        type=int,
        default=5000,
        help="at most this many real turns the corpus is derived from",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="the corpus vectors' cache; none given: ~/.cache/engram-bench",
    )
    p.add_argument("--out", type=Path, default=Path("bench/results-split.json"), help="the result file")
    args = p.parse_args()
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        p.error(f"--modes: {', '.join(bad) or 'none given'}: each must be one of {', '.join(MODES)}")
    if args.size < 1 or args.queries < 1:
        p.error("--size and --queries must be at least 1")
    from bench.common import private_redis, write_json
    from bench.perf_corpus import CACHE_DIR

    args.cache_dir = args.cache_dir or CACHE_DIR
    with private_redis() as server:
        result = asyncio.run(split(server.url, args))
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
