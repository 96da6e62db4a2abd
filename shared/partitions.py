"""The number of stream partitions a deployment was started with, recorded once and checked at start.

The partition of a namespace is its digest modulo P (`shared.keys.partition_of`): another P sends a
namespace's new events to another stream than its older ones, and a worker would fold them out of
order (an action before its start is fine, a forget before the user's episodes is not). So P is
recorded in the deployment's meta hash (`stream_partitions`) by the first process to start — a
worker, the query service or a stream SDK publisher — and every later one must agree. A deployment
that predates partitions has its one stream key and no record: it is recorded as P = 1 when its
processes leave P unset, and a P > 1 set explicitly is refused as a change. How to change P:
docs/scaling.md, Ingest partitions.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from engram_episodic.errors import ConfigError
from shared.keys import Keys

FIELD = "stream_partitions"
"""The meta hash field holding P."""

RECORD_LUA = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then return cur end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return ARGV[2]
"""
"""Record P unless recorded (HSETNX); returns the recorded value either way (one round trip)."""


async def recorded(redis: aioredis.Redis, keys: Keys) -> int | None:
    """P as recorded in the deployment's meta, or None before any process recorded it."""
    raw = await redis.hget(keys.meta, FIELD)
    return None if raw is None else int(raw)


async def check_partitions(redis: aioredis.Redis, keys: Keys, *, explicit: bool = True) -> None:
    """Record `keys.partitions` for the deployment if nothing is recorded, else require the recorded
    value. `explicit` says whether P was set (ENGRAM_STREAM_PARTITIONS, or the SDK's `partitions=`) or is
    the topology's default. Raises ConfigError naming the variable when the deployment has another P
    (or is a single-stream deployment from before partitions and P > 1 was not set explicitly to 1)."""
    proposed = keys.partitions
    if proposed > 1 and await redis.exists(Keys(keys.prefix).stream) and await recorded(redis, keys) is None:
        # a deployment from before partitions (its single stream holds entries, nothing is recorded)
        raise ConfigError(
            f"this deployment (ENGRAM_PREFIX={keys.prefix!r}) has one stream from before partitions; "
            f"ENGRAM_STREAM_PARTITIONS={proposed}{'' if explicit else ' (the cluster default)'} would leave "
            "its entries unread: set ENGRAM_STREAM_PARTITIONS=1 (docs/scaling.md, Ingest partitions)"
        )
    raw = await redis.register_script(RECORD_LUA)(keys=[keys.meta], args=[FIELD, proposed])
    have = int(raw)
    if have != proposed:
        raise ConfigError(
            f"ENGRAM_STREAM_PARTITIONS={proposed}{'' if explicit else ' (the default)'} but this deployment "
            f"(ENGRAM_PREFIX={keys.prefix!r}) was started with {have} stream partitions: set "
            f"ENGRAM_STREAM_PARTITIONS={have}, or move it to a new deployment (docs/scaling.md, Ingest "
            "partitions)"
        )


async def deployment_keys(redis: aioredis.Redis, keys: Keys, *, explicit: bool = False) -> Keys:
    """`keys` with the deployment's recorded number of partitions (`keys` as given before any process
    recorded one): for one-off commands (dead letters, redrive, erase-now, key rotation), which act on
    the deployment as it is rather than check a configuration. With `explicit` (ENGRAM_STREAM_PARTITIONS
    was set) another recorded value raises ConfigError naming the variable: the operator said something
    about the deployment that is not so, and a redrive under it would be a guess."""
    have = await recorded(redis, keys)
    if explicit and have is not None and have != keys.partitions:
        raise ConfigError(
            f"ENGRAM_STREAM_PARTITIONS={keys.partitions} but this deployment (ENGRAM_PREFIX={keys.prefix!r}) "
            f"was started with {have} stream partitions: set ENGRAM_STREAM_PARTITIONS={have}, or unset it"
        )
    return keys if have is None or have == keys.partitions else Keys(keys.prefix, have)
