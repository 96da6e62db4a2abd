"""Engram's tools for models: one definition, rendered for OpenAI, Anthropic and MCP, executed by `dispatch`.

    from engram_episodic import Engram
    from engram_episodic.tools import Toolset

    with Engram("http://127.0.0.1:8080", api_key="...") as memory:
        toolset = Toolset(memory, agent_id="coder-1", user_id="alice")
        definitions = toolset.definitions("openai")        # pass as `tools=` to the model
        ...                                                # the model answers with a tool call
        result = toolset.dispatch(call.name, call.arguments)   # arguments: a dict or its JSON string
        result.text   # compact text for the model;  result.data: the full JSON answer

Each tool (`TOOLS`) has a `name`, a `description` written for a model (when to call it, what it
returns) and `parameters`, a JSON Schema of its arguments (`additionalProperties: false`, the bounds the
query service enforces). `tools(format)` renders them for OpenAI Chat Completions, the OpenAI Responses
API or Anthropic tool use; the MCP server (`engram_episodic.mcp_server`) serves the same.

Executing a tool call: the arguments are checked against the schema first (`ToolArgumentError` names
every bad field and sends nothing), then turned into the requests of `engram_episodic.client.Calls`, sent
by `Engram` (`dispatch`) or `AsyncEngram` (`adispatch`) and rendered into a `ToolResult`. A 422 of the
service is the same `ToolArgumentError`, in the tool's field names (`feedback.reward` is `reward`).
Other failures (`ConnectionFailed`, `Unauthorized`, `RateLimited`, ...) propagate as the client raised
them; `error_result(exc)` renders any of them for a model (`errors="result"` does it for you).

Scope: `agent_id` / `user_id` can be bound once (`Toolset(client, agent_id=..., user_id=...)`); a bound
value is used whenever the model does not pass one. A bound `session_id` is stamped on recorded episodes
only: reads are not narrowed to one session unless the model asks. Tenancy is the service's: the
namespace comes from the client's API key, never from a tool argument.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, cast

from engram_episodic.calls import joined
from engram_episodic.client import (
    AsyncEngram,
    Call,
    Calls,
    ContextOptions,
    CurveOptions,
    Engram,
    FactSearchOptions,
    RecallOptions,
    SkillsOptions,
    StrategyOptions,
    SuggestOptions,
)
from engram_episodic.errors import (
    ApiError,
    ConnectionFailed,
    EngramError,
    InvalidEpisode,
    RateLimited,
    ServiceUnavailable,
    Unauthorized,
)
from engram_episodic.events import OUTCOMES
from engram_episodic.timeutil import parse_instant
from engram_episodic.types import (
    Context,
    Fact,
    Forgetting,
    IngestResult,
    LearningCurve,
    Recall,
    Skills,
    StrategyChoice,
    Suggestion,
)
from engram_episodic.validation import (
    MAX_ACTIONS,
    MAX_ID_CHARS,
    MAX_TAG_CHARS,
    MAX_TEXT_CHARS,
    Collector,
    check_tag_value,
    json_kind,
    unicode_problem,
)

# Bounds of the query service's request models (services/query/models.py, facts_routes.py), which this
# package cannot import; tests/unit/test_tools.py checks them against the server's schemas.
MAX_TOP_K = 100
MAX_QUERY_CHARS = 10_000
MAX_REWARD = 1e6  # validation.parse_feedback
MAX_COUNT = 10**9  # tests_passed, tests_total, iterations
MAX_RANGE = 1e12  # a recall range bound (models.Finite)
CONTEXT_CHARS = (200, 200_000)
CURVE_WINDOW = (1, 1000)
CURVE_LIMIT = (1, 10_000)
FACT_KINDS: tuple[str, ...] = ("strategy", "failure_pattern", "best_practice", "preference")
RECALL_MODES: tuple[str, ...] = ("hybrid", "vector", "keyword")
STRATEGIES: tuple[str, ...] = ("conservative", "exploratory", "defensive", "iterative", "example_driven")

Format = Literal["openai", "openai-responses", "anthropic"]
FORMATS: tuple[str, ...] = ("openai", "openai-responses", "anthropic")


# --- errors and results ------------------------------------------------------------------------------
class ToolError(EngramError):
    """A tool call that cannot be executed as asked (base of `ToolArgumentError` and `UnknownTool`)."""


class UnknownTool(ToolError, LookupError):
    """The model named a tool this toolset does not have. `name`, `available` (the names it has)."""

    def __init__(self, name: str, available: Sequence[str]):
        self.name, self.available = name, tuple(available)
        super().__init__(f"unknown tool {str(name)[:80]!r}; available: {', '.join(self.available)}")


class ToolArgumentError(ToolError, ValueError):
    """The arguments of a tool call are invalid. Nothing was sent, or the service refused them (422).

    `tool` is the tool's name; `errors` a tuple of `(field, reason)` pairs naming the tool's own
    arguments (`actions[2].action_type`, `reward`), every bad one at once; `field` is the first field.
    `str(err)` is `"record_episode: outcome: must be one of success, partial, failure, abandoned"`.
    """

    def __init__(self, tool: str, errors: Iterable[tuple[str, str]]):
        self.tool = tool
        self.errors = tuple(errors) or (("arguments", "are invalid"),)
        self.field = self.errors[0][0]
        super().__init__(f"{tool}: " + "; ".join(f"{f}: {why}" for f, why in self.errors))


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool call gives back: `text`, compact and written for a model to read; `data`, the full
    JSON answer (a dict) for programs and MCP structured content; `is_error`, True for `error_result`."""

    text: str
    data: dict[str, Any]
    is_error: bool = False


Scope = Mapping[str, str | None]


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

    def failure(self, exc: ApiError) -> EngramError:
        """The error to raise for a refused call: ToolArgumentError for 422/413 (and a 404 `missing`)."""
        if exc.status == 422 and exc.errors:
            return ToolArgumentError(self.tool, [(_tool_field(f, self.fields), why) for f, why in exc.errors])
        if exc.status == 413:
            return ToolArgumentError(self.tool, [("arguments", "are too large for the memory service (413)")])
        if exc.status == 404 and self.missing is not None:
            return ToolArgumentError(self.tool, [self.missing])
        return exc

    @contextlib.contextmanager
    def refusals(self) -> Iterator[None]:
        """Around sending `calls`: an ApiError leaving the block is raised as `failure(exc)` (from it)."""
        try:
            yield
        except ApiError as exc:
            mapped = self.failure(exc)
            if mapped is exc:
                raise
            raise mapped from exc


def _tool_field(path: str, fields: Mapping[str, str]) -> str:
    """`feedback.reward` → `reward`; `actions[3].input` stays; unknown names are kept as the service said."""
    for server, tool in sorted(fields.items(), key=lambda kv: -len(kv[0])):
        if path == server or path.startswith(server + ".") or path.startswith(server + "["):
            return tool + path[len(server) :] if server != tool else path
    return path


# --- schema builders -------------------------------------------------------------------------------------
def _string(description: str, *, max_length: int = MAX_TEXT_CHARS, min_length: int = 1) -> dict[str, Any]:
    return {"type": "string", "description": description, "minLength": min_length, "maxLength": max_length}


def _tag(description: str) -> dict[str, Any]:
    return _string(description, max_length=MAX_TAG_CHARS)


def _integer(description: str, lo: int, hi: int) -> dict[str, Any]:
    return {"type": "integer", "description": description, "minimum": lo, "maximum": hi}


def _number(description: str, lo: float, hi: float) -> dict[str, Any]:
    return {"type": "number", "description": description, "minimum": lo, "maximum": hi}


def _instant(description: str) -> dict[str, Any]:
    return {
        "type": "string",
        "format": "date-time",
        "description": description + " ISO 8601 with an offset, e.g. 2026-01-31T00:00:00Z.",
    }


def _object(properties: Mapping[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
    }


def _ids(*names: str, reads: bool = True) -> dict[str, Any]:
    text = {
        "agent_id": "Only episodes of this agent. Omit to use the agent this tool is bound to, if any."
        if reads
        else "The agent that did the task. Omit to use the bound agent, if any.",
        "user_id": "Only episodes for this user. Omit to use the bound user, if any."
        if reads
        else "The user the task was done for. Omit to use the bound user, if any.",
        "session_id": "Only episodes of this session (conversation)."
        if reads
        else "The session (conversation) it happened in. Omit to use the bound session.",
    }
    return {n: _string(text[n], max_length=MAX_ID_CHARS) for n in names}


# Arguments checked with the service's TAG rule (no control characters, no padding) besides the schema.
_TAG_ARGS = frozenset(
    {"agent_id", "user_id", "session_id", "episode_id", "category", "strategy", "action_type"}
)

_OUTCOME = {"type": "string", "enum": list(OUTCOMES)}
_ACTION = _object(
    {
        "action_type": _tag("What kind of step: run_tests, edit, search, shell, api_call, ..."),
        "input": _string("What the step was given (a command, a query, a diff)."),
        "output": _string("What it produced (shortened)."),
        "success": {"type": "boolean", "description": "Whether the step worked."},
        "error": _string("The error it raised, if any."),
    },
    required=["action_type"],
)


# --- the tools -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: `name`, `description` (for a model), `parameters` (JSON Schema of its arguments) and
    hints for MCP clients (`read_only`, `destructive`, `idempotent`). `plan` builds its requests."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    plan: Callable[[dict[str, Any], Scope], Plan] = field(repr=False, compare=False)
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


def _scoped(args: dict[str, Any], scope: Scope, keys: Sequence[str]) -> dict[str, Any]:
    out = dict(args)
    for key in keys:
        if out.get(key) is None and scope.get(key):
            out[key] = scope[key]
    return out


def _except(args: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The arguments but `names`: the options of the tool's call (`check_arguments` dropped unknown and
    null ones), cast by each plan to its options TypedDict."""
    return {k: v for k, v in args.items() if k not in names}


# recall_experiences ----------------------------------------------------------------------------------------
def _plan_recall(args: dict[str, Any], scope: Scope) -> Plan:
    args = _scoped(args, scope, ("agent_id", "user_id"))
    options = _except(args, "query", "min_reward")
    if args.get("min_reward") is not None:
        options["reward"] = {"gte": args["min_reward"]}
    return Plan(
        "recall_experiences",
        (Calls.recall(args["query"], cast(RecallOptions, options)),),
        lambda r: render_recall(r[0], args["query"]),
        fields={"reward.gte": "min_reward", "reward": "min_reward"},
    )


RECALL = ToolSpec(
    name="recall_experiences",
    description=(
        "Search long-term episodic memory for past attempts at tasks like this one, to reuse what worked "
        "and avoid what failed. Call it before starting a non-trivial task, and again after a failure. "
        "Returns up to top_k past episodes, best first (ranked by similarity, recency, reward and "
        "outcome), each with its outcome, reward, when it happened, the strategy used, a snippet of its "
        "solution and feedback, and its episode_id; then the strategies that worked. An empty list means "
        "nothing similar is stored yet."
    ),
    parameters=_object(
        {
            "query": _string(
                "The task or problem to find experiences for, in plain words.", max_length=MAX_QUERY_CHARS
            ),
            "top_k": _integer("How many episodes to return (default 3).", 1, MAX_TOP_K),
            "outcome": {
                "type": "array",
                "items": _OUTCOME,
                "minItems": 1,
                "maxItems": len(OUTCOMES),
                "uniqueItems": True,
                "description": 'Only these outcomes, e.g. ["success"] for worked examples or ["failure"] '
                "for pitfalls.",
            },
            "min_reward": _number(
                "Only episodes whose reward is at least this (rewards are usually 0..1).",
                -MAX_RANGE,
                MAX_RANGE,
            ),
            "category": _tag(
                "Only this task category: code_generation, debugging, refactoring, testing, "
                "architecture, or a custom one."
            ),
            "strategy": _tag("Only episodes that used this strategy."),
            "since": _instant("Only episodes completed at or after this instant."),
            "until": _instant("Only episodes completed at or before this instant."),
            "mode": {
                "type": "string",
                "enum": list(RECALL_MODES),
                "description": "hybrid (default: meaning and keywords), vector (meaning only) or keyword "
                "(exact words, e.g. error messages or identifiers).",
            },
            **_ids("agent_id", "user_id", "session_id"),
        },
        required=["query"],
    ),
    plan=_plan_recall,
)


# get_context ------------------------------------------------------------------------------------------------
def _plan_context(args: dict[str, Any], scope: Scope) -> Plan:
    args = _scoped(args, scope, ("agent_id", "user_id"))
    options = _except(args, "task")
    return Plan(
        "get_context",
        (Calls.context(args["task"], cast(ContextOptions, options)),),
        lambda r: render_context(r[0]),
    )


CONTEXT = ToolSpec(
    name="get_context",
    description=(
        "Get a ready-made working-memory briefing for the task you are starting: the most relevant past "
        "episodes, the latest episodes of this agent, the strategies that worked and distilled facts, as "
        "one text section (at most max_chars characters) to read before you plan. Call it once at the "
        "start of a task; use recall_experiences instead for a ranked list you want to inspect."
    ),
    parameters=_object(
        {
            "task": _string("The task you are about to do, in plain words.", max_length=MAX_QUERY_CHARS),
            "category": _tag(
                "The task's category, if known (code_generation, debugging, refactoring, testing, "
                "architecture or a custom one)."
            ),
            "top_k": _integer("How many past episodes to include (default 3).", 1, MAX_TOP_K),
            "max_chars": _integer(
                "The longest briefing you want, in characters (default 4000).", *CONTEXT_CHARS
            ),
            **_ids("agent_id", "user_id", "session_id"),
        },
        required=["task"],
    ),
    plan=_plan_context,
)


# record_episode --------------------------------------------------------------------------------------------
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


def _plan_record(args: dict[str, Any], scope: Scope) -> Plan:
    fields: dict[str, Any] = {}
    for arg, value in _scoped(args, scope, ("agent_id", "user_id", "session_id")).items():
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


RECORD = ToolSpec(
    name="record_episode",
    description=(
        "Save what happened on a task you finished, failed or gave up on, so you and other agents can "
        "learn from it later. Call it once per task, at the end. Give the task, the outcome and what you "
        "did: the solution, the strategy, a reward from 0 (useless) to 1 (fully solved), the main actions "
        "with their results and errors, and any feedback you got. Failures are as valuable as successes: "
        "record them with the error. Returns the new episode_id; the episode is recallable within "
        "seconds."
    ),
    parameters=_object(
        {
            "task": _string("What you were asked to do, in plain words."),
            "outcome": {
                **_OUTCOME,
                "description": "success (solved), partial (part of it), failure (tried, did "
                "not work) or abandoned (stopped before the end).",
            },
            "solution": _string("What solved it, or the final approach: the key change, command or answer."),
            "reward": _number(
                "How well it went, from 0 (useless) to 1 (fully solved); a test pass rate or a "
                "user rating fits.",
                -MAX_REWARD,
                MAX_REWARD,
            ),
            "feedback": _string(
                "Feedback you received: a user's comment, a reviewer's note, a test failure message."
            ),
            "strategy": _tag("How you approached it: " + ", ".join(STRATEGIES) + ", or your own word."),
            "actions": {
                "type": "array",
                "items": _ACTION,
                "maxItems": MAX_ACTIONS,
                "description": "The main steps you took, in order, with what each gave.",
            },
            "importance": _number(
                "How much this episode matters for the future, 1 (routine) to 10 (critical lesson).", 1, 10
            ),
            "category": _tag(
                "The task's category: code_generation, debugging, refactoring, testing, "
                "architecture, or a custom one."
            ),
            "complexity": _number("How hard the task was, 0 (trivial) to 1 (very hard).", 0, 1),
            "outcome_details": _string(
                "Why it ended this way, in a sentence or two (the blocking error for a failure)."
            ),
            "iterations": _integer("How many attempts or rounds it took.", 0, MAX_COUNT),
            "tests_passed": _integer("Tests passing at the end.", 0, MAX_COUNT),
            "tests_total": _integer("Tests run at the end.", 0, MAX_COUNT),
            **_ids("agent_id", "user_id", "session_id", reads=False),
        },
        required=["task", "outcome"],
    ),
    plan=_plan_record,
    read_only=False,
    idempotent=False,
)


# suggest_approach ------------------------------------------------------------------------------------------
def _plan_suggest(args: dict[str, Any], scope: Scope) -> Plan:
    args = _scoped(args, scope, ("agent_id", "user_id"))
    common = _except(args, "task", "category", "complexity")
    # the category picks strategy's skill profile; suggest would filter by it, and a category the model
    # guessed then found nothing while strategy, on every similar episode, found evidence
    strategy = _except(args, "task")
    calls = (
        Calls.suggest(args["task"], cast(SuggestOptions, common)),
        Calls.strategy(args["task"], cast(StrategyOptions, strategy)),
    )
    return Plan("suggest_approach", calls, lambda r: render_suggestion(r[0], r[1]))


SUGGEST = ToolSpec(
    name="suggest_approach",
    description=(
        "Before starting a task, ask memory how similar past tasks went and how to approach this one. "
        "Returns a confidence (high, medium or low, from similar successes versus failures), a recommended "
        "strategy (" + ", ".join(STRATEGIES) + ") with the reason, the strategies that succeeded, and the "
        "failure messages and action types that went wrong before, so you can avoid them."
    ),
    parameters=_object(
        {
            "task": _string("The task you are about to do, in plain words.", max_length=MAX_QUERY_CHARS),
            "category": _tag("The task's category, if known."),
            "complexity": _number(
                "How hard the task looks, 0 (trivial) to 1 (very hard); used when memory has "
                "no similar successes.",
                0,
                1,
            ),
            **_ids("agent_id", "user_id", "session_id"),
        },
        required=["task"],
    ),
    plan=_plan_suggest,
)


# search_facts ---------------------------------------------------------------------------------------------
def _plan_facts(args: dict[str, Any], scope: Scope) -> Plan:
    args = _scoped(args, scope, ("agent_id", "user_id"))
    options = _except(args, "query")
    return Plan(
        "search_facts",
        (Calls.search_facts(args.get("query"), cast(FactSearchOptions, options)),),
        lambda r: render_facts(r[0], args.get("query")),
    )


FACTS = ToolSpec(
    name="search_facts",
    description=(
        "Search semantic memory: durable lessons distilled from many episodes (strategies that work, "
        "recurring failure patterns, best practices), each with its confidence, its success rate and how "
        "many episodes support it. Call it without a query for the most confident facts. Use it for "
        "general lessons; use recall_experiences for specific past episodes."
    ),
    parameters=_object(
        {
            "query": _string(
                "What the facts should be about. Omit for the most confident facts.",
                max_length=MAX_QUERY_CHARS,
            ),
            "kind": {
                "type": "array",
                "items": {"type": "string", "enum": list(FACT_KINDS)},
                "minItems": 1,
                "maxItems": len(FACT_KINDS),
                "uniqueItems": True,
                "description": "Only these kinds: strategy (what works, with the strategy that does), "
                "failure_pattern (what keeps failing), best_practice (mixed results, or what works "
                "without one strategy behind it), preference. Omit to get every kind.",
            },
            "category": _tag("Only facts about this task category."),
            "top_k": _integer("How many facts to return (default 10).", 1, MAX_TOP_K),
            "min_confidence": _number("Only facts at least this confident (0..1).", 0, 1),
            "include_superseded": {
                "type": "boolean",
                "description": "Also facts that newer evidence replaced (history).",
            },
            **_ids("agent_id", "user_id"),
        }
    ),
    plan=_plan_facts,
)


# forget_episode -------------------------------------------------------------------------------------------
FORGET_WAIT = 5.0
"""Seconds forget_episode waits for the erase (`DELETE /v1/episodes/{id}?wait=`), so its answer can say
the episode is gone from every read; past it the answer says the erase is accepted, not done."""


def _plan_forget(args: dict[str, Any], scope: Scope) -> Plan:
    return Plan(
        "forget_episode",
        (Calls.forget_episode(args["episode_id"], wait=FORGET_WAIT),),
        lambda r: render_forgotten(r[0]),
        missing=(
            "episode_id",
            "no episode with this id in this memory (a forgotten one would answer already forgotten)",
        ),
    )


FORGET = ToolSpec(
    name="forget_episode",
    description=(
        "Permanently erase one episode from memory by its episode_id (as returned by recall_experiences or "
        "record_episode): when it holds wrong or harmful information, or the user asks to forget it. The "
        "facts built from it are rebuilt without it. This cannot be undone."
    ),
    parameters=_object(
        {"episode_id": _string("The id of the episode to erase.", max_length=MAX_ID_CHARS)},
        required=["episode_id"],
    ),
    plan=_plan_forget,
    read_only=False,
    destructive=True,
    idempotent=True,
)


# get_skills ---------------------------------------------------------------------------------------------
def _plan_skills(args: dict[str, Any], scope: Scope) -> Plan:
    args = _scoped(args, scope, ("agent_id", "user_id"))
    options = dict(args)
    return Plan("get_skills", (Calls.skills(cast(SkillsOptions, options)),), lambda r: render_skills(r[0]))


SKILLS = ToolSpec(
    name="get_skills",
    description=(
        "Show the track record per task category: how many episodes, the success rate, the average reward "
        "and iterations, and which categories are weak (success rate below threshold). Use it to decide "
        "where to be careful, test more or ask for help."
    ),
    parameters=_object(
        {
            "threshold": _number("Success rate below which a category counts as weak (default 0.5).", 0, 1),
            **_ids("agent_id", "user_id", "session_id"),
        }
    ),
    plan=_plan_skills,
)


# get_learning_curve -----------------------------------------------------------------------------------------
def _plan_curve(args: dict[str, Any], scope: Scope) -> Plan:
    args = _scoped(args, scope, ("agent_id", "user_id"))
    options = dict(args)
    return Plan(
        "get_learning_curve",
        (Calls.learning_curve(cast(CurveOptions, options)),),
        lambda r: render_curve(r[0]),
    )


CURVE = ToolSpec(
    name="get_learning_curve",
    description=(
        "Show whether performance is improving: over the completed episodes in time order, the rolling "
        "success rate and average reward. Returns the first and the latest rolling success rate and "
        "reward, the trend (improving, steady or declining), the total reward and the last few episodes."
    ),
    parameters=_object(
        {
            "category": _tag("Only this task category."),
            "window": _integer("Episodes per rolling window (default 5).", *CURVE_WINDOW),
            "limit": _integer("How many of the newest episodes to include (default 1000).", *CURVE_LIMIT),
            **_ids("agent_id", "user_id", "session_id"),
        }
    ),
    plan=_plan_curve,
)

TOOLS: tuple[ToolSpec, ...] = (RECALL, CONTEXT, RECORD, SUGGEST, FACTS, FORGET, SKILLS, CURVE)
TOOL_NAMES: tuple[str, ...] = tuple(t.name for t in TOOLS)
_BY_NAME = {t.name: t for t in TOOLS}


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
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
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


def _join(path: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{path}[{name}]"
    return f"{path}.{name}" if path else name


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _check(schema: Mapping[str, Any], value: Any, path: str, errs: Collector) -> Any:
    """Check `value` against the subset of JSON Schema the tools use; return it normalised (integral
    floats of integer fields as ints, nulls of optional properties dropped) or None after an error."""
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
            errs.add(_join(path, str(key)), "is not a known field")
        elif item is not None:  # null for an optional argument means "not given"
            checked = _check(props[key], item, _join(path, key), errs)
            if checked is not None:
                out[key] = checked
    for key in schema.get("required", ()):
        if value.get(key) is None:
            errs.add(_join(path, key), "is required")
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
    items = [_check(schema.get("items", {}), v, _join(path, i), errs) for i, v in enumerate(value)]
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


def _check_tags(args: Mapping[str, Any], path: str, errs: Collector) -> None:
    for key, value in args.items():
        here = _join(path, key)
        if key in _TAG_ARGS and isinstance(value, str):
            check_tag_value(
                value,
                here,
                errs,
                max_chars=MAX_ID_CHARS if key.endswith("_id") else MAX_TAG_CHARS,
                required=True,
            )
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, Mapping):
                    _check_tags(item, _join(here, i), errs)


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
    _check_tags(checked, "", errs)  # on the values that passed the schema
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
    cannot be made. `agent_id` / `user_id` / `session_id` are the bound scope (see the module docstring)."""
    spec = get_tool(name)
    return spec.plan(check_arguments(spec, arguments), _scope(agent_id, user_id, session_id))


# --- executing ----------------------------------------------------------------------------------------------
def execute(client: Engram, plan: Plan) -> ToolResult:
    """Send a plan's requests with the sync client and render the answers (errors as in `dispatch`)."""
    with plan.refusals():
        answers = [client.call(c) for c in plan.calls]
    return plan.render(answers)


async def aexecute(client: AsyncEngram, plan: Plan) -> ToolResult:
    """Send a plan's requests with the async client (concurrently unless `plan.ordered`) and render
    the answers."""
    with plan.refusals():
        if plan.ordered:
            answers = [await client.call(c) for c in plan.calls]
        else:
            answers = list(await asyncio.gather(*(client.call(c) for c in plan.calls)))
    return plan.render(answers)


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

    def get(self, name: str) -> ToolSpec:
        """One of this toolset's tools; UnknownTool otherwise."""
        if name not in self.names:
            raise UnknownTool(name, self.names)
        return get_tool(name)

    def prepare(self, name: str, arguments: Mapping[str, Any] | str | bytes | None = None) -> Plan:
        """The call as requests with this toolset's scope (see the module-level `prepare`)."""
        self.get(name)
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
            return execute(self.client, self.prepare(name, arguments))
        except EngramError as exc:
            return _as_result(exc, errors)

    async def adispatch(
        self,
        name: str,
        arguments: Mapping[str, Any] | str | bytes | None = None,
        *,
        errors: Literal["raise", "result"] = "raise",
    ) -> ToolResult:
        """Execute a tool call with the async client (see `adispatch`)."""
        if not isinstance(self.client, AsyncEngram):
            raise TypeError("adispatch needs an AsyncEngram client; use dispatch with an Engram")
        try:
            return await aexecute(self.client, self.prepare(name, arguments))
        except EngramError as exc:
            return _as_result(exc, errors)


def _as_result(exc: EngramError, errors: Literal["raise", "result"]) -> ToolResult:
    """`error_result(exc)` with `errors="result"`; else raises `exc` again."""
    if errors == "result":
        return error_result(exc)
    raise exc


def error_result(exc: BaseException) -> ToolResult:
    """Any error of a tool call as a ToolResult for the model (`is_error=True`), with a short sentence
    saying what to do, and `data = {"error": kind, ...}`: kind is invalid_arguments (with `errors`:
    [{field, reason}]), unknown_tool, unauthorized, unavailable (with `retry_after`), unreachable,
    service_error or internal."""
    if isinstance(exc, ToolArgumentError):
        lines = "; ".join(f"{f}: {why}" for f, why in exc.errors)
        return ToolResult(
            f"Invalid arguments for {exc.tool}: {lines}. Fix them and call again.",
            {
                "error": "invalid_arguments",
                "tool": exc.tool,
                "errors": [{"field": f, "reason": why} for f, why in exc.errors],
            },
            is_error=True,
        )
    if isinstance(exc, UnknownTool):
        return ToolResult(
            f"Unknown tool {str(exc.name)[:80]!r}; available: {', '.join(exc.available)}.",
            {"error": "unknown_tool", "tool": exc.name, "available": list(exc.available)},
            is_error=True,
        )
    if isinstance(exc, Unauthorized):
        return ToolResult(
            "The memory service refused this client's API key; memory is unavailable until it is fixed.",
            {"error": "unauthorized", "status": exc.status},
            is_error=True,
        )
    if isinstance(exc, RateLimited | ServiceUnavailable):
        after = f" in {exc.retry_after:g} s" if exc.retry_after is not None else " later"
        return ToolResult(
            f"Memory is busy or unavailable right now ({exc.status}); try again{after}.",
            {"error": "unavailable", "status": exc.status, "retry_after": exc.retry_after},
            is_error=True,
        )
    if isinstance(exc, ApiError):
        return ToolResult(
            f"The memory service refused the call: {exc}",
            {"error": "service_error", "status": exc.status, "detail": exc.detail},
            is_error=True,
        )
    if isinstance(exc, ConnectionFailed):
        return ToolResult(
            f"The memory service is unreachable: {exc}. Continue without memory.",
            {"error": "unreachable", "maybe_applied": exc.maybe_applied},
            is_error=True,
        )
    return ToolResult(f"Memory failed: {type(exc).__name__}: {exc}", {"error": "internal"}, is_error=True)


# --- renderers (pure: typed results → ToolResult) ---------------------------------------------------------------
def _clip(text: str | None, n: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "unknown time"
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def _ago(seconds: float) -> str:
    s = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.0f} {unit} ago"
    return "just now"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def render_recall(recall: Recall, query: str) -> ToolResult:
    """recall_experiences: a numbered list, best first, and the strategies that worked."""
    if not recall.results:
        return ToolResult(f"No past episodes match {_clip(query, 80)!r} yet.", dict(recall.raw))
    lines = [f"{len(recall.results)} past episode(s) for {_clip(query, 80)!r}, best first:"]
    for i, hit in enumerate(recall.results, 1):
        ep = hit.episode
        reward = ep.feedback.reward if ep.feedback else None
        head = [
            ep.outcome or "unfinished",
            f"reward {_num(reward)}",
            f"{_when(ep.completed_at)} ({_ago(hit.age_s)})",
        ]
        if ep.strategy_used:
            head.append(f"strategy {ep.strategy_used}")
        lines.append(f"{i}. [{' | '.join(head)}] {_clip(ep.task.description if ep.task else '', 160)}")
        if ep.solution:
            lines.append(f"   solution: {_clip(ep.solution, 240)}")
        why = (ep.feedback.message if ep.feedback else None) or ep.outcome_details
        failed = next((a.error for a in ep.actions if a.error), None)
        if why or failed:
            lines.append(f"   feedback: {_clip(why or failed, 200)}")
        lines.append(f"   episode_id: {ep.episode_id}")
    worked = [s for s in recall.replay_context.strategies if (s.success_rate or 0) > 0]
    if worked:
        lines.append(
            "Strategies that worked: "
            + "; ".join(
                f"{s.strategy} ({s.episodes} episode(s), success {_pct(s.success_rate)}, avg reward "
                f"{_num(s.avg_reward)})"
                for s in worked[:3]
            )
        )
    return ToolResult("\n".join(lines), dict(recall.raw))


def render_context(context: Context) -> ToolResult:
    """get_context: the service's prompt section as it is."""
    return ToolResult(context.prompt, dict(context.raw))


def render_recorded(result: IngestResult, episode_id: str, outcome: str | None) -> ToolResult:
    """record_episode: the new episode's id."""
    accepted = result.results[0] if result.results else None
    data = {
        "episode_id": episode_id,
        "event_id": accepted.event_id if accepted else None,
        "outcome": outcome,
        "accepted": result.accepted,
    }
    return ToolResult(
        f"Recorded episode {episode_id} ({outcome}). It will be recallable within seconds.", data
    )


def render_suggestion(suggestion: Suggestion, choice: StrategyChoice) -> ToolResult:
    """suggest_approach: confidence, the strategy and its reason, what failed before."""
    if suggestion.similar:
        basis = (
            f"{suggestion.successes} success(es) and {suggestion.failures} failure(s) among "
            f"{suggestion.similar} similar past episode(s)"
        )
    else:
        basis = "no similar past episodes"
    lines = [
        f"Confidence: {suggestion.confidence} ({basis}).",
        f"Recommended strategy: {choice.strategy} ({choice.reason}).",
    ]
    if suggestion.successful_strategies:
        lines.append(
            "Strategies that succeeded: "
            + ", ".join(f"{s} ({n}x)" for s, n in suggestion.successful_strategies)
        )
    if suggestion.common_failures:
        lines.append(
            "Common failures to avoid: "
            + "; ".join(f"{_clip(m, 160)!r} ({n}x)" for m, n in suggestion.common_failures)
        )
    if suggestion.failed_action_types:
        lines.append(
            "Steps that failed before: " + ", ".join(f"{a} ({n}x)" for a, n in suggestion.failed_action_types)
        )
    return ToolResult("\n".join(lines), {"suggestion": dict(suggestion.raw), "strategy": dict(choice.raw)})


def render_facts(facts: Sequence[Fact], query: str | None) -> ToolResult:
    """search_facts: one line per fact with its kind, confidence and support."""
    data = {"results": [dict(f.raw) for f in facts]}
    if not facts:
        about = f" about {_clip(query, 80)!r}" if query else ""
        return ToolResult(
            f"No facts{about} yet (facts are distilled once enough similar episodes exist).", data
        )
    lines = [f"{len(facts)} fact(s), best first:"]
    for i, f in enumerate(facts, 1):
        tail = "" if f.status in ("", "current") else f", {f.status}"
        scope = f"agent {f.agent_id}" if f.agent_id else "all agents"
        lines.append(
            f"{i}. [{f.kind} | {scope} | confidence {_num(f.confidence)} | {f.support} episode(s), "
            f"success {_pct(f.success_rate)}{tail}] {_clip(f.text, 500)} (fact_id {f.fact_id})"
        )
    return ToolResult("\n".join(lines), data)


def render_forgotten(forgetting: Forgetting) -> ToolResult:
    """forget_episode: the episode is erased (`forgotten` true: gone from every read), or the erase was
    accepted and is still to be carried out (the wait ran out), or had been done before (forgetting is
    idempotent)."""
    episode, event_id = f"Episode {forgetting.episode_id}", forgetting.event_id
    if forgetting.already_forgotten:
        status, text, event_id = "already_forgotten", f"{episode} was already forgotten.", None
    elif forgetting.forgotten:
        status = "erased"
        text = f"{episode} is erased from memory; the facts built on it are rebuilt without it."
    else:
        status = "accepted"
        text = f"{episode} will be erased from memory (and from the facts built on it) within seconds."
    return ToolResult(text, {"episode_id": forgetting.episode_id, "event_id": event_id, "status": status})


def render_skills(skills: Skills) -> ToolResult:
    """get_skills: one line per category; the weak ones marked."""
    data = dict(skills.raw)
    if not skills.results:
        return ToolResult("No completed episodes yet, so no skill profile.", data)
    lines = [f"Skills by category (weak: success rate below {skills.threshold:.0%}):"]
    for p in sorted(skills.results, key=lambda p: -p.episodes):
        iters = f", avg iterations {p.avg_iterations:.1f}" if p.avg_iterations is not None else ""
        lines.append(
            f"- {p.category}: {p.episodes} episode(s), {p.successes} success(es) "
            f"({_pct(p.success_rate)}), avg reward {_num(p.avg_reward)}{iters}"
            + (" - WEAK" if p.weak else "")
        )
    if skills.weak:
        lines.append("Weak categories: " + ", ".join(skills.weak) + ".")
    return ToolResult("\n".join(lines), data)


def render_curve(curve: LearningCurve) -> ToolResult:
    """get_learning_curve: first vs latest rolling figures, the trend, the last few episodes."""
    data = dict(curve.raw)
    points = curve.results
    if not points:
        return ToolResult("No completed episodes yet, so no learning curve.", data)
    first, last = points[min(len(points), curve.window) - 1], points[-1]
    delta = last.success_rate - first.success_rate
    trend = "improving" if delta > 0.1 else "declining" if delta < -0.1 else "steady"
    lines = [
        f"Learning curve over {len(points)} episode(s) (rolling window {curve.window}): success rate "
        f"{_pct(first.success_rate)} -> {_pct(last.success_rate)} ({trend}); avg reward "
        f"{_num(first.avg_reward)} -> {_num(last.avg_reward)}; total reward {last.cumulative_reward:.2f}.",
        "Latest: "
        + ", ".join(f"#{p.episode} {p.outcome or '?'} {_num(p.reward)}" for p in points[-5:])
        + ".",
    ]
    return ToolResult("\n".join(lines), data)


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
    "aexecute",
    "check_arguments",
    "dispatch",
    "error_result",
    "execute",
    "get_tool",
    "parse_arguments",
    "prepare",
    "tools",
]
