"""The recall's ranked searches over the episode index, each filtered by the whole scope: pre-filtered
KNN (`knn_search`), the remembered lists' union (`knn_union`), BM25 (`bm25_search`); and the KNN's
`HYBRID_POLICY` (`hybrid_policy`) and wider beam (`widened_ef`). The schema, `Scope` and reply parsing
are `shared.index`'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from engram_episodic.errors import Conflict
from shared import tracing
from shared.index import (
    VECTOR_FIELD,
    Scope,
    SearchHit,
    keyword_query,
    parse_search,
    search_limit,
    vector_bytes,
)

HYBRID_POLICIES = frozenset({"BATCHES", "ADHOC_BF"})
BATCHES_SHARE = 0.25
BATCHES_MATCHES = 2_000
WIDE_SHARE = 0.05
WIDE_MATCHES = 20_000
CROWDED_SHARE = 0.5
EF_CEILING = 4096
_BLOB_SIZE = re.compile(r"blob size \((\d+)\) does not match index's expected size \((\d+)\)")


def hybrid_policy(matches: int, indexed: int) -> str | None:
    """The `HYBRID_POLICY` of a pre-filtered KNN whose filter matches `matches` of the `indexed`
    documents of an HNSW index: `BATCHES` when the filter keeps at least BATCHES_SHARE of the index and
    BATCHES_MATCHES documents, or at least WIDE_SHARE and WIDE_MATCHES; else None (the module's choice,
    ad hoc: exact, linear in the matches, so wrong for broad filters), as for an empty index.
    """
    if not indexed:
        return None
    share = matches / indexed
    if (share >= BATCHES_SHARE and matches >= BATCHES_MATCHES) or (
        share >= WIDE_SHARE and matches >= WIDE_MATCHES
    ):
        return "BATCHES"
    return None


def widened_ef(distances: Sequence[float | None], k: int, ef: int) -> int | None:
    """The `EF_RUNTIME` to ask an HNSW KNN of `k` again with, when the `distances` (cosine, nearest
    first) of its answer under `ef` show its beam was crowded by duplicate vectors; None when it was not.

    Identical vectors are separate graph nodes at one distance, so a beam of `max(ef, k)` nodes may hold
    few distinct points. When fewer than CROWDED_SHARE of the hits have distinct distances, the beam
    grows by the hits-per-distinct ratio, at most EF_CEILING. A short answer (fewer than `k` hits) is
    never widened.
    """
    if k <= 0 or len(distances) < k:
        return None
    distinct = len(set(distances))
    if distinct >= CROWDED_SHARE * len(distances):
        return None
    base = max(int(ef), int(k))
    wider = min(EF_CEILING, math.ceil(base * len(distances) / max(distinct, 1)))
    return wider if wider > base else None


async def knn_search(
    r: aioredis.Redis,
    index: str,
    scope: Scope,
    query_vector: np.ndarray,
    k: int,
    *,
    return_fields: Sequence[str],
    ef_runtime: int | None = None,
    in_keys: Sequence[bytes | str] = (),
    policy: str | None = None,
    prechecked: bool = False,
    graph_ef: int = 0,
) -> list[SearchHit]:
    """Pre-filtered KNN: `(scope)=>[KNN k @vector $BLOB AS dist]`, nearest first; `hit.score` is the
    cosine distance (1 - cos). The filter runs inside the KNN, so a narrow scope still yields k hits.

    `policy`: `HYBRID_POLICY` (`hybrid_policy`; None lets the module choose). `in_keys`: only those
    documents (`INKEYS`). `prechecked`: `in_keys` are documents of `scope` already, so namespace and
    status are not filtered again (`Scope.query(checked=True)`). `graph_ef`: the index is HNSW with that
    `EF_RUNTIME` (0: FLAT or unknown): an answer crowded by duplicate vectors is asked again
    (`widened_ef`), unless the policy is the exact `ADHOC_BF`.
    Raises Conflict when the index holds vectors of another size (rebuilt with another embedder under
    a running process), ValueError for an unknown policy.
    """
    if policy is not None and policy not in HYBRID_POLICIES:
        raise ValueError(f"policy must be one of {sorted(HYBRID_POLICIES)}, not {policy!r}")
    where = scope.query(checked=prechecked)
    restrict = ["INKEYS", len(in_keys), *in_keys] if in_keys else []
    blob = vector_bytes(query_vector)

    async def walk(ef_runtime: int | None) -> list[SearchHit]:
        ef = f" EF_RUNTIME {int(ef_runtime)}" if ef_runtime else ""
        if policy is not None and where != "*":  # no filter, no hybrid query: the module refuses a policy
            ef += f" HYBRID_POLICY {policy}"
        q = f"({where})=>[KNN {int(k)} @{VECTOR_FIELD} $BLOB{ef} AS dist]"
        try:
            reply = await r.execute_command(*_knn_command(index, q, restrict, blob, return_fields, k))
        except ResponseError as exc:  # an index rebuilt with another embedder: say so, not a 500 per request
            expected = _BLOB_SIZE.search(str(exc))
            if expected is None:
                raise
            raise Conflict(
                f"the index {index} now holds vectors of {int(expected.group(2)) // 4} dimensions "
                f"and this process embeds {len(blob) // 4}: the index was rebuilt with another embedder "
                f"(`reindex`); restart this service with the index's ENGRAM_EMBEDDER"
            ) from None
        return _knn_hits(reply)

    hits = await walk(ef_runtime)
    if graph_ef and policy != "ADHOC_BF":
        wider = widened_ef([h.score for h in hits], k, ef_runtime or graph_ef)
        if wider is not None:
            with tracing.span("engram.recall.knn_widened", ef=wider, distinct=len({h.score for h in hits})):
                hits = await walk(wider)
    return hits


def _search(index: str, query: str, options: Sequence[Any], fields: Sequence[str], k: int) -> list[Any]:
    """The FT.SEARCH of `query` with `options` after it: its first `k` hits, each with `fields`."""
    head = ["FT.SEARCH", index, query, *search_limit(), *options]
    return [*head, "RETURN", len(fields), *fields, "LIMIT", 0, int(k), "DIALECT", 2]


def _knn_command(
    index: str, query: str, restrict: Sequence[Any], blob: bytes, return_fields: Sequence[str], k: int
) -> list[Any]:
    """The FT.SEARCH of a KNN `query` (its vector parameter `$BLOB`, its distance `dist`): the `k`
    nearest, nearest first, with `dist` and `return_fields`; `restrict` goes after the query (INKEYS)."""
    options = [*restrict, "PARAMS", 2, "BLOB", blob, "SORTBY", "dist", "ASC"]
    return _search(index, query, options, ["dist", *return_fields], k)


def _knn_hits(reply: Any) -> list[SearchHit]:
    """The hits of a `_knn_command` reply, each with its cosine distance as `hit.score` (NaN if absent)."""
    _, hits = parse_search(reply)
    for hit in hits:
        hit.score = float(hit.fields.get(b"dist", b"nan"))
    return hits


async def knn_union(
    r: aioredis.Redis,
    index: str,
    scopes: Sequence[Scope],
    query_vector: np.ndarray,
    k: int,
    *,
    return_fields: Sequence[str],
) -> list[SearchHit] | None:
    """Every document of any of `scopes`, nearest first, with its cosine distance (`hit.score`), or
    None when that cannot be proven: the union counted and searched as a KNN of `k` in one transaction
    (MULTI); a count below `k` equal to the number of hits means every document came back.
    """
    union = " | ".join(f"({s.query()})" for s in scopes)
    q = f"({union})=>[KNN {int(k)} @{VECTOR_FIELD} $BLOB AS dist]"
    async with r.pipeline(transaction=True) as pipe:
        pipe.execute_command(
            "FT.SEARCH", index, union, *search_limit(), "NOCONTENT", "LIMIT", 0, 0, "DIALECT", 2
        )
        pipe.execute_command(*_knn_command(index, q, (), vector_bytes(query_vector), return_fields, k))
        counted, reply = await pipe.execute()
    total, hits = int(counted[0]), _knn_hits(reply)
    if total >= k or total != len(hits):
        return None
    return hits


async def bm25_search(
    r: aioredis.Redis, index: str, scope: Scope, text: str, k: int, *, return_fields: Sequence[str]
) -> list[SearchHit]:
    """BM25 (RediSearch's BM25STD) over the TEXT fields within the scope, best first; `hit.score` is the
    BM25 score. See `keyword_query` for why the scope sits inside each word's clause."""
    q = keyword_query(text, scope.query())
    if q is None:
        return []
    reply = await r.execute_command(*_search(index, q, ("SCORER", "BM25STD", "WITHSCORES"), return_fields, k))
    return parse_search(reply, with_scores=True)[1]
