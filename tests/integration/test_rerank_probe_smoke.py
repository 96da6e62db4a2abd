"""The re-ranking probe (bench/rerank_probe.py) end to end on two small conversations with the hashing
embedder, so its collect → evaluate path cannot rot: the default variant equals a plain top_k 50 recall
and a neighbour weight of 0 leaves the service's order unchanged."""

from __future__ import annotations

import json

import pytest

from bench.locomo import DEFAULT_DATA
from tests.helpers import run_bench

pytestmark = pytest.mark.slow  # spawns processes or servers: `make test-fast` skips it


@pytest.mark.skipif(not DEFAULT_DATA.exists(), reason="LoCoMo data not present")
@pytest.mark.timeout(300)  # ingests a LoCoMo conversation, runs the service twice and re-ranks: 29 s measured
def test_rerank_probe_end_to_end(tmp_path):
    cache = tmp_path / "cache"
    small = ["--conversations", "2", "--questions", "6", "--cache", str(cache)]
    run_bench("bench.rerank_probe", "collect", "--embedder", "hashing", *small, timeout=280)
    raw = json.loads(cache.with_suffix(".json").read_text())
    default = raw["variants"]["default"]
    assert len(default) == 12 and all(len(r["ids"]) == 50 for r in default)
    # prefix stability: the top_k 100 list starts with the top_k 50 one
    assert all(
        a["ids"] == b["ids"][:50] for a, b in zip(default, raw["variants"]["default, top_k 100"], strict=True)
    )

    from bench.rerank_probe import Data, rerank_neighbours

    args = type(
        "Args",
        (),
        {
            "data": DEFAULT_DATA,
            "cache": cache,
            "conversations": 2,
            "questions": 6,
            "tune": 1,
            "split": "first",
        },
    )()
    data = Data(args)
    assert rerank_neighbours(data, 50, 0.0, default) == [r["ids"] for r in default]
    proc = run_bench("bench.rerank_probe", "evaluate", "--tune", "1", *small, timeout=120)
    assert "neighbour-turn context" in proc.stdout and "| service: default |" in proc.stdout
