"""Which HYBRID_POLICY a pre-filtered KNN runs with, and how deep a checked one asks (shared.hybrid):
pure thresholds."""

from __future__ import annotations

import numpy as np
import pytest

from shared.hybrid import (
    BATCHES_MATCHES,
    BATCHES_SHARE,
    WIDE_MATCHES,
    WIDE_SHARE,
    checked_depth,
    hybrid_policy,
)


@pytest.mark.parametrize(
    ("matches", "indexed", "expected"),
    [
        (90_000, 100_000, "BATCHES"),  # a big tenant: ad hoc scored every one of its vectors
        (36_000, 100_000, "BATCHES"),
        (9_000, 10_000, "BATCHES"),
        (10_000, 100_000, None),  # 10%: both cost the same, the module decides
        (1_000, 100_000, None),  # narrow: batches would walk most of the graph
        (1_000, 10_000, None),
        (1_500, 1_600, None),  # small: scoring every match is cheap
        (0, 100_000, None),
    ],
)
def test_broad_filters_with_many_matches_walk_the_graph_in_batches(matches, indexed, expected):
    assert hybrid_policy(matches, indexed) == expected


def test_the_thresholds_are_inclusive():
    n = 1_000_000
    assert hybrid_policy(int(BATCHES_SHARE * n), n) == "BATCHES"
    assert hybrid_policy(int(WIDE_SHARE * n), n) == "BATCHES"
    assert hybrid_policy(WIDE_MATCHES, int(WIDE_MATCHES / WIDE_SHARE)) == "BATCHES"
    assert hybrid_policy(WIDE_MATCHES - 1, int(WIDE_MATCHES / WIDE_SHARE)) is None
    assert hybrid_policy(BATCHES_MATCHES, int(BATCHES_MATCHES / BATCHES_SHARE)) == "BATCHES"
    assert hybrid_policy(BATCHES_MATCHES - 1, int(BATCHES_MATCHES / BATCHES_SHARE)) is None


@pytest.mark.parametrize(("matches", "indexed"), [(None, 100), (50, None), (50, 0)])
def test_unknown_counts_leave_the_choice_to_the_module(matches, indexed):
    assert hybrid_policy(matches, indexed) is None


def test_a_flat_index_never_runs_in_batches():
    assert hybrid_policy(90_000, 100_000, graph=False) is None


@pytest.mark.parametrize("share", [0.9, 0.93, 0.95, 0.99, 0.999])
@pytest.mark.parametrize("k", [5, 10, 100, 300])
def test_a_checked_search_asks_for_enough_that_k_are_the_scopes(share, k):
    """`checked_depth`: with the scope's documents spread evenly among the others, at least k of the
    n nearest are the scope's in all but ~1 search in 1,000 (a binomial draw per search)."""
    n = checked_depth(k, share)
    assert n >= k / share
    draws = np.random.default_rng(k).binomial(n, share, size=20_000)
    assert (draws < k).mean() < 0.005, (n, (draws < k).mean())


def test_a_scope_holding_the_whole_index_asks_for_k():
    assert [checked_depth(k, 1.0) for k in (1, 10, 100)] == [1, 10, 100]
    assert checked_depth(100, 0.9) < 130  # the over-fetch stays small where checking is used
