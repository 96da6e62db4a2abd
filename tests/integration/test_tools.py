"""engram_episodic.tools against a real query service and Redis: every tool through dispatch (sync, in a
worker thread) and adispatch (async), with a bound scope, the service's 422s mapped to tool fields.

The service runs in the test's loop (aiohttp test server on a real port); the consolidator is driven
in-process (`drain`).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from engram_episodic import AsyncEngram, ConnectionFailed, Engram
from engram_episodic.tools import TOOL_NAMES, ToolArgumentError, Toolset, UnknownTool, adispatch, dispatch
from tests.integration.test_query_e2e import drain
from tests.integration.test_query_support import KEY_A, KEY_B

pytest_plugins = ["tests.integration.test_query_support"]


def url(server) -> str:
    return str(server.make_url("")).rstrip("/")


async def test_every_tool_through_adispatch_with_a_bound_scope(tenants, settings, redis):
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        toolset = Toolset(memory, agent_id="ops", user_id="ann", session_id="s-1")
        recorded = []
        for i, outcome in enumerate(["success", "success", "failure", "success"]):
            result = await toolset.adispatch("record_episode", {
                "task": f"rotate the tls certificate of service {i}", "outcome": outcome, "category": "ops",
                "solution": "certbot renew, then reload nginx", "strategy": "iterative",
                "reward": 0.0 if outcome == "failure" else 0.9, "importance": 6,
                "feedback": "certbot rate limit" if outcome == "failure" else None,
                "actions": [{"action_type": "shell", "input": "certbot renew", "success": outcome != "failure",
                             "error": "too many certificates" if outcome == "failure" else None}]})
            assert result.data["episode_id"] in result.text and not result.is_error
            recorded.append(result.data["episode_id"])
        await drain(settings, redis)
        stored = await memory.wait_until_recallable(recorded[0], timeout=10)
        assert (stored.episode.agent_id, stored.episode.user_id, stored.episode.session_id) == ("ops", "ann", "s-1")
        assert stored.episode.feedback.reward == 0.9 and stored.episode.strategy_used == "iterative"
        assert stored.episode.task.category == "ops" and stored.episode.actions[0].input == "certbot renew"

        recall = await toolset.adispatch("recall_experiences", json.dumps({"query": "renew the tls certificate",
                                                                           "top_k": 4}))
        assert len(recall.data["results"]) == 4 and all(i in recall.text for i in recorded)
        assert "success | reward 0.90" in recall.text and "strategy iterative" in recall.text
        assert "certbot renew, then reload nginx" in recall.text and "certbot rate limit" in recall.text
        failures = await toolset.adispatch("recall_experiences", {"query": "tls", "outcome": ["failure"]})
        assert [r["episode"]["episode_id"] for r in failures.data["results"]] == [recorded[2]]
        other_agent = await toolset.adispatch("recall_experiences", {"query": "tls", "agent_id": "nobody"})
        assert other_agent.data["results"] == [] and "No past episodes" in other_agent.text

        context = await toolset.adispatch("get_context", {"task": "renew the tls certificate", "max_chars": 1500})
        assert context.text == context.data["prompt"] and "tls certificate" in context.text
        assert len(context.text) <= 1500
        suggestion = await toolset.adispatch("suggest_approach", {"task": "renew the tls certificate"})
        assert suggestion.data["suggestion"]["confidence"] in ("high", "medium", "low")
        assert "Recommended strategy: " in suggestion.text and "certbot rate limit" in suggestion.text
        skills = await toolset.adispatch("get_skills", {})
        assert "ops: 4 episode(s), 3 success(es) (75%)" in skills.text
        curve = await toolset.adispatch("get_learning_curve", {"window": 2})
        assert len(curve.data["results"]) == 4 and "Learning curve over 4 episode(s)" in curve.text
        facts = await toolset.adispatch("search_facts", {"query": "tls certificate", "kind": ["strategy"]})
        assert facts.data == {"results": []} and "No facts" in facts.text

        forgot = await toolset.adispatch("forget_episode", {"episode_id": recorded[2]})
        assert forgot.data["episode_id"] == recorded[2] and forgot.data["event_id"]
        await drain(settings, redis)
        with pytest.raises(ToolArgumentError) as missing:
            await toolset.adispatch("forget_episode", {"episode_id": recorded[2]})
        assert missing.value.field == "episode_id" and "no episode" in missing.value.errors[0][1]

        with pytest.raises(ToolArgumentError) as blank:  # the service's 422, named as the tool's argument
            await toolset.adispatch("recall_experiences", {"query": "   "})
        assert blank.value.errors == (("query", "must not be empty or blank"),)
        as_result = await toolset.adispatch("recall_experiences", {"query": "x", "top_k": 0}, errors="result")
        assert as_result.is_error and as_result.data["errors"] == [{"field": "top_k", "reason":
                                                                    "must be an integer between 1 and 100"}]
        with pytest.raises(UnknownTool):
            await adispatch(memory, "drop_database", {})

    async with AsyncEngram(url(tenants), api_key=KEY_B) as other:  # tenancy is the API key's
        empty = await adispatch(other, "recall_experiences", {"query": "renew the tls certificate"})
        assert empty.data["results"] == []


async def test_dispatch_with_the_sync_client(tenants, settings, redis):
    def record() -> str:
        with Engram(url(tenants), api_key=KEY_A) as memory:
            with pytest.raises(ToolArgumentError) as bad:  # refused before anything is sent
                dispatch(memory, "record_episode", '{"task": "t", "outcome": "won", "reward": 2e6}')
            assert {f for f, _ in bad.value.errors} == {"outcome", "reward"}
            return dispatch(memory, "record_episode", {"task": "bump the api version", "outcome": "partial",
                                                       "reward": 0.5}, agent_id="a").data["episode_id"]

    episode_id = await asyncio.to_thread(record)
    await drain(settings, redis)

    def recall():
        with Engram(url(tenants), api_key=KEY_A) as memory:
            return Toolset(memory, agent_id="a").dispatch("recall_experiences", {"query": "api version"})

    result = await asyncio.to_thread(recall)
    assert [r["episode"]["episode_id"] for r in result.data["results"]] == [episode_id]
    assert "partial | reward 0.50" in result.text


async def test_an_unreachable_service_is_an_error_result_for_the_model(unused_tcp_port):
    async with AsyncEngram(f"http://127.0.0.1:{unused_tcp_port}", max_retries=0) as memory:
        with pytest.raises(ConnectionFailed):
            await adispatch(memory, "get_skills", {})
        result = await adispatch(memory, "get_skills", {}, errors="result")
    assert result.is_error and result.data == {"error": "unreachable", "maybe_applied": False}
    assert "unreachable" in result.text and len(TOOL_NAMES) == 8
