"""Property-based fuzzing of everything that parses untrusted input: the request models, the episode
validator behind POST /v1/episodes, and the event decoder fed near-valid envelopes.

The property is always the same: any input gives either a valid object or a *typed* error naming the
bad field (`Invalid` → 422, `InvalidEpisode` → 422, `DecodeError` → dead letter), never another
exception. `ENGRAM_FUZZ_EXAMPLES` sets the examples per property (small in `make test`, 2000 in
`make fuzz`).
"""

from __future__ import annotations

import math
import os
from typing import Any

import msgpack
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from engram_episodic.errors import EngramError, InvalidEpisode
from engram_episodic.events import Episode, EpisodeCompleted, Feedback, Task, UserForgotten
from engram_episodic.validation import parse_episode
from services.query import models
from services.query.problems import Invalid, validate
from services.query.views.facts import ConsolidateRequest, FactsSearchRequest
from shared.codec import decode, encode

FUZZ = int(os.environ.get("ENGRAM_FUZZ_EXAMPLES", "100"))
FUZZ_SETTINGS = settings(max_examples=FUZZ, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Hostile scalars: query syntax, control and odd Unicode characters, huge and non-finite numbers.
NASTY_TEXT = st.sampled_from(
    [
        "",
        " ",
        "\n\t",
        "\x00",
        "\x7f",
        "\u2028",
        "\ud7ff",
        "@namespace:{x}",
        "a|b",
        "*",
        "-x",
        "(x)",
        "=>",
        "$BLOB",
        "{",
        "}",
        "\\",
        "12h",
        "0s",
        "-1d",
        "1e999",
        "2025-07-25T02:00:00",
        "2025-07-25T02:00:00Z",
        "2025-13-45T99:99:99Z",
        "NaN",
        "success",
        "x" * 300,
        "日本語",
        "🙂",
    ]
)
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 100, 101, 1000, 10_000, 1e308, -0.0, 0.5]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=40), NASTY_TEXT)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.one_of(st.text(max_size=8), NASTY_TEXT), inner, max_size=4)
    ),
    max_leaves=12,
)

REQUEST_MODELS = [
    models.RecallRequest,
    models.ContextRequest,
    models.StrategyRequest,
    models.SuggestRequest,
    models.SkillsQuery,
    models.LearningCurveQuery,
    models.NumRange,
    models.WeightsIn,
    FactsSearchRequest,
    ConsolidateRequest,
]
EPISODE_KEYS = sorted(set(Episode.__dataclass_fields__) | {"duration_s", "reward", "extra_field"})


def near_valid(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts over the model's own keys (plus one unknown key) with arbitrary JSON values: far more
    likely to reach the validators than random keys are."""
    values = st.one_of(
        JSON, NASTY_TEXT, st.dictionaries(st.sampled_from(["gte", "lte", "gt", "eq"]), NUMBERS, max_size=3)
    )
    return st.dictionaries(
        st.sampled_from([*keys, "unknown_field", "namespace"]), values, max_size=len(keys) + 2
    )


def assert_typed_422(exc: Invalid) -> None:
    assert exc.errors, "an Invalid must name at least one field"
    for field, reason in exc.errors:
        assert isinstance(field, str) and field and isinstance(reason, str) and reason


def check_model(model, data: Any) -> None:
    try:
        obj = validate(model, data)
    except Invalid as exc:
        assert_typed_422(exc)
        return
    assert isinstance(obj, model)
    for value in obj.model_dump().values():  # whatever was accepted is finite and of a JSON type
        if isinstance(value, float):
            assert math.isfinite(value)


@FUZZ_SETTINGS
@given(st.sampled_from(REQUEST_MODELS), st.data())
def test_fuzz_request_models_accept_or_name_the_field(model, data):
    keys = list(model.model_fields)
    body = data.draw(st.one_of(near_valid(keys), JSON), label="body")
    check_model(model, body)


@FUZZ_SETTINGS
@given(
    st.sampled_from([models.SkillsQuery, models.LearningCurveQuery]),
    st.dictionaries(
        st.sampled_from(
            ["agent_id", "user_id", "session_id", "category", "threshold", "window", "limit", "other"]
        ),
        st.one_of(st.text(max_size=20), NASTY_TEXT),
        max_size=5,
    ),
)
def test_fuzz_query_parameters_are_strings(model, params):
    check_model(model, params)  # query strings arrive as str values only


@FUZZ_SETTINGS
@given(
    st.one_of(
        near_valid(EPISODE_KEYS),
        JSON,
        st.fixed_dictionaries(
            {"task": st.one_of(NASTY_TEXT, JSON), "outcome": st.one_of(NASTY_TEXT, JSON)},
            optional={
                k: JSON
                for k in (
                    "feedback",
                    "actions",
                    "importance",
                    "completed_at",
                    "started_at",
                    "vector",
                    "context",
                    "agent_id",
                )
            },
        ),
    )
)
def test_fuzz_episode_validation_is_typed(body):
    try:
        ep = parse_episode(body, default_episode_id="generated")
    except InvalidEpisode as exc:
        assert exc.errors and all(isinstance(f, str) and isinstance(r, str) for f, r in exc.errors)
        return
    assert isinstance(ep, Episode)
    assert (
        decode(
            encode(EpisodeCompleted(namespace="ns", episode_id=ep.episode_id, occurred_at=1.0, episode=ep))
        ).episode
        == ep
    )


def _valid_envelopes() -> list[dict[str, Any]]:
    ep = Episode(
        episode_id="e1",
        task=Task(description="a task"),
        outcome="success",
        feedback=Feedback(reward=0.5),
        completed_at=10.0,
    )
    events = [
        EpisodeCompleted(namespace="ns", episode_id="e1", occurred_at=10.0, episode=ep),
        UserForgotten(namespace="ns", user_id="u1", occurred_at=10.0),
    ]
    return [msgpack.unpackb(encode(e)) for e in events]


def _mutate(envelope: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    copy = msgpack.unpackb(msgpack.packb(envelope, default=str), strict_map_key=False)
    node = copy
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return copy


DATA_PATHS = (
    [["data", k] for k in ("event_id", "namespace", "occurred_at", "episode_id", "user_id", "episode")]
    + [
        ["data", "episode", k]
        for k in (
            "episode_id",
            "task",
            "outcome",
            "feedback",
            "actions",
            "vector",
            "completed_at",
            "importance",
            "context",
        )
    ]
    + [["v"], ["type"]]
)


@FUZZ_SETTINGS
@given(
    st.sampled_from(_valid_envelopes()),
    st.sampled_from(DATA_PATHS),
    st.one_of(JSON, NASTY_TEXT, st.binary(max_size=20)),
)
def test_fuzz_decoder_near_valid_envelopes_are_typed(envelope, path, value):
    try:
        payload = msgpack.packb(_mutate(envelope, path, value), use_bin_type=True)
    except OverflowError:  # an integer msgpack cannot carry never reaches the decoder
        assume(False)
    try:
        decode(payload)
    except EngramError:
        pass
