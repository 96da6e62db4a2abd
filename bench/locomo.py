"""LoCoMo recall quality through the running service (`make bench-locomo`).

Data: `../shared/data/locomo/locomo7.json` (Maharana et al., ACL 2024; CC BY-NC 4.0), read by path and
never copied. If it is missing the benchmark says so and exits 0.

The real path, end to end:
1. every dialog turn becomes one episode: namespace `locomo-<sample_id>` per conversation,
   `episode_id` = the turn's `dia_id` (so hits map back to evidence), task = "speaker: utterance" plus
   the image caption when present, completed_at = session start + 30 s per turn, `dia_id` kept in
   metadata; published through the SDK (`EngramClient.publish`) onto the stream;
2. `--workers` consolidator processes (`python -m services.consolidator run`) project them until every
   turn is queryable;
3. every question goes to `POST /v1/recall` of a query-service process (`python -m services.query`,
   one API key per conversation's namespace) with `as_of` = one day after the conversation's last
   turn and `top_k` 50.

Metrics per category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial) and overall:
recall@5/10/25/50 (share of a question's evidence turns in the top k: the paper's R@k), hit@1/5/10,
NDCG@10 (binary relevance), with percentile-bootstrap 95% intervals over questions.

Reference rows: the paper's DRAGON retriever over turns (Table 3) and a BM25 over the same turn texts
computed here (`rank_bm25`'s BM25Okapi). Rows marked "harness" are computed by this script directly
against the same Redis index (FT.SEARCH KNN / BM25 through `shared.index`) to show what a fusion the
service does not (yet) offer would give; their RRF parameters were tuned on this very data.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import sys
import time
import uuid
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    ROOT,
    bootstrap_ci,
    machine,
    private_redis,
    publish_episodes,
    recall_ranked,
    service_env,
    spawn_query_service,
    spawn_workers,
    stop_processes,
    table,
    wait_http_ready,
    wait_recallable,
    write_json,
)

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo" / "locomo7.json"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
KS = (5, 10, 25, 50)
TOP_K = 50
DRAGON = {"R@5": 56.7, "R@10": 66.2, "R@25": 76.7, "R@50": 82.7}
_EVIDENCE_SPLIT = re.compile(r"[;,\s]+")
_EVIDENCE_ID = re.compile(r"D:?(\d+):0*(\d+)")
_WORD = re.compile(r"\w+", re.UNICODE)

# Weights of the ablation rows, each named after the terms it adds to similarity. Reward and outcome carry no information in
# LoCoMo (every turn is a "success" without reward), so "+reward/outcome" measures what the constant
# terms cost when they are present; "full" sends no weights at all: the service's default preset.
ABLATIONS: dict[str, dict[str, float] | None] = {
    "similarity-only": {"similarity": 1.0},
    "+recency": {"similarity": 0.4, "recency": 0.3},
    "+reward/outcome": {"similarity": 0.4, "recency": 0.3, "reward": 0.2, "outcome": 0.1},
    "full (service default preset)": None,
}


# --- the data ---------------------------------------------------------------------------------------
@dataclass(slots=True)
class Turn:
    dia_id: str
    session: int
    speaker: str
    text: str
    ts: float


@dataclass(slots=True)
class Question:
    conv: str
    text: str
    category: int
    evidence: list[str]


@dataclass(slots=True)
class Conversation:
    sample_id: str
    turns: list[Turn] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return f"locomo-{self.sample_id}"

    @property
    def as_of(self) -> float:
        """One day after the conversation's last turn."""
        return max(t.ts for t in self.turns) + 86400.0


def parse_session_time(text: str) -> float:
    """`"1:56 pm on 8 May, 2023"` → UTC epoch seconds (LoCoMo's dates carry no zone; UTC is assumed)."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC).timestamp()


def turn_text(turn: dict[str, Any]) -> str:
    text = f"{turn['speaker']}: {turn['text']}"
    if turn.get("blip_caption"):
        text += f" [shares an image: {turn['blip_caption']}]"
    return text


def all_texts(path: Path) -> tuple[list[str], list[str]]:
    """(every dialogue turn as `turn_text`, in session order; every question) of every conversation in
    the LoCoMo file at `path`. Unlike `load`, nothing is left out: sessions without a date and questions
    without evidence count too (the texts are a corpus to embed, not a graded benchmark)."""
    import json

    turns: list[str] = []
    questions: list[str] = []
    for sample in json.loads(path.read_text(encoding="utf-8")):
        conv = sample["conversation"]
        for key in sorted(
            (k for k in conv if k.startswith("session_") and isinstance(conv[k], list)),
            key=lambda k: int(k.split("_")[1]),
        ):
            turns += [turn_text(t) for t in conv[key]]
        questions += [str(q["question"]) for q in sample["qa"]]
    return turns, questions


def turn_episode(t: Turn) -> dict[str, Any]:
    """The episode (JSON-shaped) one turn is published as: see step 1 of the module docstring."""
    return {
        "episode_id": t.dia_id,
        "task": t.text,
        "outcome": "success",
        "session_id": f"session_{t.session}",
        "agent_id": t.speaker,
        "started_at": t.ts,
        "completed_at": t.ts,
        "metadata": {"dia_id": t.dia_id, "session": t.session, "speaker": t.speaker},
    }


def normalise_evidence(raw: Any, known: set[str]) -> list[str]:
    """Evidence ids as `D<session>:<turn>`; split on `[;,\\s]+`, accept `D:?(\\d+):0*(\\d+)`, drop unknown ids."""
    items = raw if isinstance(raw, list) else [raw]
    out: list[str] = []
    for item in items:
        for piece in _EVIDENCE_SPLIT.split(str(item)):
            m = _EVIDENCE_ID.fullmatch(piece.strip())
            if m:
                dia = f"D{int(m.group(1))}:{int(m.group(2))}"
                if dia in known and dia not in out:
                    out.append(dia)
    return out


def load(path: Path, *, conversations: int | None = None, questions: int | None = None) -> list[Conversation]:
    """The conversations of `path`, each with its turns (time-stamped) and the questions that have evidence."""
    import json

    samples = json.loads(path.read_text())
    out = []
    for sample in samples[:conversations]:
        conv = Conversation(sample_id=str(sample["sample_id"]))
        c = sample["conversation"]
        sessions = sorted(int(m.group(1)) for k in c if (m := re.fullmatch(r"session_(\d+)", k)))
        for n in sessions:
            turns = c.get(f"session_{n}")
            when = c.get(f"session_{n}_date_time")
            if not isinstance(turns, list) or not turns or not when:
                continue
            start = parse_session_time(when)
            for i, turn in enumerate(turns):
                conv.turns.append(
                    Turn(
                        dia_id=turn["dia_id"],
                        session=n,
                        speaker=turn["speaker"],
                        text=turn_text(turn),
                        ts=start + 30.0 * i,
                    )
                )
        known = {t.dia_id for t in conv.turns}
        for qa in sample["qa"]:
            evidence = normalise_evidence(qa.get("evidence", []), known)
            if evidence:
                conv.questions.append(
                    Question(
                        conv=conv.sample_id,
                        text=str(qa["question"]),
                        category=int(qa["category"]),
                        evidence=evidence,
                    )
                )
        if questions is not None:
            conv.questions = conv.questions[:questions]
        out.append(conv)
    return out


# --- metrics ----------------------------------------------------------------------------------------
def question_metrics(ranked: list[str], evidence: list[str]) -> dict[str, float]:
    """recall@k, hit@k and NDCG@10 (binary relevance) of one ranked list of episode ids."""
    gold = set(evidence)
    rel = [1.0 if d in gold else 0.0 for d in ranked]
    m: dict[str, float] = {}
    for k in KS:
        m[f"R@{k}"] = 100.0 * sum(rel[:k]) / len(gold)
    for k in (1, 5, 10):
        m[f"hit@{k}"] = 100.0 * (1.0 if any(rel[:k]) else 0.0)
    dcg = sum(r / math.log2(i + 2) for i, r in enumerate(rel[:10]))
    idcg = sum(1.0 / math.log2(i + 2) for i in range(min(len(gold), 10)))
    m["NDCG@10"] = 100.0 * dcg / idcg
    return m


METRIC_NAMES = [f"R@{k}" for k in KS] + ["hit@1", "hit@5", "hit@10", "NDCG@10"]


def per_k_metrics(ranked_by_k: dict[int, list[str]], evidence: list[str]) -> dict[str, float]:
    """Metrics when each cut comes from its own request: R@k and hit@k from the list asked with
    top_k = k (hit@1 and NDCG@10 from the top_k 10 one)."""
    m = question_metrics(ranked_by_k[10], evidence)
    for k, ranked in ranked_by_k.items():
        m[f"R@{k}"] = question_metrics(ranked, evidence)[f"R@{k}"]
    m["hit@5"] = question_metrics(ranked_by_k[5], evidence)["hit@5"]
    return m


def summarise(
    per_question: list[dict[str, float]], categories: list[int], *, iterations: int
) -> dict[str, Any]:
    """Means and bootstrap 95% intervals, overall and per category."""

    def block(rows: list[dict[str, float]]) -> dict[str, Any]:
        out: dict[str, Any] = {"n": len(rows)}
        for name in METRIC_NAMES:
            values = np.array([r[name] for r in rows])
            lo, hi = bootstrap_ci(values, iterations=iterations)
            out[name] = {"mean": float(values.mean()) if len(values) else math.nan, "ci95": [lo, hi]}
        return out

    result = {"overall": block(per_question), "by_category": {}}
    for cat, name in CATEGORIES.items():
        rows = [r for r, c in zip(per_question, categories, strict=True) if c == cat]
        if rows:
            result["by_category"][f"{cat} {name}"] = block(rows)
    return result


# --- BM25 baseline ------------------------------------------------------------------------------------
def tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def bm25_rankings(conv: Conversation) -> list[list[str]]:
    """rank_bm25's BM25Okapi over the conversation's turn texts, top 50 per question."""
    try:
        from rank_bm25 import BM25Okapi
    except ImportError:  # pragma: no cover - the test extra installs it
        raise SystemExit("the BM25 baseline needs `pip install rank-bm25`") from None
    bm25 = BM25Okapi([tokens(t.text) for t in conv.turns])
    ids = [t.dia_id for t in conv.turns]
    out = []
    for q in conv.questions:
        scores = bm25.get_scores(tokens(q.text))
        top = np.argsort(-scores, kind="stable")[:TOP_K]
        out.append([ids[i] for i in top])
    return out


# --- ingest through the SDK and the workers --------------------------------------------------------------
async def publish(redis_url: str, prefix: str, convs: list[Conversation]) -> int:
    """Publish one EpisodeCompleted per turn through the SDK; returns the number of episodes."""
    return await publish_episodes(
        redis_url, prefix, {c.namespace: [turn_episode(t) for t in c.turns] for c in convs}
    )


async def wait_projected(
    redis_url: str, prefix: str, convs: list[Conversation], workers, *, timeout: float
) -> float:
    """Wait until every turn of every conversation is recallable; returns the seconds it took."""
    return await wait_recallable(
        redis_url, prefix, {c.namespace: len(c.turns) for c in convs}, workers, timeout=timeout
    )


# --- asking the service ----------------------------------------------------------------------------------
async def ask_all(
    base_url: str,
    tokens_by_conv: dict[str, str],
    convs: list[Conversation],
    body_extra: dict[str, Any],
    *,
    concurrency: int,
    desc: str,
) -> tuple[list[list[str]], float]:
    """POST /v1/recall for every question (`bench.common.recall_ranked`, `top_k` 50, `as_of` the
    conversation's); returns ranked episode ids per question and the p50 latency (s)."""
    tokens = {c.namespace: tokens_by_conv[c.sample_id] for c in convs}
    jobs = [
        (c.namespace, q.text, {"top_k": TOP_K, "as_of": c.as_of, **body_extra})
        for c in convs
        for q in c.questions
    ]
    return await recall_ranked(base_url, tokens, jobs, concurrency=concurrency, desc=desc)


# --- harness-side fusion (what the service would return with RRF ordering) -----------------------------
async def direct_rankings(
    redis_url: str, prefix: str, convs: list[Conversation], embedder
) -> dict[str, list]:
    """Per question, the raw FT.SEARCH KNN and BM25 orders (ids, top 100) against the service's index."""
    import orjson

    from services.query.recall.arms import bm25_search, knn_search
    from shared.embedding import embed_query
    from shared.index import Scope
    from shared.keys import Keys
    from shared.redis_conn import connect
    from shared.tags import BLAKE2B  # namespace-only scopes: no id is digested

    keys = Keys(prefix)
    r = connect(redis_url)
    knn_all, bm25_all = [], []
    try:
        for conv in convs:
            scope = Scope(namespace=conv.namespace, tags=BLAKE2B)
            vectors = await embedder.embed([q.text for q in conv.questions]) if conv.questions else []
            for q, vec in zip(conv.questions, vectors, strict=True):
                # ids from the documents: the episode_id TAG field holds digests (shared.tags)
                knn = await knn_search(r, keys.episode_index_alias, scope, vec, 100, return_fields=("doc",))
                kw = await bm25_search(
                    r, keys.episode_index_alias, scope, q.text, 100, return_fields=("doc",)
                )
                knn_all.append([orjson.loads(h.fields[b"doc"])["episode_id"] for h in knn])
                bm25_all.append([orjson.loads(h.fields[b"doc"])["episode_id"] for h in kw])
        _ = embed_query  # the service embeds one query at a time; batching here gives the same vectors
    finally:
        await r.aclose()
    return {"knn": knn_all, "bm25": bm25_all}


def rrf(
    rankings: Sequence[Sequence[Hashable]], k: float = 60, weights: Sequence[float] | None = None
) -> list[tuple[Hashable, float]]:
    """Reciprocal rank fusion: score(d) = sum over rankings r of w_r / (k + rank_r(d)), rank 1-based.

    Cormack, Clarke & Buettcher 2009 (k = 60 there). A key missing from a ranking adds nothing; a key
    repeated within one ranking counts once, at its best rank. `weights` (one per ranking, default 1)
    gives the weighted variant. Returns (key, score) best first; equal scores keep the order of first
    appearance (ranking by ranking, top to bottom). Raises ValueError for k < 0 or bad weights.
    """
    if isinstance(k, bool) or not isinstance(k, int | float) or not math.isfinite(k) or k < 0:
        raise ValueError(f"k must be a finite number >= 0, got {k!r}")
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError(f"weights has {len(weights)} entries for {len(rankings)} rankings")
    for i, wi in enumerate(weights):
        if isinstance(wi, bool) or not isinstance(wi, int | float) or not math.isfinite(wi) or wi < 0:
            raise ValueError(f"weights[{i}] must be finite and >= 0, got {wi!r}")
    scores: dict[Hashable, float] = {}  # insertion order = first appearance
    for ranking, wi in zip(rankings, weights, strict=True):
        seen: set[Hashable] = set()
        for rank, key in enumerate(ranking, start=1):
            if key in seen:
                continue
            seen.add(key)
            scores[key] = scores.get(key, 0.0) + wi / (k + rank)
    first = {key: i for i, key in enumerate(scores)}
    return sorted(scores.items(), key=lambda item: (-item[1], first[item[0]]))


def rrf_rank(rankings: list[list[str]], k: float, weights: list[float]) -> list[str]:
    return [key for key, _ in rrf(rankings, k=k, weights=weights)][:TOP_K]


def tune_rrf(
    knn: list[list[str]], bm25: list[list[str]], questions: list[Question]
) -> tuple[float, float, float]:
    """Grid search of RRF k and the BM25 list's weight for mean R@5+R@10; returns (k, w_bm25, score)."""
    best = (60.0, 1.0, -1.0)
    for k in (1, 5, 10, 20, 40, 60, 100):
        for w in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0):
            score = 0.0
            for a, b, q in zip(knn, bm25, questions, strict=True):
                m = question_metrics(rrf_rank([a, b], k, [1.0, w]), q.evidence)
                score += m["R@5"] + m["R@10"]
            score /= max(1, len(questions))
            if score > best[2]:
                best = (float(k), float(w), score)
    return best


# --- embedder comparison (in process, exact cosine over each conversation's turns) ------------------------
async def compare_embedders(names: list[str], convs: list[Conversation]) -> list[dict[str, Any]]:
    """Quality (R@5/10 by exact cosine), speed and size of each embedder that can be loaded here."""
    from shared.embedding import make_embedder
    from shared.settings import Settings

    rows = []
    questions = [q for c in convs for q in c.questions]
    for name in names:
        try:
            embedder = make_embedder(Settings(embedder=name))
            t0 = time.perf_counter()
            await embedder.load()
            load_s = time.perf_counter() - t0
        except Exception as exc:  # a missing optional package: report and go on
            rows.append({"embedder": name, "error": str(exc)[:200]})
            continue
        try:
            texts = [t.text for c in convs for t in c.turns]
            t0 = time.perf_counter()
            turn_vecs = await embedder.embed(texts)
            rate = len(texts) / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            for q in questions[:50]:
                await embedder.embed([q.text])
            query_ms = 1000 * (time.perf_counter() - t0) / max(1, min(50, len(questions)))
            per_q: list[dict[str, float]] = []
            offset = 0
            for c in convs:
                tv = turn_vecs[offset : offset + len(c.turns)]
                offset += len(c.turns)
                if not c.questions:
                    continue
                qv = await embedder.embed([q.text for q in c.questions])
                sims = qv @ tv.T
                ids = [t.dia_id for t in c.turns]
                for q, row in zip(c.questions, sims, strict=True):
                    top = np.argsort(-row, kind="stable")[:TOP_K]
                    per_q.append(question_metrics([ids[i] for i in top], q.evidence))
            rows.append(
                {
                    "embedder": embedder.name,
                    "dim": embedder.dim,
                    "load_s": load_s,
                    "turns_per_s": rate,
                    "query_ms": query_ms,
                    **{m: float(np.mean([r[m] for r in per_q])) for m in ("R@5", "R@10", "R@25", "R@50")},
                }
            )
        finally:
            await embedder.aclose()
    return rows


# --- the run ----------------------------------------------------------------------------------------------
def build_configs(which: str) -> list[tuple[str, dict[str, Any]]]:
    """(row name, request body fields) of the service rows to run.

    "default" sends only the query, `top_k` and `as_of`: what an agent gets without tuning anything.
    The ablations run in the default mode; "sweep" adds RRF constants and presets for tuning.
    """
    sim = {"weights": {"similarity": 1.0}}
    rows = [
        ("default (no mode, no weights), R@k from one top_k 50 list", {}),
        ("vector · similarity-only", {"mode": "vector", **sim}),
        ("hybrid · similarity-only", {"mode": "hybrid", **sim}),
    ]
    if which == "quick":
        return rows + [("default mode · preset early", {"preset": "early"})]
    rows.append(("keyword · similarity-only", {"mode": "keyword", **sim}))
    for name, weights in ABLATIONS.items():
        if name == "similarity-only" or weights is None:
            continue
        rows.append((f"default mode · {name}", {"weights": weights}))
    if which == "sweep":
        for depth in (20, 50, 200):
            rows.append((f"default · candidates={depth}", {"candidates": depth}))
        for preset in ("early", "normal", "late"):
            rows.append((f"default mode · preset {preset}", {"preset": preset}))
    return rows


async def run(args: argparse.Namespace) -> dict[str, Any]:
    convs = load(args.data, conversations=args.conversations, questions=args.questions)
    questions = [q for c in convs for q in c.questions]
    cats = [q.category for q in questions]
    print(
        f"LoCoMo: {len(convs)} conversations, {sum(len(c.turns) for c in convs)} turns, "
        f"{len(questions)} questions with evidence; embedder {args.embedder}, {args.workers} worker(s)"
    )
    from shared.embedding import make_embedder as _make
    from shared.settings import Settings as _Settings

    resolved = _make(_Settings(embedder=args.embedder)).name  # lazy: loads no model
    out: dict[str, Any] = {
        "machine": machine(),
        "embedder": f"{args.embedder} ({resolved})" if args.embedder == "auto" else args.embedder,
        "workers": args.workers,
        "conversations": len(convs),
        "questions": len(questions),
        "rows": {},
    }
    prefix = f"locomo{uuid.uuid4().hex[:6]}:"
    per_q: dict[str, list[dict[str, float]]] = {}

    per_q["BM25 (rank_bm25, harness)"] = [
        question_metrics(ranked, q.evidence)
        for c in convs
        for ranked, q in zip(bm25_rankings(c), c.questions, strict=True)
    ]

    with private_redis() as server:
        env = service_env(server.url, prefix, args.embedder, ENGRAM_VECTOR_ALGORITHM=args.algorithm)
        workers = spawn_workers(args.workers, env, name="locomo")
        query = None
        try:
            t0 = time.perf_counter()
            n = await publish(server.url, prefix, convs)
            publish_s = time.perf_counter() - t0
            project_s = await wait_projected(server.url, prefix, convs, workers, timeout=args.timeout)
            out["ingest"] = {
                "episodes": n,
                "publish_s": publish_s,
                "publish_to_queryable_s": project_s,
                "episodes_per_s": n / max(1e-9, project_s),
            }
            print(
                f"ingest: {n} episodes published in {publish_s:.1f}s, all queryable after "
                f"{project_s:.1f}s ({n / max(1e-9, project_s):.0f} episodes/s)"
            )
            tokens_by_conv = {c.sample_id: f"bench{i}{uuid.uuid4().hex[:8]}" for i, c in enumerate(convs)}
            port = _free_port()
            query = spawn_query_service(
                {
                    **env,
                    "ENGRAM_API_KEYS": ",".join(
                        f"{tok}={c.namespace}" for c in convs for tok in [tokens_by_conv[c.sample_id]]
                    ),
                },
                port,
            )
            base = f"http://127.0.0.1:{port}"
            await wait_http_ready(base, query)
            latency: dict[str, float] = {}
            for name, body in build_configs(args.configs):
                ranked, p50 = await ask_all(
                    base, tokens_by_conv, convs, body, concurrency=args.concurrency, desc=name
                )
                latency[name] = p50 * 1000
                per_q[f"Engram {name}"] = [
                    question_metrics(r, q.evidence) for r, q in zip(ranked, questions, strict=True)
                ]
            # what an agent gets when it asks for k memories: R@k from a request with top_k = k; recall
            # is prefix-stable in top_k (ENGRAM_RECALL_CANDIDATES is independent of it), so this row equals the one-list default row
            per_k: dict[int, list[list[str]]] = {}
            for k in KS if args.per_k else ():
                per_k[k], _ = await ask_all(
                    base,
                    tokens_by_conv,
                    convs,
                    {"top_k": k},
                    concurrency=args.concurrency,
                    desc=f"default top_k={k}",
                )
            if per_k:
                per_q["Engram default, asked with top_k = k for each R@k"] = [
                    per_k_metrics({k: per_k[k][i] for k in KS}, q.evidence) for i, q in enumerate(questions)
                ]
            out["recall_p50_ms"] = latency

            if args.configs in ("full", "sweep"):
                from shared.embedding import make_embedder
                from shared.settings import Settings

                embedder = make_embedder(Settings(embedder=args.embedder), role="query")  # as the service
                try:
                    direct = await direct_rankings(server.url, prefix, convs, embedder)
                finally:
                    await embedder.aclose()
                per_q["FT.SEARCH BM25 order (harness)"] = [
                    question_metrics(r, q.evidence) for r, q in zip(direct["bm25"], questions, strict=True)
                ]
                per_q["RRF(KNN, BM25) k=60 (harness)"] = [
                    question_metrics(rrf_rank([a, b], 60, [1.0, 1.0]), q.evidence)
                    for a, b, q in zip(direct["knn"], direct["bm25"], questions, strict=True)
                ]
                k, w, _ = tune_rrf(direct["knn"], direct["bm25"], questions)
                out["rrf_tuned"] = {"k": k, "bm25_weight": w, "knn_weight": 1.0}
                per_q[f"RRF(KNN, BM25) k={k:g} w_bm25={w:g}, tuned on LoCoMo (harness)"] = [
                    question_metrics(rrf_rank([a, b], k, [1.0, w]), q.evidence)
                    for a, b, q in zip(direct["knn"], direct["bm25"], questions, strict=True)
                ]
        finally:
            if query is not None:
                qtail = stop_processes([query])[0]
                if "Traceback" in qtail or "ERROR" in qtail:
                    print("query service stderr:\n" + qtail, file=sys.stderr)
            tails = stop_processes(workers)
            if any("Traceback" in t for t in tails):
                print("worker stderr:\n" + "\n".join(tails), file=sys.stderr)

    for name, rows in per_q.items():
        out["rows"][name] = summarise(rows, cats, iterations=args.bootstrap)
        out["rows"][name]["per_question"] = rows  # in question order: `python -m bench.paired` pairs runs
    if args.compare_embedders:
        out["embedders"] = await compare_embedders(args.compare_embedders.split(","), convs)
    return out


def _free_port() -> int:
    from deploy.embedded_redis import free_port

    return free_port()


def render(out: dict[str, Any]) -> str:
    """The quality tables (Markdown)."""
    lines = []
    headers = ["retriever", "R@5 [95% CI]", "R@10", "R@25", "R@50", "hit@1", "hit@5", "hit@10", "NDCG@10"]
    rows: list[list[Any]] = [
        [
            "DRAGON (LoCoMo paper, Table 3)",
            f"{DRAGON['R@5']:.1f}",
            DRAGON["R@10"],
            DRAGON["R@25"],
            DRAGON["R@50"],
            math.nan,
            math.nan,
            math.nan,
            math.nan,
        ]
    ]
    for name, s in out["rows"].items():
        o = s["overall"]
        lo, hi = o["R@5"]["ci95"]
        rows.append(
            [name, f"{o['R@5']['mean']:.1f} [{lo:.1f}, {hi:.1f}]", *(o[m]["mean"] for m in METRIC_NAMES[1:])]
        )
    lines.append(
        f"All categories ({out['questions']} questions, {out['conversations']} conversations, "
        f"embedder {out['embedder']}):\n"
    )
    lines.append(table(headers, rows))
    cat_names = [f"{c} {n}" for c, n in CATEGORIES.items()]
    cat_rows = []
    for name, s in out["rows"].items():
        row: list[Any] = [name]
        for cat in cat_names:
            b = s["by_category"].get(cat)
            row.append(f"{b['R@5']['mean']:.1f} / {b['R@10']['mean']:.1f} (n={b['n']})" if b else "–")
        cat_rows.append(row)
    lines.append("\nBy category, R@5 / R@10:\n")
    lines.append(table(["retriever", *cat_names], cat_rows))
    if out.get("recall_p50_ms"):
        lines.append(
            "\nService latency, p50 per request (top_k 50): "
            + ", ".join(f"{k} {v:.1f} ms" for k, v in out["recall_p50_ms"].items())
        )
    if out.get("embedders"):
        lines.append("\nEmbedders (exact cosine over each conversation's turns, in process):\n")
        erows = []
        for e in out["embedders"]:
            if "error" in e:
                erows.append([e["embedder"], "not available: " + e["error"], "", "", "", "", ""])
            else:
                erows.append(
                    [e["embedder"], e["dim"], e["R@5"], e["R@10"], e["R@50"], e["turns_per_s"], e["query_ms"]]
                )
        lines.append(table(["embedder", "dim", "R@5", "R@10", "R@50", "turns/s", "query ms"], erows))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.locomo", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="path of locomo7.json")
    p.add_argument(
        "--embedder",
        default="auto",
        help="ENGRAM_EMBEDDER of the workers and the service (default: the service's default, auto)",
    )
    p.add_argument("--workers", type=int, default=1, help="consolidator processes")
    p.add_argument("--algorithm", default="HNSW", choices=("HNSW", "FLAT"), help="ENGRAM_VECTOR_ALGORITHM")
    p.add_argument("--conversations", type=int, default=None, help="use only the first N conversations")
    p.add_argument(
        "--questions", type=int, default=None, help="use only the first N questions per conversation"
    )
    p.add_argument(
        "--configs",
        choices=("quick", "full", "sweep"),
        default="full",
        help="quick: vector and hybrid rows only; full: every mode and ablation plus harness fusion",
    )
    p.add_argument("--concurrency", type=int, default=4, help="concurrent recall requests")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the 95%% intervals")
    p.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="seconds to wait for the projection (mpnet on 2 busy cores: 4-20 turns/s)",
    )
    p.add_argument("--compare-embedders", default="", help="comma-separated ENGRAM_EMBEDDER names to compare")
    p.add_argument(
        "--no-per-k",
        dest="per_k",
        action="store_false",
        help="skip the default rows asked with top_k = k for each cut (R@k then comes only from "
        "one top_k 50 recall per question, which recall's prefix stability makes the same)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results-locomo.json", help="result file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.data.exists():
        print(f"LoCoMo data not found at {args.data}: skipping the LoCoMo benchmark")
        return 0
    started = time.perf_counter()
    out = asyncio.run(run(args))
    out["wall_s"] = time.perf_counter() - started
    write_json(args.out, out)
    print(render(out))
    print(f"\nwrote {args.out} ({out['wall_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
