"""Rebuild every projection into a fresh generation and swap it in.

The events a rebuild re-folds come from two places: each episode's event hash of the live generation
(the snapshot: raw event payloads, kept so the stream can be trimmed — services.consolidator.retention)
and the stream itself. Both are raw events and folding is idempotent by `event_id`, so their overlap
is harmless.

1. generation n+1 gets its own index (with the embedder given, so this is also `reindex`);
2. the snapshot is copied and re-folded, then the whole stream is projected page by page (the same
   Projector the workers use);
3. `FT.ALIASUPDATE` points the alias at the new index and `meta.generation` is set, with the
   `context_episodes` the new generation was written with in the same HSET: workers switch on their next
   batch (they re-read the generation every turn, and the record when it changed:
   `shared.context_setting`);
4. a catch-up pass projects the entries added since step 2 began;
5. the old generation's index and keys are dropped.
Tombstones are generation-independent, so a replay never resurrects forgotten data.

**Layout migration.** A generation built before the keys carried a namespace hash tag
(`shared.keys`; its meta has no `g<n>:layout`) is read by pattern like any other (its event hashes and
facts scope states), and the new generation is written in the tagged layout. The legacy tombstones
stay where they are and are read beside the new ones from then on (`shared.legacy.mark`); dead letters
are linked again under the new names (`deadletters.relink`). Scope trigger counters start afresh.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from engram_episodic.errors import Conflict
from services.consolidator import deadletters
from services.consolidator.facts_store import import_snapshots as import_fact_snapshots
from services.consolidator.projector import Projector
from shared import context_setting, generations, legacy, streams
from shared.cluster import search_targets
from shared.index import (
    current_generation,
    ensure_episode_index,
    index_size,
    point_alias_at,
)
from shared.keyring import KeyRing, deployment_tag_key
from shared.keys import Keys
from shared.partitions import check_partitions
from shared.replies import bytes_list, bytes_map
from shared.settings import Settings

log = logging.getLogger("engram.replay")
PAGE = 500


class Progress(Protocol):
    """Where a long run reports how far it is (the `engram` command line draws a bar from it)."""

    def phase(self, name: str, total: int | None) -> None:
        """A new phase begins, of about `total` units (None: unknown)."""

    def advance(self, n: int) -> None:
        """`n` more units of the current phase are done."""


class NoProgress:
    def phase(self, name: str, total: int | None) -> None:
        pass

    def advance(self, n: int) -> None:
        pass


async def _project_range(
    projector: Projector, redis: aioredis.Redis, stream: str, start: bytes | str, progress: Progress
) -> tuple[bytes | None, int]:
    """Project entries after `start` ("-" = from the beginning); returns (last id, count)."""
    last: bytes | None = None
    count = 0
    cursor: bytes | str = start
    while True:
        page = await streams.read_range(redis, stream, cursor, "+", count=PAGE)
        if cursor != "-":
            page = [e for e in page if e.stream_id != cursor]
        if not page:
            return last, count
        await projector.apply(page)
        last = page[-1].stream_id
        cursor = last
        count += len(page)
        progress.advance(len(page))


async def _import_snapshot(
    projector: Projector, redis: aioredis.Redis, keys: Keys, old: int, progress: Progress
) -> int:
    """Copy and re-fold every episode event hash of generation `old`; returns episodes imported."""
    prefix = f"{keys.gen_prefix(old)}evs:"
    batch: list[tuple[str, str]] = []
    imported = 0
    async for key in redis.scan_iter(match=f"{prefix}*", count=500):
        digest = key.decode()[len(prefix) :]
        events = bytes_map(await redis.hgetall(key))
        sids = set(bytes_list(await redis.smembers(keys.episode_stream_ids_of(old, digest))))
        ident = await projector.import_snapshot(events, sids)
        if ident is not None:
            batch.append(ident)
        if len(batch) >= PAGE:
            await projector.refold(batch)
            imported += len(batch)
            progress.advance(len(batch))
            batch = []
    if batch:
        await projector.refold(batch)
        imported += len(batch)
        progress.advance(len(batch))
    return imported


async def replay(
    settings: Settings,
    redis: aioredis.Redis,
    embedder,
    progress: Progress | None = None,
    *,
    change_context_episodes: bool = False,
) -> dict[str, int]:
    """Build a new generation from the snapshot and the stream, swap it in, drop the old one.

    The new generation's number is claimed above every one used before, and it is recorded as
    building, with a heartbeat, until the swap (`shared.generations`): forgets erase in it too, and
    an interrupted replay drops it (or, killed, the workers' sweep does once its lease runs out).
    ReplayRunning (a Conflict) while another replay builds.

    Documents are written with the deployment's recorded ENGRAM_CONTEXT_EPISODES; an explicit other
    `settings.context_episodes` raises ConfigError unless `change_context_episodes`, which rebuilds
    under it and records it at the switch (`shared.context_setting.for_replay`).

    `progress` hears three phases: `snapshot` (episodes re-folded, of about as many as generation n
    holds documents), `stream` (entries projected, of the stream's length) and `catch-up`. Returns
    counts: from_generation, generation, snapshot_episodes, entries, dropped_keys, context_episodes
    (the value the new generation is written with)."""
    progress = progress or NoProgress()
    keys = settings.keys
    await check_partitions(redis, keys, explicit=settings.stream_partitions is not None)
    context = await context_setting.for_replay(
        redis, keys, settings.context_episodes, change=change_context_episodes
    )
    await generations.sweep(redis, keys)  # leftovers of an interrupted replay, of late writers
    old = await current_generation(redis, keys)
    new = await generations.claim(redis, keys)  # ReplayRunning while another one builds
    heartbeat = asyncio.create_task(_heartbeat(redis, keys, new))
    try:
        return await _build(settings, redis, embedder, progress, keys, context, old, new)
    except BaseException as exc:
        # interrupted (Ctrl-C, an error): the partial generation holds copies of the data that no
        # forget would reach once its lease ran out; give it up and delete it now
        await asyncio.shield(_abandon(redis, keys, new))
        if isinstance(exc, generations.StaleGeneration) and exc.gen == new:
            raise Conflict(
                f"replay abandoned: generation {new} had no heartbeat for "
                f"{generations.BUILD_LEASE_MS // 1000}s (the process was suspended?) and was swept; "
                "run it again"
            ) from None
        raise
    finally:
        heartbeat.cancel()


async def _heartbeat(redis: aioredis.Redis, keys: Keys, gen: int) -> None:
    """Renew the building lease every BEAT_SECONDS (a replay killed outright stops renewing it, and
    the workers' sweep removes its generation once it runs out)."""
    while await generations.beat(redis, keys, gen):
        await asyncio.sleep(generations.BEAT_SECONDS)


async def _abandon(redis: aioredis.Redis, keys: Keys, gen: int) -> None:
    """Give up generation `gen` and drop it, unless it became live (the failure came after the swap)."""
    given_up = await generations.finish(redis, keys, gen, live=False)
    if given_up or await current_generation(redis, keys) != gen:
        dropped = await generations.drop(redis, keys, gen)
        log.warning("replay ◆ interrupted ◆ generation %d given up ◆ %d keys dropped", gen, dropped)


async def _build(
    settings: Settings,
    redis: aioredis.Redis,
    embedder,
    progress: Progress,
    keys: Keys,
    context: int,
    old: int,
    new: int,
) -> dict[str, int]:
    from shared.index import VectorParams

    # a leftover of the same number, from before numbers were claimed
    await generations.drop(redis, keys, new)
    dim = await embedder.ensure_dim()
    # a new generation: its TAG fields get the current digest mode (`shared.tags`), whatever the old one had
    tags = await ensure_episode_index(
        redis,
        keys,
        new,
        VectorParams.of(settings, dim),
        embedder.name,
        tag_key=await deployment_tag_key(redis, keys, settings.master_key),
        point_alias=False,
    )
    # sealed events are opened with the deployment's keys; a forgotten user's (key destroyed) yield nothing
    projector = Projector(
        redis,
        keys,
        embedder,
        new,
        keyring=KeyRing.from_settings(settings),
        tags=tags,
        settings=settings.with_(context_episodes=context),
    )
    if await redis.hget(keys.meta, f"g{old}:layout") != legacy.LAYOUT.encode():
        tombstones = await legacy.mark(redis, keys)
        relinked = await deadletters.relink(redis, keys)
        log.info(
            "replay ◆ migrating generation %d to the hash-tagged key layout ◆ %d legacy tombstones read "
            "from now on ◆ %d dead letters relinked",
            old,
            tombstones,
            relinked,
        )
    progress.phase("snapshot", await _episode_count(redis, keys, old))
    snapshot = await _import_snapshot(projector, redis, keys, old, progress)
    await import_fact_snapshots(redis, keys, old, new, dim, tags, projector.keyring)
    # every partition in turn: the order within a partition is what a fold needs (a namespace's events
    # are all in one), an order across partitions means nothing
    progress.phase("stream", sum([int(await redis.xlen(s)) for s in keys.streams]))
    lasts: dict[str, bytes | str | None] = {}
    first_pass = catch_up = 0
    for stream in keys.streams:
        lasts[stream], n = await _project_range(projector, redis, stream, "-", progress)
        first_pass += n
    await point_alias_at(redis, keys.episode_index_alias, keys.episode_index(new))
    # one step: a worker that sees the new generation sees the value it is written with
    if not await generations.finish(redis, keys, new, live=True, also={context_setting.FIELD: context}):
        raise generations.StaleGeneration(new, old)  # abandoned (its heartbeat stalled past the lease)
    progress.phase("catch-up", None)
    for stream in keys.streams:
        _, n = await _project_range(projector, redis, stream, lasts[stream] or "-", progress)
        catch_up += n
    dropped = await _drop_generation(redis, keys, old)
    log.info(
        "replay ◆ generation %d → %d ◆ %s=%d ◆ %d episodes from snapshot ◆ %d entries ◆ %d caught up ◆ "
        "%d old keys dropped",
        old,
        new,
        context_setting.VARIABLE,
        context,
        snapshot,
        first_pass,
        catch_up,
        dropped,
    )
    return {
        "from_generation": old,
        "generation": new,
        "snapshot_episodes": snapshot,
        "entries": first_pass + catch_up,
        "dropped_keys": dropped,
        "context_episodes": context,
    }


async def _episode_count(redis: aioredis.Redis, keys: Keys, gen: int) -> int | None:
    """Documents in generation `gen`'s episode index (the snapshot's size, near enough; on a
    shard-local cluster the sum over every namespace's index), or None when empty or unknown."""
    try:
        targets = await search_targets(redis, keys.episode_index(gen))
        n = sum([await index_size(redis, name, **target) for name, target in targets])
    except ResponseError:  # no index yet (a first replay): the size is unknown, not an error
        return None
    return n or None


async def _drop_generation(redis: aioredis.Redis, keys: Keys, gen: int) -> int:
    return await generations.drop(redis, keys, gen)
