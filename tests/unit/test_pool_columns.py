"""The recall pool as columns (`services.query.recall.pool.Columns`) holds, row for row and to the bit, what
one object per hit held before it (the reference below is that per-hit reading), and
`services.query.recall.relevance.relevances` equals the scalar definition of each row. Pure logic: no I/O."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from services.query.recall import relevance
from services.query.recall.pool import Columns
from shared.index import SearchHit

_NUMBER_FIELDS = (b"completed_at", b"started_at", b"reward", b"importance", b"last_accessed", b"access_count")


def _number(raw: bytes | None) -> float:
    if raw is None:
        return math.nan
    try:
        return float(raw)
    except ValueError:
        return math.nan


def reference_row(hit: SearchHit) -> dict[str, object]:
    """One hit read field by field, as the pool did per hit before it was columnar."""
    get = hit.fields.get
    count = _number(get(b"access_count"))
    completed = _number(get(b"completed_at"))
    if math.isnan(completed):
        completed = _number(get(b"started_at"))
    outcome = get(b"outcome")
    return {
        "key": hit.key,
        "completed_at": completed,
        "reward": _number(get(b"reward")),
        "outcome": outcome.decode() if outcome else None,
        "importance": _number(get(b"importance")),
        "last_accessed": _number(get(b"last_accessed")),
        # not finite: 0 (the per-hit reading raised OverflowError on "inf", which HINCRBY never writes)
        "access_count": int(count) if math.isfinite(count) else 0,
    }


def ref_relevance(mode: str, cos: float, keyword: float) -> float:
    """The similarity signal of one row, read off `services.query.recall.relevance`'s docstring."""
    clipped = max(0.0, cos) if math.isfinite(cos) else 0.0
    if mode == "vector":
        return clipped
    if mode == "keyword":
        return keyword
    share = relevance.HYBRID_VECTOR_WEIGHT
    return share * clipped + (1.0 - share) * keyword


def _bits(x: float) -> str:
    return "nan" if math.isnan(x) else x.hex()


_value = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(lambda x: repr(x).encode()),
    st.floats(-1e12, 1e12).map(lambda x: b"%.12g" % x),
    st.integers(0, 10**6).map(lambda n: str(n).encode()),
    st.sampled_from([b"", b"abc", b"1_0", b" 7", b"nan", b"-0"]),
)
_fields = st.dictionaries(
    st.sampled_from([*_NUMBER_FIELDS, b"outcome", b"doc"]),
    st.one_of(_value, st.sampled_from([b"success", b"partial", b"failure", b""])),
)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(_fields, max_size=30), data=st.data())
def test_columns_hold_each_hits_fields_as_the_per_hit_reading_did(rows, data):
    hits = [SearchHit(key=b"k%d" % i, fields=f) for i, f in enumerate(rows)]
    n = len(hits)
    cos = np.array(data.draw(st.lists(st.floats(-1.0, 1.0) | st.just(math.nan), min_size=n, max_size=n)))
    keyword = np.array(data.draw(st.lists(st.floats(0.0, 0.999), min_size=n, max_size=n)))
    mode = data.draw(st.sampled_from(["vector", "keyword", "hybrid"]))
    cols = Columns.of_hits(hits, cos, keyword, mode)
    assert len(cols) == n
    for i, hit in enumerate(hits):
        want, got = reference_row(hit), cols.candidate(i)
        assert (got.key, cols.outcomes[i], got.access_count) == (
            want["key"],
            want["outcome"],
            want["access_count"],
        )
        for name in ("completed_at", "last_accessed"):
            assert _bits(getattr(got, name)) == _bits(want[name]), name
        for name in ("reward", "importance"):
            assert _bits(float(getattr(cols, name)[i])) == _bits(want[name]), name
        assert _bits(float(cols.relevance[i])) == _bits(ref_relevance(mode, float(cos[i]), float(keyword[i])))


def test_columns_concatenate_in_order_and_empty_is_neutral():
    def one(key: bytes, reward: bytes) -> Columns:
        return Columns.of_hits(
            [SearchHit(key=key, fields={b"reward": reward, b"completed_at": b"5"})],
            np.array([0.5]),
            np.array([0.0]),
            "vector",
        )

    both = Columns.empty() + one(b"a", b"0.25") + Columns.empty() + one(b"b", b"0.75")
    assert both.keys == [b"a", b"b"]
    assert both.reward.tolist() == [0.25, 0.75]
    assert both.candidate(1).key == b"b" and both.candidate(1).completed_at == 5.0
    assert len(Columns.empty()) == 0


_cos = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-300, -1e-300]),
)


@settings(max_examples=500, deadline=None)
@given(
    mode=st.sampled_from(["vector", "keyword", "hybrid"]),
    pairs=st.lists(st.tuples(_cos, st.floats(0.0, 1.0)), max_size=20),
)
def test_relevances_equal_the_scalar_relevance_to_the_bit(mode, pairs):
    cos = np.array([c for c, _ in pairs], dtype=np.float64)
    keyword = np.array([k for _, k in pairs], dtype=np.float64)
    got = relevance.relevances(mode, cos, keyword)
    want = [ref_relevance(mode, c, k) for c, k in pairs]
    assert [_bits(x) for x in got.tolist()] == [_bits(x) for x in want]


def _pool_with(name: str, values: list[float]) -> Columns:
    hits = [
        SearchHit(key=b"k%d" % i, fields={name.encode(): repr(v).encode()} if v == v else {})
        for i, v in enumerate(values)
    ]
    n = len(hits)
    return Columns.of_hits(hits, np.full(n, 0.5), np.zeros(n), "vector")


def test_the_hint_is_the_pools_third_best_value_unless_tied_or_too_few():
    from services.query.recall.pool import _hint

    assert _hint(_pool_with("reward", [0.1, 0.9, math.nan, 0.5, 0.7, 0.3]), "reward") == 0.5
    assert _hint(_pool_with("reward", [1.0, 0.0, 1.0, 1.0, 1.0]), "reward") is None  # a tie at the hint
    assert _hint(_pool_with("reward", [0.2, math.nan, 0.4]), "reward") is None  # two values only
    assert _hint(_pool_with("importance", [3.0, 9.0, 5.0]), "importance") == 3.0
    assert _hint(_pool_with("completed_at", [5.0, 6.0, 7.0, 8.0]), "completed_at") == 6.0
    assert _hint(_pool_with("last_accessed", [5.0, 6.0, 7.0]), "last_accessed") is None  # never a floor


def test_an_access_count_that_is_not_a_finite_number_is_zero():
    hits = [
        SearchHit(key=b"k%d" % i, fields={b"access_count": v})
        for i, v in enumerate([b"inf", b"-inf", b"x", b"7"])
    ]
    cols = Columns.of_hits(hits, np.zeros(4), np.zeros(4), "vector")
    assert [cols.candidate(i).access_count for i in range(4)] == [0, 0, 0, 7]
