"""Pure consolidation rules: clustering, statistics, stable ids, supersession (no I/O)."""

from __future__ import annotations

import numpy as np

from engram_episodic.events import Action, Episode, Feedback, Task
from services.consolidator.facts import Row, build_fact, changepoint, cluster, plan
from shared.facts import Fact, FactScope

SCOPE = FactScope("ns")


def row(eid: str, direction: int, *, outcome: str = "success", at: float = 0.0, strategy: str = "s",
        noise: float = 0.05) -> Row:
    rng = np.random.default_rng([ord(ch) for ch in eid])
    v = np.zeros(16)
    v[direction] = 1.0
    v += rng.normal(0, noise, 16)
    ep = Episode(episode_id=eid, task=Task(description=f"task {direction}", category="c"), outcome=outcome,
                 completed_at=at, strategy_used=strategy, feedback=Feedback(reward=1.0 if outcome == "success" else 0.0),
                 actions=(Action(action_type="edit", error=None if outcome == "success" else "boom"),))
    return Row(episode=ep, vector=v / np.linalg.norm(v))


def test_cluster_keeps_orthogonal_families_apart_and_is_deterministic():
    rows = [row(f"a{i}", 0) for i in range(4)] + [row(f"b{i}", 1) for i in range(3)] + [row("c0", 2)]
    groups = cluster(np.stack([r.vector for r in rows]), 0.5)
    assert groups == [[0, 1, 2, 3], [4, 5, 6], [7]]
    assert cluster(np.stack([r.vector for r in rows]), 0.5) == groups


def test_build_fact_statistics():
    rows = [row(f"a{i}", 0, at=float(i), outcome="success" if i < 3 else "failure") for i in range(4)]
    f = build_fact(SCOPE, rows, fact_id="x", now=10.0)
    assert (f.support, f.successes, f.success_rate, f.avg_reward) == (4, 3, 0.75, 0.75)
    assert f.common_failures == ({"message": "boom", "count": 1},)
    assert f.action_types == ({"action_type": "edit", "count": 4, "failed": 1},)
    assert (f.first_at, f.last_at, f.kind) == (0.0, 3.0, "strategy")
    assert Fact.from_data(f.to_data()) == f
    assert abs(np.linalg.norm(f.centroid_array()) - 1) < 1e-5


def test_plan_is_stable_and_supersedes_on_a_flip():
    old_rows = [row(f"a{i}", 0, at=float(i)) for i in range(4)]
    facts, removed = plan(SCOPE, old_rows, [], min_cluster=3, distance=0.5, now=100.0)
    assert len(facts) == 1 and removed == []
    assert plan(SCOPE, old_rows, facts, min_cluster=3, distance=0.5, now=200.0) is None
    flipped = old_rows + [row(f"a{i}", 0, at=float(i), outcome="failure") for i in range(4, 8)]
    new, _ = plan(SCOPE, flipped, facts, min_cluster=3, distance=0.5, now=300.0)
    current = [f for f in new if f.status == "current"]
    assert len(current) == 1 and current[0].supersedes == facts[0].fact_id
    assert current[0].evidence == tuple(f"a{i}" for i in range(4, 8))
    assert plan(SCOPE, flipped, new, min_cluster=3, distance=0.5, now=400.0) is None


def test_changepoint_needs_new_evidence_and_a_real_flip():
    rows = [row(f"a{i}", 0, at=float(i), outcome="success" if i < 4 else "failure") for i in range(8)]
    assert changepoint(rows, 3, set()) == 4
    assert changepoint(rows, 3, {r.episode_id for r in rows}) is None
    mixed = [row(f"m{i}", 0, at=float(i), outcome="success" if i % 2 else "failure") for i in range(8)]
    assert changepoint(mixed, 3, set()) is None


def _changepoint_reference(rows, min_size, known):
    """The definition, written as the plain O(n²) loop the vectorised version must agree with."""
    def rate(rs):
        return sum(r.episode.outcome == "success" for r in rs) / len(rs)

    best = None
    for i in range(min_size, len(rows) - min_size + 1):
        newer = rows[i:]
        if all(r.episode_id in known for r in newer):
            continue
        a, b = rate(rows[:i]), rate(newer)
        if (a >= 0.5) != (b >= 0.5) and abs(a - b) >= 0.5 and (best is None or abs(a - b) > best[0]):
            best = (abs(a - b), i)
    return best[1] if best else None


def test_changepoint_matches_its_definition():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.booleans(), max_size=30), st.integers(1, 5), st.sets(st.integers(0, 29)))
    def check(outcomes, min_size, known_idx):
        rows = [row(f"e{i}", 0, outcome="success" if ok else "failure") for i, ok in enumerate(outcomes)]
        known = {f"e{i}" for i in known_idx}
        assert changepoint(rows, min_size, known) == _changepoint_reference(rows, min_size, known)

    check()


def test_fact_text_never_calls_a_high_success_rate_mixed():
    from services.consolidator.facts import _text

    text = _text("best_practice", 9, 9, None, [], [], [], 1.7e9, 1.7e9, ["fix the flaky test"], [])
    assert text.startswith("What works:") and "9 of 9" in text
    assert _text("best_practice", 10, 5, None, [], [], [], 1.7e9, 1.7e9, [], []).startswith("Mixed results:")
