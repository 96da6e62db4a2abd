"""Apply a batch of decoded stream entries (`decoding`) to the projections of one generation.

Each episode's events are stored in its event hash (`HSETNX` by `event_id`) with their stream ids,
unless it is tombstoned; its document is a pure function of that set (`fold`), written only while the
hash holds exactly the events folded, the check and the write one script (`scripts`):

- **fast path** (events in hand that fold to a document): fold and embed them, then one call records
  them and writes the document; else (the episode began earlier, or another worker added an event) the
  slow path, reusing the vector when the text did not change. With a model embedder (`Embedder.cheap`
  false) an episode that has a document skips the fast path, so it is embedded only when its text changed.
- **slow path**: record, read the stored events back, fold, embed, write; fold again when another
  worker added an event in between.

Forget events apply in stream order between episode-event segments (a batch's facts rebuilt once).
Results per entry: `ok` (ack) or `dead` with a reason; transport or embedder failures raise, leaving
the batch pending."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import cast

import msgpack
import numpy as np
import redis.asyncio as aioredis

from engram_episodic.errors import EngramError
from engram_episodic.events import (
    ActionRecorded,
    EpisodeCompleted,
    EpisodeEvent,
    EpisodeForgotten,
    EpisodeStarted,
    EpisodeUpdated,
    Event,
    FactsConsolidated,
    UserForgotten,
)
from services.consolidator.decoding import BatchResult, Decoder, dead_reason
from services.consolidator.facts_store import apply_snapshot
from services.consolidator.forgetting import Forgetting
from services.consolidator.metrics import WorkerMetrics
from services.consolidator.projection import Folded, fold
from services.consolidator.scripts import PROJECT_LUA, RECORD_LUA
from shared import cluster, generations, streams, tracing
from shared.embedding_base import Embedder
from shared.index import STATUS_COMPLETED, embedding_text, episode_fields
from shared.keyring import KeyRing
from shared.settings import Settings
from shared.tags import TagCodec

log = logging.getLogger("engram.consolidator")


PROJECT_CHUNK = 32
"""Episodes per fast-path call: amortises the script's fixed cost, each call ~5 ms of Redis time."""

WRITES_IN_FLIGHT = 2
"""Fast-path pipelines of one process Redis works on at once: one idles Redis between lanes, more idle
it while every lane computes."""

EPISODE_EVENTS = (EpisodeStarted, ActionRecorded, EpisodeCompleted, EpisodeUpdated)


MAX_WRITE_ATTEMPTS = 8
_Write = tuple[str, str, Folded, dict[str, bytes], list[bytes], int, bytes]


def _payload(entry: streams.Entry) -> bytes:
    """The payload of an entry of an episode-event segment (`Decoder.events` yields none without)."""
    return cast(bytes, entry.payload)


def _split_paths(
    by_episode: dict[tuple[str, str], list[tuple[streams.Entry, EpisodeEvent]]],
) -> tuple[list[tuple[tuple[str, str], dict[str, bytes], Folded]], list[tuple[streams.Entry, EpisodeEvent]]]:
    """The episodes whose events in hand make a document (fast path: ident, payloads by event id, fold)
    and the events of the others (recorded only)."""
    fast: list[tuple[tuple[str, str], dict[str, bytes], Folded]] = []
    record_only: list[tuple[streams.Entry, EpisodeEvent]] = []
    for ident, items in by_episode.items():
        events: dict[str, EpisodeEvent] = {}
        payloads: dict[str, bytes] = {}
        for entry, ev in items:
            events.setdefault(ev.event_id, ev)
            payloads.setdefault(ev.event_id, _payload(entry))
        folded = fold(events.values())
        if folded.episode is None:
            record_only += items
        else:
            fast.append((ident, payloads, folded))
    return fast, record_only


class Projector:
    """Projects entries into generation `gen`; one per worker process. `tags` is the generation's TAG
    digest function; `reembed_facts` (a reindex) gives facts centroids of this generation's vectors."""

    def __init__(
        self,
        redis: aioredis.Redis,
        embedder: Embedder,
        gen: int,
        metrics: WorkerMetrics | None = None,
        keyring: KeyRing | None = None,
        *,
        tags: TagCodec,
        settings: Settings,
        reembed_facts: bool = False,
    ):
        self.redis = redis
        self.reembed_facts = reembed_facts
        self.tags = tags
        self.keyring = keyring
        self.keys = settings.keys
        self.embedder = embedder
        self.gen = gen
        self.metrics = metrics or WorkerMetrics()
        self._record = redis.register_script(RECORD_LUA)
        self._project = redis.register_script(PROJECT_LUA)
        self.forgetting = Forgetting(redis, embedder, gen, tags=tags, keyring=keyring, settings=settings)
        self._write_turns = asyncio.Semaphore(WRITES_IN_FLIGHT)
        self.decoder = Decoder(redis, keyring, embedder, metrics=self.metrics)

    # --- entry point ----------------------------------------------------------------------------
    async def apply(self, entries: Sequence[streams.Entry]) -> BatchResult:
        result = BatchResult()
        segment: list[tuple[streams.Entry, EpisodeEvent]] = []
        shredded: list[streams.Entry] = []
        envelopes = await self.decoder.envelopes([e.payload for e in entries])
        for entry, event, sealed in self.decoder.events(entries, envelopes, result, shredded):
            if isinstance(event, EPISODE_EVENTS):
                segment.append((entry, event))
                continue
            await self._apply_episode_events(segment, result)
            segment = []
            try:
                # on a cluster, its searches go to the namespace's primary
                with cluster.route(event.namespace):
                    await self._apply_other(entry, event)
            except (EngramError, ValueError, TypeError, KeyError) as exc:
                # content this build cannot apply (e.g. a malformed facts snapshot): dead-letter it alone
                result.dead.append((entry, dead_reason(exc, sealed)))
                self.metrics.events.labels(event.TYPE, "dead").inc()
                continue
            result.ok.append(entry.stream_id)
            self.metrics.events.labels(event.TYPE, "ok").inc()
        await self._apply_episode_events(segment, result)
        await self.forgetting.flush_facts()
        if shredded:
            await streams.delete_entries(self.redis, shredded)
        # after the writes (shared.generations): StaleGeneration makes the worker project it again
        await generations.check_writable(self.redis, self.keys, self.gen)
        return result

    # --- episode events -------------------------------------------------------------------------
    async def _apply_episode_events(
        self, segment: list[tuple[streams.Entry, EpisodeEvent]], result: BatchResult
    ) -> None:
        if not segment:
            return
        by_episode: dict[tuple[str, str], list[tuple[streams.Entry, EpisodeEvent]]] = {}
        for entry, ev in segment:
            by_episode.setdefault((ev.namespace, ev.episode_id), []).append((entry, ev))
        # a shard-local cluster: each namespace's index exists before its first document is written
        await cluster.ensure_shards(
            self.redis, [self.keys.episode_index(self.gen)], {ns for ns, _ in by_episode}
        )
        fast, record_only = _split_paths(by_episode)
        # one script call touches the keys of one namespace only (one hash slot on a Redis Cluster)
        fast.sort(key=lambda item: item[0][0])
        if fast and not self.embedder.cheap:
            fast, moved = await self._without_documents(fast)
            record_only += [item for ident in moved for item in by_episode[ident]]
        vectors, hashes = await self._embed([(f, None) for _, _, f in fast])
        items: list[_Write] = []
        for i, ((ns, eid), payloads, f) in enumerate(fast):
            sids = [entry.stream_id for entry, _ in by_episode[(ns, eid)]]
            doc = self._doc_fields(ns, f, vectors.get(i), hashes.get(i))
            items.append((ns, eid, f, payloads, sids, len(payloads), doc))
        statuses, record_replies = await self._send(items, record_only)
        tombstoned: list[streams.Entry] = []
        counted: Counter[tuple[str, str]] = Counter()  # labels().inc() per event was ~2% of a worker's CPU
        pending = await self._settle_fast(fast, statuses, by_episode, result, counted, tombstoned)
        # slow path: one whose stored events are exactly those in hand is folded without reading them
        in_hand: dict[tuple[str, str], dict[str, EpisodeEvent]] = {}
        stored: dict[tuple[str, str], tuple[int, bytes | None]] = {}
        for (entry, ev), reply in zip(record_only, record_replies, strict=True):
            if reply[0] == -1:
                tombstoned.append(entry)
                counted[(ev.TYPE, "forgotten")] += 1
            else:
                ident = (ev.namespace, ev.episode_id)
                in_hand.setdefault(ident, {})[ev.event_id] = ev
                stored[ident] = (max(int(reply[1]), stored.get(ident, (0, None))[0]), reply[2])
                counted[(ev.TYPE, "ok")] += 1
            result.ok.append(entry.stream_id)
        for (kind, outcome), n in counted.items():
            self.metrics.events.labels(kind, outcome).inc(n)
        if tombstoned:  # data of a forgotten episode must not stay in the stream
            await streams.delete_entries(self.redis, tombstoned)
        prefetched = {
            ident: (list(events.values()), stored[ident][0], stored[ident][1])
            for ident, events in in_hand.items()
            if stored[ident][0] == len(events)
        }
        known = {hashes[i]: vectors[i] for i in vectors if i in hashes}
        await self._write_until_settled(pending + list(in_hand), result, prefetched, known)

    async def _settle_fast(
        self,
        fast: list[tuple[tuple[str, str], dict[str, bytes], Folded]],
        statuses: list[int],
        by_episode: dict[tuple[str, str], list[tuple[streams.Entry, EpisodeEvent]]],
        result: BatchResult,
        counted: Counter[tuple[str, str]],
        tombstoned: list[streams.Entry],
    ) -> list[tuple[str, str]]:
        """Act on PROJECT_LUA's status per fast-path episode: -1 tombstoned, else as `_written`; returns
        the episodes to fold from their whole stored set."""
        pending: list[tuple[str, str]] = []
        for ((ns, eid), _payloads, f), status in zip(fast, statuses, strict=True):
            items = by_episode[(ns, eid)]
            outcome = "forgotten" if status == -1 else "ok"
            for entry, ev in items:
                counted[(ev.TYPE, outcome)] += 1
                result.ok.append(entry.stream_id)
            if status == -1:
                tombstoned += [entry for entry, _ in items]
            elif await self._written(ns, eid, f, status, result):
                pending.append((ns, eid))
        return pending

    async def _written(self, ns: str, eid: str, f: Folded, status: int, result: BatchResult) -> bool:
        """Act on a write script's status (see `scripts`): 0 other events were stored meanwhile (True:
        fold the whole stored set again), -2 its user, agent or session was forgotten after it began
        (erased now), 2 written (a completion is reported to `result`)."""
        if status == -2:
            await self.forgetting.erase_episode(ns, eid)
        elif status == 2 and f.status == STATUS_COMPLETED:
            result.completed.append((ns, f))
        if status > 0 and f.superseded:  # written from its current user's events only
            await self.forgetting.drop_superseded(ns, eid, f.superseded)
        return status == 0

    async def _write_until_settled(
        self,
        pending: list[tuple[str, str]],
        result: BatchResult,
        prefetched: Mapping[tuple[str, str], tuple[Sequence[Event], int, bytes | None]] | None = None,
        known: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Fold and write `pending` episodes, again for those whose stored events changed meanwhile
        (the check-and-set failed), up to MAX_WRITE_ATTEMPTS; RuntimeError past that. `prefetched`:
        (events, count, embed hash) already in hand; `known`: embed hash → vector of this batch."""
        for _attempt in range(MAX_WRITE_ATTEMPTS):
            if not pending:
                return
            pending = await self._fold_and_write(pending, result, prefetched, known)
            prefetched = {}
            if pending:
                self.metrics.write_conflicts.inc(len(pending))
        if pending:
            raise RuntimeError(
                f"{len(pending)} episode(s) kept changing during {MAX_WRITE_ATTEMPTS} write attempts"
            )

    async def _without_documents(
        self, fast: list[tuple[tuple[str, str], dict[str, bytes], Folded]]
    ) -> tuple[list[tuple[tuple[str, str], dict[str, bytes], Folded]], list[tuple[str, str]]]:
        """Split fast-path candidates into those without a document and the idents of those with one:
        with a model embedder, the slow path embeds the latter only if their text changed."""
        k, g = self.keys, self.gen
        async with self.redis.pipeline(transaction=False) as pipe:
            for (ns, eid), _payloads, _f in fast:
                pipe.exists(k.episode_doc(g, ns, eid))
            exists = await pipe.execute()
        keep = [episode for episode, found in zip(fast, exists, strict=True) if not found]
        moved = [ident for (ident, _p, _f), found in zip(fast, exists, strict=True) if found]
        return keep, moved

    async def _send(
        self, items: list[_Write], record_only: list[tuple[streams.Entry, EpisodeEvent]]
    ) -> tuple[list[int], list]:
        """One pipeline, sent in one of the WRITES_IN_FLIGHT turns: PROJECT_LUA for `items` (namespace,
        episode id, fold, payloads to record by event id, their stream ids, the event count the hash must
        hold, document), up to PROJECT_CHUNK consecutive episodes of one namespace per call, and RECORD_LUA
        for each event of `record_only`. Returns (a status per item, a reply per recorded event)."""
        k, g = self.keys, self.gen
        async with self.redis.pipeline(transaction=False) as pipe:
            calls = 0
            chunk_keys: list[str] = []
            chunk_args: list = []
            for i, (ns, eid, f, payloads, sids, count, doc) in enumerate(items):
                assert f.episode is not None, "only folds that make a document are written"
                chunk_keys += [
                    k.tombstone(ns, eid),
                    k.episode_events(g, ns, eid),
                    k.episode_stream_ids(g, ns, eid),
                    k.episode_doc(g, ns, eid),
                    *k.scope_tombstones(ns, f.episode.user_id, f.episode.agent_id, f.episode.session_id),
                ]
                chunk_args += [len(payloads), len(sids), count, repr(f.first_occurred_at)]
                for event_id, payload in payloads.items():
                    chunk_args += [event_id, payload]
                chunk_args += [*sids, doc]
                if len(chunk_keys) == 7 * PROJECT_CHUNK or i == len(items) - 1 or items[i + 1][0] != ns:
                    await self._project(keys=chunk_keys, args=chunk_args, client=pipe)
                    calls += 1
                    chunk_keys, chunk_args = [], []
            for entry, ev in record_only:
                await self._record(
                    keys=[
                        k.tombstone(ev.namespace, ev.episode_id),
                        k.episode_events(g, ev.namespace, ev.episode_id),
                        k.episode_stream_ids(g, ev.namespace, ev.episode_id),
                        k.episode_doc(g, ev.namespace, ev.episode_id),
                    ],
                    args=[ev.event_id, _payload(entry), entry.stream_id],
                    client=pipe,
                )
            async with self._write_turns:
                with tracing.span("engram.index.write", episodes=len(items), events=len(record_only)):
                    replies = await pipe.execute()
        return [status for reply in replies[:calls] for status in reply], replies[calls:]

    async def _embed(
        self, folded: Sequence[tuple[Folded, bytes | None]], known: dict[str, np.ndarray] | None = None
    ) -> tuple[dict[int, np.ndarray], dict[int, str]]:
        """({i: float32[dim]}, {i: embed hash}) of the completed episodes among `folded` ((fold, stored
        embed hash)): an agent's own vector normalised; no vector when the text's hash is the stored
        one (the document keeps its own); `known` (embed hash → vector) reused from this batch."""
        to_embed: list[tuple[int, str]] = []
        vectors: dict[int, np.ndarray] = {}
        hashes: dict[int, str] = {}
        known = known or {}
        for i, (f, old_hash) in enumerate(folded):
            if f.episode is None or f.status != STATUS_COMPLETED:
                continue
            if f.episode.vector is not None:
                v = np.asarray(f.episode.vector, dtype=np.float64)  # float32 would overflow the norm
                vectors[i] = (v / max(float(np.linalg.norm(v)), 1e-300)).astype(np.float32)
                hashes[i] = "agent:" + hashlib.blake2b(vectors[i].tobytes(), digest_size=8).hexdigest()
                continue
            text = embedding_text(f.episode)
            h = f"{self.embedder.name}:" + hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
            hashes[i] = h
            if old_hash is not None and old_hash.decode() == h:
                continue
            if h in known:
                vectors[i] = known[h]
            else:
                to_embed.append((i, text))
        if to_embed:
            before = self.embedder.truncations
            started = time.perf_counter()
            with tracing.span("engram.embed", texts=len(to_embed), embedder=self.embedder.name):
                matrix = await self.embedder.embed([t for _, t in to_embed])
            self.metrics.embed_seconds.observe(time.perf_counter() - started)
            self.metrics.truncations.inc(max(0, self.embedder.truncations - before))
            for (i, _), vec in zip(to_embed, matrix, strict=True):
                vectors[i] = vec
        return vectors, hashes

    def _doc_fields(
        self, namespace: str, f: Folded, vector: np.ndarray | None, embed_hash: str | None
    ) -> bytes:
        """The document's fields as one msgpack array [field, value, ...] the scripts unpack into HSET
        (one argument, not ~50: ~10% of the worker's CPU). No bin type: Redis's cmsgpack predates it."""
        assert f.episode is not None, "only folds that make a document are written"
        fields = episode_fields(namespace, f.episode, status=f.status, vector=vector, tags=self.tags)
        if embed_hash is not None:
            fields["embed_hash"] = embed_hash
        flat: list = []
        for key, value in fields.items():
            flat += [key, value]
        return msgpack.packb(flat, use_bin_type=False)

    async def _fold_and_write(
        self,
        episodes: list[tuple[str, str]],
        result: BatchResult,
        prefetched: Mapping[tuple[str, str], tuple[Sequence[Event], int, bytes | None]] | None = None,
        known: dict[str, np.ndarray] | None = None,
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
        loaded: dict[tuple[str, str], tuple[Sequence[Event], int, bytes | None]] = dict(prefetched)
        for i, ident in enumerate(to_read):
            events_raw, embed_hash = raw[2 * i], raw[2 * i + 1]
            loaded[ident] = (
                await self.decoder.stored(list(events_raw.values())),
                len(events_raw),
                embed_hash,
            )
        folded: list[tuple[str, str, Folded, int, bytes | None]] = []
        for ns, eid in sorted(episodes):  # by namespace: one script call touches one namespace's keys
            events, n, embed_hash = loaded[(ns, eid)]
            folded.append((ns, eid, fold(events), n, embed_hash))
        vectors, hashes = await self._embed([(f, old) for _ns, _eid, f, _n, old in folded], known)
        writes = [i for i, (_ns, _eid, f, _n, _old) in enumerate(folded) if f.episode is not None]
        items: list[_Write] = []
        for i in writes:
            ns, eid, f, n, _old = folded[i]
            items.append((ns, eid, f, {}, [], n, self._doc_fields(ns, f, vectors.get(i), hashes.get(i))))
        outcomes, _ = await self._send(items, [])
        retry: list[tuple[str, str]] = []
        for i, status in zip(writes, outcomes, strict=True):
            ns, eid, f, _n, _old = folded[i]
            if await self._written(ns, eid, f, status, result):
                retry.append((ns, eid))
        return retry

    async def refold(self, episodes: list[tuple[str, str]]) -> BatchResult:
        """Fold and write these episodes from their stored events (replay from the snapshot)."""
        result = BatchResult()
        await self._write_until_settled(episodes, result)
        await self.forgetting.flush_facts()
        await generations.check_writable(self.redis, self.keys, self.gen)  # as in `apply`
        return result

    # --- forgetting and other events -----------------------------------------------------------
    async def _apply_other(self, entry: streams.Entry, event: Event) -> None:
        if isinstance(event, EpisodeForgotten):
            # facts: rebuilt once for the batch's forgets (`Forgetting.flush_facts`)
            await self.forgetting.erase_episode(event.namespace, event.episode_id)
            return
        await self.forgetting.flush_facts()  # a later event (a snapshot, a user's forget) sees them applied
        if isinstance(event, UserForgotten):
            await self.forgetting.erase_user(event.namespace, event.user_id, event.occurred_at)
        elif isinstance(event, FactsConsolidated):
            await apply_snapshot(
                self.redis,
                self.keys,
                self.gen,
                event,
                entry.stream_id,
                self.embedder.dim,
                self.tags,
                payload=entry.payload,  # kept sealed as it came
                reembed=self.reembed_facts,
            )
