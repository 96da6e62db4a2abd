"""The episode index's ranked searches: pre-filtered KNN (`knn_search`), the remembered lists' union
(`knn_union`) and BM25 (`bm25_search`), each filtered by the whole scope. The schema, `Scope` and reply
parsing are `shared.index`'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from engram_episodic.errors import Conflict
from shared import tracing
from shared.hybrid import HYBRID_POLICIES, widened_ef
from shared.index import (
    VECTOR_FIELD,
    Scope,
    SearchHit,
    keyword_query,
    parse_search,
    search_limit,
    vector_bytes,
)


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
    """Pre-filtered KNN: `(scope)=>[KNN k @vector $BLOB AS dist]`, nearest first.

    `policy` is RediSearch's `HYBRID_POLICY` (`BATCHES` or `ADHOC_BF`; None lets the module choose):
    see `shared.hybrid.hybrid_policy`.

    `hit.score` is the cosine distance (1 - cos). Filters run inside the KNN (RediSearch hybrid
    query), so a narrow scope still yields k hits when k exist. `in_keys` restricts the search to those
    documents as well (`INKEYS`; the scope still applies): the distances of known documents, computed
    by Redis as for any KNN hit, without a tag union of their ids to build and parse.
    `prechecked`: `in_keys` are documents of `scope` already (hits of its own searches in this
    request), so its namespace and status are not filtered again (`Scope.query(checked=True)`): a
    document's key never changes namespace, and the TAG clauses cost 3× the restricted KNN itself at
    100,000 documents.
    `graph_ef`: the index is HNSW with that `EF_RUNTIME` (0: FLAT, or not known): an answer crowded by
    duplicate vectors is asked again with a wider beam (`shared.hybrid.widened_ef`), unless the policy
    is the exact `ADHOC_BF`.
    Raises Conflict when the index holds vectors of another size than `query_vector`: it was rebuilt
    with another embedder (`reindex`) under a running process, which must be restarted with that one.
    """
    if prechecked and not in_keys:
        raise ValueError("prechecked needs in_keys: the documents already found in the scope")
    where = scope.query(checked=prechecked)
    return await _knn(r, index, where, query_vector, k, return_fields, ef_runtime, in_keys, policy, graph_ef)


async def _knn(
    r: aioredis.Redis,
    index: str,
    where: str,
    query_vector: np.ndarray,
    k: int,
    return_fields: Sequence[str],
    ef_runtime: int | None,
    in_keys: Sequence[bytes | str],
    policy: str | None,
    graph_ef: int = 0,
) -> list[SearchHit]:
    """`knn_search`'s query (filter expression `where`) and its hits; asked again with a wider beam
    when `graph_ef` says it walked an HNSW graph and duplicate vectors crowded its answer."""
    hits = await _knn_once(r, index, where, query_vector, k, return_fields, ef_runtime, in_keys, policy)
    if graph_ef and policy != "ADHOC_BF":
        wider = widened_ef([h.score for h in hits], k, ef_runtime or graph_ef)
        if wider is not None:
            with tracing.span("engram.recall.knn_widened", ef=wider, distinct=len({h.score for h in hits})):
                hits = await _knn_once(
                    r, index, where, query_vector, k, return_fields, wider, in_keys, policy
                )
    return hits


async def _knn_once(
    r: aioredis.Redis,
    index: str,
    where: str,
    query_vector: np.ndarray,
    k: int,
    return_fields: Sequence[str],
    ef_runtime: int | None,
    in_keys: Sequence[bytes | str],
    policy: str | None,
) -> list[SearchHit]:
    """One FT.SEARCH of `_knn`'s query and its hits."""
    ef = f" EF_RUNTIME {int(ef_runtime)}" if ef_runtime else ""
    if policy is not None and policy not in HYBRID_POLICIES:
        raise ValueError(f"policy must be one of {sorted(HYBRID_POLICIES)}, not {policy!r}")
    if policy is not None and where != "*":  # no filter, no hybrid query: the module refuses a policy
        ef += f" HYBRID_POLICY {policy}"
    q = f"({where})=>[KNN {int(k)} @{VECTOR_FIELD} $BLOB{ef} AS dist]"
    blob = vector_bytes(query_vector)
    restrict = ["INKEYS", len(in_keys), *in_keys] if in_keys else []
    try:
        reply = await r.execute_command(*_knn_command(index, q, restrict, blob, return_fields, k))
    except ResponseError as exc:  # an index rebuilt with another embedder: say so, not a 500 per request
        expected = re.search(r"blob size \((\d+)\) does not match index's expected size \((\d+)\)", str(exc))
        if expected is None:
            raise
        raise Conflict(
            f"the index {index} now holds vectors of {int(expected.group(2)) // 4} dimensions "
            f"and this process embeds {len(blob) // 4}: the index was rebuilt with another embedder "
            f"(`reindex`); restart this service with the index's ENGRAM_EMBEDDER"
        ) from None
    return _knn_hits(reply)


def _knn_command(
    index: str, query: str, restrict: Sequence[Any], blob: bytes, return_fields: Sequence[str], k: int
) -> list[Any]:
    """The FT.SEARCH of a KNN `query` (its vector parameter `$BLOB`, its distance `dist`): the `k`
    nearest, nearest first, with `dist` and `return_fields`; `restrict` goes after the query (INKEYS)."""
    fields = ["dist", *return_fields]
    return [
        "FT.SEARCH",
        index,
        query,
        *search_limit(),
        *restrict,
        "PARAMS",
        2,
        "BLOB",
        blob,
        "SORTBY",
        "dist",
        "ASC",
        "RETURN",
        len(fields),
        *fields,
        "LIMIT",
        0,
        int(k),
        "DIALECT",
        2,
    ]


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
    None when that cannot be proven: the union counted and searched in one transaction (MULTI, so no
    write falls between).

    `(s1) | (s2) | ...` counted (`LIMIT 0 0`) and as a pre-filtered KNN of `k`: when the count is below
    `k` and equals the number of hits, every document of the union came back (each has a vector).
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
    return await _bm25(r, index, keyword_query(text, scope.query()), k, return_fields)


async def _bm25(
    r: aioredis.Redis, index: str, q: str | None, k: int, return_fields: Sequence[str]
) -> list[SearchHit]:
    if q is None:
        return []
    reply = await r.execute_command(
        "FT.SEARCH",
        index,
        q,
        *search_limit(),
        "SCORER",
        "BM25STD",
        "WITHSCORES",
        "RETURN",
        len(return_fields),
        *return_fields,
        "LIMIT",
        0,
        int(k),
        "DIALECT",
        2,
    )
    _, hits = parse_search(reply, with_scores=True)
    return hits
