"""`ENGRAM_CONTEXT_EPISODES` as the deployment's projection is written: recorded once, then followed.

The setting decides what every episode document holds (services/consolidator/context.py), but each
process reads its own environment: a replay run in a shell without the workers' value would strip every
context while the workers kept writing them. So the value is recorded in the deployment's meta hash
(`context_episodes`, "0" or "1") by the first writer to start (a worker, or `replay` / `reindex`), and

- a process that leaves the variable unset follows the record (0 when nothing is recorded yet; a
  writer then records 0);
- an explicit value equal to the record is fine; another one is refused at the start of a worker or
  of the query service (ConfigError, exit 2, naming both values), and refused by `replay` / `reindex`
  unless `--change-context-episodes` is given: then the replay rebuilds every document under the new
  value and records it in the same HSET that switches the generation (`CHANGE_FLAG`);
- running workers re-read the record when they follow a generation switch (they rebuild their
  projector there: `Worker._projector`), so after a changing replay they write the new value and say
  so in one log line; the query service re-reads it at most every `LiveContext.ttl` seconds.

A deployment from before the record (documents, no field) is recorded by the first writer to start,
from that process's value (explicit, or 0 when unset): restart its workers with their value before
running a replay, or the replay records 0 and rebuilds without contexts. The query service never
records (it writes no document): a stack whose query service starts first, without the workers'
value, must not fix the deployment at 0.
"""

from __future__ import annotations

import logging
import time

import redis.asyncio as aioredis

from engram_episodic.errors import ConfigError
from shared.keys import Keys
from shared.partitions import RECORD_LUA

FIELD = "context_episodes"
"""The meta hash field holding the value the projection is written with."""
VARIABLE = "ENGRAM_CONTEXT_EPISODES"
CHANGE_FLAG = "--change-context-episodes"
"""The `replay` / `reindex` option that rebuilds the projection under an explicit other value."""

log = logging.getLogger("engram.context")


async def recorded(redis: aioredis.Redis, keys: Keys) -> int | None:
    """The recorded value (0 or 1), or None before any writer recorded one."""
    raw = await redis.hget(keys.meta, FIELD)
    return None if raw is None else int(raw)


async def _record(redis: aioredis.Redis, keys: Keys, value: int) -> int:
    """Record `value` unless a value is recorded (atomic); returns the recorded value either way."""
    return int(await redis.register_script(RECORD_LUA)(keys=[keys.meta], args=[FIELD, value]))


def _differs(explicit: int, have: int, keys: Keys, what: str) -> str:
    return (
        f"{VARIABLE}={explicit} but this deployment (ENGRAM_PREFIX={keys.prefix!r}) is written with "
        f"{VARIABLE}={have}: unset it (or set {have}) to {what}, or rebuild every episode under {explicit} "
        f"with `engram-admin replay {CHANGE_FLAG}` and {VARIABLE}={explicit}"
    )


async def settle(redis: aioredis.Redis, keys: Keys, explicit: int | None, *, writer: bool) -> int:
    """The value a worker (`writer`) or the query service starts with: the record, or with nothing
    recorded `explicit` (None = unset: 0), which a writer records (atomically: of two workers starting
    at once, the second is checked against the first). Raises ConfigError when `explicit` differs from
    the record."""
    have = await (
        _record(redis, keys, 0 if explicit is None else explicit) if writer else recorded(redis, keys)
    )
    if have is None:
        return 0 if explicit is None else explicit
    if explicit is not None and explicit != have:
        raise ConfigError(_differs(explicit, have, keys, "follow it"))
    return have


async def for_replay(redis: aioredis.Redis, keys: Keys, explicit: int | None, *, change: bool) -> int:
    """The value a replay rebuilds the projection with, which it records when it switches the
    generation: the record (recording `explicit` or 0 first when there is none), or with `change` an
    explicit other value. Raises ConfigError on an explicit other value without `change`, and on
    `change` without an explicit value (which value was meant?)."""
    if change and explicit is None:  # refused before anything is recorded
        have_now = await recorded(redis, keys)
        raise ConfigError(
            f"{CHANGE_FLAG} needs {VARIABLE} set to the new value (0 or 1); this deployment "
            f"(ENGRAM_PREFIX={keys.prefix!r}) is written with "
            + ("nothing recorded yet" if have_now is None else f"{VARIABLE}={have_now}")
        )
    have = await _record(redis, keys, 0 if explicit is None else explicit)
    if explicit is None or explicit == have:
        return have
    if change:
        return explicit
    raise ConfigError(
        f"{VARIABLE}={explicit} but this deployment (ENGRAM_PREFIX={keys.prefix!r}) is written with "
        f"{VARIABLE}={have}: unset it to replay as it is, or add {CHANGE_FLAG} to rebuild every episode "
        f"under {explicit} (then restart the workers and the query service with {VARIABLE}={explicit} or "
        "unset)"
    )


class LiveContext:
    """The recorded value for a long-running reader (the query service shows recall hits' `context`
    with 1): re-read at most every `ttl` seconds (one HGET), so a changing replay is followed within
    `ttl` of its switch, and a record written after the start (the first worker came later) too.
    `value` is what `settle` returned at start; `explicit` the process's own setting (None = unset)."""

    def __init__(self, keys: Keys, value: int, explicit: int | None, *, ttl: float = 1.0):
        self.keys, self.value, self.explicit, self.ttl = keys, value, explicit, ttl
        self._read = time.monotonic()

    async def get(self, redis: aioredis.Redis) -> int:
        """0 or 1: the value the projection is written with, as last read."""
        now = time.monotonic()
        if now - self._read < self.ttl:
            return self.value
        self._read = now
        have = await recorded(redis, self.keys)
        if have is not None and have != self.value:
            log.warning(
                "query service ◆ this deployment is now written with %s=%d (was %d); following it%s",
                VARIABLE,
                have,
                self.value,
                ""
                if self.explicit in (None, have)
                else f": set {VARIABLE}={have} or unset it before the next start, which would be refused",
            )
            self.value = have
        return self.value
