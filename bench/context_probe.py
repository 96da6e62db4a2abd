"""Contextual embeddings on LoCoMo, offline: an episode's vector computed with the turn before it.

The re-ranking probe (`bench.rerank_probe`) found one lever with an effect: lifting a candidate by the
best cosine of its neighbouring turns. That makes an episode's score depend on other episodes at query
time. This probe measures ingest-time versions of it, where the score stays a function of (query,
stored episode) because the context is fixed when the episode is stored (the previous turn of the same
session is known then; the next one is not):

- `prev+own text`: the vector of `embed(previous turn + "\\n" + own text)` instead of `embed(own)`
  (Anthropic's "contextual retrieval", with the previous turn as the context); `own+prev text` the other
  order (own text first, so a long context is what the window cuts);
- `blend(own, ctx) λ`: normalise((1-λ)·own + λ·ctx) of the two vectors above;
- `mean(own, prev) λ`: normalise((1-λ)·own + λ·prev) of the own vectors (no second embedding);
- `second vector, max` / `sum w`: a second stored vector, the previous turn's own, scored as
  max(cos_own, cos_prev) or (1-w)·cos_own + w·cos_prev;
- `BM25 with prev text`: the previous turn's text also in the keyword side, in a field of weight
  `--ctx-weight` (idf counts include it).

The whole default ranking is recomputed offline for every episode of the namespace: hybrid relevance
0.5·max(0, cos) + 0.5·keyword (`shared.relevance`, idf from the namespace's own term counts), the `auto`
preset's weights for the namespace's size (`shared.scoring.score`, half-life 1 day, `as_of` as
`bench.locomo` sends). Candidate arms are not modelled (every episode is scored); `reproduce` in the
output says how often the simulated default's top 10 equals the service's (cached by `rerank_probe
collect`). Knobs are tuned on the tune conversations and reported on the held-out ones, with paired
bootstrap intervals against the simulated default (`rerank_probe.held_delta`).

Usage (after `python -m bench.rerank_probe collect`): `python -m bench.context_probe [--tune 4 --split
first|last]`. The contextual texts are embedded once with the cache's embedder and kept beside the cache
(`<cache>-ctx-<recipe>.npy`, outside the repository: LoCoMo is CC BY-NC).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.locomo import DEFAULT_DATA, Conversation
from bench.rerank_probe import CACHE, Data, by_category, held_delta, metrics
from shared import relevance, scoring

Ranked = list[list[str]]


def previous_turns(convs: list[Conversation]) -> list[int]:
    """Per turn (in the cache's order), the row of the turn before it in the same session, or -1."""
    out: list[int] = []
    row = 0
    for c in convs:
        last: dict[int, int] = {}
        for t in c.turns:
            out.append(last.get(t.session, -1))
            last[t.session] = row
            row += 1
    return out


def context_texts(convs: list[Conversation], recipe: str) -> list[str]:
    """Per turn, the text the contextual variant embeds: `prev_own` = previous turn, newline, own text;
    `own_prev` = own text, newline, previous turn (a session's first turn: its own text)."""
    texts = [t.text for c in convs for t in c.turns]
    prev = previous_turns(convs)
    if recipe == "prev_own":
        return [f"{texts[p]}\n{x}" if p >= 0 else x for x, p in zip(texts, prev, strict=True)]
    if recipe == "own_prev":
        return [f"{x}\n{texts[p]}" if p >= 0 else x for x, p in zip(texts, prev, strict=True)]
    raise ValueError(f"recipe must be prev_own or own_prev, got {recipe!r}")


def context_vectors(args: argparse.Namespace, data: Data, recipe: str) -> np.ndarray:
    """Unit vectors of `context_texts(recipe)` by the cache's embedder, cached beside the cache."""
    from shared.embedding import make_embedder
    from shared.settings import Settings

    path = args.cache.with_name(args.cache.name + f"-ctx-{recipe}.npy")
    if not path.exists():
        embedder = make_embedder(Settings(embedder=args.embedder))

        async def run() -> np.ndarray:
            try:
                return np.asarray(await embedder.embed(context_texts(data.convs, recipe)), dtype=np.float32)
            finally:
                await embedder.aclose()

        t0 = time.perf_counter()
        np.save(path, asyncio.run(run()))
        print(f"embedded {recipe} in {time.perf_counter() - t0:.0f} s → {path}", flush=True)
    return unit(np.load(path))


def unit(m: np.ndarray) -> np.ndarray:
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)


class Sim:
    """Everything the default ranking needs that does not depend on the episode vectors."""

    def __init__(self, data: Data, ctx_weight: float | None):
        self.data = data
        turns = [t for c in data.convs for t in c.turns]
        self.ids = [t.dia_id for t in turns]
        self.prev = np.asarray(previous_turns(data.convs))
        bounds = np.cumsum([0] + [len(c.turns) for c in data.convs])
        self.rows = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(data.convs))]
        fields = []
        for i, t in enumerate(turns):
            f = {"task": t.text}
            if ctx_weight is not None and self.prev[i] >= 0:
                f["context"] = turns[self.prev[i]].text
            fields.append(f)
        self.keyword = self._keyword(fields, ctx_weight)
        self.ts = np.asarray([t.ts for t in turns])
        sizes = [len(c.turns) for c in data.convs]
        self.weights = [scoring.resolve_weights(None, None, n)[1] for n in sizes]

    def _keyword(self, fields: list[dict[str, str]], ctx_weight: float | None) -> list[np.ndarray]:
        """Per question, the keyword relevance of every episode of its namespace (shared.relevance)."""
        extra = (("context", ctx_weight),) if ctx_weight is not None else ()
        terms = [relevance.episode_terms(f, extra) for f in fields]
        df = [Counter(s for r in rows for s in terms[r][0]) for rows in self.rows]
        out = []
        for qi, q in enumerate(self.data.questions):
            rows = self.rows[self.data.conv_of[qi]]
            words = relevance.query_words(q.text)
            counts = [df[self.data.conv_of[qi]][stem] for stem in words]
            qterms = relevance.query_terms(words, counts)
            out.append(np.asarray([relevance.keyword_relevance(qterms, *terms[r]) for r in rows]))
        return out

    def rank(self, cos_of: Callable[[int, np.ndarray], np.ndarray], top: int = 10) -> Ranked:
        """Per question, the top ids by the default priority with cosines `cos_of(question, rows)`."""
        out = []
        for qi in range(len(self.data.questions)):
            ci = self.data.conv_of[qi]
            rows = self.rows[ci]
            cos = cos_of(qi, rows)
            rel = (
                relevance.HYBRID_VECTOR_WEIGHT * np.maximum(cos, 0.0)
                + (1.0 - relevance.HYBRID_VECTOR_WEIGHT) * self.keyword[qi]
            )
            scored = scoring.score(
                scoring.Candidates(
                    completed_at=self.ts[rows],
                    cos=rel,
                    outcome_score=np.ones(len(rows)),  # bench.locomo publishes outcome "success"
                ),
                self.weights[ci],
                half_life=86400.0,
                as_of=self.data.convs[ci].as_of,
            )
            out.append([self.ids[rows[j]] for j in scored.order[:top]])
        return out


def variants(sim: Sim, data: Data, own: np.ndarray, ctx: dict[str, np.ndarray]) -> dict[str, Callable]:
    """name → (knob → cos_of) for every vector variant; a variant without a knob ignores it."""
    q = unit(data.qvec)
    prev_own = np.where((sim.prev >= 0)[:, None], own[np.maximum(sim.prev, 0)], own)

    def single(m: np.ndarray) -> Callable[[int, np.ndarray], np.ndarray]:
        return lambda qi, rows: m[rows] @ q[qi]

    def mixed(a: np.ndarray, b: np.ndarray, lam: float) -> Callable[[int, np.ndarray], np.ndarray]:
        return single(unit((1.0 - lam) * a + lam * b))

    def second_max(_: float) -> Callable[[int, np.ndarray], np.ndarray]:
        return lambda qi, rows: np.maximum(own[rows] @ q[qi], prev_own[rows] @ q[qi])

    def second_sum(w: float) -> Callable[[int, np.ndarray], np.ndarray]:
        return lambda qi, rows: (1.0 - w) * (own[rows] @ q[qi]) + w * (prev_own[rows] @ q[qi])

    out: dict[str, Callable] = {
        "default (own text)": lambda _: single(own),
        "mean(own, prev) λ": lambda lam: mixed(own, prev_own, lam),
        "second vector, max": second_max,
        "second vector, sum w": second_sum,
    }
    for recipe, m in ctx.items():
        name = "prev+own text" if recipe == "prev_own" else "own+prev text"
        out[name] = lambda _, m=m: single(m)
        out[f"blend(own, {name}) λ"] = lambda lam, m=m: mixed(own, m, lam)
    return out


KNOBS = {
    "mean(own, prev) λ": (0.1, 0.2, 0.3, 0.4, 0.5),
    "second vector, sum w": (0.1, 0.2, 0.3, 0.4, 0.5),
    "blend(own, prev+own text) λ": (0.25, 0.5, 0.75),
    "blend(own, own+prev text) λ": (0.25, 0.5, 0.75),
}


def evaluate(args: argparse.Namespace) -> None:
    data = Data(args)
    own = unit(data.tvec)
    ctx = {r: context_vectors(args, data, r) for r in args.recipes}
    sims = {"own text": Sim(data, None)}
    if args.ctx_weight:
        sims[f"+ prev text, weight {args.ctx_weight}"] = Sim(data, args.ctx_weight)
    service = [r["ids"] for r in data.variants["default"]]
    base_sim = sims["own text"]
    default = base_sim.rank(variants(base_sim, data, own, ctx)["default (own text)"](0.0))
    same = np.mean([a[:10] == b[:10] for a, b in zip(default, service, strict=True)])
    top5 = np.mean([set(a[:5]) == set(b[:5]) for a, b in zip(default, service, strict=True)])
    print(
        f"reproduce: simulated default top 10 = the service's for {100 * same:.1f}% of questions, "
        f"top-5 sets {100 * top5:.1f}%; R@5 simulated {metrics(data, default, 'all')['R@5']:.1f}, "
        f"service {metrics(data, service, 'all')['R@5']:.1f}",
        flush=True,
    )
    rows = []
    for kw_name, sim in sims.items():
        for name, make in variants(sim, data, own, ctx).items():
            grid = KNOBS.get(name, (0.0,))
            best, ranked = None, None
            for g in grid:
                r = sim.rank(make(g))
                m = metrics(data, r, "tune")
                if best is None or m["R@5"] + m["R@10"] > best[1]:
                    best, ranked = (g, m["R@5"] + m["R@10"]), r
            assert best is not None and ranked is not None
            knob = f" = {best[0]}" if len(grid) > 1 else ""
            label = f"{name}{knob} · BM25 {kw_name}"
            a, h = metrics(data, ranked, "all"), metrics(data, ranked, "held")
            rows.append(
                (label, a, h, held_delta(data, ranked, default), held_delta(data, ranked, default, "R@10"))
            )
            print(f"  {label}: all R@5 {a['R@5']:.1f}, held-out R@5 {h['R@5']:.1f} {rows[-1][3]}", flush=True)
            if args.categories:
                print(f"    {by_category(data, ranked)}")
    tune = sorted(i + 1 for i in data.tune)
    held = sorted(i + 1 for i in range(len(data.convs)) if i not in data.tune)
    print(f"\ntune = conversations {tune}, held-out = {held} (knobs tuned on R@5 + R@10 of the tune ones)\n")
    print("| variant | R@5 | R@10 | R@5 held-out (Δ [95%]) | R@10 held-out (Δ [95%]) |")
    print("|---|---|---|---|---|")
    for label, a, h, d5, d10 in rows:
        print(
            f"| {label} | {a['R@5']:.1f} | {a['R@10']:.1f} | {h['R@5']:.1f} ({d5}) | {h['R@10']:.1f} ({d10}) |"
        )
    print(f"(questions: all {len(data.questions)}, held-out {rows[0][2]['n']})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.context_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--cache", type=Path, default=CACHE)
    p.add_argument("--embedder", default="auto", help="must be the one the cache was collected with")
    p.add_argument("--tune", type=int, default=4)
    p.add_argument("--split", choices=("first", "last"), default="first")
    p.add_argument("--conversations", type=int, default=None)
    p.add_argument("--questions", type=int, default=None)
    p.add_argument("--recipes", nargs="*", default=["prev_own", "own_prev"], choices=("prev_own", "own_prev"))
    p.add_argument(
        "--ctx-weight", type=float, default=1.0, help="BM25F weight of the previous turn's text (0 = not run)"
    )
    p.add_argument("--categories", action="store_true", help="R@5 per LoCoMo category for every row")
    args = p.parse_args(argv)
    if not args.data.exists():
        print(f"LoCoMo data not found at {args.data}")
        return 0
    evaluate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
