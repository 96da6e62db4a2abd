"""Engram's tools for models: one definition, rendered for OpenAI, Anthropic and MCP, executed by `dispatch`.

The tools' names, descriptions and argument schemas are `engram_episodic/tools.json` (the TypeScript
client is generated from it too); this module adds each tool's plan (arguments → requests of
`engram_episodic.client.Calls`). Arguments are checked against the schema before anything is sent
(`ToolArgumentError` names every bad field; a 422 of the service is the same error, in the tool's field
names); other failures propagate as the client raised them. A bound scope (`Toolset(client,
agent_id=..., user_id=...)`) is used whenever the model passes none; a bound `session_id` only stamps
recorded episodes. The namespace comes from the client's API key, never from a tool argument. Usage:
docs/integrations.md, "Plain function calling".
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

from engram_episodic.calls import joined
from engram_episodic.client import AsyncEngram, Call, Calls, Engram
from engram_episodic.errors import ApiError, EngramError, InvalidEpisode
from engram_episodic.timeutil import parse_instant
from engram_episodic.tool_results import (
    ToolArgumentError,
    ToolError,
    ToolResult,
    UnknownTool,
    error_result,
    render_context,
    render_curve,
    render_facts,
    render_forgotten,
    render_recall,
    render_recorded,
    render_skills,
    render_suggestion,
)
from engram_episodic.validation import (
    MAX_ID_CHARS,
    MAX_TAG_CHARS,
    Collector,
    check_tag_value,
    json_kind,
    unicode_problem,
)
from engram_episodic.validation import _join as join

# The tools' names, descriptions, argument schemas and MCP hints: one data file, read by this module and
# written into the TypeScript client (client-ts/scripts/gen_tools.py), so the two clients cannot drift.
_DATA: dict[str, Any] = json.loads(resources.files(__package__).joinpath("tools.json").read_text("utf-8"))

Format = Literal["openai", "openai-responses", "anthropic"]
FORMATS: tuple[str, ...] = ("openai", "openai-responses", "anthropic")


@dataclass(frozen=True, slots=True)
class Plan:
    """A validated tool call as requests (no I/O yet): send `calls` in order, give the answers to `render`.

    `fields` maps the service's field names (`query`, `feedback.reward`) to the tool's arguments, so a
    422 names what the model sent. `missing` is the reason used when the service answers 404, keyed by
    the argument that named the missing thing (forget_episode's `episode_id`).
    """

    tool: str
    calls: tuple[Call[Any], ...]
    render: Callable[[Sequence[Any]], ToolResult]
    fields: Mapping[str, str] = field(default_factory=dict)
    missing: tuple[str, str] | None = None
    ordered: bool = False
    """The calls must go one after another (the parts of one large episode); else they may go at once."""

    @contextlib.contextmanager
    def refusals(self) -> Iterator[None]:
        """Around sending `calls`: a 422/413 (and a 404 when `missing`) leaves as ToolArgumentError (from
        the ApiError); any other ApiError as it is."""
        try:
            yield
        except ApiError as exc:
            if exc.status == 422 and exc.errors:
                errors = [(_tool_field(f, self.fields), why) for f, why in exc.errors]
            elif exc.status == 413:
                errors = [("arguments", "are too large for the memory service (413)")]
            elif exc.status == 404 and self.missing is not None:
                errors = [self.missing]
            else:
                raise
            raise ToolArgumentError(self.tool, errors) from exc


def _tool_field(path: str, fields: Mapping[str, str]) -> str:
    """`feedback.reward` → `reward`; `actions[3].input` stays; unknown names are kept as the service said."""
    for server, tool in sorted(fields.items(), key=lambda kv: -len(kv[0])):
        if path == server or path.startswith(server + ".") or path.startswith(server + "["):
            return tool + path[len(server) :] if server != tool else path
    return path


# --- the tools -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: `name`, `description` (for a model), `parameters` (JSON Schema of its arguments) and
    hints for MCP clients (`read_only`, `destructive`, `idempotent`). `plan` builds its requests."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    plan: Callable[[dict[str, Any]], Plan] = field(repr=False, compare=False)
    read_only: bool = True
    destructive: bool = False
    idempotent: bool = True

    def definition(self, format: Format = "openai") -> dict[str, Any]:
        """This tool for one API (see `tools`); a fresh copy each call."""
        params = copy.deepcopy(dict(self.parameters))
        if format == "openai":
            return {
                "type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": params},
            }
        if format == "openai-responses":
            return {
                "type": "function",
                "name": self.name,
                "description": self.description,
                "parameters": params,
                "strict": False,
            }
        if format == "anthropic":
            return {"name": self.name, "description": self.description, "input_schema": params}
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")


def _except(args: Mapping[str, Any], *names: str) -> Any:
    """The arguments but `names`: the options of the tool's call (`check_arguments` dropped unknown and
    null ones), typed as the call's options TypedDict."""
    return {k: v for k, v in args.items() if k not in names}


def _plan_recall(args: dict[str, Any]) -> Plan:
    options = _except(args, "query", "min_reward")
    if args.get("min_reward") is not None:
        options["reward"] = {"gte": args["min_reward"]}
    return Plan(
        "recall_experiences",
        (Calls.recall(args["query"], **options),),
        lambda r: render_recall(r[0], args["query"]),
        fields={"reward.gte": "min_reward", "reward": "min_reward"},
    )


# the arguments that are not an episode field of the same name: where each goes in the episode
_RECORD_ARGS = {
    "task": "task.description",
    "category": "task.category",
    "complexity": "task.complexity",
    "reward": "feedback.reward",
    "feedback": "feedback.message",
    "tests_passed": "feedback.tests_passed",
    "tests_total": "feedback.tests_total",
    "strategy": "strategy_used",
}
_RECORD_FIELDS = {"task": "task", **{path: arg for arg, path in _RECORD_ARGS.items()}}


def _plan_record(args: dict[str, Any]) -> Plan:
    fields: dict[str, Any] = {}
    for arg, value in args.items():
        head, _, leaf = _RECORD_ARGS.get(arg, arg).partition(".")
        if leaf:
            fields.setdefault(head, {})[leaf] = value
        else:
            fields[head] = value
    try:  # an episode larger than one request goes in parts, as `record` sends it
        episode, calls = Calls.record_parts(None, fields)
    except InvalidEpisode as exc:
        raise ToolArgumentError(
            "record_episode", [(_tool_field(f, _RECORD_FIELDS), why) for f, why in exc.errors]
        ) from exc
    return Plan(
        "record_episode",
        tuple(calls),
        lambda r: render_recorded(joined(list(r)), episode.episode_id, episode.outcome),
        fields=_RECORD_FIELDS,
        ordered=True,
    )


def _plan_suggest(args: dict[str, Any]) -> Plan:
    # the category picks strategy's skill profile; suggest would filter by it, and a category the model
    # guessed then found nothing while strategy, on every similar episode, found evidence
    calls = (
        Calls.suggest(args["task"], **_except(args, "task", "category", "complexity")),
        Calls.strategy(args["task"], **_except(args, "task")),
    )
    return Plan("suggest_approach", calls, lambda r: render_suggestion(r[0], r[1]))


FORGET_WAIT = 5.0
"""Seconds forget_episode waits for the erase (`DELETE /v1/episodes/{id}?wait=`), so its answer can say
the episode is gone from every read; past it the answer says the erase is accepted, not done."""
_PLANS: dict[str, Callable[[dict[str, Any]], Plan]] = {
    "recall_experiences": _plan_recall,
    "get_context": lambda a: Plan(
        "get_context", (Calls.context(a["task"], **_except(a, "task")),), lambda r: render_context(r[0])
    ),
    "record_episode": _plan_record,
    "suggest_approach": _plan_suggest,
    "search_facts": lambda a: Plan(
        "search_facts",
        (Calls.search_facts(a.get("query"), **_except(a, "query")),),
        lambda r: render_facts(r[0], a.get("query")),
    ),
    "forget_episode": lambda a: Plan(
        "forget_episode",
        (Calls.forget_episode(a["episode_id"], wait=FORGET_WAIT),),
        lambda r: render_forgotten(r[0]),
        missing=(
            "episode_id",
            "no episode with this id in this memory (a forgotten one would answer already forgotten)",
        ),
    ),
    "get_skills": lambda a: Plan("get_skills", (Calls.skills(**_except(a)),), lambda r: render_skills(r[0])),
    "get_learning_curve": lambda a: Plan(
        "get_learning_curve", (Calls.learning_curve(**_except(a)),), lambda r: render_curve(r[0])
    ),
}
TOOLS: tuple[ToolSpec, ...] = tuple(ToolSpec(**t, plan=_PLANS[t["name"]]) for t in _DATA["tools"])
TOOL_NAMES: tuple[str, ...] = tuple(t.name for t in TOOLS)
_BY_NAME = {t.name: t for t in TOOLS}
RECORD, SUGGEST = _BY_NAME["record_episode"], _BY_NAME["suggest_approach"]
# Arguments checked with the service's TAG rule (no control characters, no padding) besides the schema.
_TAG_ARGS = frozenset(_DATA["tag_arguments"])


def get_tool(name: str) -> ToolSpec:
    """The tool called `name`; UnknownTool otherwise."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise UnknownTool(name, TOOL_NAMES) from None


def tools(format: Format = "openai", *, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The tool definitions for one API, in `TOOLS` order (or the order of `names`).

    - `"openai"`: Chat Completions `tools=` items,
      `{"type": "function", "function": {"name", "description", "parameters"}}` (no `strict`: strict
      mode would require every argument, and the optional ones are optional);
    - `"openai-responses"`: Responses API items, `{"type": "function", "name", "description",
      "parameters", "strict": False}`;
    - `"anthropic"`: Messages API `tools=` items, `{"name", "description", "input_schema"}`.

    Every `parameters` / `input_schema` is a JSON Schema object with `additionalProperties: false`.
    Raises ValueError for another format, UnknownTool for a name that is not a tool.
    """
    chosen = TOOLS if names is None else tuple(get_tool(n) for n in names)
    return [t.definition(format) for t in chosen]


# --- argument checking -------------------------------------------------------------------------------------
def parse_arguments(tool: str, arguments: Mapping[str, Any] | str | bytes | None) -> dict[str, Any]:
    """A model's arguments as a dict: a mapping as it is, a JSON object string (or its UTF-8 bytes)
    decoded, None or "" → {}. Raises ToolArgumentError (`arguments`) for bytes that are not UTF-8 and for
    JSON that does not decode to an object."""
    if arguments is None:
        return {}
    if isinstance(arguments, bytes | bytearray):
        try:  # strictly: a replacement character would silently alter an id
            arguments = arguments.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolArgumentError(tool, [("arguments", f"are not UTF-8 text (byte {exc.start})")]) from None
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            raise ToolArgumentError(tool, [("arguments", f"are not valid JSON ({exc})")]) from None
    if not isinstance(arguments, Mapping):
        raise ToolArgumentError(tool, [("arguments", f"must be a JSON object, not {json_kind(arguments)}")])
    return dict(arguments)


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _check(schema: Mapping[str, Any], value: Any, path: str, errs: Collector) -> Any:
    """Check `value` against `schema`, the subset of JSON Schema tools.json uses (objects without extra
    keys, required keys, types, enums, string lengths, date-time strings, number bounds, list sizes,
    unique items), adding every problem to `errs` as (path, reason) in words a model can act on; returns
    the value normalised (integral floats of integer fields as ints, nulls of optional properties
    dropped), or None where it failed. `path` names `value` in the messages ("" for the arguments)."""
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        errs.add(path, "must be one of " + ", ".join(map(str, schema["enum"])))
        return None
    if kind == "object":
        return _check_object(schema, value, path, errs)
    if kind == "array":
        return _check_array(schema, value, path, errs)
    if kind == "string":
        return _check_string(schema, value, path, errs)
    if kind in ("integer", "number"):
        return _check_number(schema, value, path, errs, integer=kind == "integer")
    if kind == "boolean":
        if not isinstance(value, bool):
            errs.add(path, f"must be true or false, not {_json_type(value)}")
            return None
        return value
    return value


def _check_object(schema: Mapping[str, Any], value: Any, path: str, errs: Collector) -> dict[str, Any] | None:
    if not isinstance(value, Mapping):
        errs.add(path, f"must be an object, not {_json_type(value)}")
        return None
    props: Mapping[str, Any] = schema.get("properties", {})
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key not in props:
            errs.add(join(path, str(key)), "is not a known field")
        elif item is not None:  # null for an optional argument means "not given"
            checked = _check(props[key], item, join(path, key), errs)
            if key in _TAG_ARGS and isinstance(checked, str):  # the service's rule for TAG values too
                max_chars = MAX_ID_CHARS if key.endswith("_id") else MAX_TAG_CHARS
                checked = check_tag_value(checked, join(path, key), errs, max_chars=max_chars, required=True)
            if checked is not None:
                out[key] = checked
    for key in schema.get("required", ()):
        if value.get(key) is None:
            errs.add(join(path, key), "is required")
    return out


def _check_array(schema: Mapping[str, Any], value: Any, path: str, errs: Collector) -> list[Any] | None:
    if not isinstance(value, list | tuple):
        errs.add(path, f"must be a list, not {_json_type(value)}")
        return None
    if len(value) < schema.get("minItems", 0):
        errs.add(path, f"must hold at least {schema['minItems']} item(s)")
        return None
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errs.add(path, f"must hold at most {schema['maxItems']} items")
        return None
    items = [_check(schema.get("items", {}), v, join(path, i), errs) for i, v in enumerate(value)]
    if schema.get("uniqueItems") and len({json.dumps(v, sort_keys=True, default=repr) for v in value}) < len(
        value
    ):
        errs.add(path, "must not repeat a value")
        return None
    return items


def _check_string(schema: Mapping[str, Any], value: Any, path: str, errs: Collector) -> str | None:
    if not isinstance(value, str):
        errs.add(path, f"must be a string, not {_json_type(value)}")
        return None
    if len(value) < schema.get("minLength", 0):
        errs.add(path, "must not be empty")
        return None
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errs.add(path, f"must be at most {schema['maxLength']} characters (got {len(value)})")
        return None
    if problem := unicode_problem(value):  # JSON's "\ud800" decodes, but no request can carry it
        errs.add(path, problem)
        return None
    if schema.get("format") == "date-time":
        try:
            parse_instant(value)
        except ValueError as exc:
            errs.add(path, str(exc))
            return None
    return value


def _check_number(
    schema: Mapping[str, Any], value: Any, path: str, errs: Collector, *, integer: bool
) -> int | float | None:
    lo, hi = schema.get("minimum", -math.inf), schema.get("maximum", math.inf)
    what = "an integer" if integer else "a number"
    bounds = f" between {_fmt(lo)} and {_fmt(hi)}" if math.isfinite(lo) and math.isfinite(hi) else ""
    ok = not isinstance(value, bool) and isinstance(value, int | float)
    if ok and integer and isinstance(value, float):
        ok = math.isfinite(value) and value.is_integer()
    if ok and not math.isfinite(value):
        errs.add(path, "must be finite (NaN and infinity are rejected)")
        return None
    if not ok or not lo <= value <= hi:
        errs.add(path, f"must be {what}{bounds}" + ("" if ok else f", not {_json_type(value)}"))
        return None
    return int(value) if integer else value


def _json_type(value: Any) -> str:
    """`validation.json_kind`, a number with its value (a model reads which number it sent)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"the number {value!r}"[:60]
    return json_kind(value)


def check_arguments(spec: ToolSpec, arguments: Mapping[str, Any] | str | bytes | None) -> dict[str, Any]:
    """The arguments of a call to `spec`, checked against its schema and normalised; ToolArgumentError
    names every bad field (unknown fields, missing required ones, types, enums, bounds, instants, ids).

    Beyond the schema, ids, categories, strategies and action types follow the service's rule for tag
    values (no control characters, no leading or trailing whitespace). A null optional argument counts
    as not given.
    """
    raw = parse_arguments(spec.name, arguments)
    errs = Collector()
    checked = _check(spec.parameters, raw, "", errs)
    if errs.errors:
        raise ToolArgumentError(spec.name, errs.errors)
    return checked


def _scope(agent_id: str | None, user_id: str | None, session_id: str | None) -> dict[str, str | None]:
    errs = Collector()
    for name, value in (("agent_id", agent_id), ("user_id", user_id), ("session_id", session_id)):
        if value is not None:
            check_tag_value(value, name, errs, max_chars=MAX_ID_CHARS, required=True)
    if errs.errors:
        raise ValueError("bad scope: " + "; ".join(f"{f}: {why}" for f, why in errs.errors))
    return {"agent_id": agent_id, "user_id": user_id, "session_id": session_id}


def prepare(
    name: str,
    arguments: Mapping[str, Any] | str | bytes | None,
    *,
    agent_id: str | None = None,
    user_id: str | None = None,
    session_id: str | None = None,
) -> Plan:
    """A model's tool call as a `Plan` (requests not yet sent): UnknownTool or ToolArgumentError if it
    cannot be made, ValueError for a bad scope id. `agent_id` / `user_id` / `session_id` are the bound
    scope (see the module docstring)."""
    spec = get_tool(name)
    args = check_arguments(spec, arguments)
    scope = _scope(agent_id, user_id, session_id)
    if name != "record_episode":  # a bound session only stamps recorded episodes
        del scope["session_id"]
    return spec.plan({**{k: v for k, v in scope.items() if v}, **args})


def dispatch(
    client: Engram,
    name: str,
    arguments: Mapping[str, Any] | str | bytes | None = None,
    *,
    agent_id: str | None = None,
    user_id: str | None = None,
    session_id: str | None = None,
    errors: Literal["raise", "result"] = "raise",
) -> ToolResult:
    """Execute a model's call of tool `name` with the sync client; returns a ToolResult.

    `arguments` is a dict or its JSON string (as models send them). Raises UnknownTool,
    ToolArgumentError (bad arguments, checked before anything is sent, or a 422 of the service, with the
    tool's field names), and the client's errors (ConnectionFailed, Unauthorized, RateLimited, ...).
    With `errors="result"` any EngramError is returned as `error_result(exc)` instead (is_error=True).
    Raises ValueError for a bad scope id.
    """
    toolset = Toolset(client, agent_id=agent_id, user_id=user_id, session_id=session_id)
    return toolset.dispatch(name, arguments, errors=errors)


async def adispatch(
    client: AsyncEngram,
    name: str,
    arguments: Mapping[str, Any] | str | bytes | None = None,
    *,
    agent_id: str | None = None,
    user_id: str | None = None,
    session_id: str | None = None,
    errors: Literal["raise", "result"] = "raise",
) -> ToolResult:
    """`dispatch` with the async client (suggest_approach's two requests run concurrently)."""
    toolset = Toolset(client, agent_id=agent_id, user_id=user_id, session_id=session_id)
    return await toolset.adispatch(name, arguments, errors=errors)


class Toolset:
    """Engram's tools bound to one client and, optionally, a default scope and a subset of tools.

    `client` is an `Engram` (use `dispatch`) or an `AsyncEngram` (use `adispatch`); `agent_id`,
    `user_id`, `session_id` are used when the model passes none (a bound `session_id` only stamps
    recorded episodes); `names` limits the tools offered and accepted (e.g. without forget_episode).
    Raises ValueError for a bad scope id, UnknownTool for a bad name.
    """

    def __init__(
        self,
        client: Engram | AsyncEngram,
        *,
        agent_id: str | None = None,
        user_id: str | None = None,
        session_id: str | None = None,
        names: Iterable[str] | None = None,
    ):
        self.client = client
        self.scope = _scope(agent_id, user_id, session_id)
        self.tools: tuple[ToolSpec, ...] = TOOLS if names is None else tuple(get_tool(n) for n in names)
        self.names = tuple(t.name for t in self.tools)

    def definitions(self, format: Format = "openai") -> list[dict[str, Any]]:
        """This toolset's definitions for one API (see `tools`)."""
        return tools(format, names=self.names)

    def prepare(self, name: str, arguments: Mapping[str, Any] | str | bytes | None = None) -> Plan:
        """The call as requests with this toolset's scope (see the module-level `prepare`); UnknownTool
        for a tool this toolset does not have."""
        if name not in self.names:
            raise UnknownTool(name, self.names)
        return prepare(name, arguments, **self.scope)

    def dispatch(
        self,
        name: str,
        arguments: Mapping[str, Any] | str | bytes | None = None,
        *,
        errors: Literal["raise", "result"] = "raise",
    ) -> ToolResult:
        """Execute a tool call with the sync client (see the module-level `dispatch`)."""
        if not isinstance(self.client, Engram):
            raise TypeError("dispatch needs an Engram client; use adispatch with an AsyncEngram")
        try:
            plan = self.prepare(name, arguments)
            with plan.refusals():
                return plan.render([self.client.call(c) for c in plan.calls])
        except EngramError as exc:
            if errors == "raise":
                raise
            return error_result(exc)

    async def adispatch(
        self,
        name: str,
        arguments: Mapping[str, Any] | str | bytes | None = None,
        *,
        errors: Literal["raise", "result"] = "raise",
    ) -> ToolResult:
        """Execute a tool call with the async client, its requests concurrently unless `plan.ordered`
        (see the module-level `dispatch`)."""
        if not isinstance(self.client, AsyncEngram):
            raise TypeError("adispatch needs an AsyncEngram client; use dispatch with an Engram")
        client = self.client
        try:
            plan = self.prepare(name, arguments)
            with plan.refusals():
                if plan.ordered:
                    answers = [await client.call(c) for c in plan.calls]
                else:
                    answers = list(await asyncio.gather(*(client.call(c) for c in plan.calls)))
            return plan.render(answers)
        except EngramError as exc:
            if errors == "raise":
                raise
            return error_result(exc)


__all__ = [
    "FORMATS",
    "TOOLS",
    "TOOL_NAMES",
    "Plan",
    "ToolArgumentError",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "Toolset",
    "UnknownTool",
    "adispatch",
    "check_arguments",
    "dispatch",
    "error_result",
    "get_tool",
    "prepare",
    "tools",
]
