"""What every view shares: the JSON reply, the caller's namespace, Redis, the index, query parameters,
the query embedding and the stream publisher."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import orjson
import redis.asyncio as aioredis
from aiohttp import web
from pydantic import BaseModel

from engram_episodic.errors import ConfigError
from engram_episodic.events import Episode
from engram_episodic.validation import Collector, check_id
from services.query import recall as rc
from services.query.appkeys import (
    EMBEDDER,
    FLOORS,
    KEYS,
    METRICS,
    NAMESPACE,
    QUERY_VECTORS,
    REDIS,
    SCOPE_SIZES,
    SETTINGS,
    TAGS,
    TERMS,
)
from services.query.problems import Invalid, validate
from services.query.recall.plan import QueryVector
from services.query.store import EpisodeStore
from shared import streams, tracing
from shared.codec import peek_identity
from shared.embedding import EmbeddingError
from shared.index import Scope
from shared.sdk import EngramClient
from shared.tags import TagCodec

Handler = Callable[..., Awaitable[web.StreamResponse]]


def reply(data: Any, status: int = 200) -> web.Response:
    # orjson: the response encoding was ~10% of a recall's CPU with the stdlib encoder (bench/perf.py)
    return web.Response(
        body=orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY),
        status=status,
        content_type="application/json",
    )


def file_handler(body: bytes | Callable[[], bytes], content_type: str, cache: str) -> Handler:
    """The handler of a page's own file (a script, a stylesheet, an icon): `body`, or what it returns on
    each request (cache it), with its Content-Type (and charset, if any) and Cache-Control."""
    headers = {"Content-Type": content_type, "Cache-Control": cache}

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body() if callable(body) else body, headers=headers)

    return handler


def ns_of(request: web.Request) -> str:
    return request[NAMESPACE]


def redis_of(request: web.Request) -> aioredis.Redis:
    return request.app[REDIS]


def store_of(request: web.Request) -> EpisodeStore:
    return EpisodeStore(request.app[REDIS], request.app[KEYS])


def query_of(request: web.Request, scope: Scope, text: str, vector: QueryVector) -> rc.Query:
    """A recall's `Query` of this request, with the app's memories."""
    app = request.app
    return rc.Query(
        app[REDIS],
        index_of(request),
        scope,
        text,
        vector,
        store_of(request),
        app[SCOPE_SIZES],
        app[FLOORS],
        app[TERMS],
    )


def index_of(request: web.Request) -> str:
    return request.app[KEYS].episode_index_alias


async def tags_of(request: web.Request) -> TagCodec:
    """The live generation's TAG digests (`shared.tags`), for the Scope of this request."""
    return await request.app[TAGS].get(request.app[REDIS])


def query_params(request: web.Request, model: type[BaseModel]) -> Any:
    params: dict[str, str] = {}
    for key in request.query:
        if not key:  # "?=x": pydantic would name it "<root>", as if the whole query were wrong
            raise Invalid([("<query>", "has a parameter without a name")])
        values = request.query.getall(key)
        if len(values) > 1:
            raise Invalid([(key, "must be given once")])
        params[key] = values[0]
    # "not a known query parameter", as a route without a query model says (routes.url_middleware)
    return validate(model, params, strict=False, unknown="query parameter")


async def embed(request: web.Request, text: str):
    """`text`'s query vector (float32[dim]). Raises EmbedderMismatch (409) when the live index was
    rebuilt with another embedder under this process (`reindex --embedder`): its vectors are another
    model's, and this process must be restarted with that one (`/readyz` says so too); a keyword recall
    answers without the vector then (`services.query.recall.recall`). Raises
    EmbeddingError when the embedder fails, whatever it raised (a provider's 5xx or timeout after its
    retries, a local model's own exception): `services.query.problems` answers it 503 with Retry-After."""
    mismatch = await request.app[TAGS].mismatch(redis_of(request))
    if mismatch is not None:
        raise mismatch
    embedder = request.app[EMBEDDER]
    metrics = request.app[METRICS]
    start = time.perf_counter()
    with tracing.span("engram.recall.embed", embedder=embedder.name):
        try:
            vector = await request.app[QUERY_VECTORS].embed(embedder, text, namespace=ns_of(request))
        except (EmbeddingError, ConfigError):
            raise
        except Exception as exc:  # a model's own fault (torch, onnxruntime): an outage, not a bad request
            raise EmbeddingError(f"{embedder.name}: {type(exc).__name__}: {exc}") from exc
    metrics.embed_seconds.observe(time.perf_counter() - start)
    metrics.count_truncations(embedder.truncations)
    return vector


def publisher(request: web.Request, *, backpressure: bool = False) -> EngramClient:
    """A publisher for the caller's namespace. With `backpressure` (ingest), a consumer lag above
    ENGRAM_MAX_LAG raises Backpressure at once (→ 429 with Retry-After); forgetting is never held back."""
    s = request.app[SETTINGS]
    return EngramClient(
        redis_of(request),
        namespace=ns_of(request),
        prefix=s.prefix,
        publish_timeout=s.publish_timeout,
        retries=s.publish_retries,
        max_lag=s.max_lag if backpressure else None,
        wait_on_backpressure=False,
        consumer_group=s.consumer_group,
        master_key=s.master_key,
        partitions=s.partitions,
    )


def group_of(request: web.Request) -> streams.StreamGroup:
    """The consolidator's consumer group on the partition stream of the caller's namespace."""
    stream = request.app[KEYS].stream_of(ns_of(request))
    return streams.StreamGroup(redis_of(request), stream, request.app[SETTINGS].consumer_group)


async def accepted_ids(request: web.Request, limit: int = 10_000) -> set[str]:
    """The ids of the caller's episodes whose events the stream holds and the consolidator has not
    projected yet (read-your-writes), among the `limit` oldest pending and newest undelivered entries."""
    ns, out = ns_of(request), set()
    for payload in await group_of(request).unprojected(limit=limit):
        identity = peek_identity(payload)
        if identity is not None and identity[0] == ns:
            out.add(identity[1])
    return out


def path_id(request: web.Request, name: str) -> str:
    errs = Collector()
    value = check_id(request.match_info[name], name, errs, required=True)
    if errs.errors:
        raise Invalid(errs.errors)
    return value  # type: ignore[return-value]


def episode_of(c: rc.Candidate) -> Episode:
    """The episode of a candidate built by `decode_hit` (get_episode, `rc.latest`, `rc.similar`), which
    always sets it; `Candidate.episode` is optional for recall's signal-only candidates."""
    return cast(Episode, c.episode)
