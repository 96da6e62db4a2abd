"""Remembered counts for recall: episodes per scope, documents per index and the document frequency
of query words (one `ScopeSizes` per app)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio as aioredis

from services.query.recall.relevance import common_count
from shared.index import Scope, count, index_size, term_counts
from shared.keys import Keys
from shared.streams import StreamGroup

COMMON_IDF = 0.02
"""A word whose idf (`services.query.recall.relevance.idf`) is below this is common: in more than ~4,950 of the
namespace's episodes (`services.query.recall.relevance.common_count`)."""
COMMON_TTL_FACTOR = 10.0
"""A common word's count is remembered this many times `df_ttl`: counting it reads its whole posting
list, while more episodes holding it barely move its weight (already below COMMON_IDF)."""


LARGE_SCOPE = 100_000
"""A scope (or index) this large keeps its count longer, in proportion: `ttl` × n / LARGE_SCOPE."""
MAX_SIZE_TTL = 60.0
"""The longest a count is remembered (seconds)."""
MAX_SCOPES, MAX_TERMS = 10_000, 100_000
"""Scope counts and (index, scope, word) counts remembered at most."""


def size_ttl(ttl: float, n: int) -> float:
    """How long a count of `n` documents is remembered: `ttl` up to LARGE_SCOPE documents, then in
    proportion to n, at most MAX_SIZE_TTL (never below `ttl`): counting is linear in the scope, while
    what a count decides (the `auto` preset, the KNN policy) does not move with a few percent."""
    return max(ttl, min(MAX_SIZE_TTL, ttl * n / LARGE_SCOPE))


class ScopeSizes:
    """Episode counts per scope for the `auto` preset, remembered for `ttl` seconds (longer for a large
    scope: `size_ttl`), and the document frequency of query words for keyword relevance's idf,
    remembered for `df_ttl` seconds; at most MAX_SCOPES and MAX_TERMS of them. One per app
    (`services.query.appkeys.SCOPE_SIZES`).

    With `keys` (the app's), a count is used only while the namespace is as it was when counted
    (`version`; the index's size too, per namespace), so the same request to an unchanged namespace
    always answers the same; while its events are still being projected nothing is remembered.
    """

    def __init__(
        self,
        ttl: float = 5.0,
        *,
        df_ttl: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        keys: Keys | None = None,
        group: str = "consolidator",
    ):
        self.keys, self.group = keys, group
        self.ttl, self.df_ttl = ttl, df_ttl
        self._clock = clock  # of the idf counts (seconds, monotonic)
        # (when, count, `version`) per scope key, and per (index, namespace) of the index's size
        self._sizes: dict[Any, tuple[float, int, str]] = {}
        # insertion order is age order (a refreshed entry is re-inserted), so expiry pops from the front;
        # the counts of common words (COMMON_IDF) apart, as they are kept COMMON_TTL_FACTOR times longer
        self._df: OrderedDict[tuple[str, str, str], tuple[float, int, str]] = OrderedDict()
        self._common: OrderedDict[tuple[str, str, str], tuple[float, int, str]] = OrderedDict()
        self._common_n = common_count(COMMON_IDF)

    async def version(self, r: aioredis.Redis, namespace: str) -> str | None:
        """What the remembered counts of `namespace` are valid for: the last id of its partition stream
        once the consolidators have projected and acked every entry (`StreamGroup.settled`: every write
        to its episodes, forgets and expiry included, is an event there), None while one waits (then
        nothing is remembered). Without `keys`, "" (counts expire by age alone)."""
        if self.keys is None:
            return ""
        return await StreamGroup(r, self.keys.stream_of(namespace), self.group).settled()

    def _ttl(self, counts: OrderedDict[tuple[str, str, str], tuple[float, int, str]]) -> float:
        return self.df_ttl * COMMON_TTL_FACTOR if counts is self._common else self.df_ttl

    def expire(self) -> None:
        """Drop the idf counts older than `df_ttl` (a common word's: COMMON_TTL_FACTOR × `df_ttl`; the
        query service calls it every second, so an idle process does not keep a forgotten episode's
        words either: docs/reliability.md)."""
        now = self._clock()
        for df in (self._df, self._common):
            ttl = self._ttl(df)
            while df and now - next(iter(df.values()))[0] >= ttl:
                df.popitem(last=False)

    async def indexed(self, r: aioredis.Redis, index: str, namespace: str | None) -> int:
        """Documents in the whole index (`shared.index.index_size`), remembered per `namespace` as `size`
        is: what a recall of the namespace decides by it (the KNN's policy) moves only when the
        namespace does or the count expires, not with each write to another namespace. Without a
        namespace, for an estimate no answer depends on, remembered `ttl` seconds whatever is written
        (the count reads the whole index, and a namespace being written is never settled)."""
        return await self._remembered(r, (index, namespace), namespace, lambda: index_size(r, index))

    async def size(self, r: aioredis.Redis, index: str, scope: Scope) -> int:
        """Episodes of `scope` (`shared.index.count`), remembered as the class docstring says."""
        return await self._remembered(r, scope.cache_key(), scope.namespace, lambda: count(r, index, scope))

    async def _remembered(
        self, r: aioredis.Redis, key: Any, ns: str | None, fresh: Callable[[], Awaitable[int]]
    ) -> int:
        """The count remembered under `key` while `ns`'s `version` is the one it was counted at (any,
        `ns` None) and it is younger than `size_ttl`; else `fresh()`, remembered unless `ns` moved."""
        now = time.monotonic()
        version = await self.version(r, ns) if ns is not None else ""
        hit = self._sizes.get(key)
        if hit is not None and hit[2] == version and now - hit[0] < size_ttl(self.ttl, hit[1]):
            return hit[1]
        n = await fresh()
        if version is not None and (ns is None or await self.version(r, ns) == version):  # not moved
            if len(self._sizes) >= MAX_SCOPES:
                self._sizes.clear()
            self._sizes[key] = (now, n, version)
        return n

    async def term_counts(
        self, r: aioredis.Redis, index: str, scope: Scope, words: Sequence[str]
    ) -> list[int]:
        """`shared.index.term_counts` (documents of `scope` matching each word, same order), each word's
        count remembered for `df_ttl` seconds per (index, scope, word) and, with `keys`, only while the
        namespace's `version` is the one it was counted at; only the words not remembered are counted
        (one pipeline). `df_ttl` 0 counts every word every time. A word is dropped after its TTL at the
        next call or `expire` (docs/reliability.md "Remaining traces").
        """
        if self.df_ttl <= 0:
            return await term_counts(r, index, scope, words)
        now = self._clock()
        self.expire()
        sk = scope.cache_key()
        version = await self.version(r, scope.namespace)
        known: dict[str, int] = {}
        for w in words:
            for df in (self._df, self._common):
                hit = df.get((index, sk, w))
                # concurrent calls insert out of order: the age is checked, not only the position
                if hit is not None and hit[2] == version and now - hit[0] < self._ttl(df):
                    known[w] = hit[1]
        missing = [w for w in dict.fromkeys(words) if w not in known]
        if missing:
            counted = dict(zip(missing, await term_counts(r, index, scope, missing), strict=True))
            known.update(counted)
            # still projecting, or projected meanwhile: the counts answer this call, not later ones
            if version is not None and await self.version(r, scope.namespace) == version:
                for w, n in counted.items():
                    key = (index, sk, w)
                    df, other = (self._common, self._df) if n > self._common_n else (self._df, self._common)
                    other.pop(key, None)
                    df[key] = (now, n, version)
                    df.move_to_end(key)
            for df in (self._df, self._common):
                while len(df) > MAX_TERMS:
                    df.popitem(last=False)
        return [known[w] for w in words]
