"""UTC time: parse ISO 8601 (with an offset) or epoch numbers; format as ISO 8601 `Z`.

Inside Engram every instant is a float of UTC epoch seconds. The API accepts either an epoch number or
an ISO 8601 string that carries an offset (`Z`, `+00:00`, `-07:00`); a string without an offset is
rejected, because guessing the server's local zone is how memory systems shift events to the previous
day (or the next).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

# The instants `format_instant` can write: datetime stops at 0001-01-01 and 9999-12-31, and
# `fromtimestamp` rounds to microseconds, so the largest float it accepts is 30 µs short of year 10000
# (tests/unit/test_timeutil.py pins both ends against datetime).
MIN_SECONDS = -62135596800.0  # 0001-01-01T00:00:00Z
MAX_SECONDS = 253402300799.99997  # 9999-12-31T23:59:59.999969Z
_RANGE = "0001-01-01T00:00:00Z..9999-12-31T23:59:59.999969Z"


def parse_instant(value: object) -> float:
    """Return UTC epoch seconds for an epoch number or an ISO 8601 string with an offset.

    Raises ValueError with a reason (the caller adds the field name) for: bool, NaN/inf, a string that
    is not ISO 8601, a string without a UTC offset, and instants outside years 1..9999 in UTC (an
    offset can carry 9999-12-31T23:59:59-14:00 past the end): whatever this accepts, `format_instant`
    can write back.
    """
    if isinstance(value, bool):
        raise ValueError("must be an ISO 8601 string with an offset or epoch seconds, not a boolean")
    if isinstance(value, datetime):  # from Python callers (the client); JSON never carries one
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("is a datetime without a UTC offset (tzinfo); naive times are ambiguous")
        value = value.isoformat()
    if isinstance(value, int | float):
        outside = f"is outside years 1..9999 (epoch seconds {MIN_SECONDS:.0f}..{MAX_SECONDS})"
        try:
            seconds = float(value)
        except OverflowError:  # an int no float holds (10**400, from the SDK): out of range, not a crash
            raise ValueError(outside) from None
        if not math.isfinite(seconds):
            raise ValueError("must be finite")
        if not MIN_SECONDS <= seconds <= MAX_SECONDS:
            raise ValueError(outside)
        return seconds
    if not isinstance(value, str):
        raise ValueError("must be an ISO 8601 string with an offset or epoch seconds")
    text = value.strip()
    if text.endswith("z"):  # RFC 3339 5.6: "Z" may be lower case (Python's parser takes only "Z")
        text = text[:-1] + "Z"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(_why_not(value[:40], str(exc))) from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ValueError(f"{value[:40]!r} has no UTC offset (append Z or +00:00)")
    seconds = parsed.timestamp()
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise ValueError(f"{value[:40]!r} is outside years 1..9999 once converted to UTC ({_RANGE})")
    return seconds


_PLUS_AS_SPACE = re.compile(r"\d \d\d(:?\d\d)?$")
"""A time followed by a space and an offset's digits: `2026-01-01T00:00:00 02:00`, what
`?since=2026-01-01T00:00:00+02:00` reads as when the "+" is not percent-encoded."""


def _why_not(value: str, reason: str) -> str:
    """Why `datetime.fromisoformat` refused `value`: well-formed ISO 8601 naming no real instant (year 0,
    month 13, February 30, hour 25, an offset of a day or more) is said to be that, not "not ISO 8601"."""
    if reason.startswith("year 0 "):
        return f"{value!r} is outside years 1..9999"
    if reason.startswith("offset must be"):
        return f"{value!r} has an offset of 24 hours or more"
    if reason.endswith("out of range for month") or " must be in " in reason:
        return f"{value!r} is not a real date and time ({reason})"
    if _PLUS_AS_SPACE.search(value):  # a URL query decodes an unescaped "+" to a space
        return f"{value!r} is not ISO 8601: in a URL query, send the offset's '+' as %2B"
    try:
        float(value)
    except ValueError:
        return f"{value!r} is not ISO 8601 (e.g. 2025-07-25T02:00:00Z)"
    # epoch seconds are taken as a JSON number; "1700000000" sent as a string said only "not ISO 8601"
    return f"{value!r} is not ISO 8601 (e.g. 2025-07-25T02:00:00Z); epoch seconds go as a number, unquoted"


def format_instant(seconds: float | None) -> str | None:
    """ISO 8601 in UTC with a `Z` suffix; microseconds only when non-zero. None stays None."""
    if seconds is None:
        return None
    dt = datetime.fromtimestamp(seconds, tz=UTC)
    text = dt.isoformat(timespec="microseconds" if dt.microsecond else "seconds")
    return text.replace("+00:00", "Z")
