"""Episodes and events as JSON-shaped data: the form agents send and the HTTP API answers.

Pure functions over the frozen dataclasses of `engram_episodic.events`, shared by the HTTP client,
the stream SDK (`shared.sdk`), the codec and the query service, so an episode has one JSON shape.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Mapping
from typing import Any

from engram_episodic.events import Episode
from engram_episodic.timeutil import format_instant


@functools.cache
def _fields_of(cls: type) -> tuple[tuple[str, ...], operator.attrgetter] | None:
    """A dataclass's field names and one getter for all of them (None for other types)."""
    if not dataclasses.is_dataclass(cls):
        return None
    names = tuple(f.name for f in dataclasses.fields(cls))
    getter = operator.attrgetter(*names) if len(names) > 1 else (lambda obj, _n=names[0]: (getattr(obj, _n),))
    return names, getter


_SCALARS = frozenset({str, int, float, bool, bytes})


def to_plain(value: Any) -> Any:
    """Dataclasses → dicts without None or empty-tuple fields, sequences → lists, recursively.

    Scalars are tested first and inline (most fields are scalars): this runs for every event the SDK
    publishes and every document the worker writes, and the generic checks per value were most of the
    publisher's CPU."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    fields = _fields_of(kind)
    if fields is not None:
        names, getter = fields
        out = {}
        for name, v in zip(names, getter(value), strict=True):
            if v is None or v == ():
                continue
            out[name] = v if type(v) in _SCALARS else to_plain(v)
        return out
    if kind is list or kind is tuple or isinstance(value, tuple | list):
        return [v if type(v) in _SCALARS else to_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: v if type(v) in _SCALARS else to_plain(v) for k, v in value.items()}
    return value


def episode_to_dict(episode: Episode, *, iso: bool = False, include_vector: bool = True) -> dict[str, Any]:
    """The episode as JSON-shaped data in the shape agents send it, plus derived fields.

    With `iso=True` timestamps become ISO 8601 `Z` strings (the HTTP response form) and the derived
    `duration_s` and `feedback.pass_rate` are added; otherwise timestamps stay epoch floats (the
    stored form). None-valued fields are omitted.
    """
    data = to_plain(episode)
    if not include_vector:
        data.pop("vector", None)
    if iso:
        for key in ("started_at", "completed_at"):
            if key in data:
                data[key] = format_instant(data[key])
        for action in data.get("actions", []):
            if "timestamp" in action:
                action["timestamp"] = format_instant(action["timestamp"])
        if episode.duration_s is not None:
            data["duration_s"] = episode.duration_s
        if episode.feedback is not None and episode.feedback.pass_rate is not None:
            data["feedback"]["pass_rate"] = episode.feedback.pass_rate
    return data
