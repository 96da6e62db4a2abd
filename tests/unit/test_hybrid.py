"""Which HYBRID_POLICY a pre-filtered KNN runs with, and when a crowded one is asked again with a wider
beam (services.query.recall.arms): pure thresholds."""

from __future__ import annotations

import pytest

from services.query.recall.arms import (
    BATCHES_MATCHES,
    BATCHES_SHARE,
    EF_CEILING,
    WIDE_MATCHES,
    WIDE_SHARE,
    hybrid_policy,
    widened_ef,
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


def test_an_empty_index_leaves_the_choice_to_the_module():
    assert hybrid_policy(50, 0) is None


def test_an_answer_of_distinct_vectors_is_not_widened():
    assert widened_ef([0.1 * i for i in range(100)], 100, 100) is None


def test_a_short_answer_is_not_widened():
    """Fewer hits than k: the walk returned every document it could reach, copies or not."""
    assert widened_ef([0.2] * 40, 100, 100) is None


def test_copies_widen_the_beam_by_the_hits_per_distinct_vector():
    distances = [d for d in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8) for _ in range(13)][:100]
    assert widened_ef(distances, 100, 100) == 1_250  # 100 hits of 8 distances: 100 * 100 / 8
    assert widened_ef(distances, 100, 300) == 3_750  # the index's EF_RUNTIME is the base when larger


def test_the_beam_is_widened_only_when_copies_crowd_it():
    half = [0.01 * (i // 2) for i in range(100)]  # 50 distinct distances of 100: CROWDED_SHARE exactly
    assert widened_ef(half, 100, 100) is None
    assert widened_ef(half[:98] + [0.0, 0.0], 100, 100) == 205  # 49 distinct: ceil(100 * 100 / 49)


def test_the_widened_beam_is_bounded():
    assert widened_ef([0.5] * 100, 100, 100) == EF_CEILING
    assert widened_ef([0.5] * 5, 5, 10) == 50


@pytest.mark.parametrize(("algorithm", "graph_ef"), [("HNSW", 100), ("FLAT", 0)])
def test_recall_and_context_tell_their_knn_the_graphs_beam(algorithm, graph_ef):
    """Only an HNSW index's KNN is widened (a FLAT one is exact: copies cannot hide anything)."""
    from services.query import models
    from services.query.views.recall import context_params, recall_params
    from shared.settings import Settings

    s = Settings().with_(vector_algorithm=algorithm, hnsw_ef_runtime=100)
    assert recall_params(models.RecallRequest(query="q"), s, 0.0).graph_ef == graph_ef
    assert context_params(models.ContextRequest(task="t"), s, 0.0).graph_ef == graph_ef
