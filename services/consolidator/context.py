"""Contextual episodes (`ENGRAM_CONTEXT_EPISODES=1`, off by default): an episode's stored vector leans
towards the previous episode of its session, and its keyword side holds that episode's task.

    vector(e)       = unit((1 - CONTEXT_SHARE) · own(e) + CONTEXT_SHARE · own(prev(e)))
    context_text(e) = task(prev(e))      (CONTEXT_FIELD, a TEXT field of BM25F weight 1.0)
    context_of(e)   = prev(e)'s episode_id  (CONTEXT_OF_FIELD, not indexed: `GET /v1/episodes/{id}`)

`own(x)` is the embedding of x's own text (`shared.index.embedding_text`), kept in the document's
OWN_FIELD (not indexed); `prev(e)` is the completed episode of the same namespace, session and user (or of no user) that comes
just before e in (completed_at, episode_id) order among the documents present; a session's first
episode (or one without a session, or with an agent-supplied vector, or whose previous episode has an
agent-supplied vector) keeps `own(e)` and has no context_text. `task(x)` is x's `task` field as the index
holds it (`fold_for_search`ed), copied byte for byte. Recall is unchanged: the score is still a function
of (query, stored document), because the context is fixed when the document is written, not looked up
per query; keyword relevance (`shared.relevance`) and the BM25 arm read context_text as one more field of
`shared.index.TEXT_FIELDS`, and the namespace's term counts (idf) include it.

Why: on LoCoMo, questions often paraphrase the turn before the evidence. Measured offline with the
default embedder, tuned on 4 conversations and held out on 3, and the split reversed
(`bench.context_probe`, docs/benchmarks.md "Contextual embeddings"): with the previous turn's text in the
keyword side at weight 1.0, CONTEXT_SHARE 0.2 was chosen on both tune splits (0.4 without it).

Determinism and erasure: a session's vectors are recomputed from what the index holds
(`refresh_sessions`) after every batch that writes a vector into it and after every erasure in it, so
the result depends on the set of episodes present, not on their arrival order: a replay rebuilds the
same bytes, an episode that arrives late re-bases its successor, and a forgotten episode's text leaves
its successor's vector and context_text when the erasure re-bases it. Each write is conditional
(REBASE_LUA): it happens only while both documents still hold the own vectors and the task it was
computed from, so a refresh never recreates an erased document nor writes a context that was erased
meanwhile. A document rewritten by the projection (`scripts.REPLACE_DOC_LUA`) loses its context_text
until the re-base that follows the batch restores it: carried over, it could outlive its source.
Operator note: the setting is recorded in the deployment's meta by its first writer and followed by
every process that leaves it unset (`shared.context_setting`), so a replay run without it keeps the
contexts and an explicit other value is refused; it is changed only by `engram replay
--change-context-episodes` with the new value, which rebuilds every document under it.
Remaining gap: two workers writing new episodes into one session at the same moment can each read the
session before the other's write; the vector of the later episode's successor is then re-based by the
next write or erasure in that session, not before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import numpy as np
import orjson
import redis.asyncio as aioredis

from shared import cluster
from shared.index import STATUS_COMPLETED, tag_clause

CONTEXT_SHARE = 0.2
"""Weight of the previous episode's own vector, tuned with CONTEXT_FIELD in the keyword side (LoCoMo,
docs/benchmarks.md "Contextual embeddings")."""
OWN_FIELD = "own_vector"
CONTEXT_FIELD = "context_text"
"""The previous episode's task, indexed (`shared.index.TEXT_FIELDS`)."""
CONTEXT_OF_FIELD = "context_of"
"""The id of the previous episode the vector leans on (not indexed): what `GET /v1/episodes/{id}` shows
as `context.previous_episode_id`, so a user can see why an episode matched words it does not hold."""
TASK_FIELD = "task"
SEARCHES_IN_FLIGHT = 8
"""Sessions of one namespace read at once by `refresh_sessions`."""
SESSION_LIMIT = 10_000
"""Most episodes of one session re-based; beyond that the latest ones by completed_at are skipped (they
keep their own vectors and get no context_text; docs/configuration.md). The whole session is read per
batch that touches it, so a write costs in proportion to its session's length (docs/benchmarks.md)."""

REBASE_LUA = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if #KEYS == 2 then
  if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[3] then return 0 end
  if (redis.call('HGET', KEYS[2], ARGV[6]) or '') ~= ARGV[5] then return 0 end
end
redis.call('HSET', KEYS[1], 'vector', ARGV[4])
if ARGV[5] == '' then redis.call('HDEL', KEYS[1], ARGV[7]) else redis.call('HSET', KEYS[1], ARGV[7], ARGV[5]) end
if ARGV[9] == '' then redis.call('HDEL', KEYS[1], ARGV[8]) else redis.call('HSET', KEYS[1], ARGV[8], ARGV[9]) end
return 1
"""
"""KEYS: the document, then its previous episode's (none for a session's first); ARGV: OWN_FIELD, the
own vectors the new vector was computed from (the document's, the previous one's or ''), the vector,
the previous episode's task it copies ('' = none: the field is deleted), TASK_FIELD, CONTEXT_FIELD,
CONTEXT_OF_FIELD, the previous episode's id ('' = none: the field is deleted)."""


def contextual(own: np.ndarray, prev: np.ndarray | None) -> np.ndarray:
    """float32[dim]: unit((1 - CONTEXT_SHARE)·own + CONTEXT_SHARE·prev), or `own` when prev is None."""
    if prev is None:
        return own
    v = (1.0 - CONTEXT_SHARE) * own.astype(np.float64) + CONTEXT_SHARE * prev.astype(np.float64)
    return (v / max(float(np.linalg.norm(v)), 1e-12)).astype(np.float32)


class SessionContext:
    """Re-bases the vectors of whole sessions in one generation's index (see the module docstring)."""

    def __init__(self, redis: aioredis.Redis, index: str):
        self.redis = redis
        self.index = index
        self._rebase = redis.register_script(REBASE_LUA)

    async def sessions_of(self, doc_keys: Iterable[bytes | str]) -> set[tuple[str, str]]:
        """(namespace, session TAG value) of the documents among `doc_keys` that exist and have a session."""
        keys = list(dict.fromkeys(doc_keys))
        if not keys:
            return set()
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hmget(key, "namespace", "session_id")
            replies = await pipe.execute()
        return {(ns.decode(), sid.decode()) for ns, sid in replies if ns is not None and sid is not None}

    async def refresh_sessions(self, sessions: Iterable[tuple[str, str]]) -> int:
        """Recompute the vectors of every completed episode of these sessions; returns how many changed.
        Per namespace: the sessions are read concurrently (SEARCHES_IN_FLIGHT), the writes go in one
        pipeline (one round trip each was 5x the drain time of the hashing embedder)."""
        by_ns: dict[str, list[str]] = {}
        for namespace, session in sorted(set(sessions)):
            by_ns.setdefault(namespace, []).append(session)
        changed = 0
        gate = asyncio.Semaphore(SEARCHES_IN_FLIGHT)

        async def plan(namespace: str, session: str) -> list[tuple[list[bytes], list[bytes | str]]]:
            async with gate:
                return await self._plan(namespace, session)

        for namespace, names in by_ns.items():
            with cluster.route(namespace):  # the tasks below copy the route (a context variable)
                plans = await asyncio.gather(*(plan(namespace, s) for s in names))
                writes = [w for p in plans for w in p]
                if not writes:
                    continue
                async with self.redis.pipeline(transaction=False) as pipe:
                    for keys, args in writes:
                        await self._rebase(keys=keys, args=args, client=pipe)
                    changed += sum(int(x) for x in await pipe.execute())
        return changed

    async def _plan(self, namespace: str, session: str) -> list[tuple[list[bytes], list[bytes | str]]]:
        """The conditional writes (REBASE_LUA keys, args) that bring one session's vectors up to date."""
        query = " ".join(
            (
                tag_clause("namespace", namespace),
                tag_clause("session_id", session),
                tag_clause("status", STATUS_COMPLETED),
            )
        )
        reply = await self.redis.execute_command(
            "FT.SEARCH", self.index, query,
            "RETURN", 8, "completed_at", "doc", OWN_FIELD, "vector", TASK_FIELD, CONTEXT_FIELD, "user_id",
            CONTEXT_OF_FIELD,
            "SORTBY", "completed_at", "ASC", "LIMIT", 0, SESSION_LIMIT, "DIALECT", 2,
        )  # fmt: skip
        rows = []
        for i in range(1, len(reply), 2):
            f = dict(zip(reply[i + 1][::2], reply[i + 1][1::2], strict=True))
            try:
                eid = str(orjson.loads(f.get(b"doc") or b"{}").get("episode_id", ""))
                at = float(f.get(b"completed_at") or "nan")
            except (ValueError, TypeError, AttributeError):
                continue
            rows.append((at, eid, reply[i], f))
        rows.sort(key=lambda r: (r[0], r[1]))  # ties by episode id: the same order in every generation
        writes: list[tuple[list[bytes], list[bytes | str]]] = []
        own_key, ctx_key, task_key = OWN_FIELD.encode(), CONTEXT_FIELD.encode(), TASK_FIELD.encode()
        of_key = CONTEXT_OF_FIELD.encode()
        # per user of the session (none: one chain): another user's words must not make an episode match
        # a recall, nor be kept in its document; per user: the episode just before, its own vector, its
        # task, its id
        chains: dict[bytes, tuple[bytes | None, bytes | None, bytes, bytes]] = {}
        for _at, eid, key, f in rows:
            prev_key, prev_own, prev_task, prev_id = chains.get(
                f.get(b"user_id") or b"", (None, None, b"", b"")
            )
            own = f.get(own_key)
            if own is not None:
                based = prev_key is not None and prev_own is not None
                p = np.frombuffer(prev_own, dtype=np.float32) if based and prev_own else None
                target = contextual(np.frombuffer(own, dtype=np.float32), p).tobytes()
                text = prev_task if based else b""
                of = prev_id if based else b""
                if (
                    target != f.get(b"vector")
                    or text != (f.get(ctx_key) or b"")
                    or of != (f.get(of_key) or b"")
                ):
                    tail: list[bytes | str] = [target, text, TASK_FIELD, CONTEXT_FIELD, CONTEXT_OF_FIELD, of]
                    if prev_key is None or prev_own is None:
                        writes.append(([key], [OWN_FIELD, own, b"", *tail]))
                    else:
                        writes.append(([key, prev_key], [OWN_FIELD, own, prev_own, *tail]))
            chains[f.get(b"user_id") or b""] = (key, own, f.get(task_key) or b"", eid.encode())
        return writes
