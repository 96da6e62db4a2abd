"""Properties of POST /v1/recall and the recall part of POST /v1/context, against the real service and
RediSearch, on documents seeded as the consolidator writes them (`put`).

- Prefix stability: for any K >= k, the first k results of a `top_k` K recall are the `top_k` k recall
  with the same other inputs (the pool never depends on `top_k`).
- Absolute relevance: storing unrelated episodes changes no existing episode's relevance or priority
  for a query, in every mode.
- `min_relevance` / `min_priority` only drop results below them.
- Time-aware candidates: all weight on recency (importance, reward) returns the exact order of the
  whole scope, even when the similarity lists hold none of those episodes.
"""

from __future__ import annotations

import itertools
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.query.recall import lists, pool
from shared.keys import Keys
from shared.tags import BLAKE2B
from tests.integration.test_query_support import DAY, episode, ids, put

pytest_plugins = ["tests.integration.test_query_support"]  # fixtures: make_client, redis, prefix

WORDS = ("login", "flaky", "migration", "database", "timeout", "cache", "deploy", "retry", "schema", "token")
OTHER = ("banana", "violin", "glacier", "saffron", "tundra", "walrus", "quartz", "meadow")
FLOORS = lists.Floors()
NOW = 1_760_000_000.0
KEYS = {f"prop-key-{i:04d}-0123456789": f"prop{i}" for i in range(400)}
_counter = itertools.count()
DEPTH = 6  # ENGRAM_RECALL_CANDIDATES of these tests: smaller than the scopes, so the pool is a choice

texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=5).map(" ".join)
episodes_st = st.lists(
    st.fixed_dictionaries(
        {
            "task": texts,
            "age_h": st.integers(0, 24 * 14),
            "reward": st.none() | st.floats(0, 1, allow_nan=False).map(lambda x: round(x, 3)),
            "outcome": st.sampled_from(("success", "partial", "failure")),
            "importance": st.none() | st.integers(1, 10),
        }
    ),
    min_size=1,
    max_size=14,
)
weights_st = st.one_of(
    st.just(None),
    st.sampled_from(("early", "normal", "late")).map(lambda p: {"preset": p}),
    st.fixed_dictionaries(
        {},
        optional={
            "similarity": st.sampled_from((0.0, 0.5, 1.0)),
            "recency": st.sampled_from((0.0, 0.3, 1.0)),
            "reward": st.sampled_from((0.0, 0.2, 1.0)),
            "outcome": st.sampled_from((0.0, 0.1)),
            "importance": st.sampled_from((0.0, 0.5)),
        },
    )
    .filter(lambda w: any(w.values()))
    .map(lambda w: {"weights": w}),
)
modes = st.sampled_from(("vector", "keyword", "hybrid"))


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def fresh_tenant() -> tuple[str, str]:
    key = list(KEYS)[next(_counter) % len(KEYS)]
    return key, KEYS[key]


async def seed(redis, prefix, namespace, items, *, base: float = NOW, tag: str = "e") -> list[str]:
    out = []
    for i, it in enumerate(items):
        extra = {"importance": it["importance"]} if it.get("importance") is not None else {}
        out.append(
            await put(
                redis,
                prefix,
                namespace,
                episode(
                    f"{tag}{i}",
                    task=it["task"],
                    completed_at=base - 3600.0 * it["age_h"],
                    reward=it.get("reward"),
                    outcome=it["outcome"],
                    **extra,
                ),
            )
        )
    return out


@pytest.fixture
async def client(make_client):
    return await make_client(api_keys=KEYS, recall_candidates=DEPTH)


async def post(client, path, key, **body):
    resp = await client.post(path, json=body, headers=auth(key))
    assert resp.status == 200, await resp.text()
    return await resp.json()


def summary(body):
    return [
        (r["episode"]["episode_id"], round(r["priority"], 12), round(r["relevance"], 12))
        for r in body["results"]
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=episodes_st, query=texts, mode=modes, choice=weights_st, data=st.data())
async def test_recall_is_prefix_stable_in_top_k(client, redis, prefix, items, query, mode, choice, data):
    key, ns = fresh_tenant()
    await seed(redis, prefix, ns, items)
    big = data.draw(st.integers(1, DEPTH), label="K")
    small = data.draw(st.integers(1, big), label="k")
    body = {"query": query, "mode": mode, "as_of": NOW, **(choice or {})}
    full = await post(client, "/v1/recall", key, top_k=big, **body)
    head = await post(client, "/v1/recall", key, top_k=small, **body)
    assert summary(full)[:small] == summary(head)
    # an explicit pool as deep as the scope extends the same ranking up to top_k 100
    deep = await post(client, "/v1/recall", key, top_k=100, candidates=100, **body)
    assert summary(deep)[:small] == summary(
        await post(client, "/v1/recall", key, top_k=small, candidates=100, **body)
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=episodes_st, query=texts, data=st.data())
async def test_context_recall_is_prefix_stable_in_top_k(client, redis, prefix, items, query, data):
    key, ns = fresh_tenant()
    await seed(redis, prefix, ns, items, base=time.time())
    big = data.draw(st.integers(1, DEPTH), label="K")
    small = data.draw(st.integers(1, big), label="k")
    full = await post(client, "/v1/context", key, task=query, top_k=big)
    head = await post(client, "/v1/context", key, task=query, top_k=small)
    assert [r["episode"]["episode_id"] for r in full["results"]][:small] == [
        r["episode"]["episode_id"] for r in head["results"]
    ]


VOCAB = WORDS + OTHER + ("worker", "stream", "lock", "parse", "queue", "crash", "build", "auth", "leak")


@pytest.mark.timeout(180)
async def test_recall_is_prefix_stable_in_top_k_when_the_graph_misses_neighbours(make_client, redis, prefix):
    """HNSW is approximate: a graph this sparse (M 2, EF_RUNTIME 1, five hits per arm) misses episodes
    closer than its last hit, so the bound on an outsider's priority does not hold. The first k of a
    top_k 5 recall (recency / reward / importance lists fetched) must still be the top_k k recall (which
    may skip them): both rank the similarity lists' bounded head first."""
    key = "hnsw-prefix-key-0123456789"
    client = await make_client(
        api_keys={key: "graph"},
        vector_algorithm="HNSW",
        hnsw_m=2,
        hnsw_ef_construction=4,
        hnsw_ef_runtime=1,
        recall_candidates=5,
    )
    rnd = random.Random(5)
    for i in range(2000):
        doc = episode(
            f"g{i}",
            task=" ".join(rnd.sample(VOCAB, rnd.randint(3, 7))),
            completed_at=NOW - rnd.uniform(0, 90 * DAY),
            reward=rnd.choice([None, 0.0, 0.5, 1.0]),
            outcome=rnd.choice(["success", "failure", "partial"]),
            **({"importance": rnd.choice([2, 5, 8])} if rnd.random() < 0.7 else {}),
        )
        await put(redis, prefix, "graph", doc)
    missed = 0
    for _ in range(40):
        query = " ".join(rnd.sample(VOCAB, rnd.randint(1, 4)))
        only = {"query": query, "mode": "vector", "as_of": NOW, "weights": {"similarity": 1.0}}
        shallow = ids(await post(client, "/v1/recall", key, top_k=5, **only))
        missed += shallow != ids(await post(client, "/v1/recall", key, top_k=100, candidates=100, **only))[:5]
        for mode in ("vector", "hybrid"):
            body = {"query": query, "mode": mode, "as_of": NOW}
            full = summary(await post(client, "/v1/recall", key, top_k=5, **body))
            for k in (1, 2, 3):
                assert full[:k] == summary(await post(client, "/v1/recall", key, top_k=k, **body)), (mode, k)
    assert missed, "the graph found every nearest neighbour: this test shows nothing"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    items=episodes_st,
    unrelated=episodes_st,
    query=texts,
    mode=modes,
    choice=weights_st.filter(lambda c: c is not None),
)
async def test_unrelated_episodes_change_no_relevance_or_priority(
    client, redis, prefix, items, unrelated, query, mode, choice
):
    """`auto` is left out: it picks its preset by the scope's size, which adding episodes changes."""
    key, ns = fresh_tenant()
    await seed(redis, prefix, ns, items)
    body = {"query": query, "mode": mode, "as_of": NOW, "top_k": 100, "candidates": 100, **choice}
    before = {
        r["episode"]["episode_id"]: r for r in (await post(client, "/v1/recall", key, **body))["results"]
    }
    off_topic = [
        {**u, "task": " ".join(OTHER[(len(u["task"]) + j) % len(OTHER)] for j in range(3))} for u in unrelated
    ]
    await seed(redis, prefix, ns, off_topic, tag="u")
    # and another tenant's episodes on the very same words
    other_key, other_ns = fresh_tenant()
    await seed(redis, prefix, other_ns, items + items)
    after = {
        r["episode"]["episode_id"]: r for r in (await post(client, "/v1/recall", key, **body))["results"]
    }
    for eid, r in before.items():
        assert eid in after
        assert after[eid]["relevance"] == pytest.approx(r["relevance"], abs=1e-9), eid
        assert after[eid]["priority"] == pytest.approx(r["priority"], abs=1e-9), eid
        assert after[eid]["components"] == pytest.approx(r["components"], abs=1e-9), eid


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    items=episodes_st,
    query=texts,
    mode=modes,
    choice=weights_st,
    floor=st.tuples(st.sampled_from((0.0, 0.1, 0.3, 0.6)), st.sampled_from((0.0, 0.2, 0.5, 0.8))),
)
async def test_min_relevance_and_min_priority_only_drop_results_below_them(
    client, redis, prefix, items, query, mode, choice, floor
):
    key, ns = fresh_tenant()
    await seed(redis, prefix, ns, items)
    body = {"query": query, "mode": mode, "as_of": NOW, "top_k": 100, "candidates": 100, **(choice or {})}
    every = (await post(client, "/v1/recall", key, **body))["results"]
    kept = await post(client, "/v1/recall", key, min_relevance=floor[0], min_priority=floor[1], **body)
    expected = [
        r["episode"]["episode_id"] for r in every if r["relevance"] >= floor[0] and r["priority"] >= floor[1]
    ]
    assert ids(kept) == expected
    assert kept["min_relevance"] == floor[0] and kept["min_priority"] == floor[1]


@pytest.mark.parametrize("signal", ["recency", "importance", "reward"])
async def test_all_weight_on_one_signal_orders_the_whole_scope(client, redis, prefix, signal):
    """Twelve episodes, the pool holds 6 per list. The most similar ones are the oldest,
    least important and least rewarded; the similarity lists alone would miss the right answer."""
    key, ns = fresh_tenant()
    query = "flaky login migration"
    for i in range(12):
        # i = 0 matches the query best and is the oldest, least important, least rewarded
        words = " ".join(WORDS[:3]) if i < 6 else "schema token"
        await put(
            redis,
            prefix,
            ns,
            episode(
                f"e{i}",
                task=words + f" case {i}",
                completed_at=NOW - (12 - i) * 5 * 3600,
                reward=i / 11,
                importance=1 + (i * 9) // 11,
            ),
        )
    for mode in ("vector", "keyword", "hybrid"):
        body = await post(
            client, "/v1/recall", key, query=query, mode=mode, as_of=NOW, top_k=3, weights={signal: 1}
        )
        assert ids(body) == ["e11", "e10", "e9"], (mode, ids(body))
    if signal == "recency":
        # 17 h vs 5 h old: the newest one is returned at top_k 1
        body = await post(
            client, "/v1/recall", key, query=query, mode="hybrid", as_of=NOW, top_k=1, weights={"recency": 1}
        )
        assert ids(body) == ["e11"] and body["results"][0]["age_s"] == pytest.approx(5 * 3600)


async def test_recency_from_last_access_orders_by_the_last_recall(client, redis, prefix):
    key, ns = fresh_tenant()
    for i in range(10):
        await put(
            redis,
            prefix,
            ns,
            episode(
                f"e{i}",
                task=f"deploy cache case {i}" if i < 7 else "walrus",
                completed_at=NOW - DAY - i * 3600,
            ),
        )
    touched = await post(
        client,
        "/v1/recall",
        key,
        query="walrus",
        mode="keyword",
        top_k=1,
        touch=True,
        weights={"similarity": 1},
    )
    assert ids(touched) == ["e7"]  # the newest of the three equally relevant ones
    body = await post(
        client,
        "/v1/recall",
        key,
        query="deploy cache",
        mode="hybrid",
        top_k=2,
        weights={"recency": 1},
        recency_from="last_access",
    )
    # accessed just now: the most recent by last access (the arm sorted by last_accessed)
    assert ids(body) == ["e7", "e0"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ages=st.lists(st.integers(0, 30), min_size=1, max_size=20),
    rewards=st.lists(st.none() | st.sampled_from((0.0, 0.25, 0.5, 1.0)), min_size=20, max_size=20),
    forget=st.sets(st.integers(0, 19), max_size=5),
    later=st.lists(st.integers(0, 30), max_size=4),
    hint_at=st.none() | st.integers(0, 19),
)
async def test_sorted_lists_with_a_remembered_floor_equal_a_full_sort(
    client, redis, prefix, ages, rewards, forget, later, hint_at
):
    """top_by narrows the recency / reward lists to episodes above the last (depth + 1)-th of the order
    (value, then tie-break): the answer is exactly that order over the scope's episodes that have the
    value, including ties at the boundary (rewards of four values), forgets and new episodes since;
    the first call narrows from a hint (one episode's value, as a recall's pool gives) when drawn."""
    from shared.index import Scope, filter_search
    from shared.keys import Keys

    key, ns = fresh_tenant()
    index, scope = Keys(prefix).episode_index_alias, Scope(tags=BLAKE2B, namespace=ns)

    async def put_at(eid, age, reward):
        await put(
            redis,
            prefix,
            ns,
            episode(eid, task="cache deploy", completed_at=NOW - 3600.0 * age, reward=reward),
        )

    for i, age in enumerate(ages):
        await put_at(f"e{i}", age, rewards[i])

    hints = {"completed_at": None, "reward": None}
    if hint_at is not None and hint_at < len(ages):
        hints = {"completed_at": NOW - 3600.0 * ages[hint_at], "reward": rewards[hint_at]}

    async def check():
        for name in ("completed_at", "reward"):
            got = [
                h.key
                for h in await FLOORS.top_by(
                    redis, index, scope, name, DEPTH, pool.LIGHT_SIGNAL_FIELDS, hint=hints[name]
                )
            ]
            _, full = await filter_search(redis, index, scope, return_fields=(name, "tiebreak"), limit=1000)
            field = name.encode()
            rows = [
                (float(h.fields[field]), int(h.fields[b"tiebreak"]), h.key) for h in full if field in h.fields
            ]
            assert got == [k for *_, k in sorted(rows, reverse=True)[:DEPTH]]  # no reward: in no list

    await check()
    await check()  # now from the remembered floor
    for i in forget:
        if i < len(ages):
            await redis.delete(Keys(prefix).episode_doc(1, ns, f"e{i}"))
    for j, age in enumerate(later):
        await put_at(f"n{j}", age, 1.0)
    await check()


async def test_a_remembered_floor_narrows_values_the_index_returns_rounded(
    client, redis, prefix, monkeypatch
):
    """A SORTABLE value comes back with 12 significant digits: a reward of 0.5010000000006 as
    0.501000000001, above the stored value. The floor must still narrow (from the second call on, one
    sorted query per list, not a narrowed one that misses the floor's episode and then a full sort)
    and give the full sort's answer."""
    from shared.index import Scope, filter_search

    key, ns = fresh_tenant()
    index, scope = Keys(prefix).episode_index_alias, Scope(tags=BLAKE2B, namespace=ns)
    for i in range(3 * DEPTH):
        await put(
            redis,
            prefix,
            ns,
            episode(
                f"r{i}", task="cache deploy", completed_at=NOW - 3600.0 * i, reward=0.5 + i / 1000 + 6e-13
            ),
        )
    _, full = await filter_search(
        redis, index, scope, return_fields=("reward",), sort_by="reward", limit=DEPTH
    )
    queries = []

    async def counted(*args, **kwargs):
        queries.append(kwargs.get("sort_by"))
        return await filter_search(*args, **kwargs)

    monkeypatch.setattr(lists, "filter_search", counted)  # the real query, counted
    first = [
        h.key for h in await FLOORS.top_by(redis, index, scope, "reward", DEPTH, pool.LIGHT_SIGNAL_FIELDS)
    ]
    queries.clear()
    again = [
        h.key for h in await FLOORS.top_by(redis, index, scope, "reward", DEPTH, pool.LIGHT_SIGNAL_FIELDS)
    ]
    assert first == again == [h.key for h in full]
    assert queries == ["reward"]  # the narrowed query alone answered


async def test_remembered_lists_are_the_sorted_lists_with_redis_cosines(client, redis, prefix):
    """`remembered_lists` (one KNN over the narrowed scopes) gives `top_by`'s lists, each hit with the
    distance a KNN restricted to it gives; it declines (None) when no floor is remembered, and when the
    union holds an episode without a vector, which a KNN cannot return."""
    from engram_episodic.validation import parse_episode
    from services.query.recall.arms import knn_search
    from shared.embedding import HashingEmbedder
    from shared.index import Scope, episode_fields

    key, ns = fresh_tenant()
    index, scope = Keys(prefix).episode_index_alias, Scope(tags=BLAKE2B, namespace=ns)
    for i in range(4 * DEPTH):  # distinct times and rewards: each list is one order
        await put(
            redis,
            prefix,
            ns,
            episode(
                f"u{i}",
                task=f"{WORDS[i % len(WORDS)]} deploy",
                completed_at=NOW - 3600.0 * i,
                reward=(i * 7 % 24) / 23,
            ),
        )
    names = ["completed_at", "reward"]
    query = HashingEmbedder(256).embed_sync(["cache deploy"])[0]
    assert (
        await FLOORS.remembered_lists(redis, index, scope, query, names, DEPTH, pool.LIGHT_SIGNAL_FIELDS)
        is None
    )
    want = [await FLOORS.top_by(redis, index, scope, name, DEPTH, pool.LIGHT_SIGNAL_FIELDS) for name in names]
    got = await FLOORS.remembered_lists(redis, index, scope, query, names, DEPTH, pool.LIGHT_SIGNAL_FIELDS)
    assert got is not None
    assert [[h.key for h in g] for g in got] == [[h.key for h in w] for w in want]
    assert [[h.fields[b"reward"] for h in g] for g in got] == [[h.fields[b"reward"] for h in w] for w in want]
    keys = list({h.key for g in got for h in g})
    restricted = await knn_search(redis, index, scope, query, len(keys), return_fields=(), in_keys=keys)
    assert {h.key: h.score for g in got for h in g} == {h.key: h.score for h in restricted}

    ep = parse_episode(episode("novector", task="cache deploy", completed_at=NOW + 60.0))
    await redis.hset(
        Keys(prefix).episode_doc(1, ns, ep.episode_id),
        mapping=episode_fields(ns, ep, status="completed", vector=None, tags=BLAKE2B),
    )
    assert (
        await FLOORS.remembered_lists(redis, index, scope, query, names, DEPTH, pool.LIGHT_SIGNAL_FIELDS)
        is None
    )
    newest = await FLOORS.top_by(redis, index, scope, "completed_at", DEPTH, pool.LIGHT_SIGNAL_FIELDS)
    assert newest[0].key == Keys(prefix).episode_doc(1, ns, "novector").encode()


async def test_keyword_relevance_sees_the_words_the_index_holds(client, redis, prefix):
    """Case folding and CJK bigrams as at index time (fold_for_search): a match BM25 finds has keyword
    relevance > 0, and the same words in another case or script run weigh the same."""
    key, ns = fresh_tenant()
    await put(redis, prefix, ns, episode("ja", task="東京タワーの修理"))
    await put(redis, prefix, ns, episode("de", task="Über die Straße"))
    await put(redis, prefix, ns, episode("x", task="nothing in common"))
    ja = await post(
        client, "/v1/recall", key, query="東京の修理", mode="keyword", top_k=3, weights={"similarity": 1}
    )
    assert ids(ja)[0] == "ja" and ja["results"][0]["relevance"] > 0.2
    de = await post(
        client, "/v1/recall", key, query="ÜBER STRASSE", mode="keyword", top_k=3, weights={"similarity": 1}
    )
    assert ids(de)[0] == "de" and de["results"][0]["relevance"] > 0.2


async def test_exact_ties_come_back_in_one_order_whatever_the_query(client, redis, prefix):
    """Episodes of equal priority and age (completion times 3 ms apart, equal in the 12 significant
    digits the index returns) come back in the lists' own tie-break order whatever the query, not in
    the order of the candidates the query's similarity lists brought (two queries
    gave two orders with all-recency weights)."""
    key, ns = fresh_tenant()
    t = NOW - DAY + 0.331
    for i in range(8):
        task = f"tied {WORDS[i % len(WORDS)]} task {i}"
        await put(redis, prefix, ns, episode(f"tie{i}", task=task, completed_at=t + 0.003 * (i % 2)))
    orders = set()
    for q in ("tied task 1", "tied task 6", f"{WORDS[3]} {WORDS[5]}", "unrelated words entirely"):
        for mode in ("hybrid", "vector", "keyword"):
            body = await post(client, "/v1/recall", key, query=q, top_k=8, mode=mode, weights={"recency": 1})
            orders.add(tuple(ids(body)))
    assert len(orders) == 1 and len(next(iter(orders))) == 8, orders
