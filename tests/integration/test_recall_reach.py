"""The extra lists' members that cannot reach a recall's answer are dropped before their keyword
relevance is computed (`services.query.recall._reach`, `services.query.pool.extra_candidates`), and
the answer is the one without the drop: every result, score, component and the `candidates` count,
against the real service and RediSearch.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.query import recall as rc
from tests.integration.test_query_support import episode, put
from tests.integration.test_recall_properties import (
    DEPTH,
    NOW,
    OTHER,
    WORDS,
    auth,
    episodes_st,
    fresh_tenant,
    modes,
    seed,
    texts,
    weights_st,
)

pytest_plugins = ["tests.integration.test_query_support"]  # fixtures: make_client, redis, prefix


@pytest.fixture
async def client(make_client):
    from tests.integration.test_recall_properties import KEYS

    return await make_client(api_keys=KEYS, recall_candidates=DEPTH)


@contextlib.contextmanager
def counting_drops():
    """The number of extra-list members each recall dropped (appended per extra_candidates call)."""
    drops: list[int] = []
    real = rc.extra_candidates

    async def spy(*args, **kwargs):
        kept, dropped = await real(*args, **kwargs)
        drops.append(dropped)
        return kept, dropped

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rc, "extra_candidates", spy)
        yield drops


async def both(client, key: str, body: dict) -> tuple[dict, dict]:
    """The recall's response as served, and as served with nothing dropped (`_reach` off)."""
    resp = await client.post("/v1/recall", json=body, headers=auth(key))
    assert resp.status == 200, await resp.text()
    served = await resp.json()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rc, "_reach", lambda *args, **kwargs: None)
        resp = await client.post("/v1/recall", json=body, headers=auth(key))
        assert resp.status == 200, await resp.text()
        whole = await resp.json()
    return served, whole


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    items=episodes_st,
    query=texts,
    mode=modes,
    choice=weights_st,
    top_k=st.integers(1, DEPTH),
    floors=st.sampled_from(((0.0, 0.0), (0.3, 0.0), (0.0, 0.4), (0.2, 0.3))),
)
async def test_dropping_what_cannot_rank_changes_no_answer(
    client, redis, prefix, items, query, mode, choice, top_k, floors
):
    key, ns = fresh_tenant()
    await seed(redis, prefix, ns, items)
    min_relevance, min_priority = floors
    body = {
        "query": query,
        "mode": mode,
        "as_of": NOW,
        "top_k": top_k,
        "min_relevance": min_relevance,
        "min_priority": min_priority,
        **(choice or {}),
    }
    served, whole = await both(client, key, body)
    assert served == whole


async def test_old_matches_and_new_strangers_drop_the_strangers(client, redis, prefix):
    """Ten old episodes with the query's words, thirty newer ones with none of them: the recency list
    is all strangers, which a small recency weight cannot lift past the matches, so most are dropped,
    and the answer (the matches) is the same."""
    key, ns = fresh_tenant()
    for i in range(10):
        await put(
            redis,
            prefix,
            ns,
            episode(f"m{i}", task=f"{WORDS[i]} deploy cache", completed_at=NOW - 86400.0 * 30),
        )
    for i in range(30):
        task = f"{OTHER[i % len(OTHER)]} {OTHER[(i + 3) % len(OTHER)]}"
        await put(redis, prefix, ns, episode(f"s{i}", task=task, completed_at=NOW - 60.0 * i, reward=0.5))
    body = {"query": "deploy cache", "as_of": NOW, "top_k": 3, "weights": {"similarity": 0.9, "recency": 0.1}}
    with counting_drops() as drops:
        served, whole = await both(client, key, body)
    assert served == whole
    assert [r["episode"]["episode_id"][0] for r in served["results"]] == ["m"] * 3
    assert drops[0] >= DEPTH // 2, drops  # the served recall dropped most of its recency list
    assert drops[1] == 0  # the other one was asked with nothing dropped


async def test_a_new_episode_outside_both_similarity_lists_still_wins_on_its_words(client, redis, prefix):
    """The newest episode shares the query's words but is in neither similarity list (eight older exact
    matches fill both): only the recency list brings it, and it wins on its words plus its recency. A
    bound that left out its keyword relevance (cosine and recency alone: below the matches) would drop it."""
    key, ns = fresh_tenant()
    for i in range(8):
        await put(
            redis, prefix, ns, episode(f"old{i}", task="deploy cache", completed_at=NOW - 86400.0 * 60 - i)
        )
    await put(redis, prefix, ns, episode("newest", task="deploy cache worker", completed_at=NOW))
    for i in range(12):  # fill the recency list past its depth with strangers
        task = f"{OTHER[i % len(OTHER)]} {OTHER[(i + 3) % len(OTHER)]}"
        await put(redis, prefix, ns, episode(f"s{i}", task=task, completed_at=NOW - 600.0 - 60.0 * i))
    body = {"query": "deploy cache", "as_of": NOW, "top_k": 1, "weights": {"similarity": 0.8, "recency": 0.2}}
    with counting_drops() as drops:
        served, whole = await both(client, key, body)
    assert served == whole
    assert [r["episode"]["episode_id"] for r in served["results"]] == ["newest"]
    assert drops[0] > 0, drops
