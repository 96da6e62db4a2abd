"""The only module that issues stream commands (XADD, XREADGROUP, XAUTOCLAIM, XACK, XDEL, ...).

Entries have one field, `e`, holding the codec envelope (msgpack). Dead letters carry the original
payload `e`, the original stream id `sid`, a human-readable `reason`, the consumer and the time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT

FIELD = b"e"


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry: its id (e.g. b"1732900000000-0") and raw payload: None if the entry was deleted
    while pending (XDEL by a forget), b"" if it exists without the payload field (not ours: dead-lettered)."""

    stream_id: bytes
    payload: bytes | None
    deliveries: int = 1


PUBLISH_LUA = f"""#!lua
local ids = {{}}
for i = 1, #ARGV do ids[i] = redis.call('XADD', KEYS[1], '*', '{FIELD.decode()}', ARGV[i]) end
return ids
"""
"""XADD of every payload in one atomic call. It replaced a MULTI/EXEC pipeline: redis-py reads a
transaction's reply command by command (a QUEUED per XADD), which was ~60% of the publisher's CPU per
event. The `#!lua` line (no flags, so no `allow-oom`) makes Redis refuse the whole call when it is out
of memory, before any XADD, as it refused the whole MULTI."""


PUBLISH_PLAIN_LUA = f"""#!lua
if redis.call('EXISTS', KEYS[2]) == 1 then return redis.error_reply('ENCRYPTED the stream is encrypted') end
local ids = {{}}
for i = 1, #ARGV do ids[i] = redis.call('XADD', KEYS[1], '*', '{FIELD.decode()}', ARGV[i]) end
return ids
"""
"""PUBLISH_LUA, refused (before any XADD) when the key KEYS[2] exists: a plaintext publisher's check that
the deployment does not encrypt its stream (its deployment secret exists), in the same atomic step."""


async def publish(r: aioredis.Redis, stream: str, payloads: Sequence[bytes], *,
                  unless_exists: str | None = None) -> list[bytes]:
    """XADD each payload, all in one script call (atomic: all or none are accepted); returns stream ids.

    With `unless_exists`, nothing is added if that key exists: redis-py's ResponseError starting with
    `ENCRYPTED` (see `is_encrypted_refusal`)."""
    if not payloads:
        return []
    if unless_exists is not None:
        return list(await r.register_script(PUBLISH_PLAIN_LUA)(keys=[stream, unless_exists], args=list(payloads)))
    return list(await r.register_script(PUBLISH_LUA)(keys=[stream], args=list(payloads)))


def is_encrypted_refusal(exc: Exception) -> bool:
    """Whether `exc` is PUBLISH_PLAIN_LUA's refusal."""
    return str(exc).startswith("ENCRYPTED")


PUBLISH_SEALED_LUA = f"""#!lua
local m, d = tonumber(ARGV[1]), tonumber(ARGV[2])
for j = 1, m do
  local cur = redis.call('HGET', KEYS[1 + j], 'k')
  if cur then
    if cur ~= ARGV[1 + 2 * j] then return {{0, j, redis.call('HGET', KEYS[1 + j], 'w')}} end
  elseif ARGV[2 + 2 * j] == '' then return {{0, j, false}} end
end
for j = 1, m do
  if ARGV[2 + 2 * j] ~= '' and redis.call('EXISTS', KEYS[1 + j]) == 0 then
    local t = redis.call('TIME')
    redis.call('HSET', KEYS[1 + j], 'k', ARGV[1 + 2 * j], 'w', ARGV[2 + 2 * j],
               't', t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000)))
  end
end
for j = 1, d do redis.call('DEL', KEYS[1 + m + j]) end
local out = {{1}}
for i = 3 + 2 * m, #ARGV do out[#out + 1] = redis.call('XADD', KEYS[1], '*', '{FIELD.decode()}', ARGV[i]) end
return out
"""
"""PUBLISH_LUA for sealed entries: the XADDs happen only if every data key the payloads were sealed with
is the one stored (same key id) — a key that does not exist yet is created from the wrapped proposal the
publisher sent (first publisher wins, atomically with its events) — and the call's `destroy` keys are
deleted in the same step (a UserForgotten shreds its user as it enters the stream). A destroyed key is
never re-created from a publisher's memory: only a fresh proposal creates a key. Returns {1, ids...},
or {0, j, stored wrapped key or nil} for the first key check j that failed (nothing was written)."""


async def publish_sealed(r: aioredis.Redis, stream: str, payloads: Sequence[bytes],
                         checks: Sequence[tuple[str, bytes, bytes]], destroy: Sequence[str] = ()) -> list:
    """XADD sealed `payloads` in one script call if every `(data key hash, kid, proposal)` check holds
    (proposal b"" = the key must exist with that kid), deleting the `destroy` keys in the same step.
    Returns the script's reply (PUBLISH_SEALED_LUA)."""
    args: list = [len(checks), len(destroy)]
    for _key, kid, proposal in checks:
        args += [kid, proposal]
    return list(await r.register_script(PUBLISH_SEALED_LUA)(
        keys=[stream, *(key for key, _, _ in checks), *destroy], args=args + list(payloads)))


async def ensure_group(r: aioredis.Redis, stream: str, group: str, start: str = "0") -> None:
    """Create the consumer group (and the stream) if missing; an existing group is left alone."""
    try:
        await r.xgroup_create(stream, group, id=start, mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _entries(raw) -> list[Entry]:
    out = []
    for stream_id, fields in raw or []:
        if fields is None:  # deleted while pending (XDEL after a forget)
            out.append(Entry(stream_id, None))
            continue
        out.append(Entry(stream_id, fields.get(FIELD, b"")))  # b"": present but without our field
    return out


async def reclaim(r: aioredis.Redis, stream: str, group: str, consumer: str, *, min_idle_ms: int,
                  count: int) -> tuple[list[Entry], list[bytes]]:
    """XAUTOCLAIM entries idle longer than `min_idle_ms` from any consumer.

    Returns (claimed entries, ids of entries that were deleted from the stream while pending).
    """
    if count <= 0:
        return [], []
    res = await r.xautoclaim(stream, group, consumer, min_idle_time=min_idle_ms, start_id="0-0",
                             count=count)
    claimed = _entries(res[1])
    deleted = list(res[2]) if len(res) > 2 else []
    return claimed, deleted


async def read_new(r: aioredis.Redis, stream: str, group: str, consumer: str, *, count: int,
                   block_ms: int) -> list[Entry]:
    """XREADGROUP `>` up to `count` new entries, blocking at most `block_ms`."""
    if count <= 0:
        return []
    # RESP2 (pinned by shared.redis_conn): [[stream, entries]]; redis-py annotates the RESP3 dict
    res = cast(list[Any], await r.xreadgroup(group, consumer, {stream: ">"}, count=count, block=block_ms))
    if not res:
        return []
    return _entries(res[0][1])


async def renew(r: aioredis.Redis, stream: str, group: str, consumer: str, ids: Sequence[bytes], *,
                min_idle_ms: int) -> int:
    """Renew `consumer`'s lease on pending `ids`: `XCLAIM ... JUSTID` resets their idle time without
    counting a delivery. Only entries idle at least `min_idle_ms` are touched, so one that another
    consumer reclaimed a moment ago stays with it. Returns how many were renewed."""
    if not ids:
        return 0
    return len(await r.xclaim(stream, group, consumer, min_idle_time=min_idle_ms, message_ids=list(ids),
                              justid=True))


async def delivery_counts(r: aioredis.Redis, stream: str, group: str, ids: Sequence[bytes]) -> dict[bytes, int]:
    """How many times each pending id has been delivered (XPENDING extended form)."""
    counts: dict[bytes, int] = {}
    for sid in ids:
        res = await r.xpending_range(stream, group, min=sid, max=sid, count=1)
        if res:
            counts[sid] = int(res[0]["times_delivered"])
    return counts


async def ack(r: aioredis.Redis, stream: str, group: str, ids: Sequence[bytes]) -> int:
    if not ids:
        return 0
    return int(await r.xack(stream, group, *ids))


async def delete(r: aioredis.Redis, stream: str, ids: Sequence[bytes]) -> int:
    """XDEL entries (used by forgetting so the stream no longer holds forgotten data)."""
    if not ids:
        return 0
    return int(await r.xdel(stream, *ids))


async def dead_letter(r: aioredis.Redis, dead_stream: str, entry: Entry, reason: str, consumer: str,
                      *, source_stream: str, group: str) -> bytes:
    """Copy `entry` to the dead-letter stream with its reason, then XACK the original, atomically."""
    fields: dict[FieldT, EncodableT] = {
        b"e": entry.payload or b"",
        b"sid": entry.stream_id,
        b"reason": reason.encode()[:2000],
        b"consumer": consumer.encode(),
        b"at": repr(time.time()).encode(),
        b"deliveries": str(entry.deliveries).encode(),
    }
    async with r.pipeline(transaction=True) as pipe:
        pipe.xadd(dead_stream, fields)
        pipe.xack(source_stream, group, entry.stream_id)
        res = await pipe.execute()
    return res[0]


async def read_range(r: aioredis.Redis, stream: str, start: bytes | str = "-", end: bytes | str = "+",
                     count: int = 1000) -> list[Entry]:
    """XRANGE a page of entries (for replay and for the dead-letter listing)."""
    # ids may be bytes (redis-py takes them); the stale types-redis 4.6 stubs, where installed, say str
    return _entries(await r.xrange(stream, min=start, max=end, count=count))  # type: ignore[arg-type, unused-ignore]


async def read_range_raw(r: aioredis.Redis, stream: str, start: bytes | str = "-", end: bytes | str = "+",
                         count: int = 1000) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """XRANGE returning all fields (dead letters have several)."""
    # bytes replies (decode_responses=False); redis-py annotates bytes | str and an optional reply
    raw = cast(list[tuple[bytes, dict[bytes, bytes]]],
               await r.xrange(stream, min=start, max=end, count=count))  # type: ignore[arg-type, unused-ignore]
    return list(raw)


async def group_info(r: aioredis.Redis, stream: str, group: str) -> dict[str, int]:
    """{pending, lag, consumers} of the group from XINFO GROUPS (zeros if the stream is missing)."""
    try:
        groups = await r.xinfo_groups(stream)
    except ResponseError:
        return {"pending": 0, "lag": 0, "consumers": 0}
    for g in groups:
        name = g.get("name")
        if (name.decode() if isinstance(name, bytes) else name) == group:
            lag = g.get("lag")
            return {"pending": int(g.get("pending") or 0), "lag": int(lag) if lag is not None else 0,
                    "consumers": int(g.get("consumers") or 0)}
    return {"pending": 0, "lag": 0, "consumers": 0}


async def length(r: aioredis.Redis, stream: str) -> int:
    return int(await r.xlen(stream))


async def requeue(r: aioredis.Redis, stream: str, dead_stream: str, dead_id: bytes | str, payload: bytes,
                  original_id: bytes | str | None = None) -> bytes:
    """Re-publish a dead letter's payload to `stream` and remove it from `dead_stream` and, when given,
    its original entry from `stream` (so the data is not held twice), atomically."""
    async with r.pipeline(transaction=True) as pipe:
        pipe.xadd(stream, {FIELD: payload})
        pipe.xdel(dead_stream, dead_id)
        if original_id:
            pipe.xdel(stream, original_id)
        res = await pipe.execute()
    return res[0]


async def consumer_lag(r: aioredis.Redis, stream: str, group: str) -> int:
    """Entries published but not yet delivered to `group` (0 when the stream or group is missing).

    XINFO GROUPS reports `lag` directly, but answers nil after some deletions (forgetting XDELs
    entries); then the lag is estimated as `entries-added - entries-read` from XINFO STREAM.
    """
    try:
        groups = await r.xinfo_groups(stream)
    except ResponseError:
        return 0
    for g in groups:
        name = g.get("name")
        if (name.decode() if isinstance(name, bytes) else name) != group:
            continue
        info = await r.execute_command("XINFO", "STREAM", stream)
        fields = dict(zip(info[::2], info[1::2], strict=False))
        # entries deleted before the group read them stay counted in entries-added, so Redis's lag can
        # stay above zero for good on an idle stream (seen after forgets and compaction: every publish
        # a 429): nothing after the last delivered id is no lag, and the lag is at most the length
        if _stream_id(g.get("last-delivered-id")) >= _stream_id(fields.get(b"last-generated-id")):
            return 0
        if g.get("lag") is not None:
            lag = int(g["lag"])
        else:
            lag = int(fields.get(b"entries-added") or 0) - int(g.get("entries-read") or 0)
        return max(0, min(lag, int(fields.get(b"length") or 0)))
    return 0


def _stream_id(value: bytes | str | None) -> tuple[int, int]:
    text = value.decode() if isinstance(value, bytes) else str(value or "0-0")
    ms, _, seq = text.partition("-")
    return int(ms or 0), int(seq or 0)


async def groups(r: aioredis.Redis, stream: str) -> list[dict]:
    """XINFO GROUPS (empty when the stream does not exist)."""
    try:
        return list(await r.xinfo_groups(stream))
    except ResponseError:
        return []


async def pending_summary(r: aioredis.Redis, stream: str, group: str | bytes) -> dict:
    """XPENDING summary: {pending, min, max, consumers}."""
    return await r.xpending(stream, group)


async def trim_before(r: aioredis.Redis, stream: str, min_id: str) -> int:
    """XTRIM MINID (exact): remove every entry with an id lower than `min_id`; returns the count."""
    return int(await r.xtrim(stream, minid=min_id, approximate=False))


async def retire_consumer(r: aioredis.Redis, stream: str, group: str, consumer: str) -> bool:
    """Remove `consumer` from the group if it holds no pending entries (a worker that stopped cleanly);
    True if removed. One with pending entries stays, so that XAUTOCLAIM can hand them to another."""
    try:
        consumers = await r.xinfo_consumers(stream, group)
    except ResponseError:
        return False
    for c in consumers:
        name = c.get("name")
        if (name.decode() if isinstance(name, bytes) else name) == consumer and not int(c.get("pending") or 0):
            await r.xgroup_delconsumer(stream, group, consumer)
            return True
    return False


async def unprojected(r: aioredis.Redis, stream: str, group: str, *, limit: int) -> list[bytes]:
    """Payloads the group has not acked yet: its pending entries and those not yet delivered.

    At most `limit` of each: the oldest pending ones and the newest undelivered ones (a just-published
    entry is at the end of a long backlog); the whole stream counts as undelivered while the group does
    not exist yet (no consumer ever started). This is how a read tells "accepted, not yet projected"
    from "never seen" without a write on the ingest path; its cost is bounded by `limit`.
    """
    last: bytes | None = None
    exists = False
    for g in await groups(r, stream):
        name = g.get("name")
        if (name.decode() if isinstance(name, bytes) else name) == group:
            exists = True
            value = g.get("last-delivered-id")
            last = value if isinstance(value, bytes) else str(value).encode()
    rows = await r.xpending_range(stream, group, min="-", max="+", count=limit) if exists else []
    async with r.pipeline(transaction=False) as pipe:
        for row in rows:
            pipe.xrange(stream, min=row["message_id"], max=row["message_id"], count=1)
        # an exclusive bytes id; the stale types-redis 4.6 stubs, where installed, take str ids only
        pipe.xrevrange(stream, max="+", min=b"(" + last if last else "-", count=limit)  # type: ignore[arg-type, unused-ignore]
        replies = await pipe.execute()
    return [fields[FIELD] for reply in replies for _, fields in reply if FIELD in fields]


async def acked(r: aioredis.Redis, stream: str, group: str, ids: Sequence[str]) -> list[bool]:
    """For each entry id: delivered to the group (at or before its last delivered id) and no longer
    pending, i.e. acknowledged. False for all while the group does not exist."""
    last = None
    for g in await groups(r, stream):
        name = g.get("name")
        if (name.decode() if isinstance(name, bytes) else name) == group:
            last = _stream_id(g.get("last-delivered-id"))
    if last is None or not ids:
        return [False] * len(ids)
    async with r.pipeline(transaction=False) as pipe:
        for entry in ids:
            pipe.xpending_range(stream, group, min=entry, max=entry, count=1)
        pending = await pipe.execute()
    return [_stream_id(entry) <= last and not rows for entry, rows in zip(ids, pending, strict=True)]

