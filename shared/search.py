"""The episode index's ranked searches: pre-filtered KNN (`knn_search`), the remembered lists' union
(`knn_union`) and BM25 (`bm25_search`), each with a checked variant that leaves the scope's namespace
and status out of the filter and checks them on the hits (`Scope.query(checked=True)`, `Scope.admits`;
`shared.hybrid.checked_share` says when). The schema, `Scope` and reply parsing are `shared.index`'s.
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
from shared.hybrid import HYBRID_POLICIES, checked_depth, widened_ef
from shared.index import (
    CHECKED_FIELDS,
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
    100,000 documents (docs/benchmarks.md "Checked filters"). See `knn_checked` for a KNN without keys.
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


async def knn_checked(
    r: aioredis.Redis,
    index: str,
    scope: Scope,
    query_vector: np.ndarray,
    k: int,
    *,
    return_fields: Sequence[str],
    policy: str | None = None,
    share: float = 1.0,
    graph_ef: int = 0,
) -> list[SearchHit] | None:
    """The scope's k nearest by a KNN whose namespace and status are checked on the hits
    (`Scope.query(checked=True)`), or None when fewer than k of the wider set's
    `checked_depth(k, share)` nearest are the scope's (the caller then asks `knn_search`): the first k
    that pass are the scope's k nearest on an exact index (all of them when the wider set was
    exhausted). `share` is the scope's share of the index. On HNSW both are approximations and may
    differ near the list's end (a trial: 95.9 vs the filtered query's 97.1 of the exact top 100; none
    differed in a top 5). For a scope holding most of the index (`shared.hybrid.checked_share`),
    where it is the cheaper query (docs/benchmarks.md "Checked filters"); `policy` as in `knn_search` (what is left of the
    filter, such as the expiry clause, still matches most of the index: ad hoc it would cost ~40 ms
    at 100,000 documents, in batches ~1 ms); `graph_ef` as in `knn_search`."""
    fields = (*return_fields, *CHECKED_FIELDS)
    n = checked_depth(k, share)
    hits = await _knn(
        r, index, scope.query(checked=True), query_vector, n, fields, None, (), policy, graph_ef
    )
    return _first_admitted(scope, hits, k, n)


def _first_admitted(scope: Scope, hits: list[SearchHit], k: int, asked: int) -> list[SearchHit] | None:
    """The first `k` of `hits` (a checked search's `asked` best) that are the scope's, or None when
    fewer are and the search was not exhausted (it returned all `asked`)."""
    admitted = [h for h in hits if scope.admits(h.fields)]
    if len(admitted) >= k or len(hits) < asked:
        return admitted[:k]
    return None


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
    checked: bool = False,
) -> list[SearchHit] | None:
    """Every document of any of `scopes`, nearest first, with its cosine distance (`hit.score`), or
    None when that cannot be proven: the union counted and searched in one transaction (MULTI, so no
    write falls between).

    `(s1) | (s2) | ...` counted (`LIMIT 0 0`) and as a pre-filtered KNN of `k`: when the count is below
    `k` and equals the number of hits, every document of the union came back (each has a vector).
    `checked`: each scope's namespace and status are checked on the hits instead of filtered
    (`Scope.query(checked=True)`, `Scope.admits`): the wider union is enumerated whole the same way,
    then the documents of none of the scopes are dropped, so the answer is the same set.
    """
    union = " | ".join(f"({s.query(checked=checked)})" for s in scopes)
    q = f"({union})=>[KNN {int(k)} @{VECTOR_FIELD} $BLOB AS dist]"
    fields = (*return_fields, *CHECKED_FIELDS) if checked else return_fields
    async with r.pipeline(transaction=True) as pipe:
        pipe.execute_command(
            "FT.SEARCH", index, union, *search_limit(), "NOCONTENT", "LIMIT", 0, 0, "DIALECT", 2
        )
        pipe.execute_command(*_knn_command(index, q, (), vector_bytes(query_vector), fields, k))
        counted, reply = await pipe.execute()
    total, hits = int(counted[0]), _knn_hits(reply)
    if total >= k or total != len(hits):
        return None
    if checked:  # the scopes share namespace and status (`Scope.admits` checks both)
        hits = [h for h in hits if any(s.admits(h.fields) for s in scopes)]
    return hits


async def bm25_search(
    r: aioredis.Redis, index: str, scope: Scope, text: str, k: int, *, return_fields: Sequence[str]
) -> list[SearchHit]:
    """BM25 (RediSearch's BM25STD) over the TEXT fields within the scope, best first; `hit.score` is the
    BM25 score. See `keyword_query` for why the scope sits inside each word's clause."""
    return await _bm25(r, index, keyword_query(text, scope.query()), k, return_fields)


async def bm25_checked(
    r: aioredis.Redis,
    index: str,
    scope: Scope,
    text: str,
    k: int,
    *,
    return_fields: Sequence[str],
    share: float = 1.0,
) -> list[SearchHit] | None:
    """`bm25_search` with the scope's namespace and status checked on the hits instead of repeated in
    every word's clause (`Scope.query(checked=True)`): the first k of the wider set's
    `checked_depth(k, share)` best that are the scope's, or None when fewer are (and more matched) or
    no clause is left to stand in for the scope (the caller then asks `bm25_search`).

    Not the same scores: a `$weight: 0` clause beside each word still moves RediSearch's BM25STD
    score, by an amount that depends on the clause and the document (up to 31% in a trial; no partner
    form reproduces the filtered scores), so near the list's end other episodes may enter the pool
    (100,000 episodes, 100 LoCoMo questions: 99.7 of the 100 hits in common; 400 questions: 397 top
    10s equal). Each hit's keyword relevance is Engram's own (`shared.relevance`), unchanged."""
    where = scope.query(checked=True)
    if where == "*":
        return None
    fields = (*return_fields, *CHECKED_FIELDS)
    n = checked_depth(k, share)
    return _first_admitted(scope, await _bm25(r, index, keyword_query(text, where), n, fields), k, n)


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
