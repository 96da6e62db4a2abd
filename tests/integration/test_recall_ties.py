"""The recency / reward / importance lists (`services.query.recall.lists.top_by`) at ties and without values:
exact order (value, then the episode's `tiebreak`) over the scope, answered from a floor
that narrows to ~depth + 1 episodes even when most of the scope shares the boundary value, an empty
list without a sort when no episode has the value.
Real Redis; the queries are counted by wrapping the real `filter_search`."""

from __future__ import annotations

import pytest

from services.query.recall import lists, pool
from shared.index import (
    TIE_FIELD,
    Scope,
    filter_search,
)
from shared.keys import Keys
from shared.tags import BLAKE2B
from tests.integration.test_query_support import episode, put

pytest_plugins = ["tests.integration.test_query_support"]

FLOORS = lists.Floors()  # the lists' floors of these tests (an app holds its own)
NOW = 1_760_000_000.0
DEPTH = 5
N = 40


@pytest.fixture(autouse=True)
def _fresh_floors():
    FLOORS.floors.clear()
    FLOORS.deepest.clear()
    yield
    FLOORS.floors.clear()
    FLOORS.deepest.clear()


@pytest.fixture
def calls(monkeypatch):
    """The list queries `top_by` sends: (sort_by, the query text) per call."""
    out: list[tuple[str | None, str]] = []

    async def counted(r, index, scope, **kwargs):
        out.append((kwargs.get("sort_by"), scope.query()))
        return await filter_search(r, index, scope, **kwargs)

    monkeypatch.setattr(lists, "filter_search", counted)
    return out


async def exact(redis, index, scope, name):
    """The scope's top DEPTH keys by (name, tiebreak), from every document (the definition)."""
    _, full = await filter_search(redis, index, scope, return_fields=(name, TIE_FIELD), limit=10_000)
    field = name.encode()
    rows = [
        (float(h.fields[field]), int(h.fields[TIE_FIELD.encode()]), h.key) for h in full if field in h.fields
    ]
    return [k for *_, k in sorted(rows, reverse=True)[:DEPTH]]


async def seed(redis, prefix, ns, *, reward, importance=None, completed=None, n=N, tag="t"):
    for i in range(n):
        extra = {"importance": importance(i)} if importance else {}
        at = completed(i) if completed else NOW - 60.0 * i
        await put(
            redis,
            prefix,
            ns,
            episode(f"{tag}{i}", task="cache deploy", completed_at=at, reward=reward(i), **extra),
        )


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("reward", dict(reward=lambda i: 0.0 if i % 4 == 3 else 1.0)),  # thumbs up / down
        ("importance", dict(reward=lambda i: None, importance=lambda i: 5 if i % 16 else 9)),
        (
            "completed_at",
            dict(reward=lambda i: None, completed=lambda i: NOW - 60.0 * (i // 20)),
        ),  # same second
    ],
)
async def test_a_tie_at_the_boundary_is_ordered_by_tiebreak_and_narrowed(
    make_client, redis, prefix, calls, name, values
):
    await make_client()
    ns = f"ties-{name}"
    index, scope = Keys(prefix).episode_index_alias, Scope(tags=BLAKE2B, namespace=ns)
    await seed(redis, prefix, ns, **values)
    want = await exact(redis, index, scope, name)
    first = [h.key for h in await FLOORS.top_by(redis, index, scope, name, DEPTH, pool.LIGHT_SIGNAL_FIELDS)]
    assert first == want
    calls.clear()
    again = [h.key for h in await FLOORS.top_by(redis, index, scope, name, DEPTH, pool.LIGHT_SIGNAL_FIELDS)]
    assert again == want
    # one unsorted query for the episodes at or above the (value, tiebreak) floor, no sort of the scope
    assert len(calls) == 1 and calls[0][0] is None and f"@{TIE_FIELD}:[" in calls[0][1]
    # a new episode above the floor and a forgotten member: still the exact order
    await put(
        redis,
        prefix,
        ns,
        episode("late", task="cache deploy", completed_at=NOW + 1.0, reward=1.0, importance=9),
    )
    await redis.delete(first[0])
    assert [
        h.key for h in await FLOORS.top_by(redis, index, scope, name, DEPTH, pool.LIGHT_SIGNAL_FIELDS)
    ] == await exact(redis, index, scope, name)


async def test_no_episode_with_a_reward_is_an_empty_list_without_a_sort(make_client, redis, prefix, calls):
    await make_client()
    ns = "no-reward"
    index, scope = Keys(prefix).episode_index_alias, Scope(tags=BLAKE2B, namespace=ns)
    await seed(redis, prefix, ns, reward=lambda i: None)
    assert await FLOORS.top_by(redis, index, scope, "reward", DEPTH, pool.LIGHT_SIGNAL_FIELDS) == []
    assert len(calls) == 1 and "@reward:[-inf +inf]" in calls[0][1]  # answered by an empty range
    # fewer than DEPTH with one: those, in order
    await put(redis, prefix, ns, episode("r1", task="x", completed_at=NOW, reward=0.5))
    await put(redis, prefix, ns, episode("r2", task="x", completed_at=NOW, reward=0.5))
    got = [h.key for h in await FLOORS.top_by(redis, index, scope, "reward", DEPTH, pool.LIGHT_SIGNAL_FIELDS)]
    assert got == await exact(redis, index, scope, "reward") and len(got) == 2


async def test_exact_ties_rank_alike_in_every_namespace(tenants, redis, prefix):
    """The tie-break came from the episode's namespace digest, so the same episodes at one completion
    instant ranked in one order in one namespace and in another elsewhere."""
    from tests.integration.test_query_support import KEY_A, KEY_B, auth

    for ns in ("ns-a", "ns-b"):
        for i in range(12):
            await put(
                redis, prefix, ns, episode(f"t{i:02d}", task="same words", completed_at=1_700_000_000.0)
            )
    got = []
    for key in (KEY_A, KEY_B):
        body = {"query": "same words", "top_k": 12, "weights": {"recency": 1.0}, "as_of": 1_700_000_100.0}
        resp = await tenants.post("/v1/recall", json=body, headers=auth(key))
        assert resp.status == 200, await resp.text()
        got.append([r["episode"]["episode_id"] for r in (await resp.json())["results"]])
    assert got[0] == got[1] and len(got[0]) == 12
