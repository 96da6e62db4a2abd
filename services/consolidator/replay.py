"""Rebuild every projection into a fresh generation and swap it in (`replay`, and `reindex` with
another embedder; the steps: docs/architecture.md, Replay). The events come from each episode's event
hash in the live generation (the snapshot) and from the stream; folding is idempotent by `event_id`.
The counts are recorded in `meta` (`shared.facts.replay_record`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import redis.asyncio as aioredis
from redis.exceptions import ResponseError
from redis.typing import EncodableT

from engram_episodic.cli_progress import Bars
from engram_episodic.errors import Conflict
from services.consolidator.facts_store import import_snapshots as import_fact_snapshots
from services.consolidator.projector import Projector
from shared import generations, streams
from shared.codec import peek_identity
from shared.embedding_base import Embedder
from shared.facts import index_docs, replay_record
from shared.index import (
    current_generation,
    embedder_mismatch,
    ensure_episode_index,
    index_exists,
    point_alias_at,
)
from shared.keyring import KeyRing, deployment_tag_key
from shared.keys import Keys
from shared.partitions import check_partitions
from shared.replies import as_bytes, bytes_list, bytes_map
from shared.settings import Settings

log = logging.getLogger("engram.replay")
PAGE = 500


@dataclass(frozen=True, slots=True)
class Tip:
    """A stream partition at one instant: its last id, entries ever added, entries held."""

    last: bytes
    added: int
    length: int


async def _tip(redis: aioredis.Redis, stream: str) -> Tip:
    """The partition's `Tip` now (`0-0` and zeros for a stream that does not exist yet)."""
    try:
        info = await redis.xinfo_stream(stream)
    except ResponseError:  # no such key: nothing published to this partition yet
        return Tip(b"0-0", 0, 0)
    return Tip(as_bytes(info["last-generated-id"]), int(info["entries-added"]), int(info["length"]))


async def _project_range(
    projector: Projector,
    redis: aioredis.Redis,
    stream: str,
    after: bytes | None,
    until: bytes,
    progress: Bars,
) -> int:
    """Project the entries with ids in (`after`, `until`] (`after` None: from the first); returns the
    count. The range is fixed, so this ends however fast entries are published meanwhile."""
    count, start = 0, b"-" if after is None else b"(" + after
    while page := await streams.read_range(redis, stream, start, until, count=PAGE):
        await projector.apply(page)
        start = b"(" + page[-1].stream_id
        count += len(page)
        progress.advance(len(page))
    return count


async def _passes_before_swap(
    projector: Projector, redis: aioredis.Redis, partitions: Sequence[str], progress: Bars
) -> tuple[dict[str, Tip], int]:
    """Project every partition up to its `Tip` fixed before the pass, again up to a new one while that
    pass would be at most half the last (and over a page), so it ends however fast the ingest; returns
    the last marks and the entries projected."""
    ends = {stream: await _tip(redis, stream) for stream in partitions}
    after: dict[str, bytes | None] = dict.fromkeys(partitions)
    size = sum(t.length for t in ends.values())
    projected = 0
    while True:
        progress.phase("stream", size)
        # a fold needs the order within a partition (a namespace's events are all in one) only
        for stream in partitions:
            projected += await _project_range(
                projector, redis, stream, after[stream], ends[stream].last, progress
            )
        after = {stream: tip.last for stream, tip in ends.items()}
        tips = {stream: await _tip(redis, stream) for stream in partitions}
        left = sum(max(0, tips[s].added - ends[s].added) for s in partitions)
        if left <= PAGE or left > size // 2:
            return ends, projected
        ends, size = tips, left


async def _import_snapshot(
    projector: Projector, redis: aioredis.Redis, keys: Keys, old: int, progress: Bars
) -> int:
    """Copy every episode event hash of generation `old` (with its stream ids) into the projector's,
    unless the episode is tombstoned, and re-fold them; returns episodes imported."""
    prefix = f"{keys.gen_prefix(old)}evs:"
    batch: list[tuple[str, str]] = []
    imported = 0
    async for key in redis.scan_iter(match=f"{prefix}*", count=500):
        events = bytes_map(await redis.hgetall(key))
        ident = next(filter(None, map(peek_identity, events.values())), None)  # read from the clear fields
        if ident is None or await redis.exists(keys.tombstone(ident[0], ident[1])):
            continue
        ns, eid = ident[0], ident[1]
        sids = bytes_list(await redis.smembers(keys.episode_stream_ids_of(old, key.decode()[len(prefix) :])))
        async with redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                keys.episode_events(projector.gen, ns, eid),
                mapping=cast("Mapping[EncodableT, EncodableT]", events),
            )
            if sids:
                pipe.sadd(keys.episode_stream_ids(projector.gen, ns, eid), *sids)
            await pipe.execute()
        batch.append((ns, eid))
        if len(batch) >= PAGE:
            imported += await _refold(projector, batch, progress)
            batch = []
    return imported + await _refold(projector, batch, progress)


async def _refold(projector: Projector, batch: list[tuple[str, str]], progress: Bars) -> int:
    if batch:
        await projector.refold(batch)
    progress.advance(len(batch))
    return len(batch)


async def replay(
    settings: Settings,
    redis: aioredis.Redis,
    embedder: Embedder,
    progress: Bars | None = None,
) -> dict[str, int]:
    """Build a new generation from the snapshot and the stream, swap it in, drop the old one. The new
    number is claimed above every one used before and recorded as building, with a heartbeat, until the
    swap (forgets erase in it too); an interrupted replay drops it. ReplayRunning (a Conflict) while
    another replay builds.

    `progress` (a bar each, none by default) hears the phases `snapshot`, `stream`, `catch-up` and
    `drop`. Returns counts:
    from_generation, generation, snapshot_episodes, entries (both passes), caught_up (the second),
    dropped_keys, facts, fact_scopes, facts_indexed (searchable) and facts_reembedded."""
    progress = progress or Bars(enabled=False)
    keys = settings.keys
    await check_partitions(
        redis, keys, sealed=settings.master_key is not None, explicit=settings.stream_partitions is not None
    )
    await generations.sweep(redis, keys)  # leftovers of an interrupted replay, of late writers
    old = await current_generation(redis, keys)
    # a task, so that an interrupt arriving while its reply is on the way still learns the number
    claim = asyncio.ensure_future(generations.claim(redis, keys))  # ReplayRunning while another builds
    heartbeat: asyncio.Task | None = None
    try:
        new = await asyncio.shield(claim)
        heartbeat = asyncio.create_task(_heartbeat(redis, keys, new))
        return await _build(settings, redis, embedder, progress, keys, old, new)
    except BaseException as exc:
        # interrupted (Ctrl-C, an error): the partial generation holds copies of the data that no
        # forget would reach once its lease ran out; give it up and delete it now
        new = await asyncio.shield(claim)  # raises what the claim raised: nothing to give up then
        await asyncio.shield(_abandon(redis, keys, new))
        if isinstance(exc, generations.StaleGeneration) and exc.gen == new:
            raise Conflict(
                f"replay abandoned: generation {new} had no heartbeat for "
                f"{generations.BUILD_LEASE_MS // 1000}s (the process was suspended?) and was swept; "
                "run it again"
            ) from None
        raise
    finally:
        if heartbeat is not None:
            heartbeat.cancel()


async def _heartbeat(redis: aioredis.Redis, keys: Keys, gen: int) -> None:
    """Renew the building lease every BEAT_SECONDS (once it runs out, the workers' sweep drops it)."""
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
    embedder: Embedder,
    progress: Bars,
    keys: Keys,
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
    # facts carry centroids of their generation's embedder: another's are computed again
    reembed = await embedder_mismatch(redis, keys, old, embedder.name, dim) is not None
    # sealed events are opened with the deployment's keys; a forgotten user's (key destroyed) yield nothing
    projector = Projector(
        redis,
        embedder,
        new,
        keyring=KeyRing.from_settings(settings),
        tags=tags,
        settings=settings,
        reembed_facts=reembed,
    )
    # the snapshot's size, near enough (None: no index yet, a first replay)
    progress.phase("snapshot", await index_docs(redis, keys.episode_index(old)) or None)
    snapshot = await _import_snapshot(projector, redis, keys, old, progress)
    await import_fact_snapshots(
        redis, keys, old, new, dim, tags, projector.decoder, reembed=projector.reembed_facts
    )
    ends, first_pass = await _passes_before_swap(projector, redis, keys.streams, progress)
    await point_alias_at(redis, keys.episode_index_alias, keys.episode_index(new))
    if await index_exists(redis, keys.facts_index(new)):  # else the first snapshot creates and points it
        await point_alias_at(redis, keys.facts_index_alias, keys.facts_index(new))
    if not await generations.finish(redis, keys, new, live=True):
        raise generations.StaleGeneration(new, old)  # abandoned (its heartbeat stalled past the lease)
    # read after the switch: every later entry reaches the new generation through the workers
    swapped = {stream: await _tip(redis, stream) for stream in keys.streams}
    progress.phase("catch-up", sum(max(0, swapped[s].added - ends[s].added) for s in keys.streams))
    catch_up = 0
    for stream in keys.streams:
        catch_up += await _project_range(
            projector, redis, stream, ends[stream].last, swapped[stream].last, progress
        )
    progress.phase("drop", None)
    dropped = await generations.drop(redis, keys, old)
    progress.advance(dropped)
    facts = await _facts_of(redis, keys, new)
    facts["facts_reembedded"] = facts["facts"] if projector.reembed_facts else 0
    await redis.hset(
        keys.meta, replay_record(new), json.dumps({**facts, "embedder": embedder.name, "dim": dim})
    )
    log.info(
        "replay ◆ generation %d → %d ◆ %d episodes from snapshot ◆ %d entries ◆ %d caught up ◆ "
        "%d facts in %d scopes %s ◆ %d old keys dropped",
        old,
        new,
        snapshot,
        first_pass,
        catch_up,
        facts["facts"],
        facts["fact_scopes"],
        f"re-embedded with {embedder.name} (dim {dim})" if projector.reembed_facts else "carried over",
        dropped,
    )
    return {
        "from_generation": old,
        "generation": new,
        "snapshot_episodes": snapshot,
        "entries": first_pass + catch_up,
        "caught_up": catch_up,
        "dropped_keys": dropped,
        **facts,
    }


async def _facts_of(redis: aioredis.Redis, keys: Keys, gen: int) -> dict[str, int]:
    """Generation `gen`'s facts: `facts` (documents its scopes name), `fact_scopes`, and `facts_indexed`
    (documents its facts index holds: fewer than `facts` means some cannot be searched)."""
    scopes = facts = 0
    async for key in redis.scan_iter(match=keys.fact_scope_pattern(gen), count=500):
        ids = await redis.hget(key, "ids")
        scopes += 1
        facts += len(json.loads(ids)) if ids else 0
    indexed = await index_docs(redis, keys.facts_index(gen)) if facts else 0
    return {"facts": facts, "fact_scopes": scopes, "facts_indexed": indexed or 0}
