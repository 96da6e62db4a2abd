"""Typed results of the query service's HTTP API: frozen dataclasses built from its JSON answers.

Every class mirrors one response schema of `GET /openapi.json` and has `from_json(data)`, read by its
annotations (`_Result`); every instant is UTC epoch seconds (float), as inside Engram (the wire carries
ISO 8601 `Z` strings). Episodes come back as `engram_episodic.events.Episode`, the same class agents
build and publish, so an episode read from recall can be re-published as it is. Each result keeps the
JSON it was built from in `raw` (for fields a newer server adds).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Self, Union, cast, get_args, get_origin, get_type_hints

from engram_episodic.events import Episode
from engram_episodic.timeutil import parse_instant
from engram_episodic.validation import parse_episode

_EPISODE_FIELDS = frozenset(Episode.__dataclass_fields__)
Instant = Annotated[float, "UTC epoch seconds; an ISO 8601 string on the wire"]
Counts = tuple[tuple[str, int], ...]  # (name, count) pairs; annotated with the key of the name in a row


def episode_from_json(data: Mapping[str, Any]) -> Episode:
    """An Episode from the service's response form, through `parse_episode` without the per-input action
    bound; fields this client does not know are dropped. Raises InvalidEpisode."""
    known = {k: v for k, v in data.items() if k in _EPISODE_FIELDS}
    episode = parse_episode(known, max_actions=None)
    assert episode is not None  # parse_episode raises rather than return None without a collector
    return episode


def _converter(hint: Any) -> Callable[[Any], Any]:
    """How a JSON value becomes a field annotated `hint` (null or missing: see `_Result.from_json`)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:  # an Instant, or Counts and the key of each row's name
        if args[0] is float:
            return parse_instant
        return lambda v: tuple((row[args[1]], int(row["count"])) for row in v or ())
    if origin in (Union, types.UnionType):  # `X | None`; an empty string is None too
        inner = _converter(next(a for a in args if a is not type(None)))
        return lambda v: None if v is None or v == "" else inner(v)
    if origin is tuple:
        each = episode_from_json if args[0] is Episode else getattr(args[0], "from_json", None)
        return (lambda v: tuple(map(each, v or ()))) if each else (lambda v: tuple(v or ()))
    if origin is Mapping:
        if args[1] is float:
            return lambda v: {k: float(x) for k, x in (v or {}).items()}
        return lambda v: dict(v or {})
    if hint is Episode:
        return episode_from_json
    if isinstance(hint, type) and issubclass(hint, _Result):
        return lambda v: hint.from_json(v or {})
    return hint if hint in (float, int, bool) else lambda v: v


@functools.cache
def _fields(cls: Any) -> tuple[tuple[str, str, Callable[[Any], Any], bool, bool], ...]:
    """(name, its key in the answer, converter, has a default, required: a scalar without default) per
    field of `cls` but `raw`."""
    hints = get_type_hints(cls, include_extras=True)
    return tuple(
        (
            f.name,
            "results" if f.name == cls._ITEMS else f.name,
            _converter(hints[f.name]),
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING,
            f.default is dataclasses.MISSING and hints[f.name] in (float, int, str, Instant),
        )
        for f in dataclasses.fields(cls)
        if f.name != "raw"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Result:
    """A result read from JSON by its annotations: a scalar without a default is required (KeyError
    when missing); a null or missing field takes its default, or its type's empty value (None, (), {},
    False); `raw` is the JSON it was read from. The field `_ITEMS` (a listing's items) is the answer's
    `results`."""

    _ITEMS: ClassVar[str] = "results"
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls._read(data)

    @classmethod
    def _read(cls, data: Mapping[str, Any], **given: Any) -> Self:
        for name, key, convert, has_default, required in _fields(cast(type, cls)):
            if name not in given:
                value = data[key] if required else data.get(key)
                if value is not None or not has_default:
                    given[name] = convert(value)
        return cls(raw=data, **given)


class _Listing(_Result):
    """A result iterable over its items, the field `_ITEMS`."""

    __slots__ = ()

    def __iter__(self) -> Iterator[Any]:
        return iter(getattr(self, self._ITEMS))

    def __len__(self) -> int:
        return len(getattr(self, self._ITEMS))


@dataclass(frozen=True, slots=True, kw_only=True)
class Accepted(_Result):
    """One episode of an ingest (202): the stream holds its event and projection follows — or, with
    `event_id` None and `reason` "forgotten", its episode_id was forgotten before and nothing was
    published (a forgotten id is never stored again)."""

    episode_id: str
    event_id: str | None
    projected: bool | None = None  # with `wait`: whether the consolidator projected it in time
    # "forgotten" (the id is tombstoned: not published, with or without `wait`; publish under a new
    # episode_id), and with `wait`, when not projected: "dead_lettered" (`engram-admin dead-letters` says
    # why), "expired" (projected but past its expires_at, so hidden) or "timeout"
    reason: str | None = None

    @property
    def forgotten(self) -> bool:
        """Its episode_id was forgotten before: not published, never stored."""
        return self.reason == "forgotten"


@dataclass(frozen=True, slots=True, kw_only=True)
class IngestResult(_Result):
    """`POST /v1/episodes`: every episode of the request, in request order."""

    accepted: int
    results: tuple[Accepted, ...]
    projected: bool | None = None  # with `wait`: every episode projected (recallable) in time


@dataclass(frozen=True, slots=True, kw_only=True)
class RecallHit(_Result):
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
    last_accessed: Instant | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayStrategy(_Result):
    """A strategy the recalled episodes used: its best priority, count, average reward, success rate —
    of its newest regime: when its outcomes flipped, `changed_at` (UTC epoch seconds) is when, and
    `earlier_episodes` / `earlier_success_rate` describe the older episodes left out."""

    strategy: str
    priority: float
    episodes: int
    avg_reward: float | None
    success_rate: float | None
    changed_at: Instant | None = None
    earlier_episodes: int = 0
    earlier_success_rate: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayContext(_Result):
    """What the recalled episodes say worked: strategies to replay, best first."""

    episodes: int = 0
    avg_reward: float | None
    success_rate: float | None
    strategies: tuple[ReplayStrategy, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Recall(_Listing):
    """`POST /v1/recall`: the hits best first, and how they were ranked. Iterable over `results`.
    `similarity_unavailable`: a keyword recall ranked without the query's vector (the embedder's
    provider failed, or the live index holds another embedder's vectors), every hit's `similarity` None."""

    results: tuple[RecallHit, ...]
    replay_context: ReplayContext
    as_of: Instant
    weights: Mapping[str, float]
    preset: str | None
    mode: str = ""
    candidates: int = 0
    similarity_unavailable: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextFact(_Result):
    """A current fact in a context answer (`score`: its centroid's similarity to the task)."""

    fact_id: str
    kind: str
    text: str
    support: int
    success_rate: float | None
    confidence: float | None
    score: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Context(_Result):
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


@dataclass(frozen=True, slots=True, kw_only=True)
class StrategyChoice(_Result):
    """`POST /v1/strategy`: the strategy to use, the rule that chose it and why."""

    strategy: str
    rule: str
    reason: str
    evidence: Mapping[str, Any]
    pool: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Suggestion(_Result):
    """`POST /v1/suggest`: confidence (high/medium/low) from similar successes vs failures.

    `common_failures`, `failed_action_types` and `successful_strategies` are `(name, count)` pairs,
    most frequent first.
    """

    confidence: str
    similar: int
    successes: int
    failures: int
    success_share: float | None
    common_failures: Annotated[Counts, "message"]
    failed_action_types: Annotated[Counts, "action_type"]
    successful_strategies: Annotated[Counts, "strategy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SkillProfile(_Result):
    """One category's record: episodes, successes, success rate, average reward and iterations."""

    category: str
    episodes: int
    successes: int
    success_rate: float | None
    avg_reward: float | None
    avg_iterations: float | None
    weak: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Skills(_Listing):
    """`GET /v1/skills`: a profile per category and the weak ones (success rate below `threshold`)."""

    results: tuple[SkillProfile, ...]
    weak: tuple[str, ...]
    threshold: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CurvePoint(_Result):
    """One episode of the learning curve (time order): its reward and the running figures after it."""

    episode: int
    episode_id: str
    completed_at: Instant
    reward: float | None
    outcome: str | None
    cumulative_reward: float
    success_rate: float
    avg_reward: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LearningCurve(_Listing):
    """`GET /v1/learning-curve`: points oldest first, rolling over `window` episodes."""

    results: tuple[CurvePoint, ...]
    window: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Fact(_Result):
    """A semantic-memory fact (docs/architecture.md, "Facts"); `score` is set by search with a query."""

    fact_id: str
    kind: str
    text: str
    level: str = ""
    status: str = ""
    support: int = 0
    successes: int = 0
    success_rate: float | None
    avg_reward: float | None
    confidence: float | None
    version: int = 0
    agent_id: str | None = None
    category: str | None = None
    evidence: tuple[str, ...] = ()
    top_strategies: tuple[Mapping[str, Any], ...] = ()
    common_failures: tuple[Mapping[str, Any], ...] = ()
    first_at: Instant | None = None
    last_at: Instant | None = None
    created_at: Instant | None = None
    updated_at: Instant | None = None
    supersedes: str | None = None
    superseded_by: str | None = None
    score: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FactDetail(_Result):
    """`GET /v1/facts/{id}`: the fact, its evidence episodes (oldest first) and the facts it superseded."""

    fact: Fact
    evidence: tuple[Episode, ...]
    history: tuple[Fact, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScopeConsolidation(_Result):
    """One scope's consolidation run: `status` (published, unchanged or busy), facts written and removed."""

    scope: Mapping[str, Any]
    status: str = ""
    facts: int = 0
    removed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Consolidation(_Result):
    """`POST /v1/consolidate`: a run per scope."""

    results: tuple[ScopeConsolidation, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredEpisode(_Result):
    """`GET /v1/episodes/{id}`: a projected episode, its status and its recall counters.

    `status` is `completed`, `draft` (started, not finished) or `pending` (accepted into the stream, not
    yet projected: `episode` is None then).
    """

    episode: Episode | None
    status: str = ""
    access_count: int = 0
    last_accessed: Instant | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Forgetting(_Result):
    """A forget accepted (202): the consolidator erases the episode, or every episode of the user."""

    event_id: str | None
    episode_id: str | None = None
    user_id: str | None = None
    already_forgotten: bool = False  # the episode was forgotten before (no new event)
    forgotten: bool | None = None  # a forget with `wait`: erased from every read in time


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodePage(_Listing):
    """One page of `GET /v1/episodes`: `episodes` in the order asked for; `next_cursor` None on the last."""

    episodes: tuple[Episode, ...]
    next_cursor: str | None

    _ITEMS = "episodes"


@dataclass(frozen=True, slots=True, kw_only=True)
class FactPage(_Listing):
    """One page of `GET /v1/facts`; `next_cursor` None on the last."""

    facts: tuple[Fact, ...]
    next_cursor: str | None

    _ITEMS = "facts"


@dataclass(frozen=True, slots=True, kw_only=True)
class Updated(_Result):
    """A change accepted (202): its `EpisodeUpdated` event is on the stream; `projected` with `wait`."""

    episode_id: str
    event_id: str
    projected: bool | None = None
    reason: str | None = None  # as `Accepted.reason`


@dataclass(frozen=True, slots=True, kw_only=True)
class Expiring(_Result):
    """An episode and when it expires (`Summary.expiring`)."""

    episode_id: str
    expires_at: Instant


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary(_Result):
    """`GET /v1/summary`: what the namespace holds. `episodes` not yet expired; `agents`, `users`,
    `sessions` distinct ids; `facts` current ones; `expiring` the 10 episodes expiring soonest, soonest
    first."""

    episodes: int
    agents: int
    users: int
    sessions: int
    facts: int
    expiring: tuple[Expiring, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter(_Result):
    """An event of the namespace the consolidator gave up on: `id` in the dead-letter stream (what
    `redrive_dead_letters` and `discard_dead_letters` take), the `episode_id` it names, why, which
    consumer, and when (`at`)."""

    id: str
    episode_id: str
    reason: str
    consumer: str
    at: Instant


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetters(_Listing):
    """`GET /v1/dead-letters`: the namespace's dead letters, oldest first (at most `limit`), and `total`."""

    dead_letters: tuple[DeadLetter, ...]
    total: int

    _ITEMS = "dead_letters"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLettersActed(_Result):
    """A redrive or discard: `done` dead letters re-driven or discarded, the ids that named none of the
    namespace's `unknown`."""

    done: int
    unknown: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ForgetJob(_Result):
    """A bulk forget (`DELETE /v1/agents/{id}`, `DELETE /v1/sessions/{id}`, `POST /v1/forget`) and its
    status (`GET /v1/forget/{job_id}`): `episodes` it erases, `forgotten` so far, `done` once all are.
    `unknown` / `already_forgotten`: ids of a by-id forget that were not published, in the answer of
    `forget_episodes` only (the status `forget_job` reads keeps no ids: empty there)."""

    job_id: str
    kind: str
    done: bool
    episodes: int
    forgotten: int
    created_at: Instant
    expires_at: Instant
    unknown: tuple[str, ...] = ()
    already_forgotten: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls._read(data, done=data["status"] == "done")
