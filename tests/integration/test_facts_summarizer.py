"""The optional summariser against a local OpenAI-compatible test server (127.0.0.1)."""

from __future__ import annotations

from aiohttp import web

from services.consolidator.facts import Consolidator
from services.consolidator.summarizer import Summarizer
from shared.facts import FactScope
from tests.integration.test_consolidator import drain
from tests.integration.test_facts import ep, facts, make_worker, publish


def chat_server(answer: str, status: int = 200):
    calls: list[dict] = []

    async def handle(request: web.Request) -> web.Response:
        calls.append(await request.json())
        if status != 200:
            return web.json_response({"error": "boom"}, status=status)
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": answer}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    return app, calls


async def run(settings, redis, aiohttp_server, answer: str, status: int = 200):
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    await publish(s, redis, [ep("mig", i) for i in range(4)])
    await drain(make_worker(s, redis))
    app, calls = chat_server(answer, status)
    server = await aiohttp_server(app, host="127.0.0.1")
    summarizer = Summarizer(str(server.make_url("/v1")), model="m", max_chars=120)
    cons = Consolidator(s, redis, s.embed_dim, summarizer=summarizer)
    try:
        await cons.consolidate(FactScope("ns"))
        assert (await cons.consolidate(FactScope("ns"))).status == "unchanged"
    finally:
        await summarizer.aclose()
    return s, calls


async def test_summary_replaces_text_bounded_and_only_when_changed(settings, redis, aiohttp_server):
    s, calls = await run(settings, redis, aiohttp_server, "Use the iterative strategy. " * 50)
    (fact,) = await facts(redis, s)
    assert len(calls) == 1 and calls[0]["model"] == "m" and calls[0]["max_tokens"] == 40
    assert "4 of 4 attempts succeeded" in calls[0]["messages"][1]["content"]
    assert fact.text.startswith("Use the iterative strategy.") and len(fact.text) <= 120
    assert fact.base_text.startswith("What works:")


async def test_failing_summariser_keeps_the_deterministic_text(settings, redis, aiohttp_server):
    s, calls = await run(settings, redis, aiohttp_server, "", status=500)
    (fact,) = await facts(redis, s)
    assert len(calls) == 1 and fact.text == fact.base_text


def test_disabled_unless_configured(settings):
    assert Summarizer.from_settings(settings) is None
    assert Summarizer.from_settings(settings.with_(summarizer_url="http://127.0.0.1:1/v1")).url \
        == "http://127.0.0.1:1/v1/chat/completions"
