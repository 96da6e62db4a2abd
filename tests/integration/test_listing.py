"""`GET /v1/episodes` and `GET /v1/facts`: filters, order, cursors, tenancy, and stable pages while
others publish (a hypothesis property through the real service and consolidator)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from engram_episodic import AsyncEngram, BadRequest, Engram
from shared.keys import Keys
from shared.tags import BLAKE2B
from shared.ties import TIE_FIELD, tie_break, tie_tag
from tests.integration.test_query_e2e import consolidating, drain
from tests.integration.test_query_support import KEY_A, KEY_B, auth, episode, put_all

pytest_plugins = ["tests.integration.test_query_support"]

T0 = 1_700_000_000.0


async def pages(api, path="/v1/episodes", headers=None, **params):
    """Every page of a listing, following next_cursor; the list of pages' id lists."""
    out = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        resp = await api.get(path, params=query, headers=headers or {})
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        key = "episode_id" if path == "/v1/episodes" else "fact_id"
        out.append([r[key] for r in body["results"]])
        cursor = body["next_cursor"]
        assert len(out) < 1000, "the cursors never ended"
        if cursor is None:
            return out


def by_tie(ids: list[str]) -> list[str]:
    """`ids` in the listing's `desc` order of exact ties: their tie-breaks, highest first."""
    return sorted(ids, key=lambda i: tie_break(tie_tag(BLAKE2B, i)), reverse=True)


async def test_lists_newest_first_with_filters_and_ties(api, redis, prefix):
    # three share one completed_at (a batch is stamped with one instant): the tie is ordered by tie-break
    items = [
        episode(f"e{i}", completed_at=T0 + (i if i < 5 else 5), agent_id="a" if i % 2 else "b")
        for i in range(8)
    ]
    items.append(episode("f0", completed_at=T0 + 1, outcome="failure", user_id="ann", session_id="s1"))
    await put_all(redis, prefix, "default", items)
    every = await pages(api, limit=2)
    flat = [i for p in every for i in p]
    assert sorted(flat) == sorted(i["episode_id"] for i in items) and len(flat) == len(set(flat))
    assert all(len(p) == 2 for p in every[:-1]) and len(every) == 5
    # the tie at T0 + 5, ordered by the episodes' tie-breaks (`shared.ties`), highest first
    assert flat[:3] == by_tie(["e5", "e6", "e7"])
    asc = [i for p in await pages(api, limit=3, order="asc") for i in p]
    assert asc == flat[::-1]
    one = await (await api.get("/v1/episodes", params={"limit": 1000})).json()
    assert [r["episode_id"] for r in one["results"]] == flat and one["next_cursor"] is None
    assert one["results"][0]["completed_at"].endswith("Z")

    async def ids(**params):
        return [i for p in await pages(api, **params) for i in p]

    assert await ids(agent_id="a") == by_tie(["e5", "e7"]) + ["e3", "e1"]
    assert await ids(outcome="failure") == ["f0"]
    assert await ids(user_id="ann") == await ids(session_id="s1") == ["f0"]
    assert await ids(since=str(T0 + 3), until="2023-11-14T22:13:24Z") == ["e4", "e3"]  # T0 + 4 = :24
    assert await ids(category="nope") == []


async def test_bad_parameters_and_cursors_are_422_naming_them(api, redis, prefix):
    await put_all(redis, prefix, "default", [episode(f"e{i}", completed_at=T0 + i) for i in range(3)])
    body = await (await api.get("/v1/episodes", params={"limit": 2})).json()
    cursor = body["next_cursor"]
    assert cursor
    cases = [
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"offset": "2"}, "offset"),
        ({"order": "sideways"}, "order"),
        ({"outcome": "great"}, "outcome"),
        ({"since": "yesterday"}, "since"),
        ({"since": str(T0 + 9), "until": str(T0)}, "since"),
        ({"cursor": "garbage"}, "cursor"),
        ({"cursor": cursor[:-2] + ("AA" if not cursor.endswith("AA") else "BB")}, "cursor"),
        ({"cursor": "x" + cursor}, "cursor"),
        ({"cursor": cursor, "order": "asc"}, "cursor"),
        ({"cursor": cursor, "agent_id": "a"}, "cursor"),
    ]
    for params, field in cases:
        resp = await api.get("/v1/episodes", params=params)
        assert resp.status == 422, (params, await resp.text())
        assert field in {e["field"] for e in (await resp.json())["errors"]}, params
    # the same cursor with another limit is fine: limit is not a filter
    resp = await api.get("/v1/episodes", params={"cursor": cursor, "limit": 5})
    assert resp.status == 200 and [r["episode_id"] for r in (await resp.json())["results"]] == ["e0"]
    resp = await api.get("/v1/facts", params={"session_id": "s"})
    assert resp.status == 422 and "session_id" in await resp.text()


async def test_tenancy_is_the_api_keys(tenants, redis, prefix):
    await put_all(redis, prefix, "ns-a", [episode("a1"), episode("a2", completed_at=T0 + 1)])
    await put_all(redis, prefix, "ns-b", [episode("b1")])
    assert await pages(tenants, headers=auth(KEY_A)) == [["a2", "a1"]]
    assert await pages(tenants, headers=auth(KEY_B)) == [["b1"]]
    assert (await tenants.get("/v1/episodes")).status == 401
    # a cursor of tenant A read by tenant B names positions only: B still sees only its own
    body = await (await tenants.get("/v1/episodes", params={"limit": 1}, headers=auth(KEY_A))).json()
    resp = await tenants.get(
        "/v1/episodes", params={"limit": 1, "cursor": body["next_cursor"]}, headers=auth(KEY_B)
    )
    assert resp.status == 200 and [r["episode_id"] for r in (await resp.json())["results"]] == ["b1"]


async def test_facts_are_listed_page_by_page(api, settings, redis):
    batch = [
        {
            "task": {"description": f"renew the tls certificate of host {i}", "category": "ops"},
            "outcome": "success",
            "agent_id": "ops",
            "strategy_used": "iterative",
            "feedback": {"reward": 1.0},
        }
        for i in range(6)
    ] + [
        {
            "task": {"description": f"migrate the orders table shard {i}", "category": "db"},
            "outcome": "failure",
            "agent_id": "ops",
            "feedback": {"reward": 0.0, "message": "lock timeout"},
        }
        for i in range(6)
    ]
    assert (await api.post("/v1/episodes", json={"episodes": batch})).status == 202
    await drain(settings, redis)
    assert (await api.post("/v1/consolidate", json={})).status == 200
    search = await (await api.post("/v1/facts/search", json={"top_k": 100})).json()
    expected = {f["fact_id"] for f in search["results"]}
    assert expected
    listed = await pages(api, "/v1/facts", limit=1)
    flat = [i for p in listed for i in p]
    assert set(flat) == expected and len(flat) == len(expected)
    assert await pages(api, "/v1/facts", agent_id="nobody") == [[]]
    # the facts one episode is evidence for: those whose evidence names it, and no other
    for fact in search["results"]:
        cited = await pages(api, "/v1/facts", episode_id=fact["evidence"][0], include_superseded="true")
        assert fact["fact_id"] in cited[0]
        assert all(
            fact["evidence"][0] in f["evidence"] for f in search["results"] if f["fact_id"] in cited[0]
        )
    assert await pages(api, "/v1/facts", episode_id="never-recorded") == [[]]


@pytest.mark.timeout(180)  # a stream of publishes and pages per example, through the consolidator
@hsettings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    before=st.lists(st.integers(0, 20), min_size=1, max_size=25),
    during=st.lists(st.integers(0, 20), max_size=25),
    limit=st.integers(1, 7),
    order=st.sampled_from(["desc", "asc"]),
)
async def test_pages_have_no_duplicates_or_gaps_while_others_publish(
    api, settings, redis, before, during, limit, order
):
    """Episodes that existed before the listing started are each listed exactly once, whatever is
    published (new ids at any completed_at, ties included) between its pages."""
    tag = f"r{abs(hash((tuple(before), tuple(during), limit, order))) % 10**8}"

    def batch(name, offsets):
        return [
            episode(f"{tag}-{name}{i}", completed_at=T0 + off, agent_id=tag) for i, off in enumerate(offsets)
        ]

    old = batch("old", before)
    async with consolidating(settings, redis):
        resp = await api.post("/v1/episodes", json={"episodes": old}, params={"wait": 10})
        assert (await resp.json())["projected"]
        seen: list[str] = []
        cursor = None
        pending = list(batch("new", during))
        while True:
            params = {
                "agent_id": tag,
                "limit": limit,
                "order": order,
                **({"cursor": cursor} if cursor else {}),
            }
            body = await (await api.get("/v1/episodes", params=params)).json()
            seen += [r["episode_id"] for r in body["results"]]
            if pending:  # publish a few between pages, and let them be projected before the next one
                now, pending = pending[:3], pending[3:]
                r = await api.post("/v1/episodes", json={"episodes": now}, params={"wait": 10})
                assert (await r.json())["projected"]
            cursor = body["next_cursor"]
            if cursor is None:
                break
    assert len(seen) == len(set(seen)), "a page repeated an episode"
    assert {e["episode_id"] for e in old} <= set(seen), "a page skipped an episode"


async def test_the_clients_list_and_iterate(tenants, redis, prefix):
    await put_all(
        redis,
        prefix,
        "ns-a",
        [episode(f"e{i}", completed_at=T0 + i, agent_id="a" if i < 5 else "b") for i in range(7)],
    )
    base = str(tenants.make_url("")).rstrip("/")
    async with AsyncEngram(base, api_key=KEY_A) as memory:
        page = await memory.list_episodes(limit=2, agent_id="a")
        assert [e.episode_id for e in page] == ["e4", "e3"] and page.next_cursor
        assert [e.episode_id async for e in memory.iter_episodes(limit=2, order="asc", agent_id="a")] == [
            f"e{i}" for i in range(5)
        ]
        with pytest.raises(BadRequest) as bad:
            await memory.list_episodes(cursor="made-up")
        assert [f for f, _ in bad.value.errors] == ["cursor"]
        assert len(await memory.list_facts()) == 0

    def sync() -> list[str]:
        with Engram(base, api_key=KEY_A) as memory:
            return [e.episode_id for e in memory.iter_episodes(limit=3, since=T0 + 2)]

    assert await asyncio.to_thread(sync) == [f"e{i}" for i in range(6, 1, -1)]


async def test_exact_ties_list_alike_in_every_namespace_and_asc_is_desc_reversed(tenants, redis, prefix):
    """Order among exact ties came from the document key, a digest of (namespace, id): the same
    episodes listed in another order in another namespace, and `asc` kept the keys ascending, so it was
    not `desc` reversed. Now: the tie-break, from the id alone, then the key, all in the order's
    direction."""
    items = [episode(f"t{i:02d}", completed_at=T0 + i // 10) for i in range(40)]  # 4 groups of 10 ties
    for ns in ("ns-a", "ns-b"):
        await put_all(redis, prefix, ns, items)
    orders = {}
    for key in (KEY_A, KEY_B):
        for order in ("desc", "asc"):
            got = [i for p in await pages(tenants, headers=auth(key), limit=3, order=order) for i in p]
            assert sorted(got) == sorted(i["episode_id"] for i in items)
            orders[key, order] = got
    assert orders[KEY_A, "desc"] == orders[KEY_B, "desc"]
    assert orders[KEY_A, "asc"] == orders[KEY_B, "asc"] == orders[KEY_A, "desc"][::-1]
    assert orders[KEY_A, "desc"][:10] == by_tie([f"t{i:02d}" for i in range(30, 40)])
    # documents projected before `tiebreak` existed (until a replay) come after those with one, either way
    keys = Keys(prefix)
    await put_all(redis, prefix, "ns-a", [episode(f"old{i}", completed_at=T0 + 100) for i in range(6)])
    for i in range(3):
        await redis.hdel(keys.episode_doc(1, "ns-a", f"old{i}"), TIE_FIELD)
    for order in ("desc", "asc"):
        got = [i for p in await pages(tenants, headers=auth(KEY_A), limit=2, order=order) for i in p]
        group = [i for i in got if i.startswith("old")]
        assert len(got) == len(set(got)) == 46 and sorted(group[3:]) == ["old0", "old1", "old2"], group
