"""How long a scope's count is remembered (`services.query.recall.sizes.size_ttl`): pure arithmetic."""

from __future__ import annotations

import pytest

from services.query.recall.sizes import LARGE_SCOPE, MAX_SIZE_TTL, size_ttl


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, 5.0),
        (500, 5.0),
        (LARGE_SCOPE, 5.0),
        (300_000, 15.0),
        (1_000_000, 50.0),
        (10_000_000, MAX_SIZE_TTL),
    ],
)
def test_a_large_scope_keeps_its_count_in_proportion_up_to_a_minute(n, expected):
    """At a million episodes a count costs ~60 ms of Redis's main thread: every 50 s, not every 5 s."""
    assert size_ttl(5.0, n) == pytest.approx(expected)


def test_no_ttl_stays_no_ttl_and_a_long_one_is_never_shortened():
    assert size_ttl(0.0, 10_000_000) == 0.0  # ScopeSizes(ttl=0): every call counts
    assert size_ttl(120.0, 10) == 120.0
