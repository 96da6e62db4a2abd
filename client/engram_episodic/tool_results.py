"""What Engram's tools give a model back: `ToolResult`, the tool errors (`ToolArgumentError`, `UnknownTool`)
and `error_result`, which renders any failure for a model, and the renderers that turn each tool's typed
answer into compact text for the model (with the full JSON as `data`). Pure: no I/O;
`engram_episodic.tools` uses them and re-exports them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from engram_episodic.errors import (
    ApiError,
    ConnectionFailed,
    EngramError,
    RateLimited,
    ServiceUnavailable,
    Unauthorized,
)
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


# --- errors ------------------------------------------------------------------------------------------
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


def error_result(exc: BaseException) -> ToolResult:
    """Any error of a tool call as a ToolResult for the model (`is_error=True`), with a short sentence
    saying what to do, and `data = {"error": kind, ...}`: kind is invalid_arguments (with `errors`:
    [{field, reason}]), unknown_tool, unauthorized, unavailable (with `retry_after`), unreachable,
    service_error or internal."""
    if isinstance(exc, ToolArgumentError):
        lines = "; ".join(f"{f}: {why}" for f, why in exc.errors)
        text = f"Invalid arguments for {exc.tool}: {lines}. Fix them and call again."
        errors = [{"field": f, "reason": why} for f, why in exc.errors]
        return _failed(text, "invalid_arguments", tool=exc.tool, errors=errors)
    if isinstance(exc, UnknownTool):
        text = f"Unknown tool {str(exc.name)[:80]!r}; available: {', '.join(exc.available)}."
        return _failed(text, "unknown_tool", tool=exc.name, available=list(exc.available))
    if isinstance(exc, Unauthorized):
        text = "The memory service refused this client's API key; memory is unavailable until it is fixed."
        return _failed(text, "unauthorized", status=exc.status)
    if isinstance(exc, RateLimited | ServiceUnavailable):
        after = f" in {exc.retry_after:g} s" if exc.retry_after is not None else " later"
        text = f"Memory is busy or unavailable right now ({exc.status}); try again{after}."
        return _failed(text, "unavailable", status=exc.status, retry_after=exc.retry_after)
    if isinstance(exc, ApiError):
        text = f"The memory service refused the call: {exc}"
        return _failed(text, "service_error", status=exc.status, detail=exc.detail)
    if isinstance(exc, ConnectionFailed):
        text = f"The memory service is unreachable: {exc}. Continue without memory."
        return _failed(text, "unreachable", maybe_applied=exc.maybe_applied)
    return _failed(f"Memory failed: {type(exc).__name__}: {exc}", "internal")


def _failed(text: str, error: str, **data: Any) -> ToolResult:
    return ToolResult(text, {"error": error, **data}, is_error=True)


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
