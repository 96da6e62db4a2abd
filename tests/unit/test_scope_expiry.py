"""Scope's expiry clause (pure): in the query, but not in the key the scope caches use."""

from __future__ import annotations

from shared.index import Scope
from shared.tags import BLAKE2B


def test_the_expiry_clause_is_in_the_query_and_not_in_the_cache_key():
    a = Scope(namespace="n", tags=BLAKE2B, agent_id="x", live_at=1_700_000_000.0)
    b = Scope(namespace="n", tags=BLAKE2B, agent_id="x", live_at=1_700_000_001.5)
    assert a.query().endswith("-@expires_at:[-inf 1700000000.0]")
    assert a.query() != b.query()
    # ScopeSizes and the recall floors key on this: keyed on query() they never hit (a new instant
    # per request) and were cleared at 10,000 entries
    assert a.cache_key() == b.cache_key() == Scope(namespace="n", tags=BLAKE2B, agent_id="x").query()
    assert "expires_at" not in Scope(namespace="n", tags=BLAKE2B).query()
