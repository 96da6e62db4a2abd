"""The boundary between domain events and their stored form.

Stored form (one stream entry field `e`): msgpack of `{"type": str, "v": int, "data": map}`.
`data` is the event as plain JSON-shaped values (timestamps as epoch floats). Decoding applies the
upcasters registered for the type from the stored `v` up to the current version, then rebuilds the
event through `engram_episodic.validation`, so a stored event obeys the same rules as a fresh one.
No pickle: a stream entry is data, never code.

Errors: `DecodeError` (not msgpack / bad envelope), `UnknownEventType`, `UnknownSchemaVersion`,
`InvalidEpisode` (the payload violates the schema). All are subclasses of `EngramError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgpack

from engram_episodic.errors import DecodeError, InvalidEpisode, UnknownEventType, UnknownSchemaVersion
from engram_episodic.events import (
    EVENT_TYPES,
    ActionRecorded,
    EpisodeCompleted,
    EpisodeForgotten,
    EpisodeStarted,
    Event,
    FactsConsolidated,
    UserForgotten,
)
from engram_episodic.shapes import to_plain
from engram_episodic.timeutil import format_instant
from engram_episodic.validation import Collector, check_id, parse_action, parse_episode

CURRENT_VERSION: dict[str, int] = {name: 2 if name in ("EpisodeStarted", "EpisodeCompleted") else 1
                                   for name in EVENT_TYPES}

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def _upcast_episode_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v1 (the prototype's flat shape) → v2.

    v1 episodes had `task` as a plain string with a sibling `category`, and a top-level `reward`;
    v2 nests them as `task: {description, category}` and `feedback: {reward}`.
    """
    data = dict(data)
    episode = dict(data.get("episode") or {})
    if isinstance(episode.get("task"), str):
        episode["task"] = {"description": episode.pop("task"),
                           "category": episode.pop("category", "unknown")}
    if "reward" in episode:
        feedback = dict(episode.get("feedback") or {})
        feedback.setdefault("reward", episode.pop("reward"))
        episode["feedback"] = feedback
    data["episode"] = episode
    return data


UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("EpisodeStarted", 1): _upcast_episode_v1,
    ("EpisodeCompleted", 1): _upcast_episode_v1,
}


def stored_to_response(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored episode document (`episode_to_dict(ep)`, epoch floats) in the HTTP response form.

    The same result as `episode_to_dict(parse_episode(stored), iso=True)` for any document the
    consolidator wrote (property-tested), without re-validating it: recall returns many documents per
    request and each was validated when it was ingested.
    """
    data = dict(stored)
    started, completed = data.get("started_at"), data.get("completed_at")
    for key in ("started_at", "completed_at"):
        if data.get(key) is not None:
            data[key] = format_instant(data[key])
    if "actions" in data:
        data["actions"] = [{**a, "timestamp": format_instant(a["timestamp"])} if a.get("timestamp") is not None
                           else dict(a) for a in data["actions"]]
    if started is not None and completed is not None:
        data["duration_s"] = max(0.0, float(completed) - float(started))
    feedback = data.get("feedback")
    if feedback is not None:
        feedback = dict(feedback)
        passed, total = feedback.get("tests_passed"), feedback.get("tests_total")
        if passed is not None and total:
            feedback["pass_rate"] = passed / total
        data["feedback"] = feedback
    return data


def event_to_data(event: Event) -> dict[str, Any]:
    """The event's payload as plain data (without type and version)."""
    return to_plain(event)


def encode(event: Event) -> bytes:
    """Serialise an event to its stored envelope (msgpack bytes)."""
    envelope = {"type": event.TYPE, "v": CURRENT_VERSION[event.TYPE], "data": event_to_data(event)}
    return msgpack.packb(envelope, use_bin_type=True)


def _base(data: Mapping[str, Any], errs: Collector) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["event_id"] = check_id(data.get("event_id"), "event_id", errs, required=True)
    out["namespace"] = check_id(data.get("namespace"), "namespace", errs, required=True)
    occurred = data.get("occurred_at")
    if isinstance(occurred, bool) or not isinstance(occurred, int | float) or occurred != occurred:
        errs.add("occurred_at", "must be epoch seconds")
    out["occurred_at"] = float(occurred) if isinstance(occurred, int | float) else 0.0
    return out


def event_from_data(type_name: str, data: Mapping[str, Any]) -> Event:
    """Rebuild a current-version event from its (already upcast) plain data; InvalidEpisode if bad."""
    if not isinstance(data, Mapping):
        raise InvalidEpisode([("data", "must be a map")])
    errs = Collector()
    base = _base(data, errs)
    cls = EVENT_TYPES[type_name]
    fields: dict[str, Any] = {}
    if cls in (EpisodeStarted, EpisodeCompleted):
        fields["episode_id"] = check_id(data.get("episode_id"), "episode_id", errs, required=True)
        fields["episode"] = parse_episode(data.get("episode"), "episode", errs,
                                          require_task=True)
        if fields["episode"] is not None and fields["episode"].episode_id != fields["episode_id"]:
            errs.add("episode.episode_id", "must equal the event's episode_id")
    elif cls is ActionRecorded:
        fields["episode_id"] = check_id(data.get("episode_id"), "episode_id", errs, required=True)
        fields["action"] = parse_action(data.get("action"), "action", errs)
    elif cls is EpisodeForgotten:
        fields["episode_id"] = check_id(data.get("episode_id"), "episode_id", errs, required=True)
    elif cls is UserForgotten:
        fields["user_id"] = check_id(data.get("user_id"), "user_id", errs, required=True)
    elif cls is FactsConsolidated:
        scope, facts, removed = data.get("scope"), data.get("facts", []), data.get("removed", [])
        if not isinstance(scope, Mapping) or not isinstance(facts, list | tuple) \
                or not isinstance(removed, list | tuple):
            errs.add("facts", "scope must be a map and facts/removed lists")
        else:
            fields.update(scope=dict(scope), facts=tuple(dict(f) for f in facts if isinstance(f, Mapping)),
                          removed=tuple(str(r) for r in removed))
    errs.raise_if_any()
    return cls(**base, schema_version=CURRENT_VERSION[type_name], **fields)


def decode(payload: bytes) -> Event:
    """Stored envelope bytes → current-version event (upcasting older versions in order).

    Raises DecodeError, UnknownEventType, UnknownSchemaVersion or InvalidEpisode; never anything else
    for any input bytes (fuzzed in tests/unit/test_codec.py).
    """
    try:
        envelope = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises a zoo of types for garbage; all mean "undecodable"
        raise DecodeError(f"not a msgpack envelope: {type(exc).__name__}") from None
    if not isinstance(envelope, dict) or not {"type", "v", "data"} <= envelope.keys():
        raise DecodeError("envelope must be a map with type, v and data")
    type_name, version, data = envelope["type"], envelope["v"], envelope["data"]
    if not isinstance(type_name, str) or type_name not in EVENT_TYPES:
        raise UnknownEventType(f"unknown event type {str(type_name)[:64]!r}")
    if isinstance(version, bool) or not isinstance(version, int):
        raise DecodeError("envelope version must be an integer")
    current = CURRENT_VERSION[type_name]
    if version < 1 or version > current:
        raise UnknownSchemaVersion(f"{type_name} v{version} is not supported (this build reads v1..v{current})")
    if not isinstance(data, dict):
        raise DecodeError("envelope data must be a map")
    while version < current:
        upcaster = UPCASTERS.get((type_name, version))
        if upcaster is None:
            raise UnknownSchemaVersion(f"no upcaster for {type_name} v{version}")
        data = upcaster(data)
        version += 1
    return event_from_data(type_name, data)


def peek_identity(payload: bytes) -> tuple[str, str, str | None, float | None] | None:
    """(namespace, episode_id, user_id, occurred_at) read from an envelope that may not decode as a
    valid event (a dead letter), or None when it does not name an episode. Used only to find the data
    a forget must delete; never raises. Ids that would not pass validation are not returned."""
    try:
        envelope = msgpack.unpackb(payload, raw=False, strict_map_key=True)
        data = envelope.get("data") if isinstance(envelope, dict) else None
        if not isinstance(data, dict):
            return None
        errs = Collector()
        episode = data.get("episode")
        ns = check_id(data.get("namespace"), "namespace", errs, required=True)
        # the envelope's id, else the episode's own (an envelope that lost its top-level id still names it)
        raw_id = data.get("episode_id") or (episode.get("episode_id") if isinstance(episode, dict) else None)
        eid = check_id(raw_id, "episode_id", errs, required=True)
        if ns is None or eid is None:
            return None
        user = check_id(episode.get("user_id"), "user_id", errs) if isinstance(episode, dict) else None
        at = data.get("occurred_at")
        occurred = float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None
        return ns, eid, user, occurred
    except Exception:  # a dead letter can be any bytes at all
        return None
