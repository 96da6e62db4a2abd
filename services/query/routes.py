"""Thin views: parse and validate the request, call the domain code, shape the response.

`ROUTES` is the one table of the API: `add_routes` registers it and `services.query.openapi` documents it,
so the two cannot drift apart (a test checks it anyway). Lists are answered under `results`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, cast

import orjson
import redis.asyncio as aioredis
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from engram_episodic.errors import NotFound
from engram_episodic.events import Episode, EpisodeCompleted, new_event_id
from engram_episodic.timeutil import format_instant
from engram_episodic.validation import Collector, check_id, parse_episode
from services.consolidator import deadletters
from services.query import facts_routes, insights, models
from services.query import recall as rc
from services.query.app import (
    EMBEDDER,
    FACTS,
    KEYS,
    METRICS,
    QUERY_VECTORS,
    REDIS,
    SCOPE_SIZES,
    SETTINGS,
    TAGS,
)
from services.query.auth import NAMESPACE
from services.query.problems import Invalid, Problem, read_json, validate
from shared import streams
from shared.codec import peek_identity
from shared.index import category_stats, current_generation, index_exists
from shared.sdk import EngramClient
from shared.settings import Settings
from shared.tags import TagCodec

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
STATUS_PENDING = "pending"  # accepted into the stream, not yet projected by the consolidator
PENDING_SCAN = 10_000  # unacked entries a GET of an unknown id looks through (bounds its cost)
MAX_INGEST_WAIT = 30.0  # seconds POST /v1/episodes?wait= may hold a request
INGEST_WAIT_POLL = 0.02


def _json(data: Any, status: int = 200) -> web.Response:
    # orjson: the response encoding was ~10% of a recall's CPU with the stdlib encoder (bench/perf.py)
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY), status=status,
                        content_type="application/json")


def _ns(request: web.Request) -> str:
    return request[NAMESPACE]


def _redis(request: web.Request) -> aioredis.Redis:
    return request.app[REDIS]


def _index(request: web.Request) -> str:
    return request.app[KEYS].episode_index_alias


async def _tags(request: web.Request) -> TagCodec:
    """The live generation's TAG digests (`shared.tags`), for the Scope of this request."""
    return await request.app[TAGS].get(request.app[REDIS])


def _query_params(request: web.Request, model: type[BaseModel]) -> Any:
    params: dict[str, str] = {}
    for key in request.query:
        if not key:  # "?=x": pydantic would name it "<root>", as if the whole query were wrong
            raise Invalid([("<query>", "has a parameter without a name")])
        values = request.query.getall(key)
        if len(values) > 1:
            raise Invalid([(key, "must be given once")])
        params[key] = values[0]
    return validate(model, params)


async def _embed(request: web.Request, text: str):
    embedder = request.app[EMBEDDER]
    metrics = request.app[METRICS]
    start = time.perf_counter()
    vector = await request.app[QUERY_VECTORS].embed(embedder, text, namespace=_ns(request))
    metrics.embed_seconds.observe(time.perf_counter() - start)
    metrics.embed_truncations.set(embedder.truncations)
    return vector


def _client(request: web.Request, *, backpressure: bool = False) -> EngramClient:
    """A publisher for the caller's namespace. With `backpressure` (ingest), a consumer lag above
    ENGRAM_MAX_LAG raises Backpressure at once (→ 429 with Retry-After); forgetting is never held back."""
    s = request.app[SETTINGS]
    return EngramClient(_redis(request), namespace=_ns(request), prefix=s.prefix,
                        publish_timeout=s.publish_timeout, retries=s.publish_retries,
                        max_lag=s.max_lag if backpressure else None, wait_on_backpressure=False,
                        consumer_group=s.consumer_group, master_key=s.master_key)


def _no_query(request: web.Request) -> None:
    """Refuse query parameters on a route that takes none (other GET routes refuse unknown ones too)."""
    if request.query:
        raise Invalid([(key, "is not a known query parameter") for key in dict.fromkeys(request.query)])


def _path_id(request: web.Request, name: str) -> str:
    errs = Collector()
    value = check_id(request.match_info[name], name, errs, required=True)
    if errs.errors:
        raise Invalid(errs.errors)
    return value  # type: ignore[return-value]


# --- recall -----------------------------------------------------------------------------------------
def recall_params(req: models.RecallRequest, s: Settings, now: float) -> rc.RecallParams:
    """`POST /v1/recall`: the request's choices, the settings' defaults for the rest."""
    top_k = req.top_k or s.default_top_k
    depth = req.candidates or max(s.recall_candidates, top_k)  # never from top_k alone: top_k only cuts
    if depth < top_k:
        raise Invalid([("candidates", "must be at least top_k")])
    return rc.RecallParams(
        top_k=top_k, depth=depth, mode=req.mode or s.recall_mode, preset=req.preset,
        weights=req.weights.model_dump() if req.weights else None, half_life=req.half_life or s.half_life,
        as_of=req.as_of if req.as_of is not None else now, normalize=req.normalize,
        recency_from=req.recency_from, touch_now=now if req.touch else None,
        min_relevance=req.min_relevance, min_priority=req.min_priority)


def context_params(req: models.ContextRequest, s: Settings, now: float) -> rc.RecallParams:
    """`POST /v1/context`: the settings' mode and the auto preset, as of now, touching nothing."""
    top_k = req.top_k or s.default_top_k
    return rc.RecallParams(
        top_k=top_k, depth=max(s.recall_candidates, top_k), mode=s.recall_mode, preset=None, weights=None,
        half_life=req.half_life or s.half_life, as_of=now, normalize="none", recency_from="completed",
        touch_now=None, min_relevance=req.min_relevance, min_priority=req.min_priority)


async def recall(request: web.Request) -> web.Response:
    req: models.RecallRequest = validate(models.RecallRequest, await read_json(request))
    params = recall_params(req, request.app[SETTINGS], time.time())
    start = time.perf_counter()
    vector = await _embed(request, req.query)
    body = await rc.recall(_redis(request), _index(request),
                           rc.scope_of(_ns(request), req, await _tags(request)), req.query, vector, params,
                           sizes=request.app[SCOPE_SIZES])
    metrics = request.app[METRICS]
    metrics.recall_seconds.labels(params.mode).observe(time.perf_counter() - start)
    metrics.recall_candidates.observe(body["candidates"])
    return _json(body)


# --- episodes ---------------------------------------------------------------------------------------
class IngestQuery(models.Model):
    """`POST /v1/episodes` query parameters."""

    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)
    wait: Annotated[float, models.FloatIn(0.0, MAX_INGEST_WAIT, from_query=True)] = Field(
        0.0, description="seconds to wait until every episode is projected (recallable); the answer says "
                         "which are (`projected`); 0 answers at once")


async def _projected(request: web.Request, events: list[EpisodeCompleted], stream_ids: list[str],
                     wait: float) -> list[bool]:
    """Poll until each event is projected, up to `wait` s: the group acked its entry (a worker acks only
    after the document write committed) and its episode's event hash holds it (a dead-lettered event is
    acked but never recorded). The event hash alone was not enough: for an episode that already had
    events the worker records the new one first and rewrites the document a step later, so a read right
    after the wait could still see the previous version (found by a new-user trial)."""
    r, keys, s = _redis(request), request.app[KEYS], request.app[SETTINGS]
    deadline = time.monotonic() + wait
    done = [False] * len(events)
    while True:
        todo = [i for i, d in enumerate(done) if not d]
        acked = await streams.acked(r, keys.stream, s.consumer_group, [stream_ids[i] for i in todo])
        gen = await current_generation(r, keys)
        async with r.pipeline(transaction=False) as pipe:
            for i in todo:
                pipe.hexists(keys.episode_events(gen, events[i].namespace, events[i].episode_id), events[i].event_id)
            for i, ok, found in zip(todo, acked, await pipe.execute(), strict=True):
                done[i] = ok and bool(found)
        if all(done) or time.monotonic() >= deadline:
            return done
        await asyncio.sleep(min(INGEST_WAIT_POLL, max(0.0, deadline - time.monotonic())))


def _future(ep: Any, path: str, errs: Collector, limit: float, now: float) -> bool:
    """Name every instant of `ep` later than `limit` (UTC epoch s); True if there was one.

    An instant hours ahead (a skewed agent clock) would pin recency at 1 until then, head the short-term
    window and put learning-curve points in the future; a small skew (ENGRAM_MAX_CLOCK_SKEW) is normal.
    """
    def name(field: str) -> str:
        return f"{path}.{field}" if path else field
    found = [(name(f), getattr(ep, f)) for f in ("started_at", "completed_at") if (getattr(ep, f) or 0) > limit]
    found += [(name(f"actions[{i}].timestamp"), a.timestamp) for i, a in enumerate(ep.actions)
              if (a.timestamp or 0) > limit]
    for field, value in found:
        errs.add(field, f"is {value - now:,.0f} s in the future (more than ENGRAM_MAX_CLOCK_SKEW = "
                        f"{limit - now:g} s ahead of the service's clock)")
    return bool(found)


def _ingest_items(body: Any) -> tuple[bool, list[Any]]:
    """Whether an ingest body is a batch (`{"episodes": [...]}`), and its episodes; Invalid for a bad batch."""
    if not (isinstance(body, dict) and "episodes" in body):
        return False, [body]
    extra = [k for k in body if k != "episodes"]
    if extra:
        raise Invalid([(k, "is not a known field (send one episode, or {\"episodes\": [...]})")
                       for k in extra])
    items = body["episodes"]
    if not isinstance(items, list) or not items or len(items) > models.MAX_BATCH:
        raise Invalid([("episodes", f"must be a list of 1..{models.MAX_BATCH} episodes")])
    return True, items


async def ingest(request: web.Request) -> web.Response:
    query: IngestQuery = _query_params(request, IngestQuery)
    received = time.time()
    batch, items = _ingest_items(await read_json(request))
    errs = Collector()
    episodes = []
    first_index: dict[str, int] = {}
    for i, item in enumerate(items):
        path = f"episodes[{i}]" if batch else ""
        ep = parse_episode(item, path, errs, default_episode_id=new_event_id())
        if ep is not None and ep.episode_id in first_index:
            # both would carry the same occurred_at, so which one the episode ends up as would be a coin
            # toss between their random event ids (found by a new-user trial): refuse, naming both
            errs.add(f"{path}.episode_id", f"repeats episodes[{first_index[ep.episode_id]}].episode_id "
                     f"({ep.episode_id!r}); send one version of an episode per request")
            ep = None
        elif ep is not None:
            first_index[ep.episode_id] = i
        if isinstance(item, dict) and item.get("outcome") is None:
            errs.add(f"{path}.outcome" if path else "outcome", "is required for a finished episode")
            ep = None
        dim = request.app[EMBEDDER].dim
        if ep is not None and ep.vector is not None and len(ep.vector) != dim:
            # the consolidator would dead-letter it; the service knows the index's dimension, so say it now
            errs.add(f"{path}.vector" if path else "vector",
                     f"has {len(ep.vector)} dimensions; this index expects {dim}")
            ep = None
        if ep is not None and _future(ep, path, errs, received + request.app[SETTINGS].max_clock_skew, received):
            ep = None
        if ep is not None:
            episodes.append(ep)
    errs.raise_if_any()  # InvalidEpisode → 422 naming every bad field; nothing is published
    now = time.time()
    events = [EpisodeCompleted(namespace=_ns(request), episode_id=ep.episode_id, occurred_at=now,
                               episode=ep if ep.completed_at is not None
                               else dataclasses.replace(ep, completed_at=now))
              for ep in episodes]
    stream_ids = await _client(request, backpressure=True).publish(events)
    request.app[METRICS].published.labels("EpisodeCompleted").inc(len(events))
    results: list[dict[str, Any]] = [{"episode_id": e.episode_id, "event_id": e.event_id} for e in events]
    out: dict[str, Any] = {"results": results, "accepted": len(results)}
    if query.wait > 0:
        done = await _projected(request, events, stream_ids, query.wait)
        for result, projected in zip(results, done, strict=True):
            result["projected"] = projected
        out["projected"] = all(done)
    if not batch:
        out.update(results[0])
    return _json(out, status=202)


def _episode_of(c: rc.Candidate) -> Episode:
    """The episode of a candidate built by `decode_hit` (get_episode, `rc.latest`, `rc.similar`), which
    always sets it; `Candidate.episode` is optional for recall's signal-only candidates."""
    return cast(Episode, c.episode)


async def _stored(request: web.Request, episode_id: str) -> dict[bytes, bytes | None]:
    r = _redis(request)
    keys = request.app[KEYS]
    ns = _ns(request)
    gen = await current_generation(r, keys)
    names = ("doc", "status", "namespace", "access_count", "last_accessed")
    # bytes replies (decode_responses=False, shared.redis_conn); redis-py annotates bytes | str
    values = cast(list[bytes | None], await r.hmget(keys.episode_doc(gen, ns, episode_id), names))
    found = dict(zip((n.encode() for n in names), values, strict=True))
    if found[b"doc"] is None or found[b"namespace"] != ns.encode() \
            or await r.exists(keys.tombstone(ns, episode_id)):
        raise NotFound(f"no episode {episode_id[:80]!r} in this namespace")
    return found


async def _accepted_not_projected(request: web.Request, episode_id: str) -> bool:
    """True when the stream holds an event of this episode that the consolidator has not acked yet."""
    s, keys, ns = request.app[SETTINGS], request.app[KEYS], _ns(request)
    for payload in await streams.unprojected(_redis(request), keys.stream, s.consumer_group, limit=PENDING_SCAN):
        identity = peek_identity(payload)
        if identity is not None and identity[0] == ns and identity[1] == episode_id:
            return True
    return False


async def get_episode(request: web.Request) -> web.Response:
    episode_id = _path_id(request, "episode_id")
    _no_query(request)
    try:
        found = await _stored(request, episode_id)
    except NotFound:
        # read-your-writes: accepted (202) but not yet projected is not "never existed"
        r, keys, ns = _redis(request), request.app[KEYS], _ns(request)
        if not await r.exists(keys.tombstone(ns, episode_id)) and await _accepted_not_projected(request, episode_id):
            return _json({"episode": None, "episode_id": episode_id, "status": STATUS_PENDING,
                          "access_count": 0, "last_accessed": None})
        raise
    # a search hit has no None fields: the ones this document lacks are left out (read as missing alike)
    c = rc.decode_hit(rc.SearchHit(key=b"", fields={k: v for k, v in found.items() if v is not None}))
    if c is None:
        raise Problem(500, "the stored episode is unreadable; it was logged")
    return _json({"episode": rc.episode_json(_episode_of(c)), "status": (found[b"status"] or b"").decode(),
                  "access_count": c.access_count,
                  "last_accessed": format_instant(c.last_accessed) if math.isfinite(c.last_accessed) else None})


async def delete_episode(request: web.Request) -> web.Response:
    episode_id = _path_id(request, "episode_id")
    try:
        await _stored(request, episode_id)
    except NotFound:
        # no document, but the namespace may still hold its data: stored events of a draft or of an
        # episode not yet written, or dead letters (found by a new-user trial: those could not be forgotten)
        r, keys, ns = _redis(request), request.app[KEYS], _ns(request)
        if await r.exists(keys.tombstone(ns, episode_id)):
            # forgotten already: DELETE is idempotent (a client repeating it after a lost answer got a 404)
            return _json({"episode_id": episode_id, "event_id": None, "already_forgotten": True}, status=202)
        gen = await current_generation(r, keys)
        # accepted but not yet projected counts too: it would be projected after a refused forget
        if not await r.exists(keys.episode_events(gen, ns, episode_id)) \
                and not await deadletters.has_dead_letters(r, keys, ns, episode_id) \
                and not await _accepted_not_projected(request, episode_id):
            raise
    event_id = await _client(request).forget_episode(episode_id)
    request.app[METRICS].published.labels("EpisodeForgotten").inc()
    return _json({"episode_id": episode_id, "event_id": event_id}, status=202)


async def delete_user(request: web.Request) -> web.Response:
    user_id = _path_id(request, "user_id")
    event_id = await _client(request).forget_user(user_id)
    request.app[METRICS].published.labels("UserForgotten").inc()
    return _json({"user_id": user_id, "event_id": event_id}, status=202)


# --- working memory and insights --------------------------------------------------------------------
async def context(request: web.Request) -> web.Response:
    req: models.ContextRequest = validate(models.ContextRequest, await read_json(request))
    s = request.app[SETTINGS]
    r, index = _redis(request), _index(request)
    scope = rc.scope_of(_ns(request), req, await _tags(request), category=())
    vector = await _embed(request, req.task)
    recalled = await rc.recall(r, index, scope, req.task, vector, context_params(req, s, time.time()),
                               sizes=request.app[SCOPE_SIZES])
    short_term = await rc.latest(r, index, scope, s.short_term_window)
    facts = await request.app[FACTS](r, scope, vector, 5)
    prompt, truncated = insights.prompt_section(req.task, req.category, recalled["results"],
                                                recalled["replay_context"], facts, req.max_chars)
    return _json({"task": req.task, "category": req.category, "results": recalled["results"],
                  "short_term": [rc.episode_json(_episode_of(c)) for c in short_term],
                  "replay_context": recalled["replay_context"], "facts": facts, "prompt": prompt,
                  "truncated": truncated, "max_chars": req.max_chars, "preset": recalled["preset"]})


async def _profiles(request: web.Request, req: Any, threshold: float) -> list[dict[str, Any]]:
    scope = rc.scope_of(_ns(request), req, await _tags(request), category=())
    rows = await category_stats(_redis(request), _index(request), scope)
    return insights.skill_profiles(rows, threshold)


async def skills(request: web.Request) -> web.Response:
    req: models.SkillsQuery = _query_params(request, models.SkillsQuery)
    profiles = await _profiles(request, req, req.threshold)
    return _json({"results": profiles, "weak": [p["category"] for p in profiles if p["weak"]],
                  "threshold": req.threshold})


async def strategy(request: web.Request) -> web.Response:
    req: models.StrategyRequest = validate(models.StrategyRequest, await read_json(request))
    vector = await _embed(request, req.task)
    similar = await rc.similar(_redis(request), _index(request), rc.scope_of(_ns(request), req, await _tags(request), category=()),
                               vector, req.k, req.min_similarity)
    profile = None
    if req.category:
        profile = next((p for p in await _profiles(request, req, 0.5) if p["category"] == req.category), None)
    choice = insights.choose_strategy([_episode_of(c) for c in similar], complexity=req.complexity,
                                      category_profile=profile)
    return _json({**choice, "pool": list(insights.STRATEGY_POOL)})


async def suggest(request: web.Request) -> web.Response:
    req: models.SuggestRequest = validate(models.SuggestRequest, await read_json(request))
    vector = await _embed(request, req.task)
    scope = rc.scope_of(_ns(request), req, await _tags(request), category=(req.category,) if req.category else ())
    similar = await rc.similar(_redis(request), _index(request), scope, vector, req.k, req.min_similarity)
    return _json(insights.suggestion([_episode_of(c) for c in similar]))


async def learning_curve(request: web.Request) -> web.Response:
    req: models.LearningCurveQuery = _query_params(request, models.LearningCurveQuery)
    scope = rc.scope_of(_ns(request), req, await _tags(request))
    # the newest `limit` episodes, drawn in time order (oldest first) as the curve reads
    newest = await rc.latest(_redis(request), _index(request), scope, req.limit)
    eps = [c.episode for c in reversed(newest)]
    points = insights_curve(eps, req.window)
    return _json({"results": points, "window": req.window})


def insights_curve(eps: list[Any], window: int) -> list[dict[str, Any]]:
    from shared.scoring import learning_curve as curve

    points = curve([e.feedback.reward if e.feedback else None for e in eps], [e.outcome for e in eps], window)
    for p, e in zip(points, eps, strict=True):
        p["episode_id"] = e.episode_id
        p["completed_at"] = format_instant(e.completed_at)
    return points


# --- operations -------------------------------------------------------------------------------------
async def healthz(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    checks: dict[str, bool] = {}
    r = request.app.get(REDIS)
    try:  # a probe answers within 2 s: a Redis that hangs (paused, overloaded) is "not ready" too
        checks["redis"] = bool(r is not None and await asyncio.wait_for(r.ping(), 2.0))
        checks["index"] = bool(r is not None and await asyncio.wait_for(index_exists(r, _index(request)), 2.0))
    except Exception:  # any failure to reach Redis means "not ready", never a 500
        checks.setdefault("redis", False)
        checks["index"] = False
    embedder = request.app.get(EMBEDDER)
    checks["embedder"] = embedder is not None and bool(getattr(embedder, "loaded", True))
    ok = all(checks.values())
    return _json({"status": "ready" if ok else "not ready", "checks": checks}, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    return await request.app[METRICS].handle(request)


async def openapi_json(request: web.Request) -> web.Response:
    from services.query.openapi import document
    return _json(document())


# --- the table --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    body: type[BaseModel] | dict[str, Any] | None = None
    query: type[BaseModel] | None = None
    status: int = 200
    public: bool = False
    tag: str = "memory"


ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/recall", recall, "Prioritized recall of the episodes worth replaying",
          body=models.RecallRequest),
    Route("POST", "/v1/episodes", ingest, "Ingest one finished episode or a batch {episodes: [...]}",
          body=models.INGEST_SCHEMA, query=IngestQuery, status=202),
    Route("GET", "/v1/episodes/{episode_id:.+}", get_episode, "One episode of the caller's namespace"),
    Route("DELETE", "/v1/episodes/{episode_id:.+}", delete_episode, "Forget one episode", status=202),
    Route("DELETE", "/v1/users/{user_id:.+}", delete_user, "Forget every episode of a user", status=202),
    Route("POST", "/v1/context", context, "Working memory and a ready prompt section for a task",
          body=models.ContextRequest),
    Route("GET", "/v1/skills", skills, "Per-category skill profiles and weak categories",
          query=models.SkillsQuery),
    Route("POST", "/v1/strategy", strategy, "Adaptive strategy choice for a task", body=models.StrategyRequest),
    Route("POST", "/v1/suggest", suggest, "Confidence and common failures from similar episodes",
          body=models.SuggestRequest),
    Route("GET", "/v1/learning-curve", learning_curve, "Cumulative and rolling reward and success rate",
          query=models.LearningCurveQuery),
    Route("GET", "/healthz", healthz, "Liveness", public=True, tag="operations"),
    Route("GET", "/readyz", readyz, "Readiness: Redis, index and embedder", public=True, tag="operations"),
    Route("GET", "/metrics", metrics, "Prometheus metrics (ENGRAM_METRICS_KEY when API keys are set)",
          tag="operations"),
    Route("GET", "/openapi.json", openapi_json, "This OpenAPI 3.1 document", public=True, tag="operations"),
) + facts_routes.routes(Route)


def add_routes(app: web.Application) -> None:
    for route in ROUTES:
        app.router.add_route(route.method, route.path, route.handler)
