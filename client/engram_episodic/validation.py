"""Untrusted JSON-shaped input → valid domain objects, or InvalidEpisode naming every bad field at once
(`(path, reason)` pairs), in words that name the fix: why it is kept over pydantic and msgspec. The same
builders decode stream entries (shared.codec). Each field's check (`Tag`, `Text`, `Number`, ...) holds
its limits (docs/api.md, 'The episode model'); `engram_episodic.episode_schema` reads them from there.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from engram_episodic.errors import InvalidEpisode
from engram_episodic.events import OUTCOMES, UPDATABLE, Action, Episode, Feedback, Task
from engram_episodic.shapes import episode_to_dict
from engram_episodic.timeutil import parse_instant

MAX_ID_CHARS = 256
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_SMALLEST = 1.401298464324817e-45  # the smallest positive float32 (subnormal)
MAX_TAG_CHARS = 128
MAX_TEXT_CHARS = 1_000_000
MAX_JSON_BYTES = 64 * 1024
MAX_ACTIONS = 1000
MAX_VECTOR_DIM = 8192
MAX_JSON_DEPTH = 32
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what msgpack (the stored form) can hold

DURATION_PATTERN = r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)?$"
_DURATION = re.compile(DURATION_PATTERN)
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}
MAX_TTL = 100 * 365 * 86400.0  # a century: anything longer is no expiry


def json_kind(value: Any) -> str:
    """What `value` is, in JSON's words for a refusal ("must be a string, not an object"): null, a
    boolean, a number, a string, an object, a list; a Python caller's other types by their name."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _ttl(value: Any, path: str, errs: Collector) -> float | None:
    """A positive duration (seconds, or `90s`, `30m`, `12h`, `1d`, `1w`, `250ms`) in seconds."""
    if value is None:
        return None
    seconds = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    if seconds is None or not math.isfinite(seconds) or not 0 < seconds <= MAX_TTL:
        errs.add(
            path, "must be a positive duration of at most 100 years: seconds, or e.g. 90s, 30m, 12h, 1d, 1w"
        )
        return None
    return seconds


def _times(
    value: Mapping[str, Any], path: str, errs: Collector, default_completed_at: float | None
) -> tuple[float | None, float | None]:
    """(started_at, completed_at) of an episode, UTC epoch seconds; completed_at `default_completed_at`
    when not given. A start after the completion names the field that was sent (`started_at` when the
    completion is the default)."""
    started_at = check_instant(value.get("started_at"), _join(path, "started_at"), errs)
    completed_at = check_instant(value.get("completed_at"), _join(path, "completed_at"), errs)
    if value.get("completed_at") is None:
        completed_at = default_completed_at
    if started_at is not None and completed_at is not None and completed_at < started_at:
        if value.get("completed_at") is None:
            errs.add(
                _join(path, "started_at"),
                "must not be after completed_at, which defaults to now (give completed_at, or an earlier start)",
            )
        else:
            errs.add(_join(path, "completed_at"), "must not be before started_at")
    return started_at, completed_at


def _expiry(value: Mapping[str, Any], path: str, errs: Collector, base: float | None) -> float | None:
    """`expires_at` (an instant) or `ttl` (a duration from `base`, else from now), not both."""
    expires_at = check_instant(value.get("expires_at"), _join(path, "expires_at"), errs)
    ttl = _ttl(value.get("ttl"), _join(path, "ttl"), errs)
    if value.get("expires_at") is not None and value.get("ttl") is not None:
        errs.add(_join(path, "ttl"), "give expires_at or ttl, not both")
        return None
    if ttl is not None:
        return (base if base is not None else time.time()) + ttl
    return expires_at


TEXT_FIELDS = ("observation", "thoughts", "action", "result", "solution", "outcome_details", "source")
"""An episode's free-text fields (besides `task`), each up to MAX_TEXT_CHARS."""


class Collector:
    """Accumulates `(path, reason)` errors; `raise_if_any()` turns them into InvalidEpisode."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []

    def add(self, path: str, reason: str) -> None:
        self.errors.append((path or "<root>", reason))

    def raise_if_any(self) -> None:
        if self.errors:
            raise InvalidEpisode(self.errors)


# exactly Unicode category Cc (C0, DEL, C1): one regex scan instead of a category lookup per character
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def unicode_problem(text: str) -> str | None:
    """Why `text` cannot be stored as UTF-8 (a lone surrogate such as JSON's "\\ud800"), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"must be valid Unicode text (a lone surrogate at character {exc.start})"
    return None


def json_problem(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> tuple[str, str] | None:
    """The first `(relative path, reason)` that makes a JSON value unstorable, or None.

    Checks, without recursion (so no input can exhaust the stack): nesting depth, strings that are not
    valid Unicode, integers outside 64 bits, non-finite floats, non-string keys, non-JSON types.
    """
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > max_depth:
            return path, f"is nested deeper than {max_depth} levels"
        if item is None or isinstance(item, bool | str | int | float):
            problem = _scalar_problem(item)
            if problem:
                return path, problem
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if not isinstance(key, str) or unicode_problem(key):
                    return path, "has a key that is not valid Unicode text"
                stack.append((child, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(item, list | tuple):
            for i, child in enumerate(item):
                stack.append((child, f"{path}[{i}]", depth + 1))
        else:
            return path, f"has a value of unsupported type {type(item).__name__}"
    return None


def json_size(value: Any) -> int:
    """The bytes of `value` as compact JSON in UTF-8: no whitespace between tokens, non-ASCII characters
    as themselves (not `\\u` escapes). What the 64 KiB bounds of `context` and `metadata` count, on the
    client and the service alike: a body sent compact counts exactly its field's bytes, one sent with
    spaces or `\\u` escapes counts less than it sent. Raises ValueError for NaN or infinity, TypeError for
    a value JSON cannot hold."""
    return len(json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode())


def _scalar_problem(item: None | bool | str | int | float) -> str | None:
    """Why a JSON scalar is unstorable (json_problem), or None."""
    if item is None or isinstance(item, bool):
        return None
    if isinstance(item, str):
        return unicode_problem(item)
    if isinstance(item, int):
        return None if _INT_MIN <= item <= _INT_MAX else "is an integer outside the 64-bit range"
    return None if math.isfinite(item) else "must be finite (NaN and infinity are rejected)"


@functools.lru_cache(maxsize=4096)  # the same few dozen paths, built for every field of every event
def _join(base: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{base}[{name}]"
    return f"{base}.{name}" if base else name


def _string(value: Any, path: str, errs: Collector, *, required: bool) -> str | None:
    """`value` when it is a string; otherwise None, adding "is required" (None while `required`) or
    "must be a string" (any other type) to `errs`."""
    if value is None:
        if required:
            errs.add(path, "is required")
        return None
    if not isinstance(value, str):
        errs.add(path, f"must be a string, not {json_kind(value)}")
        return None
    return value


def _without_unicode_problem(value: str, path: str, errs: Collector) -> str | None:
    """`value`, or None with `unicode_problem`'s reason added to `errs` (a lone surrogate, ...)."""
    problem = unicode_problem(value)
    if problem:
        errs.add(path, problem)
        return None
    return value


def check_tag_value(value: Any, path: str, errs: Collector, *, max_chars: int, required: bool) -> str | None:
    """A TAG value: a non-empty string of at most `max_chars`, no control characters."""
    value = _string(value, path, errs, required=required)
    if value is None:
        return None
    if value == "" or value.strip() == "":
        errs.add(path, "must not be empty or blank")
        return None
    if value != value.strip():
        # RediSearch trims TAG values: " lead" would be stored and matched as "lead", so a filter, a
        # forget or a namespace would reach another id's data
        errs.add(path, "must not start or end with whitespace")
        return None
    if len(value) > max_chars:
        errs.add(path, f"must be at most {max_chars} characters (got {len(value)})")
        return None
    if _CONTROL.search(value):
        errs.add(path, "must not contain control characters")
        return None
    return _without_unicode_problem(value, path, errs)


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1, bracketed or not); False otherwise.

    Other names (`localhost.localdomain`, ...) are False: /etc/hosts may point them anywhere.
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_id(value: Any, path: str, errs: Collector, *, required: bool = False) -> str | None:
    return check_tag_value(value, path, errs, max_chars=MAX_ID_CHARS, required=required)


Check = Callable[[Any, str, Collector], Any]  # (value, its path, errs) → its value, or None: null or refused


@dataclass(frozen=True)
class Tag:
    """A TAG value (`check_tag_value`) of at most `max_chars` characters."""

    max_chars: int
    required: bool = False

    def __call__(self, value: Any, path: str, errs: Collector) -> str | None:
        return check_tag_value(value, path, errs, max_chars=self.max_chars, required=self.required)


@dataclass(frozen=True)
class Text:
    """Free text of at most MAX_TEXT_CHARS characters; `required`: present and not blank."""

    required: bool = False

    def __call__(self, value: Any, path: str, errs: Collector) -> str | None:
        value = _string(value, path, errs, required=self.required)
        if value is None:
            return None
        if self.required and not value.strip():
            errs.add(path, "must not be empty or blank")
            return None
        if len(value) > MAX_TEXT_CHARS:
            errs.add(path, f"must be at most {MAX_TEXT_CHARS} characters (got {len(value)})")
            return None
        return _without_unicode_problem(value, path, errs)


@dataclass(frozen=True)
class Number:
    """A finite number in [`lo`, `hi`]; an int with `integer` (an integral float is taken)."""

    lo: float
    hi: float
    integer: bool = False

    def __call__(self, value: Any, path: str, errs: Collector) -> float | None:
        lo, hi = self.lo, self.hi
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            errs.add(path, f"must be a number, not {json_kind(value)}")
            return None
        if isinstance(value, int) and not -(2**53) <= value <= 2**53:  # beyond exact floats (and float())
            errs.add(
                path, f"must be between {lo:g} and {hi:g} (got an integer of {len(str(abs(value)))} digits)"
            )
            return None
        if not math.isfinite(value):
            errs.add(path, "must be finite (NaN and infinity are rejected)")
            return None
        if self.integer and not float(value).is_integer():
            errs.add(path, "must be an integer")
            return None
        if not lo <= value <= hi:
            errs.add(path, f"must be between {lo:g} and {hi:g} (got {value:g})")
            return None
        return int(value) if self.integer else float(value)


def check_instant(value: Any, path: str, errs: Collector) -> float | None:
    """An instant (`timeutil.parse_instant`) as UTC epoch seconds."""
    if value is None:
        return None
    try:
        return parse_instant(value)
    except ValueError as exc:
        errs.add(path, str(exc))
        return None


def check_json_object(value: Any, path: str, errs: Collector) -> dict[str, Any] | None:
    """A JSON object storable as it is (`json_problem`) of at most MAX_JSON_BYTES (`json_size`); a copy."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        errs.add(path, f"must be a JSON object, not {json_kind(value)}")
        return None
    problem = json_problem(value)
    if problem is not None:
        errs.add(_join(path, problem[0]) if problem[0] else path, problem[1])
        return None
    try:
        size = json_size(value)
    except (TypeError, ValueError) as exc:
        errs.add(path, f"must be JSON-serialisable with finite numbers ({exc})")
        return None
    if size > MAX_JSON_BYTES:
        errs.add(path, f"must be at most {MAX_JSON_BYTES:,} bytes as compact UTF-8 JSON, not {size:,}")
        return None
    return json.loads(json.dumps(value, ensure_ascii=False))  # a copy: the caller's object stays its own


def check_bool(value: Any, path: str, errs: Collector) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        errs.add(path, f"must be true or false, not {json_kind(value)}")
        return None
    return value


def check_outcome(value: Any, path: str, errs: Collector) -> str | None:
    if value is not None and value not in OUTCOMES:
        errs.add(path, f"must be one of {', '.join(OUTCOMES)}")
        return None
    return value


def _unknown(obj: Mapping[str, Any], allowed: AbstractSet[str], path: str, errs: Collector) -> None:
    for key in obj:
        if key not in allowed:
            errs.add(_join(path, str(key)), "is not a known field")


def _checked(
    value: Mapping[str, Any], checks: Mapping[str, Check], path: str, errs: Collector, **defaults: Any
) -> dict[str, Any]:
    """Each field of `checks` in `value` (`defaults` for an absent one) through its check, in order."""
    return {
        name: check(value.get(name, defaults.get(name)), _join(path, name), errs)
        for name, check in checks.items()
    }


TASK_FIELDS: dict[str, Check] = {
    "description": Text(required=True),
    "category": Tag(MAX_TAG_CHARS, required=True),
    "complexity": Number(0, 1),
}


def parse_task(value: Any, path: str, errs: Collector) -> Task | None:
    """`task` is an object {description, category, complexity} or a plain description string."""
    if value is None:
        errs.add(path, "is required")
        return None
    if isinstance(value, str):
        value = {"description": value}
    if not isinstance(value, Mapping):
        errs.add(path, "must be an object with a description, or a string")
        return None
    _unknown(value, TASK_FIELDS.keys(), path, errs)
    fields = _checked(value, TASK_FIELDS, path, errs, category="unknown")
    return None if fields["description"] is None or fields["category"] is None else Task(**fields)


ACTION_FIELDS: dict[str, Check] = {
    "action_type": Tag(MAX_TAG_CHARS, required=True),
    "action_id": Tag(MAX_ID_CHARS),
    "input": Text(),
    "output": Text(),
    "timestamp": check_instant,
    "success": check_bool,
    "error": Text(),
}


def parse_action(value: Any, path: str, errs: Collector) -> Action | None:
    if not isinstance(value, Mapping):
        errs.add(path, "must be an object")
        return None
    _unknown(value, ACTION_FIELDS.keys(), path, errs)
    fields = _checked(value, ACTION_FIELDS, path, errs)
    return None if fields["action_type"] is None else Action(**fields)


def parse_actions(
    value: Any, path: str, errs: Collector, *, max_actions: int | None = MAX_ACTIONS
) -> tuple[Action, ...]:
    """A list of at most `max_actions` actions (None: any number); () for null or with errors added."""
    value = [] if value is None else value  # 0, false, "" are no list either
    if not isinstance(value, list | tuple):
        errs.add(path, "must be a list")
        return ()
    if max_actions is not None and len(value) > max_actions:
        errs.add(path, f"must hold at most {max_actions} actions")
        return ()
    actions = (parse_action(raw, _join(path, i), errs) for i, raw in enumerate(value))
    return tuple(a for a in actions if a is not None)


FEEDBACK_FIELDS: dict[str, Check] = {
    "reward": Number(-1e6, 1e6),
    "message": Text(),
    "tests_passed": Number(0, 1e9, integer=True),
    "tests_total": Number(0, 1e9, integer=True),
}


def parse_feedback(value: Any, path: str, errs: Collector) -> Feedback | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        errs.add(path, "must be an object")
        return None
    _unknown(value, FEEDBACK_FIELDS.keys() | {"pass_rate"}, path, errs)  # pass_rate: derived, ignored
    fb = Feedback(**_checked(value, FEEDBACK_FIELDS, path, errs))
    if fb.tests_passed is not None and fb.tests_total is not None and fb.tests_passed > fb.tests_total:
        errs.add(_join(path, "tests_passed"), "must not exceed tests_total")
    return fb


def parse_vector(value: Any, path: str, errs: Collector) -> tuple[float, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not value:
        errs.add(path, "must be a non-empty list of numbers")
        return None
    if len(value) > MAX_VECTOR_DIM:
        errs.add(path, f"must have at most {MAX_VECTOR_DIM} dimensions")
        return None
    out = []
    for x in value:
        if (
            isinstance(x, bool)
            or not isinstance(x, int | float)
            or (isinstance(x, float) and not math.isfinite(x))
        ):
            errs.add(path, "must contain only finite numbers")
            return None
        if abs(x) > FLOAT32_MAX:  # stored as float32: 1e39 would become inf, and the vector NaN
            errs.add(path, f"must contain only numbers of magnitude at most {FLOAT32_MAX:.4g} (float32)")
            return None
        out.append(float(x))
    if not any(abs(x) >= FLOAT32_SMALLEST for x in out):  # all would round to 0.0 in float32
        errs.add(path, "must not be the zero vector")
        return None
    return tuple(out)


_EPISODE_HEAD: dict[str, Check] = {
    "episode_id": Tag(MAX_ID_CHARS, required=True),
    "agent_id": Tag(MAX_ID_CHARS),
    "user_id": Tag(MAX_ID_CHARS),
    "session_id": Tag(MAX_ID_CHARS),
    "task": parse_task,
    **{name: Text() for name in TEXT_FIELDS},
    "actions": parse_actions,
    "outcome": check_outcome,
    "strategy_used": Tag(MAX_TAG_CHARS),
}
_EPISODE_TAIL: dict[str, Check] = {
    "context": check_json_object,
    "metadata": check_json_object,
    "feedback": parse_feedback,
    "importance": Number(1, 10),
    "iterations": Number(0, 1e9, integer=True),
    "vector": parse_vector,
}
EPISODE_FIELDS: dict[str, Check] = {
    **_EPISODE_HEAD,
    **dict.fromkeys(("started_at", "completed_at", "expires_at"), check_instant),
    **_EPISODE_TAIL,
}
"""The check of each field of an episode, in the order `parse_episode` names their errors (the instants
are checked together: `_times`, `_expiry`); `engram_episodic.episode_schema` is built from these."""
_EPISODE_INPUT = EPISODE_FIELDS.keys() | {"duration_s", "ttl"}  # duration_s: derived, ignored


def parse_episode(
    value: Any,
    path: str = "",
    errs: Collector | None = None,
    *,
    require_task: bool = True,
    default_episode_id: str | None = None,
    max_actions: int | None = MAX_ACTIONS,
    default_completed_at: float | None = None,
) -> Episode | None:
    """Build an Episode from JSON-shaped input (the HTTP body, or a decoded stream payload). With `errs`
    given, errors are added to it and None returned on failure; without, InvalidEpisode is raised.

    `default_completed_at` (UTC epoch seconds): `completed_at` when the input has none; a `ttl` counts
    from it. `max_actions` bounds one input (a request, an event); None for a stored document, which
    accumulates the actions of all its events.
    """
    own = errs is None
    errs = errs or Collector()
    if not isinstance(value, Mapping):
        errs.add(path, "must be a JSON object")
        if own:
            errs.raise_if_any()
        return None
    before = len(errs.errors)
    _unknown(value, _EPISODE_INPUT, path, errs)
    head: dict[str, Check] = {
        **_EPISODE_HEAD,
        "actions": functools.partial(parse_actions, max_actions=max_actions),
    }
    if not require_task and value.get("task") is None:
        del head["task"]
    fields = _checked(value, head, path, errs, episode_id=default_episode_id)
    started_at, completed_at = _times(value, path, errs, default_completed_at)
    expires_at = _expiry(value, path, errs, completed_at if completed_at is not None else started_at)
    latest = max((t for t in (started_at, completed_at) if t is not None), default=None)
    if expires_at is not None and latest is not None and expires_at <= latest:
        errs.add(_join(path, "expires_at"), "must be after the episode's started_at and completed_at")
    fields.update(_checked(value, _EPISODE_TAIL, path, errs))
    if len(errs.errors) > before:
        if own:
            errs.raise_if_any()
        return None
    return Episode(**fields, started_at=started_at, completed_at=completed_at, expires_at=expires_at)


def repeated_id(first: dict[str, int], index: int, episode_id: str) -> str | None:
    """Why episodes[`index`] may not go in one request with the episodes before it: "repeats
    episodes[j].episode_id ('id')" when `first` (episode id -> index of its first episode, updated here)
    holds its id; else None. Both would carry the same `occurred_at`, so which one the episode ends up as
    would be a coin toss between their random event ids."""
    if episode_id in first:
        return f"repeats episodes[{first[episode_id]}].episode_id ({episode_id!r})"
    first[episode_id] = index
    return None


def episode_problems(episode: Episode) -> list[tuple[str, str]]:
    """What the episode model refuses in a built episode, as (field path, reason) pairs: `parse_episode`
    of its stored form, without the per-input action bound and with the task optional (a draft).

    A combination of events can break a rule no single event breaks (`tests_passed` raised past a
    stored `tests_total`, metadata merged past 64 KiB); the fold and `PATCH` keep only episodes with
    none, so what a client reads back it can also parse and publish again."""
    errs = Collector()
    # the vector is left out: no merge changes one, and checking 768 floats per fold step is not free
    parse_episode(
        episode_to_dict(episode, include_vector=False), "", errs, require_task=False, max_actions=None
    )
    return errs.errors


_UPDATE_FIELDS = {
    name: EPISODE_FIELDS[name]
    for name in ("outcome", "feedback", "outcome_details", "importance", "metadata")
}


def parse_update(value: Any, path: str = "", errs: Collector | None = None) -> dict[str, Any] | None:
    """The changes of a partial update (`PATCH /v1/episodes/{id}`, an `EpisodeUpdated`): a JSON object
    of `engram_episodic.events.UPDATABLE` fields, at least one, each checked as in an episode;
    `feedback` may be partial and `metadata` may map keys to None (removed); `expires_at` or `ttl` given
    as null (and the other not given) clears the expiry (`clear_expiry`: the episode no longer expires).
    Returns the keyword arguments of `EpisodeUpdated` for those fields, or None (errors added; raised
    without `errs`)."""
    own = errs is None
    errs = errs or Collector()
    before = len(errs.errors)
    out: dict[str, Any] = {}
    if not isinstance(value, Mapping):
        errs.add(path, "must be a JSON object")
    else:
        _unknown(value, frozenset(UPDATABLE) | {"ttl"}, path, errs)
        expiry = ("expires_at", "ttl")
        clear = any(n in value for n in expiry) and all(value.get(n) is None for n in expiry)
        if not clear and not any(value.get(name) is not None for name in (*UPDATABLE, "ttl")):
            errs.add(path, f"must change at least one of {', '.join(UPDATABLE)} (or ttl)")
        out = _checked(value, _UPDATE_FIELDS, path, errs)
        out["expires_at"] = _expiry(value, path, errs, None)  # a ttl counts from now
        out["clear_expiry"] = True if clear else None
    if len(errs.errors) > before:
        if own:
            errs.raise_if_any()
        return None
    return {k: v for k, v in out.items() if v is not None}


def empty_changes(value: Any) -> list[tuple[str, str]]:
    """(field, reason) for the parts of a change request that change nothing: a `feedback` whose fields
    are all null (merged field by field, a null keeps the stored value) or an empty `metadata`. Checked
    where a person sends a change (`PATCH`, the clients' `update_episode`), not by `parse_update`: an
    `EpisodeUpdated` already in a stream must still decode."""
    out: list[tuple[str, str]] = []
    if not isinstance(value, Mapping):
        return out
    feedback = value.get("feedback")
    if isinstance(feedback, Mapping) and all(
        feedback.get(k) is None for k in ("reward", "message", "tests_passed", "tests_total")
    ):
        out.append(
            (
                "feedback",
                "must set at least one of reward, message, tests_passed, tests_total (a null keeps the "
                "stored value; it does not clear it)",
            )
        )
    if value.get("metadata") == {}:
        out.append(
            ("metadata", "must set or remove at least one key (merged key by key, {} changes nothing)")
        )
    return out
