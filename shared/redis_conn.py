"""The only place that makes Redis connections.

Transport faults (connection refused/reset, timeouts) are retried by redis-py itself with exponential
backoff, so callers see an error only after the retries are spent. RESP2 is pinned because the
RediSearch reply parsing in `shared.index` expects its flat arrays.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError
from redis.retry import Retry


def connect(url: str, *, retries: int = 3, socket_timeout: float | None = 10.0,
            max_connections: int | None = None) -> aioredis.Redis:
    """An asyncio Redis client for `url` (bytes replies, RESP2, retried transport errors)."""
    return aioredis.Redis.from_url(
        url,
        protocol=2,
        decode_responses=False,
        socket_timeout=socket_timeout,
        socket_connect_timeout=5.0,
        health_check_interval=15,
        max_connections=max_connections,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries),
        retry_on_error=[ConnectionError, TimeoutError, BusyLoadingError],
    )
