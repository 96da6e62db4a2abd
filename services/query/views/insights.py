"""`GET /v1/skills`, `POST /v1/strategy`, `POST /v1/suggest`, `GET /v1/learning-curve`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from engram_episodic.timeutil import format_instant
from services.query import insights, models
from services.query import recall as rc
from services.query.appkeys import FLOORS, SETTINGS
from services.query.problems import read_json, validate
from services.query.recall.score import learning_curve as curve
from services.query.views.common import (
    embed,
    episode_of,
    index_of,
    ns_of,
    query_params,
    redis_of,
    reply,
    tags_of,
)
from shared.index import category_stats


async def _profiles(request: web.Request, req: Any, threshold: float) -> list[dict[str, Any]]:
    scope = rc.scope_of(ns_of(request), req, await tags_of(request), category=())
    rows = await category_stats(redis_of(request), index_of(request), scope)
    return insights.skill_profiles(rows, threshold)


async def skills(request: web.Request) -> web.Response:
    req: models.SkillsQuery = query_params(request, models.SkillsQuery)
    profiles = await _profiles(request, req, req.threshold)
    return reply(
        {
            "results": profiles,
            "weak": [p["category"] for p in profiles if p["weak"]],
            "threshold": req.threshold,
        }
    )


async def strategy(request: web.Request) -> web.Response:
    req: models.StrategyRequest = validate(models.StrategyRequest, await read_json(request))
    vector = await embed(request, req.task)
    similar = await rc.similar(
        redis_of(request),
        index_of(request),
        rc.scope_of(ns_of(request), req, await tags_of(request), category=()),
        vector,
        max(req.k, insights.ADVICE_POOL),
        req.min_similarity,
        graph_ef=request.app[SETTINGS].graph_ef,
    )
    profile = None
    if req.category:
        profile = next((p for p in await _profiles(request, req, 0.5) if p["category"] == req.category), None)
    choice = insights.choose_strategy(
        [episode_of(c) for c in similar], complexity=req.complexity, category_profile=profile, k=req.k
    )
    return reply({**choice, "pool": list(insights.STRATEGY_POOL)})


async def suggest(request: web.Request) -> web.Response:
    req: models.SuggestRequest = validate(models.SuggestRequest, await read_json(request))
    vector = await embed(request, req.task)
    scope = rc.scope_of(
        ns_of(request), req, await tags_of(request), category=(req.category,) if req.category else ()
    )
    similar = await rc.similar(
        redis_of(request),
        index_of(request),
        scope,
        vector,
        max(req.k, insights.ADVICE_POOL),
        req.min_similarity,
        graph_ef=request.app[SETTINGS].graph_ef,
    )
    return reply(insights.suggestion([episode_of(c) for c in similar], k=req.k))


async def learning_curve(request: web.Request) -> web.Response:
    req: models.LearningCurveQuery = query_params(request, models.LearningCurveQuery)
    scope = rc.scope_of(ns_of(request), req, await tags_of(request))
    # the newest `limit` episodes, drawn in time order (oldest first) as the curve reads
    newest = await rc.latest(redis_of(request), index_of(request), scope, req.limit, request.app[FLOORS])
    eps = [c.episode for c in reversed(newest)]
    points = insights_curve(eps, req.window)
    return reply({"results": points, "window": req.window})


def insights_curve(eps: list[Any], window: int) -> list[dict[str, Any]]:
    points = curve([e.feedback.reward if e.feedback else None for e in eps], [e.outcome for e in eps], window)
    for p, e in zip(points, eps, strict=True):
        p["episode_id"] = e.episode_id
        p["completed_at"] = format_instant(e.completed_at)
    return points
