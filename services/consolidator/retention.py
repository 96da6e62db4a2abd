"""Stream retention: trim entries every group has acked that are older than `ENGRAM_STREAM_RETENTION`.
Each episode's event hash (written before the ack) keeps its events, and a replay re-folds those plus
the stream tail, so trimming loses nothing a rebuild needs.
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from shared import streams
from shared.keys import Keys
from shared.replies import as_text


async def safe_trim_id(redis: aioredis.Redis, stream: str) -> tuple[int, int] | None:
    """The lowest id some group still needs: its oldest pending entry, else the entry after its
    last delivered one. None when there is no group (then nothing is provably projected)."""
    groups = await streams.groups(redis, stream)
    if not groups:
        return None
    needed: list[tuple[int, int]] = []
    for g in groups:
        summary = await streams.StreamGroup(redis, stream, as_text(g["name"])).pending_summary()
        if summary and summary.get("pending"):
            needed.append(streams.id_tuple(summary["min"]))
        else:
            ms, seq = streams.id_tuple(g["last-delivered-id"])
            needed.append((ms, seq + 1))
    return min(needed)


async def trim(
    redis: aioredis.Redis, keys: Keys, *, retention_seconds: float, now: float | None = None
) -> int:
    """XTRIM MINID each partition at min(what every group still needs there, now - retention). Returns
    entries removed (all partitions)."""
    cutoff = (int(((now if now is not None else time.time()) - retention_seconds) * 1000), 0)
    removed = 0
    for stream in keys.streams:
        safe = await safe_trim_id(redis, stream)
        if safe is None:
            continue
        ms, seq = min(safe, cutoff)
        if ms > 0:
            removed += await streams.trim_before(redis, stream, f"{ms}-{seq}")
    return removed
