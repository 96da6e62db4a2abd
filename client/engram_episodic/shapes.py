"""Episodes and events as JSON-shaped data: the form agents send and the HTTP API answers.

Pure functions over the frozen dataclasses of `engram_episodic.events`, shared by the HTTP client,
the stream SDK (`shared.sdk`), the codec and the query service, so an episode has one JSON shape.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Mapping
from typing import Any

from engram_episodic.events import Action, Episode, Feedback, Task
from engram_episodic.timeutil import format_instant


@functools.cache
def _fields_of(cls: type) -> tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]] | None:
    """A dataclass's field names and one getter for all of them (None for other types); every dataclass
    of the model has several fields, so `attrgetter` answers a tuple."""
    if not dataclasses.is_dataclass(cls):
        return None
    names = tuple(f.name for f in dataclasses.fields(cls))
    return names, operator.attrgetter(*names)


_SCALARS = frozenset({str, int, float, bool, bytes})


def to_plain(value: Any) -> Any:
    """Dataclasses → dicts without None or empty-tuple fields, sequences → lists, recursively.

    Scalars are tested first and inline (most fields are scalars): this runs for every event the SDK
    publishes and every document the worker writes, and the generic checks per value were most of the
    publisher's CPU."""
    kind: type = type(value)  # annotated: mypy does not see type[Any] as Hashable (for the cache)
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

    With `iso=True` it is the HTTP response form (`response_shape`); otherwise timestamps stay epoch
    floats (the stored form). None-valued fields are omitted.
    """
    data = to_plain(episode)
    if not include_vector:
        data.pop("vector", None)
    return response_shape(data) if iso else data


def response_shape(stored: Mapping[str, Any]) -> dict[str, Any]:
    """An episode's stored form (`episode_to_dict(ep)`, epoch floats) → its HTTP response form: the one
    shaper of an episode response. Timestamps become ISO 8601 `Z` strings, and the derived `duration_s`
    (seconds, `completed_at - started_at`, at least 0) and `feedback.pass_rate` (`tests_passed /
    tests_total`) are added. Works on a stored document without building an Episode (recall returns
    many per request)."""
    data = dict(stored)
    started, completed = data.get("started_at"), data.get("completed_at")
    for key in ("started_at", "completed_at", "expires_at"):
        if data.get(key) is not None:
            data[key] = format_instant(data[key])
    if "actions" in data:
        data["actions"] = [
            {**a, "timestamp": format_instant(a["timestamp"])} if a.get("timestamp") is not None else dict(a)
            for a in data["actions"]
        ]
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


@functools.cache
def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = _names(cls)
    return {k: v for k, v in data.items() if k in names}


def episode_from_stored(stored: Mapping[str, Any]) -> Episode:
    """The Episode of a document the consolidator wrote (`episode_to_dict(ep)`), read as trusted data:
    no validation, since every stored episode was validated when it was ingested, and re-validating
    each document a read returns cost the validator again for every hit. Derived fields (`duration_s`,
    `pass_rate`) are ignored. Never use it on input from outside; a malformed document raises
    TypeError, KeyError or AttributeError (callers treat it as unreadable)."""
    data = _known(Episode, stored)
    task = data.get("task")
    if task is not None:
        data["task"] = Task(**_known(Task, task))
    feedback = data.get("feedback")
    if feedback is not None:
        data["feedback"] = Feedback(**_known(Feedback, feedback))
    if "actions" in data:
        data["actions"] = tuple(Action(**_known(Action, a)) for a in data["actions"])
    if data.get("vector") is not None:
        data["vector"] = tuple(data["vector"])
    return Episode(**data)
