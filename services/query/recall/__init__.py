"""Prioritized recall (`POST /v1/recall`, `POST /v1/context`): one request, in these files.

1. `plan.py`: the request's `RecallParams` and `Query` (scope, text, the embedding or the task computing
   it, the app's memories), resolved once into a `Plan`: weights (explicit, a preset, or `auto` by the
   scope's size, `sizes.py`), depth, the KNN's `HYBRID_POLICY`, the arms.
2. `pool.py` `similarity_pool`: the KNN and BM25 arms (`arms.py`, filtered by the whole scope) beside
   the model's pass, each member's cosine and relevance (`relevance.py`, `terms.py`).
3. `pool.py` `extra_candidates`: when an episode outside those lists could still rank (`_bounded_head`),
   the recency / reward / importance lists join the pool (`lists.py`: from remembered floors, exact);
   before them, `regime_candidates`: the failures alike old successes hide, what replaced an approach.
4. `score.py` `score` ranks the pool; `min_relevance` / `min_priority` drop what is below them.
5. `recall` (here) loads the `top_k` winners from the episode store (`services.query.store`), answers
   every signal and weighted term, the replay context of what worked, and stamps their access.
The depth never depends on `top_k`, which only cuts: the first k of a `top_k` K recall are the `top_k`
k recall.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import orjson

from engram_episodic.shapes import response_shape
from engram_episodic.timeutil import format_instant
from services.query.insights import REGIME_MIN
from services.query.recall import score
from services.query.recall.arms import knn_search
from services.query.recall.lists import Floors
from services.query.recall.plan import (
    SIMILARITY_ARMS,
    Plan,
    Query,
    RecallParams,
    plan,
    scope_of,
    vector_of,
)
from services.query.recall.pool import (
    RETURN_FIELDS,
    Candidate,
    Columns,
    decode_hit,
    extra_candidates,
    regime_candidates,
    regime_flips,
    similarity_pool,
)
from services.query.store import EpisodeStore
from shared import tracing
from shared.embedding import EmbeddingError
from shared.index import EmbedderMismatch, Scope
from shared.regimes import STALE, approach, superseded

__all__ = ["RETURN_FIELDS", "Candidate", "Query", "RecallParams", "decode_hit", "recall", "scope_of"]

log = logging.getLogger("engram.query")


async def load_episodes(store: EpisodeStore, cands: list[Candidate]) -> list[Candidate]:
    """Fill `doc` of each candidate from its stored document (one pipeline); drops the ones that vanished
    or cannot be read (a forget that landed between ranking and loading)."""
    out = []
    for c, raw in zip(cands, await store.field([c.key for c in cands], "doc"), strict=True):
        if raw is None:
            continue
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            log.error("unreadable episode document ◆ key=%r ◆ %s", c.key[:80], str(exc)[:200])
            continue
        if not isinstance(doc, dict) or "episode_id" not in doc:
            log.error("unreadable episode document ◆ key=%r ◆ not an episode", c.key[:80])
            continue
        c.doc = doc
        out.append(c)
    return out


def regime_roles(cands: Columns, listed: int, mode: str) -> tuple[np.ndarray, float | None]:
    """`shared.regimes.superseded` of the pool's `regime_flips` (evidence ranked by relevance) as int8[n]
    roles, 0 without a flip, and when the first superseded approach began failing (UTC epoch s; None
    without a flip). The rows are the decided episodes that are experience of the task in `mode`
    (`pool.experience`, as advice reads them): a success among them completed since an approach began
    failing is of its task (may be CURRENT), whatever its wording."""
    role = np.zeros(len(cands.outcomes), dtype=np.int8)
    found, flipped, decided = regime_flips(cands, listed, mode)
    if found is None or not flipped:
        return role, None
    rows, times, success, marks, key = found
    role[rows] = superseded(times, success, marks, key, REGIME_MIN, (flipped, decided))
    return role, min(times[idx[start]] for idx, start in flipped)


def score_candidates(
    cands: Columns, plan: Plan, listed: int, mode: str
) -> tuple[score.Scored, np.ndarray, float | None]:
    """The priority of the pool's rows (`score.score`), the regime term's roles from the pool itself
    (`regime_roles` in `mode`; the first `listed` rows are of the similarity lists), and those roles with
    when the superseded approach began failing."""
    p = plan.params
    roles, since = regime_roles(cands, listed, mode)
    data = score.Candidates(
        completed_at=np.where(np.isfinite(cands.completed_at), cands.completed_at, 0.0),
        cos=cands.relevance,
        last_accessed=cands.last_accessed,
        reward=cands.reward,
        outcome_score=score.outcome_scores(cands.outcomes),
        importance=cands.importance,
        regime=roles,
        tie=cands.tie,
    )
    with tracing.span("engram.recall.score", candidates=len(cands)):
        scored = score.score(
            data,
            plan.weights,
            half_life=p.half_life,
            as_of=p.as_of,
            normalize=p.normalize,
            recency_from=p.recency_from,
        )
    return scored, roles, since


def _passing(scored: score.Scored, p: RecallParams) -> np.ndarray:
    """`scored.order` without the candidates below `min_relevance` or `min_priority`."""
    keep = (scored.similarity >= p.min_relevance) & (scored.priority >= p.min_priority)
    return scored.order[keep[scored.order]]


def _bounded_head(scored: score.Scored, plan: Plan, outside: float) -> list[int] | None:
    """The passing candidates of the similarity pool whose priority is above the most an episode outside
    the similarity lists could score (`w.similarity * outside + (w.total - w.similarity)`, `outside`
    being `Pool.outside`), best first, as indices into `scored`; None when no outsider could pass
    `min_relevance` / `min_priority` at all. A recall whose top_k all lie in the head skips the other
    lists; under HNSW the bound is approximate, so a recall that does fetch them still ranks the head
    first: every top_k stays a prefix of the same ranking."""
    w, p = plan.weights, plan.params
    best_outside = w.similarity * outside + (w.total - w.similarity)
    if best_outside < p.min_priority or outside < p.min_relevance:
        return None
    order = _passing(scored, p)
    return order[scored.priority[order] > best_outside].tolist()


def _ranked(scored: score.Scored, head: list[int], p: RecallParams) -> list[int]:
    """The passing candidates best first, `head` (`_bounded_head`) before the rest."""
    order = _passing(scored, p).tolist()
    if not head:
        return order
    fixed = set(head)
    return head + [i for i in order if i not in fixed]


async def recall(q: Query, params: RecallParams) -> dict[str, Any]:
    """The `POST /v1/recall` response body (see the module docstring). Outside keyword mode, raises
    EmbeddingError when the embedder fails and Conflict (EmbedderMismatch among them) when the index
    holds another embedder's vectors; keyword mode answers without the cosines then
    (`similarity_unavailable`)."""
    pl = await plan(q, params)
    p, w = params, pl.weights
    pool = await similarity_pool(q, pl)
    await regime_candidates(q, pl, pool)
    listed = len(pool.cands)  # the extra lists' rows come after these
    try:  # the winners' cosines need it in keyword mode too, where it is all that needs it
        vector: np.ndarray | None = await vector_of(q.vector)
    except (EmbeddingError, EmbedderMismatch) as exc:  # keyword mode ranks by words alone: not a 503/409
        if p.mode != "keyword":
            raise
        why = "the embedder is unavailable" if isinstance(exc, EmbeddingError) else "another embedder's index"
        log.warning("keyword recall without cosines: %s ◆ %s", why, str(exc)[:300])
        vector = None
    cands = pool.cands
    extra = [n for n in pl.arms if n not in SIMILARITY_ARMS]
    scored = None
    roles, since = np.zeros(0, dtype=np.int8), None
    head: list[int] = []  # pool indices ranked from the similarity lists alone (see `_bounded_head`)
    if extra and len(cands) and p.normalize == "none":
        scored, roles, since = score_candidates(cands, pl, listed, pool.mode)
        bounded = _bounded_head(scored, pl, pool.outside)
        head = bounded or []
        if bounded is None or len(bounded) >= p.top_k:
            extra = []  # none can: the answer is the same without fetching them
    if extra:
        cands = cands + await extra_candidates(q, pl, pool, extra)
        scored = None
    results: list[dict[str, Any]] = []
    chosen: list[Candidate] = []
    if len(cands):
        if scored is None:
            scored, roles, since = score_candidates(cands, pl, listed, pool.mode)
        chosen, results = await _winners(q, scored, cands, _ranked(scored, head, p), p.top_k, vector)
    if p.touch_now is not None:
        await q.store.touch([c.key for c in chosen], p.touch_now)
        for result in results:  # as the touch left them (a GET then reads them); the ranking stays
            result["access_count"] += 1
            result["last_accessed"] = format_instant(p.touch_now)
    body: dict[str, Any] = {
        "results": results,
        "replay_context": _replay_context(chosen, [r["priority"] for r in results], cands, roles, since),
        "as_of": format_instant(p.as_of),
        "weights": w.as_dict(),
        "preset": pl.preset,
        "mode": p.mode,
        "half_life": p.half_life,
        "normalize": p.normalize,
        "recency_from": p.recency_from,
        "candidates": len(cands),
        "min_relevance": p.min_relevance,
        "min_priority": p.min_priority,
    }
    if vector is None:
        body["similarity_unavailable"] = True
    return body


async def _winners(
    q: Query, scored: score.Scored, cands: Columns, order: list[int], top_k: int, vector: np.ndarray | None
) -> tuple[list[Candidate], list[dict[str, Any]]]:
    """The first `top_k` of `order` whose documents load (the next best fill in for vanished ones), and
    their results."""

    async def load(rows: list[int]) -> list[tuple[int, Candidate]]:  # objects for the winners alone
        found = [(i, cands.candidate(i)) for i in rows]
        kept = {id(c) for c in await load_episodes(q.store, [c for _, c in found])}
        return [(i, c) for i, c in found if id(c) in kept]

    picked = await load(order[:top_k])
    if len(picked) < len(order[:top_k]):  # some vanished meanwhile: fill from the next best ones
        picked += await load(order[top_k : top_k + len(order[:top_k]) - len(picked)])
    no_cos = [c for _, c in picked if not math.isfinite(c.cos)]  # keyword mode's
    if vector is not None and no_cos:
        for c, cos in zip(no_cos, await q.store.cosines([c.key for c in no_cos], vector), strict=True):
            c.cos = cos
    results = []
    for i, c in picked:
        parts = scored.breakdown(i)
        priority = parts.pop("priority")
        similarity = None  # the query vector is unknown (a keyword recall without the embedder)
        if vector is not None:  # the cosine clipped at 0; 0 without a stored vector
            similarity = max(0.0, float(c.cos)) if math.isfinite(c.cos) else 0.0
        results.append(
            {
                "episode": response_shape(c.doc or {}),
                "similarity": similarity,
                "relevance": float(scored.similarity[i]),
                "recency": float(scored.recency[i]),
                "age_s": float(scored.age[i]),
                "components": parts,
                "priority": priority,
                "access_count": c.access_count,
                "last_accessed": format_instant(c.last_accessed) if math.isfinite(c.last_accessed) else None,
            }
        )
    return [c for _, c in picked], results


def _replay_context(
    chosen: list[Candidate], priorities: list[float], cands: Columns, roles: np.ndarray, since: float | None
) -> dict[str, Any]:
    """`score.replay_context` of the answered episodes, `changed_at` as ISO 8601; the successes the pool
    shows superseded (`roles` of `cands`' rows, STALE) count as earlier ones, whatever `top_k` cut."""
    docs = [c.doc or {} for c in chosen]
    old = {cands.keys[i] for i in np.flatnonzero(roles == STALE)} if len(roles) else set()
    context = score.replay_context(
        [
            approach(d.get("strategy_used"), (a.get("action_type") for a in d.get("actions") or ()))
            for d in docs
        ],
        [(d.get("feedback") or {}).get("reward") for d in docs],
        [d.get("outcome") for d in docs],
        priorities,
        [c.completed_at if math.isfinite(c.completed_at) else None for c in chosen],
        stale=[c.key in old for c in chosen],
        since=since,
    )
    for entry in context["strategies"]:
        if entry["changed_at"] is not None:
            entry["changed_at"] = format_instant(entry["changed_at"])
    return context


async def similar(
    r: Any,
    index: str,
    scope: Scope,
    query_vector: np.ndarray,
    k: int,
    min_similarity: float,
    *,
    graph_ef: int = 0,
) -> list[Candidate]:
    """The `k` nearest episodes in the scope whose cosine is at least `min_similarity`; `graph_ef` as
    in `RecallParams`."""
    hits = await knn_search(r, index, scope, query_vector, k, return_fields=RETURN_FIELDS, graph_ef=graph_ef)
    out = []
    for h in hits:
        c = decode_hit(h)
        if c is not None and h.score is not None:
            c.cos = 1.0 - float(h.score)
            if c.cos >= min_similarity:
                out.append(c)
    return out


async def latest(r: Any, index: str, scope: Scope, n: int, floors: Floors) -> list[Candidate]:
    """The `n` most recently completed episodes of the scope, newest first, ties by tie-break:
    `Floors.top_by`'s list, narrowed from a floor a recall of the scope left (`Floors.hint_for`)
    instead of sorting the whole scope."""
    if n <= 0:
        return []
    hint = floors.hint_for(index, scope, "completed_at", n)
    newest = await floors.top_by(r, index, scope, "completed_at", n, RETURN_FIELDS, hint=hint)
    return [c for c in (decode_hit(h) for h in newest) if c is not None]
