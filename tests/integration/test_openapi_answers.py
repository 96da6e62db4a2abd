"""Every JSON route's answer, provoked for real (a seeded namespace, facts consolidated, an episode
pending then projected), validates against the schema the OpenAPI document gives its success status,
and that schema lists every member the answer has: the document's types are what the service sends
(schemathesis' random requests mostly reach 4xx), so a generated client types each field it gets."""

from __future__ import annotations

import re
from typing import Any

from engram_episodic.events import EpisodeStarted
from engram_episodic.validation import parse_episode
from shared import streams
from shared.codec import encode
from shared.keys import Keys
from tests.integration.test_consolidator import drain
from tests.integration.test_facts import make_worker
from tests.integration.test_facts_http import seed
from tests.integration.test_query_support import (
    episode,
    make_client,  # noqa: F401  (fixture)
)
from tests.openapi_check import success_schema, undocumented, validator


async def test_every_answer_matches_its_documented_schema(make_client, settings, redis):  # noqa: F811
    api = await make_client()
    await seed(settings, redis)
    checked: dict[tuple[str, str], Any] = {}
    missing: list[str] = []  # members answers have and their schemas do not list, said all at once

    async def call(method: str, documented: str, path: str | None = None, **kw: Any) -> Any:
        resp = await api.request(method, path or documented, **kw)
        status, schema = success_schema(method, documented)
        body = await resp.json()
        assert resp.status == status, (method, path, body)
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator(schema).iter_errors(body)]
        assert not errors, (method, documented, errors[:5])
        if documented != "/openapi.json":  # its own schema is free-form by design
            missing.extend(f"{method} {documented}: {m}" for m in undocumented(body, schema))
        checked[(method, documented)] = body
        return body

    await call("POST", "/v1/consolidate", json={})
    found = await call("POST", "/v1/facts/search", json={"query": "migrate", "top_k": 2})
    await call("GET", "/v1/facts/{fact_id}", f"/v1/facts/{found['results'][0]['fact_id']}")
    one = episode("x1", task="renew tls", category="ops", reward=0.5)
    await call("POST", "/v1/episodes", json={**one, "actions": [{"action_type": "run", "timestamp": 1.7e9}]})
    two = episode("x2", task="renew tls", category="ops", reward=0.5)
    await call("POST", "/v1/episodes", "/v1/episodes?wait=0.01", json={"episodes": [two]})
    pending = await call("GET", "/v1/episodes/{episode_id}", "/v1/episodes/x2")
    assert pending["status"] == "pending"
    started = parse_episode({"episode_id": "x3", "task": "renew tls"})  # no outcome, no completed_at
    event = EpisodeStarted(
        namespace=settings.default_namespace, episode_id="x3", occurred_at=1.7e9, episode=started
    )
    await streams.publish(redis, Keys(settings.prefix).stream_of(settings.default_namespace), [encode(event)])
    await drain(make_worker(settings, redis))
    draft = await call("GET", "/v1/episodes/{episode_id}", "/v1/episodes/x3")
    assert draft["status"] == "draft" and "outcome" not in draft["episode"]
    got = await call("GET", "/v1/episodes/{episode_id}", "/v1/episodes/x1")
    assert got["episode"]["actions"][0]["timestamp"].endswith("Z")
    await call("POST", "/v1/recall", json={"query": "migrate the table", "top_k": 3})
    await call("POST", "/v1/context", json={"task": "migrate the table", "top_k": 2})
    await call("GET", "/v1/skills")
    await call("POST", "/v1/strategy", json={"task": "migrate the table"})
    await call("POST", "/v1/suggest", json={"task": "migrate the table"})
    await call("GET", "/v1/learning-curve", "/v1/learning-curve?limit=50")
    await call("GET", "/healthz")
    await call("GET", "/readyz")
    await call("GET", "/openapi.json")
    page = await call("GET", "/v1/episodes", "/v1/episodes?limit=1")
    await call("GET", "/v1/episodes", f"/v1/episodes?limit=1&cursor={page['next_cursor']}")
    await call("GET", "/v1/facts", "/v1/facts?limit=2")
    await call("PATCH", "/v1/episodes/{episode_id}", "/v1/episodes/x1?wait=0.01", json={"importance": 7})
    job = await call("POST", "/v1/forget", json={"episode_ids": ["x2", "never-seen"]})
    await call("GET", "/v1/forget/{job_id}", job["job"])
    await call("DELETE", "/v1/agents/{agent_id}", "/v1/agents/nobody")
    await call("DELETE", "/v1/sessions/{session_id}", "/v1/sessions/nowhere")
    await call("DELETE", "/v1/episodes/{episode_id}", "/v1/episodes/x1")
    await call("DELETE", "/v1/users/{user_id}", "/v1/users/u1")
    await drain(make_worker(settings, redis))
    again = await call("DELETE", "/v1/episodes/{episode_id}", "/v1/episodes/x1")
    assert again["already_forgotten"] is True
    await call("GET", "/v1/summary")
    from tests.integration.test_dead_letters_http import dead_lettered

    for bad in ("bad-1", "bad-2"):
        await dead_lettered(settings, redis, settings.default_namespace, bad)
    dead = await call("GET", "/v1/dead-letters")
    await call("POST", "/v1/dead-letters/redrive", json={"ids": [dead["results"][0]["id"]]})
    await call("POST", "/v1/dead-letters/discard", json={"ids": [dead["results"][1]["id"], "0-1"]})
    json_routes = {
        (m.upper(), p)
        for p, ops in (await (await api.get("/openapi.json")).json())["paths"].items()
        for m, op in ops.items()
        if "application/json" in next(r for s, r in op["responses"].items() if s.startswith("2"))["content"]
    }
    assert json_routes == set(checked)  # a new JSON route needs a case here
    assert not missing, "\n".join(sorted({re.sub(r"\[\d+\]", "[]", m) for m in missing}))
