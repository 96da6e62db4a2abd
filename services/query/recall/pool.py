"""The candidate pool of a recall: what each search returns of an episode (the field lists; the pool's
rows as `Columns`, a winner or a looked-up episode as a `Candidate`) and the merge of the lists with
cosines and relevance (`similarity_pool`, `extra_candidates`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from engram_episodic.errors import EngramError
from engram_episodic.events import Episode
from engram_episodic.shapes import episode_from_stored
from services.query.insights import MARKED_TEXTS, MIN_SIMILARITY, REGIME_MIN
from services.query.recall import relevance
from services.query.recall.arms import bm25_search, knn_search
from services.query.recall.lists import field_float, number
from services.query.recall.plan import SIMILARITY_ARMS, Plan, Query, vector_of
from services.query.recall.score import SUPERSEDED_GAP
from shared import regimes, tracing
from shared.index import TEXT_FIELDS, TIE_FIELD, Scope, SearchHit, tag_clause

log = logging.getLogger("engram.query")

RETURN_FIELDS = ("episode_id", "doc", "completed_at", "last_accessed", "access_count")


# where an episode records its approach (`services.query.recall.regime_roles`)
APPROACH_FIELDS = ("strategy", *MARKED_TEXTS)

# what ranking needs, straight from the index, without the documents (most hits never win: the
# winners' are loaded after); no episode_id: the restricted KNN names keys (INKEYS)
LIGHT_SIGNAL_FIELDS = (
    "completed_at",
    "started_at",
    "reward",
    "outcome",
    "importance",
    "last_accessed",
    "access_count",
    TIE_FIELD,  # equal priority and age: the lists' own order (`services.query.recall.score.score`)
    *APPROACH_FIELDS,
)


# ... and with the text fields where keyword relevance is computed (keyword and hybrid modes)
POOL_FIELDS = LIGHT_SIGNAL_FIELDS + tuple(name for name, _ in TEXT_FIELDS if name not in APPROACH_FIELDS)


@dataclass(slots=True)
class Candidate:
    """One stored episode fetched for a request: its document key, the episode, and what the index says."""

    key: bytes
    episode: Episode | None = None
    completed_at: float = math.nan
    cos: float = math.nan
    doc: dict[str, Any] | None = None
    """The stored document (JSON-decoded) of a recall winner; see `load_episodes`."""
    last_accessed: float = math.nan
    access_count: int = 0


def decode_hit(hit: SearchHit) -> Candidate | None:
    """A search hit → Candidate; None (logged) when its stored JSON is unreadable."""
    raw = hit.fields.get(b"doc")
    try:
        episode = episode_from_stored(json.loads(raw or b""))
    except (TypeError, ValueError, KeyError, AttributeError, EngramError) as exc:
        log.error("unreadable episode document ◆ key=%r ◆ %s", hit.key[:80], str(exc)[:200])
        return None
    count_raw = field_float(hit.fields, b"access_count")
    return Candidate(
        key=hit.key,
        episode=episode,
        last_accessed=field_float(hit.fields, b"last_accessed"),
        access_count=0 if math.isnan(count_raw) else int(count_raw),
    )


def _floats(raw: list[bytes | None]) -> np.ndarray:
    """float64[n] of returned values, NaN when absent or not a number (Python's float() per value: faster
    than numpy's cast for a pool's few hundred)."""
    nan = math.nan
    try:
        return np.array([nan if v is None else float(v) for v in raw], dtype=np.float64)
    except ValueError:  # a value that is not a number: NaN for it alone
        return np.array([number(v) for v in raw], dtype=np.float64)


@dataclass(slots=True)
class Columns:
    """A recall's candidate pool as parallel columns, one row per episode in merge order: what ranking
    reads of each hit (`LIGHT_SIGNAL_FIELDS`), its cosine and relevance. `candidate(i)` makes the
    `Candidate` of a row (the winners only). Float columns are float64[n], NaN where the index returned
    nothing (`completed_at` falls back to `started_at`; `access_count` is 0 when absent or not finite).
    Columns, not an object per hit: only the winners need one."""

    keys: list[bytes]
    outcomes: list[str | None]
    completed_at: np.ndarray
    reward: np.ndarray
    importance: np.ndarray
    last_accessed: np.ndarray
    access_count: np.ndarray
    cos: np.ndarray
    relevance: np.ndarray
    tie: np.ndarray
    """The episode's tie-break (`shared.ties.tie_break`)."""
    approaches: list[tuple[bytes | None, ...]] = field(default_factory=list)
    """The `APPROACH_FIELDS` values of each row."""
    regime: tuple[Any, ...] | None = field(default=None, init=False)
    """`regime_flips` of these rows once computed (a pool is tested once, for its search and its score)."""

    @classmethod
    def of_hits(cls, hits: list[SearchHit], cos: np.ndarray, keyword: np.ndarray, mode: str) -> Columns:
        """The rows of `hits` (LIGHT_SIGNAL_FIELDS returned), with their cosines (float64[n], NaN unknown) and
        keyword relevance (float64[n]); relevance is `services.query.recall.relevance.relevances` of `mode`."""
        gets = [h.fields.get for h in hits]
        completed = _floats([get(b"completed_at") for get in gets])
        unset = np.isnan(completed)
        if unset.any():
            completed = np.where(unset, _floats([get(b"started_at") for get in gets]), completed)
        count = _floats([get(b"access_count") for get in gets])
        return cls(
            keys=[h.key for h in hits],
            outcomes=[o.decode() if o else None for o in (get(b"outcome") for get in gets)],
            completed_at=completed,
            reward=_floats([get(b"reward") for get in gets]),
            importance=_floats([get(b"importance") for get in gets]),
            last_accessed=_floats([get(b"last_accessed") for get in gets]),
            access_count=np.where(np.isfinite(count), count, 0.0),  # HINCRBY writes it: never inf
            cos=cos,
            relevance=relevance.relevances(mode, cos, keyword),
            tie=_floats([get(_TIE) for get in gets]),
            approaches=[tuple(get(f) for f in _APPROACH) for get in gets],
        )

    @classmethod
    def empty(cls) -> Columns:
        """No rows."""
        return cls.of_hits([], np.empty(0), np.empty(0), "vector")

    def __len__(self) -> int:
        return len(self.keys)

    def __add__(self, other: Columns) -> Columns:
        """These rows, then `other`'s."""
        if not other.keys:
            return self
        if not self.keys:
            return other
        arrays = {name: np.concatenate((getattr(self, name), getattr(other, name))) for name in _ARRAYS}
        return Columns(
            keys=self.keys + other.keys,
            outcomes=self.outcomes + other.outcomes,
            approaches=self.approaches + other.approaches,
            **arrays,
        )

    def candidate(self, i: int) -> Candidate:
        """Row `i` as a Candidate (without its episode: `services.query.recall.load_episodes`)."""
        return Candidate(
            key=self.keys[i],
            completed_at=float(self.completed_at[i]),
            cos=float(self.cos[i]),
            last_accessed=float(self.last_accessed[i]),
            access_count=int(self.access_count[i]),
        )


_ARRAYS = tuple(f.name for f in fields(Columns) if f.type == "np.ndarray")
_TIE = TIE_FIELD.encode()
_APPROACH = tuple(f.encode() for f in APPROACH_FIELDS)


@dataclass(slots=True)
class Pool:
    """Candidates of a recall and what bounds the relevance of every episode not among them."""

    cands: Columns
    terms: dict[str, float]
    mode: str
    """The mode relevance is computed in (hybrid becomes vector for a query of stop words only)."""
    outside: float = 1.0
    """An upper bound of the relevance of any scope episode outside the similarity lists: the last
    KNN cosine when the KNN list is full (0 when it holds the whole scope), and the query's largest
    possible keyword relevance when the BM25 list is full (0 when it holds every episode matching a
    query word)."""


async def similarity_pool(q: Query, plan: Plan) -> Pool:
    """The similarity lists of the plan's mode (KNN, BM25), each its top `plan.depth` hits of the scope
    (pre-filtered), merged in that order, with each member's cosine and relevance. Only the KNN arm and
    the keyword hits' cosines wait for `q.vector`. The idf counts are the namespace's (`q.sizes`;
    never the request's filters); words of idf < `common_idf` leave the BM25 query only.

    Relevance is `relevance.relevances` of the mode, a function of the query and the episode alone, never
    rescaled over the pool (a score must not depend on what else is stored or returned); the depth does
    not depend on top_k, so every top_k is a prefix of the same ranking.
    """
    p, depth = plan.params, plan.depth
    mode, names = p.mode, [n for n in plan.arms if n in SIMILARITY_ARMS]
    fields = POOL_FIELDS if mode != "vector" else LIGHT_SIGNAL_FIELDS
    words = relevance.query_words(q.text) if mode != "vector" else {}

    async def knn() -> list[SearchHit]:
        if "knn" not in names:
            return []
        with tracing.span("engram.recall.knn", depth=depth):
            vector = await vector_of(q.vector)
            return await knn_search(
                q.r,
                q.index,
                q.scope,
                vector,
                depth,
                return_fields=fields,
                policy=plan.policy,
                graph_ef=p.graph_ef,
            )

    async def idf() -> dict[str, float]:
        if not words:
            return {}
        namespace = Scope(namespace=q.scope.namespace, tags=q.scope.tags)
        counts = await q.sizes.term_counts(q.r, q.index, namespace, list(words.values()))
        return relevance.query_terms(words, counts)

    async def bm25(text: str, dropped: int = 0) -> list[SearchHit]:
        if "bm25" not in names:
            return []
        with tracing.span("engram.recall.bm25", depth=depth, dropped=dropped):
            return await bm25_search(q.r, q.index, q.scope, text, depth, return_fields=fields)

    async def keyword() -> tuple[dict[str, float], set[str], list[SearchHit]]:
        """The idf, then the BM25 arm without the common terms unless all are (both at once when the
        index is too small to hold one; again if the idf shows one: the answer never depends on it)."""
        bound = relevance.common_count(p.common_idf)  # inf when off; the index's size bounds any namespace's
        hits = None
        if "bm25" not in names or bound == math.inf or await q.sizes.indexed(q.r, q.index, None) <= bound:
            terms, hits = await asyncio.gather(idf(), bm25(q.text))
        else:
            terms = await idf()
        common = relevance.common_terms(terms, p.common_idf) if "bm25" in names else set()
        common = common if len(common) < len(terms) else set()  # none rarer to search by: the full query
        if hits is not None and not common:
            return terms, common, hits
        text = relevance.without_terms(q.text, common) if common else q.text
        return terms, common, await bm25(text, len(common))

    knn_hits, (terms, common, bm25_hits) = await asyncio.gather(knn(), keyword())
    lists = [{"knn": knn_hits, "bm25": bm25_hits}[name] for name in names]
    if mode == "hybrid" and not words:  # no word to match (stop words only): the keyword arm is silent
        mode = "vector"
    pool = Pool(cands=Columns.empty(), terms=terms, mode=mode)
    last = knn_hits[-1].score if len(knn_hits) >= depth else None
    cos_out = 1.0 - float(last) if last is not None else 0.0
    # a short BM25 list holds every episode matching a kept term: outsiders match only dropped ones
    kw_out = relevance.max_keyword_relevance(
        pool.terms if len(bm25_hits) >= depth else {t: w for t, w in terms.items() if t in common}
    )
    pool.outside = float(relevance.relevances(mode, np.array([cos_out]), np.array([kw_out]))[0])
    pool.cands = await _complete(q, pool, lists, set())
    return pool


async def extra_candidates(q: Query, plan: Plan, pool: Pool, names: list[str]) -> Columns:
    """The recency / reward / importance lists `names` (`Floors.top_by`), minus what `pool` holds.
    `q.vector` is awaited only outside keyword mode (which needs no cosines, nor that every episode has
    a vector)."""
    fields = POOL_FIELDS if pool.mode != "vector" else LIGHT_SIGNAL_FIELDS
    r, index, scope, depth = q.r, q.index, q.scope, plan.depth
    lists = (
        await q.floors.remembered_lists(r, index, scope, await vector_of(q.vector), names, depth, fields)
        if pool.mode != "keyword"
        else None
    )
    if lists is None:
        lists = await asyncio.gather(
            *(
                q.floors.top_by(r, index, scope, name, depth, fields, hint=_hint(pool.cands, name))
                for name in names
            )
        )
    return await _complete(q, pool, lists, set(pool.cands.keys))


_HINTED = ("completed_at", "reward", "importance")


def _hint(cands: Columns, name: str) -> float | None:
    """The pool's third best value of `name` (`top_by`'s hint for a scope without a floor), or None:
    fewer than three members have one, or the fourth shares it (a floor at a tie needs `top_by`'s own
    tie-break). The third, not the best: above the best too few of the scope lie to prove the answer."""
    if name not in _HINTED or len(cands) < 3:
        return None
    values = getattr(cands, name)
    finite = np.sort(values[np.isfinite(values)])[::-1]
    if finite.size < 3 or (finite.size > 3 and finite[3] == finite[2]):
        return None
    return float(finite[2])


async def _complete(q: Query, pool: Pool, lists: list[list[SearchHit]], known: set[bytes]) -> Columns:
    """Candidates of the hits not in `known` (first occurrence wins), with cosines and relevance."""
    cos: dict[bytes, float] = {}
    hits: dict[bytes, SearchHit] = {}
    for found in lists:
        for h in found:
            if h.key in known:
                continue
            if b"dist" in h.fields and h.score is not None and math.isfinite(h.score):  # a KNN hit
                cos.setdefault(h.key, 1.0 - float(h.score))
            hits.setdefault(h.key, h)
    missing = [key for key in hits if key not in cos] if pool.mode != "keyword" else []
    if missing:
        # one KNN restricted to those documents (INKEYS): Redis computes the cosines, no vectors move;
        # found in the scope already, so not filtered by its namespace and status again (~3x cheaper)
        restricted = Scope(namespace=q.scope.namespace, tags=q.scope.tags)
        vector = await vector_of(q.vector)
        for h in await knn_search(
            q.r, q.index, restricted, vector, len(missing), return_fields=(), in_keys=missing, prechecked=True
        ):
            if h.score is not None and math.isfinite(h.score):
                cos[h.key] = 1.0 - float(h.score)
    found = list(hits.values())
    keywords = relevance.keyword_relevances(pool.terms, [h.fields for h in found], q.memos)
    cosines = np.array([cos.get(h.key, math.nan) for h in found], dtype=np.float64)
    return Columns.of_hits(found, cosines, keywords, pool.mode)


def experience(cands: Columns, mode: str) -> np.ndarray:
    """bool[n]: the rows that are experience of the task, as advice reads them: a cosine to the query of
    at least `insights.MIN_SIMILARITY`; in keyword mode (no cosines), a query word
    (`relevance.CONTEXT_FLOOR`). Never below the floor `/v1/context` applies in that mode."""
    if mode == "keyword":
        return np.nan_to_num(cands.relevance) >= relevance.CONTEXT_FLOOR["keyword"]
    return np.nan_to_num(cands.cos, nan=-1.0) >= MIN_SIMILARITY


def regime_rows(
    cands: Columns, listed: int, mode: str
) -> tuple[list[int], list[float], list[bool], list[set[str]], list[float]] | None:
    """The pool's decided rows that are experience of the task (`experience` in `mode`) of the similarity
    lists (its first `listed`, as advice reads them) or at most `SUPERSEDED_GAP` less relevant than the
    most relevant, as `shared.regimes` reads them: rows, completion times (UTC epoch s, 0 unknown),
    successes, marks (`shared.regimes.marks` of the strategy and the solution, actions, errors, outcome
    details) and relevance (~0.05 ms a row); None when
    fewer than REGIME_MIN succeed or fail."""
    key = np.where(np.isfinite(cands.relevance), cands.relevance, np.nan_to_num(cands.cos))
    decided = np.array([o is not None for o in cands.outcomes], dtype=bool) & experience(cands, mode)
    if decided.sum() < 2 * REGIME_MIN:
        return None
    near = (np.arange(len(key)) < listed) | (key >= key[decided].max() - SUPERSEDED_GAP)
    rows = np.flatnonzero(decided & near).tolist()
    success = [cands.outcomes[i] == "success" for i in rows]
    if min(success.count(True), success.count(False)) < REGIME_MIN:
        return None
    marks: dict[tuple[bytes | None, ...], set[str]] = {}  # episodes of one task often share their texts
    for i in rows:
        strategy, *texts = approach = cands.approaches[i]
        if approach not in marks:
            marks[approach] = set(
                regimes.marks(strategy.decode(errors="replace") if strategy else None, texts)
            )
    times = np.where(np.isfinite(cands.completed_at), cands.completed_at, 0.0)[rows].tolist()
    return rows, times, success, [marks[cands.approaches[i]] for i in rows], key[rows].tolist()


def regime_flips(
    cands: Columns, listed: int, mode: str
) -> tuple[Any, list[tuple[tuple[int, ...], int]], list[int]]:
    """`regime_rows` of `cands` and their `shared.regimes.flips` (none without rows), computed once."""
    if cands.regime is None:
        found = regime_rows(cands, listed, mode)
        cands.regime = (found, *(regimes.flips(*found[1:4], REGIME_MIN) if found else ([], [])))
    return cands.regime


async def regime_candidates(q: Query, plan: Plan, pool: Pool) -> None:
    """Add to `pool.cands` what its lists may miss of what works now (whatever `top_k`). When alike ones
    may lie outside (`Pool.outside`) and its REGIME_MIN successes show no change (`regime_flips`): the
    episodes that did not succeed since its newest decided one (alike old successes may hide them;
    advice reads past them too). Then, when an approach stopped working, those completed since it began
    failing. Each a search of the plan's lists (top `plan.depth`) minus the pool; none otherwise."""
    cands, failed = pool.cands, "-" + tag_clause("outcome", "success")
    times = cands.completed_at[[o is not None for o in cands.outcomes]]
    alike_outside = pool.outside > 0 and cands.outcomes.count("success") >= REGIME_MIN
    if alike_outside and np.isfinite(times).any() and not regime_flips(cands, len(cands), pool.mode)[1]:
        pool.cands += await _since(q, plan, pool, float(np.nanmax(times)), "engram.recall.failures", failed)
    found, flipped, _ = regime_flips(pool.cands, len(pool.cands), pool.mode)
    if flipped:
        since = min(found[1][idx[start]] for idx, start in flipped)
        pool.cands += await _since(q, plan, pool, since, "engram.recall.successors")


async def _since(q: Query, plan: Plan, pool: Pool, since: float, span: str, clause: str = "") -> Columns:
    """The plan's similarity lists (top `plan.depth` each) of the scope's episodes completed at or after
    `since` (UTC epoch s) and matching `clause` (a filter expression), minus the pool."""
    scope, fields = q.scope, POOL_FIELDS if pool.mode != "vector" else LIGHT_SIGNAL_FIELDS
    if scope.until is not None and since > scope.until:
        return Columns.empty()
    clause = f"{scope.clause} {clause}".strip()
    recent = dataclasses.replace(scope, since=max(since, scope.since or since), clause=clause)
    common = relevance.common_terms(pool.terms, plan.params.common_idf)  # as the BM25 arm searched
    text = relevance.without_terms(q.text, common) if 0 < len(common) < len(pool.terms) else q.text

    async def arm(name: str) -> list[SearchHit]:
        with tracing.span(span, arm=name, depth=plan.depth):
            if name == "bm25":
                return await bm25_search(q.r, q.index, recent, text, plan.depth, return_fields=fields)
            vector, ef = await vector_of(q.vector), plan.params.graph_ef
            return await knn_search(
                q.r, q.index, recent, vector, plan.depth, return_fields=fields, graph_ef=ef
            )

    lists = await asyncio.gather(*(arm(n) for n in plan.arms if n in SIMILARITY_ARMS))
    return await _complete(q, pool, list(lists), set(pool.cands.keys))
