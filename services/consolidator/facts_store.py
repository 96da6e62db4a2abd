"""Semantic memory in Redis: the rows facts are built from, and the projection of the facts.

Reads: `load_rows` (a scope's newest completed episodes with their vectors), `load_rows_by_id` (the
episodes a fact names), `load_state` (a scope's applied facts). Writes: `apply_snapshot` projects a
`FactsConsolidated` (one MULTI per scope under WATCH; an older snapshot is ignored), when a run
publishes it and again when the worker consumes it; `import_snapshots` carries every scope's last
snapshot into a replay's generation.
"""

from __future__ import annotations

import heapq
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import redis.asyncio as aioredis

from engram_episodic.errors import EngramError, InvalidEpisode
from engram_episodic.events import FactsConsolidated
from engram_episodic.shapes import episode_from_stored
from services.consolidator.decoding import Decoder
from shared import cluster, generations
from shared.codec import encode
from shared.facts import (
    CENTROID_FIELD,
    DOC_FIELD,
    Fact,
    FactScope,
    Row,
    by_completion,
    centroid_of,
    ensure_facts_index,
    fact_fields,
    fact_from_doc,
)
from shared.index import STATUS_COMPLETED, Scope, current_generation
from shared.index_pages import cursor_pages
from shared.keys import Keys
from shared.replies import as_bytes
from shared.tags import TagCodec

log = logging.getLogger("engram.facts")

PAGE = 500
"""Episodes per search-module read and per pipeline of `load_rows`."""


def _row(doc: bytes | None, vector: bytes | None) -> Row | None:
    """The episode and its unit vector; None when unreadable."""
    if not doc or not vector:
        return None
    try:
        episode = episode_from_stored(json.loads(doc))
    except (TypeError, ValueError, KeyError, AttributeError, EngramError):
        return None
    v = np.frombuffer(vector, dtype=np.float32).astype(np.float64)
    norm = float(np.linalg.norm(v))
    if not np.isfinite(norm) or norm == 0:
        return None
    return Row(episode=episode, vector=v / norm)


async def load_rows(
    r: aioredis.Redis, index: str, scope: FactScope, limit: int, tags: TagCodec, *, page: int | None = None
) -> list[Row]:
    """The scope's newest `limit` completed episodes with their vectors: keys and completion times
    through an unsorted FT.AGGREGATE cursor, `page` (PAGE) per read (a sorted search of 300,000
    episodes ran past the search TIMEOUT), the newest kept (ties: the greater key), then the documents,
    `page` per pipeline; deleted, changed or unreadable ones skipped. ResponseError for a missing index."""
    filters = Scope(
        namespace=scope.namespace,
        tags=tags,
        agent_id=scope.agent_id,
        category=(scope.category,) if scope.agent_id is not None and scope.category else (),
        status=STATUS_COMPLETED,
        live_at=time.time(),  # facts are not built from expired episodes
    )
    page = page or PAGE
    newest: list[tuple[float, bytes]] = []  # a min-heap of (completed_at, key)
    async for rows in cursor_pages(r, index, filters.query(), ["@__key", "@completed_at"], batch=page):
        for f in rows:
            key, at = f.get("__key"), f.get("completed_at")
            if key is None or at is None:
                continue  # deleted between the match and the load
            if len(newest) < limit:
                heapq.heappush(newest, (float(at), key))
            elif (float(at), key) > newest[0]:
                heapq.heapreplace(newest, (float(at), key))
    return await _completed_rows(r, [key for _, key in sorted(newest, reverse=True)], page)


async def load_rows_by_id(
    r: aioredis.Redis, keys: Keys, gen: int, namespace: str, ids: Sequence[str]
) -> list[Row]:
    """Completed episodes by id (missing, forgotten or draft ones are skipped)."""
    return await _completed_rows(r, [keys.episode_doc(gen, namespace, eid) for eid in ids], PAGE)


async def _completed_rows(r: aioredis.Redis, doc_keys: Sequence[bytes | str], page: int) -> list[Row]:
    """The rows of the completed episodes among the documents `doc_keys`, `page` per pipeline, by
    completion; deleted, draft or unreadable ones skipped."""
    rows: list[Row] = []
    for i in range(0, len(doc_keys), page):
        async with r.pipeline(transaction=False) as pipe:
            for key in doc_keys[i : i + page]:
                pipe.hmget(key, ["doc", "vector", "status"])
            for doc, vector, status in await pipe.execute():
                row = _row(doc, vector) if status == STATUS_COMPLETED.encode() else None
                if row is not None:
                    rows.append(row)
    return by_completion(rows)


async def reembedded(r: aioredis.Redis, keys: Keys, gen: int, facts: Sequence[Fact]) -> list[Fact]:
    """`facts` with each centroid computed from its evidence's vectors in generation `gen`, as a run
    computes it (`centroid_of`); a fact none of whose evidence is there (expired, forgotten)
    gets no centroid: listed and filtered, never found by similarity. Text, ids and versions stay."""
    out = []
    for f in facts:
        rows = await load_rows_by_id(r, keys, gen, f.namespace, f.evidence)
        vector = centroid_of(np.stack([row.vector for row in rows])) if rows else ()
        out.append(replace(f, centroid=tuple(float(x) for x in vector)))
    return out


# --- the projection ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ScopeState:
    seq: int
    facts: list[Fact]
    sids: list[str]
    min_cluster: int | None


async def load_state(r: aioredis.Redis, keys: Keys, gen: int, namespace: str, scope_id: str) -> ScopeState:
    seq, ids, sids, min_cluster = await r.hmget(
        keys.fact_scope(gen, namespace, scope_id), ["seq", "ids", "sids", "min_cluster"]
    )
    fact_ids = json.loads(ids) if ids else []
    facts = []
    if fact_ids:
        async with r.pipeline(transaction=False) as pipe:
            for fid in fact_ids:
                pipe.hmget(keys.fact_doc(gen, namespace, fid), [DOC_FIELD, CENTROID_FIELD])
            for doc, centroid in await pipe.execute():
                if doc is not None:
                    facts.append(fact_from_doc(doc, centroid))
    return ScopeState(
        seq=int(seq or 0),
        facts=facts,
        sids=json.loads(sids) if sids else [],
        min_cluster=int(min_cluster) if min_cluster else None,
    )


def snapshot_facts(event: FactsConsolidated) -> tuple[FactScope, int, list[Fact]]:
    """Validate a FactsConsolidated event: its scope, sequence number and facts (InvalidEpisode if bad)."""
    scope = FactScope.from_data(event.scope)
    try:
        seq = int(event.scope.get("seq", "0"))
    except ValueError:
        raise InvalidEpisode([("scope.seq", "must be an integer")]) from None
    facts = [Fact.from_data(f) for f in event.facts]
    if (
        scope.namespace != event.namespace
        or scope.scope_id != event.scope.get("scope_id", scope.scope_id)
        or any(f.namespace != event.namespace or f.scope_id != scope.scope_id for f in facts)
    ):
        raise InvalidEpisode([("facts", "facts must belong to the event's namespace and scope")])
    return scope, seq, facts


async def apply_snapshot(
    r: aioredis.Redis,
    keys: Keys,
    gen: int,
    event: FactsConsolidated,
    stream_id: bytes | str | None,
    dim: int,
    tags: TagCodec,
    *,
    payload: bytes | None = None,
    reembed: bool = False,
) -> bool:
    """Project a scope snapshot into generation `gen` (TAG digests `tags`, vectors of `dim`) atomically;
    False when an equal or newer one is in. `payload` (the stored bytes, sealed or not; None:
    `encode(event)`) is kept with the scope for a replay. With `reembed`, and for a centroid not of
    `dim`, centroids are computed again from the evidence in `gen` (`reembedded`). StaleGeneration when
    `gen` is neither live nor building once written."""
    scope, seq, facts = snapshot_facts(event)
    await ensure_facts_index(r, keys, gen, dim, point_alias=await current_generation(r, keys) == gen)
    await cluster.ensure_shards(r, [keys.facts_index(gen)], [scope.namespace])
    state_key = keys.fact_scope(gen, scope.namespace, scope.scope_id)
    if reembed or any(f.centroid and len(f.centroid) != dim for f in facts):
        if int(await r.hget(state_key, "seq") or 0) >= seq:  # not applied: spare the reads
            return False
        facts = await reembedded(r, keys, gen, facts)
    sid = stream_id.decode() if isinstance(stream_id, bytes) else stream_id

    async def write(pipe) -> bool:  # redis-py runs it again when the WATCH fails
        cur_seq, cur_ids, cur_sids = await pipe.hmget(state_key, ["seq", "ids", "sids"])
        if int(cur_seq or 0) >= seq:
            return False
        old_ids = set(json.loads(cur_ids) if cur_ids else [])
        sids = (json.loads(cur_sids) if cur_sids else []) + ([sid] if sid else [])
        new_ids = [f.fact_id for f in facts]
        pipe.multi()
        for fid in sorted(old_ids - set(new_ids)):
            pipe.delete(keys.fact_doc(gen, scope.namespace, fid))
        for f in facts:
            pipe.delete(keys.fact_doc(gen, scope.namespace, f.fact_id))
            pipe.hset(keys.fact_doc(gen, scope.namespace, f.fact_id), mapping=fact_fields(f, tags))
        pipe.hset(
            state_key,
            mapping={
                "seq": seq,
                "ids": json.dumps(new_ids),
                "sids": json.dumps(sids),
                "namespace": scope.namespace,
                "event": payload if payload is not None else encode(event),
                "min_cluster": event.scope.get("min_cluster", ""),
            },
        )
        return True

    if not await r.transaction(write, state_key, value_from_callable=True):
        return False
    # written into a generation a replay dropped meanwhile: swept here (StaleGeneration)
    await generations.check_writable(r, keys, gen)
    return True


async def import_snapshots(
    redis: aioredis.Redis,
    keys: Keys,
    old: int,
    new: int,
    dim: int,
    tags: TagCodec,
    decoder: Decoder,
    *,
    reembed: bool = False,
) -> int:
    """Replay: project every scope's last applied snapshot of generation `old` (kept with its state, as
    the stream may be trimmed) into `new` (`reembed` as in `apply_snapshot`); sealed ones opened by
    `decoder`, a forgotten user's skipped. Returns the scopes imported."""
    imported = 0
    async for key in redis.scan_iter(match=keys.fact_scope_pattern(old), count=500):
        payload, sids = await redis.hmget(key, ["event", "sids"])
        if payload is None:
            continue
        try:
            raw = as_bytes(payload)
            event = decoder.decode(raw, (await decoder.envelopes([raw]))[0])
        except EngramError:
            log.warning("facts ◆ skipped an unreadable (or shredded) stored snapshot of generation %d", old)
            continue
        if isinstance(event, FactsConsolidated) and await apply_snapshot(
            redis, keys, new, event, None, dim, tags, payload=raw, reembed=reembed
        ):
            await redis.hset(
                keys.fact_scope(new, event.namespace, event.scope.get("scope_id", "")), "sids", sids or b"[]"
            )
            imported += 1
    await generations.check_writable(redis, keys, new)
    return imported
