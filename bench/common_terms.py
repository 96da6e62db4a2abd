"""Does leaving common terms out of the BM25 candidate query change recall? (`ENGRAM_BM25_COMMON_IDF`)

`python -m bench.common_terms [--size 100000] [--queries 200] [--embedder hashing]`: seeds the recall
phase's corpus (bench.perf_recall.CorpusSeeder: LoCoMo turns, derived to `--size` in one namespace) into
a private Redis, then runs `services.query.recall.recall` in this process for `--queries` LoCoMo
questions twice each, with the terms dropped (`RecallParams.common_idf` `--common-idf`, 0.02) and kept (0: the
exact pool), and reports how often the top 10 is the same list, the mean share of the exact top 10 kept, the
largest difference of a priority at the same rank, how often the top 10 holds the same turns (document
i is a copy of turn i mod the turns: ~24 near-duplicates of each at 100k), and the mean terms dropped
per question. The idf
counts are shared (one ScopeSizes) so both runs score with the same counts. LoCoMo itself cannot test
this: one conversation holds ~600 turns, far below the ~4,950 episodes that make a word common.

`--quality N` answers whether the drop costs quality where it acts: the 100k namespace holds every
LoCoMo turn (document i is turn i mod 4,124, `bench.perf_corpus.derived_text`: the turn itself below
4,124, then near-duplicate copies with a `(retold r, note i)` tail and a noised vector), i.e. every
conversation's turns sit among ~96k others. N LoCoMo questions with evidence (categories 1-4: the
adversarial ones, 5, ask about what was not said; `evidence_questions`) are recalled once per
threshold of `--common-idf` (a comma list) and once exact; R@k = the share of a question's evidence
turns of which some copy is in the top k (the paper's R@k with a copy standing for its turn).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from typing import Any

from bench.common import private_redis
from bench.locomo import DEFAULT_DATA, load
from bench.perf_corpus import CACHE_DIR, cached_vectors, derive, real_texts
from bench.perf_recall import NAMESPACE, CorpusSeeder


def evidence_questions(turns: list[str], n: int) -> list[tuple[str, set[int]]]:
    """Up to `n` LoCoMo questions of categories 1-4 (every (all // n)-th, the first `n` of those: for
    400 of 1,033, the first ~800 questions), each with its evidence as indices into `turns`
    (`real_texts`' order: conversations, sessions, turns)."""
    if not DEFAULT_DATA.exists():
        raise SystemExit(f"--quality needs LoCoMo's data at {DEFAULT_DATA}")
    qs: list[tuple[str, set[int]]] = []
    at = 0
    for conv in load(DEFAULT_DATA):
        where = {t.dia_id: at + j for j, t in enumerate(conv.turns)}
        for j, t in enumerate(conv.turns):
            if turns[at + j] != t.text:
                raise SystemExit(f"turn order differs from bench.perf_corpus at {at + j}")
        at += len(conv.turns)
        qs += [(q.text, {where[d] for d in q.evidence}) for q in conv.questions if q.category != 5]
    step = max(1, len(qs) // max(1, n))
    return qs[::step][:n]


def recall_at(top: list[str], evidence: set[int], n_turns: int, k: int) -> float:
    """Share of `evidence` (turn indices) of which some copy (episode `t-<i>`, turn i mod n_turns) is
    among the first k of `top`, in percent."""
    found = {int(e.split("-")[1]) % n_turns for e in top[:k]}
    return 100.0 * len(found & evidence) / len(evidence)


async def run(url: str, args: argparse.Namespace) -> dict[str, float]:
    from services.query import recall as rc
    from services.query.recall import relevance
    from services.query.recall.sizes import ScopeSizes
    from services.query.store import EpisodeStore
    from shared.embedding import make_embedder
    from shared.index import Scope
    from shared.redis_conn import connect
    from shared.settings import Settings

    embedder = make_embedder(Settings(embedder=args.embedder, embed_dim=384))
    await embedder.load()
    turns, questions, _ = real_texts()
    base, _ = await cached_vectors(embedder, turns[:5000], cache_dir=CACHE_DIR)
    vectors, _ = derive(base, args.size, noise=0.3)
    r = connect(url)
    seeder = CorpusSeeder(r, embedder.name, embedder.dim, turns[:5000], vectors)
    await seeder.create()
    await seeder.grow(args.size)
    index, sizes = seeder.keys.episode_index_alias, ScopeSizes(df_ttl=3600.0)
    if args.quality:
        out = await quality(r, index, seeder, sizes, embedder, turns[:5000], args)
        await r.aclose()
        return out
    qs = questions[: args.queries]
    qv = await embedder.embed(qs)
    measured = float(args.common_idf.split(",")[0])
    same = kept = dropped_terms = same_turns = 0.0
    n_turns = min(len(turns), 5000)
    worst = 0.0
    for q, v in zip(qs, qv, strict=True):
        scope, params = top10_request(seeder)
        bodies = []
        for threshold in (0.0, measured):
            at = dataclasses.replace(params, common_idf=threshold)
            bodies.append(
                await rc.recall(rc.Query(r, index, scope, q, v, EpisodeStore(r, seeder.keys), sizes), at)
            )
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
        dropped_terms += len(relevance.common_terms(relevance.query_terms(words, counts), measured))
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


def top10_request(seeder: Any) -> tuple[Any, Any]:
    """(Scope, RecallParams) of one hybrid top-10 recall in the seeded namespace, as of now; the
    callers vary only `common_idf`."""
    from services.query import recall as rc
    from shared.index import Scope

    now = time.time()
    scope = Scope(namespace=NAMESPACE, tags=seeder.tags, live_at=now)
    params = rc.RecallParams(
        top_k=10,
        depth=100,
        mode="hybrid",
        preset=None,
        weights=None,
        half_life=86400.0,
        as_of=now,
        normalize="none",
        recency_from="completed",
        touch_now=None,
    )
    return scope, params


def paired_delta(
    exact: list[tuple[float, float]], other: list[tuple[float, float]], iterations: int = 2000
) -> dict[str, list[float]]:
    """Mean R@5 / R@10 difference `other - exact` over the same questions with a paired bootstrap 95%
    interval (resampling questions, seed 0): {"dR@5": [mean, lo, hi], "dR@10": [...]}, points."""
    import numpy as np

    d = np.asarray(other, dtype=float) - np.asarray(exact, dtype=float)
    rng = np.random.default_rng(0)
    means = d[rng.integers(0, len(d), size=(iterations, len(d)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5], axis=0)
    return {
        f"dR@{k}": [round(float(d[:, j].mean()), 2), round(float(lo[j]), 2), round(float(hi[j]), 2)]
        for j, k in enumerate((5, 10))
    }


async def quality(r, index, seeder, sizes, embedder, turns, args) -> dict[str, object]:
    """R@5 / R@10 of `--quality` LoCoMo questions in the big namespace, exact and per threshold."""
    from services.query import recall as rc
    from services.query.store import EpisodeStore

    qs = evidence_questions(turns, args.quality)
    qv = await embedder.embed([q for q, _ in qs])
    thresholds = [0.0] + [float(x) for x in args.common_idf.split(",")]
    sums = {t: [0.0, 0.0, 0.0] for t in thresholds}  # R@5, R@10, same top 10 as exact
    per_q: dict[float, list[tuple[float, float]]] = {t: [] for t in thresholds}
    timing = {t: 0.0 for t in thresholds}
    for (q, evidence), v in zip(qs, qv, strict=True):
        scope, params = top10_request(seeder)
        exact: list[str] = []
        for t in thresholds:
            started = time.perf_counter()
            at = dataclasses.replace(params, common_idf=t)
            body = await rc.recall(rc.Query(r, index, scope, q, v, EpisodeStore(r, seeder.keys), sizes), at)
            timing[t] += time.perf_counter() - started
            top = [x["episode"]["episode_id"] for x in body["results"]]
            exact = exact or top
            per_q[t].append(
                (recall_at(top, evidence, len(turns), 5), recall_at(top, evidence, len(turns), 10))
            )
            sums[t][0] += per_q[t][-1][0]
            sums[t][1] += per_q[t][-1][1]
            sums[t][2] += top == exact
    n = len(qs)
    return {
        "size": args.size,
        "embedder": embedder.name,
        "questions": n,
        "by_common_idf": {
            str(t): {
                "R@5": round(s[0] / n, 2),
                "R@10": round(s[1] / n, 2),
                "same_top10_as_exact": round(s[2] / n, 3),
                "ms_per_recall_in_process": round(1000 * timing[t] / n, 1),
                **paired_delta(per_q[0.0], per_q[t]),
            }
            for t, s in sums.items()
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=100_000)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--embedder", default="hashing")
    p.add_argument(
        "--common-idf", default="0.02", help="the common_idf measured against 0 (--quality: a comma list)"
    )
    p.add_argument("--quality", type=int, default=0, help="R@5/R@10 of N LoCoMo questions instead")
    args = p.parse_args()
    with private_redis() as server:
        print(json.dumps(asyncio.run(run(server.url, args)), indent=1))


if __name__ == "__main__":
    main()
