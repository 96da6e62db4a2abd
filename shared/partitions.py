"""What a deployment was started with, recorded once in its meta hash by the first process and
checked by every later one: its key layout, whether it seals its stream, its number of partitions.

**Layout** (`LAYOUT`: the keys of `shared.keys`, the TAG digests of `shared.tags`, `shared.ties`'s
`tiebreak`): a meta hash without it, or with another, was written by another Engram and is refused
with the way out. Stream entries alone do not count: a publisher without the SDK may write them first.
**Encryption** (`sealed`): a process with a master key is refused on a plaintext deployment rather
than mix sealed entries into a log that keeps plaintext ones.
**Partitions** (`stream_partitions`, P): a namespace's partition is its digest modulo P, so another P
would fold a namespace's new events apart from its older ones. How to change P: docs/scaling.md.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from engram_episodic.errors import ConfigError
from shared.keys import Keys

FIELD = "stream_partitions"
"""The meta hash field holding P."""
LAYOUT = 1
"""The key layout of this build; the meta hash field `layout` holds the deployment's."""

START_LUA = """
local layout = redis.call('HGET', KEYS[1], 'layout')
if not layout then
  if redis.call('EXISTS', KEYS[1]) == 1 then return {'', '', ''} end
  redis.call('HSET', KEYS[1], 'layout', ARGV[3], 'sealed', ARGV[4])
  layout = ARGV[3]
end
if layout ~= ARGV[3] then return {layout, '', ''} end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  cur = ARGV[2]
end
return {layout, cur, redis.call('HGET', KEYS[1], 'sealed')}
"""
"""Record the layout ARGV[3] and `sealed` ARGV[4] unless recorded — only when the meta hash does not
exist yet: every Engram process of an older layout wrote into it — then P ARGV[2] unless recorded.
Returns {recorded layout, recorded P, recorded sealed}, '' for what is not recorded (one round trip)."""


async def recorded(redis: aioredis.Redis, keys: Keys) -> int | None:
    """P as recorded in the deployment's meta, or None before any process recorded it."""
    raw = await redis.hget(keys.meta, FIELD)
    return None if raw is None else int(raw)


async def check_partitions(redis: aioredis.Redis, keys: Keys, *, sealed: bool, explicit: bool = True) -> None:
    """Record `LAYOUT`, `sealed` (a master key) and `keys.partitions` where nothing is recorded, else
    require them (`explicit`: P was set, not the topology's default). ConfigError, saying what to do,
    for another layout, a master key on a plaintext deployment, none on an encrypted one, or another P."""
    proposed = keys.partitions
    layout, raw, recorded_sealed = await redis.register_script(START_LUA)(
        keys=[keys.meta], args=[FIELD, proposed, LAYOUT, int(sealed)]
    )
    if not layout:
        raise ConfigError(
            f"ENGRAM_PREFIX={keys.prefix!r} was written by an older Engram layout: replay its episodes into "
            "a fresh prefix (ENGRAM_PREFIX=<new prefix>; `engram export` with the Engram that wrote it, "
            "then `engram import`)"
        )
    if layout != str(LAYOUT).encode():
        raise ConfigError(
            f"ENGRAM_PREFIX={keys.prefix!r} has key layout {layout.decode()!r}, this Engram reads layout "
            f"{LAYOUT}: run the Engram that wrote it"
        )
    if sealed and recorded_sealed == b"0":
        raise ConfigError(
            f"ENGRAM_PREFIX={keys.prefix!r} was started without a master key, so its stream holds plaintext: "
            "a master key applies to a fresh prefix (ENGRAM_PREFIX=<new prefix>; `engram export`, then "
            "`engram import` into it)"
        )
    if not sealed and recorded_sealed == b"1":
        # a process without the key would read every entry as undecodable: a replay would swap in an
        # empty generation, a worker dead-letter everything, a publisher write plaintext beside sealed
        raise ConfigError(
            f"this deployment (ENGRAM_PREFIX={keys.prefix!r}) encrypts its stream: set ENGRAM_MASTER_KEY or "
            "ENGRAM_MASTER_KEY_FILE (`make run` keeps it in ENGRAM_DATA_DIR/master.key)"
        )
    have = int(raw)
    if have != proposed:
        raise ConfigError(
            f"ENGRAM_STREAM_PARTITIONS={proposed}{'' if explicit else ' (the default)'} but this deployment "
            f"(ENGRAM_PREFIX={keys.prefix!r}) was started with {have} stream partitions: set "
            f"ENGRAM_STREAM_PARTITIONS={have}, or move it to a new deployment (docs/scaling.md, Ingest "
            "partitions)"
        )


async def deployment_keys(redis: aioredis.Redis, keys: Keys, *, explicit: bool = False) -> Keys:
    """`keys` with the deployment's recorded number of partitions (as given before any was recorded),
    for one-off commands that act on the deployment as it is. With `explicit` (ENGRAM_STREAM_PARTITIONS
    set) another recorded value raises ConfigError naming the variable."""
    have = await recorded(redis, keys)
    if explicit and have is not None and have != keys.partitions:
        raise ConfigError(
            f"ENGRAM_STREAM_PARTITIONS={keys.partitions} but this deployment (ENGRAM_PREFIX={keys.prefix!r}) "
            f"was started with {have} stream partitions: set ENGRAM_STREAM_PARTITIONS={have}, or unset it"
        )
    return keys if have is None or have == keys.partitions else Keys(keys.prefix, have)
