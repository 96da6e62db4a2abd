"""The success bodies of the HTTP API, as OpenAPI schemas (pydantic models used for their JSON schema only:
the views build plain dicts, encoded by orjson). Each Route names its answer (`services.query.routes`);
schemathesis checks every answer it provokes against these, so a drift fails `make test`.

A field that is always there is required; one that some answers omit has a default. Unknown fields are
allowed (a client must ignore what it does not know: a field added later is not a breaking change).
Episodes refer to `EpisodeOut`, the response form of `engram_episodic.episode_schema`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from engram_episodic.episode_schema import action_schema, episode_schema, feedback_schema, task_schema
from engram_episodic.events import OUTCOMES

_REF = "#/components/schemas/{}"
EPISODE_REFS = {name: _REF.format(name) for name in ("Task", "Action", "Feedback")}
EPISODE_OUT_REFS = {name: _REF.format(name + "Out") for name in ("Task", "Action", "Feedback")}

SCHEMAS: dict[str, dict[str, Any]] = {
    "Episode": episode_schema(refs=EPISODE_REFS),
    "Task": task_schema(),
    "Action": action_schema(),
    "Feedback": feedback_schema(),
    "EpisodeOut": episode_schema(response=True, refs=EPISODE_OUT_REFS),
    "EpisodeDraftOut": episode_schema(response=True, refs=EPISODE_OUT_REFS, draft=True),
    "TaskOut": task_schema(response=True),
    "ActionOut": action_schema(response=True),
    "FeedbackOut": feedback_schema(response=True),
}
"""Named schemas of the document that no pydantic model produces (the episode, in and out)."""

NAMED = "x-engram-named"


def named(name: str) -> dict[str, Any]:
    """The JSON schema of a pydantic field that is the document's component `name` (one of `SCHEMAS`):
    `Annotated[dict[str, Any], WithJsonSchema(named("EpisodeOut"))]`. (A `$ref` there would be looked up
    among pydantic's own definitions, a KeyError; `services.query.openapi` turns the marker into the
    `$ref`.)"""
    return {NAMED: name}


EpisodeOut = Annotated[dict[str, Any], WithJsonSchema(named("EpisodeOut"))]
EpisodeOrDraft = Annotated[
    dict[str, Any],
    WithJsonSchema({"anyOf": [named("EpisodeOut"), named("EpisodeDraftOut")]}),
]
Instant = Annotated[str, Field(description="ISO 8601, UTC (`Z`)"), WithJsonSchema({"type": "string"})]
Outcome = Literal[OUTCOMES]  # type: ignore[valid-type]


class Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


# --- episodes ---------------------------------------------------------------------------------------
class Accepted(Answer):
    episode_id: str
    event_id: str | None = Field(
        description="null: the episode_id was forgotten before, so nothing was published (reason `forgotten`)"
    )
    projected: bool | None = Field(
        None, description="with ?wait=: projected (recallable) in time; false for a forgotten id"
    )
    reason: str | None = Field(
        None,
        description="why not projected: `forgotten` (never stored again: publish under a new episode_id), "
        "with ?wait= also `dead_lettered`, `expired`, `timeout`",
    )


class IngestAnswer(Answer):
    """Every episode was published to the stream but those whose episode_id was forgotten before (listed
    with `reason: forgotten`, not published); a single episode's ids are repeated on top."""

    results: list[Accepted]
    accepted: int = Field(description="episodes published (forgotten ids are not)")
    forgotten: int | None = Field(None, description="episodes not published: their episode_id was forgotten")
    projected: bool | None = Field(None, description="with ?wait=: every episode projected in time")
    episode_id: str | None = Field(None, description="one episode sent: its id")
    event_id: str | None = Field(None, description="one episode sent: its event's id")


class EpisodeAnswer(Answer):
    episode: EpisodeOrDraft | None = Field(
        description="null while `status` is pending; an EpisodeDraftOut while it is `draft`"
    )
    episode_id: str | None = Field(None, description="present while pending")
    status: str = Field(description="`pending` (accepted, not yet projected), `completed`, ...")
    access_count: int
    last_accessed: Instant | None


class EpisodeForgotten(Answer):
    episode_id: str
    event_id: str | None = Field(description="null when it was forgotten already")
    already_forgotten: bool | None = None
    forgotten: bool | None = Field(
        None, description="with ?wait=: the episode was erased (from every read) in time"
    )


class UserForgotten(Answer):
    user_id: str
    event_id: str
    forgotten: bool | None = Field(
        None, description="with ?wait=: the user's episodes were erased (from every read) in time"
    )


class EpisodeUpdateAccepted(Answer):
    """`PATCH /v1/episodes/{id}`: the `EpisodeUpdated` event was published."""

    episode_id: str
    event_id: str
    projected: bool | None = Field(None, description="with ?wait=: folded into the episode in time")
    reason: str | None = Field(
        None, description="with ?wait=, why not projected: `dead_lettered`, `expired`, `timeout`"
    )


class ForgetJob(Answer):
    """The status of a bulk forget (by agent, session or ids), `GET /v1/forget/{job_id}`: how far it got.
    The job record keeps no ids (services.query.views.forgetting), so neither does this."""

    job_id: str
    kind: Literal["agent", "session", "episodes"]
    status: Literal["pending", "done"]
    episodes: int = Field(description="episodes it erases")
    forgotten: int = Field(description="episodes erased so far (tombstoned)")
    created_at: Instant
    expires_at: Instant = Field(description="when this status record is dropped")
    job: str = Field(description="the status resource, GET it until `status` is done")


class ForgetJobStarted(ForgetJob):
    """A bulk forget just started: its status, and what the call asked for (said once, in this answer:
    the status resource does not repeat it)."""

    agent_id: str | None = Field(None, description="`DELETE /v1/agents/{agent_id}`")
    session_id: str | None = Field(None, description="`DELETE /v1/sessions/{session_id}`")
    unknown: list[str] | None = Field(
        None, description="`POST /v1/forget`: ids the namespace never had (not published)"
    )
    already_forgotten: list[str] | None = Field(
        None, description="`POST /v1/forget`: ids forgotten before (not published)"
    )


class Page(Answer):
    results: list[Any]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last")
    order: Literal["asc", "desc"]
    limit: int


class EpisodePage(Page):
    """One page of `GET /v1/episodes`."""

    results: list[EpisodeOut]


# --- recall and working memory ----------------------------------------------------------------------
class Components(Answer):
    similarity: float
    recency: float
    reward: float
    outcome: float
    importance: float
    regime: float | None = Field(
        None,
        description="a result's only, where not 0: what the answer's regime term moved it by (docs/api.md)",
    )


class RecallHit(Answer):
    episode: EpisodeOut
    similarity: float | None = Field(
        description="cosine to the query, at least 0; null when it could not be computed (a keyword recall "
        "without the query's vector: `similarity_unavailable`)"
    )
    relevance: float = Field(description="the relevance recall ranked by (0..1)")
    recency: float = Field(description="decay factor 0..1")
    age_s: float = Field(description="seconds between completed_at (or last access) and as_of")
    components: Components = Field(description="each signal times its weight")
    priority: float
    access_count: int
    last_accessed: Instant | None


class StrategyInReplay(Answer):
    strategy: str | None
    priority: float
    episodes: int
    avg_reward: float | None
    success_rate: float | None
    changed_at: Instant | None = Field(description="when its outcomes last flipped; null if never")
    earlier_episodes: int = Field(description="its episodes before `changed_at` (not counted above)")
    earlier_success_rate: float | None = Field(description="their success rate; null without any")


class ReplayContext(Answer):
    episodes: int
    avg_reward: float | None
    success_rate: float | None
    strategies: list[StrategyInReplay]


class RecallAnswer(Answer):
    results: list[RecallHit]
    replay_context: ReplayContext
    as_of: Instant
    weights: Components
    preset: str | None
    mode: Literal["vector", "keyword", "hybrid"]
    half_life: float = Field(description="seconds")
    normalize: str
    recency_from: str
    candidates: int = Field(description="size of the re-ranked pool")
    min_relevance: float
    min_priority: float
    similarity_unavailable: bool = Field(
        False,
        description="present (true) only when a keyword-mode recall answered without the query's vector "
        "(the embedder's provider failed, or the index was rebuilt with another embedder): ranked by words "
        "alone, every `similarity` null; other modes answer 503 or 409 then",
    )


class FactBrief(Answer):
    fact_id: str
    kind: str
    text: str
    support: int
    success_rate: float | None = None
    confidence: float | None = None
    score: float | None = None


class ContextAnswer(Answer):
    task: str
    category: str | None
    results: list[RecallHit]
    short_term: list[EpisodeOut] = Field(description="the latest episodes of the scope, newest first")
    replay_context: ReplayContext
    facts: list[FactBrief]
    prompt: str = Field(description="a markdown section ready for a system prompt, at most max_chars")
    truncated: bool
    max_chars: int
    preset: str | None
    similarity_unavailable: bool = Field(
        False,
        description="present (true) only when the keyword-mode recall (ENGRAM_RECALL_MODE=keyword) "
        "answered without the query's vector (the embedder's provider failed, or the index was rebuilt "
        "with another embedder): ranked by words alone, every `similarity` null and no facts; other modes "
        "answer 503 or 409 then",
    )


# --- insights ---------------------------------------------------------------------------------------
class SkillProfile(Answer):
    category: str
    episodes: int
    successes: int
    avg_reward: float | None
    avg_iterations: float | None
    success_rate: float | None
    weak: bool


class SkillsAnswer(Answer):
    results: list[SkillProfile]
    weak: list[str]
    threshold: float


class StrategyAnswer(Answer):
    strategy: str
    rule: Literal["reuse", "weak_category", "no_evidence", "complexity"]
    reason: str
    evidence: dict[str, Any] = Field(description="`similar_episodes`, and what the rule counted")
    pool: list[str] | None = None


class FailureCount(Answer):
    message: str = Field(description="a failure message (feedback or action error), at most 300 characters")
    count: int = Field(description="episodes that said it")


class FailedActionType(Answer):
    action_type: str
    count: int = Field(description="episodes with an action of this type that did not succeed")


class StrategyCount(Answer):
    strategy: str
    count: int = Field(description="successful episodes that used it")


class StrategyChange(Answer):
    """An approach whose outcomes flipped: its episodes since, and the earlier ones it no longer counts."""

    strategy: str | None = Field(description="the approach; null for the episodes without one")
    since: Instant = Field(description="when the current run of outcomes began")
    episodes: int
    successes: int
    earlier_episodes: int
    earlier_successes: int


class SuggestAnswer(Answer):
    confidence: str
    similar: int
    successes: int
    failures: int
    success_share: float | None
    common_failures: list[FailureCount] = Field(description="most frequent first")
    failed_action_types: list[FailedActionType] = Field(description="most frequent first")
    successful_strategies: list[StrategyCount] = Field(description="most used first")
    changed: list[StrategyChange] = Field(description="strategies whose outcomes flipped")


class CurvePoint(Answer):
    episode: int = Field(description="1-based position, oldest first")
    reward: float | None
    outcome: Outcome | None
    cumulative_reward: float
    success_rate: float = Field(description="over the last `window` episodes")
    avg_reward: float | None = Field(description="over the last `window` episodes")
    episode_id: str
    completed_at: Instant | None


class LearningCurveAnswer(Answer):
    results: list[CurvePoint]
    window: int


# --- facts ------------------------------------------------------------------------------------------
class TopStrategy(Answer):
    strategy: str
    episodes: int
    successes: int
    success_rate: float


class ActionTypeCount(Answer):
    action_type: str
    count: int = Field(description="actions of this type in the evidence")
    failed: int = Field(description="those that did not succeed")


class Fact(Answer):
    """A consolidated fact (`shared.facts.Fact.to_json`: every field but the centroid and the
    deterministic text it may rewrite)."""

    fact_id: str
    namespace: str
    scope_id: str
    level: Literal["namespace", "agent_category"] = Field(description="the scope it was distilled over")
    agent_id: str | None = Field(None, description="the scope's agent (level `agent_category`)")
    category: str | None = Field(None, description="the scope's category (level `agent_category`)")
    kind: Literal["strategy", "failure_pattern", "best_practice", "preference"]
    text: str
    support: int = Field(description="evidence episodes")
    successes: int
    success_rate: float
    avg_reward: float | None = None
    top_strategies: list[TopStrategy] = Field(description="most used first")
    common_failures: list[FailureCount] = Field(description="most frequent first")
    action_types: list[ActionTypeCount] = Field(description="most frequent first")
    evidence: list[str] = Field(description="episode ids")
    central: list[str] = Field(description="the evidence episodes nearest its centroid")
    agents: list[str]
    users: list[str]
    categories: list[str]
    first_at: Instant
    last_at: Instant
    evidence_since: Instant | None = Field(
        None, description="a superseding fact counts only evidence completed since"
    )
    confidence: float
    version: int
    created_at: Instant
    updated_at: Instant
    supersedes: str | None = Field(None, description="the fact_id of the version it replaced")
    superseded_by: str | None = None
    superseded_at: Instant | None = None
    status: Literal["current", "superseded"]
    summary: Literal["llm", "fallback"] | None = Field(
        None, description="how `text` was written: absent (no summariser), `llm`, `fallback` (it failed)"
    )
    score: float | None = Field(None, description="search answers only")


class FactsAnswer(Answer):
    results: list[Fact]


class FactPage(Page):
    """One page of `GET /v1/facts`."""

    results: list[Fact]


class FactDetail(Answer):
    fact: Fact
    evidence: list[EpisodeOut]
    history: list[Fact] = Field(description="earlier versions of the fact, newest first")


class ConsolidationRun(Answer):
    scope: dict[str, Any]
    status: Literal["published", "unchanged", "busy"]
    facts: int
    removed: int
    summarizer_failures: int = Field(description="facts whose summary failed (the deterministic text kept)")


class ConsolidateAnswer(Answer):
    results: list[ConsolidationRun]
    summarizer_failures: int = Field(description="over every run")
    generation: int


# --- operations -------------------------------------------------------------------------------------
class Health(Answer):
    status: Literal["ok"]


class FactsState(Answer):
    """The live generation's facts (`shared.facts.facts_state`)."""

    generation: int
    indexed: int = Field(description="documents its facts index holds")
    replay: dict[str, Any] | None = Field(
        None, description="when a replay built the generation: facts carried over, re-embedded, indexed"
    )


class Generations(Answer):
    live: int = Field(description="the index generation recall reads")
    building: int | None = Field(
        description="the generation an `engram-admin replay` / `reindex` is building; null when none runs"
    )


class Readiness(Answer):
    status: Literal["ready", "not ready"]
    checks: dict[str, bool] = Field(description="redis, index, embedder")
    why: str | None = Field(
        None,
        description="when `checks.embedder` is false because the live index was rebuilt with another "
        "embedder: which one, and the setting to restart with",
    )
    dead_letters: int | None = Field(
        None,
        description="entries in the dead-letter stream: the consolidator gave up on them (`engram "
        "dead-letters` says why, `engram-admin redrive` publishes them again); never makes the service not "
        "ready; null when Redis does not answer",
    )
    lag: int | None = Field(
        None,
        description="entries published and not yet delivered to the consolidator (all partitions); "
        "never makes the service not ready; null when Redis does not answer",
    )
    facts: FactsState | None = Field(None, description="absent when Redis or the index does not answer")
    generations: Generations | None = Field(
        None, description="absent when Redis or the index does not answer"
    )


class Expiring(Answer):
    episode_id: str
    expires_at: Instant


class Summary(Answer):
    episodes: int = Field(description="episodes of the namespace (expired ones not counted)")
    agents: int = Field(description="distinct agent_id values")
    users: int = Field(description="distinct user_id values")
    sessions: int = Field(description="distinct session_id values")
    facts: int = Field(description="current facts")
    expiring: list[Expiring] = Field(description="the episodes expiring soonest (at most 10), soonest first")


class DeadLetter(Answer):
    id: str = Field(description="its id in the dead-letter stream (what redrive and discard take)")
    episode_id: str = Field(description="the episode its event names")
    reason: str = Field(description="why the consolidator gave up on it (values of sealed entries withheld)")
    consumer: str = Field(description="the consolidator that gave up")
    at: Instant = Field(description="when it was dead-lettered")


class DeadLetterPage(Answer):
    results: list[DeadLetter] = Field(description="the caller's namespace's, oldest first, at most `limit`")
    total: int = Field(description="the namespace's dead letters in all")


class DeadLettersActed(Answer):
    done: int = Field(description="dead letters re-driven (published again) or discarded")
    unknown: list[str] = Field(description="ids that name no dead letter of the caller's namespace")


class OpenAPIDocument(Answer):
    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]
    components: dict[str, Any]
