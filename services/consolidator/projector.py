"""Apply a batch of stream entries to the projections of one generation.

Phases, each one round trip (pipelined) for the whole batch:
1. record: every episode event is stored in its episode's own event hash (`HSETNX` by `event_id`,
   so duplicates are no-ops) and its stream id remembered, unless the episode is tombstoned;
2. fold: read each touched episode's events, fold them (services.consolidator.projection.fold),
   embed the completed ones whose text changed, in one embedder call;
3. write: a Lua script writes the document only if the event hash still holds exactly the events that
   were folded (`HLEN` check) and no tombstone appeared. If another worker added an event meanwhile,
   the script refuses and this episode is folded again. The document is a pure function of the event
   set, so there is no check-then-write window (shared/cases C02).
Forget events are applied in stream order between episode-event segments.

Results per entry: `ok` (ack it) or `dead` with a reason (dead-letter it). Transport or embedder
failures raise, and the caller leaves the batch pending for redelivery.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import redis.asyncio as aioredis

from services.consolidator.metrics import WorkerMetrics
from services.consolidator.projection import Folded, fold
from shared import streams
from shared.codec import decode
from shared.errors import EngramError
from shared.events import (
    ActionRecorded,
    EpisodeCompleted,
    EpisodeForgotten,
    EpisodeStarted,
    Event,
    FactsConsolidated,
    UserForgotten,
)
from shared.index import (
    STATUS_COMPLETED,
    Scope,
    embedding_text,
    episode_fields,
    filter_search,
)
from shared.keys import Keys

log = logging.getLogger("engram.consolidator")

RECORD_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1} end
redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[3])
return {1, redis.call('HLEN', KEYS[2]), redis.call('HGET', KEYS[4], 'embed_hash')}
"""

WRITE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
local forgot = redis.call('GET', KEYS[4])
if forgot and tonumber(forgot) >= tonumber(ARGV[2]) then return -2 end
if redis.call('HLEN', KEYS[2]) ~= tonumber(ARGV[1]) then return 0 end
local was = redis.call('HGET', KEYS[3], 'status')
redis.call('HSET', KEYS[3], unpack(ARGV, 3))
if was == 'completed' then return 1 end
return 2
"""

FORGET_USER_LUA = """
local cur = redis.call('GET', KEYS[1])
if (not cur) or tonumber(cur) < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""

EPISODE_EVENTS = (EpisodeStarted, ActionRecorded, EpisodeCompleted)
MAX_WRITE_ATTEMPTS = 8


@dataclass(slots=True)
class BatchResult:
    """Stream ids to ack, entries to dead-letter `(entry, reason)`, newly completed episodes."""

    ok: list[bytes] = field(default_factory=list)
    dead: list[tuple[streams.Entry, str]] = field(default_factory=list)
    completed: list[tuple[str, Folded]] = field(default_factory=list)


class Projector:
    """Projects entries into generation `gen` (see module docstring). One per worker process.

    `embedder` has `name`, `dim`, `async embed(texts) -> float32[n, dim]` and `truncations`.
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys, embedder, gen: int,
                 metrics: WorkerMetrics | None = None):
        self.redis = redis
        self.keys = keys
        self.embedder = embedder
        self.gen = gen
        self.metrics = metrics or WorkerMetrics()
        self._record = redis.register_script(RECORD_LUA)
        self._write = redis.register_script(WRITE_LUA)
        self._forget_user = redis.register_script(FORGET_USER_LUA)

    # --- entry point ----------------------------------------------------------------------------
    async def apply(self, entries: Sequence[streams.Entry]) -> BatchResult:
        result = BatchResult()
        segment: list[tuple[streams.Entry, Event]] = []
        for entry in entries:
            if entry.payload is None:  # deleted from the stream by a forget while pending
                result.ok.append(entry.stream_id)
                continue
            try:
                event = decode(entry.payload)
                self._check_vector(event)
            except EngramError as exc:
                result.dead.append((entry, f"{type(exc).__name__}: {exc}"))
                self.metrics.events.labels("unknown", "dead").inc()
                continue
            if isinstance(event, EPISODE_EVENTS):
                segment.append((entry, event))
                continue
            await self._apply_episode_events(segment, result)
            segment = []
            try:
                await self._apply_other(entry, event)
            except (EngramError, ValueError, TypeError, KeyError) as exc:
                # a well-formed envelope whose content this build cannot apply (e.g. a malformed facts
                # snapshot): dead-letter it alone rather than failing, and retrying, its whole batch
                result.dead.append((entry, f"{type(exc).__name__}: {exc}"))
                self.metrics.events.labels(event.TYPE, "dead").inc()
                continue
            result.ok.append(entry.stream_id)
            self.metrics.events.labels(event.TYPE, "ok").inc()
        await self._apply_episode_events(segment, result)
        return result

    def _check_vector(self, event: Event) -> None:
        episode = getattr(event, "episode", None)
        if episode is not None and episode.vector is not None and len(episode.vector) != self.embedder.dim:
            from shared.errors import InvalidEpisode

            raise InvalidEpisode([("episode.vector", f"has {len(episode.vector)} dimensions; the index "
                                   f"({self.embedder.name}) expects {self.embedder.dim}")])

    # --- episode events -------------------------------------------------------------------------
    async def _apply_episode_events(self, segment: list[tuple[streams.Entry, Event]], result: BatchResult) -> None:
        if not segment:
            return
        k, g = self.keys, self.gen
        async with self.redis.pipeline(transaction=False) as pipe:
            for entry, ev in segment:
                await self._record(keys=[k.tombstone(ev.namespace, ev.episode_id),
                                         k.episode_events(g, ev.namespace, ev.episode_id),
                                         k.episode_stream_ids(g, ev.namespace, ev.episode_id),
                                         k.episode_doc(g, ev.namespace, ev.episode_id)],
                                   args=[ev.event_id, entry.payload, entry.stream_id], client=pipe)
            recorded = await pipe.execute()
        # per episode: the events in hand, and what the record step saw of its stored state
        in_hand: dict[tuple[str, str], dict[str, Event]] = {}
        stored: dict[tuple[str, str], tuple[int, bytes | None]] = {}
        tombstoned: list[bytes] = []
        for (entry, ev), reply in zip(segment, recorded, strict=True):
            if reply[0] == -1:
                tombstoned.append(entry.stream_id)
                self.metrics.events.labels(ev.TYPE, "forgotten").inc()
            else:
                ident = (ev.namespace, ev.episode_id)
                in_hand.setdefault(ident, {})[ev.event_id] = ev
                hlen = int(reply[1])
                stored[ident] = (max(hlen, stored.get(ident, (0, None))[0]), reply[2])
                self.metrics.events.labels(ev.TYPE, "ok").inc()
            result.ok.append(entry.stream_id)
        if tombstoned:  # data of a forgotten episode must not stay in the stream
            await streams.delete(self.redis, k.stream, tombstoned)
        # an episode whose stored events are exactly those in hand (the common case: a new episode,
        # or one whose events arrive in one batch) is folded without reading them back
        prefetched = {ident: (list(events.values()), stored[ident][0], stored[ident][1])
                      for ident, events in in_hand.items() if stored[ident][0] == len(events)}
        pending = list(in_hand)
        for _attempt in range(MAX_WRITE_ATTEMPTS):
            if not pending:
                return
            pending = await self._fold_and_write(pending, result, prefetched)
            prefetched = {}
            if pending:
                self.metrics.write_conflicts.inc(len(pending))
        raise RuntimeError(f"{len(pending)} episode(s) kept changing during {MAX_WRITE_ATTEMPTS} write attempts")

    async def _fold_and_write(self, episodes: list[tuple[str, str]], result: BatchResult,
                              prefetched: dict[tuple[str, str], tuple[list[Event], int, bytes | None]] | None = None,
                              ) -> list[tuple[str, str]]:
        k, g = self.keys, self.gen
        prefetched = prefetched or {}
        to_read = [ident for ident in episodes if ident not in prefetched]
        raw: list = []
        if to_read:
            async with self.redis.pipeline(transaction=False) as pipe:
                for ns, eid in to_read:
                    pipe.hgetall(k.episode_events(g, ns, eid))
                    pipe.hget(k.episode_doc(g, ns, eid), "embed_hash")
                raw = await pipe.execute()
        loaded: dict[tuple[str, str], tuple[list[Event], int, bytes | None]] = dict(prefetched)
        for i, ident in enumerate(to_read):
            events_raw, embed_hash = raw[2 * i], raw[2 * i + 1]
            events = []
            for payload in events_raw.values():
                try:
                    events.append(decode(payload))
                except EngramError:  # validated when recorded; a build that cannot read it skips it
                    log.warning("skipping undecodable stored event of an episode")
            loaded[ident] = (events, len(events_raw), embed_hash)
        folded: list[tuple[str, str, Folded, int, bytes | None]] = []
        for ns, eid in episodes:
            events, n, embed_hash = loaded[(ns, eid)]
            folded.append((ns, eid, fold(events), n, embed_hash))
        # embed completed episodes whose text changed (agent-supplied vectors are used as given)
        to_embed: list[tuple[int, str]] = []
        vectors: dict[int, np.ndarray] = {}
        hashes: dict[int, str] = {}
        for i, (_ns, _eid, f, _n, old_hash) in enumerate(folded):
            if f.episode is None or f.status != STATUS_COMPLETED:
                continue
            if f.episode.vector is not None:
                vectors[i] = np.asarray(f.episode.vector, dtype=np.float32)
                vectors[i] /= max(float(np.linalg.norm(vectors[i])), 1e-12)
                hashes[i] = "agent:" + hashlib.blake2b(vectors[i].tobytes(), digest_size=8).hexdigest()
                continue
            text = embedding_text(f.episode)
            h = f"{self.embedder.name}:" + hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
            hashes[i] = h
            if old_hash is None or old_hash.decode() != h:
                to_embed.append((i, text))
        if to_embed:
            before = getattr(self.embedder, "truncations", 0)
            started = time.perf_counter()
            matrix = await self.embedder.embed([t for _, t in to_embed])
            self.metrics.embed_seconds.observe(time.perf_counter() - started)
            self.metrics.truncations.inc(max(0, getattr(self.embedder, "truncations", 0) - before))
            for (i, _), vec in zip(to_embed, matrix, strict=True):
                vectors[i] = vec
        async with self.redis.pipeline(transaction=False) as pipe:
            writes = []
            for i, (ns, eid, f, n, _old) in enumerate(folded):
                if f.episode is None:
                    continue
                fields = episode_fields(ns, f.episode, status=f.status, vector=vectors.get(i))
                if i in hashes:
                    fields["embed_hash"] = hashes[i]
                flat: list = []
                for key, value in fields.items():
                    flat += [key, value]
                await self._write(keys=[k.tombstone(ns, eid), k.episode_events(g, ns, eid),
                                        k.episode_doc(g, ns, eid),
                                        k.user_tombstone(ns, f.episode.user_id or "\x00none")],
                                  args=[n, repr(f.first_occurred_at), *flat], client=pipe)
                writes.append(i)
            outcomes = await pipe.execute()
        retry: list[tuple[str, str]] = []
        for i, status in zip(writes, outcomes, strict=True):
            ns, eid, f, _n, _old = folded[i]
            if status == 0:
                retry.append((ns, eid))
            elif status == -2:  # its user was forgotten after this episode began
                await self.erase_episode(ns, eid)
            elif status == 2 and f.status == STATUS_COMPLETED:
                result.completed.append((ns, f))
        return retry

    async def import_snapshot(self, events: dict[bytes, bytes], stream_ids: set[bytes]) -> tuple[str, str] | None:
        """Copy one episode's stored events (from another generation's event hash) into this
        generation, unless the episode is tombstoned; returns its (namespace, episode_id)."""
        for payload in events.values():
            try:
                ev = decode(payload)
            except EngramError:
                continue
            ns, eid = ev.namespace, ev.episode_id
            if await self.redis.exists(self.keys.tombstone(ns, eid)):
                return None
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(self.keys.episode_events(self.gen, ns, eid), mapping=events)
                if stream_ids:
                    pipe.sadd(self.keys.episode_stream_ids(self.gen, ns, eid), *stream_ids)
                await pipe.execute()
            return ns, eid
        return None

    async def refold(self, episodes: list[tuple[str, str]]) -> BatchResult:
        """Fold and write these episodes from their stored events (replay from the snapshot)."""
        result = BatchResult()
        pending = episodes
        for _attempt in range(MAX_WRITE_ATTEMPTS):
            if not pending:
                break
            pending = await self._fold_and_write(pending, result)
        return result

    # --- forgetting and other events -----------------------------------------------------------
    async def _apply_other(self, entry: streams.Entry, event: Event) -> None:
        if isinstance(event, EpisodeForgotten):
            await self.erase_episode(event.namespace, event.episode_id)
        elif isinstance(event, UserForgotten):
            await self.erase_user(event.namespace, event.user_id, event.occurred_at)
        elif isinstance(event, FactsConsolidated):
            from services.consolidator.facts import apply_snapshot
            await apply_snapshot(self.redis, self.keys, self.gen, event, entry.stream_id, self.embedder.dim)

    async def erase_episode(self, namespace: str, episode_id: str, *, facts: bool = True) -> None:
        """Tombstone the episode, XDEL the stream entries holding its data, delete its projection
        (and, unless `facts=False`, rebuild the facts whose evidence named it)."""
        k, g = self.keys, self.gen
        await self.redis.set(k.tombstone(namespace, episode_id), 1)
        sids = await self.redis.smembers(k.episode_stream_ids(g, namespace, episode_id))
        await streams.delete(self.redis, k.stream, sorted(sids))
        await self.redis.delete(k.episode_events(g, namespace, episode_id),
                                k.episode_stream_ids(g, namespace, episode_id),
                                k.episode_doc(g, namespace, episode_id))
        if facts:
            await self._forget_facts(namespace, [episode_id])

    async def _forget_facts(self, namespace: str, episode_ids: list[str]) -> None:
        from services.consolidator.facts import forget_evidence
        await forget_evidence(self.redis, self.keys, self.gen, namespace, episode_ids, self.embedder.dim)

    async def erase_user(self, namespace: str, user_id: str, forgotten_at: float) -> int:
        """Erase every episode (draft or completed) of `user_id` in `namespace`; returns the count."""
        await self._forget_user(keys=[self.keys.user_tombstone(namespace, user_id)], args=[repr(forgotten_at)])
        index = self.keys.episode_index(self.gen)
        erased: list[str] = []
        while True:
            _, hits = await filter_search(self.redis, index, Scope(namespace=namespace, user_id=user_id, status=None),
                                          return_fields=("episode_id",), limit=500)
            if not hits:
                await self._forget_facts(namespace, erased)
                return len(erased)
            for hit in hits:
                erased.append(hit.fields[b"episode_id"].decode())
                await self.erase_episode(namespace, erased[-1], facts=False)
