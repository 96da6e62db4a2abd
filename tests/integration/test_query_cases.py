"""The bug cases of shared/cases/README.md, over HTTP: C03-C06, C09, C12-C17."""

from __future__ import annotations

import asyncio
import unicodedata
from urllib.parse import quote

import pytest
from yarl import URL

from shared import streams
from shared.codec import decode
from shared.keys import Keys
from tests.integration.test_query_support import KEY_A, KEY_B, TableEmbedder, auth, episode, ids, put

pytest_plugins = ["tests.integration.test_query_support"]


def errors(body) -> dict[str, str]:
    return {e["field"]: e["reason"] for e in body.get("errors", [])}


async def post(client, path, body, status=200, headers=None):
    resp = await client.post(path, json=body, headers=headers)
    data = await resp.json()
    assert resp.status == status, data
    return data


# --- C03: namespaces never leak ---------------------------------------------------------------------
async def test_concurrent_namespaces_leak_nothing_into_each_other(tenants, redis, prefix):
    """Case C03: two namespaces written concurrently never see each other's episodes in any read."""
    shared_ids = [f"ep-{i}" for i in range(5)]

    async def write(ns):
        for i, eid in enumerate(shared_ids):
            await put(
                redis,
                prefix,
                ns,
                episode(
                    eid,
                    task=f"deploy service {ns} {i}",
                    agent_id="agent",
                    user_id="user",
                    category=f"cat-{ns}",
                    reward=0.5,
                    strategy_used=f"strat-{ns}",
                ),
            )

    await asyncio.gather(write("ns-a"), write("ns-b"))
    # HTTP ingest for both namespaces at once: each event carries its key's namespace
    bodies = [{"episodes": [episode(f"http-{i}", task="deploy")]} for i in range(2)]
    await asyncio.gather(
        *(post(tenants, "/v1/episodes", b, 202, auth(k)) for b, k in zip(bodies, (KEY_A, KEY_B), strict=True))
    )
    entries = await streams.read_range(redis, Keys(prefix).stream)
    namespaces = {decode(e.payload).episode.episode_id: decode(e.payload).namespace for e in entries}
    assert namespaces == {"http-0": "ns-a", "http-1": "ns-b"}

    for key, mine, other in ((KEY_A, "ns-a", "ns-b"), (KEY_B, "ns-b", "ns-a")):
        h = auth(key)
        for mode in ("vector", "keyword", "hybrid"):
            body = await post(
                tenants, "/v1/recall", {"query": "deploy service", "top_k": 100, "mode": mode}, headers=h
            )
            assert len(body["results"]) == 5
            assert all(r["episode"]["task"]["category"] == f"cat-{mine}" for r in body["results"])
        got = await (await tenants.get("/v1/episodes/ep-0", headers=h)).json()
        assert got["episode"]["task"]["category"] == f"cat-{mine}"
        skills = await (await tenants.get("/v1/skills", headers=h)).json()
        assert [s["category"] for s in skills["results"]] == [f"cat-{mine}"]
        assert skills["results"][0]["episodes"] == 5
        curve = await (await tenants.get("/v1/learning-curve", headers=h)).json()
        assert len(curve["results"]) == 5
        ctx = await post(tenants, "/v1/context", {"task": "deploy service", "top_k": 10}, headers=h)
        assert all(e["task"]["category"] == f"cat-{mine}" for e in ctx["short_term"])
        assert f"cat-{other}" not in str(ctx) and f"strat-{other}" not in str(ctx)
        assert ctx["facts"] == []
        strat = await post(
            tenants, "/v1/strategy", {"task": "deploy service", "min_similarity": -1}, headers=h
        )
        assert strat["strategy"] == f"strat-{mine}"
        sug = await post(tenants, "/v1/suggest", {"task": "deploy service", "min_similarity": -1}, headers=h)
        assert sug["similar"] == 5


async def test_a_namespace_in_the_body_is_rejected_not_obeyed(tenants):
    """Case C03: a `namespace` in a request body is a 422; the key alone decides the namespace."""
    body = await post(tenants, "/v1/recall", {"query": "x", "namespace": "ns-b"}, 422, auth(KEY_A))
    assert "namespace" in errors(body)
    body = await post(tenants, "/v1/episodes", episode("e", namespace="ns-b"), 422, auth(KEY_A))
    assert "namespace" in errors(body)


# --- C04-C06: time windows --------------------------------------------------------------------------
async def test_a_utc_day_window_finds_an_early_morning_episode(api, redis, prefix):
    """Case C04: an episode completed at 02:00 UTC is found by that UTC day's window, with no local shift."""
    await put(redis, prefix, "default", episode("e", completed_at="2025-07-25T02:00:00Z"))
    body = await post(
        api,
        "/v1/recall",
        {"query": "a task", "since": "2025-07-25T00:00:00Z", "until": "2025-07-25T23:59:59Z"},
    )
    assert ids(body) == ["e"]
    assert body["results"][0]["episode"]["completed_at"] == "2025-07-25T02:00:00Z"
    got = await (await api.get("/v1/episodes/e")).json()
    assert got["episode"]["completed_at"] == "2025-07-25T02:00:00Z"


@pytest.mark.parametrize(
    "since,until",
    [
        ("2015-03-01T12:00:00Z", "2015-03-01T12:00:00Z"),
        ("2015-03-01T12:00:00+00:00", "2015-03-01T12:00:00+00:00"),
        ("2015-03-01T05:00:00-07:00", "2015-03-01T05:00:00-07:00"),
        (1425211200, 1425211200.0),
    ],
)
async def test_equivalent_offsets_give_identical_results_and_bounds_are_inclusive(
    api, redis, prefix, since, until
):
    """Case C05: windows written with `Z`, `+00:00` or an equivalent offset give the same results;
    bounds are inclusive."""
    await put(redis, prefix, "default", episode("backdated", completed_at="2015-03-01T12:00:00Z"))
    await put(redis, prefix, "default", episode("june15", completed_at="2025-06-15T12:00:00Z"))
    await put(redis, prefix, "default", episode("a-second-later", completed_at="2015-03-01T12:00:01Z"))
    body = await post(api, "/v1/recall", {"query": "a task", "since": since, "until": until, "top_k": 10})
    assert ids(body) == ["backdated"]
    body = await post(
        api,
        "/v1/recall",
        {"query": "a task", "since": "2025-06-18T00:00:00Z", "until": "2025-06-25T23:59:59Z", "top_k": 10},
    )
    assert ids(body) == []


async def test_open_and_closed_time_windows(api, redis, prefix):
    """Case C06: a window with only `since`, only `until`, or both, selects the episodes inside it."""
    for day in (1, 10, 20):
        await put(redis, prefix, "default", episode(f"d{day}", completed_at=f"2025-01-{day:02d}T00:00:00Z"))

    async def window(**w):
        return sorted(ids(await post(api, "/v1/recall", {"query": "a task", "top_k": 10, **w})))

    assert await window(since="2025-01-10T00:00:00Z") == ["d10", "d20"]
    assert await window(until="2025-01-10T00:00:00Z") == ["d1", "d10"]
    assert await window(since="2025-01-05T00:00:00Z", until="2025-01-15T00:00:00Z") == ["d10"]


@pytest.mark.parametrize(
    "window,field",
    [
        ({"since": "2025-01-20T00:00:00Z", "until": "2025-01-10T00:00:00Z"}, "since"),
        ({"since": "last tuesday"}, "since"),
        ({"until": "2025-13-45"}, "until"),
        ({"since": "2025-01-10T00:00:00"}, "since"),  # no offset: never guessed
        ({"until": True}, "until"),
    ],
)
async def test_bad_time_windows_are_422_naming_the_field(api, window, field):
    """Case C06: `since` later than `until`, or a date that is not ISO 8601, is a 422 naming the field."""
    body = await post(api, "/v1/recall", {"query": "a task", **window}, 422)
    assert field in errors(body), body


# --- C09: empty queries -----------------------------------------------------------------------------
@pytest.mark.parametrize("query", ["", "   ", "\n\t", None, 42])
async def test_a_blank_query_is_422_and_the_embedder_is_not_called(make_client, redis, prefix, query):
    """Case C09: an empty or blank query is a 422 naming `query`, never "return everything"."""
    await put(redis, prefix, "default", episode("e"))
    embedder = TableEmbedder(256)
    client = await make_client(embedder)
    body = {} if query is None else {"query": query}
    data = await post(client, "/v1/recall", body, 422)
    assert "query" in errors(data)
    for path in ("/v1/context", "/v1/strategy", "/v1/suggest"):
        data = await post(client, path, {} if query is None else {"task": query}, 422)
        assert "task" in errors(data)
    assert embedder.calls == 0


# --- C12: hostile ids -------------------------------------------------------------------------------
C12_IDS = [
    "f2c59d63-a7a7-b5e6-8000-000000000000",
    "jira-summary",
    "a.b@c.d",
    "ns:with:colons",
    "path/with\\slash",
    "main",
    "_",
    "x|y",
    "{curly}",
    "$dollar",
    "日本語",
    "emoji-🙂",
    "a b",
    "*",
    "-neg",
    "(paren)",
    "@agent_id:{x}",
]
DECOYS = ["mai", "mainly", "jira", "ns", "User", "x", "y", "curly", "a", "b", "日本", "emoji"]


async def test_ids_with_query_syntax_match_exactly_over_http(api, redis, prefix):
    """Case C12: ids holding query syntax match exactly through every HTTP read, never their decoys."""
    for value in C12_IDS + DECOYS:
        await put(
            redis,
            prefix,
            "default",
            episode(
                value,
                task=f"shared task {value}",
                agent_id=value,
                user_id=value,
                session_id=value,
                category=value,
            ),
        )
    for value in C12_IDS:
        for name in ("agent_id", "user_id", "session_id"):
            body = await post(api, "/v1/recall", {"query": "shared task", name: value, "top_k": 100})
            assert ids(body) == [value], (name, value)
        body = await post(api, "/v1/recall", {"query": "shared task", "category": [value], "top_k": 100})
        assert ids(body) == [value]
        resp = await api.get(URL(f"/v1/episodes/{quote(value, safe='')}", encoded=True))
        assert resp.status == 200, value
        assert (await resp.json())["episode"]["episode_id"] == value
        skills = await (await api.get("/v1/skills", params={"agent_id": value, "user_id": value})).json()
        assert [(s["category"], s["episodes"]) for s in skills["results"]] == [(value, 1)]
        curve = await (await api.get("/v1/learning-curve", params={"session_id": value})).json()
        assert [p["episode_id"] for p in curve["results"]] == [value]
    # ingest and forget with the same ids: accepted verbatim
    data = await post(
        api, "/v1/episodes", {"episodes": [episode(v, agent_id=v, user_id=v) for v in C12_IDS]}, 202
    )
    assert [r["episode_id"] for r in data["results"]] == C12_IDS
    for value in C12_IDS:
        resp = await api.delete(URL(f"/v1/users/{quote(value, safe='')}", encoded=True))
        assert resp.status == 202 and (await resp.json())["user_id"] == value
    entries = await streams.read_range(redis, Keys(prefix).stream)
    assert [decode(e.payload).user_id for e in entries[len(C12_IDS) :]] == C12_IDS


# --- C13: filters -----------------------------------------------------------------------------------
async def test_filters_work_and_unknown_operators_or_fields_are_422(api, redis, prefix):
    """Case C13: `reward >= 0.5` and `outcome in [...]` filter; an unknown operator or field is a 422."""
    rows = [
        ("s9", "success", 0.9),
        ("p6", "partial", 0.6),
        ("f8", "failure", 0.8),
        ("s2", "success", 0.2),
        ("a5", "abandoned", 0.5),
    ]
    for eid, outcome, reward in rows:
        await put(redis, prefix, "default", episode(eid, outcome=outcome, reward=reward))

    async def q(**f):
        return sorted(ids(await post(api, "/v1/recall", {"query": "a task", "top_k": 100, **f})))

    assert await q(reward={"gte": 0.5}) == ["a5", "f8", "p6", "s9"]
    assert await q(outcome=["success", "partial"]) == ["p6", "s2", "s9"]
    assert await q(outcome="failure") == ["f8"]
    assert await q(reward={"gte": 0.5, "lte": 0.8}, outcome=["success", "partial", "failure"]) == ["f8", "p6"]
    for body, field in [
        ({"reward": {"gt": 0.5}}, "reward.gt"),
        ({"reward": {"$gte": 0.5}}, "reward.$gte"),
        ({"colour": "red"}, "colour"),
        ({"outcome": ["success", "great"]}, "outcome"),
        ({"reward": {"gte": "high"}}, "reward.gte"),
        ({"reward": 0.5}, "reward"),
        ({"reward": {"gte": 0.9, "lte": 0.1}}, "reward"),
        ({"mode": "magic"}, "mode"),
        ({"preset": "sometimes"}, "preset"),
        ({"weights": {"similarity": -1}}, "weights.similarity"),
        ({"weights": {"novelty": 1}}, "weights.novelty"),
        ({"half_life": "soon"}, "half_life"),
        ({"normalize": "zscore"}, "normalize"),
        ({"touch": "yes"}, "touch"),
    ]:
        data = await post(api, "/v1/recall", {"query": "a task", **body}, 422)
        assert field in errors(data), (body, data)


# --- C14: agent AND user scope on every result type -------------------------------------------------
async def test_agent_and_user_together_scope_every_result_type(api, redis, prefix):
    """Case C14: `agent_id` and `user_id` together scope every result type."""
    for a in ("a1", "a2"):
        for u in ("u1", "u2"):
            for i in range(2):
                await put(
                    redis,
                    prefix,
                    "default",
                    episode(
                        f"{a}-{u}-{i}",
                        task="refactor the parser",
                        agent_id=a,
                        user_id=u,
                        category=f"c-{a}-{u}",
                        strategy_used=f"s-{a}-{u}",
                        reward=0.7,
                        completed_at=1_700_000_000 + i,
                    ),
                )
    scope = {"agent_id": "a1", "user_id": "u1"}
    body = await post(api, "/v1/recall", {"query": "refactor the parser", "top_k": 100, **scope})
    assert sorted(ids(body)) == ["a1-u1-0", "a1-u1-1"]
    ctx = await post(api, "/v1/context", {"task": "refactor the parser", "top_k": 10, **scope})
    assert sorted(r["episode"]["episode_id"] for r in ctx["results"]) == ["a1-u1-0", "a1-u1-1"]
    assert sorted(e["episode_id"] for e in ctx["short_term"]) == ["a1-u1-0", "a1-u1-1"]
    skills = await (await api.get("/v1/skills", params=scope)).json()
    assert [s["category"] for s in skills["results"]] == ["c-a1-u1"]
    curve = await (await api.get("/v1/learning-curve", params=scope)).json()
    assert [p["episode_id"] for p in curve["results"]] == ["a1-u1-0", "a1-u1-1"]
    sug = await post(api, "/v1/suggest", {"task": "refactor the parser", "min_similarity": -1, **scope})
    assert sug["similar"] == 2
    strat = await post(api, "/v1/strategy", {"task": "refactor the parser", "min_similarity": -1, **scope})
    assert strat["strategy"] == "s-a1-u1"


# --- C15: top_k bounds ------------------------------------------------------------------------------
async def test_top_k_is_bounded_and_out_of_range_values_are_422(api, redis, prefix):
    """Case C15: `top_k` 10 returns at most 10; 0, -1 and 10000 are a 422 stating the allowed range."""
    for i in range(15):
        await put(redis, prefix, "default", episode(f"e{i}"))
    body = await post(api, "/v1/recall", {"query": "a task", "top_k": 10})
    assert len(body["results"]) == 10
    body = await post(api, "/v1/recall", {"query": "a task"})
    assert len(body["results"]) == 3  # settings.default_top_k
    for bad in (0, -1, 10000, "5", 2.5, True, None):
        data = await post(api, "/v1/recall", {"query": "a task", "top_k": bad}, 200 if bad is None else 422)
        if bad is not None:
            assert "between 1 and 100" in errors(data)["top_k"]
    data = await post(api, "/v1/recall", {"query": "a task", "top_k": 10, "candidates": 5}, 422)
    assert "candidates" in errors(data)
    data = await post(api, "/v1/recall", {"query": "a task", "candidates": 5000}, 422)
    assert "between 1 and 1000" in errors(data)["candidates"]


# --- C16: scripts and normal forms ------------------------------------------------------------------
async def test_unicode_text_is_byte_exact_and_recallable(api, redis, prefix):
    """Case C16: Chinese, Arabic, emoji, NFC and NFD texts come back byte-exact and are recalled."""
    nfc = unicodedata.normalize("NFC", "café résumé naïve")
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfc != nfd
    texts = {
        "zh": "修复数据库迁移中的死锁问题",
        "ar": "إصلاح خطأ في قاعدة البيانات عند الترحيل",
        "emoji": "deploy 🚀 rocket launch 🔥 hotfix",
        "nfc": nfc,
        "nfd": nfd,
    }
    for name, text in texts.items():
        await put(redis, prefix, "default", episode(name, task=text, solution=text))
    for name, text in texts.items():
        body = await post(api, "/v1/recall", {"query": text, "top_k": 2, "weights": {"similarity": 1}})
        by = {r["episode"]["episode_id"]: r["episode"] for r in body["results"]}
        assert name in by, (name, ids(body))
        assert by[name]["task"]["description"] == text  # byte-exact, no normalisation
        got = await (await api.get(f"/v1/episodes/{name}")).json()
        assert got["episode"]["solution"] == text
    kw = await post(api, "/v1/recall", {"query": texts["ar"], "mode": "keyword", "top_k": 1})
    assert ids(kw) == ["ar"]
