"""Erasure housekeeping: after forgets, make the forgotten bytes leave Redis's files
(docs/reliability.md, "Erasure").

Two copies outlive a forget's deletions: the **AOF** increments (rewritten by `BGREWRITEAOF`), and
the **stream's listpack nodes**, where `XDEL` only flags an entry (ciphertext under a destroyed key
with encryption, plaintext without, until `compact` rewrites the stream). Forgetting calls
`mark_pending`; lane 0 of a worker calls `housekeep`, which runs `compact` then the AOF rewrite at most
once per `ENGRAM_ERASURE_INTERVAL` while forgets are pending.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT

from engram_episodic.errors import EngramError
from shared import generations, streams
from shared.codec import unpack
from shared.keys import Keys
from shared.replies import as_text

log = logging.getLogger("engram.erasure")

PENDING_FIELD = generations.ERASURE_PENDING
DONE_FIELD = "erasure_done"

CLEAR_PENDING_LUA = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
return 1
"""


SWAP_LUA = """
local src, dst = KEYS[1], KEYS[2]
if redis.call('EXISTS', src) == 0 then redis.call('DEL', dst) return {0, 'no stream'} end
local function field(list, name)
  for i = 1, #list, 2 do if list[i] == name then return list[i + 1] end end
end
for _, row in ipairs(redis.call('XRANGE', src, '(' .. ARGV[1], '+')) do
  redis.call('XADD', dst, row[1], unpack(row[2]))
end
local first = redis.call('XRANGE', src, '-', '+', 'COUNT', 1)
if #first > 0 then redis.call('XTRIM', dst, 'MINID', first[1][1]) else redis.call('DEL', dst) end
if redis.call('XLEN', dst) ~= redis.call('XLEN', src) then redis.call('DEL', dst) return {0, 'changed'} end
local info = redis.call('XINFO', 'STREAM', src)
for _, g in ipairs(redis.call('XINFO', 'GROUPS', src)) do
  local name, read = field(g, 'name'), field(g, 'entries-read')
  if read then
    redis.call('XGROUP', 'CREATE', dst, name, field(g, 'last-delivered-id'), 'MKSTREAM', 'ENTRIESREAD', read)
  else
    redis.call('XGROUP', 'CREATE', dst, name, field(g, 'last-delivered-id'), 'MKSTREAM')
  end
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', src, name)) do
    redis.call('XGROUP', 'CREATECONSUMER', dst, name, field(c, 'name'))
  end
  local start = '-'
  while true do
    local page = redis.call('XPENDING', src, name, start, '+', 1000)
    if #page == 0 then break end
    for _, p in ipairs(page) do
      redis.call('XCLAIM', dst, name, p[2], 0, p[1], 'IDLE', p[3], 'RETRYCOUNT', p[4], 'FORCE', 'JUSTID')
    end
    start = '(' .. page[#page][1]
  end
end
if redis.call('EXISTS', dst) == 0 then return {0, 'empty'} end
redis.call('XSETID', dst, field(info, 'last-generated-id'), 'ENTRIESADDED', field(info, 'entries-added'),
           'MAXDELETEDID', field(info, 'max-deleted-entry-id'))
-- Redis's lag is entries-added minus entries-read; entries deleted before a group read them would stay
-- in that difference for good (every publish a 429 on an idle stack): count what each group has left
local added = tonumber(field(info, 'entries-added'))
for _, g in ipairs(redis.call('XINFO', 'GROUPS', dst)) do
  local last = field(g, 'last-delivered-id')
  local left = #redis.call('XRANGE', dst, '(' .. last, '+')
  redis.call('XGROUP', 'SETID', dst, field(g, 'name'), last, 'ENTRIESREAD', added - left)
end
redis.call('PERSIST', dst)
redis.call('RENAME', dst, src)
return {1, redis.call('XLEN', src)}
"""
"""The atomic end of `compact`: copy the entries added meanwhile, drop those trimmed, give up if one was
deleted (the lengths differ), rebuild every group exactly (last-delivered id, entries-read, consumers,
each pending entry with its idle time and deliveries), restore the last id, entries-added and
max-deleted id (`XSETID`), and RENAME over the source."""


COPY_TTL = 3600
"""Seconds a copy abandoned by a crashed compaction lives (the next compaction deletes it sooner)."""


async def compact(
    redis: aioredis.Redis,
    keys: Keys,
    *,
    page: int = 1000,
    stream: str | None = None,
) -> dict:
    """Rewrite `stream` (default: the episode stream; also each partition and the dead-letter stream) so
    that the bytes of XDEL'd entries leave Redis's memory: the live entries are copied, ids unchanged,
    into a new key page by page while the stream takes entries, then SWAP_LUA finishes atomically (a
    second copy of the stream meanwhile). Returns {compacted, entries, seconds, swap_ms (the atomic
    step: Redis serves nobody else), bytes_before, bytes_after}."""
    stream = stream or keys.stream
    tmp = keys.stream_compaction(stream)
    started = time.perf_counter()
    before = int(await redis.memory_usage(stream, samples=0) or 0)
    swap = redis.register_script(SWAP_LUA)
    why = "no attempt"
    for _attempt in range(3):  # a stream that lost an entry meanwhile is copied again
        await redis.delete(tmp)
        last = "0-0"
        while rows := await streams.read_range_raw(redis, stream, f"({last}", count=page):
            async with redis.pipeline(transaction=False) as pipe:
                for sid, fields in rows:
                    pipe.xadd(tmp, cast("dict[FieldT, EncodableT]", fields), id=sid)  # Dict is invariant
                pipe.expire(tmp, COPY_TTL)  # a copy left by a crash must not outlive a forget for long
                await pipe.execute()
            last = rows[-1][0].decode()
            if len(rows) < page:
                break
        swap_started = time.perf_counter()
        done, detail = await swap(keys=[stream, tmp], args=[last])
        swap_ms = round(1000 * (time.perf_counter() - swap_started), 2)  # Redis blocked this long at most
        if int(done) == 1:
            after = int(await redis.memory_usage(stream, samples=0) or 0)
            return {
                "compacted": True,
                "entries": int(detail),
                "seconds": round(time.perf_counter() - started, 3),
                "swap_ms": swap_ms,
                "bytes_before": before,
                "bytes_after": after,
            }
        why = detail.decode() if isinstance(detail, bytes) else str(detail)
        if why in ("no stream", "empty"):
            break
    await redis.delete(tmp)
    return {
        "compacted": False,
        "reason": why,
        "seconds": round(time.perf_counter() - started, 3),
        "bytes_before": before,
    }


async def mark_pending(redis: aioredis.Redis, keys: Keys) -> None:
    """Note that something was forgotten (the time of the latest forget)."""
    await redis.hset(keys.meta, PENDING_FIELD, repr(time.time()))


async def rewrite_aof(redis: aioredis.Redis) -> bool:
    """BGREWRITEAOF and wait for a rewrite that *started after this call* (one running forked before
    the forget); on a cluster, every primary in turn. False when AOF is off or a rewrite failed;
    TimeoutError past 300 seconds."""
    if isinstance(redis, RedisCluster):
        return all([await _rewrite_aof(redis, {"target_nodes": n}) for n in redis.get_primaries()])
    return await _rewrite_aof(redis, {})


async def _rewrite_aof(redis: aioredis.Redis, target: dict) -> bool:
    """`rewrite_aof` on one server (`target`: redis-py's `target_nodes` on a cluster, else empty)."""
    info = await redis.info("persistence", **target)
    if not int(info.get("aof_enabled", 0)):
        return False
    deadline = time.monotonic() + 300.0
    while True:
        before = int((await redis.info("persistence", **target)).get("aof_rewrites", 0))
        try:
            await redis.bgrewriteaof(**target)
            break
        except ResponseError as exc:
            if "already in progress" not in str(exc):
                raise
        if time.monotonic() > deadline:
            raise TimeoutError("an AOF rewrite stayed in progress")
        await asyncio.sleep(0.05)
    while True:
        info = await redis.info("persistence", **target)
        if (
            int(info.get("aof_rewrites", 0)) > before
            and not int(info.get("aof_rewrite_in_progress", 0))
            and not int(info.get("aof_rewrite_scheduled", 0))
        ):
            return info.get("aof_last_bgrewrite_status") == "ok"
        if time.monotonic() > deadline:
            raise TimeoutError("the AOF rewrite did not finish")
        await asyncio.sleep(0.05)


FORGET_TYPES = frozenset({"UserForgotten", "EpisodeForgotten"})


def _is_forget(fields: dict) -> bool:
    try:
        return unpack(fields.get(streams.FIELD) or b"").get("type") in FORGET_TYPES
    except EngramError:
        return False


async def drop_applied_forgets(redis: aioredis.Redis, keys: Keys) -> int:
    """XDEL the forget events every group has acked (they name the user or episode, under a key never
    destroyed; the tombstones they left keep the data from coming back). Skipped while a replay builds
    (its catch-up may still read them). Returns how many were dropped."""
    if (await generations.writable(redis, keys))[1] is not None:
        return 0
    return sum([await _drop_applied_forgets(redis, stream) for stream in keys.streams])


async def _drop_applied_forgets(redis: aioredis.Redis, stream: str) -> int:
    """`drop_applied_forgets` on one partition `stream`."""
    names = [as_text(g["name"]) for g in await streams.groups(redis, stream)]
    groups = [streams.StreamGroup(redis, stream, name) for name in names]
    dropped, last = 0, "0-0"
    while groups and (rows := await streams.read_range_raw(redis, stream, f"({last}", count=1000)):
        forgets = [sid.decode() for sid, fields in rows if _is_forget(fields)]
        acked = [await g.acked(forgets) for g in groups]
        gone = [sid for sid, *done in zip(forgets, *acked, strict=True) if all(done)]
        if gone:
            await streams.delete(redis, stream, gone)
            dropped += len(gone)
        last = rows[-1][0].decode()
    return dropped


async def compact_partitions(redis: aioredis.Redis, keys: Keys) -> dict:
    """`compact` every partition of the episode stream. With one partition its report as it is; with
    several {compacted (any), entries, seconds, swap_ms (the longest), bytes_before,
    bytes_after (sums), partitions: the report of each, in partition order}."""
    reports = [await compact(redis, keys, stream=stream) for stream in keys.streams]
    if len(reports) == 1:
        return reports[0]
    total: dict = {"compacted": any(r["compacted"] for r in reports)}
    for name in ("entries", "seconds", "bytes_before", "bytes_after"):
        total[name] = round(sum(r.get(name, 0) for r in reports), 3)
    total["swap_ms"] = max(r.get("swap_ms", 0) for r in reports)
    total["partitions"] = reports
    return total


async def run(redis: aioredis.Redis, keys: Keys) -> dict:
    """One erasure pass now: compact the stream, then rewrite the AOF (whose new base is then taken from the compacted stream). Returns
    what it did and how long each step took."""
    started = time.perf_counter()
    forgets = await drop_applied_forgets(redis, keys)
    compaction = await compact_partitions(redis, keys)
    # dead letters hold the payload of the entry they failed on (uncompacted, a forgotten user's dead
    # letter would stay in the RDB and the AOF base after the pass)
    dead = await compact(redis, keys, stream=keys.dead_letters)
    rewritten = await rewrite_aof(redis)
    return {
        "forget_events_dropped": forgets,
        "compaction": compaction,
        "dead_letters_compaction": dead,
        "aof_rewritten": rewritten,
        "seconds": round(time.perf_counter() - started, 3),
    }


async def housekeep(redis: aioredis.Redis, keys: Keys, *, interval: float, lease_ms: int) -> dict | None:
    """If forgets are pending and the last erasure pass is older than `interval` seconds, run one
    (one worker at a time: a lease) and clear the mark unless a forget came meanwhile. Returns its
    report, or None when nothing was due."""
    pending, done = await redis.hmget(keys.meta, [PENDING_FIELD, DONE_FIELD])
    if pending is None or (done is not None and time.time() - float(done) < interval):
        return None
    lock = keys.erasure_lock
    if not await redis.set(lock, "1", nx=True, px=max(lease_ms, 600_000)):
        return None
    try:
        report = await run(redis, keys)
        await redis.register_script(CLEAR_PENDING_LUA)(
            keys=[keys.meta], args=[PENDING_FIELD, pending, DONE_FIELD, repr(time.time())]
        )
        log.info("erasure ◆ after forgets: %s", report)
        return report
    finally:
        await redis.delete(lock)
