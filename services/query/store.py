"""The episode store: every read the query service makes of episode documents, their vectors, event
hashes, tombstones, dead-letter refs and forget jobs, the access stamp of recalled episodes, and the
count of distinct values of `GET /v1/summary` (`distinct`). The
keys are `shared.keys.Keys`'; the documents are written by the consolidator alone (never re-validated
here). Replies are bytes (`decode_responses=False`, `shared.redis_conn`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import redis.asyncio as aioredis

from engram_episodic.errors import NotFound
from services.consolidator.scripts import FORGET_USER_LUA
from shared.index import VECTOR_FIELD, aggregate_rows, current_generation, search_limit
from shared.keys import Keys

JOB_TTL = 7 * 86400.0  # seconds a forget job's status stays readable after it started
STORED_FIELDS = ("doc", "status", "namespace", "access_count", "last_accessed", "expires_at")

_TOUCH = """
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('HINCRBY', key, 'access_count', 1)
    redis.call('HSET', key, 'last_accessed', ARGV[1])
  end
end
return 0
"""


class EpisodeStore:
    """The reads of one Redis connection `r` under `keys` (cheap: one per request)."""

    def __init__(self, r: aioredis.Redis, keys: Keys):
        self.r, self.keys = r, keys

    async def _each(self, calls: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """One pipeline (no transaction: one key per command, a cluster's slots) of `(method, args)`."""
        if not calls:
            return []
        async with self.r.pipeline(transaction=False) as pipe:
            for name, args in calls:
                getattr(pipe, name)(*args)
            return await pipe.execute()

    async def field(self, keys: Sequence[bytes | str], name: str) -> list[bytes | None]:
        """Field `name` of each hash in `keys` (a document's `doc`, a fact's), None where it is gone."""
        return await self._each([("hget", (key, name)) for key in keys])

    async def cosines(self, keys: Sequence[bytes], query: np.ndarray) -> list[float]:
        """Cosine between `query` (float32[dim]) and each document's stored vector (NaN when missing or
        of another size)."""
        qn = float(np.linalg.norm(query))
        out = []
        for blob in await self.field(keys, VECTOR_FIELD):
            if not blob or len(blob) != query.shape[0] * 4:
                out.append(math.nan)
                continue
            v = np.frombuffer(blob, dtype=np.float32)
            vn = float(np.linalg.norm(v))
            out.append(float(np.dot(query, v) / (qn * vn)) if qn > 0 and vn > 0 else math.nan)
        return out

    async def touch(self, keys: Sequence[bytes], now: float) -> None:
        """access_count += 1 and last_accessed = `now` (epoch s) on each document that still exists (never
        recreates one)."""
        if keys:
            await self.r.eval(_TOUCH, len(keys), *keys, repr(float(now)))

    async def stored(self, ns: str, episode_id: str) -> dict[bytes, bytes | None]:
        """The episode's `STORED_FIELDS` (bytes names). Raises NotFound when it has no document in `ns`,
        is tombstoned or expired (hidden as from every read)."""
        gen = await current_generation(self.r, self.keys)
        values = await self.r.hmget(self.keys.episode_doc(gen, ns, episode_id), STORED_FIELDS)
        found = dict(zip((n.encode() for n in STORED_FIELDS), cast(list[bytes | None], values), strict=True))
        if (
            found[b"doc"] is None
            or found[b"namespace"] != ns.encode()
            or await self.tombstoned(ns, episode_id)
        ):
            raise NotFound(f"no episode {episode_id[:80]!r} in this namespace")
        if found[b"expires_at"] is not None and float(found[b"expires_at"]) <= time.time():
            raise NotFound(f"episode {episode_id[:80]!r} expired")
        return found

    async def tombstoned(self, ns: str, episode_id: str) -> bool:
        return bool(await self.r.exists(self.keys.tombstone(ns, episode_id)))

    async def forgotten(self, ns: str, episode_ids: Sequence[str]) -> set[str]:
        """The ids among `episode_ids` that are tombstoned."""
        found = await self._each([("exists", (self.keys.tombstone(ns, e),)) for e in episode_ids])
        return {e for e, tombstoned in zip(episode_ids, found, strict=True) if tombstoned}

    async def dead_lettered(self, ns: str, episode_id: str, stream_id: str | None = None) -> bool:
        """Whether some event of the episode (the one at `stream_id`, when given) is dead-lettered."""
        refs = self.keys.dead_letter_refs(ns, episode_id)
        if stream_id is None:
            return bool(await self.r.exists(refs))
        return bool(await self.r.hexists(refs, stream_id))

    async def recorded(self, events: Sequence[Any]) -> list[tuple[bool, bool]]:
        """Per event (`namespace`, `episode_id`, `event_id`): whether its episode's event hash holds it,
        and whether its episode's document is past its `expires_at` (hidden from every read)."""
        gen, k = await current_generation(self.r, self.keys), self.keys
        calls: list[tuple[str, tuple[Any, ...]]] = []
        for e in events:
            calls += [
                ("hexists", (k.episode_events(gen, e.namespace, e.episode_id), e.event_id)),
                ("hget", (k.episode_doc(gen, e.namespace, e.episode_id), "expires_at")),
            ]
        found, now = await self._each(calls), time.time()
        return [
            (bool(f), t is not None and float(t) <= now) for f, t in zip(found[::2], found[1::2], strict=True)
        ]

    async def superseded(self, ns: str, episode_id: str, stream_id: str) -> bool:
        """The event at `stream_id` left the stream while the episode's document stays: the episode was
        re-published under another user (`Forgetting.drop_superseded`)."""
        stream = self.keys.stream_of(ns)
        if await self.r.xrange(stream, min=stream_id, max=stream_id, count=1):
            return False
        gen = await current_generation(self.r, self.keys)
        return bool(await self.r.exists(self.keys.episode_doc(gen, ns, episode_id)))

    async def holdings(self, ns: str, episode_ids: Sequence[str]) -> list[tuple[bool, bool]]:
        """Per id: (tombstoned, held: a document in `ns`, stored events or dead letters)."""
        gen, k = await current_generation(self.r, self.keys), self.keys
        calls: list[tuple[str, tuple[Any, ...]]] = []
        for e in episode_ids:
            calls += [
                ("exists", (k.tombstone(ns, e),)),
                ("hget", (k.episode_doc(gen, ns, e), "namespace")),
                ("exists", (k.episode_events(gen, ns, e),)),
                ("exists", (k.dead_letter_refs(ns, e),)),
            ]
        flags = await self._each(calls)
        return [
            (bool(t), doc_ns == ns.encode() or bool(ev) or bool(dead))
            for t, doc_ns, ev, dead in zip(flags[::4], flags[1::4], flags[2::4], flags[3::4], strict=True)
        ]

    async def forget_since(self, key: str) -> None:
        """Raise the forget time at `key` (an agent's or session's tombstone) to now (the latest wins)."""
        await self.r.eval(FORGET_USER_LUA, 1, key, repr(time.time()))

    async def record_job(self, job_id: str, fields: dict[str, Any]) -> None:
        """Write a forget job's record, readable for JOB_TTL."""
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.forget_job(job_id), mapping=cast(Any, fields))
            pipe.expire(self.keys.forget_job(job_id), int(JOB_TTL))
            await pipe.execute()

    async def job(self, job_id: str) -> dict[bytes, bytes]:
        """A forget job's record ({} when unknown or expired)."""
        return cast(dict[bytes, bytes], await self.r.hgetall(self.keys.forget_job(job_id)))

    async def erased(self, ns: str, digests: Sequence[str]) -> int:
        """How many of the episodes (by `Keys.tombstone_of` digest) are tombstoned and have no document
        (tombstoned first, then erased: done once both hold)."""
        gen, done = await current_generation(self.r, self.keys), 0
        for start in range(0, len(digests), 1000):
            calls: list[tuple[str, tuple[Any, ...]]] = []
            for d in digests[start : start + 1000]:
                calls += [
                    ("exists", (self.keys.tombstone_of(ns, d),)),
                    ("exists", (self.keys.episode_doc_of(gen, ns, d),)),
                ]
            found = await self._each(calls)
            done += sum(1 for tomb, doc in zip(found[::2], found[1::2], strict=True) if tomb and not doc)
        return done


async def distinct(r: Any, index: str, query: str, field: str) -> int:
    """Distinct values of the TAG `field` among the documents of `query` (documents without it left out)."""
    reply_ = await r.execute_command(
        "FT.AGGREGATE",
        index,
        query,
        *search_limit(),
        "LOAD",
        1,
        f"@{field}",
        "FILTER",
        f"exists(@{field})",
        "GROUPBY",
        0,
        "REDUCE",
        "COUNT_DISTINCT",
        1,
        f"@{field}",
        "AS",
        "n",
        "DIALECT",
        2,
    )
    rows = aggregate_rows(reply_)
    return int(rows[0].get("n") or 0) if rows else 0
