"""Request models of the HTTP API (pydantic v2): the single source of validation and of the OpenAPI schemas.

Every model forbids unknown fields (an unknown filter or operator is a 422 naming it, never silently ignored)
and validates strictly: `"5"` is not a `top_k`, `true` is not a number. Union-shaped inputs (one value or
a list, ISO 8601 or epoch, seconds or "12h") use plain validators with explicit JSON schemas, so an error
names the field once, with one reason, instead of one line per union member.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    PlainValidator,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import core_schema

from engram_episodic.episode_schema import episode_schema, ttl_schema
from engram_episodic.errors import ConfigError
from engram_episodic.events import OUTCOMES
from engram_episodic.timeutil import parse_instant
from engram_episodic.validation import MAX_ID_CHARS, MAX_TAG_CHARS, Collector, check_tag_value
from services.query.insights import MIN_SIMILARITY
from shared.settings import parse_duration

MAX_TOP_K = 100
MAX_CANDIDATES = 1000
MAX_QUERY_CHARS = 10_000
MAX_LIST_VALUES = 100


# --- reusable field types ---------------------------------------------------------------------------
def _tag(max_chars: int):
    def validate(value: Any) -> str:
        errs = Collector()
        out = check_tag_value(value, "", errs, max_chars=max_chars, required=True)
        if errs.errors:
            raise ValueError(errs.errors[0][1])
        return out  # type: ignore[return-value]

    return validate


IdStr = Annotated[
    str,
    PlainValidator(_tag(MAX_ID_CHARS)),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS}),
]
CategoryStr = Annotated[
    str,
    PlainValidator(_tag(MAX_TAG_CHARS)),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": MAX_TAG_CHARS}),
]
"""A task category: a TAG value of at most MAX_TAG_CHARS, as an episode's `task.category` (an id's 256
let a request name a category no episode can have)."""


def _tag_list(max_chars: int, choices: tuple[str, ...] | None = None):
    check = _tag(max_chars)

    def validate(value: Any) -> tuple[str, ...]:
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not values:
            raise ValueError("must be a string or a non-empty list of strings")
        if len(values) > MAX_LIST_VALUES:
            raise ValueError(f"must list at most {MAX_LIST_VALUES} values")
        out = []
        for v in values:
            v = check(v)
            if choices is not None and v not in choices:
                raise ValueError(f"{v[:40]!r} is not one of {', '.join(choices)}")
            out.append(v)
        return tuple(dict.fromkeys(out))

    return validate


def _one_or_list_schema(item: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": [item, {"type": "array", "items": item, "minItems": 1, "maxItems": MAX_LIST_VALUES}]}


TagList = Annotated[
    tuple[str, ...],
    PlainValidator(_tag_list(MAX_TAG_CHARS)),
    WithJsonSchema(_one_or_list_schema({"type": "string", "maxLength": MAX_TAG_CHARS})),
]
OutcomeList = Annotated[
    tuple[str, ...],
    PlainValidator(_tag_list(MAX_TAG_CHARS, OUTCOMES)),
    WithJsonSchema(_one_or_list_schema({"type": "string", "enum": list(OUTCOMES)})),
]


Instant = Annotated[
    float,
    PlainValidator(parse_instant),  # its ValueError carries the reason
    WithJsonSchema(
        {
            "oneOf": [
                {"type": "string", "format": "date-time", "description": "ISO 8601 with an offset"},
                {"type": "number", "description": "UTC epoch seconds"},
            ]
        }
    ),
]


def _duration(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("must be seconds (a number) or a duration string such as 12h")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value <= 0:
            raise ValueError("must be a positive number of seconds")
        return float(value)
    if isinstance(value, str):
        try:
            return parse_duration(value, name="half_life")
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix("half_life=")) from None
    raise ValueError("must be seconds (a number) or a duration string such as 12h")


Duration = Annotated[
    float,
    PlainValidator(_duration),
    WithJsonSchema(
        {
            "oneOf": [
                {"type": "number", "exclusiveMinimum": 0},
                {
                    "type": "string",
                    "pattern": r"^(0*[1-9][0-9]*(\.[0-9]+)?|0+\.[0-9]*[1-9][0-9]*)(ms|s|m|h|d|w)?$",
                    "description": "a positive duration: 3600, 90s, 30m, 12h, 1d, 1w or 250ms",
                },
            ]
        }
    ),
]


# A number in a query string, spelled as JSON spells one (plus a leading "." or zeros): int() and
# float() also take surrounding whitespace, "1_000", and any script's digits ("１", "١٠"), and int()
# failed on "²" with a message naming Python; the documented schema is a number, nothing else. At most
# 20 characters for an int: int() refuses thousands of digits, again with Python's message.
_QUERY_INT = re.compile(r"-[0-9]{1,19}|[0-9]{1,20}", re.ASCII)
_QUERY_NUMBER = re.compile(r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


@dataclass(frozen=True, slots=True)
class Bounded:
    """`Annotated[int, Bounded(lo, hi)]`, `Annotated[float, Bounded(lo, hi)]`: a number of the annotated
    type in [lo, hi] (a float is finite and may be sent as an int; a boolean is neither) whose error
    states the range, so a caller knows what to send. `from_query`: also accept the decimal string of
    one (query parameters are strings; JSON bodies are not). Pydantic metadata (a validator and its JSON
    schema)."""

    lo: float
    hi: float
    from_query: bool = False

    def __get_pydantic_core_schema__(
        self, source: type, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        integer = source is int
        schema: core_schema.CoreSchema
        if integer:
            what, spelling = f"an integer between {self.lo} and {self.hi}", _QUERY_INT
            schema = core_schema.int_schema(ge=int(self.lo), le=int(self.hi))
        else:
            what, spelling = f"a number between {self.lo:g} and {self.hi:g}", _QUERY_NUMBER
            schema = core_schema.float_schema(ge=self.lo, le=self.hi)

        def validate(value: Any) -> Any:
            if self.from_query and isinstance(value, str) and spelling.fullmatch(value):
                value = source(value)
            if (
                isinstance(value, bool)
                or not isinstance(value, int if integer else int | float)
                or not (integer or math.isfinite(value))
                or not self.lo <= value <= self.hi
            ):
                raise ValueError(f"must be {what}")
            return source(value)

        return core_schema.no_info_plain_validator_function(validate, json_schema_input_schema=schema)


TopK = Annotated[int, Bounded(1, MAX_TOP_K)]
Relevance = Annotated[float, Bounded(0.0, 1.0)]
CandidateCount = Annotated[int, Bounded(1, MAX_CANDIDATES)]
Finite = Annotated[float, Bounded(-1e12, 1e12)]
NonNegative = Annotated[float, Bounded(0.0, 1e6)]


def _query_text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    if not value.strip():
        raise ValueError("must not be empty or blank")
    if len(value) > MAX_QUERY_CHARS:
        raise ValueError(f"must be at most {MAX_QUERY_CHARS} characters")
    return value


QueryText = Annotated[
    str,
    PlainValidator(_query_text),
    WithJsonSchema(
        {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS, "description": "non-blank"}
    ),
]


class Model(BaseModel):
    """A request's body or query parameters (validated strictly: `problems.validate`)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="after")
    def _window(self) -> Any:
        since, until = getattr(self, "since", None), getattr(self, "until", None)
        if since is not None and until is not None and since > until:
            raise ValueError("since: must not be later than until")
        return self


class NumRange(Model):
    """An inclusive numeric range: `{"gte": 0.5}`, `{"lte": 0.9}` or both. Other operators are a 422."""

    gte: Finite | None = None
    lte: Finite | None = None

    @model_validator(mode="after")
    def _ordered(self) -> NumRange:
        if self.gte is not None and self.lte is not None and self.gte > self.lte:
            raise ValueError("gte must not be greater than lte")
        return self

    def bounds(self) -> tuple[float | None, float | None]:
        return (self.gte, self.lte)


class WeightsIn(Model):
    """Explicit weights of the five signals (missing ones are 0); they win over `preset`."""

    similarity: NonNegative = 0.0
    recency: NonNegative = 0.0
    reward: NonNegative = 0.0
    outcome: NonNegative = 0.0
    importance: NonNegative = 0.0

    @model_validator(mode="after")
    def _some(self) -> WeightsIn:
        if not any((self.similarity, self.recency, self.reward, self.outcome, self.importance)):
            raise ValueError("at least one weight must be > 0")
        return self


class ScopeIn(Model):
    """Scope filters shared by every endpoint. The namespace is never here: it comes from the API key."""

    agent_id: IdStr | None = None
    user_id: IdStr | None = None
    session_id: IdStr | None = None


class FilterIn(ScopeIn):
    category: TagList | None = None
    outcome: OutcomeList | None = None
    strategy: TagList | None = None
    reward: NumRange | None = None
    importance: NumRange | None = None
    since: Instant | None = Field(None, description="inclusive lower bound on completed_at")
    until: Instant | None = Field(None, description="inclusive upper bound on completed_at")


class RecallRequest(FilterIn):
    """`POST /v1/recall`: the experiences worth replaying for `query`."""

    query: QueryText
    top_k: TopK | None = Field(None, description="1..100; default ENGRAM_DEFAULT_TOP_K")
    candidates: CandidateCount | None = Field(
        None,
        description="hits each candidate list contributes to the re-ranked pool, at least top_k; "
        "default Settings.recall_candidates (100), independent of top_k",
    )
    mode: Literal["vector", "keyword", "hybrid"] | None = Field(
        None,
        description="vector (cosine), keyword (BM25-shaped keyword relevance) or hybrid (both, "
        "combined); default ENGRAM_RECALL_MODE",
    )
    min_relevance: Relevance = Field(0.0, description="drop results whose relevance is below this (0..1)")
    min_priority: Relevance = Field(0.0, description="drop results whose priority is below this (0..1)")
    weights: WeightsIn | None = None
    preset: Literal["auto", "early", "normal", "late"] | None = None
    half_life: Duration | None = Field(None, description="seconds or e.g. '12h'; default ENGRAM_HALF_LIFE")
    as_of: Instant | None = Field(None, description="the instant decay is measured from; default now")
    normalize: Literal["none", "minmax"] = "none"
    recency_from: Literal["completed", "last_access"] = "completed"
    touch: bool = False


class ContextRequest(ScopeIn):
    """`POST /v1/context`: working memory for a task, with a prompt section of at most `max_chars`."""

    task: QueryText
    category: CategoryStr | None = Field(
        None, description="named in the prompt section's header; not a filter"
    )
    top_k: TopK | None = None
    max_chars: Annotated[int, Bounded(200, 200_000)] = 4000
    half_life: Duration | None = None
    min_relevance: Relevance | None = Field(
        None,
        description="recall only episodes at least this relevant (0..1); default the recall mode's floor "
        "(hybrid 0.15, vector 0.25, keyword: any query word), so an unrelated episode is not listed",
    )
    min_priority: Relevance = Field(0.0, description="recall only episodes of at least this priority (0..1)")


class StrategyRequest(ScopeIn):
    """`POST /v1/strategy`: which strategy to use for a task."""

    task: QueryText
    category: CategoryStr | None = Field(
        None, description="picks the skill profile the rule weighs (weak_category); not a filter"
    )
    complexity: Annotated[float, Bounded(0.0, 1.0)] | None = None
    k: Annotated[int, Bounded(1, 100)] = 10
    min_similarity: Annotated[float, Bounded(-1.0, 1.0)] = MIN_SIMILARITY


class SuggestRequest(ScopeIn):
    """`POST /v1/suggest`: how confident past experience is about a task, and what went wrong before."""

    task: QueryText
    category: CategoryStr | None = Field(None, description="a filter: only episodes of this task category")
    k: Annotated[int, Bounded(1, 100)] = 10
    min_similarity: Annotated[float, Bounded(-1.0, 1.0)] = MIN_SIMILARITY


class SkillsQuery(ScopeIn):
    """`GET /v1/skills` query parameters."""

    threshold: Annotated[float, Bounded(0.0, 1.0, from_query=True)] = 0.5


class LearningCurveQuery(ScopeIn):
    """`GET /v1/learning-curve` query parameters."""

    category: CategoryStr | None = None
    window: Annotated[int, Bounded(1, 1000, from_query=True)] = 5
    limit: Annotated[int, Bounded(1, 10_000, from_query=True)] = 1000


MAX_BATCH = 1000
_EPISODE_REF = {"$ref": "#/components/schemas/Episode"}  # engram_episodic.episode_schema, in the document
INGEST_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "required": ["episodes"],
            "additionalProperties": False,
            "properties": {
                "episodes": {"type": "array", "items": _EPISODE_REF, "minItems": 1, "maxItems": MAX_BATCH}
            },
        },
        _EPISODE_REF,
    ]
}
_EPISODE_IN = episode_schema()["properties"]  # sub-schemas inlined
UPDATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The fields to change (at least one), validated by "
    "engram_episodic.validation.parse_update: `feedback` merges field by field, `metadata` key by key "
    "(null removes a key), the others replace.",
    "minProperties": 1,
    "additionalProperties": False,
    "properties": {
        "feedback": _EPISODE_IN["feedback"],
        "outcome": _EPISODE_IN["outcome"],
        "outcome_details": _EPISODE_IN["outcome_details"],
        "importance": _EPISODE_IN["importance"],
        "metadata": {
            "type": "object",
            "additionalProperties": True,
            "description": "keys to set, any JSON value each; a null value removes the key (merged, "
            "the episode's metadata stays within its limits)",
        },
        "expires_at": _EPISODE_IN["expires_at"],
        "ttl": ttl_schema("a duration from now"),
    },
}
