"""Does leaving common terms out of the BM25 candidate query change recall? (`shared.relevance.COMMON_IDF`)

`python -m bench.common_terms [--size 100000] [--queries 200] [--embedder hashing]`: seeds the recall
phase's corpus (bench.perf_recall.CorpusSeeder: LoCoMo turns, derived to `--size` in one namespace) into
a private Redis, then runs `services.query.recall.recall` in this process for `--queries` LoCoMo
questions twice each, with the terms dropped (COMMON_IDF `--common-idf`, 0.02) and kept (COMMON_IDF 0, as
shipped: the exact pool), and reports how often the top 10 is the same list, the mean share of the exact top 10 kept, the
largest difference of a priority at the same rank, how often the top 10 holds the same turns (document
i is a copy of turn i mod the turns: ~24 near-duplicates of each at 100k), and the mean terms dropped
per question. The idf
counts are shared (one ScopeSizes) so both runs score with the same counts. LoCoMo itself cannot test
this: one conversation holds ~600 turns, far below the ~4,950 episodes that make a word common.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from bench.common import private_redis
from bench.perf_corpus import CACHE_DIR, cached_vectors, derive, real_texts
from bench.perf_recall import NAMESPACE, CorpusSeeder


async def run(url: str, args: argparse.Namespace) -> dict[str, float]:
    from services.query import recall as rc
    from services.query.sizes import ScopeSizes
    from shared import relevance
    from shared.embedding import make_embedder
    from shared.index import Scope
    from shared.redis_conn import connect
    from shared.settings import Settings

    embedder = make_embedder(Settings(embedder=args.embedder, embed_dim=384))
    if hasattr(embedder, "load"):
        await embedder.load()
    turns, questions, _ = real_texts()
    base, _ = await cached_vectors(embedder, turns[:5000], cache_dir=CACHE_DIR)
    vectors, _ = derive(base, args.size, noise=0.3)
    r = connect(url)
    seeder = CorpusSeeder(r, embedder.name, embedder.dim, turns[:5000], vectors)
    await seeder.create()
    await seeder.grow(args.size)
    qs = questions[: args.queries]
    qv = await embedder.embed(qs)
    index, sizes, shipped = seeder.keys.episode_index_alias, ScopeSizes(df_ttl=3600.0), relevance.COMMON_IDF
    measured = args.common_idf
    same = kept = dropped_terms = same_turns = 0.0
    n_turns = min(len(turns), 5000)
    worst = 0.0
    for q, v in zip(qs, qv, strict=True):
        scope = Scope(namespace=NAMESPACE, tags=seeder.tags, live_at=time.time())
        params = rc.RecallParams(
            top_k=10,
            depth=100,
            mode="hybrid",
            preset=None,
            weights=None,
            half_life=86400.0,
            as_of=time.time(),
            normalize="none",
            recency_from="completed",
            touch_now=None,
        )
        bodies = []
        for threshold in (0.0, measured):
            relevance.COMMON_IDF = threshold
            bodies.append(await rc.recall(r, index, scope, q, v, params, sizes=sizes))
        relevance.COMMON_IDF = shipped
        exact, fast = ([x["episode"]["episode_id"] for x in b["results"]] for b in bodies)
        same += exact == fast
        kept += len(set(exact) & set(fast)) / max(1, len(exact))
        turns_of = [{int(e.split("-")[1]) % n_turns for e in top} for top in (exact, fast)]
        same_turns += turns_of[0] == turns_of[1]
        for a, b in zip(bodies[0]["results"], bodies[1]["results"], strict=False):
            worst = max(worst, abs(a["priority"] - b["priority"]))
        words = relevance.query_words(q)
        counts = await sizes.term_counts(
            r, index, Scope(namespace=NAMESPACE, tags=seeder.tags), list(words.values())
        )
        relevance.COMMON_IDF = measured
        dropped_terms += len(relevance.common_terms(relevance.query_terms(words, counts)))
        relevance.COMMON_IDF = shipped
    await r.aclose()
    n = len(qs)
    return {
        "size": args.size,
        "queries": n,
        "same_top10": same / n,
        "top10_overlap": kept / n,
        "same_top10_turns": same_turns / n,
        "max_priority_diff_at_rank": worst,
        "dropped_terms_per_query": dropped_terms / n,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=100_000)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--embedder", default="hashing")
    p.add_argument("--common-idf", type=float, default=0.02, help="the COMMON_IDF measured against 0")
    args = p.parse_args()
    with private_redis() as server:
        print(json.dumps(asyncio.run(run(server.url, args)), indent=1))


if __name__ == "__main__":
    main()
