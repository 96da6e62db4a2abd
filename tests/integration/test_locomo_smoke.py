"""The LoCoMo harness end to end on one conversation (hashing embedder), so the path cannot rot:
SDK publish → consolidator process → query-service process → POST /v1/recall → metrics."""

from __future__ import annotations

import json

import pytest

from bench.locomo import DEFAULT_DATA, load, normalise_evidence, question_metrics
from tests.helpers import run_bench, run_module

pytestmark = pytest.mark.slow  # spawns processes or servers: `make test-fast` skips it


def test_metrics_by_hand():
    m = question_metrics(["a", "x", "b", "y"], ["a", "b"])
    assert m["R@5"] == 100.0 and m["hit@1"] == 100.0
    assert question_metrics(["x", "a"], ["a", "b"])["R@5"] == 50.0
    assert question_metrics(["x", "a"], ["a"])["hit@1"] == 0.0
    # NDCG@10 of one relevant item at rank 2 = 1/log2(3)
    assert abs(question_metrics(["x", "a"], ["a"])["NDCG@10"] - 100 / 1.5849625) < 1e-3


def test_evidence_quirks():
    known = {"D1:3", "D2:10", "D10:1"}
    assert normalise_evidence(["D1:3; D2:10", "D:10:01", "D9:9", ""], known) == ["D1:3", "D2:10", "D10:1"]


@pytest.mark.skipif(not DEFAULT_DATA.exists(), reason="LoCoMo data not present")
@pytest.mark.timeout(
    240
)  # the LoCoMo harness spawns the workers and query service and ingests: 21 s measured
def test_locomo_harness_end_to_end(tmp_path):
    out = tmp_path / "locomo.json"
    proc = run_bench(
        "bench.locomo",
        "--conversations",
        "1",
        "--questions",
        "40",
        "--embedder",
        "hashing",
        "--configs",
        "quick",
        "--bootstrap",
        "100",
        "--out",
        str(out),
        timeout=220,
    )
    assert "DRAGON" in proc.stdout and "R@5" in proc.stdout
    res = json.loads(out.read_text())
    n_turns = len(load(DEFAULT_DATA, conversations=1)[0].turns)
    assert res["ingest"]["episodes"] == n_turns
    rows = res["rows"]
    vector = rows["Engram vector · similarity-only"]["overall"]
    bm25 = rows["BM25 (rank_bm25, harness)"]["overall"]
    assert vector["n"] == 40
    # random ranking of ~400 turns would give R@50 ≈ 12; the hashing embedder reaches ~60 on this data
    assert vector["R@50"]["mean"] > 35, vector
    assert bm25["R@10"]["mean"] > 25, bm25
    for row in rows.values():
        o = row["overall"]
        assert 0 <= o["R@5"]["mean"] <= o["R@10"]["mean"] <= o["R@25"]["mean"] <= o["R@50"]["mean"] <= 100
        lo, hi = o["R@5"]["ci95"]
        assert lo <= o["R@5"]["mean"] <= hi


def test_missing_data_exits_zero(tmp_path):
    proc = run_module("bench.locomo", "--data", str(tmp_path / "nope.json"), timeout=60)
    assert proc.returncode == 0 and "not found" in proc.stdout
