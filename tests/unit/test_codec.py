"""Codec round-trips (hypothesis), upcasting, and the decoder's typed errors on any bytes."""

from __future__ import annotations

import dataclasses
import os

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram_episodic.errors import (
    DecodeError,
    EngramError,
    InvalidEpisode,
    UnknownEventType,
    UnknownSchemaVersion,
)
from engram_episodic.events import (
    OUTCOMES,
    Action,
    ActionRecorded,
    Episode,
    EpisodeCompleted,
    EpisodeForgotten,
    EpisodeStarted,
    EpisodeUpdated,
    Feedback,
    Task,
    UserForgotten,
)
from engram_episodic.shapes import episode_to_dict
from shared.codec import decode, encode

FUZZ = int(os.environ.get("ENGRAM_FUZZ_EXAMPLES", "150"))
ids = st.text(min_size=1, max_size=40).filter(
    lambda s: s.strip() == s and s and all(ord(c) >= 32 and not 127 <= ord(c) < 160 for c in s)
)
texts = st.text(max_size=200)
finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)
epoch = st.floats(min_value=0, max_value=4e9, allow_nan=False)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), texts, finite)
json_objects = st.dictionaries(
    st.text(max_size=10),
    st.recursive(
        json_scalars,
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
        max_leaves=8,
    ),
    max_size=4,
)

actions = st.builds(
    Action,
    action_type=ids,
    input=st.none() | texts,
    output=st.none() | texts,
    timestamp=st.none() | epoch,
    success=st.none() | st.booleans(),
    error=st.none() | texts,
    action_id=st.none() | ids,
)
episodes = st.builds(
    Episode,
    episode_id=ids,
    agent_id=st.none() | ids,
    user_id=st.none() | ids,
    session_id=st.none() | ids,
    task=st.builds(
        Task,
        description=texts.filter(lambda s: s.strip()),
        category=ids,
        complexity=st.none() | st.floats(0, 1),
    ),
    context=st.none() | json_objects,
    observation=st.none() | texts,
    thoughts=st.none() | texts,
    action=st.none() | texts,
    result=st.none() | texts,
    solution=st.none() | texts,
    actions=st.lists(actions, max_size=3).map(tuple),
    feedback=st.none() | st.builds(Feedback, reward=st.none() | finite, message=st.none() | texts),
    outcome=st.none() | st.sampled_from(OUTCOMES),
    importance=st.none() | st.floats(1, 10),
    strategy_used=st.none() | ids,
    iterations=st.none() | st.integers(0, 1000),
    started_at=st.none(),
    completed_at=st.none() | epoch,
    metadata=st.none() | json_objects,
    vector=st.none() | st.lists(st.floats(0.1, 1.0), min_size=2, max_size=4).map(tuple),
)


def _events():
    base = dict(namespace=ids, occurred_at=epoch, event_id=ids)
    return st.one_of(
        episodes.flatmap(
            lambda ep: st.builds(
                EpisodeStarted, episode_id=st.just(ep.episode_id), episode=st.just(ep), **base
            )
        ),
        episodes.flatmap(
            lambda ep: st.builds(
                EpisodeCompleted, episode_id=st.just(ep.episode_id), episode=st.just(ep), **base
            )
        ),
        st.builds(ActionRecorded, episode_id=ids, action=actions, **base),
        st.builds(EpisodeForgotten, episode_id=ids, **base),
        st.builds(UserForgotten, user_id=ids, **base),
        st.builds(
            EpisodeUpdated,
            episode_id=ids,
            user_id=st.none() | ids,
            outcome=st.sampled_from(OUTCOMES),
            importance=st.none() | st.floats(1, 10),
            metadata=st.none() | st.dictionaries(ids, st.none() | st.integers(-5, 5), max_size=3),
            **base,
        ),
    )


@settings(max_examples=FUZZ, suppress_health_check=[HealthCheck.too_slow])
@given(_events())
def test_round_trip_every_event_type(event):
    decoded = decode(encode(event))
    assert type(decoded) is type(event)
    assert decoded == event
    assert msgpack.unpackb(encode(event))["v"] == type(event).VERSION


def test_upcast_v1_flat_episode():
    v1 = {
        "type": "EpisodeCompleted",
        "v": 1,
        "data": {
            "event_id": "e1",
            "namespace": "ns",
            "occurred_at": 10.0,
            "episode_id": "ep1",
            "episode": {
                "episode_id": "ep1",
                "task": "migrate schema",
                "category": "architecture",
                "reward": 0.8,
                "outcome": "success",
                "completed_at": 10.0,
            },
        },
    }
    event = decode(msgpack.packb(v1))
    assert type(event).VERSION == 2
    assert event.episode.task == Task(description="migrate schema", category="architecture")
    assert event.episode.feedback.reward == 0.8


@pytest.mark.parametrize(
    "payload, error",
    [
        (b"\xc1garbage", DecodeError),
        (msgpack.packb([1, 2, 3]), DecodeError),
        (msgpack.packb({"type": "Nope", "v": 1, "data": {}}), UnknownEventType),
        (msgpack.packb({"type": "EpisodeCompleted", "v": 99, "data": {}}), UnknownSchemaVersion),
        (msgpack.packb({"type": "EpisodeCompleted", "v": 0, "data": {}}), UnknownSchemaVersion),
        (msgpack.packb({"type": "EpisodeCompleted", "v": 2, "data": {"event_id": "x"}}), InvalidEpisode),
        (
            msgpack.packb(
                {
                    "type": "UserForgotten",
                    "v": 1,
                    "data": {"event_id": "x", "namespace": "n", "occurred_at": 1.0, "user_id": ""},
                }
            ),
            InvalidEpisode,
        ),
    ],
)
def test_decode_errors_are_typed(payload, error):
    with pytest.raises(error):
        decode(payload)


@settings(max_examples=FUZZ)
@given(st.binary(max_size=300))
def test_fuzz_decoder_never_raises_untyped(data):
    try:
        decode(data)
    except EngramError:
        pass


@settings(max_examples=FUZZ)
@given(
    st.dictionaries(
        st.sampled_from(["type", "v", "data", "x"]),
        st.one_of(
            st.sampled_from(["EpisodeCompleted", "UserForgotten", "ActionRecorded"]),
            st.integers(-2, 3),
            st.dictionaries(st.text(max_size=12), json_scalars, max_size=6),
            json_scalars,
        ),
    )
)
def test_fuzz_envelopes_never_raise_untyped(envelope):
    try:
        decode(msgpack.packb(envelope))
    except EngramError:
        pass


def test_unicode_text_round_trips_byte_exact():
    """Case C16: Chinese, Arabic, emoji, NFC and NFD texts round-trip the codec byte-exact."""
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    texts = ["修复数据库迁移测试", "إصلاح اختبار الترحيل", "🙂🚀 emoji", nfc, nfd]
    for text in texts:
        ep = Episode(
            episode_id=text, task=Task(description=text, category=text), solution=text, outcome="success"
        )
        ev = EpisodeCompleted(namespace=text, episode_id=text, occurred_at=1.0, episode=ep)
        back = decode(encode(ev))
        assert back.episode.task.description.encode() == text.encode()
        assert back.episode.solution.encode() == text.encode()
        assert back.namespace.encode() == text.encode()
    assert decode(encode(EpisodeForgotten(namespace="n", episode_id=nfc, occurred_at=1))).episode_id != nfd


def test_episode_to_dict_iso_adds_derived_fields():
    ep = Episode(
        episode_id="e",
        task=Task(description="d"),
        started_at=1753408800.0,
        completed_at=1753408830.5,
        feedback=Feedback(reward=1, tests_passed=3, tests_total=4),
        outcome="success",
    )
    data = episode_to_dict(ep, iso=True)
    assert data["started_at"] == "2025-07-25T02:00:00Z"
    assert data["completed_at"] == "2025-07-25T02:00:30.500000Z"
    assert data["duration_s"] == 30.5
    assert data["feedback"]["pass_rate"] == 0.75


# `ids` and task descriptions filter what the validator refuses (blank, edge whitespace); a run can draw many
@settings(max_examples=FUZZ, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(episodes, st.none() | epoch, st.none() | st.tuples(st.integers(0, 10), st.integers(0, 10)))
def test_the_trusted_reader_of_stored_documents_agrees_with_the_validator(episode, started, tests):
    """Stored documents are read without re-validation (`episode_from_stored`): for every document the
    consolidator writes it yields what `parse_episode` does, and the one response shaper gives the same
    response from the document as from the episode."""
    import json

    from engram_episodic.shapes import episode_from_stored, response_shape
    from engram_episodic.validation import parse_episode

    if started is not None and episode.completed_at is not None and started <= episode.completed_at:
        episode = dataclasses.replace(episode, started_at=started)
    if tests is not None:
        passed, total = min(tests), max(tests)
        episode = dataclasses.replace(
            episode, feedback=Feedback(reward=0.5, tests_passed=passed, tests_total=total)
        )
    stored = json.loads(json.dumps(episode_to_dict(episode, include_vector=False)))
    assert episode_from_stored(stored) == parse_episode(stored, max_actions=None)
    assert response_shape(stored) == episode_to_dict(parse_episode(stored), iso=True, include_vector=False)
    with_vector = json.loads(json.dumps(episode_to_dict(dataclasses.replace(episode, vector=(0.5, -1.0)))))
    assert episode_from_stored(with_vector) == parse_episode(with_vector, max_actions=None)


def test_peek_identity_names_the_episode_of_an_undecodable_envelope():
    import msgpack

    from engram_episodic.events import Episode, EpisodeCompleted, Task
    from shared.codec import peek_identity

    ev = EpisodeCompleted(
        namespace="ns",
        episode_id="e1",
        occurred_at=5.0,
        episode=Episode(episode_id="e1", user_id="u1", task=Task(description="t"), outcome="success"),
    )
    envelope = msgpack.unpackb(encode(ev), raw=False)
    envelope["data"]["episode"]["vector"] = ["not a number"]
    assert peek_identity(msgpack.packb(envelope)) == ("ns", "e1", "u1", 5.0)
    del envelope["data"]["episode_id"]  # the envelope lost its id: the episode's own names it
    assert peek_identity(msgpack.packb(envelope)) == ("ns", "e1", "u1", 5.0)
    envelope["data"]["episode_id"] = " padded "  # an id validation refuses is not trusted
    assert peek_identity(msgpack.packb(envelope)) is None
    for junk in (b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"data": "x"})):
        assert peek_identity(junk) is None


def test_one_version_per_event_and_old_entries_with_a_schema_version_field_still_decode():
    """The version lived in three places that disagreed (a fresh event said 1, its envelope 2); now only
    the class holds it. Entries written while events carried `schema_version` still decode."""
    from engram_episodic.events import EVENT_TYPES, EpisodeEvent

    for cls in EVENT_TYPES.values():
        assert set(cls.UPCASTERS) == set(range(1, cls.VERSION))
        assert "schema_version" not in {f.name for f in dataclasses.fields(cls)}
    assert all(
        issubclass(EVENT_TYPES[n], EpisodeEvent)
        for n in ("EpisodeStarted", "ActionRecorded", "EpisodeCompleted", "EpisodeForgotten")
    )
    old = {
        "type": "EpisodeForgotten",
        "v": 1,
        "data": {
            "event_id": "e1",
            "namespace": "ns",
            "occurred_at": 1.0,
            "schema_version": 1,
            "episode_id": "ep1",
        },
    }
    assert decode(msgpack.packb(old)) == EpisodeForgotten(
        event_id="e1", namespace="ns", occurred_at=1.0, episode_id="ep1"
    )


def test_an_update_that_changes_nothing_still_decodes():
    """`PATCH` refuses an all-null feedback and an empty metadata (`validation.empty_changes`), but
    such `EpisodeUpdated` events were accepted before: in a stream they must still decode (a replay)."""
    from engram_episodic.events import EpisodeUpdated, Feedback

    event = EpisodeUpdated(namespace="n", episode_id="e", occurred_at=1.0, feedback=Feedback(), metadata={})
    assert decode(encode(event)) == event
