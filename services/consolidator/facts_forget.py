"""Semantic memory: forgetting the evidence of erased episodes.

Forgetting (`forget_evidence`, called by the projector after it erased episodes): every fact whose
evidence named a forgotten episode is rebuilt from its remaining evidence (or removed below
`min_cluster`), with the deterministic text; the scope's previous snapshot events are XDEL'd from the
stream once the new one is published, so neither the projection nor the stream keeps their ids or text.

The rebuild of a scope runs under its lease (the Consolidator's), waiting up to `ENGRAM_LEASE_MS` for a
consolidation in progress to finish.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence

import redis.asyncio as aioredis

from services.consolidator.facts import Consolidator
from services.consolidator.facts_store import apply_snapshot, load_state
from shared import generations, streams
from shared.facts import Fact, FactScope, facts_with_evidence
from shared.keys import Keys
from shared.settings import Settings
from shared.tags import TagCodec

log = logging.getLogger("engram.facts")


async def forget_evidence(
    redis: aioredis.Redis,
    keys: Keys,
    gen: int,
    namespace: str,
    episode_ids: Sequence[str],
    dim: int,
    tags: TagCodec,
    *,
    settings: Settings,
) -> int:
    """The projector's forgetting hook: see `forget_with`; `tags` are generation
    `gen`'s TAG digests. `settings` are the process's: the rebuild takes the scope's lease for
    ENGRAM_LEASE_MS (not a default of 30 s whatever the deployment's lease)."""
    if not episode_ids:
        return 0
    if settings.prefix != keys.prefix:
        raise ValueError(f"settings are for prefix {settings.prefix!r}, keys for {keys.prefix!r}")
    consolidator = Consolidator(settings, redis, dim)
    consolidator._tags[gen] = tags
    return await forget_with(consolidator, gen, namespace, episode_ids)


async def forget_with(cons: Consolidator, gen: int, namespace: str, episode_ids: Sequence[str]) -> int:
    """Rebuild or remove every fact whose evidence named a forgotten episode; returns facts touched."""
    affected = await facts_with_evidence(
        cons.redis, cons.keys.facts_index(gen), namespace, list(episode_ids), await cons.tags(gen)
    )
    by_scope: dict[str, list[Fact]] = {}
    for f in affected:
        by_scope.setdefault(f.scope_id, []).append(f)
    forgotten = set(episode_ids)
    for scope_id in sorted(by_scope):
        token = await cons._acquire(namespace, scope_id, wait=cons.settings.lease_ms / 1000)
        if token is None:
            raise RuntimeError(f"facts scope {scope_id[:12]} stayed locked; the forget will be retried")
        try:
            await _forget_in_scope(cons, gen, namespace, scope_id, forgotten)
        finally:
            await cons._release_lock(namespace, scope_id, token)
    return len(affected)


async def _forget_in_scope(
    cons: Consolidator, gen: int, namespace: str, scope_id: str, forgotten: set[str]
) -> None:
    state = await load_state(cons.redis, cons.keys, gen, namespace, scope_id)
    if not state.facts:
        return
    first = state.facts[0]
    scope = FactScope(first.namespace, first.agent_id, first.category)
    min_cluster = state.min_cluster or cons.settings.facts_min_cluster
    now = time.time()
    facts, removed = await cons.without_gone(
        scope, gen, state.facts, forgotten, min_cluster=min_cluster, now=now
    )
    # a forget of another contributor published meanwhile is left out too, not a failure
    event, sid, payload = await cons.publish_live(
        scope, gen, state.seq + 1, facts, removed, min_cluster=min_cluster, now=now
    )
    await apply_snapshot(
        cons.redis, cons.keys, gen, event, sid, cons.dim, await cons.tags(gen), payload=payload
    )
    # the older snapshots of this scope still hold the forgotten ids and text: drop them
    await streams.delete(cons.redis, cons.keys.stream_of(namespace), [s for s in state.sids if s != sid])
    await cons.redis.hset(cons.keys.fact_scope(gen, namespace, scope_id), "sids", json.dumps([sid]))
    await generations.check_writable(cons.redis, cons.keys, gen)  # the HSET may have recreated the state
    log.info(
        "facts ◆ forgot evidence in scope %s ◆ %d facts kept ◆ %d removed",
        scope_id[:12],
        len(event.facts),
        len(event.removed),
    )
