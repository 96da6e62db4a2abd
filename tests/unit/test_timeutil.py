"""UTC instants at the edges: whatever `parse_instant` accepts, `format_instant` can write back.

An offset moves an instant across the calendar's ends (`9999-12-31T23:59:59-14:00` is in year 10000 in
UTC); an epoch number near the ends rounds to a microsecond `datetime` cannot hold. Both used to be
accepted and then fail (a 500 on recall, a dead letter on ingest).
"""

from __future__ import annotations

import math
import os
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engram_episodic.timeutil import MAX_SECONDS, MIN_SECONDS, format_instant, parse_instant

FUZZ = int(os.environ.get("ENGRAM_FUZZ_EXAMPLES", "100"))
FUZZ_SETTINGS = settings(
    max_examples=max(FUZZ, 200), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

EPOCH = datetime(1970, 1, 1)
US = timedelta(microseconds=1)
# the exact (integer-microsecond) bounds of what is accepted, relative to the epoch
MIN_US = (datetime(1, 1, 1) - EPOCH) // US
MAX_US = (datetime(9999, 12, 31, 23, 59, 59, 999969) - EPOCH) // US

EDGE_DATES = st.one_of(
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(1, 1, 2, 23, 59, 59, 999999)),
    st.datetimes(min_value=datetime(9999, 12, 30), max_value=datetime(9999, 12, 31, 23, 59, 59, 999999)),
    st.datetimes(),
)
OFFSETS = st.integers(-(24 * 60 - 1), 24 * 60 - 1)  # minutes: fromisoformat takes |offset| < 24 h


def iso(naive: datetime, offset_minutes: int) -> str:
    sign = "-" if offset_minutes < 0 else "+"
    hours, minutes = divmod(abs(offset_minutes), 60)
    return f"{naive.isoformat()}{sign}{hours:02d}:{minutes:02d}"


def test_the_bounds_are_the_ends_of_what_datetime_formats():
    assert format_instant(MIN_SECONDS) == "0001-01-01T00:00:00Z"
    assert format_instant(MAX_SECONDS) == "9999-12-31T23:59:59.999969Z"
    for beyond in (math.nextafter(MIN_SECONDS, -math.inf), math.nextafter(MAX_SECONDS, math.inf)):
        with pytest.raises(ValueError):
            datetime.fromtimestamp(beyond, tz=UTC)
        with pytest.raises(ValueError, match="outside years 1..9999"):
            parse_instant(beyond)


@pytest.mark.parametrize(
    "text",
    [
        "9999-12-31T23:59:59-14:00",
        "0001-01-01T00:00:00+14:00",
        "9999-12-31T23:59:59.999999Z",
        "0001-01-01T00:00:00.000001+00:01",
    ],
)
def test_iso_past_the_calendar_once_in_utc_is_refused(text):
    with pytest.raises(ValueError, match="outside years 1..9999 once converted to UTC"):
        parse_instant(text)


@pytest.mark.parametrize(
    "value",
    [10**400, -(10**400), 253402300800, -62135596801],
    ids=["10**400", "-10**400", "year 10000", "year 0"],
)
def test_epoch_numbers_past_the_calendar_are_refused(value):
    with pytest.raises(ValueError, match="outside years 1..9999"):
        parse_instant(value)


@FUZZ_SETTINGS
@given(naive=EDGE_DATES, offset=OFFSETS)
@example(naive=datetime(9999, 12, 31, 23, 59, 59), offset=-14 * 60)
@example(naive=datetime(1, 1, 1), offset=14 * 60)
@example(naive=datetime(9999, 12, 31, 23, 59, 59, 999969), offset=0)
def test_iso_with_any_offset_is_refused_exactly_when_utc_leaves_the_calendar(naive, offset):
    exact_us = (naive - EPOCH) // US - offset * 60_000_000
    text = iso(naive, offset)
    try:
        seconds = parse_instant(text)
    except ValueError as exc:
        assert "outside years 1..9999" in str(exc)
        assert exact_us < MIN_US or exact_us > MAX_US, text
        return
    assert MIN_US <= exact_us <= MAX_US + 31, text  # a float this large is only ~30 µs precise
    written = format_instant(seconds)
    again = parse_instant(written)
    assert abs(again - seconds) <= 1e-6, (text, written)
    assert abs((datetime.fromisoformat(written).replace(tzinfo=None) - EPOCH) // US - exact_us) <= 31


@FUZZ_SETTINGS
@given(
    seconds=st.one_of(
        st.floats(MIN_SECONDS, MAX_SECONDS),
        st.floats(MIN_SECONDS, MIN_SECONDS + 1),
        st.floats(MAX_SECONDS - 1, MAX_SECONDS),
        st.integers(math.ceil(MIN_SECONDS), math.floor(MAX_SECONDS)),
    )
)
def test_every_accepted_epoch_number_round_trips_through_format_instant(seconds):
    parsed = parse_instant(seconds)
    written = format_instant(parsed)
    assert abs(parse_instant(written) - parsed) <= 1e-6, (seconds, written)


@FUZZ_SETTINGS
@given(
    seconds=st.one_of(
        st.floats(max_value=math.nextafter(MIN_SECONDS, -math.inf), allow_infinity=False),
        st.floats(min_value=math.nextafter(MAX_SECONDS, math.inf), allow_infinity=False),
    )
)
def test_epoch_numbers_outside_are_a_value_error(seconds):
    with pytest.raises(ValueError, match="outside years 1..9999"):
        parse_instant(seconds)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("0000-01-01T00:00:00Z", "'0000-01-01T00:00:00Z' is outside years 1..9999"),
        ("2025-13-01T00:00:00Z", "is not a real date and time (month must be in 1..12)"),
        ("2025-02-30T00:00:00Z", "is not a real date and time (day is out of range for month)"),
        ("2025-01-01T25:00:00Z", "is not a real date and time (hour must be in 0..23)"),
        ("2025-01-01T00:00:00+25:00", "has an offset of 24 hours or more"),
        ("yesterday", "'yesterday' is not ISO 8601 (e.g. 2025-07-25T02:00:00Z)"),
        (
            "1700000000",
            "'1700000000' is not ISO 8601 (e.g. 2025-07-25T02:00:00Z); epoch seconds go as a number",
        ),
        # `?since=2026-01-01T00:00:00+02:00` unescaped: the URL query turned the "+" into a space
        ("2026-01-01T00:00:00 02:00", "in a URL query, send the offset's '+' as %2B"),
        ("2026-01-01T00:00:00.5 0200", "in a URL query, send the offset's '+' as %2B"),
    ],
)
def test_well_formed_iso_naming_no_instant_is_told_apart_from_text_that_is_not_iso(text, said):
    """Well-formed ISO 8601 naming no instant (year 0000, day 30 of February) is told so, not
    "not ISO 8601"."""
    with pytest.raises(ValueError) as caught:
        parse_instant(text)
    assert said in str(caught.value)


@pytest.mark.parametrize("text", ["2026-12-06T01:00:00z", "2026-12-06t01:00:00z", "2026-12-06t01:00:00Z"])
def test_rfc_3339_lower_case_t_and_z_are_taken(text):
    """RFC 3339 5.6 lets "T" and "Z" be lower case; `...T01:00:00z` is taken, not "not ISO 8601"."""
    assert parse_instant(text) == parse_instant("2026-12-06T01:00:00Z")
