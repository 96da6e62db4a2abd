"""Prioritized recall: fetch candidates from RediSearch, score them with `shared.scoring`, explain the rank.

Pipeline of `POST /v1/recall`:
1. Scope → one pre-filter expression (`shared.index.Scope`), applied *inside* every candidate query, so
   a narrow scope still yields `top_k` results when they exist.
2. Candidates (`candidates`): the pool is the union of fixed-depth lists of the scope — `vector`:
   KNN; `keyword`: BM25; `hybrid`: both; plus, for each of recency, reward and importance that carries
   weight, the scope's top episodes by that signal (`arms`). The depth (default
   Settings.recall_candidates, 100) never depends on `top_k`, which only cuts: the first k of a `top_k`
   K recall are the `top_k` k recall. The non-similarity lists are fetched only when an episode
   outside the similarity lists could still reach the top_k (`Pool.outside` bounds its relevance;
   the candidates above that bound rank first either way, `_bounded_head`).
3. Relevance (`shared.relevance`): the cosine, an absolute keyword relevance from the episode's text,
   or their convex combination — a function of the query and the episode alone. Similarity in the
   response is always the cosine; for hits without one from the KNN the stored vector is read.
4. `shared.scoring.score` ranks the pool by priority; `min_relevance` / `min_priority` drop what is
   below them; the top `top_k` are returned with every signal and weighted term, plus a replay context
   of the strategies that worked.
All I/O goes through `shared.index`; this module owns no query syntax.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import redis.asyncio as aioredis

from engram_episodic.events import Episode
from engram_episodic.shapes import episode_to_dict, response_shape
from engram_episodic.timeutil import format_instant
from services.query import lists
from services.query.pool import (
    RETURN_FIELDS,
    SIMILARITY_ARMS,
    Candidate,
    Columns,
    QueryVector,
    arms,
    decode_hit,
    extra_candidates,
    similarity_pool,
    vector_of,
)
from services.query.sizes import ScopeSizes
from shared import scoring, tracing
from shared.embedding import EmbeddingError
from shared.hybrid import hybrid_policy
from shared.index import (
    VECTOR_FIELD,
    Scope,
    count,
    filter_search,
)
from shared.regimes import approach
from shared.search import knn_search
from shared.tags import TagCodec

log = logging.getLogger("engram.query")

_TOUCH = """
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('HINCRBY', key, 'access_count', 1)
    redis.call('HSET', key, 'last_accessed', ARGV[1])
  end
end
return 0
"""


def scope_of(namespace: str, req: Any, tags: TagCodec, *, category: tuple[str, ...] | None = None) -> Scope:
    """The Scope of a request model: the namespace is the server's, every filter the model has is used;
    `tags` is the live generation's digest function (`shared.tags`). `category`, when given, replaces the
    model's own `category` as the filter: `()` for a route whose `category` is not a filter (context,
    strategy: filtering by it there, a guessed category emptied the prompt)."""

    def get(name: str, default: Any = None) -> Any:
        return getattr(req, name, default)

    def bounds(name: str) -> tuple[float | None, float | None]:
        r = get(name)
        return r.bounds() if r is not None else (None, None)

    cat = get("category") if category is None else category
    if isinstance(cat, str):
        cat = (cat,)
    return Scope(
        namespace=namespace,
        tags=tags,
        agent_id=get("agent_id"),
        user_id=get("user_id"),
        session_id=get("session_id"),
        category=tuple(cat or ()),
        outcome=tuple(get("outcome") or ()),
        strategy=tuple(get("strategy") or ()),
        reward=bounds("reward"),
        importance=bounds("importance"),
        since=get("since"),
        until=get("until"),
        live_at=time.time(),  # expired episodes are hidden from every read, before the sweep erases them
    )


async def load_episodes(r: aioredis.Redis, cands: list[Candidate]) -> list[Candidate]:
    """Fill `doc` of each candidate from its stored document (one pipeline); drops the ones that
    vanished or cannot be read (a forget that landed between ranking and loading). Documents are not
    re-validated here: the consolidator wrote them from validated events."""
    if not cands:
        return []
    missing = [c for c in cands if c.raw_doc is None]
    if missing:
        async with r.pipeline(transaction=False) as pipe:
            for c in missing:
                pipe.hget(c.key, "doc")
            for c, raw in zip(missing, await pipe.execute(), strict=True):
                c.raw_doc = raw
    out = []
    for c in cands:
        if c.raw_doc is None:
            continue
        try:
            doc = orjson.loads(c.raw_doc)
        except orjson.JSONDecodeError as exc:
            log.error("unreadable episode document ◆ key=%r ◆ %s", c.key[:80], str(exc)[:200])
            continue
        if not isinstance(doc, dict) or "episode_id" not in doc:
            log.error("unreadable episode document ◆ key=%r ◆ not an episode", c.key[:80])
            continue
        c.doc = doc
        out.append(c)
    return out


def episode_json(episode: Episode) -> dict[str, Any]:
    """The episode in its ingest shape with ISO 8601 timestamps and derived fields (the response form)."""
    return episode_to_dict(episode, iso=True, include_vector=False)


async def _cosines(r: aioredis.Redis, keys: list[bytes], query: np.ndarray) -> list[float]:
    """Cosine between `query` and each document's stored vector (NaN when missing or of another size)."""
    if not keys:
        return []
    async with r.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hget(key, VECTOR_FIELD)
        blobs = await pipe.execute()
    qn = float(np.linalg.norm(query))
    out = []
    for blob in blobs:
        if not blob or len(blob) != query.shape[0] * 4:
            out.append(math.nan)
            continue
        v = np.frombuffer(blob, dtype=np.float32)
        vn = float(np.linalg.norm(v))
        out.append(float(np.dot(query, v) / (qn * vn)) if qn > 0 and vn > 0 else math.nan)
    return out


def score_candidates(
    cands: Columns,
    weights: scoring.Weights,
    *,
    half_life: float,
    as_of: float,
    normalize: scoring.Normalize = "none",
    recency_from: scoring.RecencyFrom = "completed",
) -> scoring.Scored:
    """Vectorised priority of the pool's rows (see shared.scoring for the formula)."""
    data = scoring.Candidates(
        completed_at=np.where(np.isfinite(cands.completed_at), cands.completed_at, 0.0),
        cos=np.where(np.isfinite(cands.relevance), cands.relevance, cands.cos),
        last_accessed=cands.last_accessed,
        reward=cands.reward,
        outcome_score=scoring.outcome_scores(cands.outcomes),
        importance=cands.importance,
        tie=cands.tie,
    )
    with tracing.span("engram.recall.score", candidates=len(cands)):
        return scoring.score(
            data, weights, half_life=half_life, as_of=as_of, normalize=normalize, recency_from=recency_from
        )


async def resolve_weights(
    r: aioredis.Redis,
    index: str,
    scope: Scope,
    preset: str | None,
    weights: dict[str, float] | None,
    sizes: ScopeSizes | None = None,
) -> tuple[str, scoring.Weights, int | None]:
    """Explicit weights win; else the preset; `auto` (the default) counts the episodes in the scope.
    Returns (the preset's name or "custom", the weights, the scope's episode count when it was counted)."""
    if weights is not None:
        return (*scoring.resolve_weights(None, scoring.Weights(**weights), 0), None)
    if preset not in (None, "auto"):
        return (*scoring.resolve_weights(preset, None, 0), None)
    size = await sizes.size(r, index, scope) if sizes is not None else await count(r, index, scope)
    return (*scoring.resolve_weights(preset, None, size), size)


async def touch(r: aioredis.Redis, keys: list[bytes], now: float) -> None:
    """access_count += 1 and last_accessed = now on each document that still exists (never recreates one)."""
    if keys:
        await r.eval(_TOUCH, len(keys), *keys, repr(float(now)))


def _after_touch(results: list[dict[str, Any]], now: float) -> None:
    """The answered hits as `touch` left them (as a GET then reads them); the ranking stays the one before."""
    for result in results:
        result["access_count"] += 1
        result["last_accessed"] = format_instant(now)


def _passing(scored: scoring.Scored, min_relevance: float, min_priority: float) -> np.ndarray:
    """`scored.order` without the candidates below `min_relevance` or `min_priority` (vectorised)."""
    keep = (scored.similarity >= min_relevance) & (scored.priority >= min_priority)
    return scored.order[keep[scored.order]]


def _bounded_head(
    scored: scoring.Scored, w: scoring.Weights, outside: float, min_relevance: float, min_priority: float
) -> list[int] | None:
    """The passing candidates of the similarity pool whose priority is above the most an episode outside
    the similarity lists could score (`w.similarity * outside + (w.total - w.similarity)`, `outside`
    being `Pool.outside`), best first, as indices into `scored`; None when no outsider could pass
    `min_relevance` / `min_priority` at all (the other lists cannot change the answer).

    With an exact KNN (FLAT, or the brute-force policy) no outsider can rank above the head, so a recall
    whose top_k all lie in it skips the recency / reward / importance lists. Under HNSW the bound is
    approximate — the graph can miss an episode closer than its last hit, which only those lists would
    then bring in — so a recall that does fetch them still ranks the head first: otherwise the first k
    of a `top_k` K recall (lists fetched) could differ from a `top_k` k recall (skipped), measured with
    HNSW M 2 / EF_RUNTIME 1 in tests/integration/test_recall_properties.py. The head depends on the pool
    and the weights alone, never on top_k, so every top_k is a prefix of the same ranking."""
    best_outside = w.similarity * outside + (w.total - w.similarity)
    if best_outside < min_priority or outside < min_relevance:
        return None
    order = _passing(scored, min_relevance, min_priority)
    return order[scored.priority[order] > best_outside].tolist()


def _ranked(scored: scoring.Scored, head: list[int], min_relevance: float, min_priority: float) -> list[int]:
    """The passing candidates best first, `head` (`_bounded_head` of the similarity pool, whose indices
    the appended lists leave unchanged) before the rest."""
    order = _passing(scored, min_relevance, min_priority).tolist()
    if not head:
        return order
    fixed = set(head)
    return head + [i for i in order if i not in fixed]


@dataclass(frozen=True, slots=True)
class RecallParams:
    """One recall's choices, built once per request (`services.query.views.recall`) from its model and
    the settings: `top_k` cuts the ranking of a pool of `depth` hits per arm, found by `mode`; the weights
    are `weights` or the `preset`'s; `half_life`, `as_of`, `normalize` and `recency_from` shape the
    scores; `touch_now` (or None) stamps the answered episodes; `min_relevance` and `min_priority`
    drop candidates before the cut."""

    top_k: int
    depth: int
    mode: str
    preset: str | None
    weights: dict[str, float] | None
    half_life: float
    as_of: float
    normalize: scoring.Normalize
    recency_from: scoring.RecencyFrom
    touch_now: float | None
    min_relevance: float = 0.0
    min_priority: float = 0.0
    graph_index: bool = True
    """The index is HNSW (`ENGRAM_VECTOR_ALGORITHM`): a broad filter's KNN may walk it in batches."""
    graph_ef: int = 0
    """The HNSW index's EF_RUNTIME (`Settings.hnsw_ef_runtime`; 0 for FLAT): a KNN crowded by duplicate
    vectors is asked again with a wider beam (`shared.hybrid.widened_ef`)."""
    common_idf: float = 0.0  # Settings.bm25_common_idf (similarity_pool)


async def _knn_policy(
    r: aioredis.Redis, index: str, size: int | None, sizes: ScopeSizes | None, *, graph: bool
) -> str | None:
    """The similarity KNN's `HYBRID_POLICY` (`shared.hybrid`). It needs the scope's size, known only
    where the `auto` preset counted it: a count is a filter query as costly as an ad-hoc KNN, so it is
    never made for the policy alone."""
    if sizes is None or not size or not graph:
        return None
    return hybrid_policy(size, await sizes.indexed(r, index), graph=graph)


async def recall(
    r: aioredis.Redis,
    index: str,
    scope: Scope,
    query: str,
    query_vector: QueryVector,
    params: RecallParams,
    *,
    sizes: ScopeSizes | None = None,
) -> dict[str, Any]:
    """The `POST /v1/recall` response body (see the module docstring).

    `query_vector` may still be computing (`services.query.pool.QueryVector`): the searches that need
    none run meanwhile. The ranking does not depend on `params.top_k`, which only cuts it: the pool (`candidates`, `depth` hits
    per arm) and every score are the same for any `top_k` <= depth; min_relevance / min_priority cut first.
    """
    p = params
    top_k, mode, half_life, as_of, normalize = p.top_k, p.mode, p.half_life, p.as_of, p.normalize
    recency_from, min_relevance, min_priority = p.recency_from, p.min_relevance, p.min_priority
    preset_name, w, size = await resolve_weights(r, index, scope, p.preset, p.weights, sizes)
    depth = max(p.depth, top_k)
    policy = await _knn_policy(r, index, size, sizes, graph=p.graph_index)
    pool_of = functools.partial(
        similarity_pool,
        policy=policy,
        sizes=sizes,
        common_idf=p.common_idf,
        graph_ef=p.graph_ef,
    )
    pool = await pool_of(r, index, scope, query, query_vector, mode=mode, depth=depth)
    # the winners' cosines need it in keyword mode too, where it is all that needs it
    vector = (
        await vector_of(query_vector) if mode != "keyword" else await keyword_cosines_vector(query_vector)
    )
    cands = pool.cands
    extra = [n for n in arms(mode, w, recency_from) if n not in SIMILARITY_ARMS]
    scored = None
    head: list[int] = []  # pool indices ranked from the similarity lists alone (see `_bounded_head`)
    if extra and len(cands) and normalize == "none":
        # the recency / reward / importance lists can only matter if an episode outside the similarity
        # lists could still make the top_k: its priority is at most w_sim * pool.outside + (1 - w_sim)
        scored = score_candidates(
            cands, w, half_life=half_life, as_of=as_of, normalize=normalize, recency_from=recency_from
        )
        bounded = _bounded_head(scored, w, pool.outside, min_relevance, min_priority)
        head = bounded or []
        if bounded is None or len(bounded) >= top_k:
            extra = []  # none can: the answer is the same without fetching them
    if extra:
        cands = cands + await extra_candidates(r, index, scope, query_vector, pool, extra, depth=depth)
        scored = None
    results: list[dict[str, Any]] = []
    chosen: list[Candidate] = []
    docs: list[dict[str, Any]] = []
    priorities: list[float] = []
    if len(cands):
        if scored is None:
            scored = score_candidates(
                cands, w, half_life=half_life, as_of=as_of, normalize=normalize, recency_from=recency_from
            )
        order = _ranked(scored, head, min_relevance, min_priority)
        winners = {i: cands.candidate(i) for i in order[:top_k]}  # objects for the winners alone
        loaded = {id(c) for c in await load_episodes(r, list(winners.values()))}
        if len(loaded) < len(winners):  # some vanished meanwhile: fill from the next best ones
            refill = {i: cands.candidate(i) for i in order[top_k : top_k + (len(winners) - len(loaded))]}
            loaded |= {id(c) for c in await load_episodes(r, list(refill.values()))}
            winners |= refill
        picked = [i for i in order if i in winners and id(winners[i]) in loaded][:top_k]
        await _winners_cosines(r, [winners[i] for i in picked], vector)
        for i in picked:
            c = winners[i]
            if c.doc is None:  # not in `loaded`, which `picked` is drawn from
                continue
            docs.append(c.doc)
            parts = scored.breakdown(i)
            priority = parts.pop("priority")
            chosen.append(c)
            priorities.append(priority)
            results.append(
                {
                    "episode": response_shape(c.doc),
                    "similarity": _similarity(c.cos, vector is not None),
                    "relevance": float(scored.similarity[i]),
                    "recency": float(scored.recency[i]),
                    "age_s": float(scored.age[i]),
                    "components": parts,
                    "priority": priority,
                    "access_count": c.access_count,
                    "last_accessed": format_instant(c.last_accessed)
                    if math.isfinite(c.last_accessed)
                    else None,
                }
            )
    if p.touch_now is not None:
        await touch(r, [c.key for c in chosen], p.touch_now)
        _after_touch(results, p.touch_now)
    context = scoring.replay_context(
        [
            approach(d.get("strategy_used"), (a.get("action_type") for a in d.get("actions") or ()))
            for d in docs
        ],
        [(d.get("feedback") or {}).get("reward") for d in docs],
        [d.get("outcome") for d in docs],
        priorities,
        [c.completed_at if math.isfinite(c.completed_at) else None for c in chosen],
    )
    for entry in context["strategies"]:
        if entry["changed_at"] is not None:
            entry["changed_at"] = format_instant(entry["changed_at"])
    body: dict[str, Any] = {
        "results": results,
        "replay_context": context,
        "as_of": format_instant(as_of),
        "weights": w.as_dict(),
        "preset": preset_name,
        "mode": mode,
        "half_life": half_life,
        "normalize": normalize,
        "recency_from": recency_from,
        "candidates": len(cands),
        "min_relevance": min_relevance,
        "min_priority": min_priority,
    }
    if vector is None:
        body["similarity_unavailable"] = True
    return body


async def _winners_cosines(r: aioredis.Redis, winners: list[Candidate], vector: np.ndarray | None) -> None:
    """Set the cosine of each winner without one (keyword mode's), unless the vector is unknown."""
    no_cos = [c for c in winners if not math.isfinite(c.cos)]
    if vector is not None and no_cos:
        for c, cos in zip(no_cos, await _cosines(r, [c.key for c in no_cos], vector), strict=True):
            c.cos = cos


def _similarity(cos: float, known: bool) -> float | None:
    """A result's `similarity`: the cosine clipped at 0 (0 without a stored vector), None when the query
    vector is unknown (`keyword_cosines_vector`)."""
    if not known:
        return None
    return max(0.0, float(cos)) if math.isfinite(cos) else 0.0


async def keyword_cosines_vector(query_vector: QueryVector) -> np.ndarray | None:
    """The query vector of a keyword recall, or None when the embedder failed (EmbeddingError): keyword
    mode ranks by the episodes' words alone and needs the vector only for the winners' `similarity`,
    so it answers without it (each `similarity` null, `similarity_unavailable` true) instead of a 503.
    The failure is logged as one warning."""
    try:
        return await vector_of(query_vector)
    except EmbeddingError as exc:
        log.warning("keyword recall without cosines: the embedder is unavailable ◆ %s", str(exc)[:300])
        return None


async def similar(
    r: aioredis.Redis,
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


async def latest(
    r: aioredis.Redis, index: str, scope: Scope, n: int, *, oldest_first: bool = False, offset: int = 0
) -> list[Candidate]:
    """The `n` most recently completed episodes of the scope, newest first, ties by tie-break (or the
    oldest first, from `offset`). The newest are `services.query.lists.top_by`'s list, narrowed from a
    floor a recall of the scope left (`hint_for`) instead of sorting the whole scope."""
    if not oldest_first and offset == 0 and n > 0:
        hint = lists.hint_for(index, scope, "completed_at", n)
        newest = await lists.top_by(r, index, scope, "completed_at", n, RETURN_FIELDS, hint=hint)
        return [c for c in (decode_hit(h) for h in newest) if c is not None]
    _, hits = await filter_search(
        r,
        index,
        scope,
        return_fields=RETURN_FIELDS,
        sort_by="completed_at",
        descending=not oldest_first,
        offset=offset,
        limit=n,
    )
    return [c for c in (decode_hit(h) for h in hits) if c is not None]
