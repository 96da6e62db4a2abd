"""The query service application (`make_app`): the route table wired to its middlewares, the injected
dependencies, one cleanup context owning Redis and the embedder. The imports run one way: app → routes
→ views → domain modules, and everything reads its state through `services.query.appkeys`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from aiohttp import web

from services.query.answers import SCHEMAS
from services.query.appkeys import (
    CURSORS,
    EMBEDDER,
    FACTS,
    FLOORS,
    KEYS,
    METRICS,
    OPENAPI,
    QUERY_VECTORS,
    REDIS,
    SCOPE_SIZES,
    SETTINGS,
    STARTUP,
    TAGS,
    TERMS,
    FactsProvider,
    OpenAPIDocument,
)
from services.query.auth import auth_middleware
from services.query.cursors import Cursors
from services.query.metrics import Metrics
from services.query.openapi import document
from services.query.problems import (
    BODY_TIMEOUT,
    MAX_BODY_BYTES,
    problems_middleware,
)
from services.query.recall.lists import Floors
from services.query.recall.sizes import ScopeSizes
from services.query.recall.terms import Memos
from services.query.recall.vectors import QueryVectorCache
from services.query.routes import ROUTES, url_middleware
from services.query.startup import Startup, startup_gate
from services.query.views.recall import facts_provider
from services.query.watch import RedisWatch, watch_middleware
from shared import cluster
from shared.content_coding import identity_only
from shared.embedding import Embedder, make_embedder
from shared.embedding_base import dim_when_answering
from shared.index import LiveTags, VectorParams, current_generation, ensure_episode_index
from shared.keyring import deployment_tag_key
from shared.partitions import check_partitions
from shared.redis_conn import connect
from shared.retry import until_available
from shared.settings import Settings

log = logging.getLogger("engram.query")

# the document of the table, built on the first GET /openapi.json and kept for the process
openapi_document: OpenAPIDocument = functools.cache(functools.partial(document, ROUTES, SCHEMAS))


def _resources(
    redis: aioredis.Redis | None, embedder: Embedder | None, watch: RedisWatch, *, background: bool
):
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        settings = app[SETTINGS]
        startup = app[STARTUP]
        # what this context opens, it closes (in reverse order), however start-up ends; injected resources
        # belong to the caller
        async with contextlib.AsyncExitStack() as stack:
            r = redis
            if r is None:  # `python -m services.query` refused to start without a REDIS_URL
                r = connect(
                    settings.redis_url or "", prefix=settings.prefix, cluster_search=settings.cluster_search
                )  # connects on its first command
                stack.push_async_callback(r.aclose)
            e = embedder
            if e is None:
                e = make_embedder(settings, role="query")  # constructed, not loaded
                stack.push_async_callback(e.aclose)
            keys = app[KEYS]
            tags = LiveTags(keys, None)
            app[REDIS] = r
            app[EMBEDDER] = e
            app[TAGS] = tags
            watch.redis = r
            stack.push_async_callback(watch.aclose)

            async def load() -> None:
                await e.load()
                dim = await dim_when_answering(e, "query service")  # a provider down at start: 503s, not exit
                startup.done("embedder")

                async def open_index() -> tuple[int, bytes | None]:
                    # ConfigError when the deployment has another number of stream partitions, or
                    # a coordinator is asked of a cluster without one (before anything is created)
                    await cluster.check_search(r)
                    await check_partitions(
                        r,
                        keys,
                        sealed=settings.master_key is not None,
                        explicit=settings.stream_partitions is not None,
                    )
                    gen = await current_generation(r, keys)
                    tag_key = await deployment_tag_key(r, keys, settings.master_key)
                    await ensure_episode_index(
                        r, keys, gen, VectorParams.of(settings, dim), e.name, tag_key=tag_key
                    )
                    return gen, tag_key

                # Redis down or loading at start: wait for it (one exiting service stops `make run`)
                opened = await until_available(open_index, what="start of the query service", log=log)
                assert opened is not None  # no stop event: it returns only once Redis answered
                gen, tags.tag_key = opened
                tags.embedder = (e.name, dim)  # a later `reindex --embedder` is told (`LiveTags.mismatch`)
                startup.done("index")
                log.info(
                    "query service ready ◆ %.1fs ◆ prefix=%s ◆ embedder=%s dim=%d ◆ generation %d ◆ %d api key(s)",
                    time.monotonic() - startup.started,
                    settings.prefix,
                    e.name,
                    dim,
                    gen,
                    len(settings.api_keys),
                )

            if background:
                startup.task = asyncio.create_task(load(), name="query-startup")
                stack.push_async_callback(_cancel, startup.task)
            else:
                await load()
            sweeper = asyncio.create_task(_sweep(app[TERMS], app[SCOPE_SIZES]), name="engram.query.sweep")
            stack.push_async_callback(_cancel, sweeper)
            yield

    return ctx


SWEEP_INTERVAL = 1.0
"""Seconds between two expiries of the memos of episode words (`Memos.expire`) and of the idf counts:
what bounds how long a forgotten episode's words stay in this process's memory."""


async def _sweep(memos: Memos, sizes: ScopeSizes) -> None:
    """Expire the memos every SWEEP_INTERVAL, traffic or not (an idle process must forget as well)."""
    while True:
        memos.expire()
        sizes.expire()
        await asyncio.sleep(SWEEP_INTERVAL)


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait for its end; what it raised is not raised again here (a failed start-up
    is raised where it is awaited: `Startup.wait`)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def make_app(
    settings: Settings,
    *,
    redis: aioredis.Redis | None = None,
    embedder: Embedder | None = None,
    facts: FactsProvider | None = None,
    background_start: bool = False,
) -> web.Application:
    """The query service. `redis=` and `embedder=` inject ready resources (tests, benchmarks) the app then
    neither creates nor closes; `facts=` replaces the facts provider of `POST /v1/context`
    (`services.query.views.recall.facts_provider`). Start-up loads the embedder and ensures the live episode index exists
    and was built with it (`Conflict` fails it); it waits for Redis.

    With `background_start` (`python -m services.query`) the app serves at once and loads the embedder
    and the index in a task (`services.query.startup`; `app[STARTUP].wait()` re-raises a failed
    start-up). Without it start-up completes before the first request."""
    metrics = Metrics()
    startup = Startup()
    watch = RedisWatch()
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[
            metrics.middleware(),
            identity_only,  # 415 for a compressed body, before anything reads it (shared.content_coding)
            problems_middleware,
            url_middleware(ROUTES),
            auth_middleware(
                settings.api_keys,
                settings.default_namespace,
                settings.metrics_key,
                public=frozenset(r.path for r in ROUTES if r.public),
            ),
            startup_gate(startup, frozenset(r.path for r in ROUTES if r.tag == "operations")),
            watch_middleware(watch),  # a Redis that hangs: 503 within `watch.bound` s (services.query.watch)
        ],
    )
    keys = settings.keys
    app[SETTINGS] = settings
    app[BODY_TIMEOUT] = settings.body_timeout
    app[MAX_BODY_BYTES] = settings.max_body_bytes
    app[STARTUP] = startup
    app[KEYS] = keys
    app[METRICS] = metrics
    app[FACTS] = facts if facts is not None else facts_provider(keys)
    app[OPENAPI] = openapi_document
    app[SCOPE_SIZES] = ScopeSizes(
        df_ttl=settings.idf_cache_ttl or 0.0, keys=keys, group=settings.consumer_group
    )
    app[CURSORS] = Cursors(keys)
    app[QUERY_VECTORS] = QueryVectorCache(settings.query_cache, batch=settings.query_batch)
    app[FLOORS] = Floors()
    app[TERMS] = Memos()
    app.cleanup_ctx.append(_resources(redis, embedder, watch, background=background_start))
    for r in ROUTES:
        app.router.add_route(r.method, r.path, r.call)
    return app
