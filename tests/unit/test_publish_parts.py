"""`engram_episodic.parts`: every request fits the service's bounds, and the parts fold to the episode.

The fold used is the consolidator's own (`services.consolidator.projection.fold`), so the property is
the one that matters: publishing the parts in order leaves exactly the episode that was split.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engram_episodic.errors import InvalidEpisode
from engram_episodic.events import EpisodeCompleted
from engram_episodic.parts import SPLIT_FIELDS, encode_body, episode_parts, request_bodies
from engram_episodic.shapes import episode_to_dict
from engram_episodic.validation import parse_episode
from services.consolidator.projection import fold

# non-ASCII on purpose: a CJK character is 3 bytes of UTF-8, an emoji 4 (the sizes are bytes, not characters)
_text = st.text(alphabet=st.sampled_from('ab c\u00e9\u4e2d\U0001f600"\\\n'), min_size=1, max_size=400)


@st.composite
def episodes(draw, index: int) -> dict:
    actions = [
        {
            "action_type": "step",
            "input": draw(_text),
            "timestamp": 1_700_000_000 + i,
            **({"action_id": f"a{index}-{i}"} if draw(st.booleans()) else {}),
        }
        for i in range(draw(st.integers(0, 40)))
    ]
    data = {
        "episode_id": f"ep-{index}",
        "task": {"description": "x" + draw(_text)},
        "outcome": "success",
        "completed_at": 1_700_001_000,
        "user_id": "u1",
        "actions": actions,
        "feedback": {"reward": 0.5, "message": draw(_text)},
        "metadata": {"k": draw(_text)},
    }
    for name in SPLIT_FIELDS:
        if draw(st.booleans()):
            data[name] = {"note": draw(_text)} if name == "context" else draw(_text)
    return data


def _folded(parts_in_order: list[dict]):
    """The consolidator's fold of one episode's parts, published one request after another."""
    events = [
        EpisodeCompleted(
            namespace="ns",
            episode_id=part["episode_id"],
            occurred_at=1_800_000_000 + i,
            episode=parse_episode(part),
        )
        for i, part in enumerate(parts_in_order)
    ]
    return fold(events).episode


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.integers(2_500, 12_000), st.integers(1, 4), st.integers(1, 7))
def test_bodies_fit_their_bounds_and_fold_to_each_episode(data, max_bytes, max_batch, max_actions):
    eps = [data.draw(episodes(i)) for i in range(data.draw(st.integers(1, 5)))]
    try:
        bodies = request_bodies(eps, max_bytes=max_bytes, max_batch=max_batch, max_actions=max_actions)
    except InvalidEpisode as exc:  # only when one field or action cannot fit beside the small fields
        [(path, reason)] = exc.errors
        assert path.startswith("episodes[") and f"{max_bytes:,} bytes" in reason
        event("one piece too large")
        return
    event(f"{len(bodies) if len(bodies) < 4 else '4+'} requests")
    seen: dict[str, list[dict]] = {}
    for body in bodies:
        assert len(encode_body(body)) <= max_bytes
        ids = [e["episode_id"] for e in body["episodes"]]
        assert len(ids) <= max_batch and len(set(ids)) == len(ids)  # one version per request
        for part in body["episodes"]:
            assert len(part.get("actions", ())) <= max_actions
            assert parse_episode(part) is not None  # each part is an episode the service accepts
            seen.setdefault(part["episode_id"], []).append(part)
    assert list(seen) == [e["episode_id"] for e in eps]  # first parts in the list's order
    for ep in eps:
        assert _folded(seen[ep["episode_id"]]) == _folded([ep])


def test_what_fits_is_one_body_equal_to_the_list():
    eps = [{"episode_id": f"e{i}", "task": {"description": "t"}, "outcome": "success"} for i in range(3)]
    assert request_bodies(eps) == [{"episodes": eps}]


def test_large_fields_and_actions_go_in_parts_each_with_the_small_fields():
    big = "\u4e2d" * 1_000  # 3,000 bytes of UTF-8
    ep = {
        "episode_id": "e1",
        "task": {"description": "t"},
        "outcome": "success",
        "user_id": "u1",
        "solution": big,
        "thoughts": big,
        "actions": [{"action_type": "s", "input": big} for _ in range(3)],
    }
    parts = episode_parts(ep, 0, max_bytes=4_000)
    assert len(parts) == 5  # each 3,000-byte piece alone beside the small fields
    assert all(p["user_id"] == "u1" and p["outcome"] == "success" for p in parts)
    assert [
        sorted(k for k, v in p.items() if v and k not in {"episode_id", "task", "outcome", "user_id"})
        for p in parts
    ] == [
        ["thoughts"],
        ["solution"],
        ["actions"],
        ["actions"],
        ["actions"],
    ]


def test_what_cannot_fit_is_named_before_anything_is_sent():
    ep = {"episode_id": "e1", "task": {"description": "t"}, "outcome": "success", "solution": "x" * 5_000}
    with pytest.raises(InvalidEpisode) as exc:
        request_bodies([ep, {**ep, "episode_id": "e2", "solution": "ok"}], max_bytes=4_000)
    [(path, reason)] = exc.value.errors
    assert path == "episodes[0].solution" and "4,000 bytes" in reason and "ENGRAM_MAX_BODY_BYTES" in reason
    huge_task = {**ep, "solution": None, "task": {"description": "y" * 5_000}}
    with pytest.raises(InvalidEpisode) as exc:
        request_bodies([huge_task], max_bytes=4_000)
    assert exc.value.errors[0][0] == "episodes[0]"


def test_a_read_back_episode_splits_the_same_way():
    """`episode_to_dict` of a parsed episode (what `Calls.publish` splits) round-trips through the parts."""
    ep = parse_episode(
        {
            "episode_id": "e1",
            "task": {"description": "t"},
            "outcome": "success",
            "actions": [
                {"action_type": "s", "input": "z" * 500, "timestamp": 1_700_000_000 + i} for i in range(30)
            ],
        },
        max_actions=None,
    )
    bodies = request_bodies([episode_to_dict(ep)], max_bytes=3_000)
    assert len(bodies) > 1
    assert _folded([b["episodes"][0] for b in bodies]) == _folded([episode_to_dict(ep)])


def test_the_byte_bounds_are_exact():
    """At the limit a body is one request; one byte less splits it (an episode into parts, a list into
    requests), and every body stays within the bound."""
    ep = {
        "episode_id": "e1",
        "task": {"description": "t"},
        "outcome": "success",
        "solution": "x" * 500,
        "actions": [{"action_type": "s", "input": "y" * 300}],
    }
    size = len(encode_body({"episodes": [ep]}))
    assert request_bodies([ep], max_bytes=size) == [{"episodes": [ep]}]
    split = request_bodies([ep], max_bytes=size - 1)
    assert len(split) == 2 and all(len(encode_body(b)) <= size - 1 for b in split)

    a, b = ({"episode_id": i, "task": {"description": "t"}, "outcome": "success"} for i in ("a", "b"))
    both = len(encode_body({"episodes": [a, b]}))
    assert request_bodies([a, b], max_bytes=both) == [{"episodes": [a, b]}]
    assert request_bodies([a, b], max_bytes=both - 1) == [{"episodes": [a]}, {"episodes": [b]}]


def test_the_parts_answers_join_into_one_per_episode():
    """`calls.joined`: every episode once in its first part's order, not projected (with the reason of
    the part that was not) if any of its parts was not."""
    from engram_episodic.calls import joined
    from engram_episodic.types import Accepted, IngestResult

    first = IngestResult(
        accepted=2,
        results=(
            Accepted(episode_id="e1", event_id="x1", projected=True),
            Accepted(episode_id="e2", event_id="x2", projected=True),
        ),
        projected=True,
    )
    second = IngestResult(
        accepted=1,
        results=(Accepted(episode_id="e1", event_id="x3", projected=False, reason="dead_lettered"),),
        projected=False,
    )
    both = joined([first, second])
    assert both.accepted == 2 and both.projected is False
    assert [(a.episode_id, a.event_id, a.projected, a.reason) for a in both.results] == [
        ("e1", "x1", False, "dead_lettered"),
        ("e2", "x2", True, None),
    ]
    assert joined([first]) is first


def test_publish_refuses_one_episode_twice_before_sending():
    from engram_episodic.calls import Calls

    eps = [{"episode_id": i, "task": "t", "outcome": "success"} for i in ("a", "b", "a")]
    with pytest.raises(InvalidEpisode) as exc:
        Calls.publish(eps)
    assert exc.value.errors == [
        ("episodes[2].episode_id", "repeats episodes[0].episode_id ('a'); send one version of an episode")
    ]
