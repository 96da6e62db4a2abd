"""The facts endpoints over HTTP: search, one fact with evidence and history, on-demand consolidation,
and facts in POST /v1/context."""

from __future__ import annotations

import json

import pytest

from shared.embedding import EmbedderUnavailable, HashingEmbedder
from tests.integration.test_consolidator import drain
from tests.integration.test_facts import CLOSING, T0, ep, make_worker, planted, publish
from tests.integration.test_query_support import make_client  # noqa: F401  (fixture)


@pytest.fixture
async def api(make_client):  # noqa: F811
    return await make_client()


async def seed(settings, redis, episodes=None):
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    await publish(s, redis, episodes or planted(), namespace="default")
    await drain(make_worker(s, redis))


async def test_consolidate_then_search_and_get(api, settings, redis):
    await seed(settings, redis)
    resp = await api.post("/v1/consolidate", json={})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert [r["status"] for r in body["results"]] == ["published", "published"]  # namespace + coder/debugging
    resp = await api.post(
        "/v1/facts/search",
        json={"query": "migrate the refunds table schema with alembic", "level": "namespace", "top_k": 1},
    )
    assert resp.status == 200, await resp.text()
    (top,) = (await resp.json())["results"]
    assert top["support"] == 10 and top["success_rate"] == 0.8 and "centroid" not in top
    assert top["first_at"] == "2025-06-15T15:06:40Z" and top["score"] > 0.5
    detail = await (await api.get(f"/v1/facts/{top['fact_id']}")).json()
    assert [e["episode_id"] for e in detail["evidence"]] == [f"mig-{i}" for i in range(10)]
    assert detail["history"] == []
    # filters: kind, user, time window; a second run changes nothing
    kinds = await (
        await api.post("/v1/facts/search", json={"kind": "failure_pattern", "level": "namespace"})
    ).json()
    assert [f["support"] for f in kinds["results"]] == [5]
    none = await (await api.post("/v1/facts/search", json={"user_id": "nobody"})).json()
    assert none["results"] == []
    window = await (
        await api.post("/v1/facts/search", json={"until": T0 + 50 * 3600, "level": "namespace"})
    ).json()
    assert [f["support"] for f in window["results"]] == [10]
    # a query nothing is about: no fact pointing away from it by default, none at all above 0.99
    total = len((await (await api.post("/v1/facts/search", json={})).json())["results"])
    nonsense = {"query": "zzzz qqqq xylophone"}
    every = await api.post("/v1/facts/search", json={**nonsense, "min_similarity": -1})
    assert len((await every.json())["results"]) == total
    for floor in (None, 0.99):
        body = {**nonsense, **({"min_similarity": floor} if floor is not None else {})}
        found = (await (await api.post("/v1/facts/search", json=body)).json())["results"]
        assert all(f["score"] >= (floor or 0.0) for f in found), found
        assert floor is None or not found
    again = await (await api.post("/v1/consolidate", json={"all_scopes": False})).json()
    assert [r["status"] for r in again["results"]] == ["unchanged"]


async def test_superseded_history_over_http(api, settings, redis):
    await seed(settings, redis, [ep("mig", i) for i in range(6)])
    await api.post("/v1/consolidate", json={"all_scopes": False})
    await seed(settings, redis, [ep("mig", i, outcome="failure", error="lock timeout") for i in range(6, 12)])
    await api.post("/v1/consolidate", json={"all_scopes": False})
    current = (await (await api.post("/v1/facts/search", json={})).json())["results"]
    assert len(current) == 1 and current[0]["supersedes"]
    both = (await (await api.post("/v1/facts/search", json={"include_superseded": True})).json())["results"]
    assert {f["status"] for f in both} == {"current", "superseded"}
    detail = await (await api.get(f"/v1/facts/{current[0]['fact_id']}")).json()
    assert [h["fact_id"] for h in detail["history"]] == [current[0]["supersedes"]]


async def test_context_includes_top_facts(api, settings, redis):
    await seed(settings, redis)
    await api.post("/v1/consolidate", json={})
    resp = await api.post(
        "/v1/context", json={"task": "migrate the refunds table schema in postgres", "top_k": 2}
    )
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert len(body["results"]) == 2 and 1 <= len(body["facts"]) <= 5
    assert body["facts"][0]["support"] == 10 and "Known facts" in body["prompt"]
    texts = [f["text"] for f in body["facts"]]
    assert len(texts) == len(set(texts)), "the namespace's and the (agent, category) scope's same fact once"
    assert sum(body["prompt"].count(t[:60]) for t in texts) == len(texts)


async def test_validation_and_not_found(api):
    for body, field in (
        ({"top_k": 0}, "top_k"),
        ({"kind": "nonsense"}, "kind"),
        ({"query": "  "}, "query"),
        ({"since": "2025-07-02T00:00:00Z", "until": "2025-07-01T00:00:00Z"}, "since"),
        ({"bogus": 1}, "bogus"),
    ):
        resp = await api.post("/v1/facts/search", json=body)
        assert resp.status == 422, body
        assert field in {e["field"] for e in (await resp.json())["errors"]}
    assert (await api.get("/v1/facts/nope")).status == 404
    assert (await api.post("/v1/consolidate", json={"agent_id": "a"})).status == 422


async def test_on_demand_consolidation_leaves_shared_text_out(api, settings, redis):
    """POST /v1/consolidate clusters as the consolidator does: without the text every episode shares."""
    await seed(settings, redis, [{**e, "result": CLOSING} for e in planted()])
    resp = await api.post("/v1/consolidate", json={})
    assert resp.status == 200, await resp.text()
    body = await (await api.post("/v1/facts/search", json={"level": "namespace"})).json()
    assert sorted(f["support"] for f in body["results"]) == [5, 6, 10]


async def test_on_demand_consolidation_with_the_embedder_down_is_503(make_client, settings, redis):  # noqa: F811
    """Leaving shared text out embeds again; an embedder that fails then is a 503 with Retry-After, and
    the facts stay as they were."""

    class Down(HashingEmbedder):
        down = False

        async def embed(self, texts):
            if self.down:
                raise EmbedderUnavailable("provider timed out")
            return await super().embed(texts)

    embedder = Down(settings.embed_dim)
    api = await make_client(embedder)
    await seed(settings, redis, [{**e, "result": CLOSING} for e in planted()])
    embedder.down = True
    resp = await api.post("/v1/consolidate", json={})
    assert resp.status == 503, await resp.text()
    assert resp.headers["Retry-After"]
    assert (await (await api.post("/v1/facts/search", json={})).json())["results"] == []


async def test_cli_facts_names_each_fact_level_and_prints_the_service_answer(api, settings, redis):
    """One fact distilled both for the namespace and for agent coder's category showed as two identical
    lines, and `--json` printed a bare list where the other commands print the service's answer."""
    from tests.integration.test_query_cli import run

    await seed(settings, redis)
    assert (await api.post("/v1/consolidate", json={})).status == 200
    out = await run(api, "facts", "migrate the refunds table schema")
    assert out.exit_code == 0, out.output
    levels = {line.split()[1] for line in out.output.splitlines()}
    assert levels == {"namespace", "agent_category"}, out.output
    out = await run(api, "facts", "migrate the refunds table schema", "--json")
    answer = json.loads(out.output)
    assert isinstance(answer, dict) and {f["level"] for f in answer["results"]} == levels, answer
