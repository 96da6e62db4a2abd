"""What an episode took from the previous episode of its session (ENGRAM_CONTEXT_EPISODES,
services/consolidator/context.py), as `GET /v1/episodes/{id}` and recall hits show it: `{"previous_episode_id":
..., "text": ...}`, so a user can see why an episode matched a query on words it does not hold.

The document holds both (`context_of`, `context_text`), written by the consolidator's re-base; the
predecessor is of the same namespace, session and user by construction. Shown only while that
predecessor is readable in the caller's namespace: one that is forgotten (its document is gone) or
expired (hidden from every read at once) is not shown, even before the expiry sweep re-bases the episode.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from services.consolidator.context import CONTEXT_FIELD, CONTEXT_OF_FIELD
from shared.keys import Keys

FIELDS = (CONTEXT_OF_FIELD, CONTEXT_FIELD)
"""The document's fields `shown` reads (in this order)."""


def _live(ns_raw: bytes | None, expires: bytes | None, namespace: str, now: float) -> bool:
    if ns_raw != namespace.encode():
        return False
    try:
        return expires is None or float(expires) > now
    except ValueError:
        return False


async def shown(
    r: aioredis.Redis,
    keys: Keys,
    gen: int,
    namespace: str,
    stored: Sequence[tuple[bytes | None, bytes | None]],
) -> list[dict[str, Any] | None]:
    """Per document, from its (context_of, context_text) values: the context to show, or None (nothing
    taken, or the predecessor gone or expired). One pipeline for all the predecessors; none when no
    document took anything."""
    ids = [of.decode() if of else None for of, _text in stored]
    wanted = [eid for eid in ids if eid is not None]
    if not wanted:
        return [None] * len(stored)
    async with r.pipeline(transaction=False) as pipe:
        for eid in wanted:
            pipe.hmget(keys.episode_doc(gen, namespace, eid), ["namespace", "expires_at"])
        replies = iter(await pipe.execute())
    now = time.time()
    out: list[dict[str, Any] | None] = []
    for prev, (_of, text) in zip(ids, stored, strict=True):
        if prev is None:
            out.append(None)
            continue
        ns_raw, expires = next(replies)
        if not _live(ns_raw, expires, namespace, now):
            out.append(None)
            continue
        out.append({"previous_episode_id": prev, "text": text.decode() if text else None})
    return out


async def add_to_hits(
    r: aioredis.Redis, keys: Keys, gen: int, namespace: str, hits: list[dict[str, Any]]
) -> None:
    """Set `context` on the recall hits (`{"episode": {...}, ...}`) whose episode took one; the others are
    left without the field. Two pipelined round trips per recall (the hits' fields, their predecessors)."""
    if not hits:
        return
    async with r.pipeline(transaction=False) as pipe:
        for hit in hits:
            pipe.hmget(keys.episode_doc(gen, namespace, hit["episode"]["episode_id"]), list(FIELDS))
        stored = [(of, text) for of, text in await pipe.execute()]
    for hit, context in zip(hits, await shown(r, keys, gen, namespace, stored), strict=True):
        if context is not None:
            hit["context"] = context
