"""`GET /v1/skills`, `POST /v1/strategy`, `POST /v1/suggest`, `GET /v1/learning-curve`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiohttp import web

from engram_episodic.events import Episode
from engram_episodic.timeutil import format_instant
from services.query import insights, models
from services.query import recall as rc
from services.query.appkeys import FLOORS, SETTINGS
from services.query.recall.score import learning_curve as curve
from services.query.views.common import (
    embed,
    episode_of,
    index_of,
    ns_of,
    redis_of,
    reply,
    tags_of,
)
from shared.index import category_stats


async def _profiles(request: web.Request, req: Any, threshold: float) -> list[dict[str, Any]]:
    scope = rc.scope_of(ns_of(request), req, await tags_of(request), category=())
    rows = await category_stats(redis_of(request), index_of(request), scope)
    return insights.skill_profiles(rows, threshold)


async def _similar(request: web.Request, body: Any, category: tuple[str, ...]) -> list[Episode]:
    """The episodes of the caller's scope (within `category`, () for all) nearest to `body.task`, at
    least `body.min_similarity` alike, most alike first: up to `body.k` or `insights.ADVICE_POOL`,
    whichever is more; while a search fills that, the nearest completed after the newest it found are
    searched too (at most `insights.ADVICE_SEARCHES` searches). Hundreds of alike old episodes would
    otherwise hide the newer ones, whose outcomes tell that an approach stopped working
    (`insights.current_evidence`)."""
    vector = await embed(request, body.task)
    scope = rc.scope_of(ns_of(request), body, await tags_of(request), category=category)
    n = max(body.k, insights.ADVICE_POOL)
    found: dict[bytes, rc.Candidate] = {}
    for _ in range(insights.ADVICE_SEARCHES):
        batch = await rc.similar(
            redis_of(request),
            index_of(request),
            scope,
            vector,
            n,
            body.min_similarity,
            graph_ef=request.app[SETTINGS].graph_ef,
        )
        fresh = [c for c in batch if c.key not in found]
        found.update((c.key, c) for c in fresh)
        if len(batch) < n or not fresh:
            break
        newest = max(episode_of(c).completed_at or 0.0 for c in fresh)
        scope = replace(scope, since=max(newest, scope.since or newest))
    similar = sorted(found.values(), key=lambda c: -c.cos)
    return [episode_of(c) for c in similar]


async def skills(request: web.Request, query: models.SkillsQuery) -> web.Response:
    """Per-category skill profiles and weak categories"""
    profiles = await _profiles(request, query, query.threshold)
    return reply(
        {
            "results": profiles,
            "weak": [p["category"] for p in profiles if p["weak"]],
            "threshold": query.threshold,
        }
    )


async def strategy(request: web.Request, body: models.StrategyRequest) -> web.Response:
    """Adaptive strategy choice for a task"""
    similar = await _similar(request, body, ())
    profile = None
    if body.category:
        profile = next(
            (p for p in await _profiles(request, body, 0.5) if p["category"] == body.category), None
        )
    choice = insights.choose_strategy(similar, complexity=body.complexity, category_profile=profile, k=body.k)
    return reply({**choice, "pool": list(insights.STRATEGY_POOL)})


async def suggest(request: web.Request, body: models.SuggestRequest) -> web.Response:
    """Confidence and common failures from similar episodes"""
    similar = await _similar(request, body, (body.category,) if body.category else ())
    return reply(insights.suggestion(similar, k=body.k))


async def learning_curve(request: web.Request, query: models.LearningCurveQuery) -> web.Response:
    """Cumulative and rolling reward and success rate"""
    scope = rc.scope_of(ns_of(request), query, await tags_of(request))
    # the newest `limit` episodes, drawn in time order (oldest first) as the curve reads
    newest = await rc.latest(redis_of(request), index_of(request), scope, query.limit, request.app[FLOORS])
    eps = [episode_of(c) for c in reversed(newest)]
    rewards = [e.feedback.reward if e.feedback else None for e in eps]
    points = curve(rewards, [e.outcome for e in eps], query.window)
    for p, e in zip(points, eps, strict=True):
        p["episode_id"] = e.episode_id
        p["completed_at"] = format_instant(e.completed_at)
    return reply({"results": points, "window": query.window})
