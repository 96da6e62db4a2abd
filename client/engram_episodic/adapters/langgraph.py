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

from engram_episodic.adapters._common import Clients, as_tag
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
    return next((i for i in reversed(range(len(messages))) if isinstance(messages[i], HumanMessage)), None)


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


def _node(
    clients: Clients,
    prepare: Callable[[Any, RunnableConfig | None], Any],
    call: Callable[[Any, Any], Any],
    finish: Callable[[Any, Any], dict[str, Any]],
    on_error: str,
    what: str,
    name: str,
) -> RunnableLambda:
    """A node for `invoke` and `ainvoke`: `prepare(state, config)` (None: no update), `call(client, it)`
    with the sync or the async client, `finish(state, answer)` the update. With `on_error="skip"` an
    Engram error is logged (`what`) and the state left unchanged; else it is raised."""

    def skipped(exc: EngramError) -> dict[str, Any]:
        if on_error == "raise":
            raise exc
        log.warning("%s: %s", what, exc)
        return {}

    def run(state: Any, config: RunnableConfig) -> dict[str, Any]:
        prepared = prepare(state, config)
        if prepared is None:
            return {}
        try:
            return finish(state, clients.run(lambda c: call(c, prepared)))
        except EngramError as exc:
            return skipped(exc)

    async def arun(state: Any, config: RunnableConfig) -> dict[str, Any]:
        prepared = prepare(state, config)
        if prepared is None:
            return {}
        try:
            return finish(state, await clients.arun(lambda c: call(c, prepared)))
        except EngramError as exc:
            return skipped(exc)

    return RunnableLambda(run, afunc=arun, name=name)


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
    clients = Clients(client, async_client, where="context_node", scope=default_scope)
    # the default scope (only agent_id, user_id, session_id: Clients checks it) and the typed options
    given = {"category": category, "top_k": top_k, "max_chars": max_chars, "half_life": half_life}
    options = cast(ContextOptions, {**clients.scope, **{k: v for k, v in given.items() if v is not None}})

    def update(state: Any, ctx: Any) -> dict[str, Any]:
        new = SystemMessage(content=ctx.prompt, id=message_id)
        placed = _placed(_messages(state, messages_key), new, message_id)
        return {messages_key: placed, context_key: ctx.prompt}

    return _node(
        clients,
        lambda state, config: _task(state, task, messages_key),
        lambda c, text: c.context(text[:MAX_TASK_CHARS], **options),
        update,
        on_error,
        "Engram context skipped",
        name,
    )


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
    clients = Clients(client, async_client, where="record_node", scope=default_scope)
    scope = clients.scope

    def episode(state: Any, config: RunnableConfig | None) -> dict[str, Any] | None:
        text = _task(state, task, messages_key)
        if text is None:
            return None
        messages = _messages(state, messages_key)
        value = ((config or {}).get("configurable") or {}).get("thread_id")
        thread = str(value) if value not in (None, "") else None
        kind = _value(category, state)
        data: dict[str, Any] = {
            "task": {"description": text, **({"category": kind} if kind is not None else {})},
            **turn_of(messages),
            **scope,
            "outcome": _get(state, outcome_key) or _value(outcome, state),
        }
        feedback = dict(_get(state, feedback_key) or {})
        score = _get(state, reward_key)
        score = score if score is not None else _value(reward, state)
        if score is not None:
            feedback["reward"] = score
        if feedback:
            data["feedback"] = feedback
        if session_from_thread and "session_id" not in scope and thread:
            data["session_id"] = as_tag(thread)  # a long thread id hashed, never cut: two threads stay apart
        data["metadata"] = {"integration": "langgraph", **({"thread_id": thread} if thread else {})}
        human = _last_human(messages)
        if human is not None and messages[human].id and messages[-1].id:
            # the same turn (a retry, a resumed run) is the same episode
            key = f"{thread or ''}\x00{messages[human].id}\x00{messages[-1].id}"
            data["episode_id"] = uuid.uuid5(_IDS, key).hex
        data.update(_value(fields, state) or {})
        return {k: v for k, v in data.items() if v is not None}

    return _node(
        clients,
        episode,
        lambda c, data: c.record(data),
        lambda state, episode_id: {episode_key: episode_id},
        on_error,
        "Engram episode not recorded",
        name,
    )
