"""The only place that makes Redis connections.

Transport faults are retried by redis-py with exponential backoff. RESP2 is pinned: the RediSearch
reply parsing in `shared.index` expects its flat arrays. redis-py (>= 8.2) packs commands with hiredis
on asyncio connections too: packing in Python was a fifth of the consolidator's CPU (bench/perf.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import cast
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry  # the sync Retry makes redis-py >= 8.2 warn (an error under pytest)
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError

from shared.cluster import SEARCH_SHARD, EngramCluster
from shared.keys import Keys
from shared.settings import CLUSTER_SCHEMES, Settings, check_url


def _options(retries: int, socket_timeout: float | None) -> dict:
    """What every client gets: bytes replies, RESP2, transport errors retried with backoff."""
    return {
        "protocol": 2,
        "decode_responses": False,
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": 5.0,
        "retry": Retry(ExponentialBackoff(cap=2.0, base=0.05), retries),
        "retry_on_error": [ConnectionError, TimeoutError, BusyLoadingError],
    }


def connect(
    url: str,
    *,
    retries: int = 3,
    socket_timeout: float | None = 10.0,
    max_connections: int | None = None,
    prefix: str = "engram:",
    cluster_search: str = SEARCH_SHARD,
) -> aioredis.Redis:
    """An asyncio Redis client for `url` (bytes replies, RESP2, retried transport errors).

    `url`: redis://, rediss:// or unix:// (redis-py's URL syntax), or redis+cluster:// /
    rediss+cluster:// (any one node; the others are discovered) for redis-py's `RedisCluster` (slot
    map, MOVED/ASK redirects) with the search routing of `shared.cluster.EngramCluster` by
    `cluster_search`, its meta hash under `prefix`. Raises ValueError on another scheme.
    """
    scheme = check_url(url)
    if scheme in CLUSTER_SCHEMES:
        plain = urlsplit(url)._replace(scheme=CLUSTER_SCHEMES[scheme]).geturl()
        cluster = cast(EngramCluster, EngramCluster.from_url(plain, **_options(retries, socket_timeout)))
        cluster.search, cluster.meta = cluster_search, Keys(prefix).meta
        return cast(aioredis.Redis, cluster)  # the commands Engram uses exist on both
    # types-redis 4.6 (stale stubs, where installed) has no protocol=
    return aioredis.Redis.from_url(  # type: ignore[call-overload, unused-ignore]
        url, health_check_interval=15, max_connections=max_connections, **_options(retries, socket_timeout)
    )


@contextlib.asynccontextmanager
async def connected(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    """`connect` to `settings.redis_url` (its prefix and cluster search), closed on leaving however the
    block ends. ValueError when REDIS_URL is not set."""
    if settings.redis_url is None:
        raise ValueError("REDIS_URL is not set")
    redis = connect(settings.redis_url, prefix=settings.prefix, cluster_search=settings.cluster_search)
    try:
        yield redis
    finally:
        await redis.aclose()
