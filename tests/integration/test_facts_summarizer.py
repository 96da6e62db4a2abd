"""The optional summariser against a local OpenAI-compatible test server (127.0.0.1): rewrites, and
failures that are counted, reported and retried once the server recovers."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry

from services.consolidator.facts import Consolidator
from services.consolidator.metrics import summarizer_failures
from services.consolidator.summarizer import Summarizer
from shared.facts import FactScope
from tests.integration.test_consolidator import drain
from tests.integration.test_facts import ep, facts, make_worker, publish
from tests.integration.test_query_support import make_client  # noqa: F401  (fixture)


class ChatServer:
    """POST /v1/chat/completions answering `answer`, or failing as `mode` says: "500" (HTTP 500),
    "garbage" (200 with a body that is not JSON), "shape" (200, JSON without choices), "empty" (200, an
    empty answer). Set `mode = "ok"` to recover."""

    def __init__(self, answer: str, mode: str = "ok"):
        self.answer, self.mode = answer, mode
        self.calls: list[dict] = []
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        self.calls.append(await request.json())
        if self.mode == "500":
            return web.json_response({"error": "boom"}, status=500)
        if self.mode == "garbage":
            return web.Response(text="<html>upstream crashed", content_type="application/json")
        if self.mode == "shape":
            return web.json_response({"id": "x", "object": "chat.completion"})
        content = "" if self.mode == "empty" else self.answer
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": content}}]})


async def seeded(settings, redis, namespace="ns"):
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    await publish(s, redis, [ep("mig", i) for i in range(4)], namespace=namespace)
    await drain(make_worker(s, redis))
    return s


def counted(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value("engram_summarizer_failures_total", {"reason": reason}) or 0.0


async def test_summary_replaces_text_bounded_and_only_when_changed(settings, redis, aiohttp_server):
    s = await seeded(settings, redis)
    chat = ChatServer("Use the iterative strategy. " * 50)
    server = await aiohttp_server(chat.app, host="127.0.0.1")
    summarizer = Summarizer(str(server.make_url("/v1")), model="m", max_chars=120)
    cons = Consolidator(s, redis, s.embed_dim, summarizer=summarizer)
    try:
        first = await cons.consolidate(FactScope("ns"))
        assert (first.status, first.summarizer_failures) == ("published", 0)
        assert (await cons.consolidate(FactScope("ns"))).status == "unchanged"
    finally:
        await summarizer.aclose()
    (fact,) = await facts(redis, s)
    assert len(chat.calls) == 1 and chat.calls[0]["model"] == "m" and chat.calls[0]["max_tokens"] == 40
    assert "4 of 4 attempts succeeded" in chat.calls[0]["messages"][1]["content"]
    assert fact.text.startswith("Use the iterative strategy.") and len(fact.text) <= 120
    assert fact.base_text.startswith("What works:") and fact.summary == "llm"


async def test_a_failing_summariser_is_counted_reported_and_retried_when_it_recovers(
    settings, redis, aiohttp_server
):
    s = await seeded(settings, redis)
    chat = ChatServer("Iterative migrations work: 4 of 4 succeeded.", mode="500")
    server = await aiohttp_server(chat.app, host="127.0.0.1")
    registry = CollectorRegistry()
    summarizer = Summarizer(
        str(server.make_url("/v1")), model="m", failures_metric=summarizer_failures(registry)
    )
    cons = Consolidator(s, redis, s.embed_dim, summarizer=summarizer)
    scope = FactScope("ns")
    try:
        # down: the fact is published with the deterministic text, marked, and the failure is visible
        first = await cons.consolidate(scope)
        assert (first.status, first.summarizer_failures) == ("published", 1)
        assert first.to_json()["summarizer_failures"] == 1
        (fact,) = await facts(redis, s)
        assert (fact.text, fact.summary, fact.version) == (fact.base_text, "fallback", 1)
        assert counted(registry, "http") == 1
        # still broken, in other ways: each run retries, nothing changes, each failure counted by reason
        for mode in ("garbage", "shape", "empty"):
            chat.mode = mode
            again = await cons.consolidate(scope)
            assert (again.status, again.summarizer_failures) == ("unchanged", 1)
        assert counted(registry, "malformed") == 2 and counted(registry, "empty") == 1
        assert await facts(redis, s) == [fact]
        # recovered: the next run (no new episodes) rewrites the fallen-back fact, a new version
        chat.mode = "ok"
        healed = await cons.consolidate(scope)
        assert (healed.status, healed.summarizer_failures) == ("published", 0)
        (fact2,) = await facts(redis, s)
        assert fact2.fact_id == fact.fact_id and fact2.summary == "llm" and fact2.version == 2
        assert (
            fact2.text == "Iterative migrations work: 4 of 4 succeeded." and fact2.base_text == fact.base_text
        )
        # and then it is left alone
        calls = len(chat.calls)
        assert (await cons.consolidate(scope)).status == "unchanged" and len(chat.calls) == calls == 5
    finally:
        await summarizer.aclose()


async def test_consolidate_over_http_reports_summariser_failures(
    make_client,  # noqa: F811
    settings,
    redis,
    aiohttp_server,
):
    await seeded(settings, redis, namespace="default")
    chat = ChatServer("Use iterative migrations.", mode="500")
    server = await aiohttp_server(chat.app, host="127.0.0.1")
    api = await make_client(
        summarizer_url=str(server.make_url("/v1")), facts_every=10_000, facts_importance_threshold=1e9
    )
    body = await (await api.post("/v1/consolidate", json={"all_scopes": False})).json()
    assert body["summarizer_failures"] == 1
    assert [(r["status"], r["summarizer_failures"]) for r in body["results"]] == [("published", 1)]
    (fact,) = (await (await api.post("/v1/facts/search", json={})).json())["results"]
    assert fact["summary"] == "fallback"
    metrics = await (await api.get("/metrics")).text()
    assert 'engram_summarizer_failures_total{reason="http"} 1.0' in metrics
    chat.mode = "ok"
    body = await (await api.post("/v1/consolidate", json={"all_scopes": False})).json()
    assert body["summarizer_failures"] == 0 and body["results"][0]["status"] == "published"
    (fact,) = (await (await api.post("/v1/facts/search", json={})).json())["results"]
    assert (fact["summary"], fact["text"], fact["version"]) == ("llm", "Use iterative migrations.", 2)


def test_disabled_unless_configured(settings):
    assert Summarizer.from_settings(settings) is None
    assert (
        Summarizer.from_settings(settings.with_(summarizer_url="http://127.0.0.1:1/v1")).url
        == "http://127.0.0.1:1/v1/chat/completions"
    )
