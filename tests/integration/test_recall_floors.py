"""The recency / reward lists' floors (`services.query.recall.lists`) at scale's terms: a floor is kept past
any age and moved by each exact answer, so a large scope is sorted whole once, not every half minute;
a scope without a floor is narrowed from a hint (a value its recall's pool holds) and sorted whole
only when the hint cannot be proven to hold the top depth. Every answer is the full sort's. Real
Redis; the list queries are counted by wrapping the real `filter_search`."""

from __future__ import annotations

import math

import pytest

from services.query.recall import pool
from shared.index import Scope, filter_search
from shared.keys import Keys
from shared.tags import BLAKE2B
from tests.integration import test_recall_ties as ties
from tests.integration.test_query_support import episode, put
from tests.integration.test_recall_ties import exact

pytest_plugins = ["tests.integration.test_query_support"]

_fresh_floors, calls = ties._fresh_floors, ties.calls  # the same fixtures: floors cleared, queries counted

FLOORS = ties.FLOORS
NOW = 1_760_000_000.0
DEPTH = 5
N = 40


async def _scope(redis, prefix, ns: str) -> tuple[str, Scope]:
    for i in range(N):  # distinct times and rewards: each list is one order
        await put(
            redis,
            prefix,
            ns,
            episode(f"f{i}", task="cache deploy", completed_at=NOW - 60.0 * i, reward=(i * 7 % N) / N),
        )
    return Keys(prefix).episode_index_alias, Scope(tags=BLAKE2B, namespace=ns)


def _narrowed(call: tuple[str | None, str], name: str) -> bool:
    """A sorted query narrowed to the episodes at or above a floor of `name`."""
    sort_by, query = call
    return sort_by == name and f"@{name}:[" in query and "-inf +inf" not in query


async def _keys(redis, index, scope, name, **kw) -> list[bytes]:
    return [
        h.key for h in await FLOORS.top_by(redis, index, scope, name, DEPTH, pool.LIGHT_SIGNAL_FIELDS, **kw)
    ]


@pytest.mark.parametrize("name", ["completed_at", "reward"])
async def test_a_floor_outlives_any_age_and_moves_with_each_exact_answer(
    make_client, redis, prefix, calls, name
):
    await make_client()
    index, scope = await _scope(redis, prefix, f"floors-{name}")
    assert await _keys(redis, index, scope, name) == await exact(redis, index, scope, name)
    assert len(calls) == 1 and not _narrowed(calls[0], name)  # no floor yet: the whole scope
    key = next(k for k in FLOORS.floors if k[2] == name)
    before = FLOORS.floors[key][0]  # kept however old: a floor is a checked hint, not a cache
    for j in range(3):  # above the boundary: the top depth moves, so must the floor
        await put(
            redis,
            prefix,
            scope.namespace,
            episode(f"new{j}", task="x", completed_at=NOW + 60.0 * (j + 1), reward=0.99 + j / 1000),
        )
    calls.clear()
    assert await _keys(redis, index, scope, name) == await exact(redis, index, scope, name)
    assert len(calls) == 1 and _narrowed(calls[0], name)
    assert FLOORS.floors[key][0] > before


@pytest.mark.parametrize("name", ["completed_at", "reward"])
async def test_a_hint_narrows_a_scope_without_a_floor(make_client, redis, prefix, calls, name):
    await make_client()
    index, scope = await _scope(redis, prefix, f"hint-{name}")
    want = await exact(redis, index, scope, name)
    _, ranked = await filter_search(redis, index, scope, return_fields=(name,), sort_by=name, limit=N)
    value = [float(h.fields[name.encode()]) for h in ranked]
    # the 12th best: DEPTH + 1 and more lie at or above it, so the narrowed sort is proven exact
    assert await _keys(redis, index, scope, name, hint=value[11]) == want
    assert len(calls) == 1 and _narrowed(calls[0], name)
    FLOORS.floors.clear()
    calls.clear()
    # the 3rd best: too few above it to prove anything; the whole scope is sorted after it
    assert await _keys(redis, index, scope, name, hint=value[2]) == want
    assert [_narrowed(c, name) for c in calls] == [True, False]
    for hint in (None, math.nan):  # no hint: the whole scope
        FLOORS.floors.clear()
        calls.clear()
        assert await _keys(redis, index, scope, name, hint=hint) == want
        assert len(calls) == 1 and not _narrowed(calls[0], name)


async def test_remembered_lists_move_their_floors(make_client, redis, prefix):
    """The union KNN's exact answer moves each list's floor to its new boundary, as top_by's does."""
    from shared.embedding import HashingEmbedder

    await make_client()
    index, scope = await _scope(redis, prefix, "floors-union")
    names = ["completed_at", "reward"]
    for name in names:
        await FLOORS.top_by(redis, index, scope, name, DEPTH, pool.LIGHT_SIGNAL_FIELDS)
    before = {k[2]: v[0] for k, v in FLOORS.floors.items()}
    for j in range(3):
        await put(
            redis,
            prefix,
            scope.namespace,
            episode(f"new{j}", task="x", completed_at=NOW + 60.0 * (j + 1), reward=0.99 + j / 1000),
        )
    query = HashingEmbedder(256).embed_sync(["cache deploy"])[0]
    got = await FLOORS.remembered_lists(redis, index, scope, query, names, DEPTH, pool.LIGHT_SIGNAL_FIELDS)
    assert got is not None
    assert [[h.key for h in g] for g in got] == [await exact(redis, index, scope, n) for n in names]
    after = {k[2]: v[0] for k, v in FLOORS.floors.items()}
    assert all(after[n] > before[n] for n in names)


async def test_the_newest_episodes_ride_on_a_deeper_lists_floor(make_client, redis, prefix, calls):
    """`recall.latest` (`/v1/context`'s short-term window) is `top_by`'s list: with a deeper list's floor
    of the scope remembered (a recall's recency list) it is one narrowed sort, not a sort of the whole
    scope, and the same episodes, newest first."""
    from services.query import recall as rc

    await make_client()
    index, scope = await _scope(redis, prefix, "newest")
    await FLOORS.top_by(redis, index, scope, "completed_at", 20, pool.LIGHT_SIGNAL_FIELDS)  # a deeper list
    calls.clear()
    newest = await rc.latest(redis, index, scope, 3, FLOORS)
    assert [c.key for c in newest] == (await exact(redis, index, scope, "completed_at"))[:3]
    assert len(calls) == 1 and _narrowed(calls[0], "completed_at")
    FLOORS.floors.clear()
    FLOORS.deepest.clear()
    calls.clear()
    assert [c.key for c in await rc.latest(redis, index, scope, 3, FLOORS)] == [c.key for c in newest]
    assert len(calls) == 1 and not _narrowed(calls[0], "completed_at")  # no floor: the whole scope
