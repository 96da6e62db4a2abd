"""Remembered counts for recall: episodes per scope and documents per index (one `ScopeSizes` per app)."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from shared.index import Scope, count, index_size


class ScopeSizes:
    """Episode counts per scope for the `auto` preset, remembered for `ttl` seconds.

    `auto` only needs to know which side of 50 and 500 a scope is on, while counting a large scope is a
    filter query as costly as the KNN itself (measured at 10k episodes), so a few seconds' staleness buys
    back a Redis query per recall. One per app (services.query.app), bounded to `max_entries` scopes.
    """

    def __init__(self, ttl: float = 5.0, max_entries: int = 10_000):
        self.ttl = ttl
        self.max_entries = max_entries
        self._sizes: dict[str, tuple[float, int]] = {}
        self._indexed: dict[str, tuple[float, int]] = {}

    async def indexed(self, r: aioredis.Redis, index: str) -> int:
        """Documents in the whole index (`shared.index.index_size`), remembered for `ttl` seconds."""
        now = time.monotonic()
        hit = self._indexed.get(index)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        n = await index_size(r, index)
        self._indexed[index] = (now, n)
        return n

    async def size(self, r: aioredis.Redis, index: str, scope: Scope) -> int:
        key = scope.cache_key()
        now = time.monotonic()
        hit = self._sizes.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        n = await count(r, index, scope)
        if len(self._sizes) >= self.max_entries:
            self._sizes.clear()
        self._sizes[key] = (now, n)
        return n
