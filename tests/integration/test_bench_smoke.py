"""`make bench` with tiny sizes: every phase runs end to end and the result file holds each figure with
its same-run baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_bench

pytestmark = pytest.mark.slow  # spawns processes or servers: `make test-fast` skips it

# the default-embedder phases (recall at two sizes, 1 and 2 clients; ingest of real texts) at a tiny size
TINY_DEFAULT_EMBEDDER = (
    "--recall-sizes",
    "200,400",
    "--recall-clients",
    "1,2",
    "--recall-requests",
    "3",
    "--raw-requests",
    "10",
    "--floor-passes",
    "2",
    "--recall-profile",
    "4",
    "--corpus-texts",
    "48",
    "--ingest-turns",
    "12",
    "--ingest-long",
    "2",
    "--console-requests",
    "3",
)


@pytest.mark.timeout(300)  # the whole perf suite at a tiny size, its services spawned: 25 s measured
def test_perf_suite_tiny(tmp_path):
    out = tmp_path / "results.json"
    proc = run_bench(
        "bench.perf",
        "--embedders",
        "hashing",
        "--workers",
        "1",
        "--ingest-hashing",
        "300",
        "--repeats",
        "2",
        "--sizes",
        "300,600",
        "--requests",
        "64",
        "--clients",
        "4",
        "--quality-queries",
        "10",
        "--ef-sweep",
        "50",
        *TINY_DEFAULT_EMBEDDER,
        "--recall-embedder",
        "hashing",  # the machinery of the default-embedder phases; the model's run is the test below
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(out),
        timeout=280,
    )
    assert "Ingest" in proc.stdout and "Recall" in proc.stdout
    res = json.loads(out.read_text())
    check_default_embedder_phases(res, tmp_path / "cache")
    ingest = res["ingest"][0]
    assert ingest["episodes"] == 300 and ingest["e2e_rate"] > 0 and ingest["raw_hset_rate"] > 0
    assert ingest["ratio_vs_raw"] > 0
    assert ingest["rounds"] == 2 and len(ingest["e2e_rates"]) == len(ingest["raw_hset_rates"]) == 2
    assert ingest["e2e_rate"] == sum(ingest["e2e_rates"]) / 2  # the median of two rounds
    for size in ("300", "600"):
        row = res["index"]["sizes"][size]
        for alg in ("HNSW", "FLAT"):
            assert row[alg]["insert_rate"] > 0
            assert 0.0 <= row[alg]["recall_at_10"] <= 1.0
        assert row["FLAT"]["recall_at_10"] == 1.0  # FLAT is exact
        lat = row["latency"]
        for side in ("service", "raw_ft_search", "numpy_scan"):
            assert lat[side]["p50_ms"] > 0 and lat[side]["qps"] > 0
        assert row["used_memory_bytes_per_episode"] > 0


def check_default_embedder_phases(res: dict, cache: Path) -> None:
    """The recall and ingest-real phases' results: every figure present, positive, with its floor."""
    recall = res["recall"]
    assert recall["corpus"]["real_texts"] == 48 and list(cache.glob("*.npy"))  # embedded once, cached
    assert set(recall["sizes"]) == {"200", "400"}
    for row in recall["sizes"].values():
        assert row["insert_rate"] > 0 and row["raw_ft_search"]["p50_ms"] > 0
        for c in ("1", "2"):
            s = row[c]
            assert s["requests"] == max(3 * int(c), 6)
            assert 0 < s["p50_ms"] <= s["p95_ms"] <= s["p99_ms"] and s["qps"] > 0
            assert s["floor_ms"] > 0 and s["p50_vs_floor"] == s["p50_ms"] / s["floor_ms"]
            assert s["redis_cpu_ms_per_recall"] > 0
    assert recall["qps_large_vs_small"] > 0
    for row in recall["sizes"].values():  # where Redis's time goes: the KNN arm is always among the parts
        profile = row["redis_profile"]
        assert profile["recalls"] == 4 and profile["total_us_per_recall"] > 0
        assert profile["by_part"]["KNN (vector arm, restricted KNN)"]["calls_per_recall"] >= 1
    console = recall["console"]  # the recall playground against the recall it shows, at the largest size
    if "skipped" not in console:
        assert console["size"] == 400 and console["requests"] == 3
        assert (
            console["playground_p50_ms"] > 0
            and console["ratio"] == console["playground_p50_ms"] / console["api_p50_ms"]
        )
    kinds = {r["kind"]: r for r in res["ingest_real"]}
    assert set(kinds) == {"dialogue turns", "2,000-character texts"}
    assert kinds["dialogue turns"]["texts"] == 12 and kinds["2,000-character texts"]["texts"] == 2
    assert kinds["2,000-character texts"]["mean_chars"] == 2000
    for r in kinds.values():
        assert r["e2e_rate"] > 0 and r["embed_rate"] > 0
        assert r["ratio_vs_embedder"] == r["e2e_rate"] / r["embed_rate"]
        assert r["embed_cpu_us_per_text"] > 0 and r["cpu_ratio_vs_embedder"] > 0


def _model_installed() -> bool:
    from shared.embedding import MPNetEmbedder

    return MPNetEmbedder.available()


@pytest.mark.skipif(not _model_installed(), reason="the default model (mpnet) is not installed")
# the model loaded by this process, by the query service and by two workers: 93 s measured at load ~4
@pytest.mark.timeout(420)
def test_default_embedder_phases_tiny(tmp_path):
    out = tmp_path / "results.json"
    run_bench(
        "bench.perf",
        "--phases",
        "recall,ingest-real",
        *TINY_DEFAULT_EMBEDDER,
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(out),
        timeout=400,
    )
    res = json.loads(out.read_text())
    check_default_embedder_phases(res, tmp_path / "cache")
    assert res["recall"]["embedder"] == "mpnet-base-v2"  # `auto` is the model, not the hashing fallback
    assert {r["embedder"] for r in res["ingest_real"]} == {"mpnet-base-v2"}


@pytest.mark.timeout(300)
def test_common_terms_bench_tiny():
    """bench.common_terms at 300 episodes with a threshold high enough that words there are common
    (idf < 3: in more than ~4 episodes): it drops some, and reports shares within [0, 1]."""
    proc = run_bench(
        "bench.common_terms", "--size", "300", "--queries", "6", "--common-idf", "3.0", timeout=280
    )
    res = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert res["size"] == 300 and res["queries"] == 6
    assert res["dropped_terms_per_query"] > 0
    for share in ("same_top10", "top10_overlap", "same_top10_turns"):
        assert 0.0 <= res[share] <= 1.0


@pytest.mark.timeout(300)
def test_common_terms_quality_bench_tiny():
    """bench.common_terms --quality at 5,000 episodes (every LoCoMo turn inside the namespace) with a
    threshold that makes words common there: R@5 <= R@10 within [0, 100] per threshold, and the
    exact row's top 10 is its own."""
    from bench.locomo import DEFAULT_DATA

    if not DEFAULT_DATA.exists():
        pytest.skip(f"LoCoMo's data is not at {DEFAULT_DATA} (read by path, not shipped)")
    args = ["--size", "5000", "--quality", "8", "--common-idf", "3.0"]
    proc = run_bench("bench.common_terms", *args, timeout=280)
    res = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert res["questions"] == 8 and set(res["by_common_idf"]) == {"0.0", "3.0"}
    assert res["by_common_idf"]["0.0"]["same_top10_as_exact"] == 1.0
    for row in res["by_common_idf"].values():
        assert 0.0 <= row["R@5"] <= row["R@10"] <= 100.0


@pytest.mark.timeout(300)
def test_recall_split_bench_tiny(tmp_path):
    """bench.recall_split at 300 episodes, hashing embedder: each mode's row, its parts within its total."""
    out = tmp_path / "split.json"
    args = ["--size", "300", "--queries", "6", "--modes", "hybrid,vector", "--embedder", "hashing"]
    proc = run_bench(
        "bench.recall_split",
        *args,
        "--corpus-texts",
        "48",
        "--cache-dir",
        str(tmp_path),
        "--out",
        str(out),
        timeout=280,
    )
    res = json.loads(out.read_text())
    assert res["size"] == 300 and res["queries"] == 6 and set(res["modes"]) == {"hybrid", "vector"}
    assert "queries on n/a; p50 ms of: model = the query's pass alone" in proc.stdout  # says what it prints
    for row in res["modes"].values():
        assert 0.0 < row["after_p50_ms"] <= row["total_p50_ms"]
        assert 0.0 < row["vector_p50_ms"] <= row["total_p50_ms"]
        assert 0.0 < row["after_share"] <= 1.0 and row["redis_cpu_ms"] > 0.0


@pytest.mark.timeout(120)
def test_duplicate_vectors_bench_tiny():
    """bench.duplicate_vectors at 3,000 episodes: copies widen every walk, distinct vectors none."""
    crowded = run_bench("bench.duplicate_vectors", "--episodes", "3000", "--dim", "64", timeout=100)
    assert "widened 40/40" in crowded.stdout, crowded.stdout
    control = run_bench(
        "bench.duplicate_vectors", "--episodes", "3000", "--dim", "64", "--copies", "1", timeout=100
    )
    assert "widened 0/40" in control.stdout, control.stdout
