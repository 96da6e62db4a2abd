"""Semantic memory: the Consolidator schedules and runs the consolidation of a scope's episodes into
facts (see shared.facts), publishes them under the scope's lease and rebuilds the facts whose evidence
was forgotten (`forget`, for the projector's `Forgetting`).

Facts are events: a `FactsConsolidated` holds a scope's whole state with a per-scope sequence number; it
is published first, then projected (`facts_store.apply_snapshot`), so nothing is written before the
stream has it. A lease (`SET NX PX`, `ENGRAM_LEASE_MS`) per scope lets one process write it at a time.

Triggers (`Consolidator.on_batch`): every `Settings.facts_every` newly completed episodes of a scope,
or when their summed importance reaches `Settings.facts_importance_threshold` (Generative Agents
reflect at 150; Park et al. 2023, section 4.2), or on demand (`POST /v1/consolidate`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from hashlib import blake2b
from typing import TYPE_CHECKING, Any

import numpy as np
import redis.asyncio as aioredis
from redis.asyncio.lock import Lock
from redis.exceptions import LockError

from engram_episodic.errors import EngramError
from engram_episodic.events import FactsConsolidated
from services.consolidator.facts_plan import (
    build_fact,
    default_distance,
    lexical_weight,
    plan,
    shared_sentences,
    without_shared,
)
from services.consolidator.facts_store import apply_snapshot, load_rows, load_rows_by_id, load_state
from shared import cluster, generations, streams
from shared.codec import encode, encode_sealed_facts
from shared.embedding_base import Embedder
from shared.facts import (
    LEVEL_NAMESPACE,
    STATUS_CURRENT,
    STATUS_SUPERSEDED,
    SUMMARY_FALLBACK,
    SUMMARY_LLM,
    Fact,
    FactScope,
    Row,
    facts_with_evidence,
    superseded,
)
from shared.generations import StaleGeneration
from shared.index import Scope, agent_category_counts, current_generation, generation_tags
from shared.keyring import KeyRing, deployment_tag_key, shared_ring
from shared.replies import as_text, bytes_map
from shared.retry import wait_or_stop
from shared.settings import Settings
from shared.tags import TagCodec

if TYPE_CHECKING:
    from services.consolidator.decoding import BatchResult
    from services.consolidator.summarizer import Summarizer

log = logging.getLogger("engram.facts")


CLUSTER_TEXT_CACHE = 8192
"""Embeddings without the shared text a Consolidator keeps (LRU; 12 MB of MiniLM vectors)."""

PUBLISH_TRIES = 5
"""Snapshots `publish_live` builds while forgets keep destroying contributors' keys meanwhile."""


class ContributorForgotten(EngramError):
    """A user whose key sealed a fact was forgotten before the snapshot entered the stream."""


# --- the consolidator -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunResult:
    scope: FactScope
    status: str  # "published", "unchanged", "busy"
    facts: int = 0
    removed: int = 0
    summarizer_failures: int = 0
    """Facts whose summary failed in this run (they keep the deterministic text, retried next run)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": {k: v for k, v in self.scope.to_data().items() if k != "scope_id"},
            "status": self.status,
            "facts": self.facts,
            "removed": self.removed,
            "summarizer_failures": self.summarizer_failures,
        }


class Consolidator:
    """Schedules, runs and publishes consolidations: one per worker process, one per
    `POST /v1/consolidate`, one per projector for forgets. `dim` is the facts index's vector size,
    `tags` known generations' TAG digests; snapshots are sealed per contributor with
    `settings.master_key`. `embedder` (the live index's) embeds episodes without the text their scope
    shares (`clustering_rows`; without one, stored vectors are compared). Triggered runs (`on_batch`)
    are tasks, one at a time per scope (`aclose()` waits for them), deferred for at most
    `facts_min_interval` s while `backlogged()` (a burst is still arriving)."""

    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        dim: int,
        *,
        summarizer: Summarizer | None = None,
        embedder: Embedder | None = None,
        backlogged: Callable[[], bool] | None = None,
        tags: Mapping[int, TagCodec] | None = None,
    ):
        self.settings = settings
        self.redis = redis
        self.keys = settings.keys
        self.dim = dim
        self._tags = dict(tags or {})  # generation -> its TAG digests, as `tags(gen)` reads them
        # the process's one ring of the deployment (its key cache is shared with the other users)
        self._ring: KeyRing | None = (
            shared_ring(self.keys, settings.master_key) if settings.master_key is not None else None
        )
        self._backlogged = backlogged or (lambda: False)
        self._tasks: dict[str, asyncio.Task] = {}
        self._again: set[str] = set()
        self._closing = asyncio.Event()
        self.summarizer = summarizer
        self.embedder = embedder
        self._without_shared: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self.runs = 0

    async def clustering_rows(self, rows: list[Row]) -> list[Row]:
        """`rows` with `cluster_vector` set on each episode holding text nearly every episode of the scope
        shares (`facts_plan.shared_sentences`, e.g. an agent's closing boilerplate): the embedding of its
        text without it. Episodes with their own vector keep it. One embedding per episode this
        Consolidator has not embedded (`CLUSTER_TEXT_CACHE`); EmbeddingError when the embedder fails."""
        embedder = self.embedder
        if embedder is None or not rows or embedder.dim != len(rows[0].vector):
            return rows
        shared = shared_sentences([r.episode for r in rows])
        texts: dict[int, bytes] = {}
        by_key: dict[bytes, str] = {}
        for i, r in enumerate(rows):
            text = without_shared(r.episode, shared) if r.episode.vector is None else None
            if text is not None:
                key = blake2b(f"{embedder.name}\0{text}".encode(), digest_size=16).digest()
                texts[i], by_key[key] = key, text
        if not texts:
            return rows
        cache = self._without_shared
        found = {k: cache[k] for k in by_key if k in cache}
        missing = sorted(k for k in by_key if k not in found)
        if missing:
            embedded = await embedder.embed([by_key[k] for k in missing])
            for k, v in zip(missing, np.asarray(embedded, dtype=np.float64), strict=True):
                norm = float(np.linalg.norm(v))
                if np.isfinite(norm) and norm > 0:
                    found[k] = (v / norm).astype(np.float32)
        for k in found:  # the newest run's texts are the last ones evicted
            cache[k] = found[k]
            cache.move_to_end(k)
        while len(cache) > CLUSTER_TEXT_CACHE:
            cache.popitem(last=False)
        out = list(rows)
        for i, k in texts.items():
            if k in found:
                out[i] = replace(rows[i], cluster_vector=found[k].astype(np.float64))
        return out

    # --- triggers ------------------------------------------------------------------------------
    async def on_batch(self, result: BatchResult) -> None:
        """Worker hook: count newly completed episodes per scope; schedule the scopes past a threshold."""
        touched: dict[str, tuple[FactScope, int, float]] = {}
        for namespace, folded in result.completed:
            ep = folded.episode
            if ep is None:
                continue
            scopes = [FactScope(namespace)]
            if ep.agent_id and ep.task is not None:
                scopes.append(FactScope(namespace, ep.agent_id, ep.task.category))
            for s in scopes:
                _, n, imp = touched.get(s.scope_id, (s, 0, 0.0))
                touched[s.scope_id] = (s, n + 1, imp + float(ep.importance or 0.0))
        await self.count(list(touched.values()))

    async def count(self, increments: list[tuple[FactScope, int, float]]) -> None:
        """Add to the scopes' trigger counters; a background run for each scope past a threshold."""
        if not increments:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for s, n, imp in increments:
                pipe.hincrby(self.keys.scope_counter(s.namespace, s.scope_id), "completed", n)
                pipe.hincrbyfloat(self.keys.scope_counter(s.namespace, s.scope_id), "importance", imp)
            totals = await pipe.execute()
        for i, (s, _, _) in enumerate(increments):
            completed, importance = int(totals[2 * i]), float(totals[2 * i + 1])
            if self._reached(completed, importance):
                # INFO once per scheduled run; the triggers a pending run absorbs are DEBUG
                pending = s.scope_id in self._tasks and not self._tasks[s.scope_id].done()
                log.log(
                    logging.DEBUG if pending else logging.INFO,
                    "facts ◆ trigger %s ◆ %d completed ◆ importance %.1f",
                    s.scope_id[:12],
                    completed,
                    importance,
                )
                self._schedule(s)

    def _schedule(self, scope: FactScope) -> None:
        running = self._tasks.get(scope.scope_id)
        if running is not None and not running.done():
            self._again.add(scope.scope_id)  # run once more when the current run ends
            return
        self._tasks[scope.scope_id] = asyncio.create_task(self._run_in_background(scope))

    async def _run_in_background(self, scope: FactScope) -> None:
        """Run the scope's consolidation, at most once per `facts_min_interval` seconds across workers:
        under a burst of ingest, triggers coalesce into one run per interval."""
        sid = scope.scope_id
        recent = self.keys.facts_recent(scope.namespace, sid)
        while not self._closing.is_set():
            wait = await self.redis.pttl(recent) / 1000.0  # -0.002 when no run is recent
            # closing: the counter was not reset, so the scope is picked up again later
            if wait > 0 and (
                await wait_or_stop(self._closing, wait) or not await self._still_triggered(scope)
            ):
                return  # (not triggered: the run that made us wait consumed it)
            deadline = time.monotonic() + self.settings.facts_min_interval
            while self._backlogged() and time.monotonic() < deadline and not self._closing.is_set():
                await wait_or_stop(self._closing, min(0.25, self.settings.facts_min_interval))
            if self._closing.is_set():
                return
            self._again.discard(sid)
            await self.redis.set(recent, b"1", px=max(1, int(self.settings.facts_min_interval * 1000)))
            try:
                await self.consolidate(scope)
            except ContributorForgotten:  # a forget raced the run: run again, without that user
                log.info("facts ◆ a contributor of %s was forgotten during its run; running again", sid[:12])
                self._again.add(sid)
            except Exception:  # the counter was not reset: the next trigger retries this scope
                log.exception("facts ◆ consolidation of %s failed", sid[:12])
            if sid not in self._again:
                return

    async def _still_triggered(self, scope: FactScope) -> bool:
        """The scope's trigger counter is still at a threshold (another run may have consumed it)."""
        counter = bytes_map(
            await self.redis.hgetall(self.keys.scope_counter(scope.namespace, scope.scope_id))
        )
        return self._reached(int(counter.get(b"completed", b"0")), float(counter.get(b"importance", b"0")))

    def _reached(self, completed: int, importance: float) -> bool:
        """The trigger: `facts_every` completed episodes, or their summed importance at the threshold."""
        return (
            completed >= self.settings.facts_every or importance >= self.settings.facts_importance_threshold
        )

    async def wait_idle(self) -> None:
        """Wait until no background consolidation is running (tests, shutdown)."""
        while pending := [t for t in self._tasks.values() if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    async def aclose(self) -> None:
        """Let running consolidations finish within 20 seconds, then cancel the rest (the lease
        and the unchanged counter make the next run pick the scope up again)."""
        self._closing.set()
        try:
            await asyncio.wait_for(self.wait_idle(), 20.0)
        except TimeoutError:
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def scopes_of(self, namespace: str) -> list[FactScope]:
        """The namespace scope and every (agent_id, category) scope with at least min_cluster episodes."""
        index = self.keys.episode_index_alias
        tags = await self.tags(await current_generation(self.redis, self.keys))
        scopes = [FactScope(namespace)]
        for agent_id, category, n in await agent_category_counts(
            self.redis, index, Scope(namespace=namespace, tags=tags)
        ):
            if n >= self.settings.facts_min_cluster:
                scopes.append(FactScope(namespace, agent_id, category))
        return sorted(scopes, key=lambda s: (s.level != LEVEL_NAMESPACE, s.agent_id or "", s.category or ""))

    # --- one run ---------------------------------------------------------------------------------
    async def consolidate(self, scope: FactScope, *, now: float | None = None) -> RunResult:
        """Consolidate one scope under its lease; publishes a snapshot when anything changed."""
        with cluster.route(scope.namespace):  # on a cluster, its searches go to the namespace's primary
            try:
                async with self.lease(scope.namespace, scope.scope_id):
                    return await self._consolidate(scope, now=now)
            except LockError:  # another process holds the scope's lease
                return RunResult(scope, "busy")

    async def _consolidate(self, scope: FactScope, *, now: float | None = None) -> RunResult:
        counter = bytes_map(
            await self.redis.hgetall(self.keys.scope_counter(scope.namespace, scope.scope_id))
        )
        gen = await current_generation(self.redis, self.keys)
        state = await load_state(self.redis, self.keys, gen, scope.namespace, scope.scope_id)
        tags = await self.tags(gen)
        rows = await self.clustering_rows(
            await self.sealable(
                scope.namespace,
                await load_rows(
                    self.redis,
                    self.keys.episode_index_alias,
                    scope,
                    self.settings.facts_max_episodes,
                    tags,
                ),
            )
        )
        now = time.time() if now is None else now
        distance = await self.distance(gen)
        # clustering is CPU-bound: a thread keeps the event loop (and the projection) responsive
        planned = await asyncio.to_thread(
            plan,
            scope,
            rows,
            state.facts,
            min_cluster=self.settings.facts_min_cluster,
            distance=distance,
            now=now,
            lexical=lexical_weight(await self.embedder_name(gen)),
        )
        facts, removed = planned if planned is not None else (list(state.facts), [])
        # history the plan kept as it was may name a user whose forget is pending
        facts, dropped = await self.without_gone(
            scope, gen, facts, set(), min_cluster=self.settings.facts_min_cluster, now=now
        )
        removed = [*removed, *dropped]
        # new and changed facts, and those whose summary fell back on an earlier run
        facts, failures = await self._summarise(facts, state.facts, rows, now)
        if planned is None and facts == list(state.facts):
            await self._reset(scope, counter)
            return RunResult(scope, "unchanged", facts=len(state.facts), summarizer_failures=failures)
        # nothing is written before this succeeds
        event, sid, payload = await self.publish_live(
            scope,
            gen,
            state.seq + 1,
            facts,
            removed,
            min_cluster=self.settings.facts_min_cluster,
            now=now,
        )
        try:
            await apply_snapshot(self.redis, self.keys, gen, event, sid, self.dim, tags, payload=payload)
        except StaleGeneration:  # a replay swapped generations meanwhile: the workers project the
            pass  # published snapshot into the live one (the stale copy was swept)
        await self._reset(scope, counter)
        self.runs += 1
        log.info(
            "facts ◆ scope %s ◆ seq %d ◆ %d facts ◆ %d removed",
            scope.scope_id[:12],
            state.seq + 1,
            len(event.facts),
            len(event.removed),
        )
        return RunResult(
            scope,
            "published",
            facts=len(event.facts),
            removed=len(event.removed),
            summarizer_failures=failures,
        )

    async def _reset(self, scope: FactScope, counter: dict[bytes, bytes]) -> None:
        """Subtract what this run consumed (increments made meanwhile still count)."""
        key = self.keys.scope_counter(scope.namespace, scope.scope_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(key, "completed", -int(counter.get(b"completed", b"0")))
            pipe.hincrbyfloat(key, "importance", -float(counter.get(b"importance", b"0")))
            await pipe.execute()

    async def distance(self, gen: int) -> float:
        """The clustering threshold: ENGRAM_FACTS_DISTANCE, else the default calibrated for the embedder
        the live index was built with (`default_distance`)."""
        if self.settings.facts_distance is not None:
            return self.settings.facts_distance
        return default_distance(await self.embedder_name(gen))

    async def embedder_name(self, gen: int) -> str | None:
        """The name of the embedder generation `gen` of the index was built with (None if unrecorded)."""
        name = await self.redis.hget(self.keys.meta, f"g{gen}:embedder")
        return as_text(name) if name else None

    async def _summarise(
        self, facts: list[Fact], previous: list[Fact], rows: Sequence[Row], now: float
    ) -> tuple[list[Fact], int]:
        """(facts, failures): every current fact the summariser has not rewritten yet rewritten, or marked
        `summary="fallback"` on a failure (retried next run); an unchanged fact so changed is a new version."""
        if self.summarizer is None:
            return facts, 0
        before = {f.fact_id: f for f in previous}
        tasks = {r.episode_id: r.episode.task.description for r in rows if r.episode.task}
        out, failures = [], 0
        for f in facts:
            if f.status == STATUS_CURRENT and f.summary != SUMMARY_LLM:
                text = await self.summarizer.summarize(
                    f.base_text, [tasks[e] for e in f.central if e in tasks]
                )
                failures += not text
                new = replace(f, text=text or f.base_text, summary=SUMMARY_LLM if text else SUMMARY_FALLBACK)
                if new != f and before.get(f.fact_id) == f:  # a new version of an unchanged fact
                    new = replace(new, version=f.version + 1, updated_at=now)
                f = new
            out.append(f)
        if failures:
            log.warning(
                "facts ◆ summariser failed for %d fact(s); they keep the deterministic text "
                "(summary=fallback) and are retried on the next run",
                failures,
            )
        return out, failures

    async def tags(self, gen: int) -> TagCodec:
        """The TAG digest function of generation `gen` (`shared.tags`), read once per generation."""
        got = self._tags.get(gen)
        if got is None:
            tag_key = await deployment_tag_key(self.redis, self.keys, self.settings.master_key)
            got = self._tags[gen] = await generation_tags(self.redis, self.keys, gen, tag_key)
        return got

    def lease(self, namespace: str, scope_id: str, *, wait: float = 0.0) -> Lock:
        """The scope's lease for ENGRAM_LEASE_MS (redis-py's Lock): entering it polls up to `wait`
        seconds, LockError while another process holds it; leaving it after it ran out is no error."""
        return self.redis.lock(
            self.keys.consolidation_lock(namespace, scope_id),
            timeout=self.settings.lease_ms / 1000,
            sleep=0.05,
            blocking_timeout=wait,
            raise_on_release_error=False,
        )

    async def publish_snapshot(self, event: FactsConsolidated) -> tuple[FactsConsolidated, str, bytes]:
        """(the event as published, its stream id, its stored bytes). With a master key each fact is sealed
        under its users' data keys (the namespace's without users), the XADD checking atomically that
        each is still the one sealed with; ContributorForgotten, writing nothing, when one is gone."""
        ring = self._ring
        ns = event.namespace
        if ring is None:  # after the episodes it condenses, in its namespace's partition
            (sid,) = await streams.publish(self.redis, self.keys.stream_of(ns), [encode(event)])
            return event, as_text(sid), encode(event)
        users = {u for f in event.facts for u in (f.get("users") or [None])}
        live = await ring.live_keys(self.redis, ns, users)
        if any(u not in live for u in users):
            raise ContributorForgotten("a contributor of a fact was forgotten while its snapshot was built")

        def contributors(fact) -> list:
            return [(ring.ref(ns, u), live[u]) for u in (fact.get("users") or [None])]

        payload = encode_sealed_facts(event, contributors)
        used = sorted(users, key=lambda u: u or "")
        checks = [(self.keys.data_key(ring.ref(ns, u), ns), live[u].kid, b"") for u in used]
        reply = await streams.publish_sealed(self.redis, self.keys.stream_of(ns), [payload], checks)
        if int(reply[0]) != 1:
            raise ContributorForgotten("a contributor's data key was destroyed while facts were sealed")
        return event, as_text(reply[1]), payload

    async def publish_live(
        self,
        scope: FactScope,
        gen: int,
        seq: int,
        facts: list[Fact],
        removed: Sequence[str],
        *,
        min_cluster: int,
        now: float,
    ) -> tuple[FactsConsolidated, str, bytes]:
        """Publish snapshot `seq` of `facts` (`publish_snapshot`), rebuilding them without the users a
        concurrent forget left keyless (`without_gone`) and publishing again; ContributorForgotten after
        PUBLISH_TRIES such races in a row."""
        for _ in range(PUBLISH_TRIES - 1):
            try:
                return await self.publish_snapshot(
                    self._event(scope, seq, facts, list(removed), min_cluster, now)
                )
            except ContributorForgotten:
                facts, dropped = await self.without_gone(
                    scope, gen, facts, set(), min_cluster=min_cluster, now=now
                )
                removed = [*removed, *dropped]
        return await self.publish_snapshot(self._event(scope, seq, facts, list(removed), min_cluster, now))

    async def without_gone(
        self,
        scope: FactScope,
        gen: int,
        facts: Sequence[Fact],
        drop: set[str],
        *,
        min_cluster: int,
        now: float,
    ) -> tuple[list[Fact], list[str]]:
        """(facts, removed fact ids): each fact naming an episode of `drop` or a user whose data key is
        gone rebuilt from its other evidence in generation `gen` (`load_rows_by_id`, `sealable`), or
        removed below `min_cluster` episodes; the others kept byte for byte. Rebuilt, not dropped: a
        fact left out of a snapshot leaves the index, where a later forget would look for it."""
        gone: set[str] = set()
        if self._ring is not None:
            users = {u for f in facts for u in f.users}
            live = await self._ring.live_keys(self.redis, scope.namespace, users)
            gone = users - set(live)
        out: list[Fact] = []
        removed: list[str] = []
        for f in facts:
            if not (drop & set(f.evidence) or gone & set(f.users)):
                out.append(f)
                continue
            keep = [e for e in f.evidence if e not in drop]
            rows = await self.sealable(
                f.namespace, await load_rows_by_id(self.redis, self.keys, gen, f.namespace, keep)
            )
            if len(rows) < min_cluster:
                removed.append(f.fact_id)
                continue
            rebuilt = build_fact(
                scope,
                rows,
                fact_id=f.fact_id,
                now=now,
                created_at=f.created_at,
                version=f.version + 1,
                evidence_since=f.evidence_since,
                supersedes=f.supersedes,
            )
            if f.status == STATUS_SUPERSEDED:
                rebuilt = superseded(rebuilt, f.superseded_by, f.superseded_at)
            out.append(rebuilt)
        return out, removed

    async def sealable(self, namespace: str, rows: list[Row]) -> list[Row]:
        """`rows` without the episodes of users whose data key is gone (a forget published, not applied
        yet): with a master key their facts could not be sealed, and the forget erases them anyway."""
        if self._ring is None:
            return rows
        users = {r.episode.user_id for r in rows if r.episode.user_id is not None}
        live = await self._ring.live_keys(self.redis, namespace, users)
        return [r for r in rows if r.episode.user_id is None or r.episode.user_id in live]

    def _event(
        self,
        scope: FactScope,
        seq: int,
        facts: list[Fact],
        removed: Sequence[str],
        min_cluster: int,
        now: float,
    ) -> FactsConsolidated:
        return FactsConsolidated(
            namespace=scope.namespace,
            occurred_at=now,
            scope={**scope.to_data(), "seq": str(seq), "min_cluster": str(min_cluster)},
            facts=tuple(f.to_data() for f in facts),
            removed=tuple(removed),
        )

    async def forget(self, gen: int, namespace: str, episode_ids: Sequence[str]) -> int:
        """Rebuild or remove every fact of generation `gen` whose evidence names one of `episode_ids`,
        each scope under its lease (waiting up to ENGRAM_LEASE_MS; RuntimeError past it, so the forget is
        retried); returns the facts touched."""
        if not episode_ids:
            return 0
        affected = await facts_with_evidence(
            self.redis, self.keys.facts_index(gen), namespace, list(episode_ids), await self.tags(gen)
        )
        by_scope: dict[str, list[Fact]] = {}
        for f in affected:
            by_scope.setdefault(f.scope_id, []).append(f)
        for scope_id in sorted(by_scope):
            try:
                async with self.lease(namespace, scope_id, wait=self.settings.lease_ms / 1000):
                    await self._forget_in_scope(gen, namespace, scope_id, set(episode_ids))
            except LockError:
                raise RuntimeError(
                    f"facts scope {scope_id[:12]} stayed locked; the forget will be retried"
                ) from None
        return len(affected)

    async def _forget_in_scope(self, gen: int, namespace: str, scope_id: str, forgotten: set[str]) -> None:
        state = await load_state(self.redis, self.keys, gen, namespace, scope_id)
        if not state.facts:
            return
        first = state.facts[0]
        scope = FactScope(first.namespace, first.agent_id, first.category)
        min_cluster = state.min_cluster or self.settings.facts_min_cluster
        now = time.time()
        facts, removed = await self.without_gone(
            scope, gen, state.facts, forgotten, min_cluster=min_cluster, now=now
        )
        # a forget of another contributor published meanwhile is left out too, not a failure
        event, sid, payload = await self.publish_live(
            scope, gen, state.seq + 1, facts, removed, min_cluster=min_cluster, now=now
        )
        tags = await self.tags(gen)
        await apply_snapshot(self.redis, self.keys, gen, event, sid, self.dim, tags, payload=payload)
        # the older snapshots of this scope still hold the forgotten ids and text: drop them
        await streams.delete(self.redis, self.keys.stream_of(namespace), [s for s in state.sids if s != sid])
        await self.redis.hset(self.keys.fact_scope(gen, namespace, scope_id), "sids", json.dumps([sid]))
        await generations.check_writable(self.redis, self.keys, gen)  # the HSET may have recreated the state
        log.info(
            "facts ◆ forgot evidence in scope %s ◆ %d facts kept ◆ %d removed",
            scope_id[:12],
            len(event.facts),
            len(event.removed),
        )
