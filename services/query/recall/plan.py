"""What one recall is: the request's choices (`RecallParams`), its inputs (`Query`: where, what, and the
app's memories) and the plan resolved from both once (`Plan`: weights, preset, depth, KNN policy, arms).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from services.query.recall.arms import hybrid_policy
from services.query.recall.lists import Floors
from services.query.recall.score import Normalize, RecencyFrom, Weights, resolve_weights
from services.query.recall.sizes import ScopeSizes
from services.query.recall.terms import Memos
from services.query.store import EpisodeStore
from shared.index import Scope
from shared.tags import TagCodec

QueryVector = np.ndarray | asyncio.Future
"""float32[dim], a query's embedding, or the task computing it (`services.query.views.recall`): the
searches that need no vector (the `auto` preset's count, the idf counts, BM25) run during the model's
pass, and await the vector where they need it."""


async def vector_of(vector: QueryVector) -> np.ndarray:
    """The embedding itself: awaited if still being computed (raises what the embedding raised)."""
    return await vector if isinstance(vector, asyncio.Future) else vector


def scope_of(namespace: str, req: Any, tags: TagCodec, *, category: tuple[str, ...] | None = None) -> Scope:
    """The Scope of a request model: the namespace is the server's, every filter the model has is used;
    `tags` is the live generation's digest function (`shared.tags`). `category`, when given, replaces the
    model's own (`()` for context and strategy, where a guessed category emptied the prompt)."""

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


@dataclass(frozen=True, slots=True)
class Query:
    """One recall's inputs: where (`r`, `index`, `scope`), what (`text`, `vector`), the episode store
    and the app's memories (`sizes`; `floors`, `memos`: the app's, fresh ones by default)."""

    r: aioredis.Redis
    index: str
    scope: Scope
    text: str
    vector: QueryVector
    store: EpisodeStore
    sizes: ScopeSizes
    floors: Floors = field(default_factory=Floors)
    memos: Memos = field(default_factory=Memos)


@dataclass(frozen=True, slots=True)
class RecallParams:
    """One recall's choices, from its request model and the settings (`services.query.views.recall`):
    `top_k` cuts the ranking of a pool of `depth` hits per arm, found by `mode`; the weights are
    `weights` or the `preset`'s; `half_life` (s), `as_of` (epoch s), `normalize` and `recency_from`
    shape the scores; `touch_now` (or None) stamps the answered episodes; `min_relevance` and
    `min_priority` drop candidates before the cut. `graph_index`: the index is HNSW; `graph_ef` its
    EF_RUNTIME (0 for FLAT: `arms.widened_ef`); `common_idf`: `Settings.bm25_common_idf`."""

    top_k: int
    depth: int
    mode: str
    preset: str | None
    weights: dict[str, float] | None
    half_life: float
    as_of: float
    normalize: Normalize
    recency_from: RecencyFrom
    touch_now: float | None
    min_relevance: float = 0.0
    min_priority: float = 0.0
    graph_index: bool = True
    graph_ef: int = 0
    common_idf: float = 0.0


@dataclass(frozen=True, slots=True)
class Plan:
    """A recall's choices resolved once (`plan`): `preset` as answered ("custom", "auto:normal", ...),
    the `weights`, the pool `depth` per arm (never below top_k), the KNN's `policy` and the `arms`."""

    params: RecallParams
    preset: str
    weights: Weights
    depth: int
    policy: str | None
    arms: tuple[str, ...]


async def plan(q: Query, p: RecallParams) -> Plan:
    """Explicit weights win; else the preset; `auto` (the default) counts the episodes in the scope, a
    count the KNN's `HYBRID_POLICY` then uses too (never counted for the policy alone: a count is a
    filter query as costly as an ad-hoc KNN). The request model checks the weights and the preset."""
    explicit = Weights(**p.weights) if p.weights is not None else None
    auto = explicit is None and p.preset in (None, "auto")
    size = await q.sizes.size(q.r, q.index, q.scope) if auto else 0
    name, weights = resolve_weights(p.preset, explicit, size)
    indexed = await q.sizes.indexed(q.r, q.index, q.scope.namespace) if size and p.graph_index else 0
    policy = hybrid_policy(size, indexed)  # None without a count
    return Plan(p, name, weights, max(p.depth, p.top_k), policy, arms(p.mode, weights, p.recency_from))


SIMILARITY_ARMS = ("knn", "bm25")


def arms(mode: str, weights: Weights, recency_from: str) -> tuple[str, ...]:
    """The candidate lists a recall draws from, in merge order: the similarity arms of the mode (`knn`,
    `bm25`), then, for each other signal that carries weight, the scope's top episodes by it (without
    them a recall weighted on recency could miss the scope's newest episode): `completed_at` (and
    `last_accessed` with recency_from "last_access") for recency, `reward`, `importance`. Outcome has
    no list: it is a category, its ties broken by recency."""
    out = []
    if mode in ("vector", "hybrid"):
        out.append("knn")
    if mode in ("keyword", "hybrid"):
        out.append("bm25")
    if weights.recency > 0:
        out.append("completed_at")
        if recency_from == "last_access":
            out.append("last_accessed")
    if weights.reward > 0:
        out.append("reward")
    if weights.importance > 0:
        out.append("importance")
    return tuple(out)
