"""Forgetting: erase an episode, or a user's episodes, from the projections of one generation and of
the generation a replay is building beside it (`shared.generations`).

The projector applies `EpisodeForgotten` and `UserForgotten` in stream order, and erases an episode
written after its user's forget time (the write scripts report it). Erasing an episode tombstones it,
XDELs its stream entries and dead letters, deletes its projection and rebuilds the facts whose
evidence named it (`facts.Consolidator.forget`). Erasing a user destroys their data key first
(with a master key). What stays in Redis's files is `erasure`'s, which this marks pending.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import orjson
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from engram_episodic.errors import DecodeError
from services.consolidator import deadletters, erasure
from services.consolidator.facts import Consolidator
from services.consolidator.scripts import FORGET_USER_LUA
from shared import cluster, generations, streams
from shared.codec import occurred_at, unpack
from shared.embedding_base import Embedder
from shared.facts import facts_with_evidence
from shared.index import DOC_FIELD, Scope, is_missing_index
from shared.index_pages import every_key
from shared.keyring import KeyRing
from shared.replies import as_bytes, bytes_list
from shared.settings import Settings
from shared.tags import TagCodec


def _doc_episode_id(raw: bytes | None) -> str | None:
    """The episode id of a stored document (the projector wrote it; a broken one is skipped)."""
    try:
        eid = orjson.loads(raw).get("episode_id") if raw else None
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return eid if isinstance(eid, str) else None


async def documents_ids(r: aioredis.Redis, doc_keys: Sequence[bytes]) -> dict[str, list[str]]:
    """{namespace: [episode_id, ...]} of the documents `doc_keys` (their TAGs hold digests: the ids come
    from the documents), 1000 per pipeline; erased or unreadable ones skipped."""
    out: dict[str, list[str]] = defaultdict(list)
    for start in range(0, len(doc_keys), 1000):
        async with r.pipeline(transaction=False) as pipe:
            for key in doc_keys[start : start + 1000]:
                pipe.hmget(key, ["namespace", DOC_FIELD])
            for ns, doc in await pipe.execute():
                if ns is not None and (eid := _doc_episode_id(doc)) is not None:
                    out[ns.decode()].append(eid)
    return dict(out)


def _event_id(payload: bytes | None) -> str | None:
    """The clear event id of a stream entry's payload, sealed or not (None if unreadable)."""
    try:
        data = unpack(payload).get("data") if payload else None
    except DecodeError:
        return None
    event_id = data.get("event_id") if isinstance(data, dict) else None
    return event_id if isinstance(event_id, str) else None


class Forgetting:
    """Erases episodes and users from generation `gen` (one per Projector). `embedder.dim` is the facts
    index's vector size; `tags` the generation's TAG digests; `settings` the process's (the facts
    rebuild takes the scope's lease for `lease_ms` and falls back on `facts_min_cluster`)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        embedder: Embedder,
        gen: int,
        *,
        tags: TagCodec,
        keyring: KeyRing | None,
        settings: Settings,
    ):
        self.redis = redis
        self.keys = settings.keys
        self.gen = gen
        self.tags = tags
        self.keyring = keyring
        self._forget_user = redis.register_script(FORGET_USER_LUA)
        self.snapshots = Consolidator(settings, redis, embedder.dim, tags={gen: tags})
        self._facts_due: dict[str, list[str]] = {}  # namespace -> erased episodes, facts not yet rebuilt

    async def erase_episode(self, namespace: str, episode_id: str) -> None:
        """Tombstone the episode, XDEL the stream entries holding its data, delete its projection; the
        facts whose evidence named it are rebuilt at the next `flush_facts` (a batch's forgets rebuild
        each scope once)."""
        k, g = self.keys, self.gen
        await self.redis.set(k.tombstone(namespace, episode_id), 1)
        await erasure.mark_pending(self.redis, k)  # the AOF still holds its document until rewritten
        sids = bytes_list(await self.redis.smembers(k.episode_stream_ids(g, namespace, episode_id)))
        await streams.delete(self.redis, k.stream_of(namespace), sorted(sids))
        # its dead-lettered events: the stream entry and the dead letter both hold its data
        await deadletters.delete_dead_letters(self.redis, self.keys, namespace, episode_id)
        building = await self._building()
        # and a replay's copy: its catch-up would erase it, unless it never comes
        for gen in (g,) if building is None else (g, building):
            await self.redis.delete(
                k.episode_events(gen, namespace, episode_id),
                k.episode_stream_ids(gen, namespace, episode_id),
                k.episode_doc(gen, namespace, episode_id),
            )
        self._facts_due.setdefault(namespace, []).append(episode_id)

    async def drop_superseded(self, namespace: str, episode_id: str, event_ids: frozenset[str]) -> None:
        """Delete the events of an episode's earlier users (`Folded.superseded`) from its event hash and
        the stream entries holding them (by their clear event id): a forget of an earlier user no longer
        reaches the episode, so none of that user's text may stay in it. Its facts are rebuilt at the
        next `flush_facts`. Idempotent; stream entries first, so a failure leaves the rest for later."""
        if not event_ids:
            return
        k, g = self.keys, self.gen
        events, sids_key = (
            k.episode_events(g, namespace, episode_id),
            k.episode_stream_ids(g, namespace, episode_id),
        )
        await erasure.mark_pending(self.redis, k)  # the AOF still holds them until rewritten
        stream = k.stream_of(namespace)
        sids = sorted(bytes_list(await self.redis.smembers(sids_key)))
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in sids:
                pipe.xrange(stream, min=sid, max=sid, count=1)
            found = await pipe.execute()
        gone = [
            sid
            for sid, entries in zip(sids, found, strict=True)
            if entries and _event_id(entries[0][1].get(streams.FIELD)) in event_ids
        ]
        await streams.delete(self.redis, stream, gone)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(events, *sorted(event_ids))
            if gone:
                pipe.srem(sids_key, *gone)
            await pipe.execute()
        self._facts_due.setdefault(namespace, []).append(episode_id)

    async def flush_facts(self) -> None:
        """Rebuild (or drop), once per namespace, the facts naming episodes erased since the last flush.
        Raises as `Consolidator.forget` does: the batch stays pending and is applied again (erasing is
        idempotent)."""
        due, self._facts_due = self._facts_due, {}
        for namespace, episode_ids in due.items():
            with cluster.route(namespace):
                await self._forget_facts_in_building(namespace, episode_ids)
                await self.snapshots.forget(self.gen, namespace, episode_ids)

    async def _building(self) -> int | None:
        """The generation a replay is building beside this one (`shared.generations`), if any."""
        _live, building = await generations.writable(self.redis, self.keys)
        return building if building != self.gen else None

    async def _forget_facts_in_building(self, namespace: str, episode_ids: list[str]) -> None:
        """Delete, in a building generation, every facts scope of `namespace` one of whose facts names
        one of `episode_ids` (its state keeps the snapshot, text included). The rebuilt snapshot that
        the forget publishes reaches it through the replay's catch-up pass."""
        building = await self._building()
        if building is None or not episode_ids:
            return
        tags = await self.snapshots.tags(building)
        try:
            affected = await facts_with_evidence(
                self.redis, self.keys.facts_index(building), namespace, episode_ids, tags
            )
        except ResponseError as exc:  # the replay has not created its facts index yet
            if not is_missing_index(exc):
                raise
            return
        for scope_id in sorted({f.scope_id for f in affected}):
            state = self.keys.fact_scope(building, namespace, scope_id)
            ids = await self.redis.hget(state, "ids")
            names = {f.fact_id for f in affected if f.scope_id == scope_id} | set(
                orjson.loads(ids) if ids else []
            )
            await self.redis.delete(
                state, *(self.keys.fact_doc(building, namespace, i) for i in sorted(names))
            )

    async def erase_user(self, namespace: str, user_id: str, forgotten_at: float) -> int:
        """Erase every episode of `user_id` in `namespace` that began no later than the user's forget
        time (UTC epoch seconds; the latest forget wins); returns the count. A later episode is new
        activity and kept (the write scripts apply the same rule to episodes written after the forget);
        their facts are rebuilt at the next `flush_facts`. With a key ring the user's data key is destroyed first, so every sealed copy is unreadable at
        once whatever happens to the rest."""
        if self.keyring is not None:
            await self.keyring.destroy_user(self.redis, namespace, user_id, forgotten_at)
        await erasure.mark_pending(self.redis, self.keys)
        key = self.keys.user_tombstone(namespace, user_id)
        await self._forget_user(keys=[key], args=[repr(forgotten_at)])
        stored = await self.redis.get(key)
        cutoff = max(forgotten_at, float(stored)) if stored is not None else forgotten_at
        scope = Scope(namespace=namespace, tags=self.tags, user_id=user_id, status=None)
        found = await every_key(self.redis, self.keys.episode_index(self.gen), scope.query())
        erased = 0
        for episode_id in (await documents_ids(self.redis, found)).get(namespace, []):
            first = await self._first_occurred_at(namespace, episode_id)
            if first is None or first <= cutoff:
                await self.erase_episode(namespace, episode_id)
                erased += 1
        # dead letters of the user's episodes, including ones that never had a document
        await deadletters.delete_user_dead_letters(
            self.redis,
            self.keys,
            namespace,
            user_id,
            sealed_ref=self.keyring.ref(namespace, user_id) if self.keyring is not None else None,
        )
        return erased

    async def _first_occurred_at(self, namespace: str, episode_id: str) -> float | None:
        """The earliest `occurred_at` among the episode's stored events (None if none can be read)."""
        times = [
            at
            for payload in await self.redis.hvals(self.keys.episode_events(self.gen, namespace, episode_id))
            if (at := occurred_at(as_bytes(payload))) is not None
        ]  # clear in sealed entries too
        return min(times) if times else None
