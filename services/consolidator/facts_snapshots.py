"""Semantic memory: publishing a scope's facts snapshot under the scope's lease, and rebuilding the
snapshots whose evidence was forgotten.

Facts are events: a `FactsConsolidated` holds a scope's whole state with a per-scope sequence number; it
is published first, then projected (`facts_store.apply_snapshot`), so nothing is written before the
stream has it. A lease (`SET NX PX`, `ENGRAM_LEASE_MS`) per scope lets one process write it at a time.
`Snapshots` is the part of the `Consolidator` (services.consolidator.facts, the scheduler) that a
forget needs: the projector's `Forgetting` rebuilds facts through `Snapshots.forget` without it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence

import redis.asyncio as aioredis

from engram_episodic.errors import EngramError
from engram_episodic.events import FactsConsolidated
from services.consolidator.facts_plan import build_fact
from services.consolidator.facts_store import apply_snapshot, load_rows_by_id, load_state
from shared import generations, streams
from shared.codec import encode, encode_sealed_facts
from shared.facts import STATUS_SUPERSEDED, Fact, FactScope, Row, facts_with_evidence, superseded
from shared.index import generation_tags
from shared.keyring import KeyRing, deployment_tag_key, shared_ring
from shared.settings import Settings
from shared.tags import TagCodec

log = logging.getLogger("engram.facts")

PUBLISH_TRIES = 5
"""Snapshots `publish_live` builds while forgets keep destroying contributors' keys meanwhile."""

RELEASE_LUA = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class ContributorForgotten(EngramError):
    """A user whose key sealed a fact was forgotten before the snapshot entered the stream."""


class Snapshots:
    """Publishes the facts snapshots of `settings.keys`'s deployment (sealed per contributor with
    `settings.master_key`); `dim` is the facts index's vector size, `tags` known generations' digests."""

    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        dim: int,
        *,
        tags: Mapping[int, TagCodec] | None = None,
    ):
        self.settings = settings
        self.redis = redis
        self.keys = settings.keys
        self.dim = dim
        self._release = redis.register_script(RELEASE_LUA)
        self._tags = dict(tags or {})  # generation -> its TAG digests, as `tags(gen)` reads them
        # the process's one ring of the deployment (its key cache is shared with the other users)
        self._ring: KeyRing | None = (
            shared_ring(self.keys, settings.master_key) if settings.master_key is not None else None
        )

    async def tags(self, gen: int) -> TagCodec:
        """The TAG digest function of generation `gen` (`shared.tags`), read once per generation."""
        got = self._tags.get(gen)
        if got is None:
            tag_key = await deployment_tag_key(self.redis, self.keys, self.settings.master_key)
            got = self._tags[gen] = await generation_tags(self.redis, self.keys, gen, tag_key)
        return got

    async def acquire(self, namespace: str, scope_id: str, *, wait: float = 0.0) -> str | None:
        """The scope's lease token, polling up to `wait` seconds; None while another process holds it."""
        token = uuid.uuid4().hex
        deadline = time.monotonic() + wait
        while True:
            if await self.redis.set(
                self.keys.consolidation_lock(namespace, scope_id), token, nx=True, px=self.settings.lease_ms
            ):
                return token
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.05)

    async def release(self, namespace: str, scope_id: str, token: str) -> None:
        await self._release(keys=[self.keys.consolidation_lock(namespace, scope_id)], args=[token])

    async def publish(self, event: FactsConsolidated) -> str:
        """XADD `event` into its namespace's partition (after the episodes it condenses); its stream id."""
        (sid,) = await streams.publish(self.redis, self.keys.stream_of(event.namespace), [encode(event)])
        return sid.decode() if isinstance(sid, bytes) else str(sid)

    async def publish_snapshot(self, event: FactsConsolidated) -> tuple[FactsConsolidated, str, bytes]:
        """(the event as published, its stream id, its stored bytes). With a master key each fact is sealed
        under its users' data keys (the namespace's without users), the XADD checking atomically that
        each is still the one sealed with; ContributorForgotten, writing nothing, when one is gone."""
        ring = self._ring
        if ring is None:
            return event, await self.publish(event), encode(event)
        ns = event.namespace
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
        sid = reply[1]
        return event, sid.decode() if isinstance(sid, bytes) else str(sid), payload

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
                return await self.publish_snapshot(self._event(scope, seq, facts, list(removed), now))
            except ContributorForgotten:
                facts, dropped = await self.without_gone(
                    scope, gen, facts, set(), min_cluster=min_cluster, now=now
                )
                removed = [*removed, *dropped]
        return await self.publish_snapshot(self._event(scope, seq, facts, list(removed), now))

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
        self, scope: FactScope, seq: int, facts: list[Fact], removed: Sequence[str], now: float
    ) -> FactsConsolidated:
        return FactsConsolidated(
            namespace=scope.namespace,
            occurred_at=now,
            scope={**scope.to_data(), "seq": str(seq), "min_cluster": str(self.settings.facts_min_cluster)},
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
            token = await self.acquire(namespace, scope_id, wait=self.settings.lease_ms / 1000)
            if token is None:
                raise RuntimeError(f"facts scope {scope_id[:12]} stayed locked; the forget will be retried")
            try:
                await self._forget_in_scope(gen, namespace, scope_id, set(episode_ids))
            finally:
                await self.release(namespace, scope_id, token)
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
