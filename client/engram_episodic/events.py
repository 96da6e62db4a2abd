"""Domain events: what happened to an episode, in the past tense, immutable.

The episode model holds the fields of the published episode designs Engram follows:
- experience replay for coding agents (task, actions, solution, feedback with tests, outcome, strategy,
  iterations; Lin 1992 "Self-improving reactive agents based on RL, planning and teaching");
- the observation / thoughts / action / result episode schema (ReAct-style traces, Yao et al. 2023);
- Generative Agents' 1..10 importance score (Park et al. 2023, section 4.1).

All timestamps are UTC epoch seconds (float). Text is kept byte-exact (no normalisation).
These classes carry no validation: `engram_episodic.validation` builds them from untrusted input and
`shared.codec` serialises them; a dataclass here is always already valid.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

OUTCOMES: tuple[str, ...] = ("success", "partial", "failure", "abandoned")


def new_event_id() -> str:
    """A fresh event id: UUIDv4 hex (32 chars). Retries of one event reuse it."""
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    """What the agent was asked to do. `complexity` is in [0, 1]."""

    description: str
    category: str = "unknown"
    complexity: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """One step of an episode (a tool call, an edit, a test run).

    `action_id` identifies the step for idempotent folding; the SDK sets it to the event id of the
    `ActionRecorded` that carried it. `timestamp` is UTC epoch seconds.
    """

    action_type: str
    input: str | None = None
    output: str | None = None
    timestamp: float | None = None
    success: bool | None = None
    error: str | None = None
    action_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Feedback:
    """Reward signal. `pass_rate` = tests_passed / tests_total (derived, None without tests)."""

    reward: float | None = None
    message: str | None = None
    tests_passed: int | None = None
    tests_total: int | None = None

    @property
    def pass_rate(self) -> float | None:
        if self.tests_total is None or self.tests_passed is None or self.tests_total == 0:
            return None
        return self.tests_passed / self.tests_total


@dataclass(frozen=True, slots=True, kw_only=True)
class Episode:
    """Everything an agent tells Engram about one task attempt.

    `episode_id` is the idempotency key (client-supplied or generated). `vector`, when present,
    is the agent's own embedding (float32[dim] as a tuple) and is used instead of the embedder's
    when its dimension matches the index. `duration_s` is derived from the two timestamps. Past
    `expires_at` the episode is hidden from every read and then erased (docs/api.md, Expiry).
    """

    episode_id: str
    agent_id: str | None = None
    user_id: str | None = None
    session_id: str | None = None
    task: Task | None = None
    context: dict[str, Any] | None = None
    observation: str | None = None
    thoughts: str | None = None
    action: str | None = None
    result: str | None = None
    solution: str | None = None
    actions: tuple[Action, ...] = ()
    feedback: Feedback | None = None
    outcome: str | None = None
    outcome_details: str | None = None
    importance: float | None = None
    strategy_used: str | None = None
    iterations: int | None = None
    started_at: float | None = None
    completed_at: float | None = None
    expires_at: float | None = None
    source: str | None = None
    metadata: dict[str, Any] | None = None
    vector: tuple[float, ...] | None = None

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None or self.completed_at is None:
            return None
        return max(0.0, self.completed_at - self.started_at)


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Fields every event carries. `occurred_at` is UTC epoch seconds; `namespace` is the tenant.

    `VERSION` is the class's current schema version, the one `encode` writes; `UPCASTERS[v]` turns the
    stored data of version `v` into that of `v + 1` (eventsourcing's upcasting, next to the class whose
    shape changed), so a stored event of any version decodes to the current class.
    """

    TYPE: ClassVar[str] = "Event"
    VERSION: ClassVar[int] = 1
    UPCASTERS: ClassVar[Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]]] = {}

    event_id: str = field(default_factory=new_event_id)
    namespace: str
    occurred_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeEvent(Event):
    """An event about one episode: what routing, idempotency and forgetting read first."""

    episode_id: str


def _episode_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v1 (the prototype's flat shape) → v2: `task` was a plain string with a sibling `category`, and
    `reward` was top-level; v2 nests them as `task: {description, category}` and `feedback: {reward}`."""
    data = dict(data)
    episode = dict(data.get("episode") or {})
    if isinstance(episode.get("task"), str):
        episode["task"] = {"description": episode.pop("task"), "category": episode.pop("category", "unknown")}
    if "reward" in episode:
        feedback = dict(episode.get("feedback") or {})
        feedback.setdefault("reward", episode.pop("reward"))
        episode["feedback"] = feedback
    data["episode"] = episode
    return data


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeStarted(EpisodeEvent):
    """An agent began a task. `episode` holds what is known at the start (no outcome)."""

    TYPE: ClassVar[str] = "EpisodeStarted"
    VERSION: ClassVar[int] = 2
    UPCASTERS: ClassVar[Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]]] = {1: _episode_v1_to_v2}
    episode: Episode


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionRecorded(EpisodeEvent):
    """One step happened inside an open episode."""

    TYPE: ClassVar[str] = "ActionRecorded"
    action: Action


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeCompleted(EpisodeEvent):
    """An episode finished. `episode` is the full final snapshot; it may arrive before its start."""

    TYPE: ClassVar[str] = "EpisodeCompleted"
    VERSION: ClassVar[int] = 2
    UPCASTERS: ClassVar[Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]]] = {1: _episode_v1_to_v2}
    episode: Episode


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeUpdated(EpisodeEvent):
    """Fields of an episode changed after the fact (`PATCH /v1/episodes/{id}`): a reward that arrived
    later, a corrected outcome, more importance, metadata.

    Folded after the episode's earlier events: `feedback` merges field by field into the episode's
    (fields left None keep their values), `metadata` key by key (a key whose value is None is removed,
    as RFC 7396 merges), the others replace. `clear_expiry` removes the episode's `expires_at` (a
    `PATCH` with `"expires_at": null` or `"ttl": null`): None in the other fields means "unchanged", so
    clearing needs its own flag. `user_id` is the episode's user, carried only so that a sealed event is
    sealed under that user's data key (`shared.keyring`); it changes nothing.
    """

    TYPE: ClassVar[str] = "EpisodeUpdated"
    user_id: str | None = None
    feedback: Feedback | None = None
    outcome: str | None = None
    outcome_details: str | None = None
    importance: float | None = None
    metadata: dict[str, Any] | None = None
    expires_at: float | None = None
    clear_expiry: bool = False


UPDATABLE: tuple[str, ...] = (
    "feedback",
    "outcome",
    "outcome_details",
    "importance",
    "metadata",
    "expires_at",
)
"""The episode fields an `EpisodeUpdated` may change."""


def updated(base: Episode, update: EpisodeUpdated) -> Episode:
    """`base` with `update`'s changes, as `EpisodeUpdated` documents them: `feedback` field by field,
    `metadata` key by key (None removes a key, RFC 7396), the others replaced; `clear_expiry` removes
    `expires_at`. Not checked: the fold
    (`services.consolidator.projection`) and `PATCH` keep only results `validation.episode_problems`
    accepts."""
    changes: dict[str, Any] = {}  # field name → new value
    if update.feedback is not None:
        old = base.feedback or Feedback()
        given = {f.name: getattr(update.feedback, f.name) for f in dataclasses.fields(Feedback)}
        changes["feedback"] = dataclasses.replace(old, **{k: v for k, v in given.items() if v is not None})
    if update.metadata is not None:
        merged = dict(base.metadata or {})
        for key, value in update.metadata.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        changes["metadata"] = merged or None
    for name in ("outcome", "outcome_details", "importance", "expires_at"):
        if getattr(update, name) is not None:
            changes[name] = getattr(update, name)
    if update.clear_expiry:
        changes["expires_at"] = None
    return dataclasses.replace(base, **changes)


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeForgotten(EpisodeEvent):
    """The episode must be erased from every projection and from the stream."""

    TYPE: ClassVar[str] = "EpisodeForgotten"


@dataclass(frozen=True, slots=True, kw_only=True)
class UserForgotten(Event):
    """Every episode of `user_id` in the namespace must be erased (right to be forgotten)."""

    TYPE: ClassVar[str] = "UserForgotten"
    user_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FactsConsolidated(Event):
    """A consolidation run of one scope produced these facts (dicts; see shared.facts)."""

    TYPE: ClassVar[str] = "FactsConsolidated"
    scope: dict[str, str]
    facts: tuple[dict[str, Any], ...] = ()
    removed: tuple[str, ...] = ()


EVENT_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        EpisodeStarted,
        ActionRecorded,
        EpisodeCompleted,
        EpisodeUpdated,
        EpisodeForgotten,
        UserForgotten,
        FactsConsolidated,
    )
}
