"""The recency / reward / importance lists (`services.query.lists.top_by`) at ties and without values:
exact order (value, then the episode's `tiebreak`) over the scope, answered from a floor
that narrows to ~depth + 1 episodes even when most of the scope shares the boundary value, an empty
list without a sort when no episode has the value, and an index built before `tiebreak` existed.
Real Redis; the queries are counted by wrapping the real `filter_search`."""

from __future__ import annotations

import pytest

from services.query import lists, pool
from shared.index import (
    TIE_FIELD,
    Scope,
    VectorParams,
    ensure_episode_index,
    episode_schema,
    filter_search,
)
from shared.keys import Keys
from shared.legacy import LAYOUT
from shared.tags import BLAKE2B
from tests.integration.test_query_support import episode, put

pytest_plugins = ["tests.integration.test_query_support"]

NOW = 1_760_000_000.0
DEPTH = 5
N = 40


@pytest.fixture(autouse=True)
def _fresh_floors():
    lists._FLOORS.clear()
    lists._DEEPEST.clear()
    yield
    lists._FLOORS.clear()
    lists._DEEPEST.clear()


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
    first = [h.key for h in await lists.top_by(redis, index, scope, name, DEPTH, pool.LIGHT_SIGNAL_FIELDS)]
    assert first == want
    calls.clear()
    again = [h.key for h in await lists.top_by(redis, index, scope, name, DEPTH, pool.LIGHT_SIGNAL_FIELDS)]
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
        h.key for h in await lists.top_by(redis, index, scope, name, DEPTH, pool.LIGHT_SIGNAL_FIELDS)
    ] == await exact(redis, index, scope, name)


async def test_no_episode_with_a_reward_is_an_empty_list_without_a_sort(make_client, redis, prefix, calls):
    await make_client()
    ns = "no-reward"
    index, scope = Keys(prefix).episode_index_alias, Scope(tags=BLAKE2B, namespace=ns)
    await seed(redis, prefix, ns, reward=lambda i: None)
    assert await lists.top_by(redis, index, scope, "reward", DEPTH, pool.LIGHT_SIGNAL_FIELDS) == []
    assert len(calls) == 1 and "@reward:[-inf +inf]" in calls[0][1]  # answered by an empty range
    # fewer than DEPTH with one: those, in order
    await put(redis, prefix, ns, episode("r1", task="x", completed_at=NOW, reward=0.5))
    await put(redis, prefix, ns, episode("r2", task="x", completed_at=NOW, reward=0.5))
    got = [h.key for h in await lists.top_by(redis, index, scope, "reward", DEPTH, pool.LIGHT_SIGNAL_FIELDS)]
    assert got == await exact(redis, index, scope, "reward") and len(got) == 2


async def test_an_index_without_tiebreak_keeps_working_and_ties_narrow_after_a_replay(redis, prefix, calls):
    """Upgrade: an index created before `tiebreak` gets it (FT.ALTER, `ensure_episode_index`), while
    its documents lack it the lists are the full sort's (right values, no narrowed tie floor); once
    the documents are written again (a replay) ties narrow."""
    keys = Keys(prefix)
    params = VectorParams(dim=256, algorithm="FLAT")
    old = episode_schema(params)
    i = old.index(TIE_FIELD)
    del old[i : i + 3]  # name, NUMERIC, SORTABLE
    await redis.execute_command(
        "FT.CREATE",
        keys.episode_index(1),
        "ON",
        "HASH",
        "PREFIX",
        1,
        keys.episode_doc_prefix(1),
        "SCHEMA",
        *old,
    )
    await redis.hset(keys.meta, "g1:layout", LAYOUT)  # built by an Engram with hash-tagged keys
    ns = "upgrade"
    await seed(redis, prefix, ns, reward=lambda i: 1.0)
    async for key in redis.scan_iter(match=f"{keys.episode_doc_prefix(1)}*"):
        await redis.hdel(key, TIE_FIELD)  # as an older projection wrote them
    await ensure_episode_index(redis, keys, 1, params, "hashing-256", tag_key=None)
    index, scope = keys.episode_index_alias, Scope(tags=BLAKE2B, namespace=ns)
    for _ in range(2):
        got = await lists.top_by(redis, index, scope, "reward", DEPTH, pool.LIGHT_SIGNAL_FIELDS)
        assert len(got) == DEPTH and all(h.fields[b"reward"] == b"1" for h in got)
    assert all(sort == "reward" for sort, _ in calls)  # no tie floor without tie-breaks: full sorts
    await seed(redis, prefix, ns, reward=lambda i: 1.0)  # the replay writes every field again
    calls.clear()
    want = await exact(redis, index, scope, "reward")
    assert [
        h.key for h in await lists.top_by(redis, index, scope, "reward", DEPTH, pool.LIGHT_SIGNAL_FIELDS)
    ] == want
    calls.clear()
    assert [
        h.key for h in await lists.top_by(redis, index, scope, "reward", DEPTH, pool.LIGHT_SIGNAL_FIELDS)
    ] == want
    assert len(calls) == 1 and calls[0][0] is None


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
