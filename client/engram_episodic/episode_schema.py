"""The JSON Schema (2020-12, as OpenAPI 3.1 embeds it) of an episode: what `validation.parse_episode`
accepts, as agents send it, and the form the service answers with.

It is built from what the validator is built from: the fields of the dataclasses (`Episode`, `Task`,
`Action`, `Feedback`, the very sets `parse_episode` checks unknown fields against) and the limits of
`engram_episodic.validation`. A field added to a dataclass without a schema here fails at import, so the
document cannot silently lag the validator; a test runs samples through both and compares verdicts.

What a schema cannot say is left to the server's 422 (named in `description`): a lone surrogate,
`tests_passed` above `tests_total`, `completed_at` before `started_at`, `context` past 64 KiB as
compact UTF-8 JSON, a vector of the wrong dimension or that rounds to zero in float32.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engram_episodic.events import OUTCOMES, Action, Episode, Feedback, Task
from engram_episodic.timeutil import MAX_SECONDS, MIN_SECONDS
from engram_episodic.validation import (
    DURATION_PATTERN,
    FLOAT32_MAX,
    MAX_ACTIONS,
    MAX_ID_CHARS,
    MAX_JSON_BYTES,
    MAX_TAG_CHARS,
    MAX_TEXT_CHARS,
    MAX_TTL,
    MAX_VECTOR_DIM,
    TEXT_FIELDS,
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


def tag(max_chars: int, description: str | None = None) -> dict[str, Any]:
    """A TAG value of 1..`max_chars` characters (ids: 256; category, strategy, action type: 128)."""
    out: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": max_chars, "pattern": TAG_PATTERN}
    if description:
        out["description"] = description
    return out


def _text(description: str | None = None, *, required: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "string", "maxLength": MAX_TEXT_CHARS}
    if required:
        out.update(minLength=1, pattern=r"\S")  # not empty or blank
    if description:
        out["description"] = description
    return out


def _number(lo: float, hi: float, *, integer: bool = False, description: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer" if integer else "number", "minimum": lo, "maximum": hi}
    if description:
        out["description"] = description
    return out


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


def _json_object(description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": True,
        "description": f"{description}; at most {MAX_JSON_BYTES:,} bytes as compact UTF-8 JSON, nested at most "
        "32 levels, integers within 64 bits, finite numbers",
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


def _object(
    cls: type,
    properties: dict[str, dict[str, Any]],
    required: tuple[str, ...],
    *,
    extra: dict[str, dict[str, Any]] | None = None,
    description: str | None = None,
    title: str | None = None,
) -> dict[str, Any]:
    """The object schema of a dataclass: one property per field, in field order (KeyError for a field
    without one), then the derived `extra` fields; unknown fields refused, as `parse_episode` does."""
    props = {f.name: properties[f.name] for f in dataclasses.fields(cls)}
    unknown = set(properties) - set(props)
    if unknown:
        raise KeyError(f"schema for fields {cls.__name__} does not have: {sorted(unknown)}")
    props.update(extra or {})
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if title:
        out["title"] = title
    if description:
        out["description"] = description
    if required:
        out["required"] = list(required)
    return out


def _opt(schema: dict[str, Any], response: bool) -> dict[str, Any]:
    return schema if response else _nullable(schema)


def task_schema(*, response: bool = False) -> dict[str, Any]:
    return _object(
        Task,
        {
            "description": _text("what the agent was asked to do", required=True),
            "category": tag(MAX_TAG_CHARS, "default `unknown`"),
            "complexity": _opt(_number(0, 1), response),
        },
        ("description", "category") if response else ("description",),
        title="TaskOut" if response else "Task",
    )


def action_schema(*, response: bool = False) -> dict[str, Any]:
    return _object(
        Action,
        {
            "action_type": tag(MAX_TAG_CHARS),
            "input": _opt(_text(), response),
            "output": _opt(_text(), response),
            "timestamp": _opt(instant(response=response), response),
            "success": _opt({"type": "boolean"}, response),
            "error": _opt(_text(), response),
            "action_id": _opt(tag(MAX_ID_CHARS), response),
        },
        ("action_type",),
        title="ActionOut" if response else "Action",
    )


def feedback_schema(*, response: bool = False) -> dict[str, Any]:
    count = _number(0, 1e9, integer=True)
    return _object(
        Feedback,
        {
            "reward": _opt(_number(-1e6, 1e6, description="recall clips it to [0, 1]"), response),
            "message": _opt(_text(), response),
            "tests_passed": _opt({**count, "description": "at most tests_total"}, response),
            "tests_total": _opt(count, response),
        },
        (),
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

    def sub(name: str, build: Any) -> dict[str, Any]:
        if refs is not None:
            return {"$ref": refs[name]}
        return build(response=response)

    task = sub("Task", task_schema)
    if not response:
        task = {"oneOf": [task, _text("a plain description", required=True)]}
    ident = tag(MAX_ID_CHARS)
    properties: dict[str, dict[str, Any]] = {
        "episode_id": tag(
            MAX_ID_CHARS, "default: a new UUID; re-publishing the same id replaces the episode"
        ),
        "agent_id": _opt(ident, response),
        "user_id": _opt(ident, response),
        "session_id": _opt(ident, response),
        "task": task,
        "context": _opt(_json_object("what the agent saw"), response),
        **{name: _opt(_text(), response) for name in TEXT_FIELDS},
        "actions": _opt(
            {"type": "array", "maxItems": MAX_ACTIONS, "items": sub("Action", action_schema)}, response
        ),
        "feedback": _opt(sub("Feedback", feedback_schema), response),
        "outcome": {"type": "string", "enum": list(OUTCOMES)},
        "importance": _opt(_number(1, 10), response),
        "strategy_used": _opt(tag(MAX_TAG_CHARS), response),
        "iterations": _opt(_number(0, 1e9, integer=True), response),
        "started_at": _opt(instant(response=response), response),
        "completed_at": _opt(
            {**instant(response=response), "description": "default: when the service accepted it"}, response
        ),
        "metadata": _opt(_json_object("free-form labels"), response),
        "expires_at": _opt(
            {
                **instant(response=response),
                "description": "hidden from every read after it, then erased (docs/api.md, 'Expiry')",
            },
            response,
        ),
        "vector": _nullable(
            {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_VECTOR_DIM,
                "items": {"type": "number", "minimum": -FLOAT32_MAX, "maximum": FLOAT32_MAX},
                "description": "your own embedding, of the index's dimension (not the zero vector)",
            }
        ),
    }
    schema = _object(
        Episode,
        properties,
        (RESPONSE_REQUIRED[:2] if draft else RESPONSE_REQUIRED) if response else ("task", "outcome"),
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
