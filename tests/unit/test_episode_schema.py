"""The episode schema of the OpenAPI document refuses what the service refuses and accepts what it
accepts, on samples of every documented rule: each sample goes through `jsonschema` (the document's
`POST /v1/episodes` body) and through the server's own validation (`parse_episode`, plus the ingest
rule that a finished episode has an outcome)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from engram_episodic.events import Action, Episode, Feedback, Task
from engram_episodic.validation import Collector, parse_episode
from services.query.app import openapi_document
from tests.openapi_check import component, ingest_schema, validator

OK = {"task": "fix the flaky login test", "outcome": "success"}
FULL = {
    "episode_id": "ep-1",
    "agent_id": "coder",
    "user_id": "u 1",
    "session_id": "s-1",
    "task": {"description": "fix the login test", "category": "testing", "complexity": 0.4},
    "context": {"repo": "shop", "nested": {"a": [1, 2.5, None, True]}},
    "observation": "the test fails one run in five",
    "thoughts": "a clock?",
    "action": "froze the clock",
    "result": "green 50 runs",
    "solution": "freeze the clock in the fixture",
    "actions": [
        {
            "action_type": "run_tests",
            "input": "pytest -k login",
            "output": "1 failed",
            "timestamp": "2026-12-01T10:00:00+02:00",
            "success": False,
            "error": "AssertionError",
            "action_id": "a1",
        },
        {"action_type": "edit", "timestamp": 1764590000.5},
    ],
    "feedback": {"reward": 0.9, "message": "good", "tests_passed": 50, "tests_total": 50},
    "outcome": "success",
    "outcome_details": "all green",
    "importance": 7,
    "strategy_used": "iterative",
    "iterations": 3,
    "started_at": "2025-12-01T09:00:00Z",
    "completed_at": 1764590400,
    "source": "ci",
    "metadata": {"pr": 42},
    "vector": [0.1, -0.2, 3],
}


def with_(**fields: Any) -> dict[str, Any]:
    return {**OK, **fields}


ACCEPTED = [
    OK,
    FULL,
    with_(agent_id=None, feedback=None, actions=None, vector=None, importance=None),
    with_(task={"description": "d"}),
    with_(strategy_used="s" * 128),
    with_(agent_id="a" * 256, user_id="ユーザー", session_id="a b"),
    with_(importance=1, iterations=0),
    with_(importance=10.0, iterations=1e9),
    with_(feedback={"reward": -1e6, "tests_passed": 0, "tests_total": 0}),
    with_(task={"description": "d", "complexity": 0}, completed_at="9999-12-31T23:59:59Z"),
    with_(actions=[{"action_type": "a"}] * 1000),
    with_(solution="x" * 1_000_000),
    with_(outcome="abandoned"),
]
REFUSED = [
    {"task": "t"},  # no outcome: not a finished episode
    {"outcome": "success"},  # no task
    with_(unknown_field=1),
    with_(task={"description": "d", "extra": 1}),
    with_(task={"description": "   "}),
    with_(task=""),
    with_(task={"description": "d", "category": None}),
    with_(task={"description": "d", "complexity": 1.5}),
    with_(strategy_used="s" * 129),
    with_(strategy_used=" leading"),
    with_(strategy_used="trailing "),
    with_(strategy_used=""),
    with_(strategy_used="tab\tinside"),
    with_(agent_id="a" * 257),
    with_(agent_id="new\nline"),
    with_(agent_id=5),
    with_(episode_id=None),
    with_(outcome="won"),
    with_(outcome=None),
    with_(importance=0),
    with_(importance=11),
    with_(importance="5"),
    with_(importance=True),
    with_(iterations=-1),
    with_(iterations=1.5),
    with_(feedback={"reward": 2e6}),
    with_(feedback={"grade": "A"}),
    with_(feedback={"tests_passed": 1.5}),
    with_(actions=[{"input": "no type"}]),
    with_(actions=[{"action_type": "a", "success": "yes"}]),
    with_(actions=[{"action_type": "a"}] * 1001),
    with_(actions=["run"]),
    with_(solution="x" * 1_000_001),
    with_(context=[1, 2]),
    with_(metadata="labels"),
    with_(vector=[]),
    with_(vector=["a"]),
    with_(vector=[1e39]),
    with_(started_at="2026-12-01T09:00:00"),  # no offset: the schema can only say "date-time" (see below)
    with_(started_at=True),
    with_(completed_at=1e13),
]
# Rules a JSON Schema cannot state (the schema is a superset there; the service's 422 names the field):
# an ISO 8601 string's offset, only checked as `format: date-time` (not asserted by default).
SCHEMA_CANNOT_TELL = {id(REFUSED[-3])}


def server_accepts(body: Any) -> bool:
    errs = Collector()
    items = body["episodes"] if isinstance(body, dict) and "episodes" in body else [body]
    for i, item in enumerate(items):
        parse_episode(item, f"episodes[{i}]", errs, default_episode_id="generated")
        if isinstance(item, dict) and item.get("outcome") is None:
            errs.add("outcome", "is required")
    return not errs.errors


@pytest.mark.parametrize("body", ACCEPTED, ids=range(len(ACCEPTED)))
def test_the_schema_accepts_what_the_server_accepts(body):
    assert server_accepts(body)
    errors = [e.message[:200] for e in validator(ingest_schema()).iter_errors(body)]
    assert not errors
    assert validator(ingest_schema()).is_valid({"episodes": [body, body]})


@pytest.mark.parametrize("body", REFUSED, ids=range(len(REFUSED)))
def test_the_schema_refuses_what_the_server_refuses(body):
    assert not server_accepts(body)
    if id(body) in SCHEMA_CANNOT_TELL:
        return
    assert not validator(ingest_schema()).is_valid(body)
    assert not validator(ingest_schema()).is_valid({"episodes": [OK, body]})


def test_batches_follow_the_server():
    for body in ({"episodes": []}, {"episodes": [OK] * 1001}, {"episodes": [OK], "wait": 1}):
        assert not validator(ingest_schema()).is_valid(body)


def test_the_schema_has_every_field_of_the_model_with_its_limits():
    schemas = openapi_document()["components"]["schemas"]
    for name, cls in (("Episode", Episode), ("Task", Task), ("Action", Action), ("Feedback", Feedback)):
        fields = {f.name for f in dataclasses.fields(cls)}
        props = set(schemas[name]["properties"])
        assert fields <= props and props - fields <= {"duration_s", "pass_rate", "ttl"}, name
        assert schemas[name]["additionalProperties"] is False
    episode = schemas["Episode"]["properties"]
    assert {"solution", "observation", "context", "metadata", "vector"} <= set(episode)
    strategy = (
        episode["strategy_used"]["anyOf"][0]
        if "anyOf" in episode["strategy_used"]
        else episode["strategy_used"]
    )
    assert strategy["maxLength"] == 128 and "pattern" in strategy
    # the response form: what GET /v1/episodes/{id} and recall answer with
    out = component("EpisodeOut")
    done = {"outcome": "success", "completed_at": "2026-01-01T00:00:00Z"}
    task = {"description": "d", "category": "c"}
    assert out.is_valid({"episode_id": "e", "task": task, **done, "duration_s": 3.0})
    assert not out.is_valid({"episode_id": "e", "task": task, **done, "vector": [0.1]})


def test_what_every_answered_episode_has_is_required():
    """A generated client types `task`, `outcome` and `completed_at` as present on an answered
    episode; a draft (not completed) has only `episode_id` and `task`."""
    task = {"description": "d", "category": "c"}
    done = {"episode_id": "e", "task": task, "outcome": "success", "completed_at": "2026-01-01T00:00:00Z"}
    for name in ("task", "outcome", "completed_at"):
        assert not component("EpisodeOut").is_valid({k: v for k, v in done.items() if k != name}), name
    draft = component("EpisodeDraftOut")
    assert draft.is_valid({"episode_id": "e", "task": task})
    assert not draft.is_valid({"episode_id": "e"})
    assert component("TaskOut").is_valid(task) and not component("TaskOut").is_valid({"description": "d"})
