"""`POST /v1/recall` and `POST /v1/context` (working memory): each builds one `RecallParams` from its
request model and the settings, then calls `services.query.recall.recall`; the context's facts come from
the provider under `FACTS` (`facts_provider`, unless `make_app(facts=...)` gave another)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from aiohttp import web

from engram_episodic.shapes import episode_to_dict
from services.query import insights, models
from services.query import recall as rc
from services.query.answers import FactBrief
from services.query.appkeys import FACTS, FLOORS, METRICS, SETTINGS, FactsProvider
from services.query.problems import Invalid
from services.query.recall.relevance import CONTEXT_FLOOR
from services.query.views.common import (
    embed,
    episode_of,
    index_of,
    ns_of,
    query_of,
    redis_of,
    reply,
    tags_of,
)
from shared.facts import FactQuery, live_facts_index, search_facts
from shared.index import Scope
from shared.keys import Keys
from shared.settings import Settings


def recall_params(req: models.RecallRequest, s: Settings, now: float) -> rc.RecallParams:
    """`POST /v1/recall`: the request's choices, the settings' defaults for the rest, and the settings'
    index kind and `common_idf`. Invalid (422) when the depth, given or defaulted, is below `top_k`,
    given or defaulted."""
    top_k = req.top_k or s.default_top_k
    depth = req.candidates or max(s.recall_candidates, top_k)  # never from top_k alone: top_k only cuts
    if depth < top_k:
        raise Invalid([("candidates", "must be at least top_k")])
    return rc.RecallParams(
        top_k=top_k,
        depth=depth,
        mode=req.mode or s.recall_mode,
        preset=req.preset,
        weights=req.weights.model_dump() if req.weights else None,
        half_life=req.half_life or s.half_life,
        as_of=req.as_of if req.as_of is not None else now,
        normalize=req.normalize,
        recency_from=req.recency_from,
        touch_now=now if req.touch else None,
        min_relevance=req.min_relevance,
        min_priority=req.min_priority,
        graph_index=s.vector_algorithm == "HNSW",
        graph_ef=s.graph_ef,
        common_idf=s.bm25_common_idf,
    )


def context_params(req: models.ContextRequest, s: Settings, now: float) -> rc.RecallParams:
    """`POST /v1/context`: the recall of the task with every other choice left to the settings (their
    mode, the auto preset, as of now, touching nothing); without a `min_relevance`, the mode's floor
    (`relevance.CONTEXT_FLOOR`)."""
    floor = CONTEXT_FLOOR[s.recall_mode] if req.min_relevance is None else req.min_relevance
    recall = models.RecallRequest(
        query=req.task,
        top_k=req.top_k,
        half_life=req.half_life,
        min_relevance=floor,
        min_priority=req.min_priority,
    )
    return recall_params(recall, s, now)


async def recall(request: web.Request, body: models.RecallRequest) -> web.Response:
    """Prioritized recall of the episodes worth replaying"""
    params = recall_params(body, request.app[SETTINGS], time.time())
    start = time.perf_counter()
    scope = rc.scope_of(ns_of(request), body, await tags_of(request))
    async with overlapped(embed(request, body.query)) as vector:
        answer = await rc.recall(query_of(request, scope, body.query, vector), params)
    metrics = request.app[METRICS]
    metrics.recall_seconds.labels(params.mode).observe(time.perf_counter() - start)
    metrics.recall_candidates.observe(answer["candidates"])
    return reply(answer)


@contextlib.asynccontextmanager
async def overlapped(embedding: Coroutine[Any, Any, np.ndarray]) -> AsyncIterator[asyncio.Task[np.ndarray]]:
    """The query's embedding as a task started at once (`services.query.recall.plan.QueryVector`), so the
    recall's searches that need no vector run during the model's pass. A request that fails before
    awaiting it cancels it (the pass itself finishes for the texts sharing it, `QueryBatcher`)."""
    task = asyncio.ensure_future(embedding)
    try:
        yield task
    finally:
        if not task.done():
            task.cancel()
        elif not task.cancelled():
            task.exception()  # retrieved: a failure the request already answered is not logged again


def facts_provider(keys: Keys) -> FactsProvider:
    """The facts of `/v1/context`: current only, each text once, each the fields of `answers.FactBrief`."""

    async def provider(
        r: aioredis.Redis, scope: Scope, query_vector: np.ndarray, k: int
    ) -> list[dict[str, Any]]:
        q = FactQuery(
            namespace=scope.namespace,
            tags=scope.tags,
            agent_id=scope.agent_id,
            user_id=scope.user_id,
            category=scope.category,
        )
        # the namespace scope and an (agent, category) scope holding the same episodes give the same
        # fact twice (same text): read twice as deep, keep each text once (the better-scored), then cut
        hits = await search_facts(r, await live_facts_index(r, keys), q, vector=query_vector, top_k=2 * k)
        seen: set[str] = set()
        out = []
        for h in hits:
            # a fact pointing away from the task is no context for it (`/v1/facts/search`'s default)
            if h.fact.text in seen or (h.score is not None and h.score < 0.0):
                continue
            seen.add(h.fact.text)
            brief = {name: getattr(h.fact, name) for name in FactBrief.model_fields if name != "score"}
            out.append(brief | {"score": round(h.score, 6) if h.score is not None else None})
        return out[:k]

    return provider


async def context(request: web.Request, body: models.ContextRequest) -> web.Response:
    """Working memory and a ready prompt section for a task"""
    s = request.app[SETTINGS]
    r, index = redis_of(request), index_of(request)
    scope = rc.scope_of(ns_of(request), body, await tags_of(request), category=())
    async with overlapped(embed(request, body.task)) as pending:
        params = context_params(body, s, time.time())
        recalled = await rc.recall(query_of(request, scope, body.task, pending), params)
        # a keyword recall answered without the query's vector (`similarity_unavailable`): no facts by cosine
        unavailable = recalled.get("similarity_unavailable", False)
        vector = None if unavailable else await pending
    short_term = await rc.latest(r, index, scope, s.short_term_window, request.app[FLOORS])
    facts = await request.app[FACTS](r, scope, vector, 5) if vector is not None else []
    # a fact is no knowledge of the task below the floor a vector recall applies to episodes
    floor = CONTEXT_FLOOR["vector"] if body.min_relevance is None else body.min_relevance
    facts = [f for f in facts if f.get("score") is None or f["score"] >= floor]
    prompt, truncated = insights.prompt_section(
        body.task, body.category, recalled["results"], recalled["replay_context"], facts, body.max_chars
    )
    return reply(
        {
            "task": body.task,
            "category": body.category,
            "results": recalled["results"],
            "short_term": [episode_to_dict(episode_of(c), iso=True) for c in short_term],
            "replay_context": recalled["replay_context"],
            "facts": facts,
            "prompt": prompt,
            "truncated": truncated,
            "max_chars": body.max_chars,
            "preset": recalled["preset"],
            **({"similarity_unavailable": True} if unavailable else {}),
        }
    )
