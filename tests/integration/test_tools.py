"""engram_episodic.tools against a real query service and Redis: every tool through dispatch (sync, in a
worker thread) and adispatch (async), with a bound scope, the service's 422s mapped to tool fields.

The service runs in the test's loop (aiohttp test server on a real port); the consolidator is driven
in-process (`drain`).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import sys
import types
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from engram_episodic import AsyncEngram, ConnectionFailed, Engram
from engram_episodic.tools import TOOL_NAMES, ToolArgumentError, Toolset, UnknownTool, adispatch, dispatch
from tests.integration.test_query_e2e import drain
from tests.integration.test_query_support import KEY_A, KEY_B
from tests.integration.test_reliability import running_worker

pytest_plugins = ["tests.integration.test_query_support"]


def url(server) -> str:
    return str(server.make_url("")).rstrip("/")


async def test_every_tool_through_adispatch_with_a_bound_scope(tenants, settings, redis):
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        toolset = Toolset(memory, agent_id="ops", user_id="ann", session_id="s-1")
        recorded = []
        for i, outcome in enumerate(["success", "success", "failure", "success"]):
            result = await toolset.adispatch(
                "record_episode",
                {
                    "task": f"rotate the tls certificate of service {i}",
                    "outcome": outcome,
                    "category": "ops",
                    "solution": "certbot renew, then reload nginx",
                    "strategy": "iterative",
                    "reward": 0.0 if outcome == "failure" else 0.9,
                    "importance": 6,
                    "feedback": "certbot rate limit" if outcome == "failure" else None,
                    "actions": [
                        {
                            "action_type": "shell",
                            "input": "certbot renew",
                            "success": outcome != "failure",
                            "error": "too many certificates" if outcome == "failure" else None,
                        }
                    ],
                },
            )
            assert result.data["episode_id"] in result.text and not result.is_error
            recorded.append(result.data["episode_id"])
        await drain(settings, redis)
        stored = await memory.wait_until_recallable(recorded[0], timeout=10)
        assert (stored.episode.agent_id, stored.episode.user_id, stored.episode.session_id) == (
            "ops",
            "ann",
            "s-1",
        )
        assert stored.episode.feedback.reward == 0.9 and stored.episode.strategy_used == "iterative"
        assert stored.episode.task.category == "ops" and stored.episode.actions[0].input == "certbot renew"

        recall = await toolset.adispatch(
            "recall_experiences", json.dumps({"query": "renew the tls certificate", "top_k": 4})
        )
        assert len(recall.data["results"]) == 4 and all(i in recall.text for i in recorded)
        assert "success | reward 0.90" in recall.text and "strategy iterative" in recall.text
        assert "certbot renew, then reload nginx" in recall.text and "certbot rate limit" in recall.text
        failures = await toolset.adispatch("recall_experiences", {"query": "tls", "outcome": ["failure"]})
        assert [r["episode"]["episode_id"] for r in failures.data["results"]] == [recorded[2]]
        other_agent = await toolset.adispatch("recall_experiences", {"query": "tls", "agent_id": "nobody"})
        assert other_agent.data["results"] == [] and "No past episodes" in other_agent.text

        context = await toolset.adispatch(
            "get_context", {"task": "renew the tls certificate", "max_chars": 1500}
        )
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

        async with running_worker(settings, "tool-forgetter"):  # the tool waits for the erase
            forgot = await toolset.adispatch("forget_episode", {"episode_id": recorded[2]})
        assert forgot.data["episode_id"] == recorded[2] and forgot.data["event_id"]
        assert forgot.data["status"] == "erased" and "is erased from memory" in forgot.text
        gone = await toolset.adispatch(
            "recall_experiences", {"query": "renew the tls certificate", "top_k": 10}
        )
        assert recorded[2] not in {r["episode"]["episode_id"] for r in gone.data["results"]}
        again = await toolset.adispatch("forget_episode", {"episode_id": recorded[2]})  # idempotent
        assert again.data["status"] == "already_forgotten" and "already forgotten" in again.text
        with pytest.raises(ToolArgumentError) as missing:
            await toolset.adispatch("forget_episode", {"episode_id": "never-recorded"})
        assert missing.value.field == "episode_id" and "no episode" in missing.value.errors[0][1]

        with pytest.raises(ToolArgumentError) as blank:  # the service's 422, named as the tool's argument
            await toolset.adispatch("recall_experiences", {"query": "   "})
        assert blank.value.errors == (("query", "must not be empty or blank"),)
        as_result = await toolset.adispatch("recall_experiences", {"query": "x", "top_k": 0}, errors="result")
        assert as_result.is_error and as_result.data["errors"] == [
            {"field": "top_k", "reason": "must be an integer between 1 and 100"}
        ]
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
            return dispatch(
                memory,
                "record_episode",
                {"task": "bump the api version", "outcome": "partial", "reward": 0.5},
                agent_id="a",
            ).data["episode_id"]

    episode_id = await asyncio.to_thread(record)
    await drain(settings, redis)

    def recall():
        with Engram(url(tenants), api_key=KEY_A) as memory:
            return Toolset(memory, agent_id="a").dispatch("recall_experiences", {"query": "api version"})

    result = await asyncio.to_thread(recall)
    assert [r["episode"]["episode_id"] for r in result.data["results"]] == [episode_id]
    assert "partial | reward 0.50" in result.text


async def test_an_episode_larger_than_one_request_is_recorded_in_parts(tenants, settings, redis):
    """A record_episode of ~3.9 MB (three 1,000,000-character fields, three 900,000-character
    action outputs) got a 413 naming only "arguments", while `record` stored the same episode whole: the
    tool now sends it in parts as `record` does, with the sync and the async client."""
    big = {
        "task": "t",
        "outcome": "success",
        "solution": "s" * 1_000_000,
        "feedback": "f" * 1_000_000,
        "outcome_details": "o" * 1_000_000,
        "actions": [{"action_type": "run", "output": c * 900_000} for c in "xyz"],  # distinct: kept apart
    }

    def sync() -> str:
        with Engram(url(tenants), api_key=KEY_A) as memory:
            return dispatch(memory, "record_episode", big).data["episode_id"]

    ids = [await asyncio.to_thread(sync)]
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        ids.append((await adispatch(memory, "record_episode", big)).data["episode_id"])
        await drain(settings, redis)
        for episode_id in ids:
            stored = (await memory.wait_until_recallable(episode_id, timeout=20)).episode
            assert len(stored.solution or "") == 1_000_000 and len(stored.outcome_details or "") == 1_000_000
            assert [len(a.output or "") for a in stored.actions] == [900_000] * 3


async def test_an_unreachable_service_is_an_error_result_for_the_model(unused_tcp_port):
    async with AsyncEngram(f"http://127.0.0.1:{unused_tcp_port}", max_retries=0) as memory:
        with pytest.raises(ConnectionFailed):
            await adispatch(memory, "get_skills", {})
        result = await adispatch(memory, "get_skills", {}, errors="result")
    assert result.is_error and result.data == {"error": "unreachable", "maybe_applied": False}
    assert "unreachable" in result.text and len(TOOL_NAMES) == 8


# --- the function-calling examples of docs/integrations.md, run against a stand-in model endpoint ---------
DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def doc_example(importing: str) -> str:
    """The python block of the "Plain function calling" section that contains `importing`."""
    text = DOC.read_text()
    start = text.index("\n## Plain function calling (OpenAI / Anthropic)")
    section = text[start : text.find("\n## ", start + 1)]
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if importing in b]
    return block


def run_example(code: str) -> str:
    """Execute a documented example (in a worker thread: the service answers in the test's loop)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), {"__name__": "docs_example"})
    return out.getvalue()


async def seed(tenants, settings, redis) -> str:
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        episode_id = await memory.record(
            task="the login test fails at night",
            outcome="success",
            solution="freeze the clock with a fixture",
            agent_id="coder-1",
            user_id="alice",
            feedback={"reward": 1.0},
        )
        await drain(settings, redis)
        await memory.wait_until_recallable(episode_id, timeout=10)
    return episode_id


def pointed_at(code: str, tenants) -> str:
    assert code.count('"http://127.0.0.1:8080"') == 1 and code.count('"dev-key"') == 1
    return code.replace('"http://127.0.0.1:8080"', repr(url(tenants))).replace('"dev-key"', repr(KEY_A))


async def test_the_openai_example_runs_its_tool_loop(tenants, settings, redis, aiohttp_server, monkeypatch):
    """The documented loop with the real openai SDK against an OpenAI-compatible stand-in that asks for
    recall_experiences once, then answers with what the tool returned."""
    episode_id = await seed(tenants, settings, redis)
    seen: list[dict] = []

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        assert [t["function"]["name"] for t in body["tools"]] == list(TOOL_NAMES)
        assert all(set(t) == {"type", "function"} for t in body["tools"])
        if len(seen) == 1:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "recall_experiences",
                            "arguments": '{"query": "login test fails at night"}',
                        },
                    }
                ],
            }
            reason = "tool_calls"
        else:
            tool_message = body["messages"][-1]
            assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_1"
            assert body["messages"][-2]["tool_calls"][0]["id"] == "call_1"
            message, reason = (
                {"role": "assistant", "content": "From memory: " + tool_message["content"]},
                "stop",
            )
        return web.json_response(
            {
                "id": f"c{len(seen)}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": reason}],
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    fake = await aiohttp_server(app)
    monkeypatch.setenv("OPENAI_BASE_URL", url(fake) + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    printed = await asyncio.to_thread(
        run_example, pointed_at(doc_example("from openai import OpenAI"), tenants)
    )
    assert len(seen) == 2 and "freeze the clock with a fixture" in printed and episode_id in printed


def fake_anthropic_module(base_url: str) -> types.ModuleType:
    """A stand-in for the anthropic SDK (not a dependency): `Anthropic().messages.create(**kw)` POSTs the
    Messages API request to `base_url` as the SDK would and answers attribute objects as the SDK does."""

    def plain(value):
        if isinstance(value, types.SimpleNamespace):
            value = vars(value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    def obj(value):  # as the SDK's models: a tool_use block's `input` stays a dict
        if isinstance(value, dict):
            return types.SimpleNamespace(**{k: v if k == "input" else obj(v) for k, v in value.items()})
        if isinstance(value, list):
            return [obj(v) for v in value]
        return value

    class Messages:
        def create(self, **kwargs):
            response = httpx.post(
                base_url + "/v1/messages",
                json=plain(kwargs),
                headers={"x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01"},
            )
            response.raise_for_status()
            return obj(response.json())

    class Anthropic:
        def __init__(self):
            self.messages = Messages()

    module = types.ModuleType("anthropic")
    module.Anthropic = Anthropic
    return module


async def test_the_anthropic_example_runs_its_tool_loop(
    tenants, settings, redis, aiohttp_server, monkeypatch
):
    episode_id = await seed(tenants, settings, redis)
    seen: list[dict] = []

    async def messages(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        assert request.headers["x-api-key"] == "sk-ant-test" and body["max_tokens"] == 1024
        assert [set(t) for t in body["tools"]] == [{"name", "description", "input_schema"}] * len(TOOL_NAMES)
        assert all(t["input_schema"]["type"] == "object" for t in body["tools"])
        if len(seen) == 1:
            content = [
                {"type": "text", "text": "Let me check memory."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "recall_experiences",
                    "input": {"query": "login test fails at night"},
                },
                {"type": "tool_use", "id": "toolu_2", "name": "recall_experiences", "input": {"top_k": 0}},
            ]
            reason = "tool_use"
        else:
            assistant, user = body["messages"][-2:]
            assert [b["type"] for b in assistant["content"]] == ["text", "tool_use", "tool_use"]
            ok, bad = user["content"]
            assert (ok["type"], ok["tool_use_id"], ok["is_error"]) == ("tool_result", "toolu_1", False)
            assert bad["is_error"] is True and "query: is required" in bad["content"]  # told what to fix
            content, reason = [{"type": "text", "text": "From memory: " + ok["content"]}], "end_turn"
        return web.json_response(
            {
                "id": f"msg_{len(seen)}",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": content,
                "stop_reason": reason,
            }
        )

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    fake = await aiohttp_server(app)
    monkeypatch.setitem(sys.modules, "anthropic", fake_anthropic_module(url(fake)))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    printed = await asyncio.to_thread(run_example, pointed_at(doc_example("import anthropic"), tenants))
    assert len(seen) == 2 and "freeze the clock with a fixture" in printed and episode_id in printed
