"""Which `HYBRID_POLICY` a pre-filtered KNN runs with (pure; `shared.search.knn_search` sends it),
whether its tenancy clauses are checked on the hits instead (`checked_share`), and when a graph walk
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
CHECKED_SHARE = 0.9
CROWDED_SHARE = 0.5
EF_CEILING = 4096


def hybrid_policy(matches: int | None, indexed: int | None, *, graph: bool = True) -> str | None:
    """The `HYBRID_POLICY` of a pre-filtered KNN whose filter matches `matches` of the `indexed`
    documents of an HNSW index (`graph`): `BATCHES` when the filter keeps at least BATCHES_SHARE of the
    index and BATCHES_MATCHES documents, or at least WIDE_SHARE and WIDE_MATCHES; else None (the
    module's choice). None for a FLAT index, or when either count is unknown.

    Why (RediSearch 2.10.5, 384 dims, HNSW M 16, EF_RUNTIME 100, KNN 20, one client; docs/benchmarks.md
    "Filtered KNN"): the module chose ad hoc for every filter measured. Ad hoc costs ~0.3-0.4 µs per
    matching document (90,000 matches: 23-32 ms; 9,000: 3.6 ms; 1,000: 0.2-0.5 ms); batches cost
    ~0.5-0.6 ms at any size when the filter keeps 40-90% of the index, but grow as it narrows (10%:
    2.1-2.3 ms; 1%: 6-15 ms). So batches win for broad filters with many matches and lose for narrow
    ones. On a FLAT index batches never won (20k documents: 2.8-4.2 ms vs 0.4-2.0 ad hoc).
    """
    if matches is None or not indexed or not graph:
        return None
    share = matches / indexed
    if (share >= BATCHES_SHARE and matches >= BATCHES_MATCHES) or (
        share >= WIDE_SHARE and matches >= WIDE_MATCHES
    ):
        return "BATCHES"
    return None


def checked_share(matches: int | None, indexed: int | None) -> float:
    """The scope's share of the index, in (0, 1], when a recall's searches leave the namespace and
    status out of their filter and check them on the hits (`shared.index.Scope.query(checked=True)`,
    `knn_checked`, `bm25_checked`, `knn_union`), else 0.0: when the scope holds at least CHECKED_SHARE
    of the index's `indexed` documents. Either way the answer is the scope's (a checked search with too
    few of the scope's hits is asked again with the filter), so this only predicts which query is
    cheaper; the share is what `checked_depth` is given.

    Why (RediSearch 2.10.5, 100,000 documents of one namespace, 100 LoCoMo questions, SLOWLOG; the
    bench's hashing vectors; docs/benchmarks.md "Checked filters"): each TAG clause of one value that
    most documents hold is a posting list as long as the index, and intersecting it cost more than the
    query it filtered — the KNN 100 arm 1.97 ms with the clauses, 1.25 ms without (namespace and
    status returned), the union of the remembered lists' count 1.15 → 0.18 ms and its KNN 3.19 →
    1.87 ms, the restricted KNN of 100 INKEYS 1.11 → 0.34 ms. Below ~90% a KNN's nearest hits more
    often hold another tenant's document (asked again: two queries) and the union of the remembered
    lists more often exceeds its k (then sorted the slow way), so the filtered query is kept.
    """
    if not matches or not indexed or matches < CHECKED_SHARE * indexed:
        return 0.0
    return min(1.0, matches / indexed)


def checked_depth(k: int, share: float) -> int:
    """How many nearest (or best-scored) documents of the wider set a checked search asks for, so that
    the first `k` of them that are the scope's are its answer: `n = ceil(k / share)` plus three
    standard deviations of the others' count among `n` (a binomial with p = 1 - share, its normal
    approximation), over `share`. `share` is the scope's share of the index (`checked_share`: >= 0.9);
    at 1.0 it is `k`. If the scope's documents sit evenly among the others, fewer than `k` of the `n`
    are the scope's in about 1 search in 1,000 (then it is asked again, filtered); documents of
    another tenant clustered near the query still make it ask again, as they should. Why: asking for
    exactly `k` made a checked KNN 100 at a 95% share all the scope's in 0 of 200 probe queries (0.95^100
    = 0.6%): two queries instead of one (docs/benchmarks.md "Checked filters")."""
    if share >= 1.0:
        return int(k)
    n = math.ceil(k / share)
    return n + math.ceil(3.0 * math.sqrt(n * share * (1.0 - share)) / share)


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

    Measured (RediSearch 2.10.5, HNSW M 16, EF_CONSTRUCTION 200, EF_RUNTIME 100, KNN 100;
    docs/benchmarks.md "Duplicate vectors"): 4,120 LoCoMo turns drawn from 300 distinct ones, each
    text's copies written together, MiniLM: recall@100 0.847 (one question 0.00); at EF_RUNTIME 1,500
    1.000 (worst question 0.97). Every distinct turn once: 0.968 at EF_RUNTIME 100, no distance repeated,
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
