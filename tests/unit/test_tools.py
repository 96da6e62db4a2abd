"""engram_episodic.tools without a service: the schemas (valid JSON Schema, the server's bounds, the OpenAI
and Anthropic shapes), the argument check (every bad field named; the same verdict as jsonschema), the
requests a call builds (with a bound scope), the mapping of the service's 422s, and the renderers.

Requests go to an httpx.MockTransport behind the real Engram client: no network.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, get_type_hints

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.responses import FunctionToolParam
from openai.types.shared_params import FunctionDefinition

from engram_episodic import AsyncEngram, ConnectionFailed, Engram
from engram_episodic.errors import ApiError, RateLimited, Unauthorized
from engram_episodic.events import OUTCOMES
from engram_episodic.tools import (
    FORMATS,
    TOOL_NAMES,
    TOOLS,
    ToolArgumentError,
    Toolset,
    UnknownTool,
    adispatch,
    check_arguments,
    dispatch,
    error_result,
    get_tool,
    prepare,
    tools,
)
from engram_episodic.validation import MAX_ACTIONS, MAX_TEXT_CHARS
from services.query import models
from services.query.views.facts import FactsSearchRequest
from shared.facts import KINDS

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def objects(schema: dict[str, Any]):
    """Every object schema inside `schema` (itself included)."""
    if schema.get("type") == "object":
        yield schema
        for prop in schema.get("properties", {}).values():
            yield from objects(prop)
    if schema.get("type") == "array":
        yield from objects(schema["items"])


# --- schemas -------------------------------------------------------------------------------------------
def test_every_schema_is_valid_strict_json_schema():
    assert TOOL_NAMES == (
        "recall_experiences",
        "get_context",
        "record_episode",
        "suggest_approach",
        "search_facts",
        "forget_episode",
        "get_skills",
        "get_learning_curve",
    )
    for tool in TOOLS:
        jsonschema.Draft202012Validator.check_schema(tool.parameters)
        jsonschema.Draft7Validator.check_schema(tool.parameters)  # what older validators read
        assert tool.parameters["type"] == "object" and NAME.match(tool.name)
        assert 150 < len(tool.description) < 1024, tool.name  # when to call it and what it returns
        for obj in objects(dict(tool.parameters)):
            assert obj["additionalProperties"] is False
            assert set(obj["required"]) <= set(obj["properties"])
            for name, prop in obj["properties"].items():
                assert prop.get("description") or name in ("outcome",), f"{tool.name}.{name} undocumented"
    outcome = get_tool("record_episode").parameters["properties"]["outcome"]
    assert outcome["enum"] == list(OUTCOMES)
    assert get_tool("recall_experiences").parameters["properties"]["outcome"]["items"]["enum"] == list(
        OUTCOMES
    )
    assert set(get_tool("recall_experiences").parameters["properties"]["mode"]["enum"]) == {
        "hybrid",
        "vector",
        "keyword",
    }
    assert get_tool("search_facts").parameters["properties"]["kind"]["items"]["enum"] == list(KINDS)
    assert get_tool("record_episode").parameters["required"] == ["task", "outcome"]
    assert get_tool("forget_episode").parameters["required"] == ["episode_id"]


def _bounds(schema: dict[str, Any]) -> dict[str, Any]:
    """The bounds and enum of a (server) property schema: through anyOf/oneOf (null, one-or-list) and items."""
    out: dict[str, Any] = {}
    for branch in schema.get("anyOf") or schema.get("oneOf") or [schema]:
        if "anyOf" in branch or "oneOf" in branch:
            out = {**_bounds(branch), **out}
            continue
        if branch.get("type") == "array":
            branch = branch["items"]
        for key in ("minimum", "maximum", "maxLength", "enum"):
            if key in branch:
                out.setdefault(key, branch[key])
    return out


# tool → (server request model, {tool argument: server field}); what the service checks for each argument
SERVER = {
    "recall_experiences": (
        models.RecallRequest,
        {
            "query": "query",
            "top_k": "top_k",
            "category": "category",
            "outcome": "outcome",
            "strategy": "strategy",
            "mode": "mode",
            "agent_id": "agent_id",
            "user_id": "user_id",
            "session_id": "session_id",
        },
    ),
    "get_context": (
        models.ContextRequest,
        {
            "task": "task",
            "category": "category",
            "top_k": "top_k",
            "max_chars": "max_chars",
            "agent_id": "agent_id",
        },
    ),
    "suggest_approach": (
        models.SuggestRequest,
        {"task": "task", "category": "category", "user_id": "user_id"},
    ),
    "search_facts": (
        FactsSearchRequest,
        {
            "query": "query",
            "kind": "kind",
            "category": "category",
            "top_k": "top_k",
            "min_confidence": "min_confidence",
        },
    ),
    "get_skills": (models.SkillsQuery, {"threshold": "threshold", "agent_id": "agent_id"}),
    "get_learning_curve": (
        models.LearningCurveQuery,
        {"window": "window", "limit": "limit", "category": "category"},
    ),
}


@pytest.mark.parametrize("tool_name", sorted(SERVER))
def test_the_bounds_are_within_the_services(tool_name):
    model, mapping = SERVER[tool_name]
    server = model.model_json_schema()["properties"]
    props = get_tool(tool_name).parameters["properties"]
    for arg, field in mapping.items():
        mine, theirs = _bounds(props[arg]), _bounds(server[field])
        assert theirs, f"{tool_name}.{arg}: the service states no bound"
        if "enum" in theirs:
            assert set(mine["enum"]) == set(theirs["enum"]), arg
        for key in ("minimum", "maxLength", "maximum"):
            if key in theirs:
                assert key in mine, f"{tool_name}.{arg} has no {key}"
                assert (mine[key] >= theirs[key]) if key == "minimum" else (mine[key] <= theirs[key]), (
                    f"{tool_name}.{arg}.{key}: {mine[key]} vs the service's {theirs[key]}"
                )
    complexity = models.StrategyRequest.model_json_schema()["properties"]["complexity"]
    assert _bounds(complexity) == {"minimum": 0.0, "maximum": 1.0}


def test_record_bounds_are_the_episode_models():
    """At the bound the episode validation accepts; one past it the schema refuses, naming the field."""
    edge = {
        "task": "t" * MAX_TEXT_CHARS,
        "outcome": "partial",
        "reward": 1e6,
        "importance": 10,
        "complexity": 1,
        "iterations": 10**9,
        "tests_passed": 10**9,
        "tests_total": 10**9,
        "strategy": "s" * 128,
        "category": "c" * 128,
        "agent_id": "a" * 256,
        "actions": [{"action_type": "x"}] * MAX_ACTIONS,
    }
    body = prepare("record_episode", edge).calls[0].body
    assert body["feedback"]["reward"] == 1e6 and len(body["actions"]) == MAX_ACTIONS
    over = {
        "task": "t" * (MAX_TEXT_CHARS + 1),
        "reward": -1.1e6,
        "importance": 0.5,
        "complexity": 1.01,
        "iterations": 10**9 + 1,
        "strategy": "s" * 129,
        "category": "c" * 129,
        "agent_id": "a" * 257,
        "actions": [{"action_type": "x"}] * (MAX_ACTIONS + 1),
    }
    with pytest.raises(ToolArgumentError) as err:
        prepare("record_episode", {**edge, **over})
    assert {f for f, _ in err.value.errors} == set(over)


def test_openai_and_anthropic_shapes():
    def keys(typed_dict) -> tuple[set[str], set[str]]:
        return set(typed_dict.__required_keys__), set(get_type_hints(typed_dict))

    for fmt in FORMATS:
        assert len(tools(fmt)) == len(TOOLS)
    for tool, d in zip(TOOLS, tools("openai"), strict=True):
        required, known = keys(ChatCompletionFunctionToolParam)
        assert required <= set(d) <= known and d["type"] == "function"
        required, known = keys(FunctionDefinition)
        assert required <= set(d["function"]) <= known and "strict" not in d["function"]
        assert d["function"] == {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        }
    for tool, d in zip(TOOLS, tools("openai-responses"), strict=True):
        required, known = keys(FunctionToolParam)
        assert required <= set(d) <= known and d["strict"] is False and d["parameters"] == tool.parameters
    for tool, d in zip(TOOLS, tools("anthropic"), strict=True):
        assert d == {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
    json.dumps(tools("anthropic"))  # plain JSON
    tools("openai")[0]["function"]["parameters"]["properties"].clear()  # a copy: the definition is unchanged
    assert get_tool("recall_experiences").parameters["properties"]
    assert [d["name"] for d in tools("anthropic", names=["get_skills", "recall_experiences"])] == [
        "get_skills",
        "recall_experiences",
    ]
    with pytest.raises(ValueError, match="format"):
        tools("gemini")
    with pytest.raises(UnknownTool):
        tools(names=["drop_database"])


# --- argument errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("recall_experiences", {}, [("query", "is required")]),
        (
            "recall_experiences",
            {"query": "x", "top_k": 0},
            [("top_k", "must be an integer between 1 and 100")],
        ),
        (
            "recall_experiences",
            {"query": "x", "top_k": "5"},
            [("top_k", "must be an integer between 1 and 100, not a string")],
        ),
        (
            "recall_experiences",
            {"query": "x", "top_k": True},
            [("top_k", "must be an integer between 1 and 100, not a boolean")],
        ),
        (
            "recall_experiences",
            {"query": "x", "outcome": ["won"]},
            [("outcome[0]", "must be one of success, partial, failure, abandoned")],
        ),
        (
            "recall_experiences",
            {"query": "x", "outcome": "success"},
            [("outcome", "must be a list, not a string")],
        ),
        (
            "recall_experiences",
            {"query": "x", "outcome": ["success", "success"]},
            [("outcome", "must not repeat a value")],
        ),
        (
            "recall_experiences",
            {"query": "x", "mode": "fuzzy"},
            [("mode", "must be one of hybrid, vector, keyword")],
        ),
        (
            "recall_experiences",
            {"query": "x", "since": "2026-01-01T00:00:00"},
            [("since", "'2026-01-01T00:00:00' has no UTC offset (append Z or +00:00)")],
        ),
        (
            "recall_experiences",
            {"query": "x", "agent_id": " coder"},
            [("agent_id", "must not start or end with whitespace")],
        ),
        (
            "recall_experiences",
            {"query": "x", "namespace": "other-tenant"},
            [("namespace", "is not a known field")],
        ),
        ("record_episode", {"task": "t"}, [("outcome", "is required")]),
        ("record_episode", {"task": "", "outcome": "success"}, [("task", "must not be empty")]),
        ("record_episode", {"task": "  ", "outcome": "success"}, [("task", "must not be empty or blank")]),
        (
            "record_episode",
            {"task": "t", "outcome": "success", "reward": float("nan")},
            [("reward", "must be finite (NaN and infinity are rejected)")],
        ),
        (
            "record_episode",
            {"task": "t", "outcome": "success", "actions": [{"input": "ls", "succes": True}]},
            [("actions[0].succes", "is not a known field"), ("actions[0].action_type", "is required")],
        ),
        (
            "record_episode",
            {"task": "t", "outcome": "success", "tests_passed": 3, "tests_total": 2},
            [("tests_passed", "must not exceed tests_total")],
        ),
        (
            "record_episode",
            {"task": "t", "outcome": "success", "category": "bad\ncategory"},
            [("category", "must not contain control characters")],
        ),
        ("search_facts", {"session_id": "s"}, [("session_id", "is not a known field")]),
        (
            "get_context",
            {"task": "t", "max_chars": 100},
            [("max_chars", "must be an integer between 200 and 200000")],
        ),
        (
            "get_learning_curve",
            {"window": 2.5},
            [("window", "must be an integer between 1 and 1000, not the number 2.5")],
        ),
        ("forget_episode", {"episode_id": None}, [("episode_id", "is required")]),
        (
            "recall_experiences",
            {"query": "x\ud800"},
            [("query", "must be valid Unicode text (a lone surrogate at character 1)")],
        ),
    ],
)
def test_bad_arguments_name_the_field(tool, arguments, expected):
    with pytest.raises(ToolArgumentError) as err:
        prepare(tool, arguments)
    assert list(err.value.errors) == expected and err.value.tool == tool and err.value.field == expected[0][0]
    assert str(err.value).startswith(f"{tool}: {expected[0][0]}: ")


def test_arguments_as_json_and_the_lenient_cases():
    assert check_arguments(get_tool("get_skills"), None) == {} == check_arguments(get_tool("get_skills"), " ")
    assert check_arguments(get_tool("get_learning_curve"), b'{"window": 3.0}') == {"window": 3}
    # null for an optional argument means "not given" (strict-mode models send it)
    assert check_arguments(get_tool("recall_experiences"), '{"query": "x", "top_k": null}') == {"query": "x"}
    for raw, reason in [
        ("{not json", "are not valid JSON"),
        ("[1, 2]", "must be a JSON object, not a list"),
        (b'{"agent_id": "caf\xe9"}', "are not UTF-8 text (byte 17)"),  # never an id with a U+FFFD in it
    ]:
        with pytest.raises(ToolArgumentError) as err:
            check_arguments(get_tool("get_skills"), raw)
        assert err.value.field == "arguments" and reason in err.value.errors[0][1]
    with pytest.raises(UnknownTool) as unknown:
        prepare("drop_database", {})
    assert unknown.value.available == TOOL_NAMES


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False)
    | st.text(alphabet="abc09xyz_-", max_size=12),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["action_type", "input", "x"]), children, max_size=3)
    ),
    max_leaves=8,
)


def _candidate(spec):
    props = spec.parameters["properties"]
    plain = [n for n, p in props.items() if p.get("format") != "date-time"]  # parse_instant, not RFC 3339
    good = {
        "string": st.text(alphabet="abcxyz09_-", min_size=1, max_size=20),
        "integer": st.integers(-5, 2000),
        "number": st.floats(-20, 20, allow_nan=False),
        "boolean": st.booleans(),
    }

    def value(name):
        p = props[name]
        options = [_json.filter(lambda v: v is not None)]
        if "enum" in p:
            options.append(st.sampled_from(p["enum"] + ["nope"]))
        elif p["type"] == "array" and "enum" in p["items"]:
            options.append(st.lists(st.sampled_from(p["items"]["enum"] + ["nope"]), max_size=5))
        elif p["type"] in good:
            options.append(good[p["type"]])
        return st.one_of(options)

    optional = {n: value(n) for n in plain}
    optional["unknown_arg"] = _json  # additionalProperties: false
    return st.fixed_dictionaries({}, optional=optional)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_the_argument_check_agrees_with_jsonschema(data):
    """Whatever the arguments, the check accepts exactly what jsonschema accepts (ids and texts aside from
    the service's extra tag rule, which the generated strings always meet)."""
    spec = data.draw(st.sampled_from([t for t in TOOLS if t.name != "record_episode"]))
    args = data.draw(_candidate(spec))
    schema_ok = jsonschema.Draft202012Validator(spec.parameters).is_valid(args)
    try:
        check_arguments(spec, args)
        mine = True
    except ToolArgumentError:
        mine = False
    assert mine == schema_ok, args


# --- the requests a call builds --------------------------------------------------------------------------------
RECALL_ANSWER = {
    "results": [
        {
            "episode": {
                "episode_id": "ep-1",
                "task": {"description": "fix the flaky login test", "category": "testing"},
                "outcome": "failure",
                "solution": "retry the test",
                "strategy_used": "iterative",
                "feedback": {"reward": 0.2, "message": "still flaky at midnight"},
                "completed_at": "2026-11-29T14:02:00Z",
            },
            "priority": 0.8,
            "similarity": 0.9,
            "relevance": 0.9,
            "recency": 0.5,
            "age_s": 7200.0,
            "components": {"similarity": 0.36},
        }
    ],
    "replay_context": {
        "episodes": 1,
        "avg_reward": 0.2,
        "success_rate": 0.0,
        "strategies": [
            {"strategy": "iterative", "priority": 0.8, "episodes": 1, "avg_reward": 0.2, "success_rate": 0.0}
        ],
    },
    "as_of": "2026-11-29T16:02:00Z",
    "weights": {"similarity": 0.4},
    "preset": "early",
    "mode": "hybrid",
    "candidates": 1,
}
SUGGEST_ANSWER = {
    "confidence": "low",
    "similar": 3,
    "successes": 0,
    "failures": 3,
    "success_share": 0.0,
    "common_failures": [{"message": "lock timeout", "count": 2}],
    "failed_action_types": [{"action_type": "sql", "count": 3}],
    "successful_strategies": [],
}
STRATEGY_ANSWER = {
    "strategy": "defensive",
    "rule": "weak_category",
    "reason": "category 'db' is weak",
    "evidence": {},
    "pool": ["defensive"],
}


class Recorder:
    """A MockTransport handler: records each request, answers from a table by path (or a status)."""

    def __init__(self, answers: dict[str, Any]):
        self.answers, self.requests = answers, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, body, dict(request.url.params)))
        answer = self.answers[request.url.path]
        if isinstance(answer, tuple):
            return httpx.Response(answer[0], json=answer[1])
        return httpx.Response(200, json=answer)


def engram(recorder: Recorder) -> Engram:
    return Engram(
        "http://memory.test",
        api_key="k",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(recorder)),
    )


def test_dispatch_builds_the_request_with_the_bound_scope_and_renders_text_and_data():
    recorder = Recorder(
        {
            "/v1/recall": RECALL_ANSWER,
            "/v1/episodes": (202, {"accepted": 1, "results": [{"episode_id": "x", "event_id": "ev-1"}]}),
        }
    )
    toolset = Toolset(engram(recorder), agent_id="coder-1", user_id="alice", session_id="s-9")
    result = toolset.dispatch(
        "recall_experiences", '{"query": "login test", "top_k": 2, "min_reward": 0.1, "outcome": ["failure"]}'
    )
    method, path, body, _ = recorder.requests[-1]
    assert (method, path) == ("POST", "/v1/recall")
    assert body == {
        "query": "login test",
        "top_k": 2,
        "outcome": ["failure"],
        "reward": {"gte": 0.1},
        "agent_id": "coder-1",
        "user_id": "alice",
    }  # the bound session does not narrow reads
    assert result.data == RECALL_ANSWER and not result.is_error
    assert result.text.splitlines() == [
        "1 past episode(s) for 'login test', best first:",
        "1. [failure | reward 0.20 | 2026-11-29 14:02 UTC (2 h ago) | strategy iterative] fix the flaky login test",
        "   solution: retry the test",
        "   feedback: still flaky at midnight",
        "   episode_id: ep-1",
    ]
    toolset.dispatch("recall_experiences", {"query": "q", "agent_id": "other"})
    assert recorder.requests[-1][2]["agent_id"] == "other"  # what the model passes wins

    recorded = toolset.dispatch(
        "record_episode",
        {
            "task": "fix it",
            "outcome": "success",
            "reward": 1,
            "feedback": "the user said thanks",
            "strategy": "iterative",
        },
    )
    body = recorder.requests[-1][2]
    assert (body["agent_id"], body["user_id"], body["session_id"]) == ("coder-1", "alice", "s-9")
    assert body["feedback"] == {"reward": 1.0, "message": "the user said thanks"}
    assert (
        body["task"] == {"description": "fix it", "category": "unknown"}
        and body["strategy_used"] == "iterative"
    )
    assert recorded.data == {
        "episode_id": body["episode_id"],
        "event_id": "ev-1",
        "outcome": "success",
        "accepted": 1,
    }


async def test_adispatch_sends_suggest_and_strategy_once_each():
    recorder = Recorder({"/v1/suggest": SUGGEST_ANSWER, "/v1/strategy": STRATEGY_ANSWER})
    client = AsyncEngram(
        "http://memory.test",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(recorder)),
    )
    result = await adispatch(
        client,
        "suggest_approach",
        {"task": "migrate the orders table", "complexity": 0.8, "category": "db"},
        agent_id="a",
    )
    await client.aclose()
    sent = sorted((path, body) for _, path, body, _ in recorder.requests)
    assert sent == [
        (
            "/v1/strategy",
            {"task": "migrate the orders table", "category": "db", "complexity": 0.8, "agent_id": "a"},
        ),
        ("/v1/suggest", {"task": "migrate the orders table", "agent_id": "a"}),  # category: strategy only
    ]
    assert result.data == {"suggestion": SUGGEST_ANSWER, "strategy": STRATEGY_ANSWER}
    assert result.text.splitlines() == [
        "Confidence: low (0 success(es) and 3 failure(s) among 3 similar past episode(s)).",
        "Recommended strategy: defensive (category 'db' is weak).",
        "Common failures to avoid: 'lock timeout' (2x)",
        "Steps that failed before: sql (3x)",
    ]


def test_the_services_errors_are_named_with_the_tools_fields():
    problem = {
        "title": "invalid",
        "status": 422,
        "errors": [
            {"field": "feedback.reward", "reason": "must be finite"},
            {"field": "task.category", "reason": "bad"},
            {"field": "strategy_used", "reason": "bad"},
            {"field": "actions[2].error", "reason": "bad"},
        ],
    }
    recorder = Recorder(
        {
            "/v1/episodes": (422, problem),
            "/v1/recall": (
                422,
                {"title": "invalid", "errors": [{"field": "reward.gte", "reason": "must be a number"}]},
            ),
            "/v1/episodes/ep-9": (404, {"title": "not found"}),
            "/v1/skills": (401, {"title": "unauthorized", "detail": "missing API key"}),
        }
    )
    memory = engram(recorder)
    with pytest.raises(ToolArgumentError) as err:
        dispatch(memory, "record_episode", {"task": "t", "outcome": "success"})
    assert [f for f, _ in err.value.errors] == ["reward", "category", "strategy", "actions[2].error"]
    with pytest.raises(ToolArgumentError) as err:
        dispatch(memory, "recall_experiences", {"query": "q", "min_reward": 0.5})
    assert err.value.errors == (("min_reward", "must be a number"),)
    with pytest.raises(ToolArgumentError) as err:
        dispatch(memory, "forget_episode", {"episode_id": "ep-9"})
    assert err.value.field == "episode_id" and "no episode" in err.value.errors[0][1]
    with pytest.raises(Unauthorized):
        dispatch(memory, "get_skills")
    denied = dispatch(memory, "get_skills", errors="result")
    assert denied.is_error and denied.data == {"error": "unauthorized", "status": 401}


def test_error_results_tell_the_model_what_to_do():
    bad = error_result(ToolArgumentError("record_episode", [("outcome", "must be one of success, partial")]))
    assert bad.is_error and bad.text == (
        "Invalid arguments for record_episode: outcome: must be one of success, "
        "partial. Fix them and call again."
    )
    assert bad.data["errors"] == [{"field": "outcome", "reason": "must be one of success, partial"}]
    busy = error_result(RateLimited(429, {"title": "busy"}, retry_after=2.0))
    assert busy.data == {"error": "unavailable", "status": 429, "retry_after": 2.0} and "in 2 s" in busy.text
    assert error_result(ConnectionFailed("cannot reach x", maybe_applied=True)).data == {
        "error": "unreachable",
        "maybe_applied": True,
    }
    assert error_result(ApiError(500, {"title": "boom"})).data["error"] == "service_error"
    assert error_result(UnknownTool("Nope", TOOL_NAMES)).text.startswith("Unknown tool 'Nope'; available: ")


def test_toolset_scope_subset_and_client_kind():
    memory = engram(Recorder({}))
    subset = Toolset(memory, names=["get_skills", "recall_experiences"])
    assert subset.names == ("get_skills", "recall_experiences")
    assert [d["function"]["name"] for d in subset.definitions()] == ["get_skills", "recall_experiences"]
    with pytest.raises(UnknownTool):
        subset.dispatch("forget_episode", {"episode_id": "x"})
    with pytest.raises(ValueError, match="agent_id: must not start or end with whitespace"):
        Toolset(memory, agent_id="coder ")
    with pytest.raises(TypeError, match="adispatch"):
        asyncio.run(Toolset(memory).adispatch("get_skills"))
    with pytest.raises(TypeError, match="dispatch"):
        Toolset(AsyncEngram("http://memory.test")).dispatch("get_skills")


def test_renderers_of_empty_and_full_answers():
    recorder = Recorder(
        {
            "/v1/skills": {
                "results": [
                    {
                        "category": "testing",
                        "episodes": 4,
                        "successes": 1,
                        "success_rate": 0.25,
                        "avg_reward": 0.3,
                        "avg_iterations": 2.0,
                        "weak": True,
                    },
                    {
                        "category": "debugging",
                        "episodes": 9,
                        "successes": 8,
                        "success_rate": 0.89,
                        "avg_reward": 0.9,
                        "avg_iterations": None,
                        "weak": False,
                    },
                ],
                "weak": ["testing"],
                "threshold": 0.5,
            },
            "/v1/learning-curve": {
                "window": 2,
                "results": [
                    {
                        "episode": i + 1,
                        "episode_id": f"e{i}",
                        "completed_at": f"2026-11-2{i}T00:00:00Z",
                        "reward": r,
                        "outcome": o,
                        "cumulative_reward": c,
                        "success_rate": s,
                        "avg_reward": a,
                    }
                    for i, (r, o, c, s, a) in enumerate(
                        [
                            (0.0, "failure", 0.0, 0.0, 0.0),
                            (0.0, "failure", 0.0, 0.0, 0.0),
                            (1.0, "success", 1.0, 0.5, 0.5),
                            (1.0, "success", 2.0, 1.0, 1.0),
                        ]
                    )
                ],
            },
            "/v1/facts/search": {"results": []},
            "/v1/context": {
                "task": "t",
                "prompt": "## Relevant experience for: t",
                "max_chars": 4000,
                "results": [],
                "truncated": False,
            },
        }
    )
    memory = engram(recorder)
    assert dispatch(memory, "get_skills").text.splitlines() == [
        "Skills by category (weak: success rate below 50%):",
        "- debugging: 9 episode(s), 8 success(es) (89%), avg reward 0.90",
        "- testing: 4 episode(s), 1 success(es) (25%), avg reward 0.30, avg iterations 2.0 - WEAK",
        "Weak categories: testing.",
    ]
    curve = dispatch(memory, "get_learning_curve", {"window": 2, "limit": 4})
    assert recorder.requests[-1][3] == {"window": "2", "limit": "4"}
    assert curve.text.splitlines()[0] == (
        "Learning curve over 4 episode(s) (rolling window 2): success rate 0% -> "
        "100% (improving); avg reward 0.00 -> 1.00; total reward 2.00."
    )
    facts = dispatch(memory, "search_facts", {"query": "tls"})
    assert facts.text.startswith("No facts about 'tls' yet") and facts.data == {"results": []}
    assert dispatch(memory, "get_context", {"task": "t"}).text == "## Relevant experience for: t"
