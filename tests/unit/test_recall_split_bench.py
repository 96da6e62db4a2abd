"""bench.recall_split's summary: what its columns mean."""

from __future__ import annotations

import pytest

from bench.recall_split import summarize


def test_summary_is_the_median_of_each_timing_in_ms():
    got = summarize(
        {
            "model": [0.010, 0.014, 0.012],
            "vector": [0.013, 0.016, 0.015],
            "after": [0.008, 0.010, 0.009],
            "total": [0.021, 0.026, 0.024],
        }
    )
    assert got == {
        "model_p50_ms": 12.0,
        "vector_p50_ms": 15.0,
        "after_p50_ms": 9.0,
        "total_p50_ms": 24.0,
        "after_share": 0.375,
    }


def test_a_timing_without_samples_is_refused():
    with pytest.raises(ValueError, match="no after timing"):
        summarize({"model": [0.01], "vector": [0.01], "after": [], "total": [0.02]})
