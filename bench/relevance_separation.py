"""How well an absolute relevance threshold (`min_relevance`) separates on-topic episodes from unrelated
ones that share a word with the query, on LoCoMo (`python -m bench.relevance_separation`).

Data: `../shared/data/locomo/locomo7.json` (read by path, as `bench.locomo` does). For every question
with evidence, computed in-process with the service's own functions (`services.query.recall.relevance`: the query's
stems, idf from the conversation's document counts, `keyword_relevances` of each turn's terms, the
embedder's cosine, the recall mode's combination):
- positives: the question's evidence turns;
- `one-word` negatives: up to 5 random turns (seeded) of other sessions than the evidence's that share
  exactly one query stem with the question;
- `rare-word` negatives: the same, the shared stem being rare (idf >= 2.5: in at most ~8 turns of
  the conversation), the case where keyword relevance looks like a match.
Per mode it prints the AUC (chance that an evidence turn outranks a negative, over all questions),
the evidence's 10th percentile (a floor that keeps 90% of the evidence) and the share of each negative
set at or above it, and the similarity-only R@10 over every turn of the conversation (the ranking a
recalibration must not move). No Redis and no service: a fixed seed and the same inputs give the same
numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from pathlib import Path
from typing import Any

import numpy as np

from bench.locomo import DEFAULT_DATA, load
from services.query.recall import relevance as rel
from services.query.recall.terms import Memos
from shared.embedding import Embedder, HashingEmbedder, MiniLMEmbedder, MPNetEmbedder

RARE_IDF = 2.5
NEGATIVES = 5


def embedder_of(name: str) -> Embedder:
    if name == "hashing":
        return HashingEmbedder(256)
    return (MiniLMEmbedder if name == "minilm" else MPNetEmbedder)(batch_size=64)


def pairs(path: Path, embedder: Embedder, conversations: int | None, seed: int = 7) -> list[dict[str, Any]]:
    """One row per question: cosines and keyword relevances of every turn, evidence and negatives."""
    convs = load(path, conversations=conversations)
    turns = asyncio.run(embedder.embed([t.text for c in convs for t in c.turns]))
    questions = asyncio.run(embedder.embed([q.text for c in convs for q in c.questions]))
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    ti = qi = 0
    for c in convs:
        vectors = turns[ti : ti + len(c.turns)]
        ti += len(c.turns)
        hits = [{b"task": t.text.encode()} for t in c.turns]
        memos = Memos()
        terms = [memos.hit_terms(h).tf for h in hits]
        df: dict[str, int] = {}
        for tf in terms:
            for stem in tf:
                df[stem] = df.get(stem, 0) + 1
        index = {t.dia_id: i for i, t in enumerate(c.turns)}
        for q in c.questions:
            qv = questions[qi]
            qi += 1
            words = rel.query_words(q.text)
            qt = rel.query_terms(words, [df.get(s, 0) for s in words])
            evidence = [index[e] for e in q.evidence if e in index]
            sessions = {c.turns[i].session for i in evidence}
            one, rare = [], []
            for i, tf in enumerate(terms):
                shared = [w for s, w in qt.items() if s in tf]
                if len(shared) == 1 and c.turns[i].session not in sessions:
                    one.append(i)
                    if shared[0] >= RARE_IDF:
                        rare.append(i)
            rows.append(
                {
                    "cos": vectors @ qv,
                    "kw": rel.keyword_relevances(qt, hits, memos),
                    "evidence": evidence,
                    "one-word": rng.sample(one, min(NEGATIVES, len(one))),
                    "rare-word": rng.sample(rare, min(NEGATIVES, len(rare))),
                }
            )
    return rows


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(a positive scores above a negative), ties counted half (Mann-Whitney U over n_pos·n_neg)."""
    both = np.concatenate([pos, neg])
    ranks = np.empty(len(both))
    order = both.argsort(kind="stable")
    ranks[order] = np.arange(1, len(both) + 1)
    for value in np.unique(both):  # average ranks of ties
        tied = both == value
        ranks[tied] = ranks[tied].mean()
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def report(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per mode: AUC and pass shares of both negative sets, the evidence's p10 and median, R@10."""
    out = {}
    for mode in ("hybrid", "vector", "keyword"):
        scores = [rel.relevances(mode, r["cos"], r["kw"]) for r in rows]
        pos = np.concatenate([s[r["evidence"]] for s, r in zip(scores, rows, strict=True)])
        floor = float(np.quantile(pos, 0.10))
        line: dict[str, float] = {"evidence p10": floor, "evidence median": float(np.median(pos))}
        for kind in ("one-word", "rare-word"):
            neg = np.concatenate([s[r[kind]] for s, r in zip(scores, rows, strict=True)])
            line[f"AUC {kind}"] = auc(pos, neg)
            line[f"{kind} >= p10"] = float(np.mean(neg >= floor))
            line[f"{kind} median"] = float(np.median(neg))
        hits = [
            len(set(np.argsort(-s, kind="stable")[:10].tolist()) & set(r["evidence"])) / len(r["evidence"])
            for s, r in zip(scores, rows, strict=True)
            if r["evidence"]
        ]
        line["R@10"] = 100.0 * float(np.mean(hits))
        out[mode] = line
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="path of locomo7.json")
    ap.add_argument("--embedder", default="minilm", choices=("hashing", "minilm", "mpnet"))
    ap.add_argument("--conversations", type=int, default=None, help="use only the first N conversations")
    args = ap.parse_args(argv)
    if not args.data.exists():
        print(f"{args.data} not found: nothing to measure")
        return 0
    result = report(pairs(args.data, embedder_of(args.embedder), args.conversations))
    for mode, line in result.items():
        print(mode, " ".join(f"{k}={v:.3f}" for k, v in line.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
