"""The typed keys of the query service's application and requests: a leaf module.

It imports nothing from `services.query` at run time (a unit test parses the imports and checks it), so
every other module of the service can import it: the views read `request.app[REDIS]`, `make_app` sets
it. The classes of the service's own objects are named for the type checker only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import redis.asyncio as aioredis
from aiohttp import web

from shared.embedding import Embedder
from shared.index import LiveTags, Scope
from shared.keys import Keys
from shared.settings import Settings

if TYPE_CHECKING:  # types only: this module stays a leaf of the import graph
    from services.query.cursors import Cursors
    from services.query.metrics import Metrics
    from services.query.recall.lists import Floors
    from services.query.recall.sizes import ScopeSizes
    from services.query.recall.terms import Memos
    from services.query.recall.vectors import QueryVectorCache
    from services.query.startup import Startup

# (redis, episode scope, query vector, k) → the top facts of `POST /v1/context`
FactsProvider = Callable[[aioredis.Redis, Scope, np.ndarray, int], Awaitable[list[dict[str, Any]]]]
OpenAPIDocument = Callable[[], dict[str, Any]]

SETTINGS = web.AppKey("settings", Settings)
KEYS = web.AppKey("keys", Keys)
REDIS = web.AppKey("redis", aioredis.Redis)
EMBEDDER = web.AppKey("embedder", Embedder)
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
# a Callable alias is no class to pass as the type
FACTS: web.AppKey[FactsProvider] = web.AppKey("facts")
OPENAPI: web.AppKey[OpenAPIDocument] = web.AppKey("openapi")
SCOPE_SIZES: web.AppKey[ScopeSizes] = web.AppKey("scope_sizes")
QUERY_VECTORS: web.AppKey[QueryVectorCache] = web.AppKey("query_vectors")
FLOORS: web.AppKey[Floors] = web.AppKey("floors")  # the recency / reward / importance lists' floors
TERMS: web.AppKey[Memos] = web.AppKey("terms")  # the memos of episode words
TAGS = web.AppKey("tags", LiveTags)
CURSORS: web.AppKey[Cursors] = web.AppKey("cursors")
STARTUP: web.AppKey[Startup] = web.AppKey("startup")

NAMESPACE = web.RequestKey(
    "namespace", str
)  # request[NAMESPACE]: the caller's namespace (services.query.auth)
