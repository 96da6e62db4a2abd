"""Checked filters (`shared.hybrid.checked_share`): when a scope holds most of the index, the recall's
KNNs leave its namespace and status out of the filter and check them on the hits. The answer must be
the filtered one, never another tenant's or a draft episode, whichever path a KNN took."""

from __future__ import annotations

import numpy as np
import pytest

from services.query import lists, pool
from shared import hybrid
from shared.index import STATUS_DRAFT
from tests.integration.test_query_support import TableEmbedder, episode, put, unit

pytest_plugins = ["tests.integration.test_query_support"]  # fixtures: make_client

QUERIES = {
    "near the other tenant": unit(1.0, 0.0, 0.0),  # the small namespace's episodes are its nearest
    "near the drafts": unit(0.0, 1.0, 0.0),  # the big namespace's drafts are its nearest
    "near nothing special": unit(0.0, 0.0, 1.0),  # the checked KNN's answer is the scope's
    "far from everything": unit(*[0.0] * 100, 1.0),  # cosine 0 to all: recency and reward decide
}


async def seed(redis, prefix) -> None:
    rng = np.random.default_rng(7)
    for i in range(270):  # "big": 270 completed of 295 documents (91.5%: checked)
        v = unit(*rng.normal(size=6).tolist(), 0.5 + i / 270)
        task = f"rotate the {'zebra ' if i % 5 == 0 else ''}credentials of service {i}"
        await put(
            redis,
            prefix,
            "big",
            episode(f"b{i}", task=task, reward=float(rng.random()), completed_at=1_700_000_000.0 + i * 60),
            v,
        )
    for i in range(10):  # the big namespace's drafts, nearest to their query, newest, best rewarded
        await put(
            redis,
            prefix,
            "big",
            episode(
                f"draft{i}",
                task="rotate the zebra credentials draft",
                reward=1.0,
                completed_at=1_700_100_000.0 + i,
            ),
            unit(0.01 * i, 1.0, 0.0),
            status=STATUS_DRAFT,
        )
    for i in range(15):  # another tenant: nearest to a query, newest, best rewarded, same words
        await put(
            redis,
            prefix,
            "small",
            episode(
                f"s{i}",
                task="rotate the zebra credentials of service",
                reward=1.0,
                completed_at=1_700_200_000.0 + i,
            ),
            unit(1.0, 0.01 * i, 0.0),
        )


def shape(body) -> list[tuple]:
    return [
        (x["episode"]["episode_id"], x["priority"], x["relevance"], x["similarity"]) for x in body["results"]
    ]


def spy(monkeypatch, module, name: str, record) -> list:
    """Wrap `module.name` so each call appends `record(kwargs, result)` to the returned list."""
    seen: list = []
    real = getattr(module, name)

    async def wrapped(*args, **kwargs):
        result = await real(*args, **kwargs)
        seen.append(record(kwargs, result))
        return result

    monkeypatch.setattr(module, name, wrapped)
    return seen


@pytest.mark.parametrize("mode", ["vector", "hybrid"])
async def test_checked_knns_answer_as_the_filtered_ones(make_client, redis, prefix, monkeypatch, mode):
    await seed(redis, prefix)
    embedder = TableEmbedder(256, {q: v for q, v in QUERIES.items()})
    client = await make_client(embedder, api_keys={"key-big": "big", "key-small": "small"})
    paths = spy(
        monkeypatch, pool, "knn_checked", lambda _, hits: "checked" if hits is not None else "asked again"
    )
    keyword = spy(
        monkeypatch, pool, "bm25_checked", lambda _, hits: "checked" if hits is not None else "asked again"
    )
    unions = spy(monkeypatch, lists, "knn_union", lambda kwargs, hits: kwargs["checked"] and hits is not None)

    async def answers() -> dict[tuple, list[tuple]]:
        out = {}
        for key in ("key-big", "key-small"):
            for q in QUERIES:
                # candidates 5: the checked searches ask for 9, and the small tenant's 15 episodes
                # are the nearest to its query (then the filtered search is asked again)
                for top_k, depth in ((5, None), (50, None), (5, 5)):
                    extra = {"candidates": depth} if depth else {}
                    for rnd in range(2):  # the second one answers from the remembered lists' union
                        resp = await client.post(
                            "/v1/recall",
                            json={"query": q, "top_k": top_k, "mode": mode, **extra},
                            headers={"Authorization": f"Bearer {key}"},
                        )
                        assert resp.status == 200, await resp.text()
                        body = await resp.json()
                        ns_ids = [x["episode"]["episode_id"] for x in body["results"]]
                        if key == "key-big":
                            assert not [i for i in ns_ids if i.startswith(("s", "draft"))], ns_ids
                        else:
                            assert all(i.startswith("s") for i in ns_ids), ns_ids
                        out[(key, q, top_k, depth, rnd)] = shape(body)
        return out

    checked = await answers()
    assert "checked" in paths and "asked again" in paths  # both paths taken (big only: small is 5%)
    assert any(unions)  # the remembered lists' union answered, checked
    if mode == "hybrid":  # the same words as the other tenant and the drafts: both paths
        assert "checked" in keyword and "asked again" in keyword
    monkeypatch.setattr(hybrid, "CHECKED_SHARE", 2.0)  # never: every KNN filtered
    paths.clear()
    keyword.clear()
    unions.clear()
    filtered = await answers()
    assert paths == [] and keyword == [] and unions and not any(unions)
    assert checked == filtered
