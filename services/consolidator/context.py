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
its successor's vector and context_text when the erasure re-bases it. Only the neighbourhood of
what changed is read (`SessionContext._window`): the episodes between the earliest and the latest
completed_at the touched episodes have or had, and per user the nearest one before (the seed) and after
(the only one outside the range whose predecessor can change); the whole session is read when that
window is ambiguous, and `refresh_sessions(..., whole=True)` is the reference it is tested against
(tests/integration/test_context_window.py). Each write is conditional
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
from shared.index import STATUS_COMPLETED, search_limit, tag_clause

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
Touch = tuple[str, str, str, float | None]
"""(namespace, session TAG value, user TAG value or '', completed_at UTC epoch seconds or None) of an
episode written, moved or erased: what `refresh_sessions` re-bases around."""
Row = tuple[float, str, bytes, dict[bytes, bytes]]
WINDOW_NEIGHBOURS = 16
"""Rows read on each side of a window to find each user's nearest episode; fewer settle nothing."""
SESSION_LIMIT = 10_000
"""Most episodes read by one whole-session re-base (and by one window, past which the whole session is
read); beyond that a whole-session re-base skips the latest ones by completed_at (they keep their own
vectors and get no context_text). A window reads only the episodes around what changed, so a write
into a long session re-bases its newest episodes whatever the session's length (docs/benchmarks.md)."""

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

    async def sessions_of(self, doc_keys: Iterable[bytes | str]) -> set[Touch]:
        """The Touch (namespace, session TAG value, user TAG value or '', completed_at UTC epoch seconds
        or None) of the documents among `doc_keys` that exist and have a session; pass those read before
        a write or an erasure too, so the positions the episodes left are re-based."""
        keys = list(dict.fromkeys(doc_keys))
        if not keys:
            return set()
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hmget(key, "namespace", "session_id", "user_id", "completed_at")
            replies = await pipe.execute()
        out: set[Touch] = set()
        for ns, sid, uid, at in replies:
            if ns is None or sid is None:
                continue
            try:
                when: float | None = float(at) if at is not None else None
            except ValueError:
                when = None
            out.add((ns.decode(), sid.decode(), (uid or b"").decode(), when))
        return out

    async def refresh_sessions(self, touches: Iterable[Touch], *, whole: bool = False) -> int:
        """Re-base what the touched episodes can change; returns how many documents changed. Only the
        episodes in [min, max] completed_at of a session's touches and the nearest one after that range
        per user can change (an episode's context is its predecessor's), so only those are recomputed,
        seeded by the nearest one before per user (`_window`); `whole=True` (or a touch without
        completed_at, or a bound that WINDOW_NEIGHBOURS rows leave ambiguous) reads the whole session,
        the reference the window is tested against. Per namespace: the sessions are read concurrently
        (SEARCHES_IN_FLIGHT), the writes go in one pipeline (one round trip each was 5x the drain time
        of the hashing embedder)."""
        by_ns: dict[str, dict[str, list[tuple[str, float | None]]]] = {}
        for namespace, session, user, at in sorted(
            set(touches), key=lambda t: (t[0], t[1], t[2], t[3] or 0.0)
        ):
            by_ns.setdefault(namespace, {}).setdefault(session, []).append((user, at))
        changed = 0
        gate = asyncio.Semaphore(SEARCHES_IN_FLIGHT)

        async def plan(
            namespace: str, session: str, marks: list[tuple[str, float | None]]
        ) -> list[tuple[list[bytes], list[bytes | str]]]:
            async with gate:
                return await self._plan(namespace, session, None if whole else marks)

        for namespace, sessions in by_ns.items():
            with cluster.route(namespace):  # the tasks below copy the route (a context variable)
                plans = await asyncio.gather(*(plan(namespace, s, m) for s, m in sessions.items()))
                writes = [w for p in plans for w in p]
                if not writes:
                    continue
                async with self.redis.pipeline(transaction=False) as pipe:
                    for keys, args in writes:
                        await self._rebase(keys=keys, args=args, client=pipe)
                    changed += sum(int(x) for x in await pipe.execute())
        return changed

    async def _search(self, query: str, order: str, limit: int) -> list[Row]:
        """Completed rows (completed_at, episode_id, key, fields) matching `query`, sorted by completed_at."""
        reply = await self.redis.execute_command(
            "FT.SEARCH", self.index, query, *search_limit(),
            "RETURN", 8, "completed_at", "doc", OWN_FIELD, "vector", TASK_FIELD, CONTEXT_FIELD, "user_id",
            CONTEXT_OF_FIELD,
            "SORTBY", "completed_at", order, "LIMIT", 0, limit, "DIALECT", 2,
        )  # fmt: skip
        rows: list[Row] = []
        for i in range(1, len(reply), 2):
            f = dict(zip(reply[i + 1][::2], reply[i + 1][1::2], strict=True))
            try:
                eid = str(orjson.loads(f.get(b"doc") or b"{}").get("episode_id", ""))
                at = float(f.get(b"completed_at") or "nan")
            except (ValueError, TypeError, AttributeError):
                continue
            rows.append((at, eid, reply[i], f))
        return rows

    async def _window(
        self, base: str, marks: list[tuple[str, float]]
    ) -> tuple[dict[bytes, Row], list[Row], set[bytes]] | None:
        """(per user: the nearest row before the range, the rows in the range and the nearest one after
        it per user, the keys allowed to change) of a session's touches, or None when the window is
        ambiguous (the range holds SESSION_LIMIT rows or more; WINDOW_NEIGHBOURS rows on a side do not
        settle a user's neighbour, or end in a tie with it) and the whole session must be read."""
        lo, hi = min(at for _, at in marks), max(at for _, at in marks)
        inside = await self._search(f"{base} @completed_at:[{lo!r} {hi!r}]", "ASC", SESSION_LIMIT)
        if len(inside) >= SESSION_LIMIT:
            return None
        users = {u.encode() for u, _ in marks} | {f.get(b"user_id") or b"" for *_, f in inside}
        sides: list[dict[bytes, Row]] = []
        for clause, order, nearest in ((f"[-inf ({lo!r}]", "DESC", max), (f"[({hi!r} +inf]", "ASC", min)):
            rows = await self._search(f"{base} @completed_at:{clause}", order, WINDOW_NEIGHBOURS)
            best: dict[bytes, Row] = {}
            for r in rows:
                u = r[3].get(b"user_id") or b""
                if u in users and (u not in best or nearest((r[0], r[1]), best[u][:2]) == (r[0], r[1])):
                    best[u] = r
            if len(rows) >= WINDOW_NEIGHBOURS and (
                set(best) != users or any(r[0] == rows[-1][0] for r in best.values())
            ):
                return None  # a neighbour may lie beyond the rows read, or tie with one not read
            sides.append(best)
        before, after = sides
        allowed = {r[2] for r in inside} | {r[2] for r in after.values()}
        return before, inside + list(after.values()), allowed

    async def _plan(
        self, namespace: str, session: str, marks: list[tuple[str, float | None]] | None = None
    ) -> list[tuple[list[bytes], list[bytes | str]]]:
        """The conditional writes (REBASE_LUA keys, args) that bring one session's vectors up to date:
        of the window around `marks` (user TAG value or '', completed_at), or of the whole session."""
        base = " ".join(
            (
                tag_clause("namespace", namespace),
                tag_clause("session_id", session),
                tag_clause("status", STATUS_COMPLETED),
            )
        )
        window = None
        if marks is not None and all(at is not None for _, at in marks):
            window = await self._window(base, [(u, at) for u, at in marks if at is not None])
        allowed: set[bytes] | None = None
        if window is None:
            rows = await self._search(base, "ASC", SESSION_LIMIT)
            before: dict[bytes, Row] = {}
        else:
            before, rows, allowed = window
        rows.sort(key=lambda r: (r[0], r[1]))  # ties by episode id: the same order in every generation
        writes: list[tuple[list[bytes], list[bytes | str]]] = []
        own_key, ctx_key, task_key = OWN_FIELD.encode(), CONTEXT_FIELD.encode(), TASK_FIELD.encode()
        of_key = CONTEXT_OF_FIELD.encode()
        # per user of the session (none: one chain): another user's words must not make an episode match
        # a recall, nor be kept in its document; per user: the episode just before, its own vector, its
        # task, its id
        chains: dict[bytes, tuple[bytes | None, bytes | None, bytes, bytes]] = {
            u: (r[2], r[3].get(own_key), r[3].get(task_key) or b"", r[1].encode()) for u, r in before.items()
        }
        for _at, eid, key, f in rows:
            prev_key, prev_own, prev_task, prev_id = chains.get(
                f.get(b"user_id") or b"", (None, None, b"", b"")
            )
            own = f.get(own_key)
            if own is not None and (allowed is None or key in allowed):
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
