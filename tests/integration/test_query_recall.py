"""POST /v1/recall over HTTP against the real RediSearch: ranking checked against hand-computed values."""

from __future__ import annotations

import json
import math

import pytest

from shared.tags import BLAKE2B
from tests.helpers import wait_until
from tests.integration.test_query_support import DAY, TableEmbedder, at, episode, ids, put, unit

pytest_plugins = ["tests.integration.test_query_support"]  # fixtures: make_client, api, tenants

T = at("2025-07-01T00:00:00Z")
Q = "how do I fix the flaky migration test"


async def seed_abc(redis, prefix):
    """A: cos 1, 1 day old, reward .2, failure. B: cos .6, age 0, reward 1, success.
    C: cos 0, 12 h old, reward .5, partial."""
    await put(
        redis,
        prefix,
        "default",
        episode("A", completed_at=T - DAY, reward=0.2, outcome="failure", strategy_used="s-a"),
        unit(1.0),
    )
    await put(
        redis,
        prefix,
        "default",
        episode("B", completed_at=T, reward=1.0, outcome="success", strategy_used="s-b"),
        unit(0.6, 0.8),
    )
    await put(
        redis,
        prefix,
        "default",
        episode("C", completed_at=T - DAY / 2, reward=0.5, outcome="partial", strategy_used="s-b"),
        unit(0.0, 1.0),
    )


@pytest.fixture
async def abc(make_client, redis, prefix):
    await seed_abc(redis, prefix)
    return await make_client(TableEmbedder(256, {Q: unit(1.0)}))


async def recall(client, **body):
    resp = await client.post(
        "/v1/recall", json={"query": Q, "top_k": 3, "as_of": T, "mode": "vector", **body}
    )
    assert resp.status == 200, await resp.text()
    return await resp.json()


def by_id(body):
    return {r["episode"]["episode_id"]: r for r in body["results"]}


R12H = 2**-0.5  # recency at 12 h with a 1-day half-life


def hand(s, rec, rew, out):
    """w_sim*cos + w_rec*2^(-age/1d) + w_rew*reward + w_out*outcome for A, B and C."""
    return {
        "A": s * 1 + rec * 0.5 + rew * 0.2,
        "B": s * 0.6 + rec + rew + out,
        "C": rec * R12H + rew * 0.5 + out * 0.5,
    }


@pytest.mark.parametrize(
    "preset,expected",
    [
        # hand-computed with the presets' weights (similarity/recency/reward/outcome)
        ("normal", hand(0.90, 0.05, 0.03, 0.02)),
        ("early", hand(0.95, 0.01, 0.03, 0.01)),
        ("late", hand(0.85, 0.09, 0.04, 0.02)),
    ],
)
async def test_ranking_matches_hand_computed_priorities(abc, preset, expected):
    body = await recall(abc, preset=preset)
    assert body["preset"] == preset
    got = by_id(body)
    for eid, value in expected.items():
        assert got[eid]["priority"] == pytest.approx(value, abs=1e-5), eid
        assert sum(got[eid]["components"].values()) == pytest.approx(value, abs=1e-5)
    assert ids(body) == sorted(expected, key=lambda k: -expected[k])
    assert got["A"]["similarity"] == pytest.approx(1.0, abs=1e-5)
    assert got["B"]["similarity"] == pytest.approx(0.6, abs=1e-5)
    assert got["A"]["recency"] == pytest.approx(0.5)
    assert got["C"]["recency"] == pytest.approx(0.7071, abs=1e-4)


async def test_explicit_weights_win_and_reorder(abc):
    sim = await recall(abc, weights={"similarity": 1}, preset="late")
    assert sim["preset"] == "custom" and ids(sim) == ["A", "B", "C"]
    assert sim["weights"] == {
        "similarity": 1.0,
        "recency": 0.0,
        "reward": 0.0,
        "outcome": 0.0,
        "importance": 0.0,
    }
    rec = await recall(abc, weights={"recency": 1})
    assert ids(rec) == ["B", "C", "A"]


async def test_auto_preset_counts_the_scope(abc):
    body = await recall(abc)
    assert body["preset"] == "auto:early"  # 3 episodes < 50
    assert body["weights"]["similarity"] == pytest.approx(0.95)


async def test_half_life_as_duration_string(abc):
    body = await recall(abc, half_life="12h", weights={"recency": 1})
    got = by_id(body)
    assert got["A"]["recency"] == pytest.approx(0.25)
    assert got["C"]["recency"] == pytest.approx(0.5)
    assert body["half_life"] == 43200
    week = await recall(abc, half_life=DAY, weights={"recency": 1}, as_of=T + 6 * DAY)
    assert by_id(week)["B"]["recency"] == pytest.approx(2**-6)


async def test_as_of_is_echoed_and_decay_is_measured_from_it(make_client, redis, prefix):
    """Case C17: a recall `as_of` 2020-01-01 measures decay from that instant and echoes it."""
    await put(redis, prefix, "default", episode("old", completed_at="2019-12-31T00:00:00Z"))
    await put(redis, prefix, "default", episode("older", completed_at="2019-12-29T00:00:00Z"))
    client = await make_client()
    resp = await client.post(
        "/v1/recall", json={"query": "a task", "as_of": "2020-01-01T00:00:00Z", "weights": {"recency": 1}}
    )
    body = await resp.json()
    assert body["as_of"] == "2020-01-01T00:00:00Z"
    got = by_id(body)
    assert got["old"]["recency"] == pytest.approx(0.5)
    assert got["older"]["recency"] == pytest.approx(0.125)
    epoch = await (await client.post("/v1/recall", json={"query": "a task", "as_of": 1577836800})).json()
    assert epoch["as_of"] == "2020-01-01T00:00:00Z"


async def test_minmax_normalisation(abc):
    body = await recall(abc, preset="normal", normalize="minmax")
    got = by_id(body)
    # per-signal min-max over A, B, C: sim [1,.6,0], rec [.5,1,.7071]→[0,1,.4142], reward [.2,1,.5]→[0,1,.375]
    assert got["A"]["priority"] == pytest.approx(0.9, abs=1e-5)
    assert got["B"]["priority"] == pytest.approx(0.9 * 0.6 + 0.05 + 0.03 + 0.02, abs=1e-5)
    c = 0.05 * (R12H - 0.5) / 0.5 + 0.03 * 0.375 + 0.02 * 0.5
    assert got["C"]["priority"] == pytest.approx(c, abs=1e-5)
    assert body["normalize"] == "minmax"


def keyword_rel(query: str, task: str, counts: dict[str, int]) -> float:
    """services.query.recall.relevance's keyword relevance of a task-only episode, by hand: idf from `counts`."""
    from services.query.recall.relevance import keyword_relevances, query_terms, query_words
    from services.query.recall.terms import Memos

    words = query_words(query)
    terms = query_terms(words, [counts[w] for w in words.values()])
    return float(keyword_relevances(terms, [{b"task": task.encode()}], Memos())[0])


async def test_keyword_and_hybrid_modes(make_client, redis, prefix):
    q = "zebra migration"
    await put(redis, prefix, "default", episode("vec", task="alpha beta"), unit(1.0))
    await put(redis, prefix, "default", episode("kw", task="zebra migration rollback"), unit(0.6, 0.8))
    client = await make_client(TableEmbedder(256, {q: unit(1.0)}))

    async def run(mode, k, query=q):
        resp = await client.post(
            "/v1/recall",
            json={"query": query, "mode": mode, "top_k": k, "candidates": k, "weights": {"similarity": 1}},
        )
        assert resp.status == 200, await resp.text()
        return await resp.json()

    assert ids(await run("vector", 1)) == ["vec"]
    kw = await run("keyword", 1)
    assert ids(kw) == ["kw"] and kw["mode"] == "keyword"
    assert kw["results"][0]["similarity"] == pytest.approx(0.6, abs=1e-5)  # cosine from the stored vector
    # absolute: BM25 with fixed constants and the namespace's counts (each word in 1 episode), s/(s+20)
    expected = keyword_rel(q, "zebra migration rollback", {"zebra": 1, "migration": 1})
    assert kw["results"][0]["relevance"] == pytest.approx(expected, abs=1e-9)
    assert 0.3 < expected < 0.6  # not the 1.0 the best of a result set used to get
    hybrid = await run("hybrid", 2)
    # hybrid = (cos + keyword) / 2: kw (.6 + .43) / 2 beats vec (1 + 0) / 2
    assert ids(hybrid) == ["kw", "vec"] and "rrf_k" not in hybrid
    got = by_id(hybrid)
    assert got["kw"]["similarity"] == pytest.approx(0.6, abs=1e-5)  # the cosine, whatever the mode
    assert got["kw"]["relevance"] == pytest.approx((0.6 + expected) / 2, abs=1e-6)
    assert got["vec"]["relevance"] == pytest.approx(0.5, abs=1e-6)
    # an off-topic query sharing one word is weakly relevant, not 1.0
    one = await run("keyword", 1, query="zebra crossing etiquette")
    assert ids(one) == ["kw"]
    assert one["results"][0]["relevance"] == pytest.approx(
        keyword_rel(
            "zebra crossing etiquette",
            "zebra migration rollback",
            {"zebra": 1, "crossing": 0, "etiquette": 0},
        )
    )
    assert one["results"][0]["relevance"] < expected < 1.0


async def test_replay_context_and_response_shape(abc):
    body = await recall(abc, preset="normal")
    ctx = body["replay_context"]
    assert ctx["episodes"] == 3
    assert [s["strategy"] for s in ctx["strategies"]] == ["s-a", "s-b"]  # A first (most similar)
    assert ctx["success_rate"] == pytest.approx(1 / 3)
    assert ctx["avg_reward"] == pytest.approx((0.2 + 1.0 + 0.5) / 3)
    first = body["results"][0]
    assert set(first) >= {"episode", "similarity", "recency", "components", "priority"}
    assert set(first["components"]) == {"similarity", "recency", "reward", "outcome", "importance"}
    assert first["episode"]["completed_at"] == "2025-06-30T00:00:00Z"
    assert first["episode"]["task"] == {"description": "a task", "category": "debugging"}


async def test_touch_updates_access_statistics(abc, redis, prefix):
    first = await recall(abc, weights={"recency": 1}, top_k=1, touch=True)
    second = await recall(abc, weights={"recency": 1}, top_k=1, touch=True)
    resp = await abc.get("/v1/episodes/B")
    body = await resp.json()
    assert body["access_count"] == 2 and body["last_accessed"] is not None
    # each answer shows the counts after its own touch, as GET then reads them: 1, then 2
    assert [r["results"][0]["access_count"] for r in (first, second)] == [1, 2]
    assert second["results"][0]["last_accessed"] == body["last_accessed"]
    body = await recall(abc, weights={"recency": 1}, recency_from="last_access", as_of=T)
    # B was accessed "now" (after T): age clamps to 0, recency 1
    assert by_id(body)["B"]["recency"] == 1.0


async def test_importance_weight(make_client, redis, prefix):
    await put(redis, prefix, "default", episode("lo", importance=2))
    await put(redis, prefix, "default", episode("hi", importance=9))
    client = await make_client()
    body = await (
        await client.post("/v1/recall", json={"query": "a task", "weights": {"importance": 1}})
    ).json()
    assert ids(body) == ["hi", "lo"]
    assert by_id(body)["hi"]["priority"] == pytest.approx(0.9)


async def test_an_older_episode_never_ranks_higher(make_client, redis, prefix):
    """Case C20: of two episodes equal but for age, the older one never ranks higher."""
    v = unit(1.0, 1.0)
    await put(
        redis, prefix, "default", episode("newer", task="flaky migration", completed_at=T, reward=0.5), v
    )
    await put(
        redis,
        prefix,
        "default",
        episode("older", task="flaky migration", completed_at=T - DAY, reward=0.5),
        v,
    )
    client = await make_client(TableEmbedder(256, {Q: unit(1.0)}))
    for mode in ("vector", "keyword", "hybrid"):
        for preset in ("early", "normal", "late"):
            for normalize in ("none", "minmax"):
                body = await recall(client, preset=preset, normalize=normalize, mode=mode)
                assert ids(body) == ["newer", "older"], (mode, preset, normalize)
                assert body["results"][0]["priority"] >= body["results"][1]["priority"]


async def test_filters_are_prefilters_so_narrow_scope_still_fills_top_k(make_client, redis, prefix):
    q = "same text everywhere"
    for i in range(30):
        await put(redis, prefix, "default", episode(f"noise{i}", task=q, agent_id="noise"), unit(1.0))
    for i in range(3):
        await put(redis, prefix, "default", episode(f"mine{i}", task="other", agent_id="me"), unit(0.0, 1.0))
    client = await make_client(TableEmbedder(256, {q: unit(1.0)}))
    body = await (await client.post("/v1/recall", json={"query": q, "agent_id": "me", "top_k": 3})).json()
    assert sorted(ids(body)) == ["mine0", "mine1", "mine2"]


async def test_drafts_are_not_recallable(make_client, redis, prefix):
    await put(redis, prefix, "default", episode("draft"), status="draft")
    await put(redis, prefix, "default", episode("done"))
    client = await make_client()
    body = await (await client.post("/v1/recall", json={"query": "a task", "top_k": 5})).json()
    assert ids(body) == ["done"]


async def test_empty_scope_returns_empty_results(api):
    body = await (await api.post("/v1/recall", json={"query": "nothing stored"})).json()
    assert body["results"] == [] and body["replay_context"]["episodes"] == 0
    assert math.isclose(body["weights"]["similarity"], 0.95)


async def test_only_winners_are_loaded_and_a_vanished_one_is_skipped(redis, prefix):
    from services.query.recall import Candidate, load_episodes
    from services.query.store import EpisodeStore
    from shared.keys import Keys

    keys = Keys(prefix)
    for eid in ("x", "y", "z"):
        await put(redis, prefix, "default", episode(eid), unit(1.0))
    docs = [keys.episode_doc(1, "default", eid).encode() for eid in ("x", "y", "z")]
    await redis.delete(docs[1])  # forgotten between ranking and loading
    loaded = await load_episodes(EpisodeStore(redis, keys), [Candidate(key=k) for k in docs])
    assert [c.doc["episode_id"] for c in loaded] == ["x", "z"]


async def test_auto_preset_scope_sizes_are_remembered_briefly(redis, prefix, make_client):
    from services.query.recall.sizes import ScopeSizes
    from shared.index import Scope
    from shared.keys import Keys

    await make_client()  # creates the index
    index = Keys(prefix).episode_index_alias
    await put(redis, prefix, "default", episode("one"), unit(1.0))
    cached, fresh = ScopeSizes(ttl=60), ScopeSizes(ttl=0)
    scope = Scope(tags=BLAKE2B, namespace="default")
    assert await cached.size(redis, index, scope) == 1
    await put(redis, prefix, "default", episode("two"), unit(1.0))
    assert await cached.size(redis, index, scope) == 1  # within the ttl: no second count query
    assert await fresh.size(redis, index, scope) == 2


async def test_a_large_scope_keeps_its_count_longer(redis, prefix, make_client, monkeypatch):
    """`size_ttl`: a count is remembered in proportion to the scope beyond LARGE_SCOPE episodes (here
    made 1, so two episodes remember it twice the ttl)."""
    from services.query.recall import sizes
    from shared.index import Scope
    from shared.keys import Keys

    await make_client()
    index = Keys(prefix).episode_index_alias
    for i in range(2):
        await put(redis, prefix, "default", episode(f"big{i}"), unit(1.0))
    monkeypatch.setattr(sizes, "LARGE_SCOPE", 1)
    now = [1000.0]
    monkeypatch.setattr(sizes.time, "monotonic", lambda: now[0])
    cached, scope = sizes.ScopeSizes(ttl=5.0), Scope(tags=BLAKE2B, namespace="default")
    assert await cached.size(redis, index, scope) == 2
    await put(redis, prefix, "default", episode("big2"), unit(1.0))
    now[0] += 7.0  # past the ttl, within 2 x ttl
    assert await cached.size(redis, index, scope) == 2
    now[0] += 4.0  # past 2 x ttl
    assert await cached.size(redis, index, scope) == 3


async def test_idf_counts_are_remembered_for_the_ttl_and_then_dropped(redis, prefix, make_client):
    """ENGRAM_IDF_CACHE_TTL: within the ttl a word's count is the remembered one (no count query: the
    new episode is not seen); past it the entry is gone from memory and the word is counted again."""
    from services.query.recall.sizes import ScopeSizes
    from shared.index import Scope
    from shared.keys import Keys

    await make_client()
    index = Keys(prefix).episode_index_alias
    await put(redis, prefix, "default", episode("one", task="zebra crossing"), unit(1.0))
    now = [100.0]
    cached = ScopeSizes(df_ttl=30.0, clock=lambda: now[0])
    scope = Scope(tags=BLAKE2B, namespace="default")
    assert await cached.term_counts(redis, index, scope, ["zebra", "crossing"]) == [1, 1]
    await put(redis, prefix, "default", episode("two", task="zebra stripes"), unit(1.0))
    now[0] += 29.0
    assert await cached.term_counts(redis, index, scope, ["zebra", "stripes"]) == [1, 1]  # stripes is new
    assert await ScopeSizes().term_counts(redis, index, scope, ["zebra"]) == [2]  # df_ttl 0: fresh
    now[0] += 1.5  # zebra and crossing are 30.5 s old, stripes 1.5 s
    assert await cached.term_counts(redis, index, scope, ["stripes"]) == [1]
    assert {w for *_, w in cached._df} == {"stripes"}  # the expired words left memory
    assert await cached.term_counts(redis, index, scope, ["zebra", "zebra"]) == [2, 2]
    other = Scope(tags=BLAKE2B, namespace="other")
    assert await cached.term_counts(redis, index, other, ["zebra"]) == [0]  # per namespace


async def test_a_common_words_count_is_kept_longer_and_then_dropped(redis, prefix, make_client):
    """A word in more episodes than `COMMON_IDF` allows (~4,950; here the bar is lowered to 1 so two
    episodes make a word common) keeps its count COMMON_TTL_FACTOR x the ttl: counting it reads its
    whole posting list, and its weight is near zero. Other words expire at the ttl as before."""
    from services.query.recall import sizes
    from services.query.recall.relevance import common_count
    from shared.index import Scope
    from shared.keys import Keys

    assert 4_900 < common_count(sizes.COMMON_IDF) < 5_000
    await make_client()
    index = Keys(prefix).episode_index_alias
    await put(redis, prefix, "default", episode("one", task="yak crossing"), unit(1.0))
    await put(redis, prefix, "default", episode("two", task="yak stripes"), unit(1.0))
    now = [100.0]
    cached = sizes.ScopeSizes(df_ttl=30.0, clock=lambda: now[0])
    cached._common_n = 1  # in more than one episode: common
    scope = Scope(tags=BLAKE2B, namespace="default")
    assert await cached.term_counts(redis, index, scope, ["yak", "crossing"]) == [2, 1]
    await put(redis, prefix, "default", episode("three", task="yak crossing"), unit(1.0))
    now[0] += 31.0  # past the ttl: crossing is counted again, yak (common) is remembered
    assert await cached.term_counts(redis, index, scope, ["yak", "crossing"]) == [2, 2]
    now[0] += 30.0 * sizes.COMMON_TTL_FACTOR - 31.0 + 0.5  # yak's count is older than 10 ttl
    cached.expire()
    # yak's count left memory; crossing, counted again at 2 (common now), is kept from then on
    assert {w for *_, w in cached._common} == {"crossing"} and not cached._df
    assert await cached.term_counts(redis, index, scope, ["yak"]) == [3]


async def test_the_pool_is_deeper_than_top_k(make_client, redis, prefix):
    """ENGRAM_RECALL_CANDIDATES: an episode third in both lists beats the heads of either list at
    top_k 1; with lists 1 deep (the pool of the old `2 * top_k` was shallow too) it is never seen."""
    q = "zebra migration"
    await put(redis, prefix, "default", episode("vecbest", task="alpha beta"), unit(1.0))
    await put(redis, prefix, "default", episode("x1", task="gamma delta"), unit(0.95, 0.3122))
    await put(
        redis,
        prefix,
        "default",
        episode("both", task="zebra migration rollback plan for the cluster nodes"),
        unit(0.9, 0.4359),
    )
    for i in range(6):
        await put(
            redis,
            prefix,
            "default",
            episode(f"f{i}", task=f"lorem ipsum {i}"),
            unit(0.5 - 0.05 * i, 0.0, 1.0),
        )
    await put(
        redis,
        prefix,
        "default",
        episode("y1", task="zebra migration rollback plan"),
        unit(0.0, 0.0, 0.0, 1.0),
    )
    await put(redis, prefix, "default", episode("kwbest", task="zebra migration"), unit(-1.0))
    body = {"query": q, "mode": "hybrid", "top_k": 1, "weights": {"similarity": 1}}

    deep = await make_client(TableEmbedder(256, {q: unit(1.0)}))
    resp = await deep.post("/v1/recall", json=body)
    assert resp.status == 200, await resp.text()
    answer = await resp.json()
    assert ids(answer) == ["both"] and answer["candidates"] == 11  # every episode: 100 per list by default

    # With lists 1 deep the pool is the two lists' heads. RediSearch's BM25 scores of these documents vary
    # from one Redis process to the next (measured: 'kwbest' 3.63 or 4.99 for the same data), so which
    # document heads the keyword list is read from Redis rather than assumed (a flake before).
    from services.query.recall.arms import bm25_search
    from shared.index import Scope
    from shared.keys import Keys

    heads = {"vecbest"}  # cosine 1: the KNN head, whatever BM25 does
    keyword_head = await bm25_search(
        redis,
        Keys(prefix).episode_index_alias,
        Scope(namespace="default", tags=BLAKE2B),
        q,
        1,
        return_fields=("doc",),
    )
    heads |= {json.loads(h.fields[b"doc"])["episode_id"] for h in keyword_head}
    shallow = await make_client(TableEmbedder(256, {q: unit(1.0)}), recall_candidates=1)
    resp = await shallow.post("/v1/recall", json=body)
    answer = await resp.json()
    assert answer["candidates"] == len(heads) and ids(answer)[0] in heads
    resp = await shallow.post("/v1/recall", json={**body, "candidates": 3})  # per request
    assert ids(await resp.json()) == ["both"]


async def test_a_repeated_query_is_embedded_once(make_client, redis, prefix):
    await put(redis, prefix, "default", episode("e1", task="rotate the api keys"))
    embedder = TableEmbedder(256)
    client = await make_client(embedder)
    for _ in range(3):
        resp = await client.post("/v1/recall", json={"query": "rotate keys", "top_k": 1})
        assert resp.status == 200 and ids(await resp.json()) == ["e1"]
    resp = await client.post("/v1/context", json={"task": "rotate keys"})
    assert resp.status == 200
    assert embedder.calls == 1


async def test_hybrid_without_keyword_hits_ranks_by_cosine_not_by_rank(make_client, redis, prefix):
    """With no keyword match, hybrid relevance is half the cosine (absolute, no rank flattening: a
    cosine of 0.54 vs 0.07 once became relevance 0.50 vs 0.43, where a reward outweighed it)."""
    q = "check that an e-mail string is well formed"
    await put(
        redis,
        prefix,
        "default",
        episode("regex", task="validate addresses with a pattern", reward=0.0),
        unit(0.54, 0.8417),
    )
    await put(
        redis, prefix, "default", episode("login", task="flaky sign-in suite", reward=1.0), unit(0.07, 0.9975)
    )
    client = await make_client(TableEmbedder(256, {q: unit(1.0)}))
    resp = await client.post("/v1/recall", json={"query": q, "top_k": 2, "preset": "early"})
    body = await resp.json()
    assert resp.status == 200 and body["mode"] == "hybrid"
    assert ids(body) == ["regex", "login"]
    assert by_id(body)["regex"]["relevance"] == pytest.approx(0.27, abs=1e-4)
    assert by_id(body)["login"]["relevance"] == pytest.approx(0.035, abs=1e-4)
    # a query of stop words only has no keyword arm: hybrid is the cosine
    only_stop = await (
        await client.post(
            "/v1/recall",
            json={"query": "is it the", "top_k": 2, "mode": "hybrid", "weights": {"similarity": 1}},
        )
    ).json()
    assert only_stop["results"][0]["relevance"] == pytest.approx(
        only_stop["results"][0]["similarity"], abs=1e-6
    )


async def test_replay_context_describes_a_strategy_that_stopped_working_by_its_newest_regime(
    make_client, redis, prefix
):
    """X succeeded five times, then failed five times a week later while Y succeeded: the recall's
    replay context must not average X to 50% (the rule facts and /v1/strategy follow too)."""
    week = 7 * DAY
    for i in range(5):
        await put(
            redis,
            prefix,
            "default",
            episode(
                f"x-old-{i}", completed_at=T - 2 * week + i, reward=1.0, outcome="success", strategy_used="X"
            ),
            unit(1.0),
        )
        await put(
            redis,
            prefix,
            "default",
            episode(
                f"x-new-{i}", completed_at=T - week + i, reward=0.0, outcome="failure", strategy_used="X"
            ),
            unit(1.0),
        )
        await put(
            redis,
            prefix,
            "default",
            episode(
                f"y-{i}", completed_at=T - week + 60 + i, reward=1.0, outcome="success", strategy_used="Y"
            ),
            unit(0.9, 0.1),
        )
    client = await make_client(TableEmbedder(256, {Q: unit(1.0)}))
    body = await recall(client, top_k=15)
    strategies = {s["strategy"]: s for s in body["replay_context"]["strategies"]}
    x, y = strategies["X"], strategies["Y"]
    assert (x["episodes"], x["success_rate"], x["earlier_episodes"], x["earlier_success_rate"]) == (
        5,
        0.0,
        5,
        1.0,
    )
    assert x["changed_at"] == "2025-06-24T00:00:00Z"
    assert (y["episodes"], y["success_rate"], y["changed_at"]) == (5, 1.0, None)
    assert body["replay_context"]["episodes"] == 15


async def test_common_terms_leave_the_bm25_query_but_not_the_scores(make_client, redis, prefix):
    """ENGRAM_BM25_COMMON_IDF: a word in more episodes than the threshold allows is not searched by (the
    episodes matching only it are not candidates), yet every candidate's relevance is the exact one;
    a query of common words only is searched whole. The threshold is raised here so that 5 episodes
    make a word common (the real one needs ~4,950)."""
    from services.query.recall import relevance

    q = "zebra migration"
    await put(redis, prefix, "default", episode("rare", task="zebra migration plan"), unit(1.0))
    for i in range(4):
        await put(redis, prefix, "default", episode(f"m{i}", task=f"migration step {i}"), unit(0.8, 0.6))
    embedder = TableEmbedder(256, {q: unit(1.0), "migration": unit(1.0)})
    exact_client = await make_client(embedder)
    bounded_client = await make_client(embedder, bm25_common_idf=relevance.idf(5) * 1.01)  # migration: 5

    async def run(client, query):
        body = {"query": query, "mode": "keyword", "top_k": 5, "weights": {"similarity": 1}}
        resp = await client.post("/v1/recall", json=body)
        assert resp.status == 200, await resp.text()
        return await resp.json()

    exact = await run(exact_client, q)
    assert exact["candidates"] == 5
    dropped = await run(bounded_client, q)
    assert dropped["candidates"] == 1 and ids(dropped) == ["rare"]
    assert dropped["results"][0]["relevance"] == exact["results"][0]["relevance"]
    assert (await run(bounded_client, "migration"))["candidates"] == 5  # every term common: the full query


async def test_bounded_bm25_arm_keeps_the_rare_word_episode_a_common_word_flood_pushes_out(
    make_client, redis, prefix
):
    """RediSearch ranks the BM25 arm's `candidates` deep list by its own BM25, where short
    episodes repeating a common query word outrank a long one holding the rare word once; past the
    list's depth the rare-word episode is no candidate at all. With the common word left out of the
    candidate query (ENGRAM_BM25_COMMON_IDF) it is found, with the relevance an exact pool gives it
    (absolute per query and episode). 20 episodes hold the common word here (threshold idf(20)), 180
    hold neither word."""
    from services.query.recall import relevance

    q = "zebra migration"
    filler = " ".join(f"word{i}" for i in range(200))
    await put(redis, prefix, "default", episode("rare", task=f"zebra {filler}"), unit(1.0))
    for i in range(20):
        await put(
            redis, prefix, "default", episode(f"m{i}", task="migration migration migration"), unit(0.8, 0.6)
        )
    for i in range(180):
        await put(redis, prefix, "default", episode(f"o{i}", task=f"other topic {i}"), unit(0.0, 1.0))
    embedder = TableEmbedder(256, {q: unit(1.0)})
    exact_client = await make_client(embedder)
    bounded_client = await make_client(embedder, bm25_common_idf=relevance.idf(20) * 1.01)

    async def run(client, candidates):
        body = {
            "query": q,
            "mode": "keyword",
            "top_k": 5,
            "candidates": candidates,
            "weights": {"similarity": 1},
        }
        resp = await client.post("/v1/recall", json=body)
        assert resp.status == 200, await resp.text()
        return await resp.json()

    exact = await run(exact_client, 5)
    assert "rare" not in ids(exact)  # pushed out of the arm's 5 by the flood
    bounded = await run(bounded_client, 5)
    assert ids(bounded)[0] == "rare"
    body = {"query": q, "mode": "keyword", "top_k": 100, "candidates": 100, "weights": {"similarity": 1}}
    whole = await (await exact_client.post("/v1/recall", json=body)).json()  # every match a candidate
    of = {x["episode"]["episode_id"]: x["relevance"] for x in whole["results"]}
    assert bounded["results"][0]["relevance"] == of["rare"] > 0


async def test_common_idf_changes_nothing_below_its_namespace_size(make_client, redis, prefix):
    """A word's idf is below 0.02 only when more than ~4,950 of the namespace's episodes hold it, so in
    a smaller namespace ENGRAM_BM25_COMMON_IDF 0.02 leaves every recall bit-identical, even for a word
    every episode holds (a rule by share of the namespace would drop it here)."""
    for i in range(60):
        task = f"deploy the service {'zebra ' if i % 7 == 0 else ''}step {i}"
        await put(redis, prefix, "default", episode(f"e{i}", task=task, reward=i / 60), unit(1.0, i / 60))
    embedder = TableEmbedder(256, {})
    exact_client = await make_client(embedder)
    bounded_client = await make_client(embedder, bm25_common_idf=0.02)
    for body in (
        {"query": "deploy zebra service", "top_k": 10, "candidates": 10},
        {"query": "deploy zebra service", "mode": "keyword", "top_k": 10, "candidates": 10},
        {"query": "deploy", "top_k": 20},
    ):
        a = await (await exact_client.post("/v1/recall", json=body)).json()
        b = await (await bounded_client.post("/v1/recall", json=body)).json()
        assert a["candidates"] == b["candidates"]
        assert [(x["episode"]["episode_id"], x["priority"], x["relevance"]) for x in a["results"]] == [
            (x["episode"]["episode_id"], x["priority"], x["relevance"]) for x in b["results"]
        ]


def test_without_terms_drops_every_word_of_a_stem():
    from services.query.recall.relevance import common_terms, without_terms

    assert without_terms("Groups of the group, zebra GROUP", {"group"}) == "zebra"
    assert without_terms("zebra", set()) == "zebra"
    assert common_terms({"a": 0.0001, "b": 0.5}, 0.0) == set()  # off: none
    assert common_terms({"a": 0.01, "b": 0.5, "c": 0.019999}, 0.02) == {"a", "c"}


async def test_the_query_service_forgets_episode_words_it_no_longer_uses(
    make_client, redis, prefix, monkeypatch
):
    """The service's memos of pool members' words (`services.query.recall.terms`) and of idf counts expire on a timer,
    traffic or not: an idle process does not keep a forgotten episode's words (docs/reliability.md)."""
    from services.query.appkeys import SCOPE_SIZES, TERMS
    from services.query.recall import terms

    now = [1_000.0]
    clock = lambda: now[0]  # noqa: E731
    await put(redis, prefix, "default", episode("z1", task="calibrate the zanzibarian quokka counter"))
    client = await make_client(TableEmbedder(256, {}), idf_cache_ttl=30.0)
    memos = client.server.app[TERMS]
    for memo in (memos.terms, memos.stems):
        monkeypatch.setattr(memo, "clock", clock)
        monkeypatch.setattr(memo, "born", now[0])
    sizes = client.server.app[SCOPE_SIZES]
    monkeypatch.setattr(sizes, "_clock", clock)
    resp = await client.post("/v1/recall", json={"query": "quokka counter", "top_k": 5})
    assert resp.status == 200 and ids(await resp.json()) == ["z1"]

    def remembered() -> bool:
        texts = [k for memo in (memos.terms, memos.terms.old) for k in memo]
        stems = {*memos.stems, *memos.stems.old}
        words = [k[2] for k in sizes._df]
        return (
            any(b"zanzibarian" in (t or b"") for k in texts for t in k)
            or b"zanzibarian" in stems
            or ("quokka" in words)
        )

    assert remembered()
    now[0] += terms.TERMS_TTL + 2 * 30.0  # past every TTL, while no request comes
    await wait_until(lambda: not remembered(), message="the memos expire with no traffic")
