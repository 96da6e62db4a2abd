"""LangGraph nodes around a model call: Engram context before it (`context_node`), the episode recorded
after it (`record_node`). Usage, the state keys read and why there is no `BaseStore` over Engram:
docs/integrations.md, "LangGraph nodes".
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast

try:
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        RemoveMessage,
        SystemMessage,
        ToolMessage,
    )
    from langchain_core.runnables import RunnableConfig, RunnableLambda
    from langgraph.graph.message import REMOVE_ALL_MESSAGES  # langgraph >= 0.3.23
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "engram_episodic.adapters.langgraph needs LangGraph: "
        "pip install './client[langgraph]' (engram-episodic's langgraph extra, from an Engram checkout)"
    ) from exc

from engram_episodic.adapters._common import Clients, as_tag, check_scope
from engram_episodic.client import AsyncEngram, Engram
from engram_episodic.errors import EngramError
from engram_episodic.options import ContextOptions
from engram_episodic.validation import MAX_ACTIONS, MAX_TAG_CHARS

__all__ = ["CONTEXT_MESSAGE_ID", "context_node", "record_node", "turn_of"]

log = logging.getLogger("engram_episodic.adapters.langgraph")

CONTEXT_MESSAGE_ID = "engram-context"
MAX_TASK_CHARS = 10_000  # what /v1/context accepts as `task`
_IDS = uuid.UUID("6f1c2f4e-6c1b-4d39-9a55-3c1f0d1e7a21")  # uuid5 namespace of the episode ids below

StateValue = Callable[[Any], Any] | Any


# --- reading the state -----------------------------------------------------------------------------------
def _get(state: Any, key: str) -> Any:
    """A state field: dict states (TypedDict, MessagesState) and attribute states (pydantic, dataclass)."""
    if isinstance(state, Mapping):
        return state.get(key)
    return getattr(state, key, None)


def _value(spec: StateValue, state: Any) -> Any:
    return spec(state) if callable(spec) else spec


def _text(message: BaseMessage) -> str:
    """The text of a message: its string content, or its text blocks joined (langchain-core 0.3 and 1.x)."""
    content = message.content
    if isinstance(content, str):
        return content
    parts = []
    for block in content or ():
        if isinstance(block, str):
            parts.append(block)
        elif (
            isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str)
        ):
            parts.append(block["text"])
    return "".join(parts)


def _messages(state: Any, key: str) -> list[BaseMessage]:
    value = _get(state, key) or []
    return [m for m in value if isinstance(m, BaseMessage)]


def _last_human(messages: Sequence[BaseMessage]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], HumanMessage):
            return i
    return None


def _task(state: Any, task: str | Callable[[Any], Any] | None, messages_key: str) -> str | None:
    if callable(task):
        value = task(state)
    elif isinstance(task, str):
        value = _get(state, task)
    else:
        messages = _messages(state, messages_key)
        i = _last_human(messages)
        value = _text(messages[i]) if i is not None else None
    if value is None:
        return None
    value = str(value).strip()
    return value or None


def _thread_id(config: RunnableConfig | None) -> str | None:
    value = ((config or {}).get("configurable") or {}).get("thread_id")
    return str(value) if value not in (None, "") else None


def turn_of(messages: Sequence[BaseMessage]) -> dict[str, Any]:
    """The last turn of a conversation as episode fields: `solution` and `actions`.

    The turn is every message after the last human message: the text of its last AI message is the
    solution; each tool call of its AI messages is an action (`action_type` the tool's name, `input`
    its arguments as JSON, `output` the matching tool message, `success` False when that message has
    status "error"). The last MAX_ACTIONS actions are kept. Pure; exposed for custom record nodes.
    """
    start = _last_human(messages)
    turn = list(messages[start + 1 :]) if start is not None else list(messages)
    results = {m.tool_call_id: m for m in turn if isinstance(m, ToolMessage)}
    actions: list[dict[str, Any]] = []
    solution = None
    for message in turn:
        if not isinstance(message, AIMessage):
            continue
        text = _text(message).strip()
        if text:
            solution = text
        for call in message.tool_calls or ():
            action: dict[str, Any] = {
                "action_type": as_tag(str(call.get("name") or "tool"), MAX_TAG_CHARS),
                "input": json.dumps(call.get("args") or {}, ensure_ascii=False, default=str),
            }
            result = results.get(call.get("id") or "")
            if result is not None:
                failed = getattr(result, "status", "success") == "error"
                action["output"] = _text(result) or None
                action["success"] = not failed
                if failed:
                    action["error"] = (_text(result) or "tool error")[:10_000]
            actions.append(action)
    return {"solution": solution, "actions": actions[-MAX_ACTIONS:]}


def _placed(messages: Sequence[BaseMessage], new: SystemMessage, message_id: str) -> list[BaseMessage]:
    """The `messages` update that leaves `new` right after the leading system messages, once.

    When the previous context message already sits there, replacing it by id is enough (add_messages
    replaces a message with the same id in place); otherwise the list is rebuilt with
    REMOVE_ALL_MESSAGES, so the context never lands after the question or piles up turn after turn.
    """
    others = [m for m in messages if m.id != message_id]
    lead = 0
    while lead < len(others) and isinstance(others[lead], SystemMessage):
        lead += 1
    where = next((i for i, m in enumerate(messages) if m.id == message_id), None)
    if where == lead and all(isinstance(m, SystemMessage) for m in messages[:where]):
        return [new]
    return [RemoveMessage(id=REMOVE_ALL_MESSAGES), *others[:lead], new, *others[lead:]]


def _skipped(exc: EngramError, on_error: str, what: str) -> dict[str, Any]:
    """With `on_error="skip"`, log the Engram error and change nothing; else raise it."""
    if on_error == "raise":
        raise exc
    log.warning("%s: %s", what, exc)
    return {}


# --- the nodes -------------------------------------------------------------------------------------------
def context_node(
    client: Engram | AsyncEngram,
    *,
    async_client: AsyncEngram | None = None,
    task: str | Callable[[Any], Any] | None = None,
    category: str | None = None,
    top_k: int | None = None,
    max_chars: int | None = None,
    half_life: str | float | None = None,
    messages_key: str = "messages",
    context_key: str = "engram_context",
    message_id: str = CONTEXT_MESSAGE_ID,
    on_error: Literal["raise", "skip"] = "raise",
    name: str = "engram_context",
    **default_scope: str,
) -> RunnableLambda:
    """A node that puts Engram's context for the current task into the state before the model call.

    The task is the last human message (or `task`: a state key, or a function of the state); without
    one the node changes nothing. It calls `POST /v1/context` with the default scope
    (`agent_id`, `user_id`, `session_id` keyword arguments) and `category`, `top_k`, `max_chars`,
    `half_life`, then returns a `messages` update holding the prompt section as a `SystemMessage`
    with id `message_id` placed after the leading system messages (`_placed`) and the
    prompt text under `context_key` (kept only if the state declares that key). `messages` must use
    the `add_messages` reducer (as `MessagesState` does). `on_error="skip"` logs an Engram error and
    leaves the state unchanged instead of raising. Works with `invoke` and `ainvoke`.
    """
    clients = Clients(client, async_client, where="context_node")
    scope = check_scope(default_scope, "context_node")
    # the default scope (only agent_id, user_id, session_id: check_scope) and this function's typed options
    given = {"category": category, "top_k": top_k, "max_chars": max_chars, "half_life": half_life}
    options = cast(ContextOptions, {**scope, **{k: v for k, v in given.items() if v is not None}})

    def update(state: Any, prompt: str) -> dict[str, Any]:
        new = SystemMessage(content=prompt, id=message_id)
        return {messages_key: _placed(_messages(state, messages_key), new, message_id), context_key: prompt}

    def run(state: Any) -> dict[str, Any]:
        text = _task(state, task, messages_key)
        if text is None:
            return {}
        try:
            ctx = clients.run(lambda c: c.context(text[:MAX_TASK_CHARS], **options))
        except EngramError as exc:
            return _skipped(exc, on_error, "Engram context skipped")
        return update(state, ctx.prompt)

    async def arun(state: Any) -> dict[str, Any]:
        text = _task(state, task, messages_key)
        if text is None:
            return {}
        try:
            ctx = await clients.arun(
                lambda c: c.context(text[:MAX_TASK_CHARS], **options),
                lambda c: c.context(text[:MAX_TASK_CHARS], **options),
            )
        except EngramError as exc:
            return _skipped(exc, on_error, "Engram context skipped")
        return update(state, ctx.prompt)

    return RunnableLambda(run, afunc=arun, name=name)


def _feedback_of(state: Any, feedback_key: str, reward_key: str, reward: StateValue) -> dict[str, Any]:
    """The state's `feedback_key` (a dict) with `reward` from `reward_key`, else from `reward`."""
    feedback = dict(_get(state, feedback_key) or {})
    score = _get(state, reward_key)
    score = score if score is not None else _value(reward, state)
    if score is not None:
        feedback["reward"] = score
    return feedback


def _task_fields(description: str, category: Any) -> dict[str, Any]:
    return {"description": description, **({"category": category} if category is not None else {})}


def _thread_fields(thread: str | None, session_from_thread: bool) -> dict[str, Any]:
    """A turn's `session_id` (the thread, if `session_from_thread` and there is one) and `metadata`."""
    out: dict[str, Any] = {}
    if session_from_thread and thread:
        out["session_id"] = as_tag(thread)  # a long thread id hashed, never cut: two threads stay apart
    out["metadata"] = {"integration": "langgraph", **({"thread_id": thread} if thread else {})}
    return out


def _turn_episode_id(messages: Sequence[BaseMessage], thread: str | None) -> str | None:
    """The episode id of a turn, from the thread and its message ids (None when they have none)."""
    human = _last_human(messages)
    if human is not None and messages[human].id and messages[-1].id:
        key = f"{thread or ''}\x00{messages[human].id}\x00{messages[-1].id}"
        return uuid.uuid5(_IDS, key).hex
    return None


def record_node(
    client: Engram | AsyncEngram,
    *,
    async_client: AsyncEngram | None = None,
    task: str | Callable[[Any], Any] | None = None,
    outcome: StateValue = "success",
    reward: StateValue = None,
    category: StateValue = None,
    fields: StateValue = None,
    outcome_key: str = "outcome",
    reward_key: str = "reward",
    feedback_key: str = "feedback",
    messages_key: str = "messages",
    episode_key: str = "engram_episode_id",
    session_from_thread: bool = True,
    on_error: Literal["raise", "skip"] = "raise",
    name: str = "engram_record",
    **default_scope: str,
) -> RunnableLambda:
    """A node that records the turn that just ended as one finished Engram episode.

    Episode fields: `task` the last human message (or `task`: a state key or a function of the state;
    without one nothing is recorded), `solution` and `actions` from the turn (`turn_of`), `outcome`
    the state's `outcome_key` if set, else `outcome` (a value or a function of the state; default
    "success"), `feedback` the state's `feedback_key` (a dict) with `reward` from `reward_key` or
    `reward`, the default scope (`agent_id`, `user_id`, `session_id` keyword arguments; without a
    `session_id`, the LangGraph `thread_id` when `session_from_thread`: one the service would refuse as
    an id, such as one over 256 characters, becomes "sha256:" + the hex SHA-256 of its UTF-8, see
    `_common.as_tag`; `metadata.thread_id` keeps it whole), `category`, and any
    `fields` (a mapping or a function of the state returning one: importance, strategy_used, ...),
    which win over the rest. The episode id is derived from the thread and the turn's message ids, so
    a node that runs again for the same turn (a retry, a resumed run) re-publishes the same episode
    rather than a copy. Returns `{episode_key: episode_id}` (kept only if the state declares the key).
    `on_error="skip"` logs an Engram error instead of raising. Works with `invoke` and `ainvoke`.
    """
    clients = Clients(client, async_client, where="record_node")
    scope = check_scope(default_scope, "record_node")

    def episode(state: Any, config: RunnableConfig | None) -> dict[str, Any] | None:
        text = _task(state, task, messages_key)
        if text is None:
            return None
        messages = _messages(state, messages_key)
        thread = _thread_id(config)
        data: dict[str, Any] = {
            "task": _task_fields(text, _value(category, state)),
            **turn_of(messages),
            **scope,
        }
        data["outcome"] = _get(state, outcome_key) or _value(outcome, state)
        feedback = _feedback_of(state, feedback_key, reward_key, reward)
        if feedback:
            data["feedback"] = feedback
        data.update(_thread_fields(thread, session_from_thread and "session_id" not in scope))
        episode_id = _turn_episode_id(messages, thread)
        if episode_id is not None:
            data["episode_id"] = episode_id
        data.update(_value(fields, state) or {})
        return {k: v for k, v in data.items() if v is not None}

    def run(state: Any, config: RunnableConfig) -> dict[str, Any]:
        data = episode(state, config)
        if data is None:
            return {}
        try:
            return {episode_key: clients.run(lambda c: c.record(data))}
        except EngramError as exc:
            return _skipped(exc, on_error, "Engram episode not recorded")

    async def arun(state: Any, config: RunnableConfig) -> dict[str, Any]:
        data = episode(state, config)
        if data is None:
            return {}
        try:
            return {episode_key: await clients.arun(lambda c: c.record(data), lambda c: c.record(data))}
        except EngramError as exc:
            return _skipped(exc, on_error, "Engram episode not recorded")

    return RunnableLambda(run, afunc=arun, name=name)
