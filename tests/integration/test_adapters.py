"""Framework adapters (engram_episodic.adapters) with the real libraries, against a real query service.

No LLM anywhere: LangChain tools are invoked directly, the LangGraph "model" node is a plain function
and the OpenAI Agents tools run through their `on_invoke_tool` (and a `ScriptedModel` run). The
service runs in the test's loop on a real port (`tenants`); the consolidator is driven in-process
(`drain`); sync clients run in a worker thread so the loop keeps serving.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, set_tracing_disabled
from agents.strict_schema import ensure_strict_json_schema
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

from engram_episodic import AsyncEngram, Engram
from engram_episodic.adapters.langchain import engram_tools
from engram_episodic.adapters.langgraph import CONTEXT_MESSAGE_ID, context_node, record_node, turn_of
from engram_episodic.adapters.openai_agents import engram_function_tools, strict_schema
from engram_episodic.tools import TOOL_NAMES, TOOLS, ToolArgumentError
from tests.integration.test_query_e2e import drain
from tests.integration.test_query_support import KEY_A, KEY_B

pytest_plugins = ["tests.integration.test_query_support"]


def url(server) -> str:
    return str(server.make_url("")).rstrip("/")


async def record_one(server, settings, redis, **episode: Any) -> str:
    """Record `episode` (keyword fields) in tenant A's namespace and project it; its id."""
    async with AsyncEngram(url(server), api_key=KEY_A) as memory:
        first = await memory.record(**episode)
    await drain(settings, redis)
    return first


async def seed(server, settings, redis) -> str:
    return await record_one(
        server,
        settings,
        redis,
        task="rotate the tls certificate of the api gateway",
        outcome="success",
        solution="certbot renew, then reload nginx",
        agent_id="ops",
        strategy_used="iterative",
        feedback={"reward": 1.0},
    )


@pytest.mark.slow  # a fresh interpreter
def test_the_package_imports_without_any_framework():
    """engram_episodic (and .adapters, .tools) import with no framework; an adapter names its extra."""
    probe = """
import sys
for name in ("langchain_core", "langgraph", "agents"):
    sys.modules[name] = None  # as if not installed
import engram_episodic, engram_episodic.adapters, engram_episodic.tools
for module, extra in (("langchain", "langchain"), ("langgraph", "langgraph"), ("openai_agents", "openai-agents")):
    try:
        __import__("engram_episodic.adapters." + module)
    except ImportError as exc:
        assert f"pip install './client[{extra}]'" in str(exc), exc
    else:
        raise AssertionError(module + " imported without its framework")
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


# --- LangGraph ---------------------------------------------------------------------------------------------
class Seen:
    """The "model": a plain function that answers and remembers what it was given."""

    def __init__(self, answer: str = "renewed it with certbot and reloaded nginx"):
        self.inputs: list[list[Any]] = []
        self.answer = answer

    def __call__(self, state: MessagesState) -> dict[str, Any]:
        self.inputs.append(list(state["messages"]))
        return {"messages": [AIMessage(self.answer)]}


def graph_of(memory, model, state=MessagesState, **record: Any):
    builder = StateGraph(state)
    builder.add_node("recall", context_node(memory, agent_id="ops"))
    builder.add_node("model", model)
    builder.add_node("record", record_node(memory, agent_id="ops", **record))
    builder.add_edge(START, "recall")
    builder.add_edge("recall", "model")
    builder.add_edge("model", "record")
    builder.add_edge("record", END)
    return builder.compile(checkpointer=InMemorySaver())


async def test_langgraph_context_reaches_the_model_and_the_turn_is_recorded(tenants, settings, redis):
    first = await seed(tenants, settings, redis)
    model = Seen()
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        graph = graph_of(memory, model)
        config = {"configurable": {"thread_id": "thread-1"}}
        out = await graph.ainvoke(
            {
                "messages": [
                    SystemMessage("You are an ops agent."),
                    HumanMessage("renew the tls certificate of the api gateway"),
                ]
            },
            config,
        )
        seen = model.inputs[0]
        assert [type(m) for m in seen] == [SystemMessage, SystemMessage, HumanMessage]
        assert seen[0].content == "You are an ops agent."  # the user's system prompt stays first
        assert seen[1].id == CONTEXT_MESSAGE_ID
        assert (
            "Relevant experience" in seen[1].content and "certbot renew, then reload nginx" in seen[1].content
        )
        assert isinstance(out["messages"][-1], AIMessage)

        # a second turn: the context message is replaced where it is, never stacked
        await graph.ainvoke({"messages": [HumanMessage("and the certificate of the admin panel?")]}, config)
        second = model.inputs[1]
        assert [m.id for m in second].count(CONTEXT_MESSAGE_ID) == 1
        assert second[1].id == CONTEXT_MESSAGE_ID and "admin panel" in second[1].content
        assert isinstance(second[-1], HumanMessage)

        await drain(settings, redis)
        recall = await memory.recall("renew the tls certificate of the api gateway", agent_id="ops", top_k=5)
        recorded = [h.episode for h in recall if h.episode.episode_id != first]
        assert len(recorded) == 2
        turn = next(
            e for e in recorded if e.task.description == "renew the tls certificate of the api gateway"
        )
        assert turn.solution == "renewed it with certbot and reloaded nginx" and turn.outcome == "success"
        assert turn.session_id == "thread-1" and turn.agent_id == "ops"
        assert turn.metadata == {"integration": "langgraph", "thread_id": "thread-1"}

    async with AsyncEngram(url(tenants), api_key=KEY_B) as other:  # the namespace is the key's
        assert len(await other.recall("tls certificate", top_k=10)) == 0


class Graded(MessagesState):
    outcome: str
    reward: float
    engram_context: str
    engram_episode_id: str


async def test_langgraph_sync_graph_with_outcome_and_reward_from_the_state(tenants, settings, redis):
    await seed(tenants, settings, redis)

    def model(state: Graded) -> dict[str, Any]:
        assert "certbot renew" in state["engram_context"]  # a state that declares the key gets the text
        call = {"name": "run_shell", "args": {"cmd": "certbot renew"}, "id": "call-1"}
        return {
            "messages": [
                AIMessage("", tool_calls=[call]),
                ToolMessage("rate limit hit", tool_call_id="call-1", status="error"),
                AIMessage("could not renew: certbot rate limit"),
            ],
            "outcome": "failure",
            "reward": 0.1,
        }

    def run() -> dict[str, Any]:
        with Engram(url(tenants), api_key=KEY_A) as memory:
            graph = graph_of(memory, model, state=Graded, fields={"strategy_used": "defensive"})
            return graph.invoke(
                {"messages": [HumanMessage("renew the tls certificate of the mail server")]},
                {"configurable": {"thread_id": "t-sync"}},
            )

    out = await asyncio.to_thread(run)
    episode_id = out["engram_episode_id"]
    await drain(settings, redis)
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        stored = (await memory.wait_until_recallable(episode_id, timeout=10)).episode
    assert stored.outcome == "failure" and stored.feedback.reward == pytest.approx(0.1)
    assert stored.strategy_used == "defensive" and stored.solution == "could not renew: certbot rate limit"
    [action] = stored.actions
    assert (action.action_type, action.input, action.success, action.error) == (
        "run_shell",
        '{"cmd": "certbot renew"}',
        False,
        "rate limit hit",
    )

    # the same turn recorded again (a retried node) is the same episode, not a copy
    def record_again() -> dict[str, Any]:
        with Engram(url(tenants), api_key=KEY_A) as memory:
            return record_node(memory, agent_id="ops").invoke(out, {"configurable": {"thread_id": "t-sync"}})

    assert (await asyncio.to_thread(record_again))["engram_episode_id"] == episode_id


async def test_langgraph_threads_that_share_a_long_prefix_stay_apart(tenants, settings, redis):
    """Thread ids longer than an Engram id are hashed, never cut: two threads sharing their first 256
    characters stay two sessions, each turn of a thread lands in the same one, and the metadata keeps
    the thread id whole. A tool name over 128 characters is hashed the same way."""
    prefix = "conversation/" + "x" * 300
    threads = [prefix + "/a", prefix + "/b"]
    long_tool = "t" * 200
    call = {"name": long_tool, "args": {}, "id": "call-1"}
    replies = [
        [AIMessage("", tool_calls=[call]), ToolMessage("ok", tool_call_id="call-1"), AIMessage("done")],
        [AIMessage("done again")],
        [AIMessage("other thread")],
    ]

    def model(state: MessagesState) -> dict[str, Any]:
        return {"messages": replies.pop(0)}

    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        graph = graph_of(memory, model, state=Graded)
        ids = []
        for thread, task in (
            (threads[0], "first turn"),
            (threads[0], "second turn"),
            (threads[1], "elsewhere"),
        ):
            out = await graph.ainvoke(
                {"messages": [HumanMessage(task)]}, {"configurable": {"thread_id": thread}}
            )
            ids.append(out["engram_episode_id"])
        await drain(settings, redis)
        stored = [(await memory.wait_until_recallable(i, timeout=10)).episode for i in ids]
    digests = ["sha256:" + hashlib.sha256(t.encode()).hexdigest() for t in threads]
    assert [e.session_id for e in stored] == [digests[0], digests[0], digests[1]]
    assert [e.metadata["thread_id"] for e in stored] == [threads[0], threads[0], threads[1]]
    assert stored[0].actions[0].action_type == "sha256:" + hashlib.sha256(long_tool.encode()).hexdigest()


def test_turn_of_reads_the_last_turn_only():
    messages = [
        HumanMessage("old", id="h0"),
        AIMessage("old answer", id="a0"),
        HumanMessage("new", id="h1"),
        AIMessage("", tool_calls=[{"name": "grep", "args": {}, "id": "c"}]),
        ToolMessage("3 hits", tool_call_id="c"),
        AIMessage([{"type": "text", "text": "done"}]),
    ]
    turn = turn_of(messages)
    assert turn["solution"] == "done"
    assert turn["actions"] == [{"action_type": "grep", "input": "{}", "output": "3 hits", "success": True}]


async def test_langgraph_nodes_refuse_what_they_cannot_do(tenants):
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        node = context_node(memory)
        with pytest.raises(TypeError, match="ainvoke"):  # an AsyncEngram cannot serve a sync invoke
            await asyncio.to_thread(node.invoke, {"messages": [HumanMessage("x")]})
        with pytest.raises(TypeError, match="unknown scope"):
            record_node(memory, agent="ops")
        assert await node.ainvoke({"messages": []}) == {}  # no task: nothing to look up
    with Engram(url(tenants)) as anonymous:  # no API key: a 401, skipped when asked to
        skip = context_node(anonymous, on_error="skip")
        assert await skip.ainvoke({"messages": [HumanMessage("x")]}) == {}


# --- LangChain ---------------------------------------------------------------------------------------------
def tool_call(name: str, args: dict[str, Any], call_id: str = "call-1") -> dict[str, Any]:
    return {"type": "tool_call", "name": name, "args": args, "id": call_id}


async def test_langchain_tools_record_then_recall_sync_and_async(tenants, settings, redis):
    with Engram(url(tenants), api_key=KEY_A) as sync_memory:
        async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
            tools = {t.name: t for t in engram_tools(sync_memory, async_client=memory, agent_id="lc")}
            assert list(tools) == list(TOOL_NAMES)
            for spec in TOOLS:  # the definitions of engram_episodic.tools, unchanged
                assert convert_to_openai_tool(tools[spec.name]) == spec.definition("openai")

            recorded = await tools["record_episode"].ainvoke(
                tool_call(
                    "record_episode",
                    {
                        "task": "rotate the tls certificate of the api gateway",
                        "outcome": "success",
                        "solution": "certbot renew, then reload nginx",
                        "reward": 1.0,
                        "strategy": "iterative",
                        "actions": [{"action_type": "shell", "input": "certbot renew", "success": True}],
                    },
                )
            )
            assert isinstance(recorded, ToolMessage) and recorded.status == "success"
            episode_id = recorded.artifact["episode_id"]
            assert recorded.content.startswith(f"Recorded episode {episode_id}")
            await drain(settings, redis)

            text = await asyncio.to_thread(
                tools["recall_experiences"].invoke, {"query": "renew the tls certificate"}
            )
            assert isinstance(text, str) and "certbot renew, then reload nginx" in text and episode_id in text
            message = await tools["recall_experiences"].ainvoke(
                tool_call("recall_experiences", {"query": "tls certificate"})
            )
            [hit] = message.artifact["results"]
            assert (
                hit["episode"]["episode_id"] == episode_id and hit["episode"]["agent_id"] == "lc"
            )  # bound scope
            context = await tools["get_context"].ainvoke({"task": "renew the tls certificate"})
            assert "Relevant experience" in context

            refused = await tools["record_episode"].ainvoke(
                tool_call("record_episode", {"task": "t", "outcome": "maybe"})
            )
            assert refused.status == "error" and refused.content.startswith(
                "Invalid arguments for record_episode"
            )
            assert "outcome: must be one of success" in refused.content

    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        strict = {t.name: t for t in engram_tools(memory, errors="raise")}
        with pytest.raises(ToolArgumentError) as bad:
            await strict["recall_experiences"].ainvoke({"query": "x", "top_k": 0})
        assert bad.value.field == "top_k"
        with pytest.raises(TypeError, match="AsyncEngram only"):  # no sync client: invoke cannot run
            await asyncio.to_thread(strict["get_skills"].invoke, {})

    with Engram(url(tenants), api_key=KEY_B) as other:  # a sync client alone serves ainvoke in a thread
        skills = {t.name: t for t in engram_tools(other)}["get_skills"]
        assert await skills.ainvoke({}) == "No completed episodes yet, so no skill profile."


# --- OpenAI Agents SDK -------------------------------------------------------------------------------------
def invoke(tool, arguments: dict[str, Any]):
    """Call a FunctionTool as the SDK's runner does: on_invoke_tool(ToolContext, arguments JSON)."""
    raw = json.dumps(arguments)
    ctx = ToolContext(context=None, tool_name=tool.name, tool_call_id="call-1", tool_arguments=raw)
    return tool.on_invoke_tool(ctx, raw)


def nulls(tool, **given: Any) -> dict[str, Any]:
    """What a model sends under a strict schema: every property, null for the ones it leaves out."""
    return {name: given.get(name) for name in tool.params_json_schema["properties"]}


async def test_openai_agents_function_tools_through_on_invoke_tool(tenants, settings, redis):
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        tools = {t.name: t for t in engram_function_tools(memory, agent_id="oa")}
        assert list(tools) == list(TOOL_NAMES)
        for spec in TOOLS:
            tool = tools[spec.name]
            assert tool.strict_json_schema and tool.description == spec.description
            schema = tool.params_json_schema
            assert (
                schema == strict_schema(spec.parameters) == ensure_strict_json_schema(copy.deepcopy(schema))
            )
            assert set(schema["required"]) == set(schema["properties"]) == set(spec.parameters["properties"])

        text = await invoke(
            tools["record_episode"],
            nulls(
                tools["record_episode"],
                task="migrate the orders table",
                outcome="failure",
                outcome_details="lock timeout on ALTER TABLE",
                reward=0.0,
                actions=[
                    {
                        "action_type": "sql",
                        "input": "ALTER TABLE orders ...",
                        "output": None,
                        "success": False,
                        "error": "lock timeout",
                    }
                ],
            ),
        )
        episode_id = text.split()[2]
        await drain(settings, redis)
        found = await invoke(
            tools["recall_experiences"], nulls(tools["recall_experiences"], query="orders table migration")
        )
        assert episode_id in found and "lock timeout" in found
        stored = (await memory.get_episode(episode_id)).episode
        assert stored.agent_id == "oa" and stored.actions[0].error == "lock timeout"

        advice = await invoke(
            tools["suggest_approach"], {"task": "migrate the orders table"}
        )  # non-strict call too
        assert advice.startswith("Confidence: ")
        bad = await invoke(tools["get_learning_curve"], {"window": 0})
        assert bad.startswith(
            "Invalid arguments for get_learning_curve: window: must be an integer between 1"
        )

        loose = {t.name: t for t in engram_function_tools(memory, strict=False, names=["get_skills"])}
        assert loose["get_skills"].strict_json_schema is False
        assert loose["get_skills"].params_json_schema == dict(TOOLS[6].parameters)


async def test_openai_agents_runner_with_a_scripted_model(tenants, settings, redis):
    set_tracing_disabled(True)
    await seed(tenants, settings, redis)
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        tools = engram_function_tools(memory, agent_id="ops")
        context_args = nulls(tools[1], task="renew the tls certificate of the api gateway")
        model = ScriptedModel(
            [
                [function_call("get_context", context_args, call_id="c1")],
                [assistant_message("renew with certbot, then reload nginx")],
            ]
        )
        agent = Agent(name="ops", instructions="Use memory first.", model=model, tools=tools)
        result = await Runner.run(agent, "renew the tls certificate of the api gateway")
    assert result.final_output == "renew with certbot, then reload nginx"
    [output] = [item for item in model.calls[1].input if item.get("type") == "function_call_output"]
    assert "certbot renew, then reload nginx" in output["output"]


# --- docs/integrations.md: every example runs, with a stub where the doc has an LLM -------------------------
DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def example(heading: str, url_: str) -> str:
    """The first python block under `heading` in docs/integrations.md, pointed at the test service."""
    text = DOC.read_text()
    start = text.index(f"\n{heading}\n")
    block = text[text.index("```python\n", start) + len("```python\n") :]
    code = block[: block.index("\n```")]
    assert '"http://127.0.0.1:8080"' in code and '"dev-key"' in code
    return code.replace('"http://127.0.0.1:8080"', repr(url_)).replace('"dev-key"', repr(KEY_A))


def without(code: str, line: str) -> str:
    """`code` minus one line it must hold (the doc and the test stay in step)."""
    assert line + "\n" in code, line
    return code.replace(line + "\n", "", 1)


class StubChat:
    """Stands in for `ChatOpenAI(model=...)`: answers from a script; keeps every input it was given."""

    def __init__(self, *script: Any):
        self.script = list(script)
        self.inputs: list[list[Any]] = []
        self.tools: list[Any] = []

    def __call__(self, **_: Any) -> StubChat:
        return self

    def bind_tools(self, tools: list[Any]) -> StubChat:
        self.tools = list(tools)
        return self

    def invoke(self, messages: list[Any]) -> AIMessage:
        self.inputs.append(list(messages))
        step = self.script.pop(0)
        return step(messages) if callable(step) else step


async def seed_login(server, settings, redis) -> str:
    return await record_one(
        server,
        settings,
        redis,
        task="fix the flaky login test",
        outcome="success",
        agent_id="coder-1",
        user_id="alice",
        solution="freeze the clock in conftest.py",
        feedback={"reward": 1.0},
    )


async def test_doc_langchain_example(tenants, settings, redis):
    await seed_login(tenants, settings, redis)
    call = {"name": "recall_experiences", "args": {"query": "login test fails at night"}, "id": "c1"}
    chat = StubChat(
        AIMessage("", tool_calls=[call]), lambda messages: AIMessage(f"memory says: {messages[-1].content}")
    )
    code = without(example("### LangChain tools", url(tenants)), "from langchain_openai import ChatOpenAI")
    scope = {"ChatOpenAI": chat}
    await asyncio.to_thread(exec, code, scope)
    assert [t.name for t in chat.tools] == list(TOOL_NAMES)
    tool_message = chat.inputs[1][-1]
    assert isinstance(tool_message, ToolMessage) and "freeze the clock in conftest.py" in tool_message.content
    assert tool_message.artifact["results"][0]["episode"]["user_id"] == "alice"
    assert scope["reply"].content.startswith("memory says: 1 past episode(s)")


async def test_doc_langgraph_example(tenants, settings, redis):
    await seed_login(tenants, settings, redis)
    chat = StubChat(AIMessage("froze the clock with a fixture"))
    code = without(example("### LangGraph nodes", url(tenants)), "from langchain_openai import ChatOpenAI")
    await asyncio.to_thread(exec, code, {"ChatOpenAI": chat})
    [seen] = chat.inputs
    assert seen[0].id == CONTEXT_MESSAGE_ID and "freeze the clock in conftest.py" in seen[0].content
    assert seen[1].content == "The login test fails at night. Fix it."
    await drain(settings, redis)
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        recall = await memory.recall("the login test fails at night", session_id="ticket-4711")
    [hit] = recall.results
    assert hit.episode.solution == "froze the clock with a fixture" and hit.episode.agent_id == "coder-1"


async def test_doc_openai_agents_example(tenants, settings, redis):
    set_tracing_disabled(True)
    await seed_login(tenants, settings, redis)
    record = {
        "task": "fix the flaky login test at night",
        "outcome": "success",
        "reward": 1.0,
        "solution": "froze the clock with a fixture",
    }

    def briefing_then_record(call):
        [output] = [i for i in call.input if i.get("type") == "function_call_output"]
        assert "freeze the clock in conftest.py" in output["output"]  # the context reached the model
        properties = TOOLS[2].parameters["properties"]
        return [function_call("record_episode", {k: record.get(k) for k in properties}, call_id="c2")]

    model = ScriptedModel(
        [
            [
                function_call(
                    "get_context",
                    {
                        "task": "The login test fails at night.",
                        "category": None,
                        "top_k": None,
                        "max_chars": None,
                        "agent_id": None,
                        "user_id": None,
                        "session_id": None,
                    },
                    call_id="c1",
                )
            ],
            ModelStep.respond(briefing_then_record),
            [assistant_message("fixed: froze the clock")],
        ]
    )
    code = example("## OpenAI Agents SDK", url(tenants))
    assert 'model="gpt-5-mini",' in code
    await asyncio.to_thread(exec, code.replace('model="gpt-5-mini",', "model=scripted,"), {"scripted": model})
    model.assert_complete()
    await drain(settings, redis)
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        recall = await memory.recall("fix the flaky login test at night", user_id="alice", top_k=5)
    recorded = [h.episode for h in recall if h.episode.solution == "froze the clock with a fixture"]
    assert [e.agent_id for e in recorded] == ["coder-1"]  # the bound scope stamped the episode
