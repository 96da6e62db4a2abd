"""Dead letters (entries the consolidator could not project): the one owner of their writes, reads,
re-drives and deletes (the stream commands stay in `shared.streams`).

A dead letter is a copy of the entry with its reason (`StreamGroup.dead_letter` XACKs the original).
When its payload names an episode, both copies are linked to the episode (`Keys.dead_letter_refs`,
its user under DEAD_REF_USER) and the episode to its user (`Keys.user_dead_letters`), so forgetting
either deletes them; sealed ones of a forgotten user are found by their key reference. A sealed
entry's reason names fields, never values (`withhold_values`).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.typing import EncodableT

from engram_episodic.cli_progress import Bars
from shared import streams
from shared.codec import payload_ref, peek_identity
from shared.keys import Keys
from shared.replies import as_text, bytes_map

DEAD_REF_USER = b"@user"
"""Field of an episode's dead-letter-refs hash naming its user (the other fields are stream ids)."""

_QUOTED = re.compile(r"('[A-Za-z_][\w.]*' object\b)|'[^']*'|\"[^\"]*\"")


def withhold_values(reason: str) -> str:
    """A sealed entry's dead-letter reason without any quoted value (a bad timestamp is quoted back), but
    with the type Python's `'<type>' object ...` messages name."""
    return _QUOTED.sub(lambda m: m.group(1) or "'…'", reason)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead letter: its id in the dead-letter stream, the original stream id, reason and payload;
    `source` is the partition stream it came from."""

    dead_id: str
    stream_id: str
    reason: str
    consumer: str
    at: float
    payload: bytes
    source: str = ""


async def list_dead_letters(redis: aioredis.Redis, keys: Keys, *, limit: int = 100) -> list[DeadLetter]:
    rows = await streams.read_range_raw(redis, keys.dead_letters, "-", "+", count=limit)
    out = []
    for dead_id, f in rows:
        out.append(
            DeadLetter(
                dead_id=dead_id.decode(),
                stream_id=f.get(b"sid", b"").decode(),
                reason=f.get(b"reason", b"").decode(errors="replace"),
                consumer=f.get(b"consumer", b"").decode(errors="replace"),
                at=float(f.get(b"at", b"0") or 0),
                payload=f.get(b"e", b""),
                source=f.get(b"src", b"").decode(errors="replace"),
            )
        )
    return out


async def _each(
    letters: list[DeadLetter],
    progress: Bars | None,
    phase: str,
    act: Callable[[DeadLetter], Awaitable[object]],
) -> int:
    """`act` on each of `letters` (as `list_dead_letters` read them), each one a unit of the `progress`
    phase `phase` (the command). Returns how many."""
    progress = progress or Bars(enabled=False)
    progress.phase(phase, len(letters))
    for letter in letters:
        await act(letter)
        progress.advance(1)
    return len(letters)


async def redrive(
    redis: aioredis.Redis, keys: Keys, letters: list[DeadLetter], progress: Bars | None = None
) -> int:
    """Publish dead letters' original payloads again (new stream ids, into the partition they came
    from) and remove them and their original (acked) entries (`_each` for the arguments)."""

    async def one(letter: DeadLetter) -> None:
        original = letter.stream_id or None
        await streams.requeue(
            redis, letter.source, keys.dead_letters, letter.dead_id, letter.payload, original
        )
        ident = peek_identity(letter.payload)
        if ident is not None and letter.stream_id:  # both ids it linked are gone
            await redis.hdel(keys.dead_letter_refs(ident[0], ident[1]), letter.stream_id)

    return await _each(letters, progress, "redrive", one)


async def discard(
    redis: aioredis.Redis, keys: Keys, letters: list[DeadLetter], progress: Bars | None = None
) -> int:
    """Delete dead letters no fix will make projectable, their original (acked) entries and the
    episode's link to them (its user's too once it has no other); nothing is published, as a forget
    would leave them (`_each` for the arguments)."""
    return await _each(letters, progress, "discard", lambda letter: _discard(redis, keys, letter))


async def _discard(redis: aioredis.Redis, keys: Keys, letter: DeadLetter) -> None:
    await streams.delete(redis, keys.dead_letters, [letter.dead_id])
    if letter.stream_id:
        await streams.delete(redis, letter.source, [letter.stream_id])
    ident = peek_identity(letter.payload) if letter.payload else None
    if ident is not None and letter.stream_id:
        namespace, episode_id, user_id, _ = ident
        refs_key = keys.dead_letter_refs(namespace, episode_id)
        await redis.hdel(refs_key, letter.stream_id)
        left = set(await redis.hkeys(refs_key)) - {DEAD_REF_USER}
        if not left:  # the episode has no dead letter left: neither it nor its user link to any
            await redis.delete(refs_key)
            if user_id is not None:
                await redis.srem(keys.user_dead_letters(namespace, user_id), episode_id)


async def dead_letter(
    group: streams.StreamGroup, keys: Keys, entry: streams.Entry, reason: str, *, consumer: str
) -> None:
    """Move `entry` to the dead letters (acking it), linking both copies to the episode it names (and
    its user), so that forgetting either deletes them."""
    k, redis = keys, group.redis
    dead_id = await group.dead_letter(k.dead_letters, entry, reason, consumer)
    ident = peek_identity(entry.payload) if entry.payload else None
    if ident is None:
        return
    namespace, episode_id, user_id, occurred_at = ident
    refs: dict[EncodableT, EncodableT] = {entry.stream_id: dead_id}
    if user_id is not None:
        refs[DEAD_REF_USER] = user_id.encode()
        await redis.sadd(k.user_dead_letters(namespace, user_id), episode_id)
    await redis.hset(k.dead_letter_refs(namespace, episode_id), mapping=refs)
    forgotten = bool(await redis.exists(k.tombstone(namespace, episode_id)))
    if not forgotten and user_id is not None:
        at = await redis.get(k.user_tombstone(namespace, user_id))
        forgotten = at is not None and (occurred_at is None or float(at) >= occurred_at)
    if forgotten:  # forgotten before or while this was dead-lettered: keep neither copy
        await delete_dead_letters(redis, keys, namespace, episode_id)


async def delete_dead_letters(redis: aioredis.Redis, keys: Keys, namespace: str, episode_id: str) -> None:
    """XDEL an episode's dead-lettered events from the stream and from the dead letters, and drop
    the links (its id from its user's set too)."""
    key = keys.dead_letter_refs(namespace, episode_id)
    refs = bytes_map(await redis.hgetall(key))
    user = refs.pop(DEAD_REF_USER, None)
    if refs:
        await streams.delete(redis, keys.stream_of(namespace), sorted(refs))
        await streams.delete(redis, keys.dead_letters, sorted(refs.values()))
    if user is not None:
        await redis.srem(keys.user_dead_letters(namespace, user.decode()), episode_id)
    await redis.delete(key)


async def delete_user_dead_letters(
    redis: aioredis.Redis, keys: Keys, namespace: str, user_id: str, *, sealed_ref: bytes | None
) -> None:
    """Delete the dead letters of a forgotten user's episodes, including ones that never had a document,
    and, with `sealed_ref` (the user's data-key reference), every dead letter sealed with that key."""
    dead_key = keys.user_dead_letters(namespace, user_id)
    for episode_id in await redis.smembers(dead_key):
        await delete_dead_letters(redis, keys, namespace, as_text(episode_id))
    await redis.delete(dead_key)
    if sealed_ref is not None:
        await delete_sealed_dead_letters(redis, keys, sealed_ref)


async def delete_sealed_dead_letters(redis: aioredis.Redis, keys: Keys, ref: bytes) -> None:
    """Discard the dead letters sealed with the key `ref` (a forgotten user's: their user_id is inside
    the ciphertext, so they are found by the key reference) as `discard` does."""
    for letter in await list_dead_letters(redis, keys, limit=1_000_000):
        if (payload_ref(letter.payload) or (None,))[0] == ref:
            await _discard(redis, keys, letter)
