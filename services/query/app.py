"""The query service application: typed app keys, one cleanup context owning Redis and the embedder.

`make_app(settings)` builds the aiohttp application; `redis=` and `embedder=` inject ready resources
(tests, benchmarks) which the app then neither creates nor closes. Startup ensures the episode index of
the live generation exists and was built with this embedder; a mismatch (`Conflict`) fails startup with
its message.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from aiohttp import web

from services.query.auth import auth_middleware
from services.query.metrics import Metrics
from services.query.problems import problems_middleware
from services.query.recall import ScopeSizes
from shared.embedding import Embedder, QueryVectorCache, make_embedder
from shared.index import LiveTags, Scope, VectorParams, current_generation, ensure_episode_index
from shared.keyring import deployment_tag_key
from shared.keys import Keys
from shared.redis_conn import connect
from shared.retry import until_available
from shared.settings import Settings

log = logging.getLogger("engram.query")

FactsProvider = Callable[[aioredis.Redis, Scope, np.ndarray, int], Awaitable[list[dict[str, Any]]]]


async def no_facts(r: aioredis.Redis, scope: Scope, query_vector: np.ndarray, k: int) -> list[dict[str, Any]]:
    """The facts provider until semantic memory exists: no facts (the `facts` section stays [])."""
    return []


SETTINGS = web.AppKey("settings", Settings)
KEYS = web.AppKey("keys", Keys)
REDIS = web.AppKey("redis", aioredis.Redis)
EMBEDDER = web.AppKey("embedder", Embedder)
METRICS = web.AppKey("metrics", Metrics)
FACTS: web.AppKey[FactsProvider] = web.AppKey("facts")  # a Callable alias is no class to pass as the type
SCOPE_SIZES = web.AppKey("scope_sizes", ScopeSizes)
QUERY_VECTORS = web.AppKey("query_vectors", QueryVectorCache)
TAGS = web.AppKey("tags", LiveTags)


def vector_params(settings: Settings, dim: int) -> VectorParams:
    return VectorParams(dim=dim, algorithm=settings.vector_algorithm, m=settings.hnsw_m,
                        ef_construction=settings.hnsw_ef_construction, ef_runtime=settings.hnsw_ef_runtime)


def _resources(redis: aioredis.Redis | None, embedder: Embedder | None):
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        settings = app[SETTINGS]
        # what this context opens, it closes (in reverse order), however start-up ends; injected resources
        # belong to the caller
        async with contextlib.AsyncExitStack() as stack:
            r = redis
            if r is None:
                if not settings.redis_url:
                    raise RuntimeError("REDIS_URL is not set; start the stack with `make run` or set REDIS_URL")
                r = connect(settings.redis_url)
                stack.push_async_callback(r.aclose)
            e = embedder
            if e is None:
                e = make_embedder(settings)
                stack.push_async_callback(e.aclose)
            if hasattr(e, "load"):
                await e.load()
            dim = await e.ensure_dim()
            keys = app[KEYS]

            async def open_index() -> tuple[int, bytes | None]:
                gen = await current_generation(r, keys)
                tag_key = await deployment_tag_key(r, keys, settings.master_key)
                await ensure_episode_index(r, keys, gen, vector_params(settings, dim), e.name, tag_key=tag_key)
                return gen, tag_key

            # Redis down or loading at start: wait for it (one exiting service stops `make run`)
            opened = await until_available(open_index, what="start of the query service", log=log)
            assert opened is not None  # no stop event: it returns only once Redis answered
            gen, tag_key = opened
            app[REDIS] = r
            app[EMBEDDER] = e
            app[TAGS] = LiveTags(keys, tag_key)
            log.info("query service ready ◆ prefix=%s ◆ embedder=%s dim=%d ◆ generation %d ◆ %d api key(s)",
                     settings.prefix, e.name, dim, gen, len(settings.api_keys))
            yield
    return ctx


def make_app(settings: Settings, *, redis: aioredis.Redis | None = None, embedder: Embedder | None = None,
             facts: FactsProvider = no_facts) -> web.Application:
    """The query service. Startup fails (exception) when Redis is unreachable or the index conflicts."""
    from services.query.routes import add_routes  # routes import this module's app keys

    metrics = Metrics()
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[metrics.middleware(), problems_middleware,
                     auth_middleware(settings.api_keys, settings.default_namespace, settings.metrics_key)],
    )
    app[SETTINGS] = settings
    app[KEYS] = Keys(settings.prefix)
    app[METRICS] = metrics
    app[FACTS] = facts
    app[SCOPE_SIZES] = ScopeSizes()
    app[QUERY_VECTORS] = QueryVectorCache(settings.query_cache)
    from services.query.facts_routes import register as register_facts
    register_facts(app)
    app.cleanup_ctx.append(_resources(redis, embedder))
    add_routes(app)
    return app
