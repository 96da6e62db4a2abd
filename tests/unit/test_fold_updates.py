"""The fold of `EpisodeUpdated` (pure): merged after the snapshot, order- and duplicate-independent."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engram_episodic.events import Episode, EpisodeCompleted, EpisodeUpdated, Feedback, Task
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
