"""Every validation error path names the field and the reason."""

from __future__ import annotations

import math

import pytest

from engram_episodic.errors import InvalidEpisode
from engram_episodic.validation import MAX_ACTIONS, MAX_ID_CHARS, MAX_JSON_BYTES, MAX_TAG_CHARS, parse_episode

GOOD = {
    "episode_id": "e1",
    "task": {"description": "fix the test", "category": "debugging"},
    "outcome": "success",
}


def errors_of(data) -> dict[str, str]:
    with pytest.raises(InvalidEpisode) as info:
        parse_episode(data)
    return dict(info.value.errors)


def test_good_episode_parses_with_string_task_and_iso_times():
    ep = parse_episode(
        {
            **GOOD,
            "task": "plain description",
            "started_at": "2025-07-25T02:00:00+02:00",
            "completed_at": 1753401600,
        }
    )
    assert ep.task.description == "plain description" and ep.task.category == "unknown"
    assert ep.started_at == 1753401600.0 and ep.duration_s == 0.0


@pytest.mark.parametrize(
    "patch, path, reason",
    [
        ({"episode_id": None}, "episode_id", "is required"),
        ({"episode_id": ""}, "episode_id", "must not be empty"),
        ({"episode_id": "   "}, "episode_id", "must not be empty"),
        ({"episode_id": "x" * (MAX_ID_CHARS + 1)}, "episode_id", "at most 256"),
        ({"agent_id": "a\nb"}, "agent_id", "control characters"),
        ({"user_id": " lead"}, "user_id", "start or end with whitespace"),
        ({"agent_id": "trail "}, "agent_id", "start or end with whitespace"),
        ({"user_id": 5}, "user_id", "must be a string"),
        ({"task": None}, "task", "is required"),
        ({"task": 3}, "task", "must be an object"),
        ({"task": {"description": ""}}, "task.description", "must not be empty"),
        (
            {"task": {"description": "d", "category": "c" * (MAX_TAG_CHARS + 1)}},
            "task.category",
            "at most 128",
        ),
        ({"task": {"description": "d", "complexity": 1.5}}, "task.complexity", "between 0 and 1"),
        ({"task": {"description": "d", "complexity": math.nan}}, "task.complexity", "finite"),
        ({"task": {"description": "d", "bogus": 1}}, "task.bogus", "not a known field"),
        ({"outcome": "won"}, "outcome", "must be one of"),
        ({"importance": 11}, "importance", "between 1 and 10"),
        ({"importance": math.inf}, "importance", "finite"),
        ({"iterations": 1.5}, "iterations", "integer"),
        ({"feedback": {"reward": math.nan}}, "feedback.reward", "finite"),
        ({"feedback": {"reward": "high"}}, "feedback.reward", "must be a number"),
        ({"feedback": {"tests_passed": 5, "tests_total": 3}}, "feedback.tests_passed", "must not exceed"),
        ({"feedback": []}, "feedback", "must be an object"),
        ({"started_at": "2025-07-25T02:00:00"}, "started_at", "no UTC offset"),
        ({"started_at": "yesterday"}, "started_at", "not ISO 8601"),
        ({"started_at": True}, "started_at", "boolean"),
        ({"started_at": 10, "completed_at": 5}, "completed_at", "before started_at"),
        ({"context": [1]}, "context", "JSON object"),
        ({"metadata": {"x": "y" * MAX_JSON_BYTES}}, "metadata", "at most"),
        ({"metadata": {"x": math.nan}}, "metadata.x", "finite"),
        ({"actions": "x"}, "actions", "must be a list"),
        ({"actions": 0}, "actions", "must be a list"),
        ({"actions": False}, "actions", "must be a list"),
        ({"actions": ""}, "actions", "must be a list"),
        ({"actions": {}}, "actions", "must be a list"),
        ({"actions": [{}]}, "actions[0].action_type", "is required"),
        ({"actions": [{"action_type": "t", "success": "yes"}]}, "actions[0].success", "true or false"),
        ({"actions": [{"action_type": "t"}] * (MAX_ACTIONS + 1)}, "actions", "at most"),
        ({"strategy_used": "a\x1fb"}, "strategy_used", "control characters"),
        ({"vector": []}, "vector", "non-empty"),
        ({"vector": [0, 0]}, "vector", "zero vector"),
        ({"vector": [1e39, 1.0]}, "vector", "float32"),
        ({"vector": [10**400, 1.0]}, "vector", "float32"),
        ({"vector": [1e-50, -1e-50]}, "vector", "zero vector"),
        ({"vector": [1, math.nan]}, "vector", "finite"),
        ({"solution": 7}, "solution", "must be a string"),
        ({"surprise": 1}, "surprise", "not a known field"),
    ],
)
def test_each_error_names_field_and_reason(patch, path, reason):
    errs = errors_of({**GOOD, **patch})
    assert path in errs, errs
    assert reason in errs[path]


def test_all_errors_reported_at_once():
    errs = errors_of({"episode_id": "", "task": {"description": ""}, "importance": 0, "outcome": "x"})
    assert {"episode_id", "task.description", "importance", "outcome"} <= errs.keys()


def test_not_an_object():
    assert errors_of([1]) == {"<root>": "must be a JSON object"}


@pytest.mark.parametrize("value", ["a,b", "x|y", "{curly}", "日本語", "emoji-🙂", "ns:with:colons", "_"])
def test_tag_values_with_separators_are_kept_whole(value):
    """Case C18: a category or strategy name holding a comma or a pipe is kept as one value."""
    ep = parse_episode({**GOOD, "strategy_used": value, "task": {"description": "d", "category": value}})
    assert ep.strategy_used == value and ep.task.category == value


def test_a_start_after_the_default_completion_names_started_at():
    """`started_at` two minutes ahead (within the clock skew) and no `completed_at` (so: now)
    is refused naming `started_at`, not `completed_at`, which was never sent."""
    import time

    from engram_episodic.validation import Collector

    errs = Collector()
    now = time.time()
    body = {"episode_id": "e1", "task": "x", "outcome": "success", "started_at": now + 120}
    assert parse_episode(body, "", errs, default_completed_at=now) is None
    assert [f for f, _ in errs.errors] == ["started_at"] and "defaults to now" in errs.errors[0][1], (
        errs.errors
    )


@pytest.mark.parametrize(
    ("patch", "path", "reason"),
    [
        ({"task": {"description": "t", "category": {}}}, "task.category", "must be a string, not an object"),
        ({"importance": "high"}, "importance", "must be a number, not a string"),
        ({"importance": True}, "importance", "must be a number, not a boolean"),
        ({"metadata": [1]}, "metadata", "must be a JSON object, not a list"),
        ({"episode_id": 7}, "episode_id", "must be a string, not a number"),
        ({"actions": [{"action_type": "t", "success": "yes"}]}, "actions[0].success", "not a string"),
    ],
)
def test_a_wrong_type_is_named_in_json_words_not_pythons(patch, path, reason):
    """Types are named in JSON words (`must be a string, not an object`), not Python's (`not dict`,
    `not str`)."""
    errs = errors_of({**GOOD, **patch})
    assert reason in errs[path], errs
