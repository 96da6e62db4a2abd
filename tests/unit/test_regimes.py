"""Regimes of time-ordered outcomes (shared.regimes): flips of the outcomes or of one strategy's."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import hypergeom

from shared.regimes import (
    CURRENT,
    EVIDENCE,
    STALE,
    _fisher,
    _fisher_one,
    flip,
    last_regime,
    segments,
    superseded,
)

S, F = True, False


def test_outcome_flips_and_bad_luck():
    assert segments([S] * 5 + [F] * 5, None, 3) == [(0, 5), (5, 10)]
    assert segments([S] * 30 + [F] * 20, None, 3) == [(0, 30), (30, 50)]
    assert segments([S] * 3 + [F] * 3, None, 3) == [(0, 3), (3, 6)]  # p = 0.05
    assert segments([S, S, F, F, F, F], None, 3) == [(0, 6)]  # 2 of 3 then 0 of 3: p = 0.2
    assert segments([S] * 10 + [F] * 10 + [S] * 5, None, 3) == [(0, 10), (10, 20), (20, 25)]
    assert segments([], None, 3) == [] and segments([S, F], None, 3) == [(0, 2)]
    # a real change that does not make the old advice wrong (90% -> 60%) is no flip
    assert len(segments([S] * 9 + [F] + [S, S, F, S, F] * 4, None, 3)) == 1


def test_the_fisher_tails_are_scipys_hypergeometric_tails():
    """Every (total, total_wins, m) of up to 12 rows and a spread of larger ones (110: a recall's pool),
    at every k of the support, both directions: within 1e-9 of scipy, relative."""
    grid = [(t, w, m) for t in range(1, 13) for w in range(t + 1) for m in range(t + 1)]
    grid += [
        (t, w, m) for t in (40, 110, 333) for w in range(0, t + 1, t // 10) for m in range(0, t + 1, t // 10)
    ]
    worst = 0.0
    for total, wins, m in grid:
        k = np.arange(max(0, m - (total - wins)), min(wins, m) + 1)  # support bounds included
        for down in (True, False):
            ref = hypergeom.sf(k - 1, total, wins, m) if down else hypergeom.cdf(k, total, wins, m)
            one = [_fisher_one(int(i), m, total, wins, down) for i in k]
            for got in (_fisher(k, m, total, wins, down), np.array(one)):
                worst = max(worst, float((np.abs(got - ref) / ref).max()))
    assert worst < 1e-9
    assert abs(_fisher_one(3, 3, 6, 3, True) - 0.05) < 1e-15  # 3 of 3, then 0 of 3: 1 / C(6, 3)
    assert np.allclose(_fisher([4, 0, 2], [4, 0, 3], [8, 6, 6], [4, 0, 6], True), [1 / 70, 1.0, 1.0], 1e-12)


def test_equal_p_values_are_ranked_by_the_difference():
    """0 of 4 then 13 of 16, and 1 of 6 then 12 of 14, are both p = 7/969: the larger difference cuts."""
    ok = [F] * 4 + [S, F] + [S] * 8 + [F] * 2 + [S] * 4
    assert segments(ok, None, 4) == [(0, 4), (4, 20)]


def test_a_strategy_flip_while_the_overall_rate_holds():
    """X: 5 successes, then 5 failures while Y succeeds 5 times (100% then 50% overall)."""
    ok = [S] * 5 + [F, S] * 5
    strategies = ["X"] * 5 + ["X", "Y"] * 5
    assert segments(ok, None, 3) == [(0, 15)]  # outcomes alone: no flip
    assert segments(ok, strategies, 3) == [(0, 5), (5, 15)]
    assert last_regime(ok, strategies, 3) == 5
    assert flip(ok[:5], ok[5:], strategies[:5], strategies[5:], 3)[0]


def test_a_short_tool_history_is_not_charged_for_the_whole_sequence():
    """pip: 6 of 6, then 0 of 3 while uv succeeds 3 times (p = 0.012 over pip's 4 split positions)."""
    ok = [S] * 6 + [F, S] * 3
    tools = ["pip"] * 6 + ["pip", "uv"] * 3
    assert segments(ok, tools, 3) == [(0, 6), (6, 12)]
    assert segments([S] * 6 + [F] * 3, None, 3) == [(0, 6), (6, 9)]


def test_long_runs_of_chance_with_several_strategies_are_rarely_cut():
    rng = random.Random(3)
    rows = [[(rng.random() < 0.5, rng.choice("XYZ")) for _ in range(60)] for _ in range(200)]
    cut = sum(len(segments([o for o, _ in r], [t for _, t in r], 3)) > 1 for r in rows)
    assert cut <= 10  # measured 2 of 300


def test_long_runs_of_chance_are_rarely_cut():
    rng = random.Random(7)
    cut = sum(len(segments([rng.random() < 0.5 for _ in range(60)], None, 3)) > 1 for _ in range(200))
    assert cut <= 10  # measured 1-2%: the scan is Bonferroni-corrected
    long = [rng.random() < 0.9 for _ in range(1000)] + [F] * 6  # a tool broke after 1000 episodes
    assert 995 <= last_regime(long, None, 3) <= 1000  # (where chance ended the 90% run just before)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["X", "Y", None])), max_size=40), st.integers(1, 5))
def test_property_regimes_cover_the_sequence_and_neighbours_are_flips(rows, min_size):
    ok = [o for o, _ in rows]
    strategies = [s for _, s in rows]
    parts = segments(ok, strategies, min_size)
    assert parts == segments(ok, strategies, min_size)
    if not rows:
        return
    assert parts[0][0] == 0 and parts[-1][1] == len(rows)
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))
    if len(parts) > 1:
        assert all(b - a >= min_size for a, b in parts)
        for (a, c), (_, b) in zip(parts, parts[1:], strict=False):
            assert flip(ok[a:c], ok[c:b], strategies[a:c], strategies[c:b], min_size)[0]


def switch(week1: list[tuple[str, bool]], week2: list[tuple[str, bool]]) -> tuple[list, list, list, list]:
    """Rows of `superseded` (times, success, marks, key): each tool's words mark its rows."""
    rows = [(t, ok, 0) for t, ok in week1] + [(t, ok, 1) for t, ok in week2]
    times = [w * 1000.0 + i for i, (_, _, w) in enumerate(rows)]
    return times, [ok for _, ok, _ in rows], [{t, "install"} for t, _, _ in rows], [0.5] * len(rows)


def test_an_approach_that_stopped_working_is_superseded():
    """pip: 8 successes, then 4 failures while uv succeeds 6 times."""
    rows = switch([("pip", S)] * 8, [("pip", F), ("uv", S)] * 4 + [("uv", S)] * 2)
    role = superseded(*rows, 3).tolist()
    assert role[:8] == [STALE] * 8  # what used to work
    assert [r for r, ok in zip(role[8:], rows[1][8:], strict=True) if ok] == [CURRENT] * 6
    assert role[8:].count(EVIDENCE) == 1 and role[8 + 6] == EVIDENCE  # the newest of equal keys
    # the evidence is the most relevant failure
    key = [0.5] * 18
    key[8] = 0.9
    assert superseded(rows[0], rows[1], rows[2], key, 3)[8] == EVIDENCE
    assert superseded(*rows[:3], key, 3).tolist().count(EVIDENCE) == 1


def test_nothing_is_superseded_without_a_change_or_an_alternative():
    def none_of(week1, week2):
        return not superseded(*switch(week1, week2), 3).any()

    assert none_of([("pip", S)] * 8, [("pip", S)] * 3 + [("pip", F)] + [("uv", S)] * 3 + [("pip", S)] * 3)
    assert none_of([("pip", S)] * 8, [("pip", F)] * 5)  # it stopped working, nothing else works either
    assert none_of([("pip", S)] * 8, [("pip", F), ("uv", S)] * 2)  # 2 failures: bad luck, not a regime
    assert none_of([("pip", S)] * 6, [("pip", F)] * 4 + [("pip", S)] * 6 + [("uv", S)] * 3)  # works again
    assert none_of([("pip", F)] * 6, [("pip", S), ("uv", F)] * 4)  # the reverse: pip works now
    assert not superseded([], [], [], [], 3).any()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([True, False, None]), st.sampled_from(["X", "Y", "Z"])), max_size=40)
)
def test_property_roles_fit_the_outcomes(rows):
    success = [ok for ok, _ in rows]
    role = superseded(list(range(len(rows))), success, [{t} for _, t in rows], [0.0] * len(rows), 3)
    assert (
        role.tolist()
        == superseded(list(range(len(rows))), success, [{t} for _, t in rows], [0.0] * len(rows), 3).tolist()
    )
    for r, ok in zip(role, success, strict=True):
        assert {STALE: ok is True, CURRENT: ok is True, EVIDENCE: ok is False}.get(int(r), True)
    assert (EVIDENCE in role) == (STALE in role) == (CURRENT in role)
