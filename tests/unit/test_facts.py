"""Pure consolidation rules: clustering, statistics, stable ids, supersession (no I/O)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engram_episodic.events import Action, Episode, Feedback, Task
from services.consolidator.facts_plan import (
    LEXICAL_WEIGHT,
    build_fact,
    cluster,
    clustering_texts,
    derive,
    lexical_distances,
    lexical_weight,
    plan,
    shared_sentences,
    unmodelled,
    without_shared,
)
from shared.facts import Fact, FactScope, Row
from shared.index import embedding_text

SCOPE = FactScope("ns")


def row(
    eid: str,
    direction: int,
    *,
    outcome: str = "success",
    at: float = 0.0,
    strategy: str | None = "s",
    noise: float = 0.05,
) -> Row:
    rng = np.random.default_rng([ord(ch) for ch in eid])
    v = np.zeros(16)
    v[direction] = 1.0
    v += rng.normal(0, noise, 16)
    ep = Episode(
        episode_id=eid,
        task=Task(description=f"task {direction}", category="c"),
        outcome=outcome,
        completed_at=at,
        strategy_used=strategy,
        feedback=Feedback(reward=1.0 if outcome == "success" else 0.0),
        actions=(Action(action_type="edit", error=None if outcome == "success" else "boom"),),
    )
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
    assert abs(np.linalg.norm(np.asarray(f.centroid)) - 1) < 1e-5


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


def test_a_flip_of_one_strategy_supersedes_even_when_the_overall_rate_holds():
    """Week 1: X succeeds 5 times; week 2: X fails 5 times and Y succeeds 5 times. Overall 100% then 50%
    (no outcome flip), but X went from 5/5 to 0/5: the current fact is week 2's, Y first in its text."""
    week1 = [row(f"w1-{i}", 0, at=float(i), strategy="X") for i in range(5)]
    week2 = [
        row(
            f"w2-{i}",
            0,
            at=10.0 + i,
            strategy="X" if i % 2 == 0 else "Y",
            outcome="failure" if i % 2 == 0 else "success",
        )
        for i in range(10)
    ]
    facts, _ = plan(SCOPE, week1 + week2, [], min_cluster=3, distance=0.5, now=100.0)
    (current,) = [f for f in facts if f.status == "current"]
    (old,) = [f for f in facts if f.status == "superseded"]
    assert set(current.evidence) == {r.episode_id for r in week2} and current.supersedes == old.fact_id
    assert set(old.evidence) == {r.episode_id for r in week1} and old.superseded_by == current.fact_id
    assert "Strategies: Y succeeded 5 of 5; X succeeded 0 of 5." in current.text
    assert current.evidence_since == 10.0 and old.evidence_since is None


def test_the_same_episodes_give_the_same_facts_whenever_consolidation_ran():
    """30 successes then 20 failures: one run over all 50, or runs after 10, 30 and 40 of them, end in
    the same two facts (the 30 successes superseded by the 20 failures); no episode is left out."""
    rows = [row(f"e{i:02d}", 0, at=float(i), outcome="success" if i < 30 else "failure") for i in range(50)]
    once, _ = plan(SCOPE, rows, [], min_cluster=3, distance=0.5, now=1000.0)
    state: list[Fact] = []
    for n in (10, 30, 40, 50):
        out = plan(SCOPE, rows[:n], state, min_cluster=3, distance=0.5, now=1000.0 + n)
        state = out[0] if out is not None else state

    def view(facts):
        return sorted((f.status, f.evidence, f.kind, f.text) for f in facts)

    assert view(state) == view(once)
    assert [len(f.evidence) for f in once] == [20, 30] and {e for f in once for e in f.evidence} == {
        r.episode_id for r in rows
    }
    # ids stay: the fact the run after 10 episodes created is the one that was superseded
    first = plan(SCOPE, rows[:10], [], min_cluster=3, distance=0.5, now=0.0)[0][0]
    assert [f.fact_id for f in state if f.status == "superseded"] == [first.fact_id]


def test_works_again_after_a_failing_stretch_is_current_again():
    rows = [
        row(f"e{i:02d}", 0, at=float(i), outcome="failure" if 10 <= i < 20 else "success") for i in range(25)
    ]
    facts, _ = plan(SCOPE, rows, [], min_cluster=3, distance=0.5, now=1.0)
    current = [f for f in facts if f.status == "current"]
    assert [f.evidence for f in current] == [tuple(f"e{i:02d}" for i in range(20, 25))]
    assert len(facts) == 3 and current[0].kind != "failure_pattern"


def test_a_run_of_bad_luck_is_not_a_flip():
    rows = [row(f"e{i}", 0, at=float(i), outcome="success" if i < 2 else "failure") for i in range(6)]
    facts, _ = plan(SCOPE, rows, [], min_cluster=3, distance=0.5, now=1.0)
    assert [(f.status, f.support) for f in facts] == [("current", 6)]  # 2 of 3 then 0 of 3: p = 0.2


STRATEGIES = ("X", "Y", None)


def _interleavings():
    """(episodes, arrival order, runs): per (family, strategy) a world flips its outcome at some time
    (or never), each outcome inverted one time in ten; episodes arrive in any order and consolidation
    runs after any subset of arrivals."""
    from hypothesis import strategies as st

    world = st.lists(st.tuples(st.integers(0, 31), st.booleans()), min_size=6, max_size=6)
    episode = st.tuples(st.integers(0, 1), st.integers(0, 2), st.integers(0, 30), st.integers(0, 9))

    def case(w_eps):
        w, eps = w_eps
        out = []
        for fam, strat, t, noise in eps:
            flip_at, before = w[3 * fam + strat]
            ok = before if t < flip_at else not before
            out.append((fam, ok != (noise == 0), STRATEGIES[strat], t))
        return st.tuples(
            st.just(out),
            st.permutations(range(len(out))),
            st.sets(st.integers(1, max(1, len(out))), max_size=6),
        )

    return st.tuples(world, st.lists(episode, min_size=12, max_size=40)).flatmap(case)


def test_property_any_interleaving_of_publishes_and_consolidations_gives_the_single_run_facts():
    """Episodes arrive in any order (concurrent publishers), consolidation runs after any of them; the
    facts in the end are those of one run over all the episodes: the same current and superseded facts
    (evidence, kind, text), every episode of a large enough cluster in exactly one of them."""
    from hypothesis import given, settings

    @settings(max_examples=200, deadline=None)
    @given(_interleavings())
    def check(case):
        eps, arrival, runs = case
        rows = [
            row(f"e{i:02d}", fam, at=float(t), outcome="success" if ok else "failure", strategy=s)
            for i, (fam, ok, s, t) in enumerate(eps)
        ]
        seen: list[Row] = []
        state: list[Fact] = []
        for k, i in enumerate(arrival, start=1):
            seen.append(rows[i])
            if k in runs:
                out = plan(SCOPE, seen, state, min_cluster=3, distance=0.5, now=float(k))
                state = out[0] if out is not None else state
        out = plan(SCOPE, rows, state, min_cluster=3, distance=0.5, now=1000.0)
        state = out[0] if out is not None else state
        once = plan(SCOPE, rows, [], min_cluster=3, distance=0.5, now=2000.0)
        once = once[0] if once is not None else []

        def view(facts):
            return sorted((f.status, f.evidence, f.kind, f.text) for f in facts)

        assert view(state) == view(once)
        covered = [e for f in once for e in f.evidence]
        assert len(covered) == len(set(covered))

    check()


def test_fact_text_never_calls_a_high_success_rate_mixed():
    from services.consolidator.facts_plan import _text

    def fact(support: int, successes: int) -> Fact:
        return Fact(
            **dict(fact_id="f", namespace="ns", scope_id="s", level="namespace", kind="best_practice"),
            **dict(text="", base_text="", support=support, successes=successes, success_rate=0.0),
            **dict(first_at=1.7e9, last_at=1.7e9, confidence=0.5, created_at=0.0, updated_at=0.0),
        )

    text = _text(fact(9, 9), ["fix the flaky test"])
    assert text.startswith("What works:") and "9 of 9" in text
    assert _text(fact(10, 5), []).startswith("Mixed results:")


def test_the_planner_imports_neither_redis_nor_asyncio():
    """facts_plan is the pure part of consolidation: Redis I/O is facts_store's, scheduling the
    Consolidator's, so planning runs (and is tested) without a server or an event loop."""
    import ast
    from pathlib import Path

    from services.consolidator import facts_plan

    tree = ast.parse(Path(facts_plan.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"redis", "asyncio"}


def test_a_tool_switch_recorded_only_in_actions_supersedes():
    """No strategy recorded: week 1 calls pip 8 times and succeeds; week 2 pip fails 4 times and uv
    succeeds 6 times (60% overall: no outcome flip). pip's own flip makes week 2 the current fact."""

    def tool_row(eid: str, tool: str, ok: bool, at: float) -> Row:
        base = row(eid, 0, at=at, strategy=None, outcome="success" if ok else "failure")
        actions = (Action(action_type=tool, success=ok, error=None if ok else f"{tool} failed"),)
        return Row(episode=replace(base.episode, actions=actions), vector=base.vector)

    week1 = [tool_row(f"w1-{i}", "pip", True, float(i)) for i in range(8)]
    week2 = [
        tool_row(f"w2-{i}", "pip" if i < 4 else "uv", i >= 4, 100.0 + (i % 4) * 2 + i // 4) for i in range(10)
    ]
    facts, _ = plan(SCOPE, week1 + week2, [], min_cluster=3, distance=0.5, now=1000.0)
    (current,) = [f for f in facts if f.status == "current"]
    (old,) = [f for f in facts if f.status == "superseded"]
    assert set(old.evidence) == {r.episode_id for r in week1}
    assert set(current.evidence) == {r.episode_id for r in week2} and current.supersedes == old.fact_id
    assert "uv (6)" in current.text


def noted(eid: str, task: str, solution: str, result: str | None = None) -> Episode:
    return Episode(
        episode_id=eid, task=Task(description=task), solution=solution, result=result, outcome="success"
    )


def test_shared_sentences_are_those_of_nearly_every_episode_s_notes():
    closing = "Task completed.  I checked every result.\nNo further action is required."
    eps = [
        noted(f"e{i}", f"task {i}", f"note {i}." + (" Used the CLI." if i < 4 else ""), closing)
        for i in range(5)
    ]
    eps.append(noted("e5", "task 5", "note 5"))
    # the closing text is in 5 of 6 episodes; a note in 4 of 6 (under 80%) is the topic's, not boilerplate
    assert shared_sentences(eps) == {
        "Task completed.",
        "I checked every result.",
        "No further action is required.",
    }
    # a task repeated is never shared text: a scope of one task is one topic
    assert shared_sentences([noted(f"r{i}", "Run the nightly backup", f"n{i}") for i in range(4)]) == set()
    assert shared_sentences(eps[:1]) == set()


def test_without_shared_keeps_the_task_and_the_episode_s_own_notes():
    shared = frozenset({"Task completed.", "No further action is required."})
    ep = noted(
        "e", "Book a table", "Called the restaurant.", "Task completed. No further action is required."
    )
    assert without_shared(ep, shared) == "Book a table\nCalled the restaurant."
    plain = noted("p", "Book a table", "Called the restaurant.")
    assert without_shared(plain, shared) is None  # nothing to leave out: the stored vector stands
    assert without_shared(ep, frozenset()) is None
    assert embedding_text(plain) == without_shared(ep, shared)


def test_clustering_compares_the_cluster_vector_when_set():
    # stored vectors all alike (shared text), cluster vectors of two directions: two clusters of 3
    rows = [row(f"r{i}", 0, at=float(i)) for i in range(6)]
    apart = [replace(r, cluster_vector=row(r.episode_id, 1 + i % 2).vector) for i, r in enumerate(rows)]
    assert len(derive(rows, min_cluster=3, distance=0.5)) == 1
    groups = derive(apart, min_cluster=3, distance=0.5)
    assert sorted(sorted(r.episode_id for p in g for r in p) for g in groups) == [
        ["r0", "r2", "r4"],
        ["r1", "r3", "r5"],
    ]
    # facts' centroids stay those of the stored vectors
    fact = build_fact(SCOPE, apart[:3], fact_id="f", now=0.0)
    assert np.allclose(fact.centroid, build_fact(SCOPE, rows[:3], fact_id="f", now=0.0).centroid)


GERMAN = {
    "restaurant": (
        [
            "Reserviere einen Tisch für vier Personen beim Italiener am Freitagabend",
            "Finde ein Restaurant mit veganen Gerichten und reserviere einen Tisch",
            "Buche einen Tisch in einem Sushi-Lokal für Samstagabend",
        ],
        "im Restaurant angerufen und eine Bestätigungsnummer erhalten",
    ),
    "train": (
        [
            "Finde den günstigsten Zug von Berlin nach München am nächsten Montag",
            "Prüfe, ob der Zug um 8:15 nach Köln Verspätung hat",
            "Kaufe eine Bahnfahrkarte nach Wien für die Konferenz",
        ],
        "der ICE um 6:30 kostet 29,90 mit Sparpreis",
    ),
}
ENGLISH = {
    "restaurant": (
        [
            "Book a table for four at an Italian restaurant on Friday evening",
            "Find a restaurant with vegan options and book a table",
            "Book a table at a sushi place for Saturday night",
        ],
        "called the restaurant and got a confirmation number",
    ),
    "train": (
        [
            "Find the cheapest train from Berlin to Munich next Monday",
            "Check whether the 8:15 train to Cologne is delayed",
            "Buy a rail ticket to Vienna for the conference",
        ],
        "the ICE at 6:30 costs 29.90 with a saver fare",
    ),
}


def test_text_the_embedder_does_not_model_is_compared_by_its_words_too():
    # an English model places unrelated German texts close together: alike vectors, two topics in words
    rows = [row(f"r{i}", 0, at=float(i)) for i in range(6)]

    def written(topics: dict[str, tuple[list[str], str]]) -> list[Row]:
        texts = [(task, note) for tasks, note in topics.values() for task in tasks]
        return [
            replace(r, episode=replace(r.episode, task=Task(description=t), solution=n))
            for r, (t, n) in zip(rows, texts, strict=True)
        ]

    german, english = written(GERMAN), written(ENGLISH)
    assert all(unmodelled(t) for t in clustering_texts([r.episode for r in german]))
    assert len(derive(german, min_cluster=3, distance=0.5)) == 1  # the vectors alone
    groups = derive(german, min_cluster=3, distance=0.5, lexical=LEXICAL_WEIGHT["minilm-l6-v2"])
    assert sorted(sorted(r.episode_id for p in g for r in p) for g in groups) == [
        ["r0", "r1", "r2"],
        ["r3", "r4", "r5"],
    ]
    # English text is the embedder's: its vectors alone decide, as they do without texts
    assert not any(unmodelled(t) for t in clustering_texts([r.episode for r in english]))
    assert len(derive(english, min_cluster=3, distance=0.5, lexical=LEXICAL_WEIGHT["minilm-l6-v2"])) == 1
    vectors = np.stack([r.vector for r in english])
    texts = clustering_texts([r.episode for r in english])
    weight = LEXICAL_WEIGHT["minilm-l6-v2"]
    assert cluster(vectors, 0.5, texts, weight) == cluster(vectors, 0.5) == [[0, 1, 2, 3, 4, 5]]


def test_each_english_embedder_has_its_own_lexical_weight_and_others_compare_vectors_alone():
    assert lexical_weight("minilm-l6-v2") == 0.6 and lexical_weight("mpnet-base-v2") == 0.75
    assert lexical_weight("hashing-v1") is None and lexical_weight("openai/text-embedding-3-small") is None
    assert lexical_weight(None) is None
    with pytest.raises(ValueError, match="texts and weight"):
        cluster(np.eye(3), 0.5, ["a", "b", "c"])


def test_unmodelled_needs_words_of_another_language_and_lexical_distances_share_compounds():
    assert unmodelled("Finde den günstigsten Zug von Berlin nach München am nächsten Montag")
    assert not unmodelled("Find the cheapest train from Berlin to Munich next Monday")
    assert unmodelled("Trouve la facture la plus récente du client 4711")
    # terse English has no English function word, and none of another language either
    assert not unmodelled("Rotate expired TLS certificate on api gateway nginx reload certbot renew")
    assert not unmodelled("Book flight Berlin Lisbon next Tuesday morning window seat confirmed")
    assert not unmodelled("Zug nach München")  # too few words to tell: the vector decides
    assert not unmodelled("")
    d = lexical_distances(
        ["Das Lasagnerezept skalieren", "Das Chili-Rezept einkaufen", "Zug nach Wien", "1 2 3"]
    )
    assert d.shape == (4, 4) and np.allclose(np.diag(d)[:3], 0.0)
    assert d[0, 1] < d[0, 2] == 1.0  # "rezept" is in both compounds; "das" is too short to count
    assert d[3, 0] == d[3, 3] == 1.0  # a text without a word of 4 letters shares nothing
