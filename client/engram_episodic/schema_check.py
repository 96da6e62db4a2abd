"""The subset of JSON Schema Engram's tool definitions use (engram_episodic/tools.json), checked with
messages a model can act on: objects without extra keys, required keys, types, enums, string lengths,
date-time strings, number bounds, list sizes and unique items. `engram_episodic.tools` runs it on every
tool call's arguments before anything is sent."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from engram_episodic.timeutil import parse_instant
from engram_episodic.validation import Collector, json_kind, unicode_problem
from engram_episodic.validation import _join as join


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def check(schema: Mapping[str, Any], value: Any, path: str, errs: Collector) -> Any:
    """Check `value` against `schema` (the subset above), adding every problem to `errs` as (path, reason);
    returns the value normalised (integral floats of integer fields as ints, nulls of optional properties
    dropped), or None where it failed. `path` names `value` in the messages ("" for the arguments)."""
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        errs.add(path, "must be one of " + ", ".join(map(str, schema["enum"])))
        return None
    if kind == "object":
        return _check_object(schema, value, path, errs)
    if kind == "array":
        return _check_array(schema, value, path, errs)
    if kind == "string":
        return _check_string(schema, value, path, errs)
    if kind in ("integer", "number"):
        return _check_number(schema, value, path, errs, integer=kind == "integer")
    if kind == "boolean":
        if not isinstance(value, bool):
            errs.add(path, f"must be true or false, not {_json_type(value)}")
            return None
        return value
    return value


def _check_object(schema: Mapping[str, Any], value: Any, path: str, errs: Collector) -> dict[str, Any] | None:
    if not isinstance(value, Mapping):
        errs.add(path, f"must be an object, not {_json_type(value)}")
        return None
    props: Mapping[str, Any] = schema.get("properties", {})
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key not in props:
            errs.add(join(path, str(key)), "is not a known field")
        elif item is not None:  # null for an optional argument means "not given"
            checked = check(props[key], item, join(path, key), errs)
            if checked is not None:
                out[key] = checked
    for key in schema.get("required", ()):
        if value.get(key) is None:
            errs.add(join(path, key), "is required")
    return out


def _check_array(schema: Mapping[str, Any], value: Any, path: str, errs: Collector) -> list[Any] | None:
    if not isinstance(value, list | tuple):
        errs.add(path, f"must be a list, not {_json_type(value)}")
        return None
    if len(value) < schema.get("minItems", 0):
        errs.add(path, f"must hold at least {schema['minItems']} item(s)")
        return None
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errs.add(path, f"must hold at most {schema['maxItems']} items")
        return None
    items = [check(schema.get("items", {}), v, join(path, i), errs) for i, v in enumerate(value)]
    if schema.get("uniqueItems") and len({json.dumps(v, sort_keys=True, default=repr) for v in value}) < len(
        value
    ):
        errs.add(path, "must not repeat a value")
        return None
    return items


def _check_string(schema: Mapping[str, Any], value: Any, path: str, errs: Collector) -> str | None:
    if not isinstance(value, str):
        errs.add(path, f"must be a string, not {_json_type(value)}")
        return None
    if len(value) < schema.get("minLength", 0):
        errs.add(path, "must not be empty")
        return None
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errs.add(path, f"must be at most {schema['maxLength']} characters (got {len(value)})")
        return None
    if problem := unicode_problem(value):  # JSON's "\ud800" decodes, but no request can carry it
        errs.add(path, problem)
        return None
    if schema.get("format") == "date-time":
        try:
            parse_instant(value)
        except ValueError as exc:
            errs.add(path, str(exc))
            return None
    return value


def _check_number(
    schema: Mapping[str, Any], value: Any, path: str, errs: Collector, *, integer: bool
) -> int | float | None:
    lo, hi = schema.get("minimum", -math.inf), schema.get("maximum", math.inf)
    what = "an integer" if integer else "a number"
    bounds = f" between {_fmt(lo)} and {_fmt(hi)}" if math.isfinite(lo) and math.isfinite(hi) else ""
    ok = not isinstance(value, bool) and isinstance(value, int | float)
    if ok and integer and isinstance(value, float):
        ok = math.isfinite(value) and value.is_integer()
    if ok and not math.isfinite(value):
        errs.add(path, "must be finite (NaN and infinity are rejected)")
        return None
    if not ok or not lo <= value <= hi:
        errs.add(path, f"must be {what}{bounds}" + ("" if ok else f", not {_json_type(value)}"))
        return None
    return int(value) if integer else value


def _json_type(value: Any) -> str:
    """`validation.json_kind`, a number with its value (a model reads which number it sent)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"the number {value!r}"[:60]
    return json_kind(value)
