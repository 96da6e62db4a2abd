"""Request bodies are parsed with orjson where that reads them as the stdlib does, else with the stdlib:
the 64-bit, depth and Unicode checks behind it see the same values either way."""

from __future__ import annotations

import json
import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.query import problems
from services.query.problems import Problem, _parse

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_reads_every_body_as_the_stdlib_does(value):
    raw = json.dumps(value, ensure_ascii=False).encode()
    got = _parse(raw)
    assert got == json.loads(raw)
    assert json.dumps(got) == json.dumps(value)  # ints stay ints (2**64 is not 1.8e19)


@pytest.mark.parametrize(
    "raw, value",
    [
        (b'{"k": 18446744073709551616}', 2**64),
        (b'{"k": -9223372036854775809}', -(2**63) - 1),
        (b'{"k": 99999999999999999999999}', 10**23 - 1),
        (b'{"k": "\\ud800"}', "\ud800"),  # orjson refuses it; json_problem names the field (a 422)
        (b'{"k": 1e400}', math.inf),  # json_problem refuses it by name
    ],
)
def test_values_orjson_would_change_or_refuse_are_read_by_the_stdlib(raw, value):
    assert _parse(raw)["k"] == value


def test_the_fast_path_is_orjson(monkeypatch):
    calls = []
    real = orjson.loads
    monkeypatch.setattr(problems.orjson, "loads", lambda raw: calls.append(raw) or real(raw))
    assert _parse(b'{"task": "t", "importance": 5, "vector": [0.5, 1e-3]}') == {
        "task": "t",
        "importance": 5,
        "vector": [0.5, 1e-3],
    }
    assert calls


@pytest.mark.parametrize(
    "raw, detail",
    [
        (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
        (b'{"k": NaN}', "not valid JSON"),
        (b'{"k": ' + b"9" * 5000 + b"}", "too many digits"),
        (b"\xff", "not UTF-8"),
        (b'{"k": 1,}', "not valid JSON"),
    ],
)
def test_malformed_bodies_are_400_with_the_reason(raw, detail):
    with pytest.raises(Problem) as info:
        _parse(raw)
    assert info.value.status == 400 and detail in info.value.detail
