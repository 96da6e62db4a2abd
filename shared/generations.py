"""Which projection generations may hold keys, and the one sweep that deletes the others
(docs/reliability.md, Generations).

A generation's keys (`Keys.gen_prefix`) may exist only while it is *live* (`meta.generation`) or
*building* (`meta.building`, kept alive by the replay's heartbeat `meta.building_beat`, Redis's clock
in ms): a forget erases in those two only. Writers re-read the record after writing (`check_writable`,
not atomic: the meta hash is in another cluster slot; a write read as live came before the swap, so
the sweep after the swap finds it); `sweep` deletes every other generation.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from engram_episodic.errors import Conflict
from shared.keys import Keys
from shared.replies import as_text

log = logging.getLogger("engram.generations")

BUILDING = "building"
"""Meta-hash field: the generation a replay is building (absent when none is)."""
BUILDING_BEAT = "building_beat"
"""Meta-hash field: Redis time (ms) of the building replay's last heartbeat."""
BUILD_LEASE_MS = 60_000
"""A building generation whose heartbeat is older than this is abandoned (the replay beats every
`BEAT_SECONDS`)."""
BEAT_SECONDS = 5.0
ERASURE_PENDING = "erasure_pending"
"""Meta-hash field that asks for the erasure pass (`services.consolidator.erasure.PENDING_FIELD`): a
sweep sets it, so that the AOF's copy of what it deleted goes at the next rewrite."""
LAST = "generation_last"
"""Meta-hash field: the highest generation number a replay ever claimed (numbers are never reused)."""

_GEN_KEY = re.compile(rb"g(\d+):")
_GEN_FIELD = re.compile(r"g(\d+):")
# "facts": what the replay that built the generation did with them (`shared.facts.replay_record`)
_META_FIELDS = ("embedder", "dim", "algorithm", "tags", "facts")

CLAIM_LUA = """
local m = redis.call('HMGET', KEYS[1], 'generation', 'building', 'building_beat', 'generation_last')
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if m[2] and m[3] and ms - tonumber(m[3]) < tonumber(ARGV[1]) then return {0, m[2], ms - tonumber(m[3])} end
local n = math.max(tonumber(m[1] or 1), tonumber(m[2] or 0), tonumber(m[4] or 0)) + 1
redis.call('HSET', KEYS[1], 'building', n, 'building_beat', ms, 'generation_last', n)
return {1, n}
"""
"""Claim a new generation number (above every one used before) as the building one, unless another
replay's lease is fresh: {1, n}, or {0, its generation, ms since its heartbeat}."""

BEAT_LUA = """
if redis.call('HGET', KEYS[1], 'building') ~= ARGV[1] then return 0 end
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'building_beat', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
return 1
"""
"""Renew the lease of building generation ARGV[1]; 0 when it is no longer the building one."""

RELEASE_LUA = """
if redis.call('HGET', KEYS[1], 'building') ~= ARGV[1] then return 0 end
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'generation', ARGV[2]) end
redis.call('HDEL', KEYS[1], 'building', 'building_beat')
return 1
"""
"""Give up building generation ARGV[1] (ARGV[2] empty), or make it live (ARGV[2] = it), in one step."""

EXPIRE_LUA = """
local b = redis.call('HMGET', KEYS[1], 'building', 'building_beat')
if not b[1] then return 0 end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if b[2] and ms - tonumber(b[2]) < tonumber(ARGV[1]) then return 0 end
redis.call('HDEL', KEYS[1], 'building', 'building_beat')
return 1
"""
"""Declare the building generation abandoned when its heartbeat is older than ARGV[1] ms."""


class StaleGeneration(RuntimeError):
    """A write went into generation `gen`, which is neither live nor being built (`live` is); what it
    wrote has been swept. Not an EngramError: no entry is dead-lettered for it, the work is re-done."""

    def __init__(self, gen: int, live: int):
        self.gen, self.live = gen, live
        super().__init__(f"generation {gen} is no longer written (live: {live}); its keys were swept")


class ReplayRunning(Conflict):
    """Another replay holds the building lease (its generation, ms since its last heartbeat)."""


async def writable(r: aioredis.Redis, keys: Keys) -> tuple[int, int | None]:
    """(live generation, building generation or None): the generations keys may exist in. A building
    generation whose lease ran out still counts until a `sweep` declares it abandoned."""
    live, building = await r.hmget(keys.meta, ["generation", BUILDING])
    return (int(live) if live else 1), (int(building) if building else None)


async def check_writable(r: aioredis.Redis, keys: Keys, gen: int) -> None:
    """After writing into generation `gen`: return when it is live or building; else sweep (so that
    what was just written goes) and raise StaleGeneration."""
    live, building = await writable(r, keys)
    if gen in (live, building):
        return
    await sweep(r, keys)
    raise StaleGeneration(gen, live)


async def claim(r: aioredis.Redis, keys: Keys) -> int:
    """Claim a replay's generation number (above every one used before) and record it as building,
    heartbeat now. ReplayRunning when another replay's lease is fresh."""
    reply = await r.register_script(CLAIM_LUA)(keys=[keys.meta], args=[BUILD_LEASE_MS])
    if int(reply[0]) != 1:
        raise ReplayRunning(
            f"a replay is building generation {as_text(reply[1])} (heartbeat {int(reply[2]) / 1000:.1f}s "
            f"ago); wait for it, or for its lease ({BUILD_LEASE_MS // 1000}s) to run out if it died"
        )
    return int(reply[1])


async def beat(r: aioredis.Redis, keys: Keys, gen: int) -> bool:
    """Renew generation `gen`'s building lease; False when it was declared abandoned (or finished)."""
    return bool(await r.register_script(BEAT_LUA)(keys=[keys.meta], args=[gen]))


async def finish(r: aioredis.Redis, keys: Keys, gen: int, *, live: bool) -> bool:
    """End building generation `gen`: make it live (`live`) or give it up, clearing the building fields
    atomically. False (nothing changed) when it was no longer building (declared abandoned)."""
    reply = await r.register_script(RELEASE_LUA)(keys=[keys.meta], args=[gen, gen if live else ""])
    return bool(reply)


async def due(r: aioredis.Redis, keys: Keys, seen_live: int | None) -> tuple[bool, int]:
    """(due, live): whether a `sweep` has work (one HMGET): the live generation is not `seen_live` (None:
    never swept), or a building generation's lease ran out."""
    live, building, at = await r.hmget(keys.meta, ["generation", BUILDING, BUILDING_BEAT])
    live_gen = int(live) if live else 1
    if seen_live != live_gen:
        return True, live_gen
    if building is None:
        return False, live_gen
    now_s, now_us = await r.time()
    return int(now_s) * 1000 + int(now_us) // 1000 - int(at or 0) >= BUILD_LEASE_MS, live_gen


async def sweep(r: aioredis.Redis, keys: Keys) -> int:
    """Delete the keys, indexes and meta fields of every dead generation (below the live one, or above
    it up to the last claimed and not building, as read before the SCAN: numbers are never reused, so
    a running replay's is never dead), after declaring abandoned a building one whose lease ran out.
    Returns keys deleted."""
    if await r.register_script(EXPIRE_LUA)(keys=[keys.meta], args=[BUILD_LEASE_MS]):
        log.warning("generations ◆ a replay's building generation was abandoned (no heartbeat); sweeping it")
    raw_live, raw_building, raw_last = await r.hmget(keys.meta, ["generation", BUILDING, LAST])
    live = int(raw_live) if raw_live else 1
    building = int(raw_building) if raw_building else None
    last = max(live, building or 0, int(raw_last) if raw_last else 0)

    def is_dead(gen: int) -> bool:
        return gen < live or (live < gen <= last and gen != building)

    prefix = keys.prefix.encode()
    dead: set[int] = set()

    async def dead_keys() -> AsyncIterator[bytes]:
        async for key in r.scan_iter(match=f"{keys.prefix}g[0-9]*", count=1000):
            m = _GEN_KEY.match(key, len(prefix)) if key.startswith(prefix) else None
            if m is not None and is_dead(int(m.group(1))):
                dead.add(int(m.group(1)))
                yield key

    deleted = await _unlink_all(r, dead_keys())
    for field in await r.hkeys(keys.meta):
        found = _GEN_FIELD.match(as_text(field))
        if found is not None and is_dead(int(found.group(1))):
            dead.add(int(found.group(1)))
    for gen in sorted(dead):
        await drop(r, keys, gen, keys_too=False)
    if deleted:
        await r.hset(keys.meta, ERASURE_PENDING, repr(time.time()))
        log.info("generations ◆ swept %d keys of generations %s", deleted, sorted(dead))
    return deleted


async def drop(r: aioredis.Redis, keys: Keys, gen: int, *, keys_too: bool = True) -> int:
    """Drop generation `gen`'s indexes, its keys (unless not `keys_too`) and its meta fields; returns
    the keys deleted. Whatever generation it is: callers decide that it is dead."""
    for name in (keys.episode_index(gen), keys.facts_index(gen)):
        try:  # FT.DROPINDEX keeps the documents: deleted below
            await r.execute_command("FT.DROPINDEX", name)
        except ResponseError:  # a missing index is the normal case
            pass

    dropped = (
        await _unlink_all(r, r.scan_iter(match=f"{keys.gen_prefix(gen)}*", count=1000)) if keys_too else 0
    )
    await r.hdel(keys.meta, *(f"g{gen}:{name}" for name in _META_FIELDS))
    return dropped


async def _unlink_all(r: aioredis.Redis, found: AsyncIterator[bytes]) -> int:
    """UNLINK the keys `found` yields, 1,000 per call; how many were deleted."""
    deleted, batch = 0, []
    async for key in found:
        batch.append(key)
        if len(batch) >= 1000:
            deleted += await r.unlink(*batch)
            batch = []
    return deleted + (await r.unlink(*batch) if batch else 0)
