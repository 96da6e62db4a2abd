"""Unit tests of services.query.recall.score: hand-computed values, presets, ordering, properties. No I/O."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.locomo import rrf
from engram_episodic.events import OUTCOMES
from services.query.recall import score as scoring
from services.query.recall.score import (
    AUTO_EARLY_BELOW,
    AUTO_NORMAL_BELOW,
    MINMAX_CONSTANT,
    PRESETS,
    SUPERSEDED_GAP,
    Candidates,
    Weights,
    learning_curve,
    minmax,
    outcome_scores,
    replay_context,
    resolve_weights,
    score,
)
from shared.regimes import CURRENT, EVIDENCE, STALE

HOUR = 3600.0
DAY = 86400.0
NOW = 1_750_000_000.0  # 2025-06-15T15:06:40Z
ONLY_RECENCY = Weights(similarity=0, recency=1, reward=0, outcome=0)


UNKNOWN = {"cos": 0.0, "last_accessed": np.nan, "reward": np.nan, "outcome_score": 0.0, "importance": np.nan}


def candidates(n: int = 1, **overrides) -> Candidates:
    """A factory: n candidates completed at NOW with nothing else known (no regime, no tie-break), plus
    `overrides` (sequences, made float64 arrays as the pool's columns are)."""
    fields = {"completed_at": np.full(n, NOW), "regime": np.zeros(n), "tie": np.full(n, np.nan)}
    fields.update({name: np.full(n, value) for name, value in UNKNOWN.items()})
    fields.update({name: np.array(value, dtype=np.float64) for name, value in overrides.items()})
    return Candidates(**fields)


# --- recency decay: the seed's hand table (half-life one day) ---------------------------------------


@pytest.mark.parametrize(
    ("age", "expected"),
    [
        (0.0, 1.0),
        (12 * HOUR, 0.7071),
        (DAY, 0.50),
        (2 * DAY, 0.25),
        (7 * DAY, 0.0078),
    ],
)
def test_recency_hand_table(age, expected):
    scored = score(candidates(completed_at=[NOW - age]), ONLY_RECENCY, half_life=DAY, as_of=NOW)
    assert scored.recency[0] == pytest.approx(expected, abs=5e-5)
    assert scored.priority[0] == pytest.approx(expected, abs=5e-5)


def test_recency_exact_powers_of_two():
    ages = np.array([12 * HOUR, DAY, 2 * DAY, 7 * DAY])
    scored = score(candidates(4, completed_at=NOW - ages), ONLY_RECENCY, half_life=DAY, as_of=NOW)
    assert scored.recency == pytest.approx([2**-0.5, 0.5, 0.25, 2**-7], rel=1e-12)


def test_future_timestamps_are_clamped_to_age_zero():
    c = candidates(2, completed_at=[NOW + DAY, NOW + 10 * DAY])
    scored = score(c, ONLY_RECENCY, half_life=DAY, as_of=NOW)
    assert scored.age.tolist() == [0.0, 0.0]
    assert scored.recency.tolist() == [1.0, 1.0]


def test_as_of_in_the_past_measures_from_that_instant():  # C17: decay from `as_of`, not from now
    c = candidates(completed_at=[NOW - 2 * DAY])
    scored = score(c, ONLY_RECENCY, half_life=DAY, as_of=NOW - DAY)
    assert scored.recency[0] == pytest.approx(0.5)


def test_recency_from_last_access_falls_back_to_completed_at():
    c = candidates(2, completed_at=[NOW - 2 * DAY, NOW - 2 * DAY], last_accessed=[NOW - DAY, np.nan])
    by_access = score(c, ONLY_RECENCY, half_life=DAY, as_of=NOW, recency_from="last_access")
    assert by_access.recency == pytest.approx([0.5, 0.25])
    by_completion = score(c, ONLY_RECENCY, half_life=DAY, as_of=NOW)
    assert by_completion.recency == pytest.approx([0.25, 0.25])


# --- the full priority formula, by hand --------------------------------------------------------------


def test_priority_by_hand():
    w = Weights(similarity=0.4, recency=0.3, reward=0.2, outcome=0.1, importance=0.5)
    c = candidates(
        3,
        cos=[0.8, -0.3, 1.0],
        completed_at=[NOW - DAY, NOW - 2 * DAY, NOW],
        reward=[0.6, 1.7, np.nan],
        outcome_score=outcome_scores(["success", "partial", None]),
        importance=[7, np.nan, 10],
    )
    s = score(c, w, half_life=DAY, as_of=NOW)
    # 0.4*0.8 + 0.3*0.5 + 0.2*0.6 + 0.1*1 + 0.5*0.7 = 0.32 + 0.15 + 0.12 + 0.10 + 0.35
    # 0.4*0   + 0.3*0.25 + 0.2*1 + 0.1*0.5 + 0       = 0 + 0.075 + 0.2 + 0.05
    # 0.4*1   + 0.3*1   + 0      + 0       + 0.5*1   = 0.4 + 0.3 + 0.5
    assert s.priority == pytest.approx([1.04, 0.325, 1.2])
    assert s.similarity.tolist() == [pytest.approx(0.8), 0.0, 1.0]
    assert s.reward_term == pytest.approx([0.2 * 0.6, 0.2 * 1.0, 0.0])  # clipped, missing 0
    assert s.outcome_term == pytest.approx([0.1, 0.05, 0.0])
    assert s.similarity_term == pytest.approx([0.32, 0.0, 0.4])
    assert s.recency_term == pytest.approx([0.15, 0.075, 0.3])
    assert s.importance_term == pytest.approx([0.35, 0.0, 0.5])
    assert s.order.tolist() == [2, 0, 1]
    assert s.breakdown(0) == pytest.approx(
        {
            "priority": 1.04,
            "similarity": 0.32,
            "recency": 0.15,
            "reward": 0.12,
            "outcome": 0.1,
            "importance": 0.35,
        }
    )


def test_superseded_successes_rank_below_what_works_now():
    """Old successes of a superseded approach (relevance 0.9) below the successes of the approach that
    replaced it (0.7, 0.7), its most relevant recent failure (0.6) right after the best of those."""
    w = PRESETS["normal"]
    c = candidates(
        6,
        cos=[0.9, 0.9, 0.7, 0.7, 0.6, 0.5],
        completed_at=[NOW - 9 * DAY, NOW - 8 * DAY, NOW - DAY, NOW - 2 * DAY, NOW - 3 * DAY, NOW - 4 * DAY],
        reward=[1.0, 1.0, 1.0, 1.0, 0.0, 0.0],
        outcome_score=[1.0, 1.0, 1.0, 1.0, 0.0, 0.0],
        regime=[STALE, STALE, CURRENT, CURRENT, EVIDENCE, 0],
    )
    s = score(c, w, half_life=DAY, as_of=NOW)
    assert s.order.tolist() == [2, 4, 3, 1, 0, 5]  # 0.9 - 0.25 still above an unrelated 0.5
    assert s.priority[4] == s.priority[2] and s.breakdown(4)["regime"] > 0
    assert s.regime_term[0] == pytest.approx(-(0.03 + 0.02 + 0.9 * SUPERSEDED_GAP))
    assert "regime" not in s.breakdown(5) and s.regime_term[5] == 0.0
    # the lift is bounded: a failure far less relevant stays where it is
    far = score(
        candidates(2, cos=[0.9, 0.1], outcome_score=[1.0, 0.0], regime=[CURRENT, EVIDENCE]),
        w,
        half_life=DAY,
        as_of=NOW,
    )
    assert far.regime_term[1] == pytest.approx(0.9 * SUPERSEDED_GAP) and far.priority[1] < far.priority[0]
    # what replaced a superseded success takes its place, however less relevant (the pool found it of
    # the same task), and no more: an unrelated episode above both stays above
    near = score(
        candidates(3, cos=[0.95, 0.5, 0.99], outcome_score=[1.0, 1.0, 0.0], regime=[STALE, CURRENT, 0]),
        w,
        half_life=DAY,
        as_of=NOW,
    )
    assert near.order.tolist() == [2, 1, 0]
    assert near.priority[1] == pytest.approx(near.priority[0] - near.regime_term[0])


def test_missing_fields_contribute_nothing():
    w = Weights(similarity=1, recency=0, reward=1, outcome=1, importance=1)
    s = score(candidates(2), w, half_life=DAY, as_of=NOW)
    assert s.priority.tolist() == [0.0, 0.0]


def test_nan_cos_counts_as_zero():
    c = candidates(2, cos=[np.nan, 0.5])
    s = score(c, Weights(similarity=1, recency=0, reward=0, outcome=0), half_life=DAY, as_of=NOW)
    assert s.priority.dtype == np.float64
    assert s.priority.tolist() == [0.0, 0.5]


def test_outcome_scores():
    scores = outcome_scores(["success", "partial", "failure", "abandoned", None, "unknown", "SUCCESS"])
    assert scores.tolist() == [1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert scores.dtype == np.float64
    assert outcome_scores([]).shape == (0,)
    assert set(OUTCOMES) <= set(scoring.OUTCOME_SCORES)


def test_empty_candidate_set():
    s = score(candidates(0), PRESETS["normal"], half_life=DAY, as_of=NOW, normalize="minmax")
    assert s.priority.size == 0 and s.order.tolist() == []


@pytest.mark.parametrize("normalize", ["none", "minmax"])
def test_results_are_read_only_and_inputs_untouched(normalize):
    c = candidates(3, cos=[0.5, 0.45, 0.2], outcome_score=[1.0, 0.0, 0.5], regime=[CURRENT, EVIDENCE, 0])
    before = {f.name: getattr(c, f.name).copy() for f in dataclasses.fields(c)}
    s = score(c, PRESETS["early"], half_life=DAY, as_of=NOW, normalize=normalize)
    for name, values in before.items():
        np.testing.assert_array_equal(getattr(c, name), values)
    for f in dataclasses.fields(s):
        with pytest.raises(ValueError):
            getattr(s, f.name)[0] = 1


# --- ordering ----------------------------------------------------------------------------------------


def test_the_newer_of_two_equal_episodes_ranks_higher():
    """Case C20: of two episodes equal in similarity, reward and outcome, the newer one ranks higher."""
    c = candidates(
        2,
        cos=[0.7, 0.7],
        completed_at=[NOW - 2 * DAY, NOW - DAY],
        reward=[0.5, 0.5],
        outcome_score=outcome_scores(["success", "success"]),
    )
    for name, w in PRESETS.items():
        for normalize in ("none", "minmax"):
            s = score(c, w, half_life=DAY, as_of=NOW, normalize=normalize)
            assert s.order.tolist() == [1, 0], (name, normalize)
            assert s.priority[1] > s.priority[0]


def test_order_ties_broken_by_recency_then_index():
    # equal priority everywhere: recency carries no weight, similarity is the same
    w = Weights(similarity=1, recency=0, reward=0, outcome=0)
    c = candidates(4, cos=[0.5] * 4, completed_at=[NOW - DAY, NOW, NOW - DAY, NOW])
    s = score(c, w, half_life=DAY, as_of=NOW)
    assert s.order.tolist() == [1, 3, 0, 2]


def test_order_tie_break_survives_recency_underflow():
    # both recencies underflow to 0.0; the younger still ranks first
    w = Weights(similarity=1, recency=1, reward=0, outcome=0)
    c = candidates(2, completed_at=[NOW - 5000 * DAY, NOW - 4000 * DAY])
    s = score(c, w, half_life=1.0, as_of=NOW)
    assert s.recency.tolist() == [0.0, 0.0]
    assert s.order.tolist() == [1, 0]


# --- min-max normalisation (Generative Agents' variant) ---------------------------------------------


def test_minmax_by_hand():
    assert minmax(np.array([2.0, 4.0, 3.0])).tolist() == [0.0, 1.0, 0.5]


@pytest.mark.parametrize("values", [[0.3, 0.3, 0.3], [0.0], [7.0], [0.0, 0.0]])
def test_minmax_constant_signal_is_midpoint_not_nan(values):
    out = minmax(np.array(values))
    assert not np.isnan(out).any()
    assert out.tolist() == [MINMAX_CONSTANT] * len(values)


def test_score_minmax_with_constant_signals_has_no_nan():
    w = Weights(similarity=0.4, recency=0.3, reward=0.2, outcome=0.1, importance=0.5)
    c = candidates(3, cos=[0.4, 0.4, 0.4], reward=[np.nan] * 3)  # all same age, outcome, importance too
    s = score(c, w, half_life=DAY, as_of=NOW, normalize="minmax")
    assert not np.isnan(s.priority).any()
    assert s.priority == pytest.approx([MINMAX_CONSTANT * w.total] * 3)
    assert s.order.tolist() == [0, 1, 2]


def test_score_minmax_by_hand():
    w = Weights(similarity=1, recency=1, reward=0, outcome=0)
    c = candidates(3, cos=[0.2, 0.6, 0.4], completed_at=[NOW, NOW - DAY, NOW - 2 * DAY])
    s = score(c, w, half_life=DAY, as_of=NOW, normalize="minmax")
    # similarity -> 0, 1, 0.5; recency 1, 0.5, 0.25 -> 1, 1/3, 0
    assert s.similarity_term == pytest.approx([0.0, 1.0, 0.5])
    assert s.recency_term == pytest.approx([1.0, 1 / 3, 0.0])
    assert s.priority == pytest.approx([1.0, 4 / 3, 0.5])
    assert s.similarity == pytest.approx([0.2, 0.6, 0.4])  # raw signals are reported unscaled
    assert s.order.tolist() == [1, 0, 2]


# --- weights, presets, auto -------------------------------------------------------------------------


def test_presets():
    assert PRESETS["early"] == Weights(similarity=0.95, recency=0.01, reward=0.03, outcome=0.01)
    assert PRESETS["normal"] == Weights(similarity=0.90, recency=0.05, reward=0.03, outcome=0.02)
    assert PRESETS["late"] == Weights(similarity=0.85, recency=0.09, reward=0.04, outcome=0.02)
    for w in PRESETS.values():
        assert w.importance == 0.0
        assert w.total == pytest.approx(1.0)
    # recency, reward and outcome together close a relevance gap of at most 0.05 / 0.11 / 0.18
    reach = [
        (w.total - w.similarity) / w.similarity for w in (PRESETS[p] for p in ("early", "normal", "late"))
    ]
    assert [round(r, 3) for r in reach] == [0.053, 0.111, 0.176]


@pytest.mark.parametrize(
    ("size", "name"),
    [
        (0, "auto:early"),
        (AUTO_EARLY_BELOW - 1, "auto:early"),
        (AUTO_EARLY_BELOW, "auto:normal"),
        (AUTO_NORMAL_BELOW - 1, "auto:normal"),
        (AUTO_NORMAL_BELOW, "auto:late"),
        (10**9, "auto:late"),
    ],
)
def test_auto_thresholds(size, name):
    assert (AUTO_EARLY_BELOW, AUTO_NORMAL_BELOW) == (50, 500)
    for preset in ("auto", None):
        used, w = resolve_weights(preset, None, size)
        assert used == name
        assert w == PRESETS[name.split(":")[1]]


def test_resolve_named_and_custom():
    assert resolve_weights("late", None, 3) == ("late", PRESETS["late"])
    mine = Weights(similarity=1, recency=0, reward=0, outcome=0, importance=2)
    share = Weights(similarity=1 / 3, recency=0, reward=0, outcome=0, importance=2 / 3)
    assert resolve_weights("early", mine, 3) == ("custom", share)  # divided by the total: priority in [0, 1]
    assert resolve_weights(None, mine, 10_000) == ("custom", share)
    assert resolve_weights(None, share, 3)[1] == share


def test_weights_are_frozen():
    w = Weights(similarity=1.0, recency=0.0, reward=0.0, outcome=0.0)
    assert w.as_dict() == {
        "similarity": 1.0,
        "recency": 0.0,
        "reward": 0.0,
        "outcome": 0.0,
        "importance": 0.0,
    }
    with pytest.raises(AttributeError):
        w.similarity = 2.0  # type: ignore[misc]


# --- properties -------------------------------------------------------------------------------------

unit = st.floats(0.0, 1.0)
weight = st.floats(0.0, 10.0)
maybe_reward = st.one_of(st.just(math.nan), st.floats(-5.0, 5.0))
maybe_importance = st.one_of(st.just(math.nan), st.floats(1.0, 10.0))
outcome_st = st.sampled_from([0.0, 0.5, 1.0])
age_st = st.floats(-10 * DAY, 3650 * DAY)
half_life_st = st.floats(1.0, 365 * DAY)


weights_st = (
    st.tuples(weight, weight, weight, weight, weight).filter(lambda t: sum(t) > 0).map(lambda t: Weights(*t))
)


@given(
    w=weights_st,
    cos=st.floats(-1.0, 1.0),
    reward=maybe_reward,
    importance=maybe_importance,
    outcome=outcome_st,
    age=age_st,
    extra=st.floats(0.0, 3650 * DAY),
    half_life=half_life_st,
    last_accessed=st.one_of(st.just(math.nan), st.floats(NOW - 3650 * DAY, NOW + DAY)),
    recency_from=st.sampled_from(["completed", "last_access"]),
)
def test_priority_never_increases_with_age(
    w, cos, reward, importance, outcome, age, extra, half_life, last_accessed, recency_from
):
    """Case C20: whatever the weights and signals, making an episode older never raises its priority."""
    # candidate 0 is candidate 1 made older by `extra` seconds; a third, unrelated candidate stays put
    c = candidates(
        3,
        cos=[cos, cos, 0.9],
        completed_at=[NOW - age - extra, NOW - age, NOW - DAY],
        reward=[reward, reward, 0.3],
        importance=[importance, importance, 5],
        outcome_score=[outcome, outcome, 1.0],
        last_accessed=[last_accessed, last_accessed, NOW],
    )
    s = score(c, w, half_life=half_life, as_of=NOW, recency_from=recency_from)
    assert s.priority[0] <= s.priority[1]
    assert s.recency[0] <= s.recency[1]
    if s.age[0] > s.age[1]:  # really older (not both clamped to 0, not both dated by last access)
        assert list(s.order).index(0) > list(s.order).index(1)  # the newer ranks first, even on a tie


@given(
    w=weights_st,
    n=st.integers(1, 30),
    data=st.data(),
    half_life=half_life_st,
    normalize=st.sampled_from(["none", "minmax"]),
)
def test_priority_within_bounds_and_order_is_a_ranking(w, n, data, half_life, normalize):
    c = candidates(
        n,
        regime=data.draw(
            st.lists(st.sampled_from([0, 0, 0, STALE, CURRENT, EVIDENCE]), min_size=n, max_size=n)
        ),
        cos=data.draw(st.lists(st.floats(-1.0, 1.0), min_size=n, max_size=n)),
        completed_at=[NOW - a for a in data.draw(st.lists(age_st, min_size=n, max_size=n))],
        reward=data.draw(st.lists(maybe_reward, min_size=n, max_size=n)),
        outcome_score=data.draw(st.lists(outcome_st, min_size=n, max_size=n)),
        importance=data.draw(st.lists(maybe_importance, min_size=n, max_size=n)),
    )
    s = score(c, w, half_life=half_life, as_of=NOW, normalize=normalize)
    assert not np.isnan(s.priority).any()
    assert (s.priority >= 0.0).all()
    assert (s.priority <= w.total).all()
    assert sorted(s.order.tolist()) == list(range(n))
    ranked = s.priority[s.order]
    assert (np.diff(ranked) <= 0).all()
    assert s.priority == pytest.approx(
        s.similarity_term
        + s.recency_term
        + s.reward_term
        + s.outcome_term
        + s.importance_term
        + s.regime_term
    )
    assert (s.regime_term >= -(s.reward_term + s.outcome_term + w.similarity * SUPERSEDED_GAP) - 1e-12).all()
    # the term lifts none above the best priority without it: CURRENT to the best STALE, EVIDENCE to
    # the best CURRENT
    assert s.priority.max(initial=0.0) <= (s.priority - s.regime_term).max(initial=0.0) + 1e-12
    assert (s.regime_term[c.regime == CURRENT] >= 0.0).all()


@given(values=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30))
def test_minmax_stays_in_unit_interval(values):
    out = minmax(np.array(values))
    assert ((out >= 0.0) & (out <= 1.0)).all()


# --- reciprocal rank fusion -------------------------------------------------------------------------


def test_rrf_hand_example():
    fused = rrf([["a", "b", "c"], ["b", "a", "d"]], k=60)
    # a and b: 1/61 + 1/62 each (tie -> a appeared first); c and d: 1/63 each (tie -> c first)
    assert [key for key, _ in fused] == ["a", "b", "c", "d"]
    assert fused[0][1] == pytest.approx(1 / 61 + 1 / 62)
    assert fused[2][1] == pytest.approx(1 / 63)


def test_rrf_with_k_zero_by_hand():
    fused = rrf([["a", "b"], ["b", "c"]], k=0)
    assert fused == [("b", pytest.approx(1.5)), ("a", pytest.approx(1.0)), ("c", pytest.approx(0.5))]


def test_rrf_weighted_and_duplicates():
    fused = rrf([["x", "y"], ["y", "x"]], k=0, weights=[1.0, 3.0])
    assert fused == [("y", pytest.approx(0.5 + 3.0)), ("x", pytest.approx(1.0 + 1.5))]
    assert rrf([["x", "x", "y"]], k=0) == [("x", 1.0), ("y", pytest.approx(1 / 3))]  # x counted once
    assert rrf([]) == [] and rrf([[], []]) == []


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"k": -1}, "k"),
        ({"weights": [1.0]}, "weights"),
        ({"weights": [1.0, -2.0]}, "weights"),
    ],
)
def test_rrf_rejects_bad_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        rrf([["a"], ["b"]], **kwargs)


# --- replay context and learning curve --------------------------------------------------------------


def test_replay_context_hand_example():
    ctx = replay_context(
        strategies=["tdd", "print-debug", "tdd", None, "bisect"],
        rewards=[1.0, None, 0.5, 0.2, math.nan],
        outcomes=["success", "failure", "partial", "success", "success"],
        priorities=[0.7, 0.9, 0.8, 0.95, 0.9],
    )
    assert ctx["episodes"] == 5
    assert ctx["avg_reward"] == pytest.approx((1.0 + 0.5 + 0.2) / 3)
    assert ctx["success_rate"] == pytest.approx(3 / 5)
    same = {"changed_at": None, "earlier_episodes": 0, "earlier_success_rate": None}
    assert ctx["strategies"] == [
        {
            "strategy": "print-debug",
            "priority": 0.9,
            "episodes": 1,
            "avg_reward": None,
            "success_rate": 0.0,
            **same,
        },
        {
            "strategy": "bisect",
            "priority": 0.9,
            "episodes": 1,
            "avg_reward": None,
            "success_rate": 1.0,
            **same,
        },
        {"strategy": "tdd", "priority": 0.8, "episodes": 2, "avg_reward": 0.75, "success_rate": 0.5, **same},
    ]


def test_replay_context_counts_each_strategys_newest_regime():
    """X worked five times in week 1 and failed five times in week 2, Y succeeded in
    week 2. Averaged, X looked 50/50 and could head the list on priority; by regime it is 0/5 since
    week 2, and the entry says what changed. The input order (recall's) does not matter."""
    week = 7 * 86400.0
    rows = [("X", "success", 1.0, i * 3600.0) for i in range(5)]
    rows += [("X", "failure", 0.0, week + i * 3600.0) for i in range(5)]
    rows += [("Y", "success", 1.0, week + i * 3600.0 + 60) for i in range(5)]
    for order in (rows, rows[::-1], rows[5:] + rows[:5]):
        ctx = replay_context(
            [r[0] for r in order],
            [r[2] for r in order],
            [r[1] for r in order],
            [0.9 if r[0] == "X" else 0.5 for r in order],
            [r[3] for r in order],
        )
        x = next(e for e in ctx["strategies"] if e["strategy"] == "X")
        assert (x["episodes"], x["success_rate"], x["avg_reward"]) == (5, 0.0, 0.0)
        assert (x["earlier_episodes"], x["earlier_success_rate"], x["changed_at"]) == (5, 1.0, week)
        y = next(e for e in ctx["strategies"] if e["strategy"] == "Y")
        assert (y["episodes"], y["success_rate"], y["changed_at"]) == (5, 1.0, None)
        assert ctx["episodes"] == 15 and ctx["success_rate"] == pytest.approx(10 / 15)  # totals: everything
    # too few episodes to call it a change (2 then 2): nothing is dropped
    ctx = replay_context(
        ["X"] * 4, [1, 1, 0, 0], ["success", "success", "failure", "failure"], [1.0] * 4, [1.0, 2.0, 3.0, 4.0]
    )
    assert ctx["strategies"][0]["episodes"] == 4 and ctx["strategies"][0]["changed_at"] is None


def test_replay_context_counts_the_successes_the_pool_shows_superseded_as_earlier():
    """Three old X successes answered without the failures that superseded them (`top_k` cut them):
    the pool's roles say X stopped working at `since`, so X is no proven strategy; Y still is."""
    since = 7 * 86400.0
    args = (["X", "X", "X", "Y"], [1.0, 1.0, 1.0, 1.0], ["success"] * 4, [0.9, 0.8, 0.7, 0.95])
    times = [0.0, 3600.0, 7200.0, since + 60]
    plain = replay_context(*args, times)
    assert plain["strategies"][1]["success_rate"] == 1.0  # the answered hits alone: X worked
    ctx = replay_context(*args, times, stale=[True, True, True, False], since=since)
    x, y = ctx["strategies"][1], ctx["strategies"][0]
    assert (x["strategy"], x["episodes"], x["success_rate"], x["avg_reward"]) == ("X", 0, None, None)
    assert (x["earlier_episodes"], x["earlier_success_rate"], x["changed_at"]) == (3, 1.0, since)
    assert (y["strategy"], y["episodes"], y["success_rate"], y["changed_at"]) == ("Y", 1, 1.0, None)
    assert ctx["episodes"] == 4 and ctx["success_rate"] == 1.0  # totals: everything answered


def test_replay_context_empty():
    assert replay_context([], [], [], []) == {
        "episodes": 0,
        "avg_reward": None,
        "success_rate": None,
        "strategies": [],
    }


def test_learning_curve_hand_example():
    curve = learning_curve(
        rewards=[1.0, None, 0.0, 0.5], outcomes=["success", "failure", "failure", "success"], window=2
    )
    assert [p["episode"] for p in curve] == [1, 2, 3, 4]
    assert [p["reward"] for p in curve] == [1.0, None, 0.0, 0.5]
    assert [p["outcome"] for p in curve] == ["success", "failure", "failure", "success"]
    assert [p["cumulative_reward"] for p in curve] == pytest.approx([1.0, 1.0, 1.0, 1.5])
    assert [p["success_rate"] for p in curve] == pytest.approx([1.0, 0.5, 0.0, 0.5])
    assert [p["avg_reward"] for p in curve] == [1.0, 1.0, 0.0, pytest.approx(0.25)]


def test_learning_curve_window_larger_than_history_and_missing_rewards():
    curve = learning_curve([None, None, 0.3], ["partial", "success", "success"])
    assert [p["success_rate"] for p in curve] == pytest.approx([0.0, 0.5, 2 / 3])
    assert [p["avg_reward"] for p in curve] == [None, None, pytest.approx(0.3)]
    assert [p["cumulative_reward"] for p in curve] == pytest.approx([0.0, 0.0, 0.3])


def test_learning_curve_of_nothing():
    assert learning_curve([], []) == []


def test_equal_priority_and_age_are_ordered_by_the_tie_break_then_by_position():
    """The recall's tie rule: priority, then age, then the episode's tie-break (higher first; none
    last), then the candidate's position; without tie-breaks, position alone (as before)."""
    c = candidates(5, completed_at=[NOW, NOW, NOW, NOW - DAY, NOW], tie=[5.0, np.nan, 9.0, 99.0, 5.0])
    assert score(c, ONLY_RECENCY, half_life=DAY, as_of=NOW).order.tolist() == [2, 0, 4, 1, 3]
    plain = candidates(3, completed_at=[NOW, NOW, NOW])
    assert score(plain, ONLY_RECENCY, half_life=DAY, as_of=NOW).order.tolist() == [0, 1, 2]
