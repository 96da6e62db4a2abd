"""The JSON Schema (2020-12, as OpenAPI 3.1 embeds it) of an episode: what `validation.parse_episode`
accepts, as agents send it, and the form the service answers with.

It is built from the validator's own checks (`engram_episodic.validation.EPISODE_FIELDS` and those of
the task, an action, feedback): each field's `Tag`, `Text` or `Number` carries its limits, so the document
cannot lag the validator. A field of a dataclass without a check fails at import; a test runs samples
through both and compares verdicts.

What a schema cannot say is left to the server's 422 (named in `description`): a lone surrogate,
`tests_passed` above `tests_total`, `completed_at` before `started_at`, `context` past 64 KiB as
compact UTF-8 JSON, a vector of the wrong dimension or that rounds to zero in float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from engram_episodic.events import OUTCOMES, Action, Episode, Feedback, Task
from engram_episodic.timeutil import MAX_SECONDS, MIN_SECONDS
from engram_episodic.validation import (
    ACTION_FIELDS,
    DURATION_PATTERN,
    EPISODE_FIELDS,
    FEEDBACK_FIELDS,
    FLOAT32_MAX,
    MAX_ACTIONS,
    MAX_JSON_BYTES,
    MAX_TEXT_CHARS,
    MAX_TTL,
    MAX_VECTOR_DIM,
    TASK_FIELDS,
    Check,
    Number,
    Tag,
    Text,
    check_bool,
    check_instant,
    check_json_object,
    check_outcome,
    parse_actions,
    parse_feedback,
    parse_task,
    parse_vector,
)

# `check_tag_value`: no control character (Unicode Cc) anywhere, no whitespace at either end (RediSearch
# trims TAG values), not empty. ECMA-262 and Python's `re` read this pattern alike.
_CC = r"\u0000-\u001f\u007f-\u009f"
TAG_PATTERN = rf"^[^\s{_CC}]([^{_CC}]*[^\s{_CC}])?$"


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """`null` reads as absent in `parse_episode`: an optional field may be sent as null."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def instant(*, response: bool) -> dict[str, Any]:
    """An instant: ISO 8601 with an offset or UTC epoch seconds in; ISO 8601 `Z` out."""
    iso = {"type": "string", "format": "date-time", "description": "ISO 8601 with a UTC offset"}
    if response:
        return iso
    return {
        "oneOf": [
            iso,
            {
                "type": "number",
                "minimum": MIN_SECONDS,
                "maximum": MAX_SECONDS,
                "description": "UTC epoch seconds (years 1..9999)",
            },
        ]
    }


def ttl_schema(description: str) -> dict[str, Any]:
    """A positive duration of at most 100 years (`validation._ttl`): seconds, or `90s`, `30m`, `12h`,
    `1d`, `1w`, `250ms`; given instead of `expires_at`."""
    return _nullable(
        {
            "oneOf": [
                {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TTL},
                {"type": "string", "pattern": DURATION_PATTERN},
            ],
            "description": f"{description}; not with expires_at",
        }
    )


def _derived(description: str) -> dict[str, Any]:
    return {"type": ["number", "null"], "readOnly": True, "description": f"{description} (ignored on input)"}


_DESCRIPTIONS = {
    "Task.description": "what the agent was asked to do",
    "Task.category": "default `unknown`",
    "Feedback.reward": "recall clips it to [0, 1]",
    "Feedback.tests_passed": "at most tests_total",
    "Episode.episode_id": "default: a new UUID; re-publishing the same id replaces the episode",
    "Episode.context": "what the agent saw",
    "Episode.metadata": "free-form labels",
    "Episode.completed_at": "default: when the service accepted it",
    "Episode.expires_at": "hidden from every read after it, then erased (docs/api.md, 'Expiry')",
    "Episode.vector": "your own embedding, of the index's dimension (not the zero vector)",
}
"""The words of a field's schema (`Class.field`) beyond what its check says."""


def _value_schema(
    check: Check, *, response: bool, refs: Mapping[str, str] | None = None, description: str | None = None
) -> dict[str, Any]:
    """The JSON schema of the values other than null that a field's `check` accepts; the task, actions
    and feedback as `$ref`s to `refs[name]` when given; KeyError for a check no schema states."""

    def nested(name: str, build: Callable[..., dict[str, Any]]) -> dict[str, Any]:
        return {"$ref": refs[name]} if refs is not None else build(response=response)

    out: dict[str, Any]
    if isinstance(check, Tag):  # `check_tag_value`
        out = {"type": "string", "minLength": 1, "maxLength": check.max_chars, "pattern": TAG_PATTERN}
    elif isinstance(check, Text):
        blank = {"minLength": 1, "pattern": r"\S"} if check.required else {}  # refuses empty or blank
        out = {"type": "string", "maxLength": MAX_TEXT_CHARS, **blank}
    elif isinstance(check, Number):
        out = {"type": "integer" if check.integer else "number", "minimum": check.lo, "maximum": check.hi}
    elif check is check_instant:
        out = instant(response=response)
    elif check in (check_bool, check_outcome):
        out = {"type": "boolean"} if check is check_bool else {"type": "string", "enum": list(OUTCOMES)}
    elif check is check_json_object:
        out = {"type": "object", "additionalProperties": True}
        description = (
            f"{description}; at most {MAX_JSON_BYTES:,} bytes as compact UTF-8 JSON, nested at most 32 levels, "
            "integers within 64 bits, finite numbers"
        )
    elif check is parse_task:
        out = nested("Task", task_schema)
        if not response:  # or a plain description
            plain = _value_schema(
                TASK_FIELDS["description"], response=False, description="a plain description"
            )
            out = {"oneOf": [out, plain]}
    elif check is parse_actions:
        out = {"type": "array", "maxItems": MAX_ACTIONS, "items": nested("Action", action_schema)}
    elif check is parse_feedback:
        out = nested("Feedback", feedback_schema)
    elif check is parse_vector:
        bound = {"type": "number", "minimum": -FLOAT32_MAX, "maximum": FLOAT32_MAX}
        out = {"type": "array", "minItems": 1, "maxItems": MAX_VECTOR_DIM, "items": bound}
    else:
        raise KeyError(f"no schema for the check {check!r}")
    return {**out, "description": description} if description else out


def _object(
    cls: type,
    checks: Mapping[str, Check],
    *,
    response: bool,
    required: tuple[str, ...],
    title: str,
    refs: Mapping[str, str] | None = None,
    extra: dict[str, dict[str, Any]] | None = None,
    description: str | None = None,
) -> dict[str, Any]:
    """The object schema of a dataclass: one property per field, in field order, from its check
    (nullable in a request unless required), then the derived `extra` fields; unknown fields refused,
    as `parse_episode` does."""
    props: dict[str, dict[str, Any]] = {}
    for f in dataclasses.fields(cls):
        check = checks[f.name]
        words = _DESCRIPTIONS.get(f"{cls.__name__}.{f.name}")
        schema = _value_schema(check, response=response, refs=refs, description=words)
        optional = not (response or f.name in required or getattr(check, "required", False))
        props[f.name] = _nullable(schema) if optional else schema
    props.update(extra or {})
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    out["title"] = title
    if description:
        out["description"] = description
    if required:
        out["required"] = list(required)
    return out


def task_schema(*, response: bool = False) -> dict[str, Any]:
    required = ("description", "category") if response else ("description",)
    return _object(
        Task, TASK_FIELDS, response=response, required=required, title="TaskOut" if response else "Task"
    )


def action_schema(*, response: bool = False) -> dict[str, Any]:
    title = "ActionOut" if response else "Action"
    return _object(Action, ACTION_FIELDS, response=response, required=("action_type",), title=title)


def feedback_schema(*, response: bool = False) -> dict[str, Any]:
    return _object(
        Feedback,
        FEEDBACK_FIELDS,
        response=response,
        required=(),
        extra={"pass_rate": _derived("tests_passed / tests_total")},
        title="FeedbackOut" if response else "Feedback",
    )


RESPONSE_REQUIRED = ("episode_id", "task", "outcome", "completed_at")
"""What every episode the service answers with has: the codec refuses an event without a task, the fold
makes a completion without an outcome `abandoned` and one without `completed_at` completed when it
occurred. A draft (`GET /v1/episodes/{id}` of one not completed yet) has only the first two."""


def episode_schema(
    *, response: bool = False, refs: dict[str, str] | None = None, draft: bool = False
) -> dict[str, Any]:
    """The episode as `POST /v1/episodes` takes it (`response=False`: `task` and `outcome` required, the
    service refuses a finished episode without an outcome) or as the service answers with it (task an
    object, ISO 8601 instants, no vector, nothing null; `RESPONSE_REQUIRED` always there, or with
    `draft=True` only `episode_id` and `task`).

    `refs` maps `Task`, `Action`, `Feedback` to `$ref` targets (the OpenAPI document's components);
    without it the sub-schemas are inlined."""
    schema = _object(
        Episode,
        EPISODE_FIELDS,
        response=response,
        required=(RESPONSE_REQUIRED[:2] if draft else RESPONSE_REQUIRED) if response else ("task", "outcome"),
        refs=refs,
        extra={
            "duration_s": _derived("completed_at - started_at, seconds"),
            **({} if response else {"ttl": ttl_schema("expires_at as a duration after completed_at")}),
        },
        title=("EpisodeDraftOut" if draft else "EpisodeOut") if response else "Episode",
        description=(
            "An episode not completed yet (`status` draft): no outcome, no completed_at"
            if draft
            else "An episode as the service answers with it"
            if response
            else "An episode as agents send it (docs/api.md, 'The episode model'); validated by "
            "engram_episodic.validation.parse_episode"
        ),
    )
    if response:
        del schema["properties"]["vector"]
    return schema
