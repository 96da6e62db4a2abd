"""Typed results of the query service's HTTP API: frozen dataclasses built from its JSON answers.

Every class mirrors one response schema of `GET /openapi.json` and has `from_json(data)`; every
instant is UTC epoch seconds (float), as inside Engram (the wire carries ISO 8601 `Z` strings).
Episodes come back as `engram_episodic.events.Episode`, the same class agents build and publish, so
an episode read from recall can be re-published as it is. Each top-level result keeps the answer it
was built from in `raw` (the full JSON, for fields a newer server adds).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from engram_episodic.events import Episode
from engram_episodic.timeutil import parse_instant
from engram_episodic.validation import parse_episode

# Fields the service adds to an episode it answers with; derived, never part of the model.
_DERIVED = ("duration_s",)
_EPISODE_FIELDS = frozenset(Episode.__dataclass_fields__)


def episode_from_json(data: Mapping[str, Any]) -> Episode:
    """An Episode from the service's response form (ISO 8601 times, derived fields).

    Derived fields (`duration_s`, `feedback.pass_rate`) and fields this client does not know are
    dropped; the rest is validated by the same `parse_episode` the service uses (stored episodes may
    hold more actions than one input, so the per-input bound is off). Raises InvalidEpisode when the
    answer is not an episode.
    """
    known = {k: v for k, v in data.items() if k in _EPISODE_FIELDS and k not in _DERIVED}
    episode = parse_episode(known, max_actions=None)
    assert episode is not None  # parse_episode raises rather than return None without a collector
    return episode


def _instant(value: Any) -> float | None:
    return None if value is None else parse_instant(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Accepted:
    """One episode of an ingest (202): the stream holds its event and projection follows — or, with
    `event_id` None and `reason` "forgotten", its episode_id was forgotten before and nothing was
    published (a forgotten id is never stored again)."""

    episode_id: str
    event_id: str | None
    projected: bool | None = None  # with `wait`: whether the consolidator projected it in time
    # "forgotten" (the id is tombstoned: not published, with or without `wait`; publish under a new
    # episode_id), and with `wait`, when not projected: "dead_lettered" (`engram dead-letters` says
    # why), "expired" (projected but past its expires_at, so hidden) or "timeout"
    reason: str | None = None

    @property
    def forgotten(self) -> bool:
        """Its episode_id was forgotten before: not published, never stored."""
        return self.reason == "forgotten"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Accepted:
        return cls(
            episode_id=data["episode_id"],
            event_id=data["event_id"],
            projected=data.get("projected"),
            reason=data.get("reason"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class IngestResult:
    """`POST /v1/episodes`: every episode of the request, in request order."""

    accepted: int
    results: tuple[Accepted, ...]
    projected: bool | None = None  # with `wait`: every episode projected (recallable) in time
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IngestResult:
        return cls(
            accepted=int(data["accepted"]),
            results=tuple(map(Accepted.from_json, data["results"])),
            projected=data.get("projected"),
            raw=data,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RecallHit:
    """One recalled episode with the signals of its priority (docs/api.md, "POST /v1/recall").

    `similarity` is the cosine clipped at 0 (None when a keyword recall answered without the embedder:
    `Recall.similarity_unavailable`); `relevance` the similarity signal of the mode in [0, 1];
    `recency` exp(-ln2 * age / half_life); `age_s` seconds from `completed_at` (or `last_accessed`) to
    the request's `as_of`; `components` each weighted signal; `priority` their sum.
    """

    episode: Episode
    priority: float
    similarity: float | None
    relevance: float
    recency: float
    age_s: float
    components: Mapping[str, float]
    access_count: int = 0
    last_accessed: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RecallHit:
        return cls(
            episode=episode_from_json(data["episode"]),
            priority=float(data["priority"]),
            similarity=_opt_float(data.get("similarity")),
            relevance=float(data["relevance"]),
            recency=float(data["recency"]),
            age_s=float(data["age_s"]),
            components={k: float(v) for k, v in (data.get("components") or {}).items()},
            access_count=int(data.get("access_count") or 0),
            last_accessed=_instant(data.get("last_accessed")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayStrategy:
    """A strategy the recalled episodes used: its best priority, count, average reward, success rate —
    of its newest regime: when its outcomes flipped, `changed_at` (UTC epoch seconds) is when, and
    `earlier_episodes` / `earlier_success_rate` describe the older episodes left out."""

    strategy: str
    priority: float
    episodes: int
    avg_reward: float | None
    success_rate: float | None
    changed_at: float | None = None
    earlier_episodes: int = 0
    earlier_success_rate: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReplayStrategy:
        return cls(
            strategy=data["strategy"],
            priority=float(data["priority"]),
            episodes=int(data["episodes"]),
            avg_reward=_opt_float(data.get("avg_reward")),
            success_rate=_opt_float(data.get("success_rate")),
            changed_at=_instant(data.get("changed_at")),
            earlier_episodes=int(data.get("earlier_episodes") or 0),
            earlier_success_rate=_opt_float(data.get("earlier_success_rate")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayContext:
    """What the recalled episodes say worked: strategies to replay, best first."""

    episodes: int
    avg_reward: float | None
    success_rate: float | None
    strategies: tuple[ReplayStrategy, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReplayContext:
        return cls(
            episodes=int(data.get("episodes") or 0),
            avg_reward=_opt_float(data.get("avg_reward")),
            success_rate=_opt_float(data.get("success_rate")),
            strategies=tuple(map(ReplayStrategy.from_json, data.get("strategies") or ())),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Recall:
    """`POST /v1/recall`: the hits best first, and how they were ranked. Iterable over `results`.
    `similarity_unavailable`: a keyword recall ranked without the embedder (its provider failed), every
    hit's `similarity` None."""

    results: tuple[RecallHit, ...]
    replay_context: ReplayContext
    as_of: float
    weights: Mapping[str, float]
    preset: str | None
    mode: str
    candidates: int
    similarity_unavailable: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Recall:
        return cls(
            results=tuple(map(RecallHit.from_json, data["results"])),
            replay_context=ReplayContext.from_json(data.get("replay_context") or {}),
            as_of=parse_instant(data["as_of"]),
            weights=dict(data.get("weights") or {}),
            preset=data.get("preset"),
            mode=data.get("mode", ""),
            candidates=int(data.get("candidates") or 0),
            similarity_unavailable=bool(data.get("similarity_unavailable")),
            raw=data,
        )

    def __iter__(self) -> Iterator[RecallHit]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    @property
    def episodes(self) -> tuple[Episode, ...]:
        return tuple(h.episode for h in self.results)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextFact:
    """A current fact in a context answer (`score`: its centroid's similarity to the task)."""

    fact_id: str
    kind: str
    text: str
    support: int
    success_rate: float | None
    confidence: float | None
    score: float | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ContextFact:
        return cls(
            fact_id=data["fact_id"],
            kind=data["kind"],
            text=data["text"],
            support=int(data["support"]),
            success_rate=_opt_float(data.get("success_rate")),
            confidence=_opt_float(data.get("confidence")),
            score=_opt_float(data.get("score")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """`POST /v1/context`: working memory for a task, with `prompt` ready to put before a model call.
    `similarity_unavailable` as in `Recall` (and no facts then)."""

    task: str
    category: str | None
    prompt: str
    truncated: bool
    max_chars: int
    results: tuple[RecallHit, ...]
    short_term: tuple[Episode, ...]
    replay_context: ReplayContext
    facts: tuple[ContextFact, ...]
    preset: str | None
    similarity_unavailable: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Context:
        return cls(
            task=data["task"],
            category=data.get("category"),
            prompt=data["prompt"],
            truncated=bool(data.get("truncated")),
            max_chars=int(data["max_chars"]),
            results=tuple(map(RecallHit.from_json, data.get("results") or ())),
            short_term=tuple(map(episode_from_json, data.get("short_term") or ())),
            replay_context=ReplayContext.from_json(data.get("replay_context") or {}),
            facts=tuple(map(ContextFact.from_json, data.get("facts") or ())),
            preset=data.get("preset"),
            similarity_unavailable=bool(data.get("similarity_unavailable")),
            raw=data,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StrategyChoice:
    """`POST /v1/strategy`: the strategy to use, the rule that chose it and why."""

    strategy: str
    rule: str
    reason: str
    evidence: Mapping[str, Any]
    pool: tuple[str, ...]
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StrategyChoice:
        return cls(
            strategy=data["strategy"],
            rule=data["rule"],
            reason=data["reason"],
            evidence=dict(data.get("evidence") or {}),
            pool=tuple(data.get("pool") or ()),
            raw=data,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Suggestion:
    """`POST /v1/suggest`: confidence (high/medium/low) from similar successes vs failures.

    `common_failures`, `failed_action_types` and `successful_strategies` are `(name, count)` pairs,
    most frequent first.
    """

    confidence: str
    similar: int
    successes: int
    failures: int
    success_share: float | None
    common_failures: tuple[tuple[str, int], ...]
    failed_action_types: tuple[tuple[str, int], ...]
    successful_strategies: tuple[tuple[str, int], ...]
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Suggestion:
        def pairs(name: str, key: str) -> tuple[tuple[str, int], ...]:
            return tuple((row[key], int(row["count"])) for row in data.get(name) or ())

        return cls(
            confidence=data["confidence"],
            similar=int(data["similar"]),
            successes=int(data["successes"]),
            failures=int(data["failures"]),
            success_share=_opt_float(data.get("success_share")),
            common_failures=pairs("common_failures", "message"),
            failed_action_types=pairs("failed_action_types", "action_type"),
            successful_strategies=pairs("successful_strategies", "strategy"),
            raw=data,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SkillProfile:
    """One category's record: episodes, successes, success rate, average reward and iterations."""

    category: str
    episodes: int
    successes: int
    success_rate: float | None
    avg_reward: float | None
    avg_iterations: float | None
    weak: bool

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SkillProfile:
        return cls(
            category=data["category"],
            episodes=int(data["episodes"]),
            successes=int(data["successes"]),
            success_rate=_opt_float(data.get("success_rate")),
            avg_reward=_opt_float(data.get("avg_reward")),
            avg_iterations=_opt_float(data.get("avg_iterations")),
            weak=bool(data.get("weak")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Skills:
    """`GET /v1/skills`: a profile per category and the weak ones (success rate below `threshold`)."""

    results: tuple[SkillProfile, ...]
    weak: tuple[str, ...]
    threshold: float
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Skills:
        return cls(
            results=tuple(map(SkillProfile.from_json, data["results"])),
            weak=tuple(data.get("weak") or ()),
            threshold=float(data["threshold"]),
            raw=data,
        )

    def __iter__(self) -> Iterator[SkillProfile]:
        return iter(self.results)


@dataclass(frozen=True, slots=True, kw_only=True)
class CurvePoint:
    """One episode of the learning curve (time order): its reward and the running figures after it."""

    episode: int
    episode_id: str
    completed_at: float
    reward: float | None
    outcome: str | None
    cumulative_reward: float
    success_rate: float
    avg_reward: float | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CurvePoint:
        return cls(
            episode=int(data["episode"]),
            episode_id=data["episode_id"],
            completed_at=parse_instant(data["completed_at"]),
            reward=_opt_float(data.get("reward")),
            outcome=data.get("outcome"),
            cumulative_reward=float(data["cumulative_reward"]),
            success_rate=float(data["success_rate"]),
            avg_reward=_opt_float(data.get("avg_reward")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LearningCurve:
    """`GET /v1/learning-curve`: points oldest first, rolling over `window` episodes."""

    results: tuple[CurvePoint, ...]
    window: int
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LearningCurve:
        return cls(
            results=tuple(map(CurvePoint.from_json, data["results"])), window=int(data["window"]), raw=data
        )

    def __iter__(self) -> Iterator[CurvePoint]:
        return iter(self.results)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fact:
    """A semantic-memory fact (docs/architecture.md, "Facts"); `score` is set by search with a query."""

    fact_id: str
    kind: str
    text: str
    level: str
    status: str
    support: int
    successes: int
    success_rate: float | None
    avg_reward: float | None
    confidence: float | None
    version: int
    agent_id: str | None = None
    category: str | None = None
    evidence: tuple[str, ...] = ()
    top_strategies: tuple[Mapping[str, Any], ...] = ()
    common_failures: tuple[Mapping[str, Any], ...] = ()
    first_at: float | None = None
    last_at: float | None = None
    created_at: float | None = None
    updated_at: float | None = None
    supersedes: str | None = None
    superseded_by: str | None = None
    score: float | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fact:
        return cls(
            fact_id=data["fact_id"],
            kind=data["kind"],
            text=data["text"],
            level=data.get("level", ""),
            status=data.get("status", ""),
            support=int(data.get("support") or 0),
            successes=int(data.get("successes") or 0),
            success_rate=_opt_float(data.get("success_rate")),
            avg_reward=_opt_float(data.get("avg_reward")),
            confidence=_opt_float(data.get("confidence")),
            version=int(data.get("version") or 0),
            agent_id=data.get("agent_id") or None,
            category=data.get("category") or None,
            evidence=tuple(data.get("evidence") or ()),
            top_strategies=tuple(data.get("top_strategies") or ()),
            common_failures=tuple(data.get("common_failures") or ()),
            first_at=_instant(data.get("first_at")),
            last_at=_instant(data.get("last_at")),
            created_at=_instant(data.get("created_at")),
            updated_at=_instant(data.get("updated_at")),
            supersedes=data.get("supersedes") or None,
            superseded_by=data.get("superseded_by") or None,
            score=_opt_float(data.get("score")),
            raw=data,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class FactDetail:
    """`GET /v1/facts/{id}`: the fact, its evidence episodes (oldest first) and the facts it superseded."""

    fact: Fact
    evidence: tuple[Episode, ...]
    history: tuple[Fact, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FactDetail:
        return cls(
            fact=Fact.from_json(data["fact"]),
            evidence=tuple(map(episode_from_json, data.get("evidence") or ())),
            history=tuple(map(Fact.from_json, data.get("history") or ())),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ScopeConsolidation:
    """One scope's consolidation run: `status` (published, unchanged or busy), facts written and removed."""

    scope: Mapping[str, Any]
    status: str
    facts: int
    removed: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScopeConsolidation:
        return cls(
            scope=dict(data.get("scope") or {}),
            status=data.get("status", ""),
            facts=int(data.get("facts") or 0),
            removed=int(data.get("removed") or 0),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Consolidation:
    """`POST /v1/consolidate`: a run per scope."""

    results: tuple[ScopeConsolidation, ...]
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Consolidation:
        return cls(results=tuple(map(ScopeConsolidation.from_json, data["results"])), raw=data)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredEpisode:
    """`GET /v1/episodes/{id}`: a projected episode, its status and its recall counters.

    `status` is `completed`, `draft` (started, not finished) or `pending` (accepted into the stream, not
    yet projected: `episode` is None then).
    """

    episode: Episode | None
    status: str
    access_count: int
    last_accessed: float | None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoredEpisode:
        return cls(
            episode=episode_from_json(data["episode"]) if data.get("episode") is not None else None,
            status=data.get("status", ""),
            access_count=int(data.get("access_count") or 0),
            last_accessed=_instant(data.get("last_accessed")),
            raw=data,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Forgetting:
    """A forget accepted (202): the consolidator erases the episode, or every episode of the user."""

    event_id: str | None
    episode_id: str | None = None
    user_id: str | None = None
    already_forgotten: bool = False  # the episode was forgotten before (no new event)
    forgotten: bool | None = None  # a forget with `wait`: erased from every read in time

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Forgetting:
        return cls(
            event_id=data.get("event_id"),
            episode_id=data.get("episode_id"),
            user_id=data.get("user_id"),
            already_forgotten=bool(data.get("already_forgotten")),
            forgotten=data.get("forgotten"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodePage:
    """One page of `GET /v1/episodes`: `episodes` in the order asked for; `next_cursor` None on the last."""

    episodes: tuple[Episode, ...]
    next_cursor: str | None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __iter__(self) -> Iterator[Episode]:
        return iter(self.episodes)

    def __len__(self) -> int:
        return len(self.episodes)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EpisodePage:
        return cls(
            episodes=tuple(episode_from_json(e) for e in data["results"]),
            next_cursor=data.get("next_cursor"),
            raw=data,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class FactPage:
    """One page of `GET /v1/facts`; `next_cursor` None on the last."""

    facts: tuple[Fact, ...]
    next_cursor: str | None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __iter__(self) -> Iterator[Fact]:
        return iter(self.facts)

    def __len__(self) -> int:
        return len(self.facts)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FactPage:
        return cls(
            facts=tuple(Fact.from_json(f) for f in data["results"]),
            next_cursor=data.get("next_cursor"),
            raw=data,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Updated:
    """A change accepted (202): its `EpisodeUpdated` event is on the stream; `projected` with `wait`."""

    episode_id: str
    event_id: str
    projected: bool | None = None
    reason: str | None = None  # as `Accepted.reason`

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Updated:
        return cls(
            episode_id=data["episode_id"],
            event_id=data["event_id"],
            projected=data.get("projected"),
            reason=data.get("reason"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ForgetJob:
    """A bulk forget (`DELETE /v1/agents/{id}`, `DELETE /v1/sessions/{id}`, `POST /v1/forget`) and its
    status (`GET /v1/forget/{job_id}`): `episodes` it erases, `forgotten` so far, `done` once all are.
    `unknown` / `already_forgotten`: ids of a by-id forget that were not published, in the answer of
    `forget_episodes` only (the status `forget_job` reads keeps no ids: empty there)."""

    job_id: str
    kind: str
    done: bool
    episodes: int
    forgotten: int
    created_at: float
    expires_at: float
    unknown: tuple[str, ...] = ()
    already_forgotten: tuple[str, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ForgetJob:
        return cls(
            job_id=data["job_id"],
            kind=data["kind"],
            done=data["status"] == "done",
            episodes=int(data["episodes"]),
            forgotten=int(data["forgotten"]),
            created_at=parse_instant(data["created_at"]),
            expires_at=parse_instant(data["expires_at"]),
            unknown=tuple(data.get("unknown") or ()),
            already_forgotten=tuple(data.get("already_forgotten") or ()),
            raw=data,
        )
