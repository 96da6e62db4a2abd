"""Two runs of a quality benchmark compared question by question (`python -m bench.paired A.json B.json`).

`bench.locomo` and `bench.bfcl` write each row's per-question metrics into their result file
(`per_question`, in question order). Two runs over the same questions (one setting changed between
them, e.g. `ENGRAM_EMBEDDER=minilm` then `mpnet`) are compared per row and metric: the mean
of each run and of B - A, with a paired percentile-bootstrap 95% interval over questions (resampling
questions, `bench.common.bootstrap_ci`). A paired interval is far narrower than two runs' own
intervals, which overlap for any small change. Rows whose questions differ in number are refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import bootstrap_ci


def per_question_rows(result: dict[str, Any]) -> dict[str, list[dict[str, float]]]:
    """{row name: per-question metric dicts} of a bench.locomo or bench.bfcl result file; ValueError
    when it holds none (a file written before `per_question` existed)."""
    rows: dict[str, list[dict[str, float]]] = {}
    for name, row in (result.get("rows") or {}).items():  # bench.locomo
        if "per_question" in row:
            rows[name] = row["per_question"]
    for ev, block in (result.get("evaluations") or {}).items():  # bench.bfcl
        for rel, entry in block.get("relevance", {}).items():
            if "per_question" in entry:
                rows[f"{ev} · {rel}"] = entry["per_question"]
    if not rows:
        raise ValueError("no per-question results in this file: rerun the benchmark with this checkout")
    return rows


def compare(
    a: dict[str, list[dict[str, float]]], b: dict[str, list[dict[str, float]]], *, iterations: int = 2000
) -> dict[str, dict[str, dict[str, float | list[float]]]]:
    """Per row present in both and per metric: {"a", "b", "diff", "diff_ci95": [lo, hi]} (points as the
    files hold them). ValueError when a shared row has another number of questions in each."""
    out: dict[str, dict[str, dict[str, float | list[float]]]] = {}
    for name in [n for n in a if n in b]:
        ra, rb = a[name], b[name]
        if len(ra) != len(rb):
            raise ValueError(f"{name}: {len(ra)} questions in the first file, {len(rb)} in the second")
        metrics = [m for m in ra[0] if m in rb[0]] if ra else []
        out[name] = {}
        for m in metrics:
            x = np.array([q[m] for q in ra], dtype=float)
            y = np.array([q[m] for q in rb], dtype=float)
            lo, hi = bootstrap_ci(y - x, iterations=iterations)
            out[name][m] = {
                "a": float(x.mean()),
                "b": float(y.mean()),
                "diff": float((y - x).mean()),
                "diff_ci95": [lo, hi],
            }
    return out


def render(result: dict[str, dict[str, dict[str, Any]]], metrics: list[str]) -> str:
    lines = ["| row | " + " | ".join(f"{m}: A → B (B − A [95%])" for m in metrics) + " |"]
    lines.append("|---|" + "---|" * len(metrics))
    for name, per in result.items():
        cells = []
        for m in metrics:
            c = per.get(m)
            cells.append(
                "–"
                if c is None
                else f"{c['a']:.1f} → {c['b']:.1f} ({c['diff']:+.2f} [{c['diff_ci95'][0]:+.2f}, "
                f"{c['diff_ci95'][1]:+.2f}])"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="the first run's result file (the baseline)")
    p.add_argument("b", type=Path, help="the second run's result file")
    p.add_argument("--metrics", default="R@5,R@10,NDCG@10", help="comma-separated, as the files name them")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
    args = p.parse_args(argv)
    try:
        a, b = (per_question_rows(json.loads(f.read_text(encoding="utf-8"))) for f in (args.a, args.b))
        result = compare(a, b, iterations=args.bootstrap)
    except (OSError, ValueError) as exc:
        print(f"bench.paired: {exc}", file=sys.stderr)
        return 2
    print(render(result, args.metrics.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
