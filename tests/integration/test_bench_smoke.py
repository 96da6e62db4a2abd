"""`make bench` with tiny sizes: every phase runs end to end and the result file holds each figure with
its same-run baseline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # spawns processes or servers: `make test-fast` skips it

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)  # the whole perf suite at a tiny size, its services spawned: 25 s measured
def test_perf_suite_tiny(tmp_path):
    out = tmp_path / "results.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
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
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Ingest" in proc.stdout and "Recall" in proc.stdout
    res = json.loads(out.read_text())
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


@pytest.mark.timeout(180)  # three services spawned and a private Redis: ~15 s measured
def test_query_batch_bench_tiny():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.query_batch",
            "--embedder",
            "hashing",
            "--episodes",
            "20",
            "--requests",
            "8",
            "--rounds",
            "2",
            "--clients",
            "2",
            "--timeout",
            "120",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ENGRAM_QUERY_BATCH=1" in proc.stdout and "ENGRAM_QUERY_BATCH=32" in proc.stdout
    assert "recalls/s x" in proc.stdout
