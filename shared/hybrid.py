"""Which `HYBRID_POLICY` a pre-filtered KNN runs with (pure; `shared.index.knn_search` sends it).

RediSearch answers `(filter)=>[KNN k ...]` either ad hoc (score every document the filter matches:
exact, cost linear in the matches) or in batches (walk the HNSW graph and filter each batch of
neighbours: cost grows as the filter gets narrower). The module's own choice was measured to be wrong
for broad filters, the common case of a memory service whose big tenants are its active ones.
"""

from __future__ import annotations

HYBRID_POLICIES = frozenset({"BATCHES", "ADHOC_BF"})
BATCHES_SHARE = 0.25
BATCHES_MATCHES = 2_000
WIDE_SHARE = 0.05
WIDE_MATCHES = 20_000


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
