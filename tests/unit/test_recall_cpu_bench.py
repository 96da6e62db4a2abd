"""bench.recall_cpu's pieces that decide what its numbers mean: the per-round ratios and the sampler."""

from __future__ import annotations

import time

from bench.recall_cpu import Sampler, summary


def _run(size, rnd, tree, py, redis):
    row = {"python_cpu_ms": py, "python_cpu_p50_ms": py, "redis_cpu_ms": redis, "wall_ms": 2 * py}
    return {"size": size, "round": rnd, "tree": tree, "cold": row, "warm": row}


def test_summary_takes_the_median_of_per_round_ratios():
    # round 0 ran at twice the load of round 1: its ratio is still 0.5, the medians of each side are not
    runs = [
        _run(10, 0, "head", 10.0, 4.0),
        _run(10, 0, "base", 20.0, 4.0),
        _run(10, 1, "base", 10.0, 2.0),
        _run(10, 1, "head", 5.0, 2.0),
        _run(10, 2, "head", 9.0, 3.0),
        _run(10, 2, "base", 12.0, 3.0),
    ]
    got = summary(runs)["10 warm"]
    assert got["ratio_python_cpu_ms"] == 0.5  # of 0.5, 0.5, 0.75
    assert got["head_python_cpu_ms"] == 9.0 and got["base_python_cpu_ms"] == 12.0
    assert got["ratio_redis_cpu_ms"] == 1.0


def test_summary_without_a_base_has_no_ratio():
    got = summary([_run(10, 0, "head", 10.0, 4.0)])["10 cold"]
    assert got["head_python_cpu_ms"] == 10.0 and not any(k.startswith("ratio") for k in got)


def _spin(until: float) -> int:
    n = 0
    while time.perf_counter() < until:
        n += 1
    return n


def test_sampler_sees_where_the_main_thread_spends_its_cpu():
    with Sampler() as sampler:
        _spin(time.perf_counter() + 0.2)
    report = sampler.report()
    assert report["samples"] > 20
    own = report["own_pct"]
    assert any(name.endswith(" _spin") and share > 50 for name, share in own.items()), own
