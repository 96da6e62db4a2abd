"""Re-ranking probe on LoCoMo: ingest once, cache the service's candidates, re-rank offline.

Two phases, so that a re-ranker variant costs only its own model time:

1. `collect` (~10 min with mpnet): the real path of `bench.locomo` (SDK publish, a consolidator process,
   a query-service process, one API key per conversation), then one `POST /v1/recall` per question for
   each service variant (`VARIANTS`: the default, candidate depths, presets, similarity only), each asked
   first to warm the query-vector cache and then again, one request at a time, for its p50 latency. Each
   question's ranked ids with relevance / similarity / priority, every turn's stored vector (read from
   Redis: the very vectors the service ranks with) and every question's query vector are written to
   `--cache` (default /tmp/engram-rerank/cache.npz + .json, outside the repository: LoCoMo is CC BY-NC).
2. `evaluate`: re-rankers over the head (`--depth`, default 50) of the default variant's list, their
   knobs tuned on the tune conversations (the first `--tune` of the file) and reported on the rest
   (held-out) and overall, R@5 / R@10 exactly as `bench.locomo.question_metrics` defines them.

Usage: `python -m bench.rerank_probe collect` then `python -m bench.rerank_probe evaluate`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson

from bench.common import (
    http_pool,
    private_redis,
    service_env,
    spawn_query_service,
    spawn_workers,
    stop_processes,
    wait_http_ready,
)
from bench.locomo import DEFAULT_DATA, Conversation, load, publish, question_metrics, wait_projected

CACHE = Path("/tmp/engram-rerank/cache")
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "default, top_k 100": {"top_k": 100},
    "candidates 30": {"candidates": 30, "top_k": 30},
    "candidates 50": {"candidates": 50},
    "candidates 200": {"candidates": 200},
    "candidates 400": {"candidates": 400},
    "hybrid · similarity-only": {"mode": "hybrid", "weights": {"similarity": 1.0}},
    "preset early": {"preset": "early"},
    "preset normal": {"preset": "normal"},
    "preset late": {"preset": "late"},
}


# --- phase 1: the service ---------------------------------------------------------------------------------
async def ask(
    base: str, tokens: dict[str, str], convs: list[Conversation], body: dict[str, Any], *, concurrency: int
) -> tuple[list[dict[str, Any]], list[float]]:
    """One recall per question; per question the ranked ids and scores, and every request's latency (s)."""
    from engram_episodic import AsyncEngram
    from engram_episodic.client import Calls
    from engram_episodic.options import RecallOptions

    jobs = [(c, q) for c in convs for q in c.questions]
    out: list[dict[str, Any]] = [{} for _ in jobs]
    lat: list[float] = []
    sem = asyncio.Semaphore(concurrency)
    async with http_pool(max(1, concurrency), 300.0) as http:
        clients = {
            sid: AsyncEngram(base, api_key=tok, max_retries=0, http_client=http)
            for sid, tok in tokens.items()
        }

        async def one(i: int, conv: Conversation, q: Any) -> None:
            options = cast(RecallOptions, {"top_k": 50, "as_of": conv.as_of, **body})
            call = Calls.recall(q.text, **options).as_json()
            async with sem:
                t0 = time.perf_counter()
                payload = await clients[conv.sample_id].call(call)
                lat.append(time.perf_counter() - t0)
            res = payload["results"]
            out[i] = {
                "ids": [r["episode"]["episode_id"] for r in res],
                "relevance": [r["relevance"] for r in res],
                "similarity": [r["similarity"] for r in res],
                "priority": [r["priority"] for r in res],
            }

        await asyncio.gather(*(one(i, c, q) for i, (c, q) in enumerate(jobs)))
    return out, lat


async def stored_vectors(
    redis_url: str, prefix: str, convs: list[Conversation]
) -> dict[str, dict[str, np.ndarray]]:
    """namespace → episode_id → the vector the consolidator stored (float32)."""
    from shared.redis_conn import connect

    wanted = {c.namespace for c in convs}
    out: dict[str, dict[str, np.ndarray]] = {ns: {} for ns in wanted}
    r = connect(redis_url)
    try:
        async for key in r.scan_iter(match=f"{prefix}*", count=1000):
            if await r.type(key) != b"hash":
                continue
            # the id from the document: the episode_id TAG field holds a digest (shared.tags)
            ns, doc, vec = await r.hmget(key, "namespace", "doc", "vector")
            if ns is None or doc is None or vec is None or ns.decode() not in wanted:
                continue
            out[ns.decode()][orjson.loads(doc)["episode_id"]] = np.frombuffer(vec, dtype=np.float32).copy()
    finally:
        await r.aclose()
    return out


async def collect(args: argparse.Namespace) -> None:
    from deploy.embedded_redis import free_port
    from shared.embedding import make_embedder
    from shared.settings import Settings

    convs = load(args.data, conversations=args.conversations, questions=args.questions)
    prefix = f"rrprobe{uuid.uuid4().hex[:6]}:"
    result: dict[str, Any] = {"variants": {}, "latency_ms": {}, "embedder": args.embedder}
    with private_redis() as server:
        env = service_env(server.url, prefix, args.embedder)
        workers = spawn_workers(1, env, name="rrprobe")
        query = None
        try:
            t0 = time.perf_counter()
            n = await publish(server.url, prefix, convs)
            project_s = await wait_projected(server.url, prefix, convs, workers, timeout=3600)
            print(
                f"ingest: {n} episodes queryable after {project_s:.0f}s ({time.perf_counter() - t0:.0f}s)",
                flush=True,
            )
            tokens = {c.sample_id: f"rr{i}{uuid.uuid4().hex[:8]}" for i, c in enumerate(convs)}
            port = free_port()
            query = spawn_query_service(
                {**env, "ENGRAM_API_KEYS": ",".join(f"{tokens[c.sample_id]}={c.namespace}" for c in convs)},
                port,
            )
            base = f"http://127.0.0.1:{port}"
            await wait_http_ready(base, query)
            await ask(base, tokens, convs, {}, concurrency=4)  # warms the query-vector cache
            for name, body in VARIANTS.items():
                ranked, lat = await ask(base, tokens, convs, body, concurrency=1)
                result["variants"][name] = ranked
                result["latency_ms"][name] = {
                    "p50": 1000 * float(np.median(lat)),
                    "p90": 1000 * float(np.percentile(lat, 90)),
                }
                r5 = np.mean(
                    [
                        question_metrics(r["ids"], q.evidence)["R@5"]
                        for r, q in zip(ranked, [q for c in convs for q in c.questions], strict=True)
                    ]
                )
                print(f"{name:32s} R@5 {r5:5.1f}  p50 {result['latency_ms'][name]['p50']:.1f} ms", flush=True)
            vectors = await stored_vectors(server.url, prefix, convs)
        finally:
            if query is not None:
                stop_processes([query])
            stop_processes(workers)
    embedder = make_embedder(Settings(embedder=args.embedder))
    try:
        qvecs = await embedder.embed([q.text for c in convs for q in c.questions])
    finally:
        await embedder.aclose()
    ids = [f"{c.namespace}|{t.dia_id}" for c in convs for t in c.turns]
    tvecs = np.stack([vectors[c.namespace][t.dia_id] for c in convs for t in c.turns])
    args.cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(args.cache.with_suffix(".npz"), turns=tvecs, questions=np.asarray(qvecs, dtype=np.float32))
    result["turn_keys"] = ids
    args.cache.with_suffix(".json").write_text(json.dumps(result))
    print(f"wrote {args.cache}.json/.npz")


# --- phase 2: offline re-rankers -----------------------------------------------------------------------------
class Data:
    """The cache joined with the LoCoMo questions."""

    def __init__(self, args: argparse.Namespace):
        self.convs = load(args.data, conversations=args.conversations, questions=args.questions)
        raw = json.loads(args.cache.with_suffix(".json").read_text())
        arrays = np.load(args.cache.with_suffix(".npz"))
        self.variants: dict[str, list[dict[str, Any]]] = raw["variants"]
        self.latency: dict[str, dict[str, float]] = raw["latency_ms"]
        self.questions = [q for c in self.convs for q in c.questions]
        self.conv_of = [i for i, c in enumerate(self.convs) for _ in c.questions]
        self.qvec = arrays["questions"]
        keys = raw["turn_keys"]
        self.row = {k: i for i, k in enumerate(keys)}
        self.tvec = arrays["turns"]
        self.text = {f"{c.namespace}|{t.dia_id}": t.text for c in self.convs for t in c.turns}
        self.ns = [self.convs[ci].namespace for ci in self.conv_of]
        n = len(self.convs)
        self.tune = set(range(args.tune)) if args.split == "first" else set(range(n - args.tune, n))


def metrics(data: Data, ranked: list[list[str]], subset: str) -> dict[str, float]:
    rows = [
        question_metrics(r, q.evidence)
        for r, q, ci in zip(ranked, data.questions, data.conv_of, strict=True)
        if subset == "all" or (ci in data.tune) == (subset == "tune")
    ]
    return {m: float(np.mean([r[m] for r in rows])) for m in ("R@5", "R@10")} | {"n": len(rows)}


def held_delta(data: Data, ranked: list[list[str]], base: list[list[str]], metric: str = "R@5") -> str:
    """Held-out mean difference against `base` with a paired percentile-bootstrap 95% interval."""
    d = np.array(
        [
            question_metrics(a, q.evidence)[metric] - question_metrics(b, q.evidence)[metric]
            for a, b, q, ci in zip(ranked, base, data.questions, data.conv_of, strict=True)
            if ci not in data.tune
        ]
    )
    rng = np.random.default_rng(0)
    boots = [float(d[rng.integers(0, len(d), len(d))].mean()) for _ in range(1000)]
    return f"{d.mean():+.1f} [{np.percentile(boots, 2.5):+.1f}, {np.percentile(boots, 97.5):+.1f}]"


def by_category(data: Data, ranked: list[list[str]]) -> str:
    from bench.locomo import CATEGORIES

    parts = []
    for cat, name in CATEGORIES.items():
        rows = [
            question_metrics(r, q.evidence)["R@5"]
            for r, q in zip(ranked, data.questions, strict=True)
            if q.category == cat
        ]
        parts.append(f"{name} {np.mean(rows):.1f}")
    return ", ".join(parts)


def rerank_neighbours(data: Data, depth: int, beta: float, base: list[dict[str, Any]]) -> list[list[str]]:
    """priority + beta * the best cosine of the turn before / after in the same session (dialog context)."""
    out = []
    for i, res in enumerate(base):
        ns, q = data.ns[i], data.qvec[i]
        head = res["ids"][:depth]
        scores = []
        for eid, p in zip(head, res["priority"][:depth], strict=True):
            s, t = eid[1:].split(":")
            best = 0.0
            for nb in (f"D{s}:{int(t) - 1}", f"D{s}:{int(t) + 1}"):
                row = data.row.get(f"{ns}|{nb}")
                if row is not None:
                    best = max(
                        best, float(data.tvec[row] @ q) / (np.linalg.norm(data.tvec[row]) * np.linalg.norm(q))
                    )
            scores.append(p + beta * best)
        order = np.argsort(-np.asarray(scores), kind="stable")
        out.append([head[j] for j in order] + res["ids"][depth:])
    return out


def second_opinion(data: Data, args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, float]:
    """Unit vectors of every turn and question by a second embedder (cached beside the cache), and its
    p50 ms to embed one question plus `--depth` turns (what scoring them at query time would cost)."""
    from shared.embedding import make_embedder
    from shared.settings import Settings

    path = args.cache.with_name(args.cache.name + f"-{args.second}.npz")
    texts = [t.text for c in data.convs for t in c.turns]
    embedder = make_embedder(Settings(embedder=args.second))

    async def run() -> tuple[np.ndarray, np.ndarray, float]:
        try:
            if path.exists():
                z = np.load(path)
                turns, qs = z["turns"], z["questions"]
            else:
                turns = np.asarray(await embedder.embed(texts), dtype=np.float32)
                qs = np.asarray(await embedder.embed([q.text for q in data.questions]), dtype=np.float32)
                np.savez(path, turns=turns, questions=qs)
            lat = []
            for i in range(20):
                head = [
                    data.text[f"{data.ns[i]}|{e}"] for e in data.variants["default"][i]["ids"][: args.depth]
                ]
                t0 = time.perf_counter()
                await embedder.embed([data.questions[i].text, *head])
                lat.append(time.perf_counter() - t0)
            return turns, qs, 1000 * float(np.median(lat))
        finally:
            await embedder.aclose()

    turns, qs, ms = asyncio.run(run())
    norm = lambda m: m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)  # noqa: E731
    return norm(turns), norm(qs), ms


def rerank_second(
    data: Data, depth: int, gamma: float, base: list[dict[str, Any]], turns: np.ndarray, qs: np.ndarray
) -> list[list[str]]:
    """priority + gamma * the second embedder's cosine (a bi-encoder as the re-ranker)."""
    keys = [f"{c.namespace}|{t.dia_id}" for c in data.convs for t in c.turns]
    row = {k: i for i, k in enumerate(keys)}
    out = []
    for i, res in enumerate(base):
        head = res["ids"][:depth]
        cos = turns[[row[f"{data.ns[i]}|{e}"] for e in head]] @ qs[i]
        scores = np.asarray(res["priority"][:depth]) + gamma * cos
        order = np.argsort(-scores, kind="stable")
        out.append([head[j] for j in order] + res["ids"][depth:])
    return out


def tuned(data: Data, grid: tuple[float, ...], make, label: str) -> tuple[float, list[list[str]]]:
    """The grid value with the best tune-split R@5 + R@10, and its ranking."""
    best: tuple[float, float] | None = None
    for g in grid:
        m = metrics(data, make(g), "tune")
        print(f"  {label} {g}: tune R@5 {m['R@5']:.1f} R@10 {m['R@10']:.1f}")
        if best is None or m["R@5"] + m["R@10"] > best[1]:
            best = (g, m["R@5"] + m["R@10"])
    assert best is not None
    return best[0], make(best[0])


Row = tuple[str, dict[str, float], dict[str, float], dict[str, float], str]


def _row(data: Data, label: str, ranked: list[list[str]], note: str) -> Row:
    """One line of the results table: `label`, the metrics of `ranked` on all, tune and held-out
    questions, and `note` (its latency or cost)."""
    return (
        label,
        metrics(data, ranked, "all"),
        metrics(data, ranked, "tune"),
        metrics(data, ranked, "held"),
        note,
    )


def evaluate(args: argparse.Namespace) -> None:
    data = Data(args)
    rows: list[Row] = []
    for name, ranked in data.variants.items():
        ids = [r["ids"] for r in ranked]
        lat = data.latency[name]
        rows.append(_row(data, f"service: {name}", ids, f"p50 {lat['p50']:.1f} ms"))
    base = data.variants["default"]
    beta, ranked = tuned(
        data,
        (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5),
        lambda b: rerank_neighbours(data, args.depth, b, base),
        "neighbours beta",
    )
    rows.append(
        _row(
            data,
            f"re-rank top {args.depth}: neighbour-turn context, beta {beta} (tuned)",
            ranked,
            "stored vectors only",
        )
    )
    default_ids = [r["ids"] for r in base]
    print(
        f"neighbour context, held-out R@5 - default: {held_delta(data, ranked, default_ids)}, "
        f"R@10: {held_delta(data, ranked, default_ids, 'R@10')}"
    )
    print(f"R@5 by category, default: {by_category(data, default_ids)}")
    print(f"R@5 by category, neighbour context: {by_category(data, ranked)}")
    if args.second:
        turns, qs, ms = second_opinion(data, args)
        gamma, ranked = tuned(
            data,
            (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0),
            lambda g: rerank_second(data, args.depth, g, base, turns, qs),
            f"{args.second} gamma",
        )
        rows.append(
            _row(
                data,
                f"re-rank top {args.depth}: + gamma {gamma} x {args.second} cosine (tuned)",
                ranked,
                f"+{ms:.0f} ms p50 to embed query + {args.depth} turns",
            )
        )
    print(f"\ntune = conversations {sorted(data.tune)} of {len(data.convs)}; held-out = the rest\n")
    print("| variant | R@5 all | R@10 all | R@5 tune | R@10 tune | R@5 held-out | R@10 held-out | latency |")
    print("|---|---|---|---|---|---|---|---|")
    for name, a, t, h, lat in rows:
        print(
            f"| {name} | {a['R@5']:.1f} | {a['R@10']:.1f} | {t['R@5']:.1f} | {t['R@10']:.1f} | "
            f"{h['R@5']:.1f} | {h['R@10']:.1f} | {lat} |"
        )
    print(f"(questions: all {rows[0][1]['n']}, tune {rows[0][2]['n']}, held-out {rows[0][3]['n']})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rerank_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("phase", choices=("collect", "evaluate"))
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--embedder", default="auto")
    p.add_argument("--cache", type=Path, default=CACHE)
    p.add_argument(
        "--tune", type=int, default=4, help="the first N conversations tune, the rest are held out"
    )
    p.add_argument("--conversations", type=int, default=None, help="only the first N (smoke runs)")
    p.add_argument("--questions", type=int, default=None, help="only the first N questions each (smoke runs)")
    p.add_argument(
        "--second", default="", help="a second ENGRAM_EMBEDDER as a bi-encoder re-ranker (e.g. minilm)"
    )
    p.add_argument(
        "--split",
        choices=("first", "last"),
        default="first",
        help="whether the tune conversations are the first or the last --tune of the file",
    )
    p.add_argument("--depth", type=int, default=50, help="candidates re-ranked per question")
    args = p.parse_args(argv)
    if not args.data.exists():
        print(f"LoCoMo data not found at {args.data}")
        return 0
    if args.phase == "collect":
        asyncio.run(collect(args))
    else:
        evaluate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
