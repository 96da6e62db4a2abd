"""List and re-drive dead letters (entries the consolidator could not project)."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis

from shared import streams
from shared.codec import peek_identity
from shared.keys import Keys


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead letter: its id in the dead-letter stream, the original stream id, reason and payload."""

    dead_id: str
    stream_id: str
    reason: str
    consumer: str
    at: float
    payload: bytes


async def list_dead_letters(redis: aioredis.Redis, keys: Keys, *, limit: int = 100) -> list[DeadLetter]:
    rows = await streams.read_range_raw(redis, keys.dead_letters, "-", "+", count=limit)
    out = []
    for dead_id, f in rows:
        out.append(DeadLetter(dead_id=dead_id.decode(), stream_id=f.get(b"sid", b"").decode(),
                              reason=f.get(b"reason", b"").decode(errors="replace"),
                              consumer=f.get(b"consumer", b"").decode(errors="replace"),
                              at=float(f.get(b"at", b"0") or 0), payload=f.get(b"e", b"")))
    return out


async def redrive(redis: aioredis.Redis, keys: Keys, dead_ids: list[str] | None = None) -> int:
    """Publish dead letters' original payloads again (new stream ids) and remove them from the
    dead-letter stream, and their original (acked) entries from the stream. `dead_ids=None` re-drives
    all. Returns how many were re-driven."""
    letters = await list_dead_letters(redis, keys, limit=1_000_000)
    chosen = [d for d in letters if dead_ids is None or d.dead_id in dead_ids]
    for letter in chosen:
        await streams.requeue(redis, keys.stream, keys.dead_letters, letter.dead_id, letter.payload,
                              original_id=letter.stream_id or None)
        ident = peek_identity(letter.payload)
        if ident is not None and letter.stream_id:  # both ids it linked are gone
            await redis.hdel(keys.dead_letter_refs(ident[0], ident[1]), letter.stream_id)
    return len(chosen)
