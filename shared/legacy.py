"""Tombstones of the key layout before hash tags, read beside the current ones.

A deployment that predates the cluster-ready layout (`shared.keys`) moves to it by a replay: the new
generation's keys are built from the old generation's event hashes and the stream. Its tombstones
cannot be renamed — a legacy name is a digest of (namespace, id), which does not give the namespace
back for the tag — so they are *read in both layouts* instead. They are immutable once the layout
changed (forgetting writes only the new names), so reading them beside an atomic script, rather than
inside it, leaves no race: a legacy tombstone that exists now existed before any event this process
holds was published.

The migrating replay sets the meta field `legacy_tombstones` when it finds any (`mark`); only then does
the consolidator's hot path pay the extra round trip (`forgotten`). A cluster deployment, which starts
in the new layout, never has one.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis.asyncio as aioredis

from engram_episodic.errors import Conflict
from shared.keys import Keys, LegacyKeys

FLAG = "legacy_tombstones"


async def enabled(redis: aioredis.Redis, keys: Keys) -> bool:
    """Whether the deployment's meta says legacy tombstones exist."""
    return bool(await redis.hexists(keys.meta, FLAG))


async def mark(redis: aioredis.Redis, keys: Keys) -> int:
    """Count the legacy episode and user tombstones (SCAN) and set the meta flag if there are any;
    returns the count. Run by the replay that migrates the layout."""
    legacy = LegacyKeys(keys.prefix)
    found = 0
    for pattern in (legacy.tombstone_pattern(), legacy.user_tombstone_pattern()):
        async for _key in redis.scan_iter(match=pattern, count=1000):
            found += 1
    if found:
        await redis.hset(keys.meta, FLAG, found)
    return found


async def forgotten(
    redis: aioredis.Redis,
    keys: Keys,
    episodes: Iterable[tuple[str, str, str | None, float]],
) -> set[tuple[str, str]]:
    """The (namespace, episode_id) among `episodes` — (namespace, episode_id, user_id or None, first
    occurred_at, UTC epoch seconds) — that a legacy tombstone forgets: the episode's own, or its user's
    forgotten at or after the episode began (the rule of the projection's scripts). One pipeline."""
    legacy = LegacyKeys(keys.prefix)
    items = list(episodes)
    if not items:
        return set()
    async with redis.pipeline(transaction=False) as pipe:
        for ns, eid, user, _at in items:
            pipe.exists(legacy.tombstone(ns, eid))
            pipe.get(legacy.user_tombstone(ns, user if user is not None else "\x00none"))
        replies = await pipe.execute()
    out = set()
    for i, (ns, eid, _user, at) in enumerate(items):
        tomb, user_at = replies[2 * i], replies[2 * i + 1]
        if tomb or (user_at is not None and float(user_at) >= at):
            out.add((ns, eid))
    return out


def tombstones(keys: Keys, namespace: str, episode_id: str) -> tuple[str, str]:
    """An episode's tombstone in both layouts, for an `EXISTS` that answers "forgotten?" off the hot
    path (the query service, dead letters, a replay's snapshot import)."""
    return keys.tombstone(namespace, episode_id), LegacyKeys(keys.prefix).tombstone(namespace, episode_id)


async def user_forgot_at(redis: aioredis.Redis, keys: Keys, namespace: str, user_id: str) -> float | None:
    """The latest forget time of a user in either layout (UTC epoch seconds), or None."""
    times = [
        await redis.get(keys.user_tombstone(namespace, user_id)),
        await redis.get(LegacyKeys(keys.prefix).user_tombstone(namespace, user_id)),
    ]
    known = [float(t) for t in times if t is not None]
    return max(known) if known else None


LAYOUT = "tagged"
"""The meta field `g<n>:layout` of a generation built with hash-tagged keys; a generation without it
(whose index existed before the field did) has the legacy layout."""


class LegacyLayout(Conflict):
    """The live generation's keys have the layout before hash tags: this build would not find them.
    `python -m services.consolidator replay` migrates it (a configuration error at start: exit 2)."""

    def __init__(self, gen: int):
        self.gen = gen
        super().__init__(
            f"index generation {gen} has the key layout before hash tags (built by an older Engram); "
            "migrate it with `python -m services.consolidator replay` before starting the stack "
            "(docs/scaling.md, Migrating to the cluster-ready layout)"
        )


async def check_layout(redis: aioredis.Redis, keys: Keys, gen: int, *, created: bool) -> None:
    """Record generation `gen`'s layout (`created`: this process is about to create its index, so it
    is built with tags; else it existed, and without the field it predates them). Raises LegacyLayout
    for a generation of the legacy layout."""
    await redis.hsetnx(keys.meta, f"g{gen}:layout", LAYOUT if created else "legacy")
    if await redis.hget(keys.meta, f"g{gen}:layout") != LAYOUT.encode():
        raise LegacyLayout(gen)
