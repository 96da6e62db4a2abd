"""The fold of `EpisodeUpdated` (pure): merged after the snapshot, order- and duplicate-independent."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from engram_episodic.events import Action, Episode, EpisodeCompleted, EpisodeUpdated, Feedback, Task
from services.consolidator.projection import fold

BASE = Episode(
    episode_id="e",
    task=Task(description="t"),
    outcome="success",
    feedback=Feedback(reward=0.1, message="m"),
    metadata={"a": 1, "b": 2},
    importance=2,
)
COMPLETED = EpisodeCompleted(namespace="n", episode_id="e", occurred_at=100.0, episode=BASE)


def updated(at: float, **changes) -> EpisodeUpdated:
    return EpisodeUpdated(namespace="n", episode_id="e", occurred_at=at, **changes)


def test_an_update_merges_feedback_and_metadata_and_replaces_the_rest():
    u = updated(101, feedback=Feedback(reward=0.9), metadata={"a": None, "c": 3}, importance=7)
    ep = fold([COMPLETED, u]).episode
    assert ep.feedback == Feedback(reward=0.9, message="m")
    assert ep.metadata == {"b": 2, "c": 3} and ep.importance == 7 and ep.outcome == "success"
    assert fold([u]).episode is None  # an update alone makes no document: it waits for the snapshot
    # a later snapshot replaces what it sets, as a re-publish always did
    again = EpisodeCompleted(namespace="n", episode_id="e", occurred_at=102.0, episode=BASE)
    assert fold([COMPLETED, u, again]).episode.feedback == BASE.feedback
    # an update at the snapshot's own instant applies after it
    assert fold([updated(100, outcome="failure"), COMPLETED]).episode.outcome == "failure"
    cleared = fold([COMPLETED, updated(101, metadata={"a": None, "b": None})]).episode
    assert cleared.metadata is None


updates = st.lists(
    st.builds(
        updated,
        at=st.integers(90, 110).map(float),
        outcome=st.none() | st.sampled_from(["success", "failure"]),
        importance=st.none() | st.integers(1, 10).map(float),
        metadata=st.none()
        | st.dictionaries(st.sampled_from("abc"), st.none() | st.integers(0, 3), max_size=2),
        feedback=st.none() | st.builds(Feedback, reward=st.none() | st.floats(0, 1)),
    ),
    max_size=6,
)


@given(updates, st.randoms(use_true_random=False), st.integers(0, 3))
def test_the_fold_is_a_function_of_the_set_of_events(items, rnd, repeats):
    events = [COMPLETED, *items]
    shuffled = events + [rnd.choice(events) for _ in range(repeats)]  # redeliveries
    rnd.shuffle(shuffled)
    assert fold(shuffled) == fold(events)


def test_an_update_the_episode_model_refuses_once_merged_is_not_folded():
    """Each update is valid alone, but merged with the episode it would break a rule of the model; the
    fold keeps the episode as it was (a later valid update still applies), so every stored episode can
    be read back, exported and published again (`validation.episode_problems`)."""
    from engram_episodic.validation import episode_problems

    base = Episode(
        episode_id="e",
        task=Task(description="t"),
        outcome="success",
        completed_at=100.0,
        feedback=Feedback(tests_passed=2, tests_total=3),
        metadata={"a": "x" * 40_000},
    )
    done = EpisodeCompleted(namespace="n", episode_id="e", occurred_at=100.0, episode=base)
    refused = [
        updated(101, feedback=Feedback(tests_passed=5)),  # above the stored tests_total
        updated(102, feedback=Feedback(tests_total=1)),  # below the stored tests_passed
        updated(103, metadata={"b": "y" * 40_000}),  # the merged metadata past 64 KiB
        updated(104, expires_at=50.0),  # before the stored completed_at
    ]
    for u in refused:
        assert fold([done, u]).episode == base, u
    later = fold([done, *refused, updated(105, feedback=Feedback(tests_passed=3), metadata={"a": "short"})])
    assert later.episode.feedback == Feedback(tests_passed=3, tests_total=3)
    assert later.episode.metadata == {"a": "short"}
    assert episode_problems(later.episode) == []


def test_a_snapshot_refused_once_merged_leaves_the_stored_fields():
    """A re-publish completed before the stored start would merge into completed_at < started_at. Taking
    the snapshot alone (as a first version did) dropped the stored user_id and expires_at while their
    actions stayed — a forget of that user, or the expiry sweep, then missed them. The stored
    fields stay; the snapshot's actions still join the union."""
    first = Episode(
        episode_id="e",
        task=Task(description="t"),
        started_at=200.0,
        outcome="partial",
        importance=4,
        user_id="bob",
        expires_at=500.0,
        actions=(Action(action_type="a", action_id="a1", timestamp=210.0),),
    )
    second = Episode(
        episode_id="e",
        task=Task(description="t2"),
        completed_at=150.0,
        outcome="success",
        actions=(Action(action_type="b", action_id="b1", timestamp=140.0),),
    )
    a = EpisodeCompleted(namespace="n", episode_id="e", occurred_at=100.0, episode=first)
    b = EpisodeCompleted(namespace="n", episode_id="e", occurred_at=101.0, episode=second)
    kept = fold([a, b]).episode
    # completed_at: `first` has none, so it completed when it occurred
    assert dataclasses.replace(kept, actions=first.actions) == dataclasses.replace(first, completed_at=100.0)
    assert {x.action_id for x in kept.actions} == {"a1", "b1"}
    ok = Episode(episode_id="e", task=Task(description="t2"), completed_at=250.0)
    c = EpisodeCompleted(namespace="n", episode_id="e", occurred_at=101.0, episode=ok)
    merged = fold([a, c]).episode
    assert merged.started_at == 200.0 and merged.completed_at == 250.0 and merged.importance == 4
    assert merged.user_id == "bob"


def _snapshot(at: float, user: str | None, **fields) -> EpisodeCompleted:
    ep = dataclasses.replace(BASE, user_id=user, **fields)
    return EpisodeCompleted(namespace="n", episode_id="e", occurred_at=at, episode=ep)


def test_an_episode_is_folded_from_its_latest_users_events_only():
    """A snapshot under another user starts the episode afresh: nothing of the earlier user's events
    (fields, actions, updates) survives, they are reported superseded, and folding the current user's
    events alone gives the same episode (a replay after the earlier events were dropped)."""
    a = _snapshot(100, "a", solution="secret of a", actions=(Action(action_type="sh", action_id="a1"),))
    a_update = updated(101, user_id="a", outcome_details="a's details")
    b = _snapshot(102, "b", actions=(Action(action_type="sh", action_id="b1"),))
    late_a_update = updated(103, user_id="a", importance=9)  # sealed for a, after the change
    b_update = updated(104, user_id="b", importance=5)
    whole = fold([b_update, late_a_update, b, a_update, a])
    assert whole.episode.user_id == "b" and whole.episode.solution is None
    assert whole.episode.outcome_details is None and whole.episode.importance == 5
    assert [x.action_id for x in whole.episode.actions] == ["b1"]
    assert whole.superseded == {a.event_id, a_update.event_id, late_a_update.event_id}
    assert whole.first_occurred_at == 102 and whole.event_count == 2
    alone = fold([b, b_update])
    assert alone.episode == whole.episode and alone.superseded == frozenset()
    # a snapshot without a user, or under the same one, changes nothing
    same = fold([a, _snapshot(102, None), _snapshot(103, "a")])
    assert same.episode.solution == "secret of a" and same.superseded == frozenset()
    # back to the first user: every event before the change goes, the first user's earlier ones too
    back = fold([a, b, _snapshot(105, "a")])
    assert back.episode.solution is None and back.superseded == {a.event_id, b.event_id}


def test_a_completion_without_completed_at_completed_when_it_occurred():
    """Every completed episode has a `completed_at` (the API requires it of an answered episode): one
    published bare (`EngramClient.publish`) gets its first completion's instant; a draft gets none."""
    assert BASE.completed_at is None
    later = EpisodeCompleted(namespace="n", episode_id="e", occurred_at=105.0, episode=BASE)
    folded = fold([later, COMPLETED])
    assert folded.episode is not None and folded.episode.completed_at == 100.0
    given = dataclasses.replace(BASE, completed_at=90.0)
    kept = fold([EpisodeCompleted(namespace="n", episode_id="e", occurred_at=100.0, episode=given)])
    assert kept.episode is not None and kept.episode.completed_at == 90.0
