"""Which `HYBRID_POLICY` a pre-filtered KNN runs with (pure; `shared.search.knn_search` sends it),
and when a graph walk
crowded by duplicate vectors is asked again with a wider beam (`widened_ef`).

RediSearch answers `(filter)=>[KNN k ...]` either ad hoc (score every document the filter matches:
exact, cost linear in the matches) or in batches (walk the HNSW graph and filter each batch of
neighbours: cost grows as the filter gets narrower). The module's own choice was measured to be wrong
for broad filters, the common case of a memory service whose big tenants are its active ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

HYBRID_POLICIES = frozenset({"BATCHES", "ADHOC_BF"})
BATCHES_SHARE = 0.25
BATCHES_MATCHES = 2_000
WIDE_SHARE = 0.05
WIDE_MATCHES = 20_000
CROWDED_SHARE = 0.5
EF_CEILING = 4096


def hybrid_policy(matches: int | None, indexed: int | None, *, graph: bool = True) -> str | None:
    """The `HYBRID_POLICY` of a pre-filtered KNN whose filter matches `matches` of the `indexed`
    documents of an HNSW index (`graph`): `BATCHES` when the filter keeps at least BATCHES_SHARE of the
    index and BATCHES_MATCHES documents, or at least WIDE_SHARE and WIDE_MATCHES; else None (the
    module's choice). None for a FLAT index, or when either count is unknown.

    Why (RediSearch 2.10.5, 384 dims, HNSW M 16, EF_RUNTIME 100, KNN 20, one client): the module chose ad hoc
    for every filter measured. Ad hoc costs ~0.3-0.4 µs per matching document (90,000 matches: 23-32 ms;
    9,000: 3.6 ms; 1,000: 0.2-0.5 ms); batches cost ~0.5-0.6 ms at any size when the filter keeps 40-90% of
    the index, but grow as it narrows (10%: 2.1-2.3 ms; 1%: 6-15 ms). So batches win for broad filters with
    many matches and lose for narrow ones. On a FLAT index batches never won (20k documents: 2.8-4.2 ms vs
    0.4-2.0 ad hoc).
    """
    if matches is None or not indexed or not graph:
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

    HNSW's beam holds `max(ef, k)` nodes, and identical vectors are separate nodes at one distance: an
    agent that ran the same task 14 times leaves 14 copies of its vector, and a KNN 100 whose hits come
    from 8 distinct vectors walked the graph with a beam of ~8 distinct points, not 100. Its neighbour
    lists fill with copies too (the heuristic of Malkov & Yashunin 2018, Algorithm 4, prunes a candidate
    only when strictly closer to a kept one, so a copy never prunes another), so the walk can stay in the
    wrong region. So when fewer than CROWDED_SHARE of the hits have distinct distances, the beam is
    widened by the hits-per-distinct-vector ratio (`ceil(max(ef, k) * hits / distinct)`, at most
    EF_CEILING), which gives it back as many distinct points as `ef` would have without copies. A short
    answer (fewer than `k` hits: every document the walk could reach came back) is not widened.

    Measured (RediSearch 2.10.5, HNSW M 16, EF_CONSTRUCTION 200, EF_RUNTIME 100, KNN 100): 4,120 LoCoMo turns
    drawn from 300 distinct ones, each text's copies written together, MiniLM: recall@100 0.847 (one question
    0.00); at EF_RUNTIME 1,500 1.000 (worst question 0.97). Every distinct turn once: 0.968 at EF_RUNTIME 100,
    no distance repeated, never widened.
    """
    if k <= 0 or len(distances) < k:
        return None
    distinct = len(set(distances))
    if distinct >= CROWDED_SHARE * len(distances):
        return None
    base = max(int(ef), int(k))
    wider = min(EF_CEILING, math.ceil(base * len(distances) / max(distinct, 1)))
    return wider if wider > base else None
