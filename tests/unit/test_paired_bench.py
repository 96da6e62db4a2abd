"""bench.paired: two result files compared question by question (pure; no Redis)."""

from __future__ import annotations

import json

import pytest

from bench import paired


def locomo_result(values: list[float]) -> dict:
    return {
        "rows": {"Engram default": {"overall": {}, "per_question": [{"R@5": v, "R@10": v} for v in values]}}
    }


def test_a_paired_difference_is_exact_and_its_interval_narrow(tmp_path):
    a = [0.0, 100.0] * 50  # two runs whose own means (50 vs 51) have wide intervals
    b = [0.0, 100.0] * 50
    b[0] = 100.0  # one question more found in B
    result = paired.compare(
        paired.per_question_rows(locomo_result(a)), paired.per_question_rows(locomo_result(b))
    )
    r5 = result["Engram default"]["R@5"]
    assert (r5["a"], r5["b"], r5["diff"]) == (50.0, 51.0, 1.0)
    lo, hi = r5["diff_ci95"]
    assert 0.0 <= lo <= 1.0 <= hi <= 3.0  # the 99 unchanged questions carry no noise
    for name, data in (("a.json", locomo_result(a)), ("b.json", locomo_result(b))):
        (tmp_path / name).write_text(json.dumps(data))
    assert paired.main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--metrics", "R@5"]) == 0


def test_bfcl_rows_are_named_by_evaluation_and_relevance():
    result = {"evaluations": {"memory": {"relevance": {"turn": {"per_question": [{"R@1": 1.0}]}}}}}
    assert paired.per_question_rows(result) == {"memory · turn": [{"R@1": 1.0}]}


def test_files_without_per_question_results_or_other_questions_are_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="no per-question results"):
        paired.per_question_rows({"rows": {"x": {"overall": {}}}})
    with pytest.raises(ValueError, match="3 questions in the first file, 2 in the second"):
        paired.compare(
            paired.per_question_rows(locomo_result([1, 2, 3])),
            paired.per_question_rows(locomo_result([1, 2])),
        )
    (tmp_path / "old.json").write_text(json.dumps({"rows": {"x": {"overall": {}}}}))
    assert paired.main([str(tmp_path / "old.json"), str(tmp_path / "old.json")]) == 2
    assert "rerun the benchmark" in capsys.readouterr().err
