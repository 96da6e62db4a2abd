"""bench.common_terms' quality measure: R@k over copies of LoCoMo turns in the derived corpus."""

from __future__ import annotations

import pytest

from bench.common_terms import evidence_questions, recall_at
from bench.locomo import DEFAULT_DATA


def test_recall_at_counts_a_copy_as_its_turn_once():
    # 10 turns: t-13 is a copy of turn 3, t-3 the turn itself, t-29 turn 9; turn 5 is never found
    top = ["t-13", "t-3", "t-7", "t-29", "t-1"]
    assert recall_at(top, {3, 5}, 10, 5) == 50.0
    assert recall_at(top, {3, 5}, 10, 1) == 50.0
    assert recall_at(top, {7, 5}, 10, 2) == 0.0
    assert recall_at(top, {7, 5, 3}, 10, 3) == pytest.approx(200.0 / 3)
    assert recall_at(top, {7, 9, 3}, 10, 4) == 100.0


@pytest.mark.skipif(not DEFAULT_DATA.exists(), reason="LoCoMo's data is read by path, not shipped")
def test_evidence_questions_point_at_their_turns():
    from bench.perf_corpus import real_texts

    turns, _, _ = real_texts()
    qs = evidence_questions(turns, 50)
    assert len(qs) == 50
    assert all(evidence and max(evidence) < len(turns) for _, evidence in qs)
    assert len({q for q, _ in qs}) > 40  # distinct questions, not one repeated


def test_paired_delta_of_identical_runs_is_zero_and_of_a_shift_is_the_shift():
    from bench.common_terms import paired_delta

    exact = [(float(i % 3) * 50, 100.0) for i in range(30)]
    assert paired_delta(exact, exact) == {"dR@5": [0.0, 0.0, 0.0], "dR@10": [0.0, 0.0, 0.0]}
    worse = [(a, b - 10.0) for a, b in exact]
    assert paired_delta(exact, worse)["dR@10"] == [-10.0, -10.0, -10.0]
