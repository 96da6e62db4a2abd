"""The model embedders on each backend, side by side in one run: torch vs ONNX Runtime (float, int8).

    python -m bench.embed_backends [--embedder mpnet] [--backends torch,onnx,onnx-int8] [--threads 1,2]
        [--turns 512] [--long 64] [--queries 40]

For each backend and intra-op thread count, in one process on one machine: single query latency
(p50/p95 of one-text `embed` calls, LoCoMo questions), throughput on LoCoMo dialogue turns and on
2,000-character texts (made by joining consecutive turns), and the cosine agreement of its vectors
with torch's on the same turns. Ratios are to torch at the same thread count. The LoCoMo file is read
by path (../shared/data/locomo/locomo7.json); the ONNX export is made once in `--cache` if missing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import int_list, table
from bench.locomo import DEFAULT_DATA
from bench.locomo import all_texts as locomo_texts  # the name tests and callers import from here
from bench.perf_corpus import long_texts  # one joiner for every bench: published texts end on a character


async def measure_round(
    embedder: Any, turns: list[str], longs: list[str], queries: list[str], acc: dict[str, Any]
) -> None:
    """One round of each measurement on this round's share of the texts, added into `acc`."""
    for q in queries:
        t0 = time.perf_counter()
        await embedder.embed([q])
        acc["lat"].append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    acc["vectors"].append(await embedder.embed(turns))
    acc["turn_s"] += time.perf_counter() - t0
    acc["turns"] += len(turns)
    t0 = time.perf_counter()
    await embedder.embed(longs)
    acc["long_s"] += time.perf_counter() - t0
    acc["longs"] += len(longs)


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (backend, threads) variant loaded at once, then `--rounds` rounds that each measure every
    variant on a new share of the texts: the machine's load drifts, and interleaving spreads it evenly."""
    import torch

    from shared.embedding import MiniLMEmbedder, MPNetEmbedder

    model = {"minilm": MiniLMEmbedder, "mpnet": MPNetEmbedder}[args.embedder]
    turns, questions = locomo_texts(args.data)
    rng = np.random.default_rng(0)
    sample = [turns[i] for i in sorted(rng.choice(len(turns), min(args.turns, len(turns)), replace=False))]
    longs = long_texts(turns, args.long)
    queries = [questions[i] for i in rng.choice(len(questions), args.queries, replace=False)]
    variants: dict[tuple[str, int], tuple[Any, dict[str, Any]]] = {}
    for threads in args.threads:
        for backend in args.backends:
            embedder = model(backend=backend, threads=threads, cache_dir=args.cache, batch_size=64)
            t0 = time.perf_counter()
            await embedder.load()
            if backend.startswith("onnx") and embedder.runs_on != backend and args.force:
                force(embedder, backend, threads)
            await embedder.embed(sample[:8])  # warm-up: first-call allocations
            acc: dict[str, Any] = {"load_s": time.perf_counter() - t0, "lat": [], "vectors": []}
            acc.update(turn_s=0.0, turns=0, long_s=0.0, longs=0)
            variants[(backend, threads)] = (embedder, acc)
    k = args.rounds
    for r in range(k):
        for (backend, threads), (embedder, acc) in variants.items():
            if backend == "torch":
                torch.set_num_threads(threads)  # process-wide: set before each torch variant's turn
            await measure_round(embedder, sample[r::k], longs[r::k], queries[r::k], acc)
        print(f"round {r + 1}/{k} done", flush=True)
    rows: list[dict[str, Any]] = []
    for (_backend, threads), (embedder, acc) in variants.items():
        lat = sorted(acc["lat"])
        row = {
            "backend": embedder.runs_on,
            "threads": threads,
            "load_s": acc["load_s"],
            "query_p50_ms": 1000 * statistics.median(lat),
            "query_p95_ms": 1000 * lat[int(0.95 * (len(lat) - 1))],
            "turns_per_s": acc["turns"] / acc["turn_s"],
            "long_per_s": acc["longs"] / acc["long_s"],
        }
        ref = variants.get(("torch", threads))
        if ref is not None:
            cos = (np.concatenate(ref[1]["vectors"]) * np.concatenate(acc["vectors"])).sum(axis=1)
            row["cos_mean"], row["cos_min"] = float(cos.mean()), float(cos.min())
        rows.append(row)
        await embedder.aclose()
    gc.collect()
    return rows


def force(embedder: Any, variant: str, threads: int) -> None:
    """Run `variant` even though the agreement gate refused it (to measure what the gate turned down)."""
    import shared.embedding_onnx as eo

    source = Path(embedder.model_path())
    target, manifest = eo.ensure_export(source, Path(embedder.cache_dir), embedder.NAME, threads=threads)
    embedder._model = eo.OnnxSentenceModel(
        target / eo.FILES[variant],
        source,
        max_seq_length=int(manifest["max_seq_length"]),
        threads=threads,
        variant=variant,
    )
    embedder.runs_on = f"{variant} (forced past the gate)"


async def quality(args: argparse.Namespace) -> list[dict[str, Any]]:
    """LoCoMo evidence recall (R@5, R@10 by exact cosine of each question against its conversation's
    turns, as `bench.locomo --compare-embedders`) per backend, on the first `--quality` conversations."""
    from bench.locomo import TOP_K, load, question_metrics
    from shared.embedding import MiniLMEmbedder, MPNetEmbedder

    model = {"minilm": MiniLMEmbedder, "mpnet": MPNetEmbedder}[args.embedder]
    convs = load(args.data, conversations=args.quality)
    rows = []
    for backend in args.backends:
        embedder = model(backend=backend, threads=max(args.threads), cache_dir=args.cache, batch_size=64)
        await embedder.load()
        if backend.startswith("onnx") and embedder.runs_on != backend and args.force:
            force(embedder, backend, max(args.threads))
        per_q: list[dict[str, float]] = []
        for c in convs:
            turn_vecs = await embedder.embed([t.text for t in c.turns])
            sims = (await embedder.embed([q.text for q in c.questions])) @ turn_vecs.T
            ids = [t.dia_id for t in c.turns]
            for q, row in zip(c.questions, sims, strict=True):
                ranked = [ids[i] for i in np.argsort(-row, kind="stable")[:TOP_K]]
                per_q.append(question_metrics(ranked, q.evidence))
        rows.append(
            {
                "backend": embedder.runs_on,
                "questions": len(per_q),
                **{m: float(np.mean([r[m] for r in per_q])) for m in ("R@5", "R@10")},
            }
        )
        print(rows[-1], flush=True)
        await embedder.aclose()
    return rows


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    base = {r["threads"]: r for r in rows if r["backend"] == "torch"}
    out = []
    for r in rows:
        b = base.get(r["threads"])

        def ratio(key: str, r: dict[str, Any] = r, b: dict[str, Any] | None = b) -> str:
            return f" (x{r[key] / b[key]:.2f})" if b and b is not r else ""

        out.append(
            [
                r["backend"],
                r["threads"],
                f"{r['query_p50_ms']:.1f}{ratio('query_p50_ms')}",
                f"{r['query_p95_ms']:.1f}",
                f"{r['turns_per_s']:.1f}{ratio('turns_per_s')}",
                f"{r['long_per_s']:.2f}{ratio('long_per_s')}",
                f"{r.get('cos_mean', float('nan')):.4f} / {r.get('cos_min', float('nan')):.4f}",
                f"{r['load_s']:.1f}",
            ]
        )
    head = [
        "backend",
        "threads",
        "query p50 ms",
        "p95 ms",
        "turns/s",
        "2,000-char/s",
        "cos to torch mean/min",
        "load s",
    ]
    title = f"{args.embedder}: {args.turns} LoCoMo turns, {args.long} texts of 2,000 characters, {args.queries} queries"
    return title + "\n" + table(head, out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--embedder", default="mpnet", choices=("minilm", "mpnet"))
    p.add_argument("--backends", default="torch,onnx,onnx-int8", type=lambda s: s.split(","))
    p.add_argument("--threads", default="2", type=int_list)
    p.add_argument("--turns", type=int, default=512)
    p.add_argument("--long", type=int, default=64)
    p.add_argument("--queries", type=int, default=40)
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds over the variants")
    p.add_argument("--cache", default=None, help="ENGRAM_MODEL_CACHE (default ~/.cache/engram)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--force", action="store_true", help="run an ONNX variant the agreement gate refuses")
    p.add_argument(
        "--quality", type=int, default=0, help="LoCoMo R@5/R@10 on the first N conversations instead"
    )
    args = p.parse_args()
    if args.quality:
        rows = asyncio.run(quality(args))
        print(
            table(
                ["backend", "questions", "R@5", "R@10"],
                [[r["backend"], r["questions"], f"{r['R@5']:.1f}", f"{r['R@10']:.1f}"] for r in rows],
            )
        )
        return
    print(render(asyncio.run(run(args)), args))


if __name__ == "__main__":
    main()
